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

from lowtide.config import Config
from lowtide.db import apply_migrations
from lowtide.db.embedded import start_embedded

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


async def run_up(config: Config) -> int:
    url = config.database.url
    if url:
        where = "the database at LOWTIDE_DATABASE_URL"
    else:
        print(f"starting embedded PostgreSQL (data in {config.database.data_dir}) ...", flush=True)
        url = await asyncio.to_thread(start_embedded, config.database.data_dir)
        where = f"embedded PostgreSQL, data in {config.database.data_dir}"
    await apply_migrations(url)
    env = dict(os.environ, LOWTIDE_DATABASE_URL=url)
    services = [Service("scheduler", ["scheduler", "serve"], env), Service("signal", ["signal", "serve"], env)]
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    supervisors = [asyncio.create_task(_supervise(s, stopping)) for s in services]
    print(
        "lowtide is up\n"
        f"  database:  {where}\n"
        f"  scheduler: {config.scheduler.listen} (gRPC: SchedulerService, WorkerService)\n"
        f"  signal:    {config.signal.listen} (gRPC: SignalService; feed: {config.signal.feed})\n"
        "try, in another shell:\n"
        "  lowtide demo-worker\n"
        "  lowtide task submit echo --payload hi\n"
        "  lowtide signal watch    (and lowtide signal set 520 in a third)\n"
        "Ctrl-C stops everything.",
        flush=True,
    )
    await stopping.wait()
    print("stopping ...", flush=True)
    await asyncio.gather(*(s.stop() for s in services))
    for task in supervisors:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return 0
