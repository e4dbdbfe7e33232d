"""WorkerService.Connect: one bidirectional stream per worker.

The first message must be a Hello. After it the scheduler pushes assignments into the worker's
free slots and the worker sends results, heartbeats and slot changes. Every report is fenced by
(task id, attempt): one for an attempt the worker no longer holds is refused, never applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import duration_pb2

from lowtide.errors import (
    Aborted,
    DatabaseUnavailable,
    FailedPrecondition,
    InvalidArgument,
    LowtideError,
    TooLarge,
    Unavailable,
)
from lowtide.grpc_status import abort
from lowtide_proto.durations import format_duration
from lowtide_proto.lowtide.v1 import task_pb2, worker_pb2, worker_pb2_grpc
from scheduler_service.completer import Completer
from scheduler_service.convert import name, stored_text
from scheduler_service.dispatcher import Dispatcher
from scheduler_service.domain.holds import local_conflicts
from scheduler_service.domain.model import Failure, Outcome, State
from scheduler_service.domain.retry import after_failure, after_success
from scheduler_service.fixed_starts import FixedStarts
from scheduler_service.sessions import MAX_OUTBOX, Registry, WorkerSession
from scheduler_service.store import Store, attempt_of

if TYPE_CHECKING:
    from scheduler_service.metrics import SchedulerMetrics

log = logging.getLogger("lowtide.scheduler.workers")

MAX_SLOTS = 10_000


def _duration(value: timedelta) -> duration_pb2.Duration:
    out = duration_pb2.Duration()
    out.FromTimedelta(value)
    return out


def session_from_hello(hello: worker_pb2.Hello, *, config_held: frozenset[str] = frozenset()) -> WorkerSession:
    """A session for the hello, or InvalidArgument / FailedPrecondition saying what is wrong."""
    if not 0 < hello.slots <= MAX_SLOTS:
        raise InvalidArgument("hello.slots", f"must be between 1 and {MAX_SLOTS}")
    types: list[str] = []
    local: list[str] = []
    for activity in hello.activity_types:
        activity_name = name("hello.activity_types.name", activity.name)
        (local if activity.local else types).append(activity_name)
    own_held = frozenset(name("hello.cost_deferrable_activities", t) for t in hello.cost_deferrable_activities)
    conflicts = local_conflicts(own_held | config_held, local)
    if conflicts:
        raise FailedPrecondition(
            f"cost hold names local activity {', '.join(sorted(conflicts))}: a local activity runs inline in "
            "its workflow task and is never queued, so a hold cannot defer it; remove it from the hold"
        )
    if not types:
        raise InvalidArgument("hello.activity_types", "must name at least one activity type that is not local")
    session = WorkerSession(
        worker_id=name("hello.worker_id", hello.worker_id, default=f"worker-{uuid.uuid4().hex[:12]}"),
        pool=name("hello.pool", hello.pool, default="default"),
        queues=tuple(sorted({name("hello.queues", q) for q in hello.queues} or {"default"})),
        activity_types=tuple(sorted(set(types))),
        slots=hello.slots,
    )
    session.cost_deferrable = own_held
    return session


class WorkerStream(worker_pb2_grpc.WorkerServiceServicer):
    def __init__(
        self,
        *,
        store: Store,
        registry: Registry,
        dispatcher: Dispatcher,
        completer: Completer,
        scheduler_id: str,
        heartbeat_interval: timedelta,
        lease_timeout: timedelta,
        limits: Mapping[str, int],
        fixed: FixedStarts,
        metrics: SchedulerMetrics,
        local_types: frozenset[str] = frozenset(),
    ) -> None:
        self._store = store
        self._registry = registry
        self._dispatcher = dispatcher
        self._completer = completer
        self._scheduler_id = scheduler_id
        self._heartbeat_interval = heartbeat_interval
        self._lease = lease_timeout
        self._limits = limits
        self._local_types = local_types
        self.stopping = False
        self._warned_unregistered: set[str] = set()
        self.fixed = fixed
        self.metrics = metrics
        # The releases of ended streams, each its own task so that nothing cancelling a
        # handler (grpc.aio does, once the call is over) can interrupt one half way.
        self._releases: dict[str, asyncio.Task[None]] = {}
        # Sessions whose Connect handler still runs (a drain waits for them to end).
        self._live: set[WorkerSession] = set()
        self._none_live = asyncio.Event()
        self._none_live.set()
        # The Drain sent to every stream once the scheduler stops.
        self._drain: worker_pb2.Drain | None = None

    # Written with context.write() rather than as a generator, so the stub's signature differs.
    async def Connect(  # type: ignore[override]
        self,
        request_iterator: AsyncIterator[worker_pb2.WorkerMessage],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> None:
        try:
            if self.stopping:
                raise Unavailable(
                    "the scheduler is shutting down: connect again with backoff (to another replica, or to this "
                    "one once it is back), listing running attempts in Hello.running"
                )
            try:
                first = await anext(request_iterator)
            except StopAsyncIteration:
                return
            if first.WhichOneof("message") != "hello":
                raise FailedPrecondition("the first message on a worker stream must be a hello")
            holds = self._dispatcher.holds.config
            config_held = holds.deferrable.union(*(holds.per_queue or {}).values())
            session = session_from_hello(first.hello, config_held=config_held)
            # Shielded: a call that ends meanwhile (the worker killed) must not leave the worker
            # half recorded, its row and adopted attempts waiting out the lease.
            registering = asyncio.ensure_future(self._register(session, first.hello))
            try:
                stale = await asyncio.shield(registering)
            except asyncio.CancelledError:
                registering.add_done_callback(lambda done: self._registered_too_late(session, done))
                raise
        except LowtideError as error:
            await abort(context, error)
        log.info("worker.connected", extra={"worker_id": session.worker_id, "slots": session.slots})
        self._live.add(session)
        self._none_live.clear()
        reader = asyncio.create_task(self._read(session, request_iterator))
        feeder = asyncio.create_task(self._dispatcher.run(session))
        write: asyncio.Future[Any] | None = None
        try:
            welcome = worker_pb2.Welcome(
                worker_id=session.worker_id,
                heartbeat_interval=_duration(self._heartbeat_interval),
                lease_timeout=_duration(self._lease),
            )
            await context.write(worker_pb2.SchedulerMessage(welcome=welcome))
            if stale:
                # Listed in the hello but no longer this worker's: stop them, drop their results.
                refs = [task_pb2.TaskRef(task_id=t, attempt=a) for t, a in stale]
                await context.write(worker_pb2.SchedulerMessage(cancel=worker_pb2.CancelTasks(tasks=refs)))
            detached = asyncio.ensure_future(session.detached.wait())
            overflowed = asyncio.ensure_future(session.overflowed.wait())
            ended = asyncio.ensure_future(session.ended.wait())
            while True:
                get = asyncio.ensure_future(session.outbox.get())
                done, _ = await asyncio.wait(
                    {get, reader, detached, overflowed, ended}, return_when=asyncio.FIRST_COMPLETED
                )
                if get not in done:
                    get.cancel()
                    break
                # A worker that does not read blocks this write (flow control); the overflow
                # must still end the stream.
                write = asyncio.ensure_future(context.write(get.result()))
                finished, _ = await asyncio.wait({write, overflowed}, return_when=asyncio.FIRST_COMPLETED)
                if write not in finished:
                    write.cancel()
                    break
                write.result()
            for waiter in (detached, overflowed, ended):
                waiter.cancel()
            if session.overflowed.is_set():
                log.warning("worker.not_reading", extra={"worker_id": session.worker_id})
                # Released first: the status itself waits behind the unread messages, so the
                # abort may not return until the worker reads or its connection goes.
                await self._end(session)
                await abort(
                    context,
                    TooLarge(f"the worker does not read its stream: over {MAX_OUTBOX} messages are waiting for it"),
                )
            if reader.done() and not reader.cancelled():
                failure = reader.exception()
                if isinstance(failure, LowtideError):
                    session.end(failure)
                elif failure is not None:
                    raise failure
            # Send what is still queued (rejections of the worker's last reports).
            while not session.outbox.empty() and not context.done():
                await context.write(session.outbox.get_nowait())
            if session.end_error is not None:
                await self._end(session)
                await abort(context, session.end_error)
        finally:
            reader.cancel()
            feeder.cancel()
            if write is not None and not write.done():
                # Cut short (the call is over): its failure is of no interest to anyone.
                write.cancel()
                write.add_done_callback(_quiet)
            self._live.discard(session)
            if not self._live:
                self._none_live.set()
            await self._end(session)

    async def _end(self, session: WorkerSession) -> None:
        """The stream is over: the session takes nothing more, and its unreported attempts are
        released (in a task of their own, awaited here but never interrupted by a cancel)."""
        release = self._start_release(session)
        if release is not None:
            await asyncio.shield(release)

    def _start_release(self, session: WorkerSession) -> asyncio.Task[None] | None:
        session.closed = True
        self._registry.remove(session)
        if session.released:
            return self._releases.get(session.worker_id)
        session.released = True
        if self.stopping and session.end_error is None:
            # The scheduler is shutting down, not the worker: its lease carries its attempts over
            # to the next scheduler it connects to.
            log.info("worker.detached", extra={"worker_id": session.worker_id})
            return None
        release = asyncio.get_running_loop().create_task(self._release(session), name="worker-release")
        self._releases[session.worker_id] = release
        release.add_done_callback(lambda done: self._release_done(session.worker_id, done))
        return release

    def _registered_too_late(self, session: WorkerSession, registering: asyncio.Future[Any]) -> None:
        """The call ended while its worker was being recorded: once recorded, it is released."""
        if not registering.cancelled() and registering.exception() is None:
            self._start_release(session)

    def _release_done(self, worker_id: str, release: asyncio.Task[None]) -> None:
        if self._releases.get(worker_id) is release:
            del self._releases[worker_id]

    async def settle(self, within: float) -> None:
        """Waits (up to `within` seconds) for every report taken and every release started."""
        pending = [asyncio.ensure_future(self._completer.flushed()), *self._releases.values()]
        await asyncio.wait(pending, timeout=within)

    async def drain(self, grace: float, reason: str = "the scheduler is shutting down") -> None:
        """Sends every stream a Drain, then waits up to `grace` seconds for the workers to finish
        what they run, report it and close their streams. New streams are refused meanwhile."""
        self.stopping = True
        deadline = datetime.now(UTC) + timedelta(seconds=grace)
        message = worker_pb2.Drain(reason=reason, grace=_duration(timedelta(seconds=grace)))
        message.deadline.FromDatetime(deadline)
        self._drain = message
        for session in self._registry:
            session.draining = True
            session.send(worker_pb2.SchedulerMessage(drain=message))
            log.info("worker.draining", extra={"worker_id": session.worker_id, "running": len(session.in_flight)})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._none_live.wait(), grace)

    async def _register(self, session: WorkerSession, hello: worker_pb2.Hello) -> list[tuple[int, int]]:
        """Records the worker and hands it the attempts its hello lists that are still its own;
        returns the listed ones that are not (the worker is to stop them)."""
        old = self._registry.get(session.worker_id)
        if old is not None:
            # A newer stream for the same worker id wins. The older one ends with ABORTED, and
            # its attempts are not released: the newer stream takes those its hello lists.
            old.released = True
            old.closed = True
            old.end(Aborted(f"replaced by a newer stream for worker id {session.worker_id}"))
            self._registry.remove(old)
            log.warning("worker.replaced", extra={"worker_id": session.worker_id})
        release = self._releases.get(session.worker_id)
        if release is not None:
            # The previous stream's release runs still: let it finish, or it would end the
            # attempts (and forget the worker) this stream is about to take on.
            await asyncio.shield(release)
        await self._store.upsert_worker(
            worker_id=session.worker_id,
            pool=session.pool,
            queues=session.queues,
            activity_types=session.activity_types,
            slots=session.slots,
            scheduler_id=self._scheduler_id,
            lease=self._lease,
        )
        listed = [(r.task_id, r.attempt) for r in hello.running]
        if listed:
            for row in await self._store.adopt(session.worker_id, listed):
                session.in_flight[row["id"]] = attempt_of(row)
        # Attempts recorded as this worker's that its hello does not name never reached it (still
        # in a killed scheduler's outbox) or were reported to a scheduler that died before writing
        # them. Its lease is renewed from now on, so nothing else would ever end them: they are lost.
        # Reports already taken from its previous stream are written first, or their attempts would
        # be ended too (bounded: at worst such an attempt runs again, as after any lost lease).
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._completer.flushed(), 5.0)
        orphans = [
            a
            for a in await self._store.running_attempts_of(session.worker_id, self._scheduler_id)
            if a.task_id not in session.in_flight
        ]
        if orphans:
            now = datetime.now(UTC)
            if old is not None:
                reason = f"replaced by a newer stream for worker id {session.worker_id}, whose hello does not list it"
            else:
                reason = "the worker reconnected without the attempt"
            lost = Failure("WorkerLost", reason)
            await self._store.finish([(after_failure(a, lost, now), session.worker_id) for a in orphans])
            self._registry.wake_all()
        self._registry.add(session)
        if self._drain is not None:
            # Connected just as the drain began: it drains too.
            session.draining = True
            session.send(worker_pb2.SchedulerMessage(drain=self._drain))
        session.wake.set()
        self._warn_unregistered_holds()
        return [ref for ref in listed if not _holds(session, ref)]

    def _warn_unregistered_holds(self) -> None:
        """A held name that no connected worker registers does nothing; say so once."""
        holds = self._dispatcher.holds.config
        registered = {t for s in self._registry for t in s.activity_types}
        for held in sorted(holds.deferrable.union(*(holds.per_queue or {}).values()) - registered):
            if held not in self._warned_unregistered:
                self._warned_unregistered.add(held)
                log.warning(
                    "cost_hold.unregistered_type",
                    extra={"activity_type": held, "detail": "no connected worker registers it; the hold has no effect"},
                )

    async def _release(self, session: WorkerSession) -> None:
        """The worker is gone: its unreported attempts fail as WorkerLost (retried per policy)."""
        try:
            await self._completer.flushed()
            attempts = await self._store.running_attempts_of(session.worker_id, self._scheduler_id)
            now = datetime.now(UTC)
            lost = Failure("WorkerLost", session.lost_reason)
            outcomes: list[tuple[Outcome, str | None]] = [
                (after_failure(a, lost, now), session.worker_id) for a in attempts
            ]
            if outcomes:
                await self._store.finish(outcomes)
                self._registry.wake_all()
            await self._store.delete_worker(session.worker_id, self._scheduler_id)
        except DatabaseUnavailable as error:
            # The worker's lease will run out and the leader will end its attempts then.
            log.warning("worker.release_deferred", extra={"worker_id": session.worker_id, "error": str(error)})
            return
        except Exception:
            log.exception("worker.release_failed", extra={"worker_id": session.worker_id})
            return
        log.info("worker.disconnected", extra={"worker_id": session.worker_id, "lost": len(outcomes)})

    async def _read(self, session: WorkerSession, messages: AsyncIterator[worker_pb2.WorkerMessage]) -> None:
        async for message in messages:
            if session.closed:
                # Replaced by a newer stream: nothing more from this one is applied.
                return
            kind = message.WhichOneof("message")
            if kind == "results":
                self._on_results(session, message.results)
            elif kind == "heartbeat":
                refs = [(r.task_id, r.attempt) for r in message.heartbeat.running]
                worker_id = session.worker_id
                try:
                    renewed = await self._store.renew_worker(worker_id, session.slots, self._lease, self._scheduler_id)
                except DatabaseUnavailable as error:
                    # A busy pool or a database restart is not the worker's fault: the stream
                    # stays, and the next heartbeat renews the lease (or finds it gone).
                    log.warning("worker.heartbeat_deferred", extra={"worker_id": worker_id, "error": str(error)})
                    continue
                if not renewed:
                    lease = format_duration(self._lease)
                    session.lost_reason = f"the worker's lease ran out (nothing heard from it for {lease})"
                    raise Unavailable(
                        f"worker {session.worker_id}: its lease ran out before this heartbeat (nothing heard from it "
                        f"for {lease}), so its attempts were given up; connect again with a new Hello"
                    )
                held = [ref for ref in refs if _holds(session, ref)]
                if held:
                    try:
                        await self._store.heartbeat(session.worker_id, held)
                    except DatabaseUnavailable as error:
                        log.warning("worker.heartbeat_deferred", extra={"worker_id": worker_id, "error": str(error)})
            elif kind == "slot_update":
                if message.slot_update.slots > MAX_SLOTS:
                    raise InvalidArgument("slot_update.slots", f"must be at most {MAX_SLOTS}")
                session.slots = message.slot_update.slots
                session.wake.set()
            elif kind == "hold_update":
                holding = frozenset(name("hold_update.held_types", t) for t in message.hold_update.held_types)
                released = session.predicate_held - holding
                session.predicate_held = holding
                if released:
                    session.wake.set()
            elif kind == "hello":
                raise FailedPrecondition("hello may only be sent once, as the first message")
            else:
                raise InvalidArgument("message", "empty or unknown worker message")

    def _on_results(self, session: WorkerSession, results: worker_pb2.Results) -> None:
        now = datetime.now(UTC)
        clock = asyncio.get_running_loop().time()
        stale: list[tuple[int, int]] = []
        empty: list[tuple[int, int]] = []
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
            del session.in_flight[ref[0]]
            sent_at = session.sent_at.pop(ref[0], None)
            if not attempt.fixed and sent_at is not None and outcome_kind == "success":
                self.fixed.record_run(session.pool, clock - sent_at)
            if attempt.fixed and outcome.state is State.PENDING:
                self.fixed.mark_due(session.pool, outcome.run_at)
            self._completer.add(outcome, session)
        session.reject(stale, "the attempt is not held by this worker")
        session.reject(empty, "the result has no outcome: set success or failure")
        if stale:
            self.metrics.rejected.add(len(stale), {"reason": "not_held"})
        if empty:
            self.metrics.rejected.add(len(empty), {"reason": "no_outcome"})
        session.wake.set()


def _quiet(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _holds(session: WorkerSession, ref: tuple[int, int]) -> bool:
    attempt = session.in_flight.get(ref[0])
    return attempt is not None and attempt.attempt == ref[1]
