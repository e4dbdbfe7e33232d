"""The adaptive-limit scenario, shared by its test and `make bench`: a downstream that slows
down and fails past `capacity` concurrent requests (tests/adaptive/downstream.py, a process of
its own), worker processes whose activity calls it (tests/adaptive/caller.py), a signal service
and a scheduler with `call_api` cost-deferrable and limited either adaptively or statically.

`steady` submits tasks and watches the limit; `release` holds the type (the signal high),
submits a held backlog and lowers the signal: everything held is released at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path

import httpx
import psycopg

from lowtide.config import (
    AdaptiveConcurrencyConfig,
    Config,
    CostConfig,
    SchedulerConfig,
    SignalConfig,
    TypeConfig,
)
from lowtide_client import Client, SignalClient, task_spec
from scheduler_service.server import Scheduler, start_scheduler
from signal_service.server import SignalServer, start_signal_service

REPO = Path(__file__).resolve().parents[2]
TYPE = "call_api"
# Retries as a user would set them for a flaky downstream: many attempts, short backoff.
RETRY = {
    "max_attempts": 50,
    "initial_backoff": timedelta(milliseconds=100),
    "backoff_coefficient": 2.0,
    "max_backoff": timedelta(seconds=1),
}


def scheduler_config(signal_target: str, *, adaptive: bool, static_limit: int = 200) -> Config:
    limit = (
        TypeConfig(adaptive_concurrency=AdaptiveConcurrencyConfig(min=1, max=static_limit))
        if adaptive
        else TypeConfig(max_concurrency=static_limit)
    )
    scheduler = SchedulerConfig(
        listen="127.0.0.1:0",
        metrics_listen="127.0.0.1:0",
        signal_target=signal_target,
        maintenance_interval=timedelta(milliseconds=200),
    )
    return Config(
        scheduler=scheduler,
        cost=CostConfig(deferrable_activities=(TYPE,), hold_recheck=timedelta(milliseconds=200)),
        types={TYPE: limit},
        auth=replace(Config().auth, enabled=False),
    )


@dataclass
class Readings:
    """The limit over time (monotonic seconds, limit), read every `every` seconds."""

    values: list[tuple[float, int]] = field(default_factory=list)

    def since(self, start: float) -> list[int]:
        return [v for t, v in self.values if t >= start]

    def rested(self, low: int, high: int, span: float) -> bool:
        """Every reading of the last `span` seconds within [low, high] (and `span` covered)."""
        if not self.values or self.values[-1][0] - self.values[0][0] < span:
            return False
        last = self.values[-1][0]
        return all(low <= v <= high for t, v in self.values if t >= last - span)


@dataclass
class Phase:
    tasks: int
    seconds: float
    requests: int
    failures: int
    peak: int
    limits: list[int]

    @property
    def failure_rate(self) -> float:
        return self.failures / self.requests if self.requests else 0.0

    @property
    def throughput(self) -> float:
        return self.tasks / self.seconds if self.seconds else 0.0


@dataclass
class Setup:
    scheduler: Scheduler
    signal: SignalServer
    downstream: str
    database_url: str
    readings: Readings
    adaptive: bool

    def limit(self) -> int:
        if self.adaptive:
            return self.scheduler.parts.adaptive.limits[TYPE]
        return self.scheduler.parts.dispatcher.static_limits[TYPE]

    async def set_signal(self, value: float) -> None:
        async with SignalClient(self.signal.target) as client:
            await client.set(value=value)

    async def stats(self) -> dict[str, int]:
        async with httpx.AsyncClient(base_url=self.downstream) as http:
            stats: dict[str, int] = (await http.get("/stats")).json()
            return stats

    async def reset(self) -> None:
        async with httpx.AsyncClient(base_url=self.downstream) as http:
            (await http.post("/reset")).raise_for_status()

    def unfinished(self) -> int:
        with psycopg.connect(self.database_url) as conn:
            row = conn.execute("SELECT count(*) FROM lowtide.tasks WHERE state IN ('pending', 'running')").fetchone()
        return int(row[0]) if row else 0

    def held(self) -> int:
        with psycopg.connect(self.database_url) as conn:
            row = conn.execute("SELECT count(*) FROM lowtide.tasks WHERE state = 'pending' AND attempt = 0").fetchone()
        return int(row[0]) if row else 0


async def _read_limits(setup: Setup, every: float = 0.25) -> None:
    while True:
        setup.readings.values.append((time.monotonic(), setup.limit()))
        await asyncio.sleep(every)


def _process(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, LOWTIDE_LOG_LEVEL="WARNING")
    with log.open("ab") as stderr:
        return subprocess.Popen([sys.executable, "-m", *args], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=stderr)


@contextlib.asynccontextmanager
async def running(
    database_url: str,
    logs: Path,
    *,
    adaptive: bool,
    capacity: int = 20,
    base_ms: float = 200.0,
    workers: int = 4,
    slots: int = 50,
) -> AsyncIterator[Setup]:
    """The downstream, the signal service, the scheduler and the worker processes, all started;
    stopped in reverse order on the way out."""
    processes: list[subprocess.Popen[bytes]] = []
    downstream = _process(
        ["tests.adaptive.downstream", "--capacity", str(capacity), "--base-ms", str(base_ms)], logs / "downstream.log"
    )
    processes.append(downstream)
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(_stop, processes)
        assert downstream.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(downstream.stdout.readline), 30)
        url = f"http://127.0.0.1:{int(line.split()[1])}"
        signal_config = Config(
            signal=SignalConfig(listen="127.0.0.1:0", metrics_listen="127.0.0.1:0"),
            auth=replace(Config().auth, enabled=False),
        )
        signal = await start_signal_service(signal_config, database_url=database_url)
        stack.push_async_callback(signal.stop, 0.5)
        scheduler = await start_scheduler(scheduler_config(signal.target, adaptive=adaptive), database_url=database_url)
        stack.push_async_callback(scheduler.stop, 1.0)
        setup = Setup(scheduler, signal, url, database_url, Readings(), adaptive)
        await setup.set_signal(100.0)
        for n in range(workers):
            processes.append(
                _process(
                    ["tests.adaptive.caller", "--target", scheduler.target, "--downstream", url, "--slots", str(slots)],
                    logs / f"caller-{n}.log",
                )
            )
        reader = asyncio.create_task(_read_limits(setup))
        stack.callback(reader.cancel)
        yield setup


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in reversed(processes):
        if process.poll() is None:
            process.terminate()
    for process in reversed(processes):
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def submit(setup: Setup, count: int) -> None:
    async with Client(setup.scheduler.target) as client:
        for start in range(0, count, 500):
            specs = [task_spec(TYPE, **RETRY) for _ in range(min(500, count - start))]  # type: ignore[arg-type]
            await client.submit_many(specs)


async def phase_figures(setup: Setup, tasks: int, began: float, limits_from: float) -> Phase:
    stats = await setup.stats()
    return Phase(
        tasks=tasks,
        seconds=time.monotonic() - began,
        requests=stats["requests"],
        failures=stats["failures"],
        peak=stats["peak"],
        limits=setup.readings.since(limits_from),
    )
