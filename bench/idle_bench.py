"""Idle cost: what connected workers with nothing to do cost the scheduler and the database.

For 0, 100 and 1,000 connected workers (4 slots each, written from the protos, see
`bench.idle_fleet`, spread over 4 processes) a scheduler process is started on a database of
its own; once every worker is registered and a few seconds have passed, a window of
`WINDOW_S` seconds, or of the heartbeat interval the fleet follows if longer (so every worker
beats in it exactly once per interval, whatever its phase), is measured: the database's committed
transactions (pg_stat_database xact_commit of that database, before and after; this side's own two
reads left out) and the scheduler process's CPU time (utime + stime from /proc). The fleets stop
before the scheduler does. Targets (issue 15): at 1,000 workers at most 20 commits/s and 5 % of a
core.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import psycopg

from bench import lowtide_run
from bench._cpu import cpu_seconds
from bench._pg import committed, throwaway_database

FLEETS = (0, 100, 1000)
PROCESSES = 4
SETTLE_S = 3.0
WINDOW_S = 15.0
# The parent directory of the `bench` package, so the fleet's `python -m bench.idle_fleet` resolves.
_ROOT = str(Path(__file__).resolve().parent.parent)


async def _fleet(env: dict[str, str], target: str, count: int, prefix: str) -> tuple[asyncio.subprocess.Process, float]:
    """A fleet process with its streams welcomed, and the heartbeat interval they follow."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.idle_fleet", target, str(count), prefix, stdout=asyncio.subprocess.PIPE, env=env
    )
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), 120)
    ready, _, interval = line.decode().strip().partition(" ")
    if ready != "ready":
        raise RuntimeError(f"the idle fleet {prefix} did not start ({line!r})")
    return process, float(interval)


async def _idle(database_url: str, workers: int) -> dict[str, float]:
    async with (
        lowtide_run._services(database_url) as (target, env, processes),
        await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn,
    ):
        scheduler = processes[0]
        fleet_env = dict(env, PYTHONPATH=os.pathsep.join(filter(None, [_ROOT, env.get("PYTHONPATH")])))
        per = [workers // PROCESSES + (1 if i < workers % PROCESSES else 0) for i in range(PROCESSES)]
        fleets, interval = [], 0.0
        try:
            for i, count in enumerate(c for c in per if c):
                fleet, beats_every = await _fleet(fleet_env, target, count, f"idle{i}")
                fleets.append(fleet)
                interval = max(interval, beats_every)
            await lowtide_run._wait_for(conn, "SELECT count(*) FROM lowtide.workers", workers, 120)
            await asyncio.sleep(SETTLE_S)
            window = max(WINDOW_S, interval)
            commits, cpu = await committed(conn), cpu_seconds(scheduler.pid)
            await asyncio.sleep(window)
            commits, cpu = await committed(conn) - commits - 1, cpu_seconds(scheduler.pid) - cpu
        finally:
            # Gone before the scheduler stops, so its drain has no stream left to write to.
            await lowtide_run._stop(fleets)
    return {
        "workers": workers,
        "heartbeat_interval_s": interval,
        "window_s": window,
        "commits_per_s": round(commits / window, 1),
        "scheduler_cpu_pct": round(100 * cpu / window, 1),
    }


async def idle_cost(server_url: str) -> dict[str, Any]:
    runs = []
    for workers in FLEETS:
        async with throwaway_database(server_url, "bench_idle") as url:
            run = await _idle(url, workers)
        print(
            f"[idle] {workers} workers (beating every {run['heartbeat_interval_s']} s): {run['commits_per_s']} "
            f"commits/s, {run['scheduler_cpu_pct']} % CPU",
            file=sys.stderr,
        )
        runs.append(run)
    return {
        "slots_per_worker": 4,
        "min_window_s": WINDOW_S,
        "runs": runs,
        "method": "pg_stat_database xact_commit delta of the run's database; scheduler utime+stime from /proc",
    }
