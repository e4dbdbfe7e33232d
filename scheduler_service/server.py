"""Wires the scheduler together and serves it: `start_scheduler(config)` for tests and `up`,
`serve(config)` for `lowtide scheduler serve` (runs until SIGTERM or SIGINT)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from lowtide.auth import SCHEDULER_METHODS, WORKER_METHODS, check_listen
from lowtide.auth import interceptors as auth_interceptors
from lowtide.background import cancel_all
from lowtide.config import Config
from lowtide.db import Database, apply_migrations
from lowtide.errors import ConfigError, DatabaseUnavailable
from lowtide.grpc_options import server_options
from lowtide.grpc_status import RefuseUndecodable
from lowtide.heap import freeze_started
from lowtide.listen import add_listen_port
from lowtide.output import print_line
from lowtide.telemetry import Telemetry, server_interceptors, start_telemetry
from lowtide_proto.backoff import Backoff
from lowtide_proto.lowtide.v1 import scheduler_pb2, scheduler_pb2_grpc, worker_pb2, worker_pb2_grpc
from scheduler_service.api.health import follow_database
from scheduler_service.api.keda import SERVICE_NAME as KEDA_SERVICE
from scheduler_service.api.keda import add_keda_scaler
from scheduler_service.composition import Parts, build_parts
from scheduler_service.dispatch.dispatcher import Dispatcher
from scheduler_service.domain.holds import HoldConfig, local_conflicts
from scheduler_service.domain.submission import parse_wake
from scheduler_service.fleet.sessions import Registry
from scheduler_service.holds.signals import SignalHolds
from scheduler_service.observe.metrics import SchedulerMetrics
from scheduler_service.store import Store
from scheduler_service.tasks.waiters import Waiters
from scheduler_service.workers.stream import WorkerStream

log = logging.getLogger("lowtide.scheduler")

SERVICES = (
    scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"].full_name,
    worker_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name,
)


@dataclass
class Scheduler:
    """A running scheduler replica. `resources` closes, in reverse order, what the start opened."""

    config: Config
    db: Database
    parts: Parts
    server: grpc.aio.Server
    health: health.aio.HealthServicer
    port: int
    scheduler_id: str
    resources: contextlib.AsyncExitStack
    # Set when a background loop failed: the replica can no longer keep its promises (`serve`
    # then stops it and exits, for `lowtide up` or the orchestrator to start it afresh).
    failed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def store(self) -> Store:
        return self.parts.store

    @property
    def registry(self) -> Registry:
        return self.parts.registry

    @property
    def stream(self) -> WorkerStream:
        return self.parts.stream

    @property
    def dispatcher(self) -> Dispatcher:
        return self.parts.dispatcher

    @property
    def metrics(self) -> SchedulerMetrics:
        return self.parts.metrics

    @property
    def target(self) -> str:
        host = self.config.scheduler.listen.rsplit(":", 1)[0]
        return f"{host}:{self.port}"

    async def stop(self, grace: float = 5.0) -> None:
        """Graceful: health goes NOT_SERVING, every worker stream gets a Drain and up to `grace`
        to finish, report and close; streams still open then are ended (their attempts keep
        their lease, for the scheduler the worker reconnects to); the reports taken are written;
        then the cost hold, the background loops, the pool and the metrics close."""
        await self.health.enter_graceful_shutdown()
        loop = asyncio.get_running_loop()
        began = loop.time()
        await self.stream.drain(grace)
        for session in self.registry:
            session.detached.set()
        await self.server.stop(max(0.5, grace - (loop.time() - began)))
        await self.stream.settle(within=5.0)
        await self.dispatcher.carbon.flush()
        await self.resources.aclose()


def check_cost_config(config: Config) -> HoldConfig:
    """Refuses a hold that names a local activity; warns about held types with a
    schedule_to_start default (that deadline keeps running during a hold)."""
    per_queue = {q: frozenset(c.deferrable_activities) for q, c in config.queues.items()}
    holds = HoldConfig(
        frozenset(config.cost.deferrable_activities),
        per_queue,
        type_signals={t: c.signal for t, c in config.types.items() if c.signal},
        queue_signals={q: c.signal for q, c in config.queues.items() if c.signal},
        pool_signals={p: c.signal for p, c in config.pools.items() if c.signal},
    )
    _warn_unknown_signals(config, holds)
    every_held = holds.deferrable.union(*per_queue.values())
    local = {name for name, t in config.types.items() if t.local}
    conflicts = local_conflicts(every_held, local)
    if conflicts:
        raise ConfigError(
            f"cost hold names local activit{'y' if len(conflicts) == 1 else 'ies'} {', '.join(sorted(conflicts))}: "
            "a local activity runs inline in its workflow task, so a hold cannot defer it"
        )
    for name in sorted(every_held):
        type_config = config.types.get(name)
        if type_config is not None and type_config.schedule_to_start is not None:
            log.warning(
                "cost_hold.schedule_to_start_default",
                extra={
                    "activity_type": name,
                    "detail": "schedule_to_start keeps running during a cost hold; a long window times tasks out",
                },
            )
    return holds


def _warn_unknown_signals(config: Config, holds: HoldConfig) -> None:
    """A signal some work follows that this configuration does not define may be defined by the
    signal service's own; if not, that work stays held (a signal holds until its first value)."""
    known = {config.cost.signal, *config.signals}
    for name in sorted(holds.signals(config.cost.signal) - known):
        log.warning(
            "cost_hold.unknown_signal",
            extra={
                "signal": name,
                "detail": "no [signals.NAME] defines it here; its work stays held until the signal service has it",
            },
        )


async def _listen(
    db: Database,
    registry: Registry,
    dispatcher: Dispatcher,
    waiters: Waiters,
    planned: Callable[[], Awaitable[None]],
    *,
    holds: SignalHolds,
    scheduler_id: str,
) -> None:
    """Wake-ups, cancels and new plans from other replicas (and this one), and signal changes the
    signal service committed, through LISTEN/NOTIFY. A wake-up this replica sent after waking its
    own dispatch (see wake_payload) is skipped."""
    backoff = Backoff(initial=0.1, maximum=5.0)
    while True:
        try:
            # lowtide_done last: its LISTEN is the one a connection's last statement shows once all are taken.
            channels = ("lowtide_signal", "lowtide_wake", "lowtide_cancel", "lowtide_plan", "lowtide_done")
            async with db.listen(*channels) as notifications:
                backoff.reset()
                # Plans made before this replica listened were never announced here.
                await planned()
                async for note in notifications:
                    channel, _, payload = note.partition(":")
                    if channel == "lowtide_wake":
                        origin, pairs = parse_wake(payload)
                        if origin == scheduler_id:
                            continue
                        if pairs is None:
                            registry.wake_all()
                        else:
                            dispatcher.wake_for(pairs)
                    elif channel == "lowtide_cancel":
                        task_id, attempt, worker_id = payload.split(":", 2)
                        session = registry.get(worker_id)
                        if session is not None:
                            session.cancel([(int(task_id), int(attempt))])
                    elif channel == "lowtide_plan":
                        await planned()
                    elif channel == "lowtide_done":
                        waiters.finished(int(task_id) for task_id in payload.split(","))
                    elif channel == "lowtide_signal" and payload in holds.by_signal:
                        await holds.refresh(payload)
        except DatabaseUnavailable as error:
            log.warning("listen.reconnecting", extra={"error": str(error)})
        await asyncio.sleep(backoff.next_delay())


def _database_url(config: Config, database_url: str | None) -> str:
    url = database_url or config.database.url
    if not url:
        raise ConfigError("no database URL: set LOWTIDE_DATABASE_URL or [database] url")
    return url


def _reserved_within_horizon(config: Config, store: Store) -> Callable[[str], Awaitable[int]]:
    async def reserved(pool: str) -> int:
        """Admitted fixed starts of the pool that start inside its autoscale horizon."""
        horizon = await store.now() + config.pool(pool).autoscale_horizon
        for stats in await store.pool_fixed_stats():
            if stats.pool == pool:
                return sum(1 for start in stats.ahead or [] if start <= horizon)
        return 0

    return reserved


def _grpc_server(
    config: Config, parts: Parts, telemetry: Telemetry
) -> tuple[grpc.aio.Server, health.aio.HealthServicer, int]:
    """The server with every service on it, its port bound (not started yet)."""
    cfg = config.scheduler
    check_listen(config.auth, cfg.listen, "scheduler")
    guards = auth_interceptors(config, {**SCHEDULER_METHODS, **WORKER_METHODS})
    # The limits of lowtide/grpc_options.py; no connection age limit (a worker's stream holds its work).
    options = server_options(max_concurrent_streams=cfg.max_concurrent_streams, max_message_bytes=cfg.max_message_bytes)
    interceptors = [*server_interceptors(telemetry), *guards, RefuseUndecodable()]
    server = grpc.aio.server(options=options, interceptors=interceptors)
    scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(parts.api, server)
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(parts.stream, server)
    reserved = _reserved_within_horizon(config, parts.store)
    add_keda_scaler(server, store=parts.store, registry=parts.registry, holds=parts.holds, reserved=reserved)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((*SERVICES, KEDA_SERVICE, reflection.SERVICE_NAME, health.SERVICE_NAME), server)
    port = add_listen_port(server, cfg.listen, config.tls, "[scheduler] listen")
    return server, health_servicer, port


def _background(
    config: Config,
    db: Database,
    parts: Parts,
    health_servicer: health.aio.HealthServicer,
    scheduler_id: str,
    *,
    failed: asyncio.Event,
) -> list[asyncio.Task[None]]:
    cfg = config.scheduler
    listen = _listen(
        db,
        parts.registry,
        parts.dispatcher,
        parts.waiters,
        parts.planner.wake_for_upcoming,
        holds=parts.holds,
        scheduler_id=scheduler_id,
    )
    database = follow_database(db, health_servicer, ("", *SERVICES), interval=cfg.heartbeat_interval)
    tasks = [
        asyncio.create_task(parts.completer.run(), name="completer"),
        asyncio.create_task(parts.dispatcher.run(), name="dispatcher"),
        asyncio.create_task(parts.leases.run(), name="leases"),
        asyncio.create_task(parts.strays.run(), name="strays"),
        asyncio.create_task(parts.dispatcher.carbon.run(), name="carbon-totals"),
        asyncio.create_task(parts.waiters.announce(), name="waiters-announce"),
        asyncio.create_task(parts.waiters.check(), name="waiters-check"),
        asyncio.create_task(parts.maintenance.run(), name="maintenance"),
        asyncio.create_task(parts.adaptive.run(), name="adaptive"),
        asyncio.create_task(listen, name="listen"),
        asyncio.create_task(parts.holds.run(), name="signal"),
        asyncio.create_task(parts.metrics.run(cfg.metrics_interval), name="metrics"),
        asyncio.create_task(parts.fixed.run(), name="fixed-starts"),
        asyncio.create_task(database, name="db-health"),
    ]
    for task in tasks:
        task.add_done_callback(partial(_loop_ended, failed))
    return tasks


def _loop_ended(failed: asyncio.Event, task: asyncio.Task[None]) -> None:
    """A background loop that failed is said loudly, at once, and `failed` is set: nothing else
    would notice (a dead completer still had groups of submits lend it reports, and finishes went
    on being written, while waiters, retries and stale reports were no longer seen to)."""
    if not task.cancelled() and task.exception() is not None:
        log.critical("scheduler.loop_failed", extra={"loop": task.get_name()}, exc_info=task.exception())
        failed.set()


async def start_scheduler(config: Config, *, database_url: str | None = None) -> Scheduler:
    """Builds the replica in dependency order. Whatever is opened is entered on one exit stack,
    so a failure at any step (a ConfigError included) closes everything opened before it."""
    url = _database_url(config, database_url)
    hold_config = check_cost_config(config)
    scheduler_id = f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
    async with contextlib.AsyncExitStack() as stack:
        # Closed last: the spans of the calls the server ends while stopping are flushed too (in a
        # thread: the export must not stop the event loop, another service of this process may run on it).
        telemetry = start_telemetry("lowtide-scheduler", config.scheduler.metrics_listen)
        stack.push_async_callback(asyncio.to_thread, telemetry.shutdown)
        # Opened once the ports are bound (below): a database connection never holds a listen port.
        # The generic-plan connections serve the claims and the submit groups' inserts (2 writers).
        db = Database(
            url, min_size=config.database.pool_min, max_size=config.database.pool_max, planned_min=1, planned_max=6
        )
        stack.push_async_callback(db.close)
        parts = build_parts(config, db, hold_config, telemetry, scheduler_id)
        server, health_servicer, port = _grpc_server(config, parts, telemetry)
        stack.push_async_callback(server.stop, None)
        await apply_migrations(url)
        await db.open()
        await server.start()
        for service in ("", *SERVICES):
            await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
        failed = asyncio.Event()
        # Closed after the background loops ended (a tick cancelled at a stop hands it no more work).
        stack.callback(parts.planner.close)
        stack.push_async_callback(
            cancel_all, _background(config, db, parts, health_servicer, scheduler_id, failed=failed)
        )
        stack.callback(parts.holds.close)
        resources = stack.pop_all()
    log.info("scheduler.started", extra={"listen": config.scheduler.listen, "port": port, "scheduler_id": scheduler_id})
    return Scheduler(config, db, parts, server, health_servicer, port, scheduler_id, resources, failed)


async def serve(config: Config, *, database_url: str | None = None) -> None:
    scheduler = await start_scheduler(config, database_url=database_url)
    freeze_started()
    print_line(f"lowtide scheduler listening on {scheduler.target}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    waits = [asyncio.create_task(stop.wait()), asyncio.create_task(scheduler.failed.wait())]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for wait in waits:
        wait.cancel()
    log.info("scheduler.stopping")
    await scheduler.stop()
    if scheduler.failed.is_set():
        # Started afresh by `lowtide up` (or the orchestrator): a crash, not a configuration error.
        raise SystemExit(1)
