"""Workers' leases, the leader's lease, the replicas seen, and the database's clock."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from scheduler_service.rows.fleet import DatabaseClock
from scheduler_service.rows.leases import LeaderCheck, MaintenanceDue, RenewedWorker
from scheduler_service.store.base import SEPARATOR, Q, StoreBase, ms


class WorkerStore(StoreBase):
    async def upsert_worker(
        self,
        *,
        worker_id: str,
        pool: str,
        queues: Sequence[str],
        activity_types: Sequence[str],
        slots: int,
        scheduler_id: str,
        lease: timedelta,
        token_name: str | None,
    ) -> bool:
        """False when the worker id is another token's (see the statement), and nothing was written."""
        written = await self.db.execute(
            Q["upsert_worker"],
            {
                "id": worker_id,
                "pool": pool,
                "queues": list(queues),
                "activity_types": list(activity_types),
                "slots": slots,
                "scheduler_id": scheduler_id,
                "lease_ms": ms(lease),
                "token_name": token_name,
            },
        )
        return written == 1

    async def renew_workers(self, leases: Mapping[str, tuple[int, int]], scheduler_id: str) -> set[str]:
        """Sets the leases of these workers (id -> its slots now and its lease from now, in ms) in
        one statement; returns the ids renewed. The others had run out (or the worker is another
        replica's)."""
        params = {
            "ids": SEPARATOR.join(leases),
            "slots": ",".join(str(slots) for slots, _ in leases.values()),
            "lease_ms": ",".join(str(lease) for _, lease in leases.values()),
            "scheduler_id": scheduler_id,
        }
        return {row.id for row in await self.db.fetch_as(RenewedWorker, Q["renew_worker_leases"], params)}

    async def delete_worker(self, worker_id: str, scheduler_id: str) -> None:
        await self.db.execute(Q["delete_worker"], {"id": worker_id, "scheduler_id": scheduler_id})

    async def delete_expired_workers(self) -> None:
        await self.db.execute(Q["delete_expired_workers"])

    async def seen_and_lead(self, name: str, holder: str, ttl: timedelta) -> LeaderCheck:
        """Records that the replica `holder` runs and takes or keeps the leader lease `name`."""
        params = {"name": name, "holder": holder, "ttl_ms": ms(ttl)}
        check = await self.db.fetch_one_as(LeaderCheck, Q["seen_and_lead"], params)
        assert check is not None
        return check

    async def maintenance_due(self, schedules_horizon: datetime, retention: timedelta) -> MaintenanceDue:
        """Which of the leader's time-driven statements may find work now (fire times up to
        `schedules_horizon` count as due; finished tasks are kept for `retention`, 0 for ever)."""
        params = {"horizon": schedules_horizon, "retention_ms": ms(retention)}
        due = await self.db.fetch_one_as(MaintenanceDue, Q["maintenance_due"], params)
        assert due is not None
        return due

    async def purge_finished(self, retention: timedelta, limit: int) -> int:
        """Deletes up to `limit` tasks finished more than `retention` ago; returns how many."""
        return await self.db.execute(Q["purge_finished"], {"retention_ms": ms(retention), "limit": limit})

    async def resign(self, name: str, holder: str) -> None:
        await self.db.execute(Q["resign"], {"name": name, "holder": holder})

    async def replica_stopped(self, replica: str) -> None:
        await self.db.execute(Q["replica_stopped"], {"id": replica})

    async def forget_replicas(self) -> None:
        await self.db.execute(Q["forget_replicas"])

    async def now(self) -> datetime:
        row = await self.db.fetch_one_as(DatabaseClock, Q["now"])
        assert row is not None
        return row.now
