"""lowtide's own figures: no-op tasks through the real services, as separate processes.

- `tasks_per_s`: a scheduler process and 4 `lowtide demo-worker` processes (echo, 64 slots each)
  are started and connected first; then N tasks are submitted in batches of 1,000 while the
  workers run, and the clock runs from the first submit to the last completion (submit ->
  complete, end to end).
- `drain_tasks_per_s`: the same N tasks submitted to a paused queue, the workers connected,
  then the queue resumed; the clock runs from the resume until the last completion, both by the
  database's clock, looking every 0.2 s — the method the peers are measured with (workers
  released together, start-up not counted).
- `dispatch_latency_ms`: on an idle queue, one task at a time: the time from the task's row
  being committed (`created_at`) to its claim (`started_at`), both by the database clock;
  plus the submit -> result round trip seen by the client, and beside each sample the time
  one row takes to commit on the same database (`database_commit_ms`): the floor both share.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg

from bench._cpu import CpuWindow, run_backends
from bench._fleet import POLL_INTERVAL_S
from bench._pg import throwaway_database
from lowtide_client import Client, task_spec
from tests.helpers import free_port

WORKERS = 4
SLOTS = 64
LATENCY_SAMPLES = 200
_ROOT = str(Path(__file__).resolve().parent.parent)


def _env(database_url: str, target: str) -> dict[str, str]:
    return dict(
        os.environ,
        LOWTIDE_DATABASE_URL=database_url,
        # Auth is on by default; the benchmark runs everything on loopback.
        LOWTIDE_AUTH="off",
        LOWTIDE_SCHEDULER_LISTEN=target,
        LOWTIDE_SCHEDULER_METRICS_LISTEN="",
        LOWTIDE_LOG_LEVEL="WARNING",
    )


async def _spawn(env: dict[str, str], *args: str) -> asyncio.subprocess.Process:
    # Their console lines go to stderr: stdout is the bench's one JSON object.
    return await asyncio.create_subprocess_exec(sys.executable, "-m", "lowtide", *args, env=env, stdout=sys.stderr)


async def _stop(processes: list[asyncio.subprocess.Process]) -> None:
    for process in processes:
        if process.returncode is None:
            process.terminate()
    for process in processes:
        try:
            await asyncio.wait_for(process.wait(), 15)
        except TimeoutError:
            process.kill()
            await process.wait()


async def _value(conn: psycopg.AsyncConnection[Any], sql: str) -> Any:
    cur = await conn.execute(sql)
    row = await cur.fetchone()
    assert row is not None
    return row[0]


async def _count(conn: psycopg.AsyncConnection[Any], sql: str) -> int:
    return int(await _value(conn, sql))


async def _wait_for(
    conn: psycopg.AsyncConnection[Any], sql: str, want: int, within: float, *, every: float = 0.01
) -> float:
    deadline = time.monotonic() + within
    while True:
        if await _count(conn, sql) >= want:
            return time.perf_counter()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{sql!r} did not reach {want} within {within}s")
        await asyncio.sleep(every)


@asynccontextmanager
async def _services(database_url: str) -> AsyncIterator[tuple[str, dict[str, str], list[Any]]]:
    target = f"127.0.0.1:{free_port()}"
    env = _env(database_url, target)
    processes = [await _spawn(env, "scheduler", "serve")]
    try:
        async with Client(target) as client:
            # The first call retries until the scheduler listens.
            await client.list(page_size=1)
        yield target, env, processes
    finally:
        await _stop(processes)


async def _start_workers(
    env: dict[str, str], target: str, conn: psycopg.AsyncConnection[Any], count: int = WORKERS
) -> list[Any]:
    workers = [
        await _spawn(env, "demo-worker", "--target", target, "--types", "echo", "--slots", str(SLOTS))
        for _ in range(count)
    ]
    await _wait_for(conn, "SELECT count(*) FROM lowtide.workers", count, 60)
    return workers


async def _throughput(database_url: str, tasks: int) -> dict[str, float]:
    async with (
        _services(database_url) as (target, env, processes),
        await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn,
    ):
        processes.extend(await _start_workers(env, target, conn))
        async with Client(target) as client:
            specs = [task_spec("echo", b"") for _ in range(tasks)]
            started = time.perf_counter()
            for i in range(0, tasks, 1000):
                await client.submit_many(specs[i : i + 1000])
            submitted = time.perf_counter()
        done = await _wait_for(conn, "SELECT count(*) FROM lowtide.tasks WHERE state = 'completed'", tasks, 600)
        await _stop(processes[1:])
    return {
        "tasks_per_s": round(tasks / (done - started)),
        "submit_per_s": round(tasks / (submitted - started)),
        "seconds": round(done - started, 3),
    }


async def drain(
    database_url: str, tasks: int, *, processes: int = WORKERS, per_process: int = 1, slots: int = SLOTS
) -> dict[str, Any]:
    """Submits `tasks` to a paused queue, starts `processes` worker processes (the demo worker, one
    stream each, when `per_process` is 1, else `bench.drain_workers` with `per_process` streams
    each; `slots` per stream), and once every stream is connected resumes the queue: the clock runs
    from the resume to the last completion, so process start-up is not counted whatever the shape
    (the peers' workers are released together the same way, see bench._fleet). Also reports the
    CPU the scheduler, the workers and PostgreSQL spent per task meanwhile (bench._cpu)."""
    async with (
        _services(database_url) as (target, env, processes_run),
        await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn,
        Client(target) as client,
    ):
        await client.pause_queue("default")
        specs = [task_spec("echo", b"") for _ in range(tasks)]
        for i in range(0, tasks, 1000):
            await client.submit_many(specs[i : i + 1000])
        for _ in range(processes):
            if per_process == 1:
                worker = await _spawn(env, "demo-worker", "--target", target, "--types", "echo", "--slots", str(slots))
            else:
                worker = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "bench.drain_workers",
                    target,
                    str(per_process),
                    str(slots),
                    env=_bench_env(env),
                )
            processes_run.append(worker)
        await _wait_for(conn, "SELECT count(*) FROM lowtide.workers", processes * per_process, 120)
        # Timed as the peers are (bench._fleet): from the database's clock just before the
        # resume to the completion time the scheduler recorded on the last task, looking only
        # every POLL_INTERVAL_S, so the count that tells when it is over costs the run next to
        # nothing (counting 100,000 rows every 10 ms took a fifth of a core from it).
        # PostgreSQL's share: the backends of the run's database (bench._cpu.run_backends), as in
        # the steady bench and the peers' drains.
        roles = {"scheduler": [processes_run[0].pid], "workers": [p.pid for p in processes_run[1:]]}
        async with run_backends(conn) as backends:
            cpu = CpuWindow(roles, backends)
            started = await _value(conn, "SELECT clock_timestamp()")
            cpu.start()
            await client.resume_queue("default")
            await _wait_for(
                conn, "SELECT count(*) FROM lowtide.tasks WHERE state = 'completed'", tasks, 600, every=POLL_INTERVAL_S
            )
            used = cpu.per_task(tasks)
        finished = await _value(conn, "SELECT max(finished_at) FROM lowtide.tasks")
    seconds = (finished - started).total_seconds()
    return {"drain_tasks_per_s": round(tasks / seconds), "drain_seconds": round(seconds, 3), "cpu_us_per_task": used}


def _bench_env(env: dict[str, str]) -> dict[str, str]:
    """`env` with the parent of the `bench` package on the path, for `python -m bench.<module>`."""
    return dict(env, PYTHONPATH=os.pathsep.join(filter(None, [_ROOT, env.get("PYTHONPATH")])))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return round(ordered[index], 3)


async def _latency(database_url: str) -> dict[str, Any]:
    async with (
        _services(database_url) as (target, env, processes),
        await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn,
    ):
        processes.extend(await _start_workers(env, target, conn))
        await conn.execute("CREATE TABLE bench_commit_floor (at timestamptz NOT NULL DEFAULT now())")
        round_trips: list[float] = []
        commits: list[float] = []
        async with Client(target) as client:
            for _ in range(LATENCY_SAMPLES):
                await asyncio.sleep(0.02)  # let the queue go idle between samples
                # The database's own floor, beside each sample: one row committed on its own,
                # as a submit commits its tasks. A p99 of dispatch latency above this one's is
                # lowtide's; what they share (a disk that stalls its fsyncs now and then) is not.
                t0 = time.perf_counter()
                await conn.execute("INSERT INTO bench_commit_floor DEFAULT VALUES")
                commits.append((time.perf_counter() - t0) * 1000)
                t0 = time.perf_counter()
                task = await client.submit(
                    "echo",
                    b"",
                )
                await client.wait(task.id)
                round_trips.append((time.perf_counter() - t0) * 1000)
        cur = await conn.execute(
            "SELECT extract(epoch FROM started_at - created_at) * 1000 FROM lowtide.tasks WHERE attempt = 1"
        )
        dispatch = [float(r[0]) for r in await cur.fetchall()]
    return {
        "dispatch_latency_ms": {
            "p50": _percentile(dispatch, 0.5),
            "p99": _percentile(dispatch, 0.99),
            "mean": round(statistics.fmean(dispatch), 3),
            "samples": len(dispatch),
        },
        "submit_to_result_ms": {"p50": _percentile(round_trips, 0.5), "p99": _percentile(round_trips, 0.99)},
        "database_commit_ms": {"p50": _percentile(commits, 0.5), "p99": _percentile(commits, 0.99)},
    }


async def run(server_url: str, tasks: int) -> dict[str, Any]:
    result: dict[str, Any] = {"workers": WORKERS, "slots_per_worker": SLOTS, "tasks": tasks}
    async with throwaway_database(server_url, "bench_lowtide") as url:
        result.update(await _throughput(url, tasks))
    async with throwaway_database(server_url, "bench_lowtide") as url:
        result.update(await drain(url, tasks))
    async with throwaway_database(server_url, "bench_lowtide") as url:
        result.update(await _latency(url))
    return result


if __name__ == "__main__":
    import json

    url = os.environ.get("LOWTIDE_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    print(json.dumps(asyncio.run(run(url, count)), indent=2))
