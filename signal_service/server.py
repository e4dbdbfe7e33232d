"""Wires the signal service together and serves it: `start_signal_service(config)` for tests and
`up`, `serve(config)` for `lowtide signal serve` (runs until SIGTERM or SIGINT)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import uuid
from dataclasses import dataclass
from datetime import timedelta

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from lowtide.auth import SIGNAL_METHODS, check_listen
from lowtide.auth import interceptors as auth_interceptors
from lowtide.config import Config
from lowtide.db import Database, apply_migrations
from lowtide.errors import ConfigError, DatabaseUnavailable, LowtideError
from lowtide.grpc_options import signal_server_options
from lowtide.grpc_status import RefuseUndecodable
from lowtide.listen import add_listen_port
from lowtide.metrics import Metrics
from lowtide.output import print_line
from lowtide.tasks import cancel_all
from lowtide.telemetry import Telemetry, server_interceptors, start_telemetry
from lowtide_proto.backoff import Backoff
from lowtide_proto.lowtide.v1 import signal_pb2, signal_pb2_grpc
from signal_service.api import SignalApi
from signal_service.fanout import Fanout
from signal_service.feeds import Feed, feed_unit, make_feed
from signal_service.feeds.runner import FeedStats, run_feed
from signal_service.metrics import register_signal_metrics
from signal_service.signals import Signals, definitions
from signal_service.store import SignalStore

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
    feed_stats: FeedStats
    metrics: Metrics
    resources: contextlib.AsyncExitStack
    stopped: bool = False

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


async def _maintain(signals: Signals, *, stale_after: timedelta, refresh: timedelta) -> None:
    """Marks stale the signals with no update for stale_after (any replica may; the mark is
    stored once and announced by NOTIFY), and re-reads every state as a safety net."""
    while True:
        try:
            for name in await signals.store.mark_stale(stale_after):
                log.warning("signal.stale", extra={"signal": name, "stale_after": str(stale_after)})
            await signals.resync()
        except DatabaseUnavailable as error:
            log.warning("maintain.failed", extra={"error": str(error)})
        except Exception:
            # Keep going: without this loop nothing is ever marked stale again.
            log.exception("maintain.failed")
        await asyncio.sleep(_tick(stale_after, refresh))


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


def _background(
    config: Config, db: Database, signals: Signals, *, feed: Feed | None, stats: FeedStats, replica_id: str
) -> list[asyncio.Task[None]]:
    """The replica's loops: other replicas' changes, stale marks, and the feed (which the
    runner closes when it ends)."""
    cfg = config.signal
    background = [
        asyncio.create_task(_listen(db, signals), name="signal-listen"),
        asyncio.create_task(
            _maintain(signals, stale_after=cfg.stale_after, refresh=cfg.refresh), name="signal-maintain"
        ),
    ]
    if feed is not None:
        refresh = cfg.refresh.total_seconds()
        runner = run_feed(feed, signals, config.cost.signal, refresh=refresh, stats=stats, holder=replica_id)
        background.append(asyncio.create_task(runner, name="signal-feed"))
    return background


async def start_signal_service(
    config: Config, *, database_url: str | None = None, feed: Feed | None = None
) -> SignalServer:
    """Starts a replica. `feed` replaces the configured one (tests pass adapters they built);
    either way the replica owns it from here and closes it when it stops or fails to start.
    Whatever is opened is entered on one exit stack, so a failure at any step (a ConfigError
    included) closes everything opened before it."""
    url = database_url or config.database.url
    if not url:
        raise ConfigError("no database URL: set LOWTIDE_DATABASE_URL or [database] url")
    cfg = config.signal
    async with contextlib.AsyncExitStack() as stack:
        feed = feed or make_feed(cfg)
        # Until the feed's runner has it (and closes it when it ends), the start closes it.
        feed_owner = await stack.enter_async_context(contextlib.AsyncExitStack())
        if feed is not None:
            feed_owner.push_async_callback(feed.aclose)
        db = Database(url, min_size=config.database.pool_min, max_size=config.database.pool_max)
        stack.push_async_callback(db.close)
        unit = feed.unit if feed else feed_unit(cfg)
        signals = Signals(SignalStore(db), Fanout(), definitions(config, feed_unit=unit), default=config.cost.signal)
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
        stats = FeedStats()
        register_signal_metrics(metrics, signals.fanout, stats, cfg.feed)
        replica_id = f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
        background = _background(config, db, signals, feed=feed, stats=stats, replica_id=replica_id)
        stack.push_async_callback(cancel_all, background)
        feed_owner.pop_all()
        for service in ("", SERVICE):
            await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
        resources = stack.pop_all()
    log.info("signal.started", extra={"listen": cfg.listen, "port": port, "feed": cfg.feed, "replica": replica_id})
    return SignalServer(config, db, signals, server, health_servicer, port, replica_id, stats, metrics, resources)


async def serve(config: Config, *, database_url: str | None = None) -> None:
    running = await start_signal_service(config, database_url=database_url)
    print_line(f"lowtide signal service listening on {running.target}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("signal.stopping")
    await running.stop()
