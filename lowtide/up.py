"""`lowtide up`: the database (embedded unless LOWTIDE_DATABASE_URL is set) and the services, in
one supervised process tree. A service that dies is restarted with backoff; Ctrl-C or SIGTERM
stops the services first, then the embedded database.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lowtide.auth import check_listen, is_loopback
from lowtide.config import Config
from lowtide.db import apply_migrations
from lowtide.db.embedded import start_embedded
from lowtide.demo import demo_env, demo_worker_args, generate, show
from lowtide.errors import ConfigError

log = logging.getLogger("lowtide.up")


class Service:
    def __init__(self, name: str, args: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.args = args
        self.env = env
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(sys.executable, "-m", "lowtide", *self.args, env=self.env)

    async def stop(self, grace: float = 10.0) -> None:
        process = self.process
        if process is None or process.returncode is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), grace)
        except TimeoutError:
            process.kill()
            await process.wait()


async def _supervise(service: Service, stopping: asyncio.Event) -> None:
    delay = 0.5
    while not stopping.is_set():
        started = time.monotonic()
        await service.start()
        assert service.process is not None
        code = await service.process.wait()
        if stopping.is_set():
            return
        if time.monotonic() - started > 30:
            delay = 0.5
        log.error("up.service_exited", extra={"service": service.name, "code": code, "restart_in": delay})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), delay)
        delay = min(delay * 2, 30.0)


async def _wait_serving(target: str, within: float = 60.0) -> bool:
    """Waits until the service at `target` reports SERVING through gRPC health checking."""
    deadline = asyncio.get_running_loop().time() + within
    async with grpc.aio.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while asyncio.get_running_loop().time() < deadline:
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return True
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.1)
    return False


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


async def run_up(config: Config, *, demo: bool = False) -> int:
    env = dict(os.environ)
    auth_line = dev_auth(config, env)
    url = config.database.url
    if url:
        where = "the database at LOWTIDE_DATABASE_URL"
    else:
        print(f"starting embedded PostgreSQL (data in {config.database.data_dir}) ...", flush=True)
        url = await asyncio.to_thread(start_embedded, config.database.data_dir)
        where = f"embedded PostgreSQL, data in {config.database.data_dir}"
    await apply_migrations(url)
    env["LOWTIDE_DATABASE_URL"] = url
    # The scheduler subscribes to the signal service this process starts, wherever it listens.
    env.setdefault("LOWTIDE_SCHEDULER_SIGNAL_TARGET", config.signal.listen)
    if demo:
        for key, value in demo_env().items():
            env.setdefault(key, value)
    services = [Service("signal", ["signal", "serve"], env), Service("scheduler", ["scheduler", "serve"], env)]
    scheduler_target = config.scheduler.listen
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    supervisors = [asyncio.create_task(_supervise(s, stopping)) for s in services]
    ready = await asyncio.gather(_wait_serving(scheduler_target), _wait_serving(config.signal.listen))
    if not all(ready):
        log.error("up.not_serving", extra={"scheduler": ready[0], "signal": ready[1]})
    workers = [Service(f"demo-worker-{i}", demo_worker_args(scheduler_target, i), env) for i in (1, 2)] if demo else []
    supervisors += [asyncio.create_task(_supervise(s, stopping)) for s in workers]
    feed = env.get("LOWTIDE_SIGNAL_FEED", config.signal.feed)
    print(
        "lowtide is up\n"
        f"  database:  {where}\n"
        f"  scheduler: {scheduler_target} (gRPC: SchedulerService, WorkerService)\n"
        f"  signal:    {config.signal.listen} (gRPC: SignalService; feed: {feed})\n"
        f"  metrics:   {config.scheduler.metrics_listen or 'off'} (scheduler), "
        f"{config.signal.metrics_listen or 'off'} (signal)\n"
        f"  auth:      {auth_line}\n"
        + (
            "demo: the 2020 GB grid trace replayed at a day per minute, threshold 215 gCO2/kWh;\n"
            "  two demo workers; every second 2 echo + 1 train (held while the signal is high)\n"
            if demo
            else "try, in another shell:\n"
            "  lowtide demo-worker\n"
            "  lowtide task submit echo --payload hi\n"
            "  lowtide signal watch    (and lowtide signal set 520 in a third)\n"
        )
        + "Ctrl-C stops everything.",
        flush=True,
    )
    extras = (
        [
            asyncio.create_task(generate(scheduler_target, stopping)),
            asyncio.create_task(show(scheduler_target, stopping)),
        ]
        if demo
        else []
    )
    await stopping.wait()
    print("stopping ...", flush=True)
    for task in extras:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    # Workers first, so they hand their work back to a scheduler that is still there; the
    # signal service last, so the scheduler never sees it go.
    await asyncio.gather(*(s.stop() for s in workers))
    for service in reversed(services):
        await service.stop()
    for task in supervisors:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return 0
