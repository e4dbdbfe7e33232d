"""`lowtide up`: the database (embedded unless LOWTIDE_DATABASE_URL is set) and the services, in
one supervised process tree, with one line per step on the way up.

- A service that exits with EXIT_CONFIG (a configuration error, a listen port that is taken)
  stops `up` with that service's own one-line message and a non-zero exit: restarting it would
  only fail again. A service that exits otherwise is restarted with backoff, and `up` gives up
  on one that never served after START_ATTEMPTS starts.
- "lowtide is up" is printed once every service answers SERVING to gRPC health checking (over
  TLS with LOWTIDE_CA etc. when the services serve TLS, as for the CLI).
- Ctrl-C or SIGTERM, at any moment: the services get SIGTERM (workers first, the signal service
  last) and whatever still runs GRACE seconds later gets SIGKILL; then the embedded database
  stops. A second Ctrl-C kills at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from lowtide.auth import check_listen, is_loopback
from lowtide.config import Config, DatabaseConfig
from lowtide.db import apply_migrations
from lowtide.db.embedded import NOT_INSTALLED, is_initialized, is_installed, start_embedded
from lowtide.demo import demo_env, demo_worker_args, generate, show
from lowtide.errors import EXIT_CONFIG, ConfigError
from lowtide.health import check_health, wait_http
from lowtide.output import print_line
from lowtide.supervise import Failure, Service, supervise
from lowtide_proto.channel import Security

log = logging.getLogger("lowtide.up")

# Seconds from Ctrl-C (or SIGTERM) until every service still running is killed.
GRACE = 10.0


async def _wait_serving(name: str, target: str, security: Security) -> None:
    """Returns once the service at `target` reports SERVING through gRPC health checking; says
    what it last heard every 15 s meanwhile."""
    loop = asyncio.get_running_loop()
    told = loop.time()
    while True:
        answer = await check_health(target, within=1.0, security=security)
        if answer.serving:
            return
        if loop.time() - told > 15:
            print_line(f"still waiting for the {name} service: {answer.message}")
            told = loop.time()
        await asyncio.sleep(0.1)


def _health_security() -> Security:
    """TLS for the health checks as the CLI has it (LOWTIDE_CA, LOWTIDE_CERT, LOWTIDE_KEY)."""
    ca, cert, key = (os.environ.get(name) or None for name in ("LOWTIDE_CA", "LOWTIDE_CERT", "LOWTIDE_KEY"))
    return Security(ca=ca, cert=cert, key=key)


async def _first(*aws: asyncio.Future[Any]) -> None:
    """Waits for the first of `aws` to finish; raises its exception if it failed."""
    done, _ = await asyncio.wait(aws, return_when=asyncio.FIRST_COMPLETED)
    for finished in done:
        if not finished.cancelled() and finished.exception() is not None:
            raise finished.exception()  # type: ignore[misc]


def dev_auth(config: Config, env: dict[str, str]) -> str:
    """Switches auth off for a loopback dev setup unless tokens are configured or LOWTIDE_AUTH
    is set already; refuses (ConfigError) to serve beyond loopback with nothing to check. Returns
    the banner's auth line."""
    listens = (config.scheduler.listen, config.signal.listen)
    if config.auth.tokens or "LOWTIDE_AUTH" in os.environ:
        if not config.auth.enabled:
            for listen, section in zip(listens, ("scheduler", "signal"), strict=True):
                check_listen(config.auth, listen, section)
            return "OFF (LOWTIDE_AUTH=off): anyone who can connect may do anything"
        if not config.auth.tokens:
            raise ConfigError("lowtide up: LOWTIDE_AUTH=on and no [auth] tokens: every call would be refused")
        return f"on, {len(config.auth.tokens)} token(s) in [auth] tokens"
    if all(is_loopback(listen) for listen in listens):
        env["LOWTIDE_AUTH"] = "off"
        return "OFF for local development (loopback only; configure [auth] tokens to turn it on)"
    raise ConfigError(
        "lowtide up: a listen address is not loopback and no [auth] tokens are configured; "
        "add tokens (see `lowtide token hash`), listen on 127.0.0.1, or set LOWTIDE_AUTH=off "
        "and [auth] allow_insecure_remote = true to accept an open service"
    )


async def run_up(config: Config, *, demo: bool = False, recorded: bool = False) -> int:
    env = dict(os.environ)
    auth_line = dev_auth(config, env)
    loop = asyncio.get_running_loop()
    stopping, hurry = asyncio.Event(), asyncio.Event()

    def stop() -> None:
        if stopping.is_set():
            hurry.set()
        stopping.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    if demo:
        config = replace(config, database=demo_database(config.database))
    database = await _start_database(config, stopping)
    if database is None:
        return 0
    url, where = database
    env["LOWTIDE_DATABASE_URL"] = url
    # The scheduler subscribes to the signal service this process starts, wherever it listens.
    env.setdefault("LOWTIDE_SCHEDULER_SIGNAL_TARGET", config.signal.listen)
    if demo:
        for key, value in demo_env(recorded=recorded).items():
            env.setdefault(key, value)
    stack = _Stack.of(config, env, demo)
    security = _health_security()
    stopped = asyncio.create_task(stopping.wait())
    failure: Failure | None = None
    try:
        await _serve(stack, stopping, stopped, security, banner=lambda: _banner(config, env, where, auth_line, demo))
    except Failure as error:
        failure = error
        print(f"lowtide up: {error}", file=sys.stderr, flush=True)
    finally:
        stopping.set()
        print("stopping ...", flush=True)
        stopped.cancel()
        await _stop(stack, loop.time() + GRACE, hurry)
    if failure is not None:
        return EXIT_CONFIG if failure.code == EXIT_CONFIG else 1
    return 0


def demo_database(database: DatabaseConfig) -> DatabaseConfig:
    """The demo's embedded database lives in a folder of its own (`demo` in the data folder): its
    generated tasks and replayed signal never mix with the ones of `lowtide up`, nor theirs with
    the demo's. A database named by URL is the user's choice, and used as it is."""
    if database.url:
        return database
    return replace(database, data_dir=str(Path(database.data_dir).expanduser() / "demo"))


async def _start_database(config: Config, stopping: asyncio.Event) -> tuple[str, str] | None:
    """The database's URL and where it is (started first if embedded), its schema migrated; None
    when `up` was stopped meanwhile."""
    url = config.database.url
    if url:
        where = "the database at LOWTIDE_DATABASE_URL"
    else:
        data_dir = config.database.data_dir
        if not is_installed():
            raise ConfigError(NOT_INSTALLED)
        if is_initialized(data_dir):
            print(f"starting embedded PostgreSQL (data in {data_dir}) ...", flush=True)
        else:
            print(f"embedded PostgreSQL: first start, creating its database in {data_dir} ...", flush=True)
        url = await asyncio.to_thread(start_embedded, data_dir)
        where = f"embedded PostgreSQL, data in {data_dir}"
    if stopping.is_set():
        return None
    applied = await apply_migrations(url)
    schema = f"database schema: {len(applied)} migration(s) applied" if applied else "database schema: up to date"
    print(schema, flush=True)
    return url, where


@dataclass
class _Stack:
    """The processes `lowtide up` runs (services, and the demo's workers) and the tasks watching them."""

    services: list[Service]
    workers: list[Service]
    targets: dict[str, str]
    served: dict[str, asyncio.Event]
    scheduler_target: str
    demo: bool
    # The web console, started once both services serve; None with [console] listen empty.
    console: Service | None = None
    console_url: str = ""
    supervisors: list[asyncio.Task[None]] = field(default_factory=list)
    extras: list[asyncio.Task[None]] = field(default_factory=list)

    @classmethod
    def of(cls, config: Config, env: dict[str, str], demo: bool) -> _Stack:
        scheduler_target = config.scheduler.listen
        services = [Service("signal", ["signal", "serve"], env), Service("scheduler", ["scheduler", "serve"], env)]
        targets = {"signal": config.signal.listen, "scheduler": scheduler_target}
        workers = (
            [Service(f"demo-worker-{i}", demo_worker_args(scheduler_target, i), env) for i in (1, 2)] if demo else []
        )
        listen = config.console.listen
        console = Service("console", ["console"], env) if listen else None
        env.setdefault("LOWTIDE_CONSOLE_SCHEDULER_TARGET", scheduler_target)
        env.setdefault("LOWTIDE_CONSOLE_SIGNAL_TARGET", config.signal.listen)
        served = {s.name: asyncio.Event() for s in (*services, *workers, *([console] if console else []))}
        return cls(services, workers, targets, served, scheduler_target, demo, console, f"http://{listen}/")


async def _serve(
    stack: _Stack,
    stopping: asyncio.Event,
    stopped: asyncio.Future[Any],
    security: Security,
    *,
    banner: Callable[[], None],
) -> None:
    """Starts the services, waits until each serves, then the demo's workers; returns once `up`
    is stopped (or raises Failure for a service given up on)."""

    async def ready(service: Service) -> None:
        await _wait_serving(service.name, stack.targets[service.name], security)
        stack.served[service.name].set()

    for service in stack.services:
        if stopping.is_set():
            break
        print_line(f"starting the {service.name} service on {stack.targets[service.name]} ...")
        stack.supervisors.append(asyncio.create_task(supervise(service, stopping, stack.served[service.name])))
    serving = asyncio.gather(*(ready(s) for s in stack.services))
    try:
        await _first(serving, stopped, *stack.supervisors)
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
    if stopping.is_set():
        return
    if stack.console is not None:
        await _start_console(stack, stopping, stopped)
    for worker in stack.workers:
        stack.served[worker.name].set()  # a worker has no health check: restarted whenever it exits
        stack.supervisors.append(asyncio.create_task(supervise(worker, stopping, stack.served[worker.name])))
    banner()
    if stack.demo:
        stack.extras += [
            asyncio.create_task(generate(stack.scheduler_target, stopping)),
            asyncio.create_task(show(stack.scheduler_target, stopping)),
        ]
    await _first(stopped, *stack.supervisors)


async def _start_console(stack: _Stack, stopping: asyncio.Event, stopped: asyncio.Future[Any]) -> None:
    """Starts the web console and returns once it answers over HTTP (or `up` is stopped)."""
    assert stack.console is not None
    print_line(f"starting the console on {stack.console_url} ...")
    supervisor = asyncio.create_task(supervise(stack.console, stopping, stack.served["console"]))
    stack.supervisors.append(supervisor)
    waiting = asyncio.ensure_future(wait_http(f"{stack.console_url}static/console.css"))
    try:
        await _first(waiting, stopped, supervisor)
    finally:
        waiting.cancel()
    if waiting.done() and not waiting.cancelled():
        stack.served["console"].set()


async def _stop(stack: _Stack, deadline: float, hurry: asyncio.Event) -> None:
    """Stops everything `up` started, in order; whatever still runs at `deadline` is killed."""
    for task in stack.extras:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    # Workers first, so they hand their work back to a scheduler that is still there; the
    # signal service last, so the scheduler never sees it go.
    await asyncio.gather(
        *(w.stop(deadline, hurry) for w in (*stack.workers, *([stack.console] if stack.console else [])))
    )
    for service in reversed(stack.services):
        await service.stop(deadline, hurry)
    for task in stack.supervisors:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Failure):
            await task


def _banner(config: Config, env: dict[str, str], where: str, auth_line: str, demo: bool) -> None:
    feed = env.get("LOWTIDE_SIGNAL_FEED", config.signal.feed)
    named = {name: d.feed for name, d in config.signals.items() if d.has_feed}
    # Several signals, each from its own feed: each is named.
    feeds = {config.cost.signal: feed, **named}
    feed_text = "feeds: " + ", ".join(f"{n} {f}" for n, f in feeds.items()) if named else f"feed: {feed}"
    console = f"http://{config.console.listen}/" if config.console.listen else "off"
    print(
        "lowtide is up\n"
        f"  database:  {where}\n"
        f"  scheduler: {config.scheduler.listen} (gRPC: SchedulerService, WorkerService)\n"
        f"  signal:    {config.signal.listen} (gRPC: SignalService; {feed_text})\n"
        f"  metrics:   {config.scheduler.metrics_listen or 'off'} (scheduler), "
        f"{config.signal.metrics_listen or 'off'} (signal)\n"
        f"  console:   {console} (web console: signal, held work, pools, tasks)\n"
        f"  auth:      {auth_line}\n"
        + (
            _demo_line(env) + "  two demo workers; every second 2 echo + 1 train (held while the signal is high);\n"
            f"  open {console} to watch the signal rise, the train tasks wait and go when it falls\n"
            if demo
            else "try, in another shell:\n"
            "  lowtide demo-worker\n"
            "  lowtide task submit echo --payload hi\n"
            "  lowtide signal watch    (and lowtide signal set 520 in a third)\n"
        )
        + "Ctrl-C stops everything.",
        flush=True,
    )


def _demo_line(env: dict[str, str]) -> str:
    threshold = env.get("LOWTIDE_COST_DEFER_THRESHOLD", "")
    if env.get("LOWTIDE_SIGNAL_FEED") == "recorded":
        played = "the UK API's recorded week (its forecasts as issued, the values that came)"
    else:
        played = "the 2020 GB grid trace"
    return f"demo: {played} replayed at a day per minute, threshold {threshold} gCO2/kWh;\n"
