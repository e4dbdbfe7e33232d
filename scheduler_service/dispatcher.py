"""Dispatch: each connected worker has a loop that claims up to its free slots and pushes the
claimed tasks down its stream in one message.

A loop sleeps until woken — by a submit (in this process or, through NOTIFY, in another), by a
freed slot, by a cancel — or until the poll interval passes, which is only the fallback.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from google.protobuf import duration_pb2

from lowtide.db.connector import Row
from lowtide.errors import DatabaseUnavailable
from lowtide_proto.lowtide.v1 import task_pb2, worker_pb2
from scheduler_service.convert import KIND_TO_PROTO
from scheduler_service.cost import CostHolds

if TYPE_CHECKING:
    from scheduler_service.fixed_starts import FixedStarts
    from scheduler_service.metrics import SchedulerMetrics
from lowtide_proto.backoff import Backoff
from scheduler_service.domain.model import Kind
from scheduler_service.sessions import Registry, WorkerSession
from scheduler_service.store import Store, attempt_of

log = logging.getLogger("lowtide.scheduler.dispatcher")


class Parked:
    """Dispatch references (wake-ups naming new tasks) that named only held types, per worker:
    each is rechecked after hold_recheck, or released at once when the hold ends. Made before
    the cost hold (which releases them) and the dispatcher (which parks them)."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry
        self.entries: dict[str, tuple[asyncio.TimerHandle, set[tuple[str, str]]]] = {}

    def __len__(self) -> int:
        return len(self.entries)

    def release(self) -> None:
        """The hold ended: every parked reference goes back at once, and every worker is woken."""
        for handle, _ in self.entries.values():
            handle.cancel()
        self.entries.clear()
        self._registry.wake_all()


class Dispatcher:
    def __init__(
        self,
        store: Store,
        registry: Registry,
        *,
        poll_interval: timedelta,
        limits: Mapping[str, int],
        holds: CostHolds,
        hold_recheck: timedelta,
        parked: Parked,
        fixed: FixedStarts,
        metrics: SchedulerMetrics,
        resources: Mapping[str, int],
    ) -> None:
        self._store = store
        self._registry = registry
        self._poll = poll_interval.total_seconds()
        self._limits = dict(limits)
        self.holds = holds
        self._hold_recheck = hold_recheck.total_seconds()
        self.parked = parked
        self.metrics = metrics
        self._wake_timers: set[int] = set()
        self.fixed = fixed
        # Capacities of named resources ([resources]); empty: no task can ask for any.
        self.resources = dict(resources)

    def held_map(self, session: WorkerSession) -> dict[str, frozenset[str]]:
        """Per queue, the types the cost hold holds for this worker now (read from memory)."""
        return {
            queue: self.holds.held_for(
                queue, worker_deferrable=session.cost_deferrable, worker_held=session.predicate_held
            )
            for queue in session.queues
        }

    def wake_for(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Routes a dispatch reference to each worker: wake it, park it, or leave it alone."""
        pairs = list(pairs)
        for session in self._registry:
            runnable = [(q, t) for q, t in pairs if q in session.queues and t in session.activity_types]
            if not runnable:
                continue
            if self._all_held(session, runnable):
                self._park(session, runnable)
            else:
                session.wake.set()

    def _all_held(self, session: WorkerSession, pairs: list[tuple[str, str]]) -> bool:
        held = self.held_map(session)
        return all(t in held.get(q, frozenset()) for q, t in pairs)

    def _park(self, session: WorkerSession, pairs: list[tuple[str, str]]) -> None:
        parked = self.parked.entries.get(session.worker_id)
        if parked is not None:
            parked[1].update(pairs)
            return
        loop = asyncio.get_running_loop()
        handle = loop.call_later(self._hold_recheck, self._recheck, session)
        self.parked.entries[session.worker_id] = (handle, set(pairs))

    def _recheck(self, session: WorkerSession) -> None:
        """hold_recheck passed: the reference goes back to dispatch (which also takes held tasks
        past their max_defer); if its types are still held it is parked again."""
        _, pairs = self.parked.entries.pop(session.worker_id, (None, set()))
        if session.closed:
            return
        session.wake.set()
        if pairs and self._all_held(session, sorted(pairs)):
            self._park(session, sorted(pairs))

    def wake_at(self, when: datetime) -> None:
        """Wakes every dispatcher at `when` (a planned release or a latest start), so the work due
        then is claimed on time rather than at the next poll. Timers are shared per 10 ms."""
        bucket = int(when.timestamp() * 100)
        if bucket in self._wake_timers:
            return
        delay = max(0.0, (when - datetime.now(UTC)).total_seconds())
        loop = asyncio.get_running_loop()

        def fire() -> None:
            self._wake_timers.discard(bucket)
            self._registry.wake_all()

        self._wake_timers.add(bucket)
        loop.call_later(delay, fire)

    async def run(self, session: WorkerSession) -> None:
        """Feeds one worker until its session closes: due fixed starts first (on held slots or
        any free one), then regular work into the slots that are neither busy nor held."""
        backoff = Backoff(initial=0.05, maximum=2.0)
        while not session.closed:
            polled = False
            try:
                await asyncio.wait_for(session.wake.wait(), self._poll)
            except TimeoutError:
                polled = True
            session.wake.clear()
            try:
                fixed_full = await self._claim_fixed(session, polled)
                self.fixed.offer_slots(session)
                resources_full = await self._claim_with_resources(session)
                free = session.free
                rows: list[Row] = []
                if free > 0:
                    rows = await self._store.claim(
                        worker_id=session.worker_id,
                        queues=session.queues,
                        worker_types=session.activity_types,
                        limit=free,
                        limits=self._limits,
                        held=self.held_map(session),
                        signal=self.holds.value,
                    )
            except DatabaseUnavailable as error:
                log.warning("dispatch.claim_failed", extra={"error": str(error)})
                await asyncio.sleep(backoff.next_delay())
                continue
            backoff.reset()
            sent_full = bool(rows) and await self._send(session, rows) and len(rows) == free
            if sent_full or fixed_full or resources_full:
                # A full batch: more may be waiting, so claim again without sleeping.
                session.wake.set()

    async def _claim_fixed(self, session: WorkerSession, polled: bool) -> bool:
        """Claims due fixed-start tasks of the worker's pool into its busy-or-held room; True
        when the batch came back full (more may be due)."""
        if not (polled or session.pool in self.fixed.due):
            return False
        room = session.slots - len(session.in_flight)
        if room <= 0 or session.closed or session.draining:
            return False
        self.fixed.due.discard(session.pool)
        rows = await self._store.claim_fixed_due(
            worker_id=session.worker_id,
            pool=session.pool,
            queues=session.queues,
            worker_types=session.activity_types,
            limit=room,
            signal=self.holds.value,
        )
        if not rows:
            return False
        self.fixed.dispatched([r["id"] for r in rows])
        await self._send(session, rows)
        self.metrics.fixed_started(rows)
        if len(rows) == room:
            self.fixed.due.add(session.pool)
            return True
        return False

    async def _claim_with_resources(self, session: WorkerSession) -> bool:
        """Tasks that need named resources go their own way: as many as fit in what is free.
        Due fixed starts among them may use the worker's held slots."""
        if not self.resources:
            return False
        room = session.slots - len(session.in_flight)
        if room <= 0 or session.closed or session.draining:
            return False
        rows = await self._store.claim_with_resources(
            worker_id=session.worker_id,
            pool=session.pool,
            queues=session.queues,
            worker_types=session.activity_types,
            held=self.held_map(session),
            capacities=self.resources,
            limit=session.free,
            room=room,
            signal=self.holds.value,
        )
        if not rows:
            return False
        self.fixed.dispatched([r["id"] for r in rows])
        await self._send(session, rows)
        return len(rows) == room

    async def _send(self, session: WorkerSession, rows: list[Row]) -> bool:
        if session.closed or session.draining:
            # The worker left (or was told to drain) while the claim ran: hand the attempts back
            # untouched. Nothing is assigned after a Drain.
            await self._store.unclaim(session.worker_id, [(r["id"], r["attempt"]) for r in rows])
            return False
        now = asyncio.get_running_loop().time()
        assignments = []
        for row in rows:
            session.in_flight[row["id"]] = attempt_of(row)
            session.sent_at[row["id"]] = now
            assignments.append(assignment(row))
        session.send(worker_pb2.SchedulerMessage(assignments=worker_pb2.Assignments(assignments=assignments)))
        self.metrics.dispatched.add(len(rows), {"pool": session.pool})
        return True


def assignment(row: Row) -> worker_pb2.Assignment:
    message = worker_pb2.Assignment(
        task=task_pb2.TaskRef(task_id=row["id"], attempt=row["attempt"]),
        queue=row["queue"],
        kind=KIND_TO_PROTO[Kind(row["kind"])],
        activity_type=row["activity_type"],
        payload=row["payload"],
        headers=row["headers"],
    )
    if row["close_deadline"] is not None:
        message.start_to_close_deadline.FromDatetime(row["close_deadline"])
    if row["heartbeat_ms"] is not None:
        message.heartbeat_timeout.CopyFrom(_duration_ms(int(row["heartbeat_ms"])))
    return message


def _duration_ms(ms: int) -> duration_pb2.Duration:
    out = duration_pb2.Duration()
    out.FromMilliseconds(ms)
    return out
