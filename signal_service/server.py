"""Wires the signal service together and serves it: `start_signal_service(config)` for tests and
`up`, `serve(config)` for `lowtide signal serve` (runs until SIGTERM or SIGINT)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import uuid
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from lowtide.auth import SIGNAL_METHODS, check_listen
from lowtide.auth import interceptors as auth_interceptors
from lowtide.background import cancel_all
from lowtide.config import Config
from lowtide.db import Database, apply_migrations
from lowtide.errors import ConfigError, DatabaseUnavailable, LowtideError
from lowtide.forecast_error import ErrorModel, HorizonError
from lowtide.grpc_options import signal_server_options
from lowtide.grpc_status import RefuseUndecodable
from lowtide.heap import freeze_started
from lowtide.listen import add_listen_port
from lowtide.metrics import Metrics
from lowtide.output import print_line
from lowtide.telemetry import Telemetry, server_interceptors, start_telemetry
from lowtide_proto.backoff import Backoff
from lowtide_proto.lowtide.v1 import signal_pb2, signal_pb2_grpc
from signal_service.api import SignalApi
from signal_service.calibration import Calibrations, register_calibration_metrics
from signal_service.fanout import Fanout
from signal_service.feeds import Feed, FeedSettings, feed_settings, feed_unit, make_feed
from signal_service.feeds.runner import FeedStats, run_feed
from signal_service.feeds.seed import Seeding
from signal_service.metrics import register_signal_metrics
from signal_service.signals import Signals, definitions
from signal_service.store import SignalStore, feed_lease

log = logging.getLogger("lowtide.signal")

SERVICE = signal_pb2.DESCRIPTOR.services_by_name["SignalService"].full_name
CHANNEL = "lowtide_signal"
FORECAST_CHANNEL = "lowtide_forecast"


@dataclass
class SignalServer:
    """A running signal-service replica. `resources` closes, in reverse order, what the start opened."""

    config: Config
    db: Database
    signals: Signals
    server: grpc.aio.Server
    health: health.aio.HealthServicer
    port: int
    replica_id: str
    # Each polled signal's feed counts, by signal name.
    feeds: dict[str, FeedStats]
    metrics: Metrics
    resources: contextlib.AsyncExitStack
    stopped: bool = False

    @property
    def feed_stats(self) -> FeedStats:
        """The default signal's feed counts (all zero when it has no feed)."""
        return self.feeds.get(self.signals.default) or FeedStats()

    @property
    def target(self) -> str:
        host = self.config.signal.listen.rsplit(":", 1)[0]
        return f"{host}:{self.port}"

    async def stop(self, grace: float = 5.0) -> None:
        """Ends subscriptions, lets unary calls finish, gives the feed's lease up. Idempotent."""
        if self.stopped:
            return
        self.stopped = True
        await self.health.enter_graceful_shutdown()
        # Subscriber streams never end on their own: end them (UNAVAILABLE, so clients
        # reconnect, to another replica if there is one) and let unary calls finish.
        self.signals.fanout.close()
        await self.server.stop(grace)
        await self.resources.aclose()


async def _listen(db: Database, signals: Signals) -> None:
    """Changes made by other replicas (and this one), through LISTEN/NOTIFY; the payload is the
    signal's name, and the state (or forecast) is read back so that no NOTIFY has to carry it."""
    backoff = Backoff(initial=0.1, maximum=5.0)
    while True:
        try:
            async with db.listen(CHANNEL, FORECAST_CHANNEL) as notifications:
                backoff.reset()
                # Changes made while this connection was down were never notified here.
                await signals.resync()
                async for note in notifications:
                    channel, _, name = note.partition(":")
                    if name not in signals.defined:
                        continue
                    if channel == FORECAST_CHANNEL:
                        await signals.reload_forecast(name)
                    else:
                        await signals.reload(name)
        except LowtideError as error:
            log.warning("listen.reconnecting", extra={"error": str(error)})
        except Exception:
            # Keep going: without this loop other replicas' changes arrive only by resync.
            log.exception("listen.failed")
        await asyncio.sleep(backoff.next_delay())


def _tick(stale_after: timedelta, refresh: timedelta) -> float:
    """How often to look for stale signals and re-read the database: often enough that stale is
    announced within a tenth of stale_after, and replicas agree within refresh at worst."""
    return max(0.05, min(stale_after.total_seconds() / 10, refresh.total_seconds(), 5.0))


def health_name(signal: str) -> str:
    """The health-check service name that reports on one signal's feed."""
    return f"{SERVICE}/{signal}"


async def _report_health(servicer: health.aio.HealthServicer, signals: Signals, polled: Collection[str]) -> None:
    """Each signal's own health: NOT_SERVING while stale, or while its feed has given no value
    yet; the service's own stays SERVING, since the other signals are served meanwhile."""
    for state in signals.fanout.all():
        if state.name in signals.defined:
            down = state.stale or (state.value is None and state.name in polled)
            status = health_pb2.HealthCheckResponse.NOT_SERVING if down else health_pb2.HealthCheckResponse.SERVING
            await servicer.set(health_name(state.name), status)


async def _maintain(
    signals: Signals,
    *,
    stale_after: timedelta,
    refresh: timedelta,
    per_signal: Mapping[str, timedelta],
    report: Callable[[], Awaitable[None]],
) -> None:
    """Marks stale the signals with no update for stale_after, or their own (any replica may;
    the mark is stored once and announced by NOTIFY), re-reads every state as a safety net, and
    reports each signal's health."""
    shortest = min([stale_after, *per_signal.values()])
    while True:
        try:
            for name in await signals.store.mark_stale(stale_after, per_signal):
                after = per_signal.get(name, stale_after)
                log.warning("signal.stale", extra={"signal": name, "stale_after": str(after)})
            await signals.resync()
            await _calibrate(signals)
            await report()
        except DatabaseUnavailable as error:
            log.warning("maintain.failed", extra={"error": str(error)})
        except Exception:
            # Keep going: without this loop nothing is ever marked stale again.
            log.exception("maintain.failed")
        await asyncio.sleep(_tick(shortest, refresh))


async def _calibrate(signals: Signals) -> None:
    """Learns each signal's calibration when due (any replica: the newest stored is the one), and
    takes what the others learned."""
    if signals.calibrations is None:
        return
    await signals.calibrations.maybe_learn(sorted(signals.defined), datetime.now(UTC))
    await signals.calibrations.load()


def _grpc_server(
    signals: Signals, config: Config, telemetry: Telemetry
) -> tuple[grpc.aio.Server, health.aio.HealthServicer, int]:
    listen = config.signal.listen
    check_listen(config.auth, listen, "signal")
    # The limits of lowtide/grpc_options.py; among them no SO_REUSEPORT: a second service on the
    # same port is an error, not a silent split of the subscribers between two processes.
    server = grpc.aio.server(
        options=signal_server_options(),
        interceptors=[*server_interceptors(telemetry), *auth_interceptors(config, SIGNAL_METHODS), RefuseUndecodable()],
    )
    signal_pb2_grpc.add_SignalServiceServicer_to_server(SignalApi(signals), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((SERVICE, reflection.SERVICE_NAME, health.SERVICE_NAME), server)
    port = add_listen_port(server, listen, config.tls, "[signal] listen")
    return server, health_servicer, port


@dataclass(frozen=True)
class _Feeds:
    """The replica's feeds by signal, with their settings and counts."""

    running: dict[str, Feed]
    settings: dict[str, FeedSettings]
    stats: dict[str, FeedStats]

    def units(self) -> dict[str, str]:
        """Each signal's unit: the configured one, else its feed's."""
        return {
            name: s.options.unit or (self.running[name].unit if name in self.running else feed_unit(s.options))
            for name, s in self.settings.items()
        }

    def stale_after(self) -> dict[str, timedelta]:
        return {name: s.options.stale_after for name, s in self.settings.items()}


def _build_feeds(config: Config, owner: contextlib.AsyncExitStack, feed: Feed | None) -> _Feeds:
    """Every signal's feed, each closed by `owner` until its runner has it; `feed` replaces the
    default signal's (tests pass adapters they built)."""
    settings = feed_settings(config)
    running: dict[str, Feed] = {}
    if feed is not None:
        owner.push_async_callback(feed.aclose)
        running[config.cost.signal] = feed
    for name, setting in settings.items():
        if name in running:
            continue
        built = make_feed(setting.options, where=setting.where)
        if built is not None:
            owner.push_async_callback(built.aclose)
            running[name] = built
    return _Feeds(running, settings, {name: FeedStats() for name in running})


def _background(
    config: Config,
    db: Database,
    signals: Signals,
    feeds: _Feeds,
    *,
    replica_id: str,
    report: Callable[[], Awaitable[None]],
) -> list[asyncio.Task[None]]:
    """The replica's loops: other replicas' changes, stale marks, and one per feed (which the
    runner closes when it ends)."""
    cfg = config.signal
    maintain = _maintain(
        signals, stale_after=cfg.stale_after, refresh=cfg.refresh, per_signal=feeds.stale_after(), report=report
    )
    background = [
        asyncio.create_task(_listen(db, signals), name="signal-listen"),
        asyncio.create_task(maintain, name="signal-maintain"),
    ]
    for name, feed in feeds.running.items():
        options = feeds.settings[name].options
        refresh = options.refresh.total_seconds()
        lease = feed_lease(name, default=config.cost.signal)
        seeding = Seeding(options.calibration_seed_days, options.calibration_seed_timeout.total_seconds())
        runner = run_feed(
            feed,
            signals,
            name,
            refresh=refresh,
            stats=feeds.stats[name],
            holder=replica_id,
            lease=lease,
            seeding=seeding,
        )
        background.append(asyncio.create_task(runner, name=f"signal-feed-{name}"))
    return background


def _priors(config: Config) -> dict[str, ErrorModel]:
    """Each signal's forecast error prior: `[signals.NAME]`'s, else `[signal]`'s."""
    base = config.signal
    priors: dict[str, ErrorModel] = {
        config.cost.signal: HorizonError(base.forecast_error_prior_1h, base.forecast_error_prior_24h)
    }
    for name, definition in config.signals.items():
        priors[name] = HorizonError(*definition.forecast_error_prior(base))
    return priors


async def start_signal_service(
    config: Config, *, database_url: str | None = None, feed: Feed | None = None
) -> SignalServer:
    """Starts a replica. `feed` replaces the default signal's configured one (tests pass
    adapters they built); either way the replica owns every feed from here and closes it when
    it stops or fails to start. Whatever is opened is entered on one exit stack, so a failure
    at any step (a ConfigError included) closes everything opened before it."""
    url = database_url or config.database.url
    if not url:
        raise ConfigError("no database URL: set LOWTIDE_DATABASE_URL or [database] url")
    cfg = config.signal
    async with contextlib.AsyncExitStack() as stack:
        # Until the feeds' runners have them (and close them when they end), the start closes them.
        feed_owner = await stack.enter_async_context(contextlib.AsyncExitStack())
        feeds = _build_feeds(config, feed_owner, feed)
        db = Database(url, min_size=config.database.pool_min, max_size=config.database.pool_max)
        stack.push_async_callback(db.close)
        # A replayed feed's forecasts run at its speed: the calibration counts leads in its time.
        scales = {name: float(getattr(f, "time_scale", 1.0)) for name, f in feeds.running.items()}
        signals = Signals(
            SignalStore(db),
            Fanout(),
            definitions(config, units=feeds.units()),
            default=config.cost.signal,
            calibrations=Calibrations(db, scales=scales, priors=_priors(config), every=cfg.calibrate_every),
        )
        # Closed last: the spans of the calls the server ends while stopping are flushed too (in a
        # thread: the export must not stop the event loop, another service of this process may run on it).
        telemetry = start_telemetry("lowtide-signal", cfg.metrics_listen)
        stack.push_async_callback(asyncio.to_thread, telemetry.shutdown)
        metrics = telemetry.metrics
        # The port first: a database connection never holds it (50052 is in the ephemeral range).
        server, health_servicer, port = _grpc_server(signals, config, telemetry)
        stack.push_async_callback(server.stop, None)
        await apply_migrations(url)
        await db.open()
        await signals.start()
        await server.start()
        if signals.calibrations is not None:
            register_calibration_metrics(metrics, signals.calibrations)
        register_signal_metrics(
            metrics, signals.fanout, {name: (f.source, feeds.stats[name]) for name, f in feeds.running.items()}
        )
        replica_id = f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"

        async def report() -> None:
            await _report_health(health_servicer, signals, feeds.running.keys())

        background = _background(config, db, signals, feeds, replica_id=replica_id, report=report)
        stack.push_async_callback(cancel_all, background)
        feed_owner.pop_all()
        for service in ("", SERVICE):
            await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
        await report()
        resources = stack.pop_all()
    polled = {name: f.source for name, f in feeds.running.items()}
    log.info("signal.started", extra={"listen": cfg.listen, "port": port, "feeds": polled, "replica": replica_id})
    return SignalServer(config, db, signals, server, health_servicer, port, replica_id, feeds.stats, metrics, resources)


async def serve(config: Config, *, database_url: str | None = None) -> None:
    running = await start_signal_service(config, database_url=database_url)
    freeze_started()
    print_line(f"lowtide signal service listening on {running.target}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("signal.stopping")
    await running.stop()
