"""Fixed starts after admission: the reservations ahead, and the starts that were missed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from lowtide.db.connector import Row
from scheduler_service.domain.fixed import Miss
from scheduler_service.rows.tasks import EndedRow
from scheduler_service.store.base import Q, StoreBase, ms
from scheduler_service.store.tasks import settle


class FixedStore(StoreBase):
    async def upcoming_fixed(self, pools: Sequence[str], horizon: datetime) -> list[Row]:
        return await self.db.fetch(Q["upcoming_fixed"], {"pools": list(pools), "horizon": horizon})

    async def apply_misses(self, reason_of: Callable[[Row], Miss], *, lease: timedelta) -> list[Row]:
        """Marks first attempts not started by start + tolerance; returns what was applied. A
        replica not seen for `lease` (and not stopped cleanly) counts as gone."""
        async with self.db.transaction() as tx:
            rows = await tx.fetch(Q["missed_fixed"], {"lease_ms": ms(lease)})
            if not rows:
                return []
            misses = [reason_of(r) for r in rows]
            params = {
                "ids": [r["id"] for r in rows],
                "reasons": [m.message for m in misses],
                "kinds": [m.kind for m in misses],
            }
            marked = await tx.fetch(Q["mark_missed"], params)
            await settle(tx, [EndedRow(r["id"], r["state"], r["has_dependents"]) for r in marked])
            return marked

    async def pool_fixed_stats(self) -> list[Row]:
        return await self.db.fetch(Q["pool_fixed_stats"])

    async def live_reservations(self) -> list[Row]:
        return await self.db.fetch(Q["live_reservations"])
