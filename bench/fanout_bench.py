"""Signal fan-out: 1,000 concurrent subscribers, 100 changes through SetSignal; for each change,
the time from the SetSignal call to the LAST subscriber receiving it.

Run three times, each time against fresh services: with the subscribers in 4 Python processes
(grpc.aio, 8 channels each), the figure tracked from the start; then in 2 Node processes
(@grpc/grpc-js, 8 channels each, `fanout_subscriber.js`), when Node and clients/node's
node_modules are there, on one replica and then on two (one Node process on each: the
subscribers split as a gRPC-aware load balancer would split them; SetSignal goes to the first,
the second hears of each change through the database's NOTIFY). The subscribers run on the
same machine as the service and on a small one they compete with it for the cores: Python's
grpc.aio takes about twice Node's CPU per message received, so the Node figure is nearer a
deployment, where subscribers are elsewhere.

10 untimed changes come first (WARMUP). Each run also reports CPU per change, read from /proc over
the 100 timed changes (Linux only): of each replica, of the subscriber processes, and of the whole
machine (all cores, anything busy: when it is well above the other two, other work on the machine
was competing too)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc

from bench._pg import throwaway_database
from bench.lowtide_run import _percentile, _stop
from lowtide_client import SignalClient
from tests.helpers import free_port

SUBSCRIBERS = 1000
PROCESSES = 4
NODE_PROCESSES = 2
CHANGES = 100
# Untimed changes first: a subscriber's first messages pay one-time costs (V8 compiles Node's
# receive path; the first 5 changes took 100-130 ms against 40-70 ms after), which would
# otherwise make up the p99 of 100.
WARMUP = 10
_HERE = Path(__file__).resolve().parent
_NODE_SUBSCRIBER = _HERE / "fanout_subscriber.js"
_NODE_MODULES = _HERE.parent / "clients" / "node" / "node_modules"


def _ticks() -> tuple[dict[int, int], dict[int, list[int]]]:
    """CPU ticks (user + system) of every process, and each process's children."""
    ticks: dict[int, int] = {}
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # After the command name, which may itself hold spaces and parentheses.
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry.name)
        ticks[pid] = int(fields[11]) + int(fields[12])
        children.setdefault(int(fields[1]), []).append(pid)
    return ticks, children


def _cpu_s(pids: list[int]) -> float | None:
    """CPU seconds used so far by `pids` and their descendants; None without /proc."""
    if not Path("/proc/self/stat").exists():
        return None
    ticks, children = _ticks()
    total, todo = 0, list(pids)
    while todo:
        pid = todo.pop()
        total += ticks.get(pid, 0)
        todo += children.get(pid, [])
    return total / os.sysconf("SC_CLK_TCK")


def _busy_s() -> float | None:
    """CPU seconds the machine has been busy so far, all cores (not idle, not waiting on I/O)."""
    try:
        fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except OSError:
        return None
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


class _CpuMeter:
    """CPU used between start() and stop(), in ms per change: of each signal-service replica, of
    the subscriber processes, and of the machine."""

    def __init__(self) -> None:
        self._start: list[float | None] = []
        self.per_change: dict[str, Any] = {}

    def _read(self, services: list[int], clients: list[int]) -> list[float | None]:
        return [*(_cpu_s([pid]) for pid in services), _cpu_s(clients), _busy_s()]

    def start(self, services: list[int], clients: list[int]) -> None:
        self._start = self._read(services, clients)

    def stop(self, services: list[int], clients: list[int]) -> None:
        used = [
            None if before is None or after is None else round((after - before) * 1000 / CHANGES, 1)
            for before, after in zip(self._start, self._read(services, clients), strict=True)
        ]
        *replicas, client, machine = used
        known = [r for r in replicas if r is not None]
        self.per_change = {
            # Summed over the replicas (one replica: its own), and each replica's.
            "server_cpu_ms_per_change": round(sum(known), 1) if known else None,
            "server_cpu_ms_per_change_per_replica": replicas,
            "client_cpu_ms_per_change": client,
            "machine_busy_ms_per_change": machine,
        }


async def _until_serving(signals: SignalClient) -> None:
    for _ in range(300):
        try:
            await signals.set(100)
            return
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.UNAVAILABLE:
                raise
        await asyncio.sleep(0.1)
    raise TimeoutError("the signal service did not start within 30 s")


def _node_missing() -> str | None:
    """Why the Node run cannot happen, or None; installs clients/node's packages (from its lock
    file, as `make test` does) when node and npm are there and the packages are not."""
    if shutil.which("node") is None:
        return "node is not on PATH"
    if not (_NODE_MODULES / "@grpc" / "grpc-js").is_dir():
        npm = shutil.which("npm")
        if npm is None:
            return "clients/node has no node_modules and npm is not on PATH"
        installed = subprocess.run([npm, "ci", "--silent"], cwd=_NODE_MODULES.parent, check=False)
        if installed.returncode != 0:
            return f"`npm ci` in clients/node failed ({installed.returncode})"
    return None


async def _run(server_url: str, *, node: bool, replicas: int = 1) -> dict[str, Any]:
    """One run: `replicas` signal-service replicas on one database, the subscriber processes
    split between them (as a gRPC-aware load balancer would spread them), every SetSignal sent
    to the first (the others learn of it through NOTIFY, as in a deployment)."""
    processes = NODE_PROCESSES if node else PROCESSES
    async with throwaway_database(server_url, "bench_fanout") as url:
        targets = [f"127.0.0.1:{free_port()}" for _ in range(replicas)]
        services: list[asyncio.subprocess.Process] = []
        for target in targets:
            env = dict(
                os.environ,
                LOWTIDE_DATABASE_URL=url,
                LOWTIDE_LOG_LEVEL="WARNING",
                # Loopback only, and auth is checked once per call, not per streamed message: off,
                # so the benchmark needs no token and measures the fan-out alone.
                LOWTIDE_AUTH="off",
                LOWTIDE_SIGNAL_LISTEN=target,
                LOWTIDE_SIGNAL_METRICS_LISTEN="",
            )
            services.append(
                await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "lowtide", "signal", "serve", env=env, stdout=subprocess.DEVNULL
                )
            )
        clients: list[asyncio.subprocess.Process] = []
        set_at: dict[int, float] = {}
        cpu = _CpuMeter()
        service_pids = [service.pid for service in services]
        try:
            async with SignalClient(targets[0]) as signals:
                await _until_serving(signals)
                for target in targets[1:]:
                    async with SignalClient(target) as other:
                        await _until_serving(other)
                for i in range(processes):
                    count = SUBSCRIBERS // processes + (i < SUBSCRIBERS % processes)
                    program = (
                        ["node", str(_NODE_SUBSCRIBER)] if node else [sys.executable, "-m", "bench.fanout_subscriber"]
                    )
                    clients.append(
                        await asyncio.create_subprocess_exec(
                            *program, targets[i % replicas], str(count), stdin=subprocess.PIPE, stdout=subprocess.PIPE
                        )
                    )
                for client in clients:
                    assert client.stdout is not None
                    line = await asyncio.wait_for(client.stdout.readline(), 120)
                    if line.strip() != b"ready":
                        raise RuntimeError(f"subscriber process said {line!r}")
                pids = [client.pid for client in clients]
                for i in range(WARMUP + CHANGES):
                    if i == WARMUP:
                        cpu.start(service_pids, pids)
                    t0 = time.time()
                    state = await signals.set(200 + i)
                    if i >= WARMUP:
                        set_at[state.version] = t0
                    await asyncio.sleep(0.1)
                cpu.stop(service_pids, pids)
            arrivals: dict[int, float] = {}
            for client in clients:
                out, _ = await asyncio.wait_for(client.communicate(b""), 60)
                for version, at in json.loads(out.decode().strip().splitlines()[-1]).items():
                    arrivals[int(version)] = max(arrivals.get(int(version), 0.0), at)
        finally:
            await _stop([*services, *clients])
    latencies = [(arrivals[v] - t) * 1000 for v, t in set_at.items() if v in arrivals]
    return {
        "replicas": replicas,
        "client_processes": processes,
        "delivered_changes": len(latencies),
        "set_to_last_subscriber_ms": {"p50": _percentile(latencies, 0.5), "p99": _percentile(latencies, 0.99)},
        **cpu.per_change,
    }


async def signal_fanout(server_url: str) -> dict[str, Any]:
    report: dict[str, Any] = {"subscribers": SUBSCRIBERS, "changes": CHANGES, "warmup_changes": WARMUP}
    report.update(await _run(server_url, node=False))
    missing = _node_missing()
    if missing:
        report["node_subscribers"] = {"skipped": missing}
        return report
    report["node_subscribers"] = await _run(server_url, node=True)
    # Scale-out: the same 1,000 subscribers split over two replicas.
    report["node_subscribers_two_replicas"] = await _run(server_url, node=True, replicas=2)
    return report
