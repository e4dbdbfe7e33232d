"""Heartbeat deadlines of running attempts, written for every worker of the replica at once.

A heartbeat that lists running attempts pushes back their heartbeat timeouts. Its handler only
notes the attempts (and when the heartbeat arrived); within `WINDOW` seconds one statement writes
what every worker of the replica listed meanwhile, each deadline counted from its own heartbeat's
arrival, so the wait moves no deadline. A fleet of N busy workers so costs at most 1 / WINDOW
statements a second for their heartbeats, not N per heartbeat interval.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

from lowtide.errors import DatabaseUnavailable
from scheduler_service.store import Store

log = logging.getLogger("lowtide.scheduler.workers")

# How long the first noted heartbeat waits for others to join its statement: short beside any
# heartbeat timeout a worker can keep (it beats every third of it, at least every 50 ms).
WINDOW = 0.1


class Beats:
    def __init__(self, store: Store, *, window: float = WINDOW) -> None:
        self._store = store
        self._window = window
        # (task id, attempt) -> (worker id, when its latest heartbeat arrived): at most one entry
        # per attempt a session of this replica holds.
        self._pending: dict[tuple[int, int], tuple[str, float]] = {}
        self._noted = asyncio.Event()
        # Statements run (one per window with any attempt noted).
        self.writes = 0

    def note(self, worker_id: str, refs: Iterable[tuple[int, int]]) -> None:
        """The worker's heartbeat listed these attempts (it holds each)."""
        now = time.monotonic()
        for ref in refs:
            self._pending[ref] = (worker_id, now)
        self._noted.set()

    async def run(self) -> None:
        while True:
            await self._noted.wait()
            await asyncio.sleep(self._window)
            self._noted.clear()
            await self.flush()

    async def flush(self) -> None:
        """Writes every deadline noted so far, in one statement."""
        if not self._pending:
            return
        batch, self._pending = self._pending, {}
        now = time.monotonic()
        beats = [(worker, ref[0], ref[1], round((now - at) * 1000)) for ref, (worker, at) in batch.items()]
        try:
            self.writes += 1
            await self._store.heartbeat(beats)
        except DatabaseUnavailable as error:
            # Kept for the next window (a newer heartbeat of the same attempt wins).
            log.warning("worker.heartbeat_deferred", extra={"attempts": len(beats), "error": str(error)})
            for ref, entry in batch.items():
                self._pending.setdefault(ref, entry)
            self._noted.set()
