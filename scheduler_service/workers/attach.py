"""Who a worker stream belongs to: its hello, its registration (a newer stream for the same worker
id takes over from an older one), and the release of its attempts once the stream is over."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from opentelemetry.metrics import Counter

from lowtide.errors import Aborted, DatabaseUnavailable, FailedPrecondition, InvalidArgument, PermissionDenied
from lowtide_proto.lowtide.v1 import worker_pb2
from scheduler_service.dispatch.dispatcher import Dispatcher
from scheduler_service.domain.holds import local_conflicts
from scheduler_service.domain.model import Failure, Outcome
from scheduler_service.domain.retry import after_failure
from scheduler_service.fleet.sessions import Registry, WorkerSession
from scheduler_service.rows.tasks import FinishedRow
from scheduler_service.store import Store, retries_due
from scheduler_service.wire.inbound import name
from scheduler_service.workers.completer import Completer
from scheduler_service.workers.reader import (
    MAX_ACTIVITY_TYPES,
    MAX_LISTED,
    MAX_PAIRS,
    MAX_QUEUES,
    MAX_SLOTS,
    at_most,
)

log = logging.getLogger("lowtide.scheduler.workers")


def session_from_hello(hello: worker_pb2.Hello, *, config_held: frozenset[str] = frozenset()) -> WorkerSession:
    """A session for the hello, or InvalidArgument / FailedPrecondition saying what is wrong."""
    if not 0 < hello.slots <= MAX_SLOTS:
        raise InvalidArgument("hello.slots", f"must be between 1 and {MAX_SLOTS}")
    at_most("hello.activity_types", hello.activity_types, MAX_ACTIVITY_TYPES, "activity types")
    at_most("hello.queues", hello.queues, MAX_QUEUES, "queues")
    at_most("hello.cost_deferrable_activities", hello.cost_deferrable_activities, MAX_ACTIVITY_TYPES, "types")
    at_most("hello.held_types", hello.held_types, MAX_ACTIVITY_TYPES, "types")
    at_most("hello.running", hello.running, MAX_LISTED, "attempts")
    types: list[str] = []
    local: list[str] = []
    for activity in hello.activity_types:
        activity_name = name("hello.activity_types.name", activity.name)
        (local if activity.local else types).append(activity_name)
    own_held = frozenset(name("hello.cost_deferrable_activities", t) for t in hello.cost_deferrable_activities)
    predicate_held = frozenset(name("hello.held_types", t) for t in hello.held_types)
    conflicts = local_conflicts(own_held | predicate_held | config_held, local)
    if conflicts:
        raise FailedPrecondition(
            f"cost hold names local activity {', '.join(sorted(conflicts))}: a local activity runs inline in "
            "its workflow task and is never queued, so a hold cannot defer it; remove it from the hold"
        )
    if not types:
        raise InvalidArgument("hello.activity_types", "must name at least one activity type that is not local")
    queues = tuple(sorted({name("hello.queues", q) for q in hello.queues} or {"default"}))
    activity_types = tuple(sorted(set(types)))
    if len(queues) * len(activity_types) > MAX_PAIRS:
        raise InvalidArgument(
            "hello.queues",
            f"{len(queues)} queues x {len(activity_types)} activity types make {len(queues) * len(activity_types):,} "
            f"(queue, type) pairs, over the limit of {MAX_PAIRS:,}: split the work among workers",
        )
    session = WorkerSession(
        worker_id=name("hello.worker_id", hello.worker_id, default=f"worker-{uuid.uuid4().hex[:12]}"),
        pool=name("hello.pool", hello.pool, default="default"),
        queues=queues,
        activity_types=activity_types,
        slots=hello.slots,
    )
    session.cost_deferrable = own_held
    session.predicate_held = predicate_held
    return session


def may_take_over(holder: str | None, newcomer: str | None) -> bool:
    """Whether a stream made with token `newcomer` may take a worker id over from a stream made
    with token `holder` (token names; None: auth off). Only a worker of the same token may, so a
    worker token cannot take another's attempts, nor report their results. The upsert_worker
    statement applies the same rule across replicas."""
    return holder is None or newcomer is None or holder == newcomer


def _taken(session: WorkerSession) -> PermissionDenied:
    return PermissionDenied(
        f"worker id {session.worker_id!r} is in use by a worker of another token: choose another worker id "
        "(each worker needs its own), or connect with that worker's token"
    )


class Attachments:
    """Registers the sessions of worker streams and releases them once their streams end."""

    def __init__(
        self,
        *,
        store: Store,
        registry: Registry,
        dispatcher: Dispatcher,
        completer: Completer,
        scheduler_id: str,
        lease_timeout: timedelta,
        reconnect_grace: timedelta = timedelta(0),
        cuts: Counter | None = None,
    ) -> None:
        self._store = store
        self._registry = registry
        self._dispatcher = dispatcher
        self._completer = completer
        self._scheduler_id = scheduler_id
        self._lease = lease_timeout
        self._grace = reconnect_grace.total_seconds()
        self._cuts = cuts
        self.stopping = False
        self._warned_unregistered: set[str] = set()
        # The releases of ended streams, each its own task so that nothing cancelling a
        # handler (grpc.aio does, once the call is over) can interrupt one half way.
        self.releases: dict[str, asyncio.Task[None]] = {}
        # The cut streams whose attempts wait out the reconnect grace, by worker id: the release
        # each starts when it runs out, unless the worker reconnects here first.
        self.graces: dict[str, tuple[asyncio.TimerHandle, WorkerSession]] = {}
        # The Drain sent to every stream once the scheduler stops.
        self.drain_message: worker_pb2.Drain | None = None

    async def attach(self, session: WorkerSession, hello: worker_pb2.Hello) -> list[tuple[int, int]]:
        """Registers the session (see `_register`); returns the attempts the worker is to stop."""
        # Shielded: a call that ends meanwhile (the worker killed) must not leave the worker
        # half recorded, its row and adopted attempts waiting out the lease.
        registering = asyncio.ensure_future(self._register(session, hello))
        try:
            return await asyncio.shield(registering)
        except asyncio.CancelledError:
            registering.add_done_callback(lambda done: self._registered_too_late(session, done))
            raise

    async def end(self, session: WorkerSession, *, cut: bool = False) -> None:
        """The stream is over: the session takes nothing more, and its unreported attempts are
        released (in a task of their own, awaited here but never interrupted by a cancel). A
        stream that was `cut` (neither the worker nor the scheduler ended it) is released only
        once the reconnect grace has run out without the worker reconnecting here."""
        release = self._start_release(session, cut=cut)
        if release is not None:
            await asyncio.shield(release)

    def _start_release(self, session: WorkerSession, *, cut: bool = False) -> asyncio.Task[None] | None:
        session.closed = True
        self._registry.remove(session)
        if session.released:
            return self.releases.get(session.worker_id)
        session.released = True
        if self.stopping and session.end_error is None:
            # The scheduler is shutting down, not the worker: its lease carries its attempts over
            # to the next scheduler it connects to.
            log.info("worker.detached", extra={"worker_id": session.worker_id})
            return None
        if cut and self._grace > 0:
            log.info(
                "worker.stream_cut",
                extra={"worker_id": session.worker_id, "running": len(session.in_flight), "grace_s": self._grace},
            )
            loop = asyncio.get_running_loop()
            earlier = self.graces.get(session.worker_id)
            if earlier is not None:
                earlier[0].cancel()  # this one's release covers the worker id's attempts
            self.graces[session.worker_id] = (loop.call_later(self._grace, self._grace_over, session), session)
            return None
        if cut:
            self._count_cut("released")
        return self._begin_release(session)

    def _grace_over(self, session: WorkerSession) -> None:
        """The reconnect grace ran out and the worker has not reconnected here: it is released
        (its attempts are not, if it reconnected to another replica meanwhile)."""
        self.graces.pop(session.worker_id, None)
        if self.stopping:
            log.info("worker.detached", extra={"worker_id": session.worker_id})
            return
        self._count_cut("released")
        self._begin_release(session)

    def _count_cut(self, outcome: str) -> None:
        if self._cuts is not None:
            self._cuts.add(1, {"outcome": outcome})

    def _begin_release(self, session: WorkerSession) -> asyncio.Task[None]:
        release = asyncio.get_running_loop().create_task(self._release(session), name="worker-release")
        self.releases[session.worker_id] = release
        release.add_done_callback(lambda done: self._release_done(session.worker_id, done))
        return release

    def _registered_too_late(self, session: WorkerSession, registering: asyncio.Future[Any]) -> None:
        """The call ended while its worker was being recorded: once recorded, it is released."""
        if not registering.cancelled() and registering.exception() is None:
            self._start_release(session)

    def _release_done(self, worker_id: str, release: asyncio.Task[None]) -> None:
        if self.releases.get(worker_id) is release:
            del self.releases[worker_id]

    async def _register(self, session: WorkerSession, hello: worker_pb2.Hello) -> list[tuple[int, int]]:
        """Records the worker and hands it the attempts its hello lists that are still its own;
        returns the listed ones that are not (the worker is to stop them)."""
        old = self._registry.get(session.worker_id)
        waiting = self.graces.get(session.worker_id)
        for holder in (old, waiting[1] if waiting is not None else None):
            if holder is not None and not may_take_over(holder.token_name, session.token_name):
                raise _taken(session)
        if old is not None:
            # A newer stream for the same worker id wins. The older one ends with ABORTED, and
            # its attempts are not released: the newer stream takes those its hello lists.
            old.released = True
            old.closed = True
            old.end(Aborted(f"replaced by a newer stream for worker id {session.worker_id}"))
            self._registry.remove(old)
            log.warning("worker.replaced", extra={"worker_id": session.worker_id})
        if waiting is not None:
            # Back within its reconnect grace: it takes back what its hello lists, as after a
            # scheduler restart, and what it does not list is lost (_end_orphans).
            del self.graces[session.worker_id]
            waiting[0].cancel()
            self._count_cut("reconnected")
            log.info("worker.reconnected", extra={"worker_id": session.worker_id})
        release = self.releases.get(session.worker_id)
        if release is not None:
            # The previous stream's release runs still: let it finish, or it would end the
            # attempts (and forget the worker) this stream is about to take on.
            await asyncio.shield(release)
        recorded = await self._store.upsert_worker(
            worker_id=session.worker_id,
            pool=session.pool,
            queues=session.queues,
            activity_types=session.activity_types,
            slots=session.slots,
            scheduler_id=self._scheduler_id,
            lease=self._lease,
            token_name=session.token_name,
        )
        if not recorded:
            # Held on another replica by a worker of another token.
            raise _taken(session)
        listed = [(r.task_id, r.attempt) for r in hello.running]
        if listed:
            for attempt in await self._store.adopt(session.worker_id, listed):
                session.in_flight[attempt.task_id] = attempt
        await self._end_orphans(session, replaced=old is not None)
        self._registry.add(session)
        if self.drain_message is not None:
            # Connected just as the drain began: it drains too.
            session.draining = True
            session.send(worker_pb2.SchedulerMessage(drain=self.drain_message))
        session.wake.set()
        self._warn_unregistered_holds()
        return [ref for ref in listed if not session.holds(ref)]

    async def _end_orphans(self, session: WorkerSession, *, replaced: bool) -> None:
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
            if replaced:
                reason = f"replaced by a newer stream for worker id {session.worker_id}, whose hello does not list it"
            else:
                reason = "the worker reconnected without the attempt"
            lost = Failure("WorkerLost", reason)
            outcomes: list[tuple[Outcome, str | None]] = [
                (after_failure(a, lost, now), session.worker_id) for a in orphans
            ]
            self._wake_for_retries(outcomes, await self._store.finish(outcomes))

    def _wake_for_retries(
        self, outcomes: list[tuple[Outcome, str | None]], applied: dict[tuple[int, int], FinishedRow]
    ) -> None:
        """Lost attempts were written as ended: every group looks again now, and the groups of the
        retries when each is due."""
        self._registry.wake_all()
        for due, pairs in retries_due((o for o, _ in outcomes), applied).items():
            self._dispatcher.wake_at(due, pairs)

    def _warn_unregistered_holds(self) -> None:
        """A held name that no connected worker registers does nothing; say so once."""
        config = self._dispatcher.holds.config
        unwarned = config.deferrable.union(*(config.per_queue or {}).values()) - self._warned_unregistered
        if not unwarned:
            return
        # Per dispatch group, not per session: a fleet of a thousand alike is one group, and this
        # runs for every hello.
        registered = {t for group in self._registry.groups() for t in group.key.activity_types}
        for held in sorted(unwarned - registered):
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
                self._wake_for_retries(outcomes, await self._store.finish(outcomes))
            await self._store.delete_worker(session.worker_id, self._scheduler_id)
        except DatabaseUnavailable as error:
            # The worker's lease will run out and the leader will end its attempts then.
            log.warning("worker.release_deferred", extra={"worker_id": session.worker_id, "error": str(error)})
            return
        except Exception:
            log.exception("worker.release_failed", extra={"worker_id": session.worker_id})
            return
        log.info("worker.disconnected", extra={"worker_id": session.worker_id, "lost": len(outcomes)})
