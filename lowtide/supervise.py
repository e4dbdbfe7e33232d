"""The child processes of `lowtide up`: each service runs as `python -m lowtide ARGS`, its stderr
passed through and its last lines kept, restarted with jittered backoff when it exits.

A service that exits with EXIT_CONFIG (a configuration error, a listen port that is taken) is not
restarted: it would only fail again, so `supervise` raises Failure with the service's own words.
Nor is one that never served after START_ATTEMPTS starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import time
from collections import deque

from lowtide.errors import EXIT_CONFIG
from lowtide_proto.backoff import Backoff

log = logging.getLogger("lowtide.up")

# Starts of a service that exits before it ever served, after which `up` gives up on it.
START_ATTEMPTS = 5


class Service:
    """One child process (`python -m lowtide ARGS`). Its stderr is passed through to ours, and its
    last lines kept, so that a failure can be told in the service's own words."""

    def __init__(self, name: str, args: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.args = args
        self.env = env
        self.process: asyncio.subprocess.Process | None = None
        self.tail: deque[str] = deque(maxlen=20)
        self._relay: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.tail.clear()
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "lowtide", *self.args, env=self.env, stderr=asyncio.subprocess.PIPE
        )
        self._relay = asyncio.create_task(self._pass_stderr(self.process))

    async def _pass_stderr(self, process: asyncio.subprocess.Process) -> None:
        assert process.stderr is not None
        async for line in process.stderr:
            sys.stderr.buffer.write(line)
            sys.stderr.flush()
            self.tail.append(line.decode(errors="replace").rstrip())

    async def wait(self) -> int:
        assert self.process is not None
        code = await self.process.wait()
        if self._relay is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._relay, 5)
        return code

    def message(self) -> str:
        """The service's own account of why it stopped: its `lowtide: ...` error line, else its
        last line on stderr."""
        for line in reversed(self.tail):
            if line.startswith("lowtide: "):
                return line.removeprefix("lowtide: ")
        return self.tail[-1] if self.tail else "(nothing on stderr)"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    def terminate(self) -> None:
        if self.process is not None and self.running:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)

    async def stop(self, deadline: float, hurry: asyncio.Event) -> None:
        """SIGTERM, then SIGKILL at `deadline` (loop time; at least a second from now) or as soon
        as `hurry` is set."""
        process = self.process
        if process is None or process.returncode is not None:
            return
        self.terminate()
        loop = asyncio.get_running_loop()
        hurried = asyncio.ensure_future(hurry.wait())
        try:
            exited = asyncio.ensure_future(process.wait())
            timeout = max(deadline - loop.time(), 1.0)
            await asyncio.wait([exited, hurried], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            hurried.cancel()
        if process.returncode is None:
            log.warning("up.killed", extra={"service": self.name, "pid": process.pid})
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        await self.wait()


class Failure(Exception):
    """A service that cannot run: `up` stops and reports it."""

    def __init__(self, service: Service, code: int) -> None:
        self.service = service
        self.code = code
        super().__init__(f"the {service.name} service exited ({code}): {service.message()}")


async def supervise(service: Service, stopping: asyncio.Event, served: asyncio.Event) -> None:
    """Runs `service` until `stopping`; raises Failure for an exit that restarting cannot mend."""
    backoff = Backoff(initial=0.5, maximum=30.0)
    failed_starts = 0
    while not stopping.is_set():
        started = time.monotonic()
        await service.start()
        code = await service.wait()
        if stopping.is_set():
            return
        if code == EXIT_CONFIG:
            raise Failure(service, code)
        failed_starts = 0 if served.is_set() else failed_starts + 1
        if failed_starts >= START_ATTEMPTS:
            raise Failure(service, code)
        if time.monotonic() - started > 30:
            backoff.reset()
        delay = backoff.next_delay()
        log.error(
            "up.service_exited",
            extra={"service": service.name, "code": code, "error": service.message(), "restart_in": delay},
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), delay)
