"""Connected workers, one session per Connect stream, and the registry that finds them."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

from lowtide.errors import LowtideError
from lowtide_proto.lowtide.v1 import task_pb2, worker_pb2
from scheduler_service.domain.model import Attempt

# Messages waiting for a worker that does not read its stream: assignments never exceed its
# slots, but rejections answer every report it sends, so a worker that writes without reading
# could otherwise fill the scheduler's memory. Past this many (plus two per slot: a cancel and a
# rejection for each attempt it may hold, which a reading worker can meet in a burst) its stream
# is ended.
MAX_OUTBOX = 1000


class WorkerSession:
    """What the scheduler knows of one connected worker.

    `in_flight` holds the attempts it was sent and has not reported: the worker's busy slots.
    Reports are fenced against it first (cheap), then against the database (authoritative).
    """

    def __init__(
        self,
        *,
        worker_id: str,
        pool: str,
        queues: tuple[str, ...],
        activity_types: tuple[str, ...],
        slots: int,
    ) -> None:
        self.worker_id = worker_id
        self.pool = pool
        self.queues = queues
        self.activity_types = activity_types
        self.slots = slots
        self.in_flight: dict[int, Attempt] = {}
        # The worker's own cost-deferrable types (held with the signal), and the types it holds
        # by its own predicate (HoldUpdate), whatever the signal says.
        self.cost_deferrable: frozenset[str] = frozenset()
        self.predicate_held: frozenset[str] = frozenset()
        # Fixed-start tasks this worker keeps a slot idle for (see fixed_starts.py).
        self.held: set[int] = set()
        # When each in-flight attempt was sent (loop time), for the pool's run-time samples.
        self.sent_at: dict[int, float] = {}
        self.outbox: asyncio.Queue[worker_pb2.SchedulerMessage] = asyncio.Queue()
        self.wake = asyncio.Event()
        self.closed = False
        self.draining = False
        # Set once its unreported attempts have been ended, so that is never done twice.
        self.released = False
        # Set when the scheduler shuts down: the stream ends and the worker reconnects elsewhere.
        self.detached = asyncio.Event()
        # Set when the outbox is full (see MAX_OUTBOX): the stream ends with RESOURCE_EXHAUSTED.
        self.overflowed = asyncio.Event()
        # Set by end(): the stream ends with `end_error`'s status (a newer stream took over the
        # worker id, or its lease ran out).
        self.ended = asyncio.Event()
        self.end_error: LowtideError | None = None
        # Why its unreported attempts are lost when the stream ends (the WorkerLost message).
        self.lost_reason = "the worker's stream closed while the attempt ran"

    def end(self, error: LowtideError) -> None:
        """Ends the stream with the error's status; takes no more work meanwhile."""
        if self.end_error is None:
            self.end_error = error
        self.draining = True
        self.ended.set()

    @property
    def free(self) -> int:
        if self.closed or self.draining:
            return 0
        return max(0, self.slots - len(self.in_flight) - len(self.held))

    def send(self, message: worker_pb2.SchedulerMessage) -> None:
        if self.closed:
            return
        if self.outbox.qsize() >= MAX_OUTBOX + 2 * self.slots:
            # Dropping is safe: the stream is ended, and its attempts are released as lost.
            self.overflowed.set()
            return
        self.outbox.put_nowait(message)

    def cancel(self, refs: list[tuple[int, int]]) -> None:
        """Stops attempts on the worker; they no longer take its slots."""
        dropped = []
        for task_id, attempt in refs:
            held = self.in_flight.get(task_id)
            if held is not None and held.attempt == attempt:
                del self.in_flight[task_id]
                dropped.append(task_pb2.TaskRef(task_id=task_id, attempt=attempt))
        if dropped:
            self.send(worker_pb2.SchedulerMessage(cancel=worker_pb2.CancelTasks(tasks=dropped)))
            self.wake.set()

    def reject(self, refs: list[tuple[int, int]], reason: str) -> None:
        if not refs:
            return
        reports = [
            worker_pb2.RejectedReport(task=task_pb2.TaskRef(task_id=t, attempt=a), reason=reason) for t, a in refs
        ]
        self.send(worker_pb2.SchedulerMessage(rejected=worker_pb2.ReportsRejected(reports=reports)))


class Registry:
    def __init__(self) -> None:
        self._sessions: dict[str, WorkerSession] = {}

    def __iter__(self) -> Iterator[WorkerSession]:
        return iter(list(self._sessions.values()))

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, worker_id: str) -> WorkerSession | None:
        return self._sessions.get(worker_id)

    def add(self, session: WorkerSession) -> None:
        self._sessions[session.worker_id] = session

    def remove(self, session: WorkerSession) -> None:
        if self._sessions.get(session.worker_id) is session:
            del self._sessions[session.worker_id]

    def wake_all(self) -> None:
        for session in self._sessions.values():
            session.wake.set()

    def holder_of(self, task_id: int, attempt: int) -> WorkerSession | None:
        for session in self._sessions.values():
            held = session.in_flight.get(task_id)
            if held is not None and held.attempt == attempt:
                return session
        return None
