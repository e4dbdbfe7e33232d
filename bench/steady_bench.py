"""Steady light load: what each task costs when tasks come one at a time and the queue stays empty.

The drain measures a backlog, where claims and completions come in large batches. Most queues
spend their day the other way: a client submits one task at a time, a worker takes it at once,
and every step of the task is a statement and a message of its own. For each rate in RATES a
scheduler process and 4 `lowtide demo-worker` processes (echo, 64 slots each) are started; one
client submits `echo` tasks one by one (SubmitTask) at that rate for DURATION_S, then waits for
the last to complete. Reported per task: the database's committed transactions (pg_stat_database
xact_commit of the run's database: the submit, the claim, the completion, the SubmitTask
answer's read, and whatever else ran), the CPU of the scheduler, the workers and PostgreSQL
(bench._cpu), and the time from commit to claim and to completion by the database's clock.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from typing import Any

import psycopg

from bench._cpu import CpuWindow
from bench._pg import committed, throwaway_database
from bench.lowtide_run import _percentile, _services, _start_workers, _wait_for
from lowtide_client import Client

RATES = (100, 200)
DURATION_S = 10.0
# PostgreSQL 15 publishes a backend's transaction counts at most once a second.
STATS_FLUSH_S = 1.5


async def _steady(database_url: str, rate: int) -> dict[str, Any]:
    tasks = int(rate * DURATION_S)
    async with (
        _services(database_url) as (target, env, processes),
        await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn,
    ):
        processes.extend(await _start_workers(env, target, conn))
        async with Client(target) as client:
            await client.submit("echo", b"")  # registers the queue: every task after is alike
            await _wait_for(conn, "SELECT count(*) FROM lowtide.tasks WHERE state = 'completed'", 1, 30)
            await asyncio.sleep(STATS_FLUSH_S)
            cpu = CpuWindow({"scheduler": [processes[0].pid], "workers": [p.pid for p in processes[1:]]})
            commits = await committed(conn)
            cpu.start()
            started = time.monotonic()
            for i in range(tasks):
                await client.submit("echo", b"")
                ahead = started + (i + 1) / rate - time.monotonic()
                if ahead > 0:
                    await asyncio.sleep(ahead)
            achieved = tasks / (time.monotonic() - started)
            await _wait_for(conn, "SELECT count(*) FROM lowtide.tasks WHERE state = 'completed'", tasks + 1, 60)
            used = cpu.per_task(tasks)
            await asyncio.sleep(STATS_FLUSH_S)
            # This side's own three reads (two counts before, this one) left out.
            commits = await committed(conn) - commits - 3
        cur = await conn.execute(
            "SELECT extract(epoch FROM started_at - created_at) * 1000,"
            " extract(epoch FROM finished_at - created_at) * 1000 FROM lowtide.tasks ORDER BY id OFFSET 1"
        )
        rows = await cur.fetchall()
    claimed = [float(r[0]) for r in rows]
    completed = [float(r[1]) for r in rows]
    return {
        "rate_per_s": rate,
        "achieved_per_s": round(achieved, 1),
        "tasks": tasks,
        "commits_per_task": round(commits / tasks, 2),
        "cpu_us_per_task": used,
        "created_to_claimed_ms": {"p50": _percentile(claimed, 0.5), "p99": _percentile(claimed, 0.99)},
        "created_to_completed_ms": {
            "p50": _percentile(completed, 0.5),
            "p99": _percentile(completed, 0.99),
            "mean": round(statistics.fmean(completed), 3),
        },
    }


async def steady(server_url: str) -> dict[str, Any]:
    runs = []
    for rate in RATES:
        async with throwaway_database(server_url, "bench_steady") as url:
            run = await _steady(url, rate)
        print(
            f"[steady] {rate}/s one at a time: {run['commits_per_task']} commits, "
            f"{run['cpu_us_per_task']} us CPU a task",
            file=sys.stderr,
        )
        runs.append(run)
    return {
        "workers": 4,
        "slots_per_worker": 64,
        "duration_s": DURATION_S,
        "runs": runs,
        "method": "SubmitTask one at a time at a fixed rate; pg_stat_database xact_commit delta per task; "
        "CPU from /proc (bench._cpu); latencies by the database's clock",
    }
