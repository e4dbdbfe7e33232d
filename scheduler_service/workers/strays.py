"""Attempts recorded as running on a worker that the worker does not run: found and handed out again.

An attempt is a worker's twice over: its row (`running`, the worker's id on it) and the worker's
session (`in_flight`, what was sent). Two gaps can strand it, recorded and never run, while the
worker heartbeats and so keeps its lease (nothing else would ever end it):

* The row is the worker's but the session never sent it: a claim whose commit was written but
  whose answer was lost with its connection (PostgreSQL killed mid-commit), or rows a claim could
  not send whose hand-back failed. The replica looks (one statement for all its workers) every
  half lease, and at once after a claim failed that way: a row no session holds, no report waits
  for, and no claim can still be bringing (seen by two looks, no claim of its worker running
  since before the first) is a stray.
* The session sent it but the worker does not hold it: the worker's heartbeat says how many
  assignments it had read and lists every attempt it holds (Heartbeat.assignments_read); one sent
  within those that it does not list never reached it, or was declined. Assignments still on
  their way when it wrote the heartbeat are not counted against it.

Either way the attempt never ran: it is put back pending as before its claim (its attempt not
counted), fenced by (task id, attempt, worker), and handed out again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from datetime import timedelta

from opentelemetry.metrics import Counter

from lowtide.errors import DatabaseUnavailable
from lowtide_proto.backoff import Backoff
from lowtide_proto.lowtide.v1 import task_pb2
from scheduler_service.fleet.sessions import Registry, WorkerSession
from scheduler_service.store import Store
from scheduler_service.workers.completer import Completer

log = logging.getLogger("lowtide.scheduler.strays")

# How soon the looks follow a claim whose outcome is unknown (two confirm a stray).
SOON = 1.0

# (task id, attempt, worker id)
Stray = tuple[int, int, str]


class Strays:
    def __init__(
        self,
        store: Store,
        registry: Registry,
        completer: Completer,
        *,
        scheduler_id: str,
        lease_timeout: timedelta,
        uncertain: asyncio.Event,
        counter: Counter | None = None,
    ) -> None:
        self._store = store
        # lowtide.dispatch.strays_returned: what an operator sees of this sweep's work.
        self._counter = counter
        self._registry = registry
        self._completer = completer
        self._scheduler_id = scheduler_id
        self._interval = lease_timeout.total_seconds() / 2
        # Set by the dispatcher when a claim failed after it may have been written.
        self._uncertain = uncertain
        # Attempts to put back ((task id, attempt) -> worker id), and the wake-up that asks for it.
        self._returning: dict[tuple[int, int], str] = {}
        self._wake = asyncio.Event()
        # What the last look found recorded and not accounted for, and when it began (monotonic).
        self._seen: set[Stray] = set()
        self._seen_at = 0.0
        # Looks still to come SOON apart (after an uncertain claim).
        self._quick = 0
        # Attempts put back so far (tests, logs).
        self.returned = 0

    def heartbeat(self, session: WorkerSession, running: Sequence[task_pb2.TaskRef], read: int) -> None:
        """The worker held the `running` attempts when it had read `read` assignment entries on its
        stream: those it must know of and does not list leave its session and are put back."""
        listed = {(ref.task_id, ref.attempt) for ref in running}
        gone = session.not_held(listed, read)
        if not gone:
            return
        for task_id, attempt in gone:
            session.drop(task_id)
            session.traces.pop(task_id, None)
            self._returning[(task_id, attempt)] = session.worker_id
        log.warning(
            "dispatch.assignments_not_held",
            extra={"worker_id": session.worker_id, "attempts": len(gone), "detail": "put back to be handed out again"},
        )
        self._wake.set()
        session.wake.set()  # its slots are free

    async def run(self) -> None:
        backoff = Backoff(initial=0.2, maximum=5.0)
        loop = asyncio.get_running_loop()
        next_look = loop.time() + self._interval
        while True:
            if self._uncertain.is_set():
                self._uncertain.clear()
                self._quick = 2
                next_look = loop.time()
            left = next_look - loop.time()
            if left > 0 and not self._wake.is_set():
                waits = [asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(self._uncertain.wait())]
                try:
                    await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for waiting in waits:
                        waiting.cancel()
                continue
            self._wake.clear()
            try:
                if loop.time() >= next_look:
                    await self.look()
                    self._quick = max(0, self._quick - 1)
                    next_look = loop.time() + (SOON if self._quick else self._interval)
                await self.put_back()
            except DatabaseUnavailable as error:
                log.warning("dispatch.strays_deferred", extra={"error": str(error)})
                self._wake.set()
                await asyncio.sleep(backoff.next_delay())
                continue
            backoff.reset()

    async def look(self) -> None:
        """One look at what the database records as running on this replica's workers: what was
        not accounted for in this look and the last one, with no claim of its worker running since
        before the last, is put back."""
        began = time.monotonic()
        sessions = [s for s in self._registry if not s.closed]
        if not sessions:
            self._seen = set()
            return
        rows = await self._store.running_on_workers([s.worker_id for s in sessions], self._scheduler_id)
        unwritten = self._completer.unwritten()
        unaccounted: set[Stray] = set()
        for row in rows:
            ref = (row.id, row.attempt)
            session = self._registry.get(row.worker_id)
            if session is None or session.closed or session.holds(ref) or ref in unwritten or ref in self._returning:
                continue
            unaccounted.add((row.id, row.attempt, row.worker_id))
        for task_id, attempt, worker_id in unaccounted & self._seen:
            session = self._registry.get(worker_id)
            if session is not None and not session.claimed_before(self._seen_at):
                self._returning[(task_id, attempt)] = worker_id
        self._seen, self._seen_at = unaccounted, began

    async def put_back(self) -> None:
        """Puts the strays found so far back pending, in one statement."""
        if not self._returning:
            return
        batch = dict(self._returning)
        returned = await self._store.return_strays(batch, self._scheduler_id)
        for ref in batch:
            self._returning.pop(ref, None)
        if returned:
            self.returned += len(returned)
            if self._counter is not None:
                self._counter.add(len(returned))
            log.warning(
                "dispatch.strays_returned",
                extra={
                    "attempts": len(returned),
                    "detail": "recorded as running on a worker that never got them: pending again",
                },
            )
            self._registry.wake_all()
