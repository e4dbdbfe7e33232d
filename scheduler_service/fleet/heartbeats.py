"""Heartbeat deadlines of running attempts, written for every worker of the replica at once.

A heartbeat that lists running attempts pushes back their heartbeat timeouts. Its handler only
notes the attempts (and when the heartbeat arrived); within `WINDOW` seconds one statement writes
what every worker of the replica listed meanwhile, each deadline counted from its own heartbeat's
arrival, so the wait moves no deadline. A fleet of N busy workers so costs at most 1 / WINDOW
statements a second for their heartbeats, not N per heartbeat interval.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from lowtide.errors import DatabaseUnavailable
from scheduler_service.store import Store
from scheduler_service.store.batched_writes import BatchedWrites

log = logging.getLogger("lowtide.scheduler.workers")

# How long the first noted heartbeat waits for others to join its statement: short beside any
# heartbeat timeout a worker can keep (it beats every third of it, at least every 50 ms).
WINDOW = 0.1


class HeartbeatDeadlines(BatchedWrites[dict[tuple[int, int], tuple[str, float]]]):
    def __init__(self, store: Store, *, window: float = WINDOW) -> None:
        super().__init__(window)
        self._store = store
        # (task id, attempt) -> (worker id, when its latest heartbeat arrived): at most one entry
        # per attempt a session of this replica holds.
        self._pending: dict[tuple[int, int], tuple[str, float]] = {}

    def note(self, worker_id: str, refs: Iterable[tuple[int, int]]) -> None:
        """The worker's heartbeat listed these attempts (it holds each)."""
        now = time.monotonic()
        for ref in refs:
            self._pending[ref] = (worker_id, now)
        self.noted()

    def _take(self) -> dict[tuple[int, int], tuple[str, float]] | None:
        if not self._pending:
            return None
        batch, self._pending = self._pending, {}
        return batch

    async def _write(self, batch: dict[tuple[int, int], tuple[str, float]]) -> None:
        now = time.monotonic()
        await self._store.heartbeat(
            [(worker, ref[0], ref[1], round((now - at) * 1000)) for ref, (worker, at) in batch.items()]
        )

    def _keep(self, batch: dict[tuple[int, int], tuple[str, float]], error: DatabaseUnavailable) -> None:
        # A newer heartbeat of the same attempt wins.
        log.warning("worker.heartbeat_deferred", extra={"attempts": len(batch), "error": str(error)})
        for ref, entry in batch.items():
            self._pending.setdefault(ref, entry)
