"""What the hostile tests (and `make bench`'s hostile part) run beside an attack: both services as
real processes with auth on, and well-behaved clients that say what a user would notice — a
subscriber that must keep getting changes, `SetSignal` and `SubmitTask` that must keep
answering — plus the attacked process's CPU and memory, read from /proc."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lowtide_client import Client, SignalClient
from tests.helpers import free_port

REPO = Path(__file__).resolve().parents[2]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_bytes(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE


@dataclass
class Service:
    name: str
    target: str
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def port(self) -> int:
        return int(self.target.rsplit(":", 1)[1])


@dataclass
class Services:
    signal: Service
    scheduler: Service
    token: str

    def by_name(self, name: str) -> Service:
        return self.signal if name == "signal" else self.scheduler

    def logs(self) -> str:
        return "\n".join(
            f"--- {s.name} ---\n{s.log.read_text(errors='replace')[-4000:]}" for s in (self.signal, self.scheduler)
        )


async def serving(target: str) -> bool:
    async with grpc.aio.insecure_channel(target) as channel:
        try:
            answer = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2.0)
        except grpc.aio.AioRpcError:
            return False
        return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)


def serving_now(target: str) -> bool:
    """`serving`, without an event loop (for fixtures and the bench's setup)."""
    with grpc.insecure_channel(target) as channel:
        try:
            answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2.0)
        except grpc.RpcError:
            return False
        return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)


def _until_serving(service: Service, within: float) -> None:
    deadline = time.monotonic() + within
    while not serving_now(service.target):
        if service.process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{service.name} did not start:\n{service.log.read_text(errors='replace')[-4000:]}")
        time.sleep(0.2)


@contextlib.contextmanager
def services(database_url: str, workdir: Path) -> Iterator[Services]:
    """Both services, as `lowtide signal serve` and `lowtide scheduler serve`, auth on with one
    admin token (which the scheduler also presents to the signal service)."""
    token = secrets.token_urlsafe(24)
    signal_target = f"127.0.0.1:{free_port()}"
    scheduler_target = f"127.0.0.1:{free_port()}"
    config = workdir / "lowtide.toml"
    config.write_text(
        f"""[auth]
signal_token = "{token}"

[[auth.tokens]]
name = "canary"
role = "admin"
sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"
"""
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOWTIDE_")}
    env.update(
        LOWTIDE_CONFIG=str(config),
        LOWTIDE_DATABASE_URL=database_url,
        LOWTIDE_LOG_LEVEL="WARNING",
        LOWTIDE_SIGNAL_LISTEN=signal_target,
        LOWTIDE_SIGNAL_METRICS_LISTEN="",
        LOWTIDE_SCHEDULER_LISTEN=scheduler_target,
        LOWTIDE_SCHEDULER_METRICS_LISTEN="",
        LOWTIDE_SCHEDULER_SIGNAL_TARGET=signal_target,
    )
    started: list[Service] = []
    try:
        for name, target in (("signal", signal_target), ("scheduler", scheduler_target)):
            log = workdir / f"{name}.log"
            with log.open("ab") as out:
                process = subprocess.Popen(
                    [sys.executable, "-m", "lowtide", name, "serve"],
                    cwd=REPO,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            service = Service(name, target, process, log)
            started.append(service)
            _until_serving(service, within=60)
        yield Services(started[0], started[1], token)
    finally:
        for service in started:
            if service.process.poll() is None:
                service.process.kill()
            service.process.wait(timeout=10)


@dataclass
class Figures:
    """What the canary saw during one attack."""

    set_latencies: list[float] = field(default_factory=list)
    submit_latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    versions_seen: list[int] = field(default_factory=list)
    last_version_set: int = 0
    peak_rss: int = 0
    rss_before: int = 0
    rss_after: int = 0
    cpu: float = 0.0
    attacker: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        def p(values: list[float], q: float) -> float | None:
            if not values:
                return None
            ordered = sorted(values)
            return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 1)

        return {
            "service_cpu_s": round(self.cpu, 2),
            "rss_mb_before": round(self.rss_before / 2**20, 1),
            "rss_mb_peak": round(self.peak_rss / 2**20, 1),
            "set_signal_ms_p50": p(self.set_latencies, 0.5),
            "set_signal_ms_max": p(self.set_latencies, 1.0),
            "submit_task_ms_p50": p(self.submit_latencies, 0.5),
            "submit_task_ms_max": p(self.submit_latencies, 1.0),
            "calls": len(self.set_latencies) + len(self.submit_latencies),
            "failures": len(self.failures),
            "changes_seen": len(self.versions_seen),
            "attacker": self.attacker,
        }


async def run_attack(
    services: Services, attack: str, victim: str, *, seconds: float, call_timeout: float = 10.0
) -> Figures:
    """Runs `attack` against `victim` ("signal" or "scheduler") for `seconds` in its own process,
    with the canary beside it: a Subscribe stream, a SetSignal and a SubmitTask every 0.25 s."""
    service = services.by_name(victim)
    figures = Figures(rss_before=rss_bytes(service.pid))
    figures.peak_rss = figures.rss_before
    cpu_before = cpu_seconds(service.pid)
    stop = asyncio.Event()
    arrived = asyncio.Event()
    async with (
        SignalClient(services.signal.target, token=services.token) as signals,
        Client(services.scheduler.target, token=services.token) as client,
    ):

        async def subscribe() -> None:
            with contextlib.suppress(grpc.aio.AioRpcError):
                async for update in signals.updates(reconnect=True):
                    figures.versions_seen.append(update.state.version)
                    arrived.set()

        async def seen(version: int, within: float) -> None:
            """Until the subscriber has seen `version` (or a later one), at most `within`."""
            deadline = time.monotonic() + within
            while not figures.versions_seen or figures.versions_seen[-1] < version:
                arrived.clear()
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(arrived.wait(), left)

        async def setter() -> None:
            value = 100.0
            while not stop.is_set():
                value = 300.0 if value == 100.0 else 100.0
                started = time.monotonic()
                try:
                    state = await asyncio.wait_for(signals.set(value), call_timeout)
                    figures.set_latencies.append(time.monotonic() - started)
                    figures.last_version_set = max(figures.last_version_set, state.version)
                except (grpc.aio.AioRpcError, TimeoutError) as error:
                    figures.failures.append(f"SetSignal: {error!r}"[:300])
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.25)

        async def submitter() -> None:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    await asyncio.wait_for(client.submit("canary", payload=b"c"), call_timeout)
                    figures.submit_latencies.append(time.monotonic() - started)
                except (grpc.aio.AioRpcError, TimeoutError) as error:
                    figures.failures.append(f"SubmitTask: {error!r}"[:300])
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.25)

        async def sample_memory() -> None:
            while not stop.is_set():
                with contextlib.suppress(OSError):
                    figures.peak_rss = max(figures.peak_rss, rss_bytes(service.pid))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.1)

        subscriber = asyncio.create_task(subscribe())
        # The subscriber's first state, before the attack starts.
        await seen(1, within=15)
        tasks = [asyncio.create_task(c()) for c in (setter, submitter, sample_memory)]
        attacker = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.hostile.attacks",
            attack,
            service.target,
            str(seconds),
            cwd=REPO,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(attacker.communicate(), seconds + 60)
        except TimeoutError:
            attacker.kill()
            out, err = await attacker.communicate()
        stop.set()
        await asyncio.gather(*tasks)
        figures.cpu = cpu_seconds(service.pid) - cpu_before
        try:
            figures.attacker = json.loads(out.decode().strip().splitlines()[-1])
        except (IndexError, ValueError):
            figures.attacker = {"error": err.decode(errors="replace")[-2000:]}
        # After the attack: one more change, which the subscriber must get.
        started = time.monotonic()
        try:
            state = await asyncio.wait_for(signals.set(200.0), call_timeout)
            figures.set_latencies.append(time.monotonic() - started)
            figures.last_version_set = state.version
        except (grpc.aio.AioRpcError, TimeoutError) as error:
            figures.failures.append(f"SetSignal after: {error!r}"[:300])
        await seen(figures.last_version_set, within=15)
        subscriber.cancel()
        await asyncio.gather(subscriber, return_exceptions=True)
    figures.rss_after = rss_bytes(service.pid)
    return figures
