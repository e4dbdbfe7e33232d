"""The reading half of a worker stream: results, heartbeats, slot and hold changes.

Every report is fenced by (task id, attempt): one for an attempt the worker no longer holds is
refused, never applied.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence, Sized
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from lowtide.errors import DatabaseUnavailable, FailedPrecondition, InvalidArgument, TooFast
from lowtide_proto.lowtide.v1 import worker_pb2
from scheduler_service.domain.model import Failure, State
from scheduler_service.domain.retry import after_failure, after_success
from scheduler_service.domain.token_bucket import TokenBucket
from scheduler_service.fleet.heartbeats import HeartbeatDeadlines
from scheduler_service.fleet.sessions import WorkerSession
from scheduler_service.holds.fixed_starts import FixedStarts
from scheduler_service.observe.tracing import now_ns
from scheduler_service.store import Store
from scheduler_service.wire.inbound import name, stored_text
from scheduler_service.workers.completer import Completer
from scheduler_service.workers.strays import Strays

if TYPE_CHECKING:
    from scheduler_service.observe.metrics import SchedulerMetrics

log = logging.getLogger("lowtide.scheduler.workers")

MAX_SLOTS = 10_000
# Heartbeat details (an activity's progress) are stored per task; bounded like headers.
MAX_HEARTBEAT_DETAILS = 4096
# What one worker may name in its Hello: activity types, queues, and the (queue, type) pairs they
# make, which every claim for its group walks (a Hello of 1,000 queues x 1,000 types, 14 KB, held
# the scheduler's event loop for 3 s; 10,000 pairs cost it tens of milliseconds).
MAX_ACTIVITY_TYPES = 1_000
MAX_QUEUES = 1_000
MAX_PAIRS = 10_000
# Attempts one message may name (Hello.running, Results, Heartbeat.running and .details): a worker
# holds at most its slots, and results it could not send yet were in its slots too.
MAX_LISTED = 2 * MAX_SLOTS


def at_most(field: str, items: Sized, limit: int, what: str) -> None:
    """InvalidArgument naming `field` when it lists more than `limit` entries; checked before any
    entry is looked at."""
    if len(items) > limit:
        raise InvalidArgument(field, f"must name at most {limit:,} {what}, not {len(items):,}")


class WorkerReader:
    def __init__(
        self,
        *,
        store: Store,
        completer: Completer,
        beats: HeartbeatDeadlines,
        fixed: FixedStarts,
        metrics: SchedulerMetrics,
        strays: Strays,
    ) -> None:
        self._store = store
        self._completer = completer
        self._beats = beats
        self._strays = strays
        self.fixed = fixed
        self.metrics = metrics

    async def read(self, session: WorkerSession, messages: AsyncIterator[worker_pb2.WorkerMessage]) -> None:
        # The messages that may each start a claim (domain.token_bucket).
        allowance = TokenBucket()
        async for message in messages:
            if session.closed:
                # Replaced by a newer stream: nothing more from this one is applied.
                return
            kind = message.WhichOneof("message")
            if kind == "results":
                at_most("results.results", message.results.results, MAX_LISTED, "results")
                self.on_results(session, message.results)
            elif kind == "heartbeat":
                at_most("heartbeat.running", message.heartbeat.running, MAX_LISTED, "attempts")
                at_most("heartbeat.details", message.heartbeat.details, MAX_LISTED, "attempts")
                await self._on_heartbeat(session, message.heartbeat)
            elif kind == "slot_update":
                _spend(allowance)
                if message.slot_update.slots > MAX_SLOTS:
                    raise InvalidArgument("slot_update.slots", f"must be at most {MAX_SLOTS}")
                grew = message.slot_update.slots > session.slots
                session.slots = message.slot_update.slots
                if grew:
                    # More room: its group claims for it (fewer slots free none).
                    session.wake.set()
                if message.slot_update.answer:
                    # Behind every assignment already queued for the stream; a claim still
                    # running hands its rows back rather than send them past a zero (dispatcher).
                    taken = worker_pb2.SlotsTaken(slots=session.slots)
                    session.send(worker_pb2.SchedulerMessage(slots_taken=taken))
            elif kind == "hold_update":
                _spend(allowance)
                at_most("hold_update.held_types", message.hold_update.held_types, MAX_ACTIVITY_TYPES, "types")
                holding = frozenset(name("hold_update.held_types", t) for t in message.hold_update.held_types)
                released = session.predicate_held - holding
                session.predicate_held = holding
                if released:
                    session.wake.set()
            elif kind == "hello":
                raise FailedPrecondition("hello may only be sent once, as the first message")
            else:
                raise InvalidArgument("message", "empty or unknown worker message")

    async def _on_heartbeat(self, session: WorkerSession, heartbeat: worker_pb2.Heartbeat) -> None:
        # The lease is renewed with every other session's on the replica's next tick (leases.py),
        # the listed attempts' heartbeat deadlines within the next window (fleet/heartbeats.py).
        lease = session.lease
        lease.heard = True
        lease.heard_at = time.monotonic()
        if heartbeat.running:
            held = [(r.task_id, r.attempt) for r in heartbeat.running if session.holds((r.task_id, r.attempt))]
            if held:
                self._beats.note(session.worker_id, held)
        if heartbeat.HasField("assignments_read"):
            # It lists every attempt it holds: those it must know of and does not list go back.
            self._strays.heartbeat(session, heartbeat.running, heartbeat.assignments_read)
        if not heartbeat.details:
            return
        details = _held_details(session, heartbeat.details)
        if not details:
            return
        try:
            # Rare (an activity's progress), and written before the stream's next message is read,
            # so a result that follows the details never lands first.
            await self._store.heartbeat_details(session.worker_id, details)
        except DatabaseUnavailable as error:
            log.warning("worker.heartbeat_deferred", extra={"worker_id": session.worker_id, "error": str(error)})

    def on_results(self, session: WorkerSession, results: worker_pb2.Results) -> None:
        now = datetime.now(UTC)
        clock = asyncio.get_running_loop().time()
        stale: list[tuple[int, int]] = []
        empty: list[tuple[int, int]] = []
        freed = False
        for result in results.results:
            ref = (result.task.task_id, result.task.attempt)
            attempt = session.in_flight.get(ref[0])
            if attempt is None or attempt.attempt != ref[1]:
                stale.append(ref)
                continue
            outcome_kind = result.WhichOneof("outcome")
            if outcome_kind == "success":
                outcome = after_success(attempt, result.success)
            elif outcome_kind == "failure":
                failure = Failure(
                    stored_text(result.failure.error_type, 200) or "Error",
                    stored_text(result.failure.message, 8192),
                    result.failure.non_retryable,
                )
                outcome = after_failure(attempt, failure, now)
            else:
                # Refused, and the attempt stays this worker's, to be reported properly.
                empty.append(ref)
                continue
            sent_at = session.sent_at.get(ref[0])
            session.drop(ref[0])
            freed = True
            # Only traced attempts have a context here (tracing on): their result gets a span.
            traced = (session.traces.pop(ref[0], None), now_ns()) if session.traces else None
            if not attempt.fixed and sent_at is not None and outcome_kind == "success":
                self.fixed.record_run(session.pool, clock - sent_at)
            if attempt.fixed and outcome.state is State.PENDING:
                self.fixed.mark_due(session.pool, outcome.run_at)
            self._completer.add(outcome, session, traced)
        session.reject(stale, "the attempt is not held by this worker")
        session.reject(empty, "the result has no outcome: set success or failure")
        if stale:
            self.metrics.rejected.add(len(stale), {"reason": "not_held"})
        if empty:
            self.metrics.rejected.add(len(empty), {"reason": "no_outcome"})
        if freed and (session.group is None or session.group.behind):
            # Its slots freed: its group claims for them, if work may wait (Group.behind). A
            # report that freed none (empty, or only refused) asks for no claim, or a worker
            # sending such could keep one running.
            session.wake.set()


def _spend(allowance: TokenBucket) -> None:
    """TooFast (the stream ends with RESOURCE_EXHAUSTED) once the worker sends the messages that
    may each start a claim faster than the bucket allows."""
    if not allowance.take(time.monotonic()):
        raise TooFast(
            f"the worker sends slot and hold updates faster than {allowance.rate:g} "
            f"a second (in a burst, {allowance.burst:g}): each may cost the scheduler a database statement"
        )


def _held_details(
    session: WorkerSession, reported: Sequence[worker_pb2.HeartbeatDetails]
) -> list[tuple[int, int, bytes]]:
    """The heartbeat details of the attempts the session holds (the last per attempt wins)."""
    kept: dict[tuple[int, int], bytes] = {}
    for entry in reported:
        if len(entry.details) > MAX_HEARTBEAT_DETAILS:
            raise InvalidArgument(
                "heartbeat.details",
                f"task {entry.task.task_id}: {len(entry.details)} bytes is over the limit of {MAX_HEARTBEAT_DETAILS}",
            )
        ref = (entry.task.task_id, entry.task.attempt)
        if session.holds(ref):
            kept[ref] = bytes(entry.details)
    return [(task_id, attempt, data) for (task_id, attempt), data in kept.items()]
