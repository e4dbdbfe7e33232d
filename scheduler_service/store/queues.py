"""Queues (pause, resume, backlog), the status figures, and the release plans of held work."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timedelta

from scheduler_service.domain.carbon import Totals
from scheduler_service.domain.planning import RELEASE_LEAD
from scheduler_service.rows.fleet import (
    CarbonByType,
    PausedQueue,
    PendingGroup,
    PlannableTask,
    PoolPlanned,
    PoolSlots,
    PoolType,
    PoolWorkers,
    QueueName,
    QueueRunning,
    RecentDeferrable,
    ReleaseDue,
    ResumedQueue,
    StoredSignal,
    TypeRunning,
    WorkerCount,
)
from scheduler_service.store.base import Q, StoreBase, ms


class QueueStore(StoreBase):
    async def stored_signal(self, name: str) -> StoredSignal | None:
        return await self.db.fetch_one_as(StoredSignal, Q["stored_signal"], {"name": name})

    async def pause_queue(self, name: str) -> PausedQueue:
        row = await self.db.fetch_one_as(PausedQueue, Q["pause_queue"], {"name": name})
        assert row is not None
        return row

    async def resume_queue(self, name: str) -> bool:
        """Resumes the queue and moves its schedule_to_start deadlines past the pause."""
        async with self.db.transaction() as tx:
            row = await tx.fetch_one_as(ResumedQueue, Q["resume_queue"], {"name": name})
            if row is None:
                return False
            await tx.execute(Q["shift_schedule_to_start"], {"name": name, "paused_for": row.paused_for})
            return True

    async def paused_queues(self) -> dict[str, datetime]:
        return {q.name: q.paused_at for q in await self.db.fetch_as(PausedQueue, Q["paused_queues"])}

    async def pending_by_queue_and_type(self) -> list[PendingGroup]:
        return await self.db.fetch_as(PendingGroup, Q["pending_by_queue_and_type"])

    async def known_queues(self) -> set[str]:
        return {q.name for q in await self.db.fetch_as(QueueName, Q["known_queues"])}

    async def running_by_queue(self) -> dict[str, int]:
        return {q.queue: q.running for q in await self.db.fetch_as(QueueRunning, Q["running_by_queue"])}

    async def pools(self) -> list[PoolWorkers]:
        return await self.db.fetch_as(PoolWorkers, Q["pools"])

    async def pool_slots(self, types: Sequence[str]) -> dict[str, int]:
        """Slots of the connected workers that run any of these types, by pool."""
        rows = await self.db.fetch_as(PoolSlots, Q["pool_slots"], {"types": list(types)})
        return {r.pool: r.slots for r in rows}

    async def pool_types(self, types: Sequence[str]) -> dict[tuple[str, str], set[str]]:
        """The pools whose connected workers run each of these types, by (queue, type)."""
        out: dict[tuple[str, str], set[str]] = {}
        for r in await self.db.fetch_as(PoolType, Q["pool_types"], {"types": list(types)}):
            out.setdefault((r.queue, r.activity_type), set()).add(r.pool)
        return out

    async def planned_by_pool(self) -> dict[str, PoolPlanned]:
        """Held tasks the plan placed in each pool and has not released yet, and the soonest."""
        return {r.pool: r for r in await self.db.fetch_as(PoolPlanned, Q["planned_by_pool"])}

    async def forget_idle_queues(
        self, *, busy: Collection[str], kept: Collection[str], retention: timedelta, limit: int
    ) -> int:
        """Marks which queues are idle (all but `busy`), then forgets those idle for the retention
        (see the statements); returns how many were forgotten."""
        await self.db.execute(Q["mark_idle_queues"], {"busy": sorted(busy)})
        params = {"kept": sorted(kept), "retention_ms": ms(retention), "limit": limit}
        return await self.db.execute(Q["forget_idle_queues"], params)

    async def carbon_totals(self, types: Sequence[str]) -> dict[str, Totals]:
        rows = await self.db.fetch_as(CarbonByType, Q["carbon_totals"], {"types": list(types)})
        return {r.activity_type: Totals(r.tasks, r.sum_at_submit, r.sum_at_dispatch) for r in rows}

    async def add_carbon_totals(self, totals: Mapping[str, Totals]) -> None:
        types = sorted(totals)
        await self.db.execute(
            Q["add_carbon_totals"],
            {
                "types": types,
                "tasks": [totals[t].tasks for t in types],
                "at_submit": [totals[t].at_submit for t in types],
                "at_dispatch": [totals[t].at_dispatch for t in types],
            },
        )

    async def workers_for_type(self, queue: str, activity_type: str) -> int:
        params = {"queue": queue, "activity_type": activity_type}
        row = await self.db.fetch_one_as(WorkerCount, Q["workers_for_type"], params)
        return row.workers if row else 0

    async def running_of_type(self, activity_type: str) -> int:
        rows = await self.db.fetch_as(TypeRunning, Q["count_running_by_type"], {"types": [activity_type]})
        return rows[0].running if rows else 0

    async def plannable_tasks(self) -> list[PlannableTask]:
        return await self.db.fetch_as(PlannableTask, Q["plannable_tasks"])

    async def recent_deferrable(self, types: Sequence[str], lookback: timedelta) -> list[RecentDeferrable]:
        params = {"types": list(types), "lookback": lookback}
        return await self.db.fetch_as(RecentDeferrable, Q["recent_deferrable"], params)

    async def apply_plans(
        self,
        plans: Sequence[tuple[int, datetime | None, float | None, str]],
        pools: Sequence[str | None] | None = None,
    ) -> None:
        """Stores the plans (with the pool each placed its task in, for tasks naming pools) and
        tells every replica (NOTIFY, at commit) to time its wake-ups."""
        if not plans:
            return
        params = {
            "ids": [p[0] for p in plans],
            "release_ats": [p[1] for p in plans],
            "intensities": [p[2] for p in plans],
            "reasons": [p[3] for p in plans],
            "planned_pools": list(pools) if pools is not None else [None] * len(plans),
            "release_lead": RELEASE_LEAD,
        }
        async with self.db.transaction() as tx:
            await tx.execute(Q["apply_plans"], params)
            await tx.execute(Q["notify_plans"])

    async def upcoming_releases(self, horizon: timedelta) -> list[datetime]:
        return [r.due for r in await self.db.fetch_as(ReleaseDue, Q["upcoming_releases"], {"horizon": horizon})]
