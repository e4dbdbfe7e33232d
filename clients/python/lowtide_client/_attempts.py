"""The attempts a worker runs and the results it has yet to send.

Both outlive any one stream: when the stream breaks, attempts keep running and their results
wait here for the next stream. The stream code (``_runtime``) only asks this registry what
to put in a Hello or a Heartbeat, and takes the waiting results when it can write them.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import UTC, datetime
from types import MappingProxyType

from lowtide_client._activities import (
    Activity,
    UnknownActivityType,
    failure_result,
    invoke,
    success_result,
)
from lowtide_client._log import log_event
from lowtide_client._tracing import attempt_span, failed, traced
from lowtide_client.activity import ActivityContext, _enter
from lowtide_proto.lowtide.v1 import task_pb2, worker_pb2

__all__ = ["Attempt", "Attempts"]

# An attempt still running this long after its start-to-close deadline is abandoned. The
# deadline is on the scheduler's clock, so the margin also absorbs some clock skew.
_DEADLINE_GRACE = 5.0
# The headers of the attempts that have none (most): one read-only mapping for all.
_NO_HEADERS: Mapping[str, str] = MappingProxyType({})
# How long abandoned (cancelled) attempts get to unwind.
_CANCEL_WAIT = 5.0
# Heartbeat details an activity reported go out within about this long.
_DETAILS_DELAY = 0.1


@dataclass(eq=False, slots=True)
class Attempt:
    """One attempt this worker runs; a ``discarded`` attempt is never reported."""

    ref: task_pb2.TaskRef
    heartbeat_timeout: float | None
    task: asyncio.Task[None] | None = None
    #: The second (loop time) whose shared timer abandons it past its deadline, if it has one.
    deadline_second: int | None = None
    discarded: bool = False
    context: ActivityContext | None = None
    #: Heartbeat details the activity reported, not yet sent.
    details: bytes | None = None

    @property
    def key(self) -> tuple[int, int]:
        return (self.ref.task_id, self.ref.attempt)

    def abandon(self) -> None:
        """Stop the attempt and drop its result: it is no longer this worker's to report."""
        self.discarded = True
        if self.context is not None:
            self.context.cancelled.set()  # what a plain function (in a thread) can check
        if self.task is not None:
            self.task.cancel()


class Attempts:
    """Starts attempts, collects their results, and forgets the ones taken away from us.

    ``on_result`` is called (on the event loop) whenever a result is added, so that the
    stream can send it soon; several results that finish before it gets to write travel
    together.
    """

    def __init__(
        self,
        *,
        activities: Mapping[str, Activity],
        executor: Executor,
        slots: int,
        on_result: Callable[[], None],
    ) -> None:
        self._activities = activities
        self._executor = executor
        self._slots = slots
        # The scheduler only fills free slots; this keeps the limit even if it did not.
        self._slot_guard = asyncio.Semaphore(slots)
        self._on_result = on_result
        self.running: dict[tuple[int, int], Attempt] = {}
        #: Finished attempts' results, oldest first, not yet written to a stream.
        self.unsent: list[worker_pb2.TaskResult] = []
        #: Set when an attempt starts that the heartbeat loop's current wait is too long for
        #: (the heartbeat period may have to shrink), or when heartbeat details wait to go out.
        self.started = asyncio.Event()
        #: Set by the heartbeat loop before each wait: when it beats next (loop time), and the
        #: period it keeps while attempts run. A start wakes it only when that beat is too late.
        self.beat_at = 0.0
        self.busy_period = 0.0
        # Running attempts by the second (loop time) their deadline and grace run out in, each
        # second with one timer: a claim's batch shares a deadline, and a timer per attempt (a
        # heap push, a cancel, a pop) was a fifth of a worker's Python per task in a drain.
        self._deadlines: dict[int, tuple[asyncio.TimerHandle, set[Attempt]]] = {}

    def unreported_refs(self) -> list[task_pb2.TaskRef]:
        """Attempts still ours: running, or finished with the result not yet sent."""
        refs = {attempt.key: attempt.ref for attempt in self.running.values()}
        for result in self.unsent:
            refs.setdefault((result.task.task_id, result.task.attempt), result.task)
        return list(refs.values())

    def heartbeat_period(self, interval: float, idle_interval: float | None = None) -> float:
        """Heartbeat often enough for the lease and for every running attempt's own timeout; with
        nothing running and no result unsent, every `idle_interval` (when the scheduler names one)."""
        if idle_interval is not None and not self.running and not self.unsent:
            return max(interval, idle_interval)
        timeouts = [a.heartbeat_timeout for a in self.running.values() if a.heartbeat_timeout]
        if any(a.details is not None for a in self.running.values()):
            timeouts.append(_DETAILS_DELAY * 3)  # reported details go out soon
        return max(0.05, min([interval, *(t / 3 for t in timeouts)]))

    def take_details(self) -> list[worker_pb2.HeartbeatDetails]:
        """The heartbeat details reported since the last heartbeat (then forgotten)."""
        taken = []
        for attempt in self.running.values():
            if attempt.details is not None:
                taken.append(worker_pb2.HeartbeatDetails(task=attempt.ref, details=attempt.details))
                attempt.details = None
        return taken

    def _details_reported(self, attempt: Attempt, data: bytes) -> None:
        if self.running.get(attempt.key) is attempt:
            attempt.details = data
            self.started.set()  # wakes the heartbeat loop to send them

    def tasks(self) -> set[asyncio.Task[None]]:
        return {attempt.task for attempt in self.running.values() if attempt.task is not None}

    def mark_sent(self, batch: list[worker_pb2.TaskResult]) -> None:
        sent = {id(result) for result in batch}
        self.unsent = [result for result in self.unsent if id(result) not in sent]

    def start(self, assignment: worker_pb2.Assignment) -> None:
        ref = assignment.task
        key = (ref.task_id, ref.attempt)
        if key in self.running:
            log_event(logging.WARNING, "worker.duplicate_assignment", task_id=ref.task_id, attempt=ref.attempt)
            return
        if len(self.running) >= self._slots:
            log_event(logging.WARNING, "worker.over_capacity", running=len(self.running), slots=self._slots)
        heartbeat_timeout = None
        if assignment.HasField("heartbeat_timeout"):
            heartbeat_timeout = assignment.heartbeat_timeout.ToTimedelta().total_seconds() or None
        attempt = Attempt(
            ref=task_pb2.TaskRef(task_id=ref.task_id, attempt=ref.attempt),
            heartbeat_timeout=heartbeat_timeout,
        )
        loop = asyncio.get_running_loop()
        deadline = (
            assignment.start_to_close_deadline.ToDatetime(tzinfo=UTC)
            if assignment.HasField("start_to_close_deadline")
            else None
        )
        attempt.context = ActivityContext(
            task_id=ref.task_id,
            attempt=ref.attempt,
            activity_type=assignment.activity_type,
            deadline=deadline,
            headers=dict(assignment.headers) if assignment.headers else _NO_HEADERS,
            _report=lambda data: loop.call_soon_threadsafe(self._details_reported, attempt, data),
        )
        task = loop.create_task(
            self._execute(attempt, assignment.activity_type, assignment.payload, assignment.headers),
            name=f"lowtide-attempt-{ref.task_id}-{ref.attempt}",
        )
        attempt.task = task
        task.add_done_callback(lambda _: self._finished(attempt))
        self.running[key] = attempt
        if deadline is not None:
            self._watch(attempt, loop, max(0.0, (deadline - datetime.now(UTC)).total_seconds()))
        if heartbeat_timeout is not None or self.beat_at > loop.time() + self.busy_period:
            # A short heartbeat timeout, or an idle worker's long wait: the loop recomputes.
            # Otherwise its next beat comes on time already (one wake per start was a tenth of
            # a small worker's CPU in a drain).
            self.started.set()
        log_event(
            logging.DEBUG,
            "worker.attempt_started",
            task_id=ref.task_id,
            attempt=ref.attempt,
            activity_type=assignment.activity_type,
        )

    def forget(self, ref: task_pb2.TaskRef, *, event: str, reason: str) -> None:
        """Drop an attempt that is no longer ours: stop it, and never report its result."""
        key = (ref.task_id, ref.attempt)
        log_event(logging.INFO, event, task_id=ref.task_id, attempt=ref.attempt, reason=reason)
        attempt = self.running.get(key)
        if attempt is not None:
            attempt.abandon()
        self.unsent = [r for r in self.unsent if (r.task.task_id, r.task.attempt) != key]

    async def abandon_all(self, reason: str) -> None:
        """Cancel every running attempt without reporting it; the scheduler re-dispatches them.

        A plain function keeps running in its thread until it returns (Python threads cannot
        be interrupted); only its result is dropped.
        """
        attempts = list(self.running.values())
        for attempt in attempts:
            log_event(
                logging.WARNING,
                "worker.attempt_abandoned",
                task_id=attempt.ref.task_id,
                attempt=attempt.ref.attempt,
                reason=reason,
            )
            attempt.abandon()
        tasks = [a.task for a in attempts if a.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=_CANCEL_WAIT)

    async def _execute(self, attempt: Attempt, activity_type: str, payload: bytes, headers: Mapping[str, str]) -> None:
        # CancelledError (scheduler cancel, deadline, shutdown) propagates: never reported.
        ref = attempt.ref
        if attempt.context is not None:
            _enter(attempt.context)  # this task's own context, copied into a plain function's thread
        async with self._slot_guard:
            if traced(headers):
                with attempt_span(
                    headers, task_id=ref.task_id, attempt=ref.attempt, activity_type=activity_type
                ) as span:
                    result = await self._run(attempt, activity_type, payload, span)
            else:
                result = await self._run(attempt, activity_type, payload, None)
        if attempt.discarded:
            return
        self.unsent.append(result)
        self._on_result()

    async def _run(self, attempt: Attempt, activity_type: str, payload: bytes, span: object) -> worker_pb2.TaskResult:
        activity = self._activities.get(activity_type)
        try:
            if activity is None:
                raise UnknownActivityType(f"activity {activity_type!r} is not registered on this worker")
            return success_result(attempt.ref, await invoke(activity, payload, self._executor))
        except (Exception, SystemExit) as exc:
            # SystemExit too: sys.exit() in an activity fails its attempt, it does not end the
            # worker (and every attempt running beside it). KeyboardInterrupt, an operator's
            # Ctrl-C that may land in any code running on the loop, still stops the worker.
            log_event(
                logging.INFO,
                "worker.attempt_failed",
                exc_info=True,
                task_id=attempt.ref.task_id,
                attempt=attempt.ref.attempt,
                activity_type=activity_type,
                error_type=type(exc).__name__,
            )
            failed(span, exc)
            return failure_result(attempt.ref, exc)

    def _finished(self, attempt: Attempt) -> None:
        # A done callback rather than a finally: a task cancelled before its first step never
        # runs its body, but must still leave the running set.
        if self.running.get(attempt.key) is attempt:
            del self.running[attempt.key]
        self._unwatch(attempt)
        task = attempt.task
        if task is not None and not task.cancelled() and task.exception() is not None:
            log_event(
                logging.ERROR,
                "worker.attempt_crashed",
                task_id=attempt.ref.task_id,
                attempt=attempt.ref.attempt,
                error=repr(task.exception()),
            )

    def _watch(self, attempt: Attempt, loop: asyncio.AbstractEventLoop, remaining: float) -> None:
        """Abandons the attempt once `remaining` seconds and the grace have passed (up to a second
        later: the deadlines of a second share a timer), unless it ends first."""
        second = math.ceil(loop.time() + remaining + _DEADLINE_GRACE)
        watched = self._deadlines.get(second)
        if watched is None:
            watched = self._deadlines[second] = (loop.call_at(second, self._second_passed, second), set())
        watched[1].add(attempt)
        attempt.deadline_second = second

    def _unwatch(self, attempt: Attempt) -> None:
        second = attempt.deadline_second
        if second is None:
            return
        attempt.deadline_second = None
        watched = self._deadlines.get(second)
        if watched is not None:
            watched[1].discard(attempt)
            if not watched[1]:
                watched[0].cancel()
                del self._deadlines[second]

    def _second_passed(self, second: int) -> None:
        _, attempts = self._deadlines.pop(second, (None, set()))
        for attempt in attempts:
            attempt.deadline_second = None
            self._deadline_passed(attempt)

    def _deadline_passed(self, attempt: Attempt) -> None:
        # The scheduler has failed this attempt by now; stop spending a slot on it.
        if self.running.get(attempt.key) is attempt:
            log_event(
                logging.WARNING,
                "worker.attempt_deadline_passed",
                task_id=attempt.ref.task_id,
                attempt=attempt.ref.attempt,
            )
            attempt.abandon()
