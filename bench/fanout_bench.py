"""Signal fan-out: 1,000 concurrent subscribers (in 4 client processes, so the clients' own work
is spread over both cores as it would be over many machines), 100 changes through SetSignal;
for each change, the time from the SetSignal call to the LAST subscriber receiving it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

import grpc

from bench._pg import throwaway_database
from bench.lowtide_run import _free_port, _percentile, _stop
from lowtide_client import SignalClient

SUBSCRIBERS = 1000
PROCESSES = 4
CHANGES = 100


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


async def signal_fanout(server_url: str) -> dict[str, Any]:
    async with throwaway_database(server_url, "bench_fanout") as url:
        target = f"127.0.0.1:{_free_port()}"
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
        service = await asyncio.create_subprocess_exec(sys.executable, "-m", "lowtide", "signal", "serve", env=env)
        clients: list[asyncio.subprocess.Process] = []
        set_at: dict[int, float] = {}
        try:
            async with SignalClient(target) as signals:
                await _until_serving(signals)
                for _ in range(PROCESSES):
                    clients.append(
                        await asyncio.create_subprocess_exec(
                            sys.executable,
                            "-m",
                            "bench.fanout_subscriber",
                            target,
                            str(SUBSCRIBERS // PROCESSES),
                            stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE,
                        )
                    )
                for client in clients:
                    assert client.stdout is not None
                    line = await asyncio.wait_for(client.stdout.readline(), 120)
                    if line.strip() != b"ready":
                        raise RuntimeError(f"subscriber process said {line!r}")
                for i in range(CHANGES):
                    t0 = time.time()
                    state = await signals.set(200 + i)
                    set_at[state.version] = t0
                    await asyncio.sleep(0.1)
            arrivals: dict[int, float] = {}
            for client in clients:
                out, _ = await asyncio.wait_for(client.communicate(b""), 60)
                for version, at in json.loads(out.decode().strip().splitlines()[-1]).items():
                    arrivals[int(version)] = max(arrivals.get(int(version), 0.0), at)
        finally:
            await _stop([service, *clients])
    latencies = [(arrivals[v] - t) * 1000 for v, t in set_at.items() if v in arrivals]
    return {
        "subscribers": SUBSCRIBERS,
        "client_processes": PROCESSES,
        "changes": CHANGES,
        "delivered_changes": len(latencies),
        "set_to_last_subscriber_ms": {"p50": _percentile(latencies, 0.5), "p99": _percentile(latencies, 0.99)},
    }
