"""Fixed starts after admission: the reservations ahead, and the starts that were missed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from scheduler_service.domain.fixed import Miss
from scheduler_service.rows.fleet import MissApplied, MissedFixed, PoolFixedStats, ReservationWindow, UpcomingFixed
from scheduler_service.store.base import Q, StoreBase, ms
from scheduler_service.store.tasks import settle


class FixedStore(StoreBase):
    async def upcoming_fixed(self, pools: Sequence[str], horizon: datetime) -> list[UpcomingFixed]:
        params = {"pools": list(pools), "horizon": horizon}
        return await self.db.fetch_as(UpcomingFixed, Q["upcoming_fixed"], params)

    async def apply_misses(self, reason_of: Callable[[MissedFixed], Miss], *, lease: timedelta) -> list[MissApplied]:
        """Marks first attempts not started by start + tolerance; returns what was applied. A
        replica not seen for `lease` (and not stopped cleanly) counts as gone."""
        async with self.db.transaction() as tx:
            missed = await tx.fetch_as(MissedFixed, Q["missed_fixed"], {"lease_ms": ms(lease)})
            if not missed:
                return []
            misses = [reason_of(m) for m in missed]
            params = {
                "ids": [m.id for m in missed],
                "reasons": [m.message for m in misses],
                "kinds": [m.kind for m in misses],
            }
            marked = await tx.fetch_as(MissApplied, Q["mark_missed"], params)
            await settle(tx, marked)
            return marked

    async def pool_fixed_stats(self) -> list[PoolFixedStats]:
        return await self.db.fetch_as(PoolFixedStats, Q["pool_fixed_stats"])

    async def live_reservations(self) -> list[ReservationWindow]:
        return await self.db.fetch_as(ReservationWindow, Q["live_reservations"])
