"""The carbon totals of the replica's dispatches (domain.carbon), added to the database's about
once a second in one statement: the dispatch path only counts in memory. `GetStatus` reads the
database's totals with what this replica has not written yet, so its own dispatches show at once
and other replicas' within a second. A replica killed loses at most its last second's figures."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from lowtide.errors import DatabaseUnavailable
from scheduler_service.domain.carbon import Totals, merged, tally
from scheduler_service.rows.claims import ClaimedRow
from scheduler_service.store import Store
from scheduler_service.store.batched_writes import BatchedWrites

log = logging.getLogger("lowtide.scheduler.carbon")

# How long the first counted dispatch waits for others to join its statement.
WINDOW = 1.0


class CarbonTotals(BatchedWrites[dict[str, Totals]]):
    def __init__(self, store: Store, *, window: float = WINDOW) -> None:
        super().__init__(window)
        self._store = store
        # Per activity type, what this replica dispatched and has not written yet.
        self._pending: dict[str, Totals] = {}

    def dispatched(self, rows: Iterable[ClaimedRow]) -> None:
        """These attempts were sent to their workers."""
        counted = tally((r.activity_type, r.attempt, r.signal_at_submit, r.signal_at_dispatch) for r in rows)
        if counted:
            self._pending = merged(self._pending, counted)
            self.noted()

    async def of(self, types: Sequence[str]) -> dict[str, Totals]:
        """The totals of these types: the database's and this replica's not yet written."""
        unwritten = {t: self._pending[t] for t in types if t in self._pending}
        return merged(await self._store.carbon_totals(types), unwritten)

    def _take(self) -> dict[str, Totals] | None:
        if not self._pending:
            return None
        batch, self._pending = self._pending, {}
        return batch

    async def _write(self, batch: dict[str, Totals]) -> None:
        await self._store.add_carbon_totals(batch)

    def _keep(self, batch: dict[str, Totals], error: DatabaseUnavailable) -> None:
        log.warning("carbon.totals_deferred", extra={"types": len(batch), "error": str(error)})
        self._pending = merged(batch, self._pending)
