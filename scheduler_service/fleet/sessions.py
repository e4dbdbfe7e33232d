"""Connected workers, one session per Connect stream, and the registry that finds them.

The registry also keeps the sessions in dispatch groups (sessions that may run the same work,
see domain.dispatch) and which groups asked for a claim: a session's `wake.set()` asks for one
for its group, and the replica's one dispatcher (dispatch/dispatcher.py) claims for the group.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from lowtide.errors import LowtideError
from lowtide_proto.lowtide.v1 import task_pb2, worker_pb2
from scheduler_service.domain.dispatch import GroupKey
from scheduler_service.domain.leases import LeaseState
from scheduler_service.domain.model import Attempt

if TYPE_CHECKING:
    from opentelemetry.context import Context

# Messages waiting for a worker that does not read its stream: assignments never exceed its
# slots, but rejections answer every report it sends, so a worker that writes without reading
# could otherwise fill the scheduler's memory. Past this many (plus two per slot: a cancel and a
# rejection for each attempt it may hold, which a reading worker can meet in a burst) its stream
# is ended.
MAX_OUTBOX = 1000


class Wake:
    """A session's call for a claim (its slots freed, a task it may run arrived): `set()` asks the
    replica's dispatcher to claim for the session's group. Does nothing until the session is
    registered."""

    __slots__ = ("notify",)

    def __init__(self) -> None:
        self.notify: Callable[[], None] | None = None

    def set(self) -> None:
        if self.notify is not None:
            self.notify()


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
        # The name of the token its stream was made with (None: auth off): its worker id is that
        # token's while it is connected (worker_attach.may_take_over).
        self.token_name: str | None = None
        # The worker's own cost-deferrable types (held with the signal), and the types it holds
        # by its own predicate (HoldUpdate), whatever the signal says.
        self.cost_deferrable: frozenset[str] = frozenset()
        self._predicate_held: frozenset[str] = frozenset()
        # Its own held types changed since the registry last put it in its group.
        self.regroup = False
        # Fixed-start tasks this worker keeps a slot idle for (see fixed_starts.py).
        self.held: set[int] = set()
        # Slots that claims running now may fill (reserved by the dispatcher while they run).
        self.claiming = 0
        # When each in-flight attempt was sent (loop time), for the pool's run-time samples.
        self.sent_at: dict[int, float] = {}
        # Assignment entries queued for the stream so far, and the number of each in-flight
        # attempt's among them (none for those its hello listed): a heartbeat saying how many the
        # worker had read tells which it must know of (Heartbeat.assignments_read, see `not_held`).
        self.assigned = 0
        self.assigned_as: dict[int, int] = {}
        # When each claim that may fill its slots and runs now began (time.monotonic): rows
        # recorded as its worker's that it does not hold may still be on their way from one.
        self.claims_since: list[float] = []
        # The trace context of each traced in-flight attempt (tracing on only), for its result's span.
        self.traces: dict[int, Context] = {}
        self.outbox: asyncio.Queue[worker_pb2.SchedulerMessage] = asyncio.Queue()
        self.wake = Wake()
        # The dispatch group it is in while registered.
        self.group: Group | None = None
        self.closed = False
        self.draining = False
        # When it was last heard from, and what its lease was last renewed for (see leases.py).
        self.lease = LeaseState(heard_at=time.monotonic(), leased_slots=slots)
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

    def assign(self, task_id: int, attempt: Attempt, now: float) -> None:
        """Records an attempt queued for the worker (sent at `now`, loop time)."""
        self.assigned += 1
        self.in_flight[task_id] = attempt
        self.sent_at[task_id] = now
        self.assigned_as[task_id] = self.assigned

    def drop(self, task_id: int) -> None:
        """Forgets an in-flight attempt: it no longer takes a slot."""
        del self.in_flight[task_id]
        self.sent_at.pop(task_id, None)
        self.assigned_as.pop(task_id, None)

    def not_held(self, listed: set[tuple[int, int]], read: int) -> list[tuple[int, int]]:
        """The in-flight attempts the worker must know of, having read `read` assignment entries
        on this stream (and those its hello listed), that its heartbeat's `listed` leaves out."""
        assigned_as = self.assigned_as
        return [
            (task_id, attempt.attempt)
            for task_id, attempt in self.in_flight.items()
            if assigned_as.get(task_id, 0) <= read and (task_id, attempt.attempt) not in listed
        ]

    def claimed_before(self, moment: float) -> bool:
        """Whether a claim that may fill its slots, begun before `moment` (time.monotonic), runs now."""
        return any(began < moment for began in self.claims_since)

    def holds(self, ref: tuple[int, int]) -> bool:
        """Whether it holds attempt `ref` (task id, attempt) now."""
        attempt = self.in_flight.get(ref[0])
        return attempt is not None and attempt.attempt == ref[1]

    @property
    def predicate_held(self) -> frozenset[str]:
        return self._predicate_held

    @predicate_held.setter
    def predicate_held(self, value: frozenset[str]) -> None:
        self._predicate_held = value
        self.regroup = True

    def key(self) -> GroupKey:
        """What it may run now: sessions with equal keys share every claim."""
        return GroupKey(self.pool, self.queues, self.activity_types, self.cost_deferrable, self.predicate_held)

    @property
    def room(self) -> int:
        """Slots not busy (held ones included): what due fixed starts may take."""
        if self.closed or self.draining:
            return 0
        return max(0, self.slots - len(self.in_flight) - self.claiming)

    @property
    def free(self) -> int:
        if self.closed or self.draining:
            return 0
        return max(0, self.slots - len(self.in_flight) - len(self.held) - self.claiming)

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
            if self.holds((task_id, attempt)):
                self.drop(task_id)
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


class Group:
    """The sessions of one replica that may run the same work (equal keys): one claim serves them
    all, and at most CLAIMS_PER_GROUP run for them at a time (each on slots the others do not
    take)."""

    def __init__(self, key: GroupKey) -> None:
        self.key = key
        self.members: dict[str, WorkerSession] = {}
        # Where the next claim's hand-out starts (rotated each claim, see domain.dispatch.hand_out).
        self.turn = 0
        # A claim was asked for since the last one began; the replica's poll came since then;
        # something else asked (a wake: a submit, a freed slot), which a poll alone does not.
        self.wanted = False
        self.polled = False
        self.woken = False
        # Claims running for the group now.
        self.claims = 0
        # Work may wait for the group's slots: its last claim came back full, failed, or found
        # no free slot for what woke it. Until then a freed slot need not claim: new work wakes
        # the group (or is handed to it) as it comes, and the poll looks for the rest.
        self.behind = True


class Registry:
    def __init__(self) -> None:
        self._sessions: dict[str, WorkerSession] = {}
        self._groups: dict[GroupKey, Group] = {}
        # Groups that asked for a claim since the dispatcher last looked, and its wake-up.
        self.wanted: dict[GroupKey, Group] = {}
        self.changed = asyncio.Event()
        # Told of each ask as it is made, while the dispatcher runs (see on_want).
        self._listener: Callable[[Group], None] | None = None

    def __iter__(self) -> Iterator[WorkerSession]:
        return iter(list(self._sessions.values()))

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, worker_id: str) -> WorkerSession | None:
        return self._sessions.get(worker_id)

    def add(self, session: WorkerSession) -> None:
        self._sessions[session.worker_id] = session
        self._join(session)
        session.wake.notify = lambda: self.want(session)

    def remove(self, session: WorkerSession) -> None:
        if self._sessions.get(session.worker_id) is session:
            del self._sessions[session.worker_id]
        self._leave(session)
        session.wake.notify = None

    def groups(self) -> list[Group]:
        return list(self._groups.values())

    def want(self, session: WorkerSession) -> None:
        """Asks for a claim for the session's group."""
        if session.group is not None:
            self.want_group(session.group)

    def want_group(self, group: Group) -> None:
        group.woken = True
        self._want(group)

    def on_want(self, listener: Callable[[Group], None] | None) -> None:
        """While set, `listener` is told of every ask as it is made (the running dispatcher
        starts the group's claim at once, rather than a few turns of the event loop later when
        its own loop looks); the asks are recorded for the dispatcher's loop all the same."""
        self._listener = listener

    def _want(self, group: Group) -> None:
        group.wanted = True
        self.wanted[group.key] = group
        self.changed.set()
        if self._listener is not None:
            self._listener(group)

    def wake_all(self) -> None:
        for group in self._groups.values():
            self.want_group(group)

    def poll(self) -> None:
        """The replica's poll: every group claims once (due fixed starts included)."""
        for group in self._groups.values():
            group.polled = True
            self._want(group)

    def take_wanted(self) -> list[Group]:
        groups = list(self.wanted.values())
        self.wanted.clear()
        return groups

    def members(self, group: Group) -> list[WorkerSession]:
        """The group's sessions that can take work now. A session whose key changed since it
        joined (its own held types did) moves to its new group first, which is asked to claim."""
        out = []
        for session in list(group.members.values()):
            if session.regroup:
                session.regroup = False
                if session.key() != group.key:
                    self._leave(session)
                    self._join(session)
                    self.want(session)
                    continue
            if not (session.closed or session.draining):
                out.append(session)
        return out

    def _join(self, session: WorkerSession) -> None:
        key = session.key()
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = Group(key)
        group.members[session.worker_id] = session
        session.group = group

    def _leave(self, session: WorkerSession) -> None:
        group = session.group
        if group is None:
            return
        session.group = None
        if group.members.get(session.worker_id) is session:
            del group.members[session.worker_id]
        if not group.members and self._groups.get(group.key) is group:
            del self._groups[group.key]

    def holding(self, worker_id: str | None, ref: tuple[int, int]) -> WorkerSession | None:
        """The session of `worker_id` on this replica, if it holds attempt `ref` (task id, attempt) now."""
        session = self._sessions.get(worker_id) if worker_id is not None else None
        return session if session is not None and session.holds(ref) else None


# A claim's slots: the sessions it fills and how many of each one's slots (domain.dispatch.take_slots).
Slots = list[tuple[WorkerSession, int]]


@contextlib.contextmanager
def reserved(taken: Slots) -> Iterator[None]:
    """Reserves the slots a claim may fill while it runs, so a claim running beside it for the
    same group takes other slots."""
    began = time.monotonic()
    for session, count in taken:
        session.claiming += count
        session.claims_since.append(began)
    try:
        yield
    finally:
        for session, count in taken:
            session.claiming -= count
            session.claims_since.remove(began)
