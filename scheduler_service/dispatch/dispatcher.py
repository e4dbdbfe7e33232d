"""Central dispatch: one dispatcher per replica claims for the work, not for each worker.

Why it works this way: docs/architecture/dispatch.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from lowtide.errors import DatabaseUnavailable
from lowtide_proto.backoff import Backoff
from lowtide_proto.lowtide.v1 import worker_pb2
from scheduler_service.dispatch.wakeups import HeldReferences, WakeTimers
from scheduler_service.domain.claim_plan import effective_limits
from scheduler_service.domain.dispatch import GroupKey, hand_out, take_slots
from scheduler_service.fleet.sessions import Group, Registry, Slots, WorkerSession, reserved
from scheduler_service.holds.signals import SignalHolds
from scheduler_service.observe.tracing import TaskTraces, now_ns
from scheduler_service.rows.claims import ClaimedRow
from scheduler_service.rows.tasks import FinishedRow
from scheduler_service.store import Store, attempt_of
from scheduler_service.wire.outbound import assignment

if TYPE_CHECKING:
    from scheduler_service.dispatch.adaptive import AdaptiveLimits
    from scheduler_service.holds.fixed_starts import FixedStarts
    from scheduler_service.observe.carbon_totals import CarbonTotals
    from scheduler_service.observe.metrics import SchedulerMetrics

log = logging.getLogger("lowtide.scheduler.dispatcher")

# Claims that may run at once for one group: a second starts for slots freed while the first
# runs, instead of leaving them idle until it returns.
CLAIMS_PER_GROUP = 2
# The most slots one claim fills: a large group is served by several claims in turn (each comes
# back full, so the next starts at once), none of which costs more than this many slots.
CLAIM_SLOTS = 512
# The slots a poll's claim fills when nothing woke the group since its last claim: the poll looks
# for work no wake announced (a retry's backoff ended, a wake missed), and an idle fleet of any
# size costs this much. When it comes back full, the group claims again at once, for all.
PROBE_SLOTS = 32


class Dispatcher:
    def __init__(
        self,
        store: Store,
        registry: Registry,
        *,
        poll_interval: timedelta,
        limits: Mapping[str, int],
        holds: SignalHolds,
        hold_recheck: timedelta,
        parked: HeldReferences,
        fixed: FixedStarts,
        metrics: SchedulerMetrics,
        resources: Mapping[str, int],
        traces: TaskTraces | None,
        adaptive: AdaptiveLimits,
        carbon: CarbonTotals,
    ) -> None:
        self._store = store
        self._registry = registry
        self._poll = poll_interval.total_seconds()
        # Static limits ([types.NAME] max_concurrency); adaptive ones are read from `adaptive`.
        self.static_limits = dict(limits)
        self.adaptive = adaptive
        self.holds = holds
        self._hold_recheck = hold_recheck.total_seconds()
        self.parked = parked
        self.metrics = metrics
        self._timers = WakeTimers(registry, self.wake_for)
        self.fixed = fixed
        # Capacities of named resources ([resources]); empty: no task can ask for any.
        self.resources = dict(resources)
        # The held and dispatch spans of traced tasks; None while tracing is off.
        self.traces = traces
        # The carbon figures of what is dispatched (GetStatus).
        self.carbon = carbon
        self._claims: set[asyncio.Task[None]] = set()
        # Set when a claim failed after it may have been written (its commit's answer lost with
        # the connection, or rows it could not send not handed back): the look for attempts
        # recorded as a worker's that its session never handed it begins at once (strays.py).
        self.uncertain = asyncio.Event()
        # Claim statements run, for tests and metrics (no claim may run for an idle fleet
        # between the replica's polls).
        self.claims_run = 0
        self.polls = 0

    def limits(self) -> dict[str, int]:
        """The limit per type a claim applies now: static and adaptive, the lower of the two."""
        adaptive = self.adaptive.limits
        return effective_limits(self.static_limits, adaptive) if adaptive else self.static_limits

    def freed(self, rows: Collection[FinishedRow]) -> None:
        """These attempts were written as ended: groups that may claim their type, if it has a
        limit, claim again (a claim woken by the worker's report, before the write, still counted
        them running, so it found the type at its limit). Nothing to do without limits."""
        limits = self.limits()
        if limits:
            limited = {(r.queue, r.activity_type) for r in rows if r.activity_type in limits}
            if limited:
                self.wake_for(sorted(limited))

    def held_map(self, key: GroupKey, *, confirmed: bool = False) -> dict[str, frozenset[str]]:
        """Per queue, the types the cost hold holds for the group's workers now (read from memory);
        with `confirmed`, also those whose signal's view is not confirmed (for what starts now)."""
        return {
            queue: self.holds.held_for(
                queue, worker_deferrable=key.cost_deferrable, worker_held=key.predicate_held, confirmed=confirmed
            )
            for queue in key.queues
        }

    async def _held_to_claim(self, key: GroupKey) -> dict[str, frozenset[str]]:
        """The held map a claim applies: the views of the signals holding the group's types
        confirmed first (a stored row read when one is not, see CostHolds.confirm), so a replica
        that was frozen or starved never releases held work on what it knew before."""
        await self.holds.confirm(self.holds.signals_of(key.queues, key.activity_types, key.cost_deferrable))
        return self.held_map(key, confirmed=True)

    def wake_for(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Routes a dispatch reference to each group: wake it, park it, or leave it alone."""
        pairs = list(pairs)
        for group in self._registry.groups():
            key = group.key
            runnable = [(q, t) for q, t in pairs if q in key.queues and t in key.activity_types]
            if not runnable:
                continue
            held = self.held_map(key)
            if all(t in held.get(q, frozenset()) for q, t in runnable):
                for session in list(group.members.values()):
                    self.parked.park(session, runnable, self._hold_recheck, self.held_map)
            else:
                self._registry.want_group(group)

    def wake_at(self, when: datetime, pairs: Iterable[tuple[str, str]] | None = None) -> None:
        """Wakes the groups that may run the (queue, type) `pairs` at `when` (every group when
        None: a planned release or a latest start; a retry names its own), so the work due then
        is claimed on time rather than at the next poll."""
        self._timers.wake_at(when, pairs)

    async def run(self) -> None:
        """The replica's dispatch loop, until cancelled: a group that asks for a claim (and has
        fewer than CLAIMS_PER_GROUP running) gets one at once, from the ask itself; the loop
        starts what asks that came meanwhile left, and every poll_interval asks every group once."""
        loop = asyncio.get_running_loop()
        changed = self._registry.changed
        next_poll = loop.time() + self._poll
        self._registry.on_want(self._start)
        try:
            while True:
                left = next_poll - loop.time()
                if left > 0 and not changed.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(changed.wait(), left)
                changed.clear()
                if loop.time() >= next_poll:
                    next_poll = loop.time() + self._poll
                    self.polls += 1
                    self._registry.poll()
                for group in self._registry.take_wanted():
                    self._start(group)
        finally:
            self._registry.on_want(None)
            for claim in list(self._claims):
                claim.cancel()

    def _start(self, group: Group) -> None:
        """Starts a claim for the group unless CLAIMS_PER_GROUP run already (one of them then
        claims again for the ask, see _serve)."""
        if group.claims < CLAIMS_PER_GROUP and group.wanted:
            group.claims += 1
            claim = asyncio.get_running_loop().create_task(self._serve(group), name="dispatch-claim")
            self._claims.add(claim)
            claim.add_done_callback(self._claims.discard)

    async def _serve(self, group: Group) -> None:
        """Claims for the group while it asks for claims (or a claim came back full)."""
        backoff = Backoff(initial=0.05, maximum=2.0)
        try:
            while group.wanted:
                group.wanted = False
                polled, group.polled = group.polled, False
                woken, group.woken = group.woken, False
                try:
                    again = await self._claim_for(group, polled, probe=polled and not woken)
                except DatabaseUnavailable as error:
                    group.behind = True
                    log.warning("dispatch.claim_failed", extra={"error": str(error)})
                    self.uncertain.set()
                    await asyncio.sleep(backoff.next_delay())
                    _ask_again(group, polled=polled, woken=woken)
                    continue
                except Exception:
                    # Nothing else may stop this group's dispatch for good: said, then tried again.
                    group.behind = True
                    log.exception("dispatch.claim_error", extra={"pool": group.key.pool})
                    self.uncertain.set()
                    await asyncio.sleep(backoff.next_delay())
                    _ask_again(group, polled=polled, woken=woken)
                    continue
                backoff.reset()
                if again is None:
                    # The claim running beside this one has every free slot reserved: the ask
                    # stays for it, which claims again once its own claim is done (so a submit
                    # landing while it ran is not left to the next poll).
                    _ask_again(group, polled=polled, woken=woken)
                    return
                if again:
                    # A full batch: more may be waiting, so claim again at once.
                    group.wanted = True
        finally:
            group.claims -= 1

    async def _claim_for(self, group: Group, polled: bool, *, probe: bool) -> bool | None:
        """One round for the group: due fixed starts, slot holds, resources, regular work.
        True when a claim came back full (more may be waiting); None when it found no free slot
        because a claim running beside it reserves them all. A `probe` (the replica's poll,
        with no wake since the last claim) claims for PROBE_SLOTS slots only: it looks for work
        nothing announced, and when it comes back full the group claims again at once for all."""
        members = self._registry.members(group)
        if not members:
            return False
        most = PROBE_SLOTS if probe else CLAIM_SLOTS
        fixed_full = await self._claim_fixed(group, members, polled, most)
        if self.fixed.upcoming:
            for session in members:
                self.fixed.offer_slots(session)
        resources_full = await self._claim_with_resources(group, members, most)
        taken, group.turn = take_slots(members, _free, group.turn, most)
        if not taken:
            # Whatever woke the group waits for a slot: the next one freed claims.
            group.behind = True
            if not (fixed_full or resources_full) and any(s.claiming for s in members):
                return None
            return fixed_full or resources_full
        key = group.key
        self.claims_run += 1
        claimed_ns = now_ns()
        wanted = sum(free for _, free in taken)
        with reserved(taken):
            held = await self._held_to_claim(key)
            rows = await self._store.claim(
                slots=[(s.worker_id, free) for s, free in taken],
                queues=key.queues,
                worker_types=key.activity_types,
                limits=self.limits(),
                held=held,
                signal=self.holds.value_in(key.pool),
                pool=key.pool,
            )
            sent = await self._send(taken, rows, claimed_ns)
        full = fixed_full or resources_full or (sent and len(rows) == wanted)
        # A claim that took less than it asked for found no more waiting, unless some went back
        # or work needing resources (claimed on its own terms) may wait.
        group.behind = full or not sent or bool(self.resources)
        return full

    async def _claim_fixed(self, group: Group, members: list[WorkerSession], polled: bool, most: int) -> bool:
        """Claims due fixed-start tasks of the group's pool into its busy-or-held room (up to
        `most` slots); True when the batch came back full (more may be due)."""
        key = group.key
        if not (polled or key.pool in self.fixed.due):
            return False
        taken, _ = take_slots(members, _room, group.turn, most)
        if not taken:
            return False
        self.fixed.due.discard(key.pool)
        self.claims_run += 1
        claimed_ns = now_ns()
        with reserved(taken):
            rows = await self._store.claim_fixed_due(
                slots=[(s.worker_id, room) for s, room in taken],
                pool=key.pool,
                queues=key.queues,
                worker_types=key.activity_types,
                signal=self.holds.value_in(key.pool),
            )
            if not rows:
                return False
            self.fixed.dispatched([r.id for r in rows])
            await self._send(taken, rows, claimed_ns)
        self.metrics.fixed_started(rows)
        if len(rows) == sum(room for _, room in taken):
            self.fixed.due.add(key.pool)
            return True
        return False

    async def _claim_with_resources(self, group: Group, members: list[WorkerSession], most: int) -> bool:
        """Tasks that need named resources go their own way: as many as fit in what is free.
        Due fixed starts among them may use the workers' held slots."""
        if not self.resources:
            return False
        taken, _ = take_slots(members, _room, group.turn, most)
        fixed_slots = hand_out([(s.worker_id, room) for s, room in taken])
        if not fixed_slots:
            return False
        self.claims_run += 1
        free_slots = hand_out([(s.worker_id, min(s.free, room)) for s, room in taken])
        claimed_ns = now_ns()
        key = group.key
        with reserved(taken):
            held = await self._held_to_claim(key)
            rows = await self._store.claim_with_resources(
                fixed_slots=fixed_slots,
                free_slots=free_slots,
                pool=key.pool,
                queues=key.queues,
                worker_types=key.activity_types,
                held=held,
                capacities=self.resources,
                signal=self.holds.value_in(key.pool),
            )
            if not rows:
                return False
            self.fixed.dispatched([r.id for r in rows])
            await self._send(taken, rows, claimed_ns)
        return len(rows) == len(fixed_slots)

    async def hand_over(self, taken: Slots, rows: list[ClaimedRow]) -> None:
        """Sends attempts stored running already (dispatch.handoff) as a claim's rows are sent."""
        await self._send(taken, rows, now_ns())

    async def _send(self, taken: Slots, rows: list[ClaimedRow], claimed_ns: int) -> bool:
        """Hands each row to the session it was claimed for, in one message per session. Rows of a
        session that left, was told to drain or took its slots to zero while the claim ran go back
        untouched: nothing is assigned after a Drain, nor after the answer to a SlotUpdate(0).
        False when any went back. `claimed_ns`: when the claim began."""
        if not rows:
            return True
        sessions = {s.worker_id: s for s, _ in taken}
        by_worker: dict[str, list[ClaimedRow]] = defaultdict(list)
        for row in rows:
            by_worker[row.worker_id].append(row)
        now = asyncio.get_running_loop().time()
        back: list[ClaimedRow] = []
        sent: list[tuple[WorkerSession, list[ClaimedRow]]] = []
        for worker_id, claimed in by_worker.items():
            session = sessions[worker_id]
            if session.closed or session.draining or session.slots == 0:
                back.extend(claimed)
                continue
            # Made before anything is recorded: rows whose message cannot be made are the
            # worker's in the database only, where the look for strays finds them (strays.py).
            message = worker_pb2.Assignments(assignments=[assignment(row) for row in claimed])
            for row in claimed:
                session.assign(row.id, attempt_of(row), now)
            session.send(worker_pb2.SchedulerMessage(assignments=message))
            sent.append((session, claimed))
        # The streams write the assignments (one turn of the loop) before a figure is recorded.
        if sent:
            await asyncio.sleep(0)
        timings = self.metrics.tasks.sent(sent)
        self.carbon.dispatched(row for _, claimed in sent for row in claimed)
        if self.traces is not None:
            # Their contexts stay with the session for their results.
            for (session, claimed), figures in zip(sent, timings, strict=True):
                session.traces.update(self.traces.sent(claimed, figures, claimed_ns))
        if back:
            await self._store.unclaim(back)
            self._registry.wake_all()
            return False
        return True


def _ask_again(group: Group, *, polled: bool, woken: bool) -> None:
    """The group asks for a claim again, with the poll and the wake a claim took from it."""
    group.wanted = True
    group.polled = group.polled or polled
    group.woken = group.woken or woken


def _free(session: WorkerSession) -> int:
    return session.free


def _room(session: WorkerSession) -> int:
    return session.room
