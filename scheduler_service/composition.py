"""The scheduler's components and the order they are built in: the composition root's wiring,
apart from starting and stopping them (scheduler_service.server)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from lowtide.config import Config
from lowtide.db import Database
from lowtide.telemetry import Telemetry
from scheduler_service.api.scheduler import SchedulerApi
from scheduler_service.dispatch.adaptive import AdaptiveLimits, adaptive_gauges, adaptive_settings
from scheduler_service.dispatch.dispatcher import Dispatcher
from scheduler_service.dispatch.handoff import Handoff
from scheduler_service.dispatch.wakeups import HeldReferences
from scheduler_service.domain.holds import HoldConfig, HoldPolicy, OnStale
from scheduler_service.fleet.leadership import Leadership
from scheduler_service.fleet.leases import Leases
from scheduler_service.fleet.sessions import Registry
from scheduler_service.holds.cost import CostHolds, LoopWatch
from scheduler_service.holds.fixed_starts import DuePools, FixedStarts
from scheduler_service.holds.release_planning import ReleasePlanner
from scheduler_service.holds.signals import SignalHolds, stored_reader
from scheduler_service.maintenance import Maintenance
from scheduler_service.observe.carbon_totals import CarbonTotals
from scheduler_service.observe.metrics import DEFAULT as DEFAULT_QUEUE
from scheduler_service.observe.metrics import SchedulerMetrics
from scheduler_service.observe.tracing import TaskTraces
from scheduler_service.store import Store
from scheduler_service.tasks.control import TaskControl
from scheduler_service.tasks.schedules import ScheduleMaterializer
from scheduler_service.tasks.submission import Submission
from scheduler_service.tasks.waiters import Waiters
from scheduler_service.workers.completer import Completer
from scheduler_service.workers.strays import Strays
from scheduler_service.workers.stream import WorkerStream


@dataclass
class Parts:
    """The scheduler's components, each built with everything it uses (see `build_parts`)."""

    store: Store
    registry: Registry
    holds: SignalHolds
    fixed: FixedStarts
    metrics: SchedulerMetrics
    dispatcher: Dispatcher
    planner: ReleasePlanner
    api: SchedulerApi
    completer: Completer
    stream: WorkerStream
    leases: Leases
    waiters: Waiters
    maintenance: Maintenance
    adaptive: AdaptiveLimits
    strays: Strays


@dataclass(frozen=True)
class _Core:
    """What dispatch needs, built first; the serving parts are built on it."""

    store: Store
    registry: Registry
    holds: SignalHolds
    fixed: FixedStarts
    metrics: SchedulerMetrics
    dispatcher: Dispatcher
    planner: ReleasePlanner
    traces: TaskTraces | None
    adaptive: AdaptiveLimits
    leadership: Leadership


def _cost_holds(config: Config, hold_config: HoldConfig, parked: HeldReferences, store: Store) -> SignalHolds:
    """One subscription per signal some work follows. release_below is in the default signal's
    unit, so only its hold has it; min_hold and on_stale apply to every hold."""
    default = config.cost.signal
    watch = LoopWatch()
    by_signal = {
        name: CostHolds(
            target=config.scheduler.signal_target,
            signal=name,
            policy=HoldPolicy(
                release_below=config.cost.release_below if name == default else None,
                min_hold=config.cost.min_hold,
                on_stale=OnStale(config.cost.on_stale),
            ),
            config=hold_config,
            on_release=parked.release,
            stale_after=_stale_after(config, name),
            token=config.auth.signal_token or None,
            ca=config.tls.signal_ca or None,
            read=stored_reader(store),
            watch=watch,
        )
        for name in sorted(hold_config.signals(default))
    }
    return SignalHolds(by_signal, default=default, config=hold_config, watch=watch)


def _stale_after(config: Config, signal: str) -> timedelta:
    """The signal's own stale_after where its section sets one, else [signal]'s."""
    own = config.signals.get(signal)
    return (own.stale_after if own is not None else None) or config.signal.stale_after


def build_parts(
    config: Config, db: Database, hold_config: HoldConfig, telemetry: Telemetry, scheduler_id: str
) -> Parts:
    """Every component, in dependency order: dispatch's core first, then what serves on it."""
    core = _dispatch_core(config, db, hold_config, telemetry, scheduler_id)
    return _serving_parts(config, core, scheduler_id)


def _dispatch_core(
    config: Config, db: Database, hold_config: HoldConfig, telemetry: Telemetry, scheduler_id: str
) -> _Core:
    """The store, the cost hold, fixed starts, metrics, the dispatcher and the planner. The two
    cycles (the cost hold releases what the dispatcher parked; a completed dependency makes a
    fixed start due) go through small objects made first: `HeldReferences` and `DuePools`."""
    limits = {t: c.max_concurrency for t, c in config.types.items() if c.max_concurrency is not None}
    registry = Registry()
    due = DuePools(registry)
    store = Store(db, on_unblocked=due.unblocked)
    parked = HeldReferences(registry)
    holds = _cost_holds(config, hold_config, parked, store)
    fixed = FixedStarts(store, registry, config, due)
    traces = None if telemetry.tracer is None else TaskTraces(telemetry.tracer)
    leadership = Leadership()
    adaptive = AdaptiveLimits(
        store,
        settings=adaptive_settings(config),
        scheduler_id=scheduler_id,
        window=config.scheduler.adaptive_window,
        leadership=leadership,
        on_raised=registry.wake_all,
    )
    adaptive_gauges(telemetry.metrics.meter, adaptive)
    metrics = SchedulerMetrics(
        telemetry.metrics,
        store=store,
        registry=registry,
        holds=holds,
        parked=parked.__len__,
        config=config,
        fixed=fixed,
    )
    dispatcher = Dispatcher(
        store,
        registry,
        poll_interval=config.scheduler.poll_interval,
        limits=limits,
        holds=holds,
        hold_recheck=config.cost.hold_recheck,
        parked=parked,
        fixed=fixed,
        metrics=metrics,
        resources=config.resources,
        traces=traces,
        adaptive=adaptive,
        carbon=CarbonTotals(store),
    )
    planner = ReleasePlanner(store, registry, holds, config, wake_at=dispatcher.wake_at)
    return _Core(store, registry, holds, fixed, metrics, dispatcher, planner, traces, adaptive, leadership)


def _serving_parts(config: Config, core: _Core, scheduler_id: str) -> Parts:
    """The API, the worker stream with its completer and leases, and maintenance."""
    store, registry, dispatcher, metrics, fixed = core.store, core.registry, core.dispatcher, core.metrics, core.fixed
    waiters = Waiters(store)
    completer = Completer(
        store,
        metrics=metrics,
        on_applied=waiters.applied,
        traces=core.traces,
        adaptive=core.adaptive,
        on_freed=dispatcher.freed,
        on_retry=dispatcher.wake_at,
    )
    submission = Submission(
        config=config,
        store=store,
        dispatcher=dispatcher,
        fixed=fixed,
        planner=core.planner,
        tracing=core.traces is not None,
        scheduler_id=scheduler_id,
        handoff=Handoff(dispatcher, registry),
        reports=completer,
    )
    api = SchedulerApi(
        config=config,
        store=store,
        registry=registry,
        dispatcher=dispatcher,
        metrics=metrics,
        submission=submission,
        tasks=TaskControl(config=config, store=store, registry=registry, dispatcher=dispatcher),
        waiters=waiters,
        traces=core.traces,
    )
    leases, strays, stream = _worker_stream(config, core, completer, scheduler_id)
    maintenance = _maintenance(config, core, waiters, scheduler_id)
    return Parts(
        store,
        registry,
        core.holds,
        fixed,
        metrics,
        dispatcher,
        core.planner,
        api,
        completer,
        stream,
        leases,
        waiters,
        maintenance,
        core.adaptive,
        strays,
    )


def _worker_stream(
    config: Config, core: _Core, completer: Completer, scheduler_id: str
) -> tuple[Leases, Strays, WorkerStream]:
    """The worker leases (with their heartbeat writer), the look for attempts no worker got, and
    WorkerService.Connect."""
    cfg = config.scheduler
    leases = Leases(
        core.store,
        core.registry,
        scheduler_id=scheduler_id,
        lease_timeout=cfg.lease_timeout,
        heartbeat_interval=cfg.heartbeat_interval,
        idle_heartbeat_interval=cfg.idle_heartbeat_interval,
    )
    strays = Strays(
        core.store,
        core.registry,
        completer,
        scheduler_id=scheduler_id,
        lease_timeout=cfg.lease_timeout,
        uncertain=core.dispatcher.uncertain,
        counter=core.metrics.strays_returned,
    )
    stream = WorkerStream(
        store=core.store,
        registry=core.registry,
        dispatcher=core.dispatcher,
        completer=completer,
        beats=leases.beats,
        scheduler_id=scheduler_id,
        heartbeat_interval=cfg.heartbeat_interval,
        idle_heartbeat_interval=cfg.idle_heartbeat_interval,
        lease_timeout=cfg.lease_timeout,
        fixed=core.fixed,
        metrics=core.metrics,
        reconnect_grace=cfg.reconnect_grace,
        auth=config.auth,
        strays=strays,
    )
    return leases, strays, stream


def _maintenance(config: Config, core: _Core, waiters: Waiters, scheduler_id: str) -> Maintenance:
    """The leader's maintenance (every replica runs it; the lease holder does the leader's part)."""
    cfg = config.scheduler
    return Maintenance(
        core.store,
        core.registry,
        holder=scheduler_id,
        interval=cfg.maintenance_interval,
        lease=cfg.leader_lease,
        retention=cfg.retention,
        kept_queues=frozenset({DEFAULT_QUEUE, *config.queues}),
        on_requeued=core.registry.wake_all,
        on_retry=core.dispatcher.wake_at,
        on_replicas=waiters.others_running,
        fixed=core.fixed,
        metrics=core.metrics,
        schedules=ScheduleMaterializer(core.store, config),
        planner=core.planner,
        adaptive=core.adaptive,
        leadership=core.leadership,
    )
