"""The scheduler's metrics.

Why it works this way: docs/architecture/observe.md."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from lowtide.config import Config
from lowtide.errors import DatabaseUnavailable
from lowtide.metrics import Metrics
from lowtide_proto.lowtide.v1 import scheduler_pb2
from scheduler_service.domain.capacity import desired_workers
from scheduler_service.domain.fixed import reservation_capacity
from scheduler_service.domain.pacing import paced
from scheduler_service.fleet.sessions import Registry
from scheduler_service.holds.fixed_starts import FixedStarts
from scheduler_service.holds.signals import SignalHolds
from scheduler_service.observe.status import held
from scheduler_service.observe.task_metrics import TaskMetrics
from scheduler_service.rows.claims import ClaimedRow
from scheduler_service.rows.fleet import PendingGroup
from scheduler_service.store import Store

log = logging.getLogger("lowtide.scheduler.metrics")


@dataclass
class QueueFigures:
    depth: int = 0
    oldest_pending_age: float = 0.0
    held_depth: int = 0
    oldest_held_age: float = 0.0
    running: int = 0


@dataclass
class PoolFigures:
    hit_rate: float | None = None
    desired_workers: int = 0
    held_slots: int = 0
    reservations_ahead: int = 0
    # Held tasks the plan placed in the pool (tasks naming pools), not released yet.
    planned_releases: int = 0


DEFAULT = "default"


@dataclass
class Snapshot:
    queues: dict[str, QueueFigures] = field(default_factory=dict)
    pools: dict[str, PoolFigures] = field(default_factory=dict)


class SchedulerMetrics:
    def __init__(
        self,
        metrics: Metrics,
        *,
        store: Store,
        registry: Registry,
        holds: SignalHolds,
        parked: Callable[[], int],
        config: Config,
        fixed: FixedStarts,
    ) -> None:
        self.metrics = metrics
        self._config = config
        self.fixed = fixed
        self._parked_count = parked
        self._store = store
        self._registry = registry
        self._holds = holds
        self.snapshot = Snapshot()
        meter = metrics.meter
        # Per task: dispatched and finished counts, queue wait, run time, dispatch latency, time held.
        self.tasks = TaskMetrics(meter, metrics.histograms, holds=holds, config=config)
        self.fixed_starts = meter.create_counter(
            "lowtide.fixed_start.started",
            unit="{task}",
            description="Fixed starts dispatched, by hit (within tolerance)",
        )
        self.misses = meter.create_counter(
            "lowtide.fixed_start.misses", unit="{task}", description="Fixed starts missed, by reason"
        )
        self.stream_cuts = meter.create_counter(
            "lowtide.worker.stream_cut",
            unit="{stream}",
            description="Worker streams cut (ended neither by the worker nor the scheduler), by what followed on "
            "this replica: reconnected (the worker came back within reconnect_grace) or released (its attempts "
            "given up at once, or once the grace ran out)",
        )
        self.strays_returned = meter.create_counter(
            "lowtide.dispatch.strays_returned",
            unit="{attempt}",
            description="Attempts recorded as running on a connected worker that never got them (a claim committed "
            "but unanswered), put back pending without counting an attempt",
        )
        self.purged = meter.create_counter(
            "lowtide.task.purged",
            unit="{task}",
            description="Finished tasks deleted by the leader once [scheduler] retention had passed",
        )
        self.rejected = meter.create_counter(
            "lowtide.report.rejected",
            unit="{report}",
            description="Worker reports refused, by reason: not_held (not this stream's attempt), no_outcome "
            "(a result with neither success nor failure), no_longer_held (the attempt ended meanwhile)",
        )
        self._gauges(meter)

    def _gauges(self, meter: Meter) -> None:
        """The observable gauges, read from the latest snapshot (and the hold, the sessions) when
        the exporter collects."""
        gauges = [
            ("lowtide.queue.depth", "{task}", "Pending tasks a worker could claim now (held ones apart)", "depth"),
            ("lowtide.queue.oldest_pending_age", "s", "Age of the oldest claimable pending task", "oldest_pending_age"),
            ("lowtide.queue.held_depth", "{task}", "Pending tasks held by a cost hold", "held_depth"),
            ("lowtide.queue.oldest_held_age", "s", "Age of the oldest held task", "oldest_held_age"),
            ("lowtide.queue.running", "{task}", "Running attempts", "running"),
        ]
        for name, unit, description, attribute in gauges:
            meter.create_observable_gauge(
                name, callbacks=[self._queue_callback(attribute)], unit=unit, description=description
            )
        pool_gauges = [
            # Named with its unit's word: an OTLP -> Prometheus path appends `_ratio` to a "1" gauge
            # (once), the Prometheus reader does not, and both agree on this name.
            ("lowtide.pool.fixed_start_hit_ratio", "1", "Share of fixed starts within tolerance", "hit_rate"),
            ("lowtide.pool.desired_workers", "{worker}", "Workers the pool should have", "desired_workers"),
            ("lowtide.pool.held_slots", "{slot}", "Slots held idle for fixed starts", "held_slots"),
            ("lowtide.pool.reservations_ahead", "{task}", "Admitted fixed starts not started", "reservations_ahead"),
            (
                "lowtide.pool.planned_releases",
                "{task}",
                "Held tasks naming pools that the plan placed in this pool, to be released later",
                "planned_releases",
            ),
        ]
        for name, unit, description, attribute in pool_gauges:
            meter.create_observable_gauge(
                name, callbacks=[self._pool_callback(attribute)], unit=unit, description=description
            )
        meter.create_observable_gauge(
            # Not unit "1": an OTLP -> Prometheus path would name a 0/1 gauge lowtide_cost_hold_ratio.
            "lowtide.cost_hold",
            callbacks=[self._cost_hold],
            unit="{state}",
            description="1 while a cost hold is active",
        )
        meter.create_observable_gauge(
            "lowtide.worker.connected", callbacks=[self._workers], unit="{worker}", description="Connected workers"
        )
        meter.create_observable_gauge(
            "lowtide.dispatch.parked",
            callbacks=[self._parked],
            unit="{reference}",
            description="Dispatch references of held types waiting for hold_recheck",
        )

    def _queue_callback(self, attribute: str):  # type: ignore[no-untyped-def]
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            for queue, figures in self.snapshot.queues.items():
                yield Observation(getattr(figures, attribute), {"queue": queue})

        return observe

    def _pool_callback(self, attribute: str):  # type: ignore[no-untyped-def]
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            for pool, figures in self.snapshot.pools.items():
                value = getattr(figures, attribute)
                if value is not None:
                    yield Observation(value, {"pool": pool})

        return observe

    def fixed_started(self, rows: Iterable[ClaimedRow]) -> None:
        for row in rows:
            if row.attempt == 1:
                self.fixed_starts.add(1, {"pool": row.pool, "hit": str(bool(row.start_hit)).lower()})

    def busy_queues(self) -> set[str] | None:
        """The queues with tasks due or running at the backlog's last count (None before the first)."""
        if not self.snapshot.queues:
            return None
        return {q for q, f in self.snapshot.queues.items() if f.depth or f.held_depth or f.running}

    def _known_queues(self) -> set[str]:
        served = {queue for session in self._registry for queue in session.queues}
        return {DEFAULT, *self._config.queues, *(self._holds.config.per_queue or {}), *self.snapshot.queues, *served}

    def _cost_hold(self, options: CallbackOptions) -> Iterable[Observation]:
        """Per known queue and signal: 1 while that signal's hold is active and holds some type
        there (configured to follow it, or declared cost-deferrable by a worker serving the
        queue, which follows its type's signal), else 0."""
        holds = self._holds
        by_workers: dict[str, set[str]] = {}
        for session in self._registry:
            for queue in session.queues:
                by_workers.setdefault(queue, set()).update(session.cost_deferrable)
        for queue in sorted(self._known_queues()):
            types = holds.config.for_queue(queue) | by_workers.get(queue, set())
            following = {holds.config.signal_for(queue, t, holds.default) for t in types}
            for name in sorted(following | {holds.default}):
                active = name in following and holds.by_signal[name].state.active
                yield Observation(1 if active else 0, {"queue": queue, "signal": name})

    def _workers(self, options: CallbackOptions) -> Iterable[Observation]:
        pools: dict[str, int] = dict.fromkeys([DEFAULT, *self._config.pools, *self.snapshot.pools], 0)
        for session in self._registry:
            pools[session.pool] = pools.get(session.pool, 0) + 1
        for pool, count in sorted(pools.items()):
            yield Observation(count, {"pool": pool})

    def _parked(self, options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(self._parked_count())

    async def refresh(self) -> None:
        # Every known queue, empty ones too: an idle queue reports zeros, not nothing.
        known = await self._store.known_queues()
        queues = {name: QueueFigures() for name in sorted({DEFAULT, *self._config.queues, *known})}
        # One read of the backlog serves the queue figures and the pools' desired workers.
        running = await self._store.running_by_queue()
        pending = await self._store.pending_by_queue_and_type()
        for group in pending:
            figures = queues.setdefault(group.queue, QueueFigures())
            if held(self._holds, group):
                figures.held_depth += group.depth
                figures.oldest_held_age = max(figures.oldest_held_age, group.oldest_age)
            else:
                figures.depth += group.depth
                figures.oldest_pending_age = max(figures.oldest_pending_age, group.oldest_age)
        for queue, count in running.items():
            queues.setdefault(queue, QueueFigures()).running = count
        pools = {p.name: _figures(p) for p in await self.pool_status(pending, running)}
        pools.setdefault(DEFAULT, PoolFigures())
        self.snapshot = Snapshot(queues, pools)

    async def pool_status(
        self, pending: list[PendingGroup] | None = None, running: dict[str, int] | None = None
    ) -> list[scheduler_pb2.PoolStatus]:
        """Per pool: workers, slots, busy and held slots, reservations, hit rate, desired workers.
        `pending` and `running` are the backlog when the caller has read it already."""
        if pending is None or running is None:
            pending, running = await self._store.pending_by_queue_and_type(), await self._store.running_by_queue()
        return await pool_status(
            self._store, self._registry, self._holds, self._config, self.fixed, pending=pending, running=running
        )

    async def run(self, interval: timedelta) -> None:
        """Refreshes every `interval`, or less often while a refresh costs more than a small
        share of it (domain.pacing: the backlog's counts read every pending task)."""
        loop = asyncio.get_running_loop()
        slowed = False
        while True:
            began = loop.time()
            try:
                await self.refresh()
            except DatabaseUnavailable as error:
                log.warning("metrics.refresh_failed", extra={"error": str(error)})
            took = loop.time() - began
            wait = paced(interval.total_seconds(), took)
            if (wait > interval.total_seconds()) != slowed:
                slowed = not slowed
                event = "metrics.refresh_paced" if slowed else "metrics.refresh_on_interval"
                log.info(event, extra={"took_s": round(took, 3), "next_in_s": round(wait, 1)})
            await asyncio.sleep(wait)


def _figures(status: scheduler_pb2.PoolStatus) -> PoolFigures:
    hit_rate = None if math.isnan(status.fixed_start_hit_rate) else status.fixed_start_hit_rate
    return PoolFigures(
        hit_rate, status.desired_workers, status.held_slots, status.reservations_ahead, status.planned_releases
    )


async def pool_status(
    store: Store,
    registry: Registry,
    holds: SignalHolds,
    config: Config,
    fixed: FixedStarts,
    *,
    pending: list[PendingGroup],
    running: dict[str, int],
) -> list[scheduler_pb2.PoolStatus]:
    """The pools as GetStatus, the metrics and the KEDA scaler see them."""
    now = await store.now()
    pools: dict[str, scheduler_pb2.PoolStatus] = {}

    def pool(name: str) -> scheduler_pb2.PoolStatus:
        if name not in pools:
            settings = config.pool(name)
            pools[name] = scheduler_pb2.PoolStatus(
                name=name,
                fixed_start_hit_rate=math.nan,
                max_workers=settings.max_workers,
                reservation_capacity=reservation_capacity(settings.max_workers, settings.reservable_fraction),
            )
        return pools[name]

    for name in config.pools:
        pool(name)
    for name, planned in (await store.planned_by_pool()).items():
        status = pool(name)
        status.planned_releases = planned.planned
        status.next_release_at.FromDatetime(planned.next_at)
        status.next_release_task_id = planned.next_task_id
        if planned.next_intensity is not None:
            status.next_release_intensity = planned.next_intensity
    for name, status in pools.items():
        status.signal = config.pool(name).signal
        if status.signal:
            value = holds.value_in(name)
            if value is not None:
                status.signal_value = value
    for workers in await store.pools():
        status = pool(workers.pool)
        status.workers, status.slots, status.busy_slots = workers.workers, workers.slots, workers.busy
    ahead_in_horizon: dict[str, int] = {}
    for stats in await store.pool_fixed_stats():
        status = pool(stats.pool)
        starts = stats.ahead or []
        status.reservations_ahead = len(starts)
        horizon = now + config.pool(stats.pool).autoscale_horizon
        ahead_in_horizon[stats.pool] = sum(1 for s in starts if s <= horizon)
        if stats.hit_rate is not None:
            status.fixed_start_hit_rate = stats.hit_rate
    for name in list(pools) + [u.pool for u in fixed.upcoming.values()]:
        pool(name).held_slots = fixed.held_slots(name)
    backlog = pool_backlog(registry, holds, pending, running)
    for name, status in pools.items():
        claimable, busy = backlog.get(name, (0, 0))
        per_worker = status.slots // status.workers if status.workers else 1
        status.desired_workers = desired_workers(
            claimable=claimable,
            running=busy,
            slots_per_worker=max(1, per_worker),
            reserved=ahead_in_horizon.get(name, 0),
            max_workers=None,
        )
    return [pools[name] for name in sorted(pools)]


def pool_backlog(
    registry: Registry, holds: SignalHolds, pending: list[PendingGroup], running: dict[str, int]
) -> dict[str, tuple[int, int]]:
    """Claimable pending work and running work per pool, held work left out. A queue's work is
    counted in the pools of the workers that serve it (in this replica)."""
    serving: dict[str, set[str]] = {}
    for session in registry:
        for queue in session.queues:
            serving.setdefault(queue, set()).add(session.pool)
    out: dict[str, tuple[int, int]] = {}
    for group in pending:
        if held(holds, group):
            continue
        for name in serving.get(group.queue, set()):
            claimable, busy = out.get(name, (0, 0))
            out[name] = (claimable + group.depth, busy)
    for queue, count in running.items():
        for name in serving.get(queue, set()):
            claimable, busy = out.get(name, (0, 0))
            out[name] = (claimable, busy + count)
    return out
