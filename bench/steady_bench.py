"""Steady single submits, side by side: lowtide and PgQueuer under the same open-loop offered rates.

Most queues spend their day the way a web app uses them: many callers each submit one task, the
queue stays near empty, a worker takes it at once. For each offered rate (RATES, then MORE upward
until neither system keeps up) each system gets a database of its own and is loaded open loop
for DURATION_S: every submit is fired on its schedule (many in flight at once, one channel or
pool), never waiting for the one before. lowtide: a scheduler process and WORKERS
`lowtide demo-worker` processes (echo, SLOTS slots), one `Client.submit` per task on one
gRPC channel (a message of the client's one `SubmitStream` call each). PgQueuer: its
single-row `Queries.enqueue` through an asyncpg pool of POOL_SIZE, and
CONSUMERS `bench.pgqueuer_worker` processes (continuous mode, the drain bench's settings).

Reported per system and rate: completed/s (tasks finished over the time from the first scheduled
submit to the last finish), the CPU per task of each process (scheduler, workers, PostgreSQL;
bench._cpu; this load generator apart, its database backends in PostgreSQL's share; of
PostgreSQL, the backends connected to the run's database, not the server's shared background
processes nor other databases' work on a shared machine), the
database's committed transactions per task, submit p50/p99 (from the moment a submit was due,
so a late generator counts against the system, not for it), submit -> finished p50/p99 (the
same start to the finish the system recorded: lowtide's finished_at, PgQueuer's log row), and
the saturation rate: the highest offered rate kept, i.e. every submit answered, every task
finished, and submit p99 at most KEPT_P99_MS. The ladder of rates is coarse (300 to 1,000 is a
step of 3.3x), so once it is run each system is probed between the highest rate it kept and the
lowest above that it did not, halving the gap until it is at most SATURATION_STEP. Each run
also gives how long a fixed loop took on the host just before it (bench._machine.cpu_loop_ms):
the same code's latencies drift with it.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import asyncpg
import psycopg
from pgqueuer import AsyncpgDriver, AsyncpgPoolDriver, Queries

from bench import _fleet, pgqueuer_bench
from bench._cpu import CpuWindow, cpu_seconds, run_backends
from bench._machine import cpu_loop_ms
from bench._pg import committed, throwaway_database
from bench.lowtide_run import SLOTS, _percentile, _services, _start_workers, _wait_for
from bench.pgqueuer_worker import ENTRYPOINT
from lowtide_client import Client

RATES = (100, 300, 1000, 2000)
# Tried after RATES, in order, until a rate neither system keeps.
MORE = (3000, 4000, 6000, 8000)
DURATION_S = 10.0
KEPT_P99_MS = 100.0
# The saturation rate is narrowed to within this many submits a second.
SATURATION_STEP = 50
# A submit not answered within this is counted failed.
SUBMIT_TIMEOUT_S = 10.0
# How long the last tasks may take to finish once the last submit is answered.
FINISH_GRACE_S = 30.0
WORKERS = 2
CONSUMERS = 2
POOL_SIZE = 16
# PostgreSQL 15 publishes a backend's transaction counts at most once a second.
STATS_FLUSH_S = 1.5


@dataclass
class System:
    """One system under load: `submit()` stores one task and returns its id; `finished()` reads
    (id, finish time as epoch seconds) of every finished task; `roles` are its processes' pids."""

    submit: Callable[[], Awaitable[int]]
    finished: Callable[[], Awaitable[list[tuple[int, float]]]]
    roles: dict[str, list[int]]
    conn: psycopg.AsyncConnection[Any]


@asynccontextmanager
async def _lowtide(database_url: str) -> AsyncIterator[System]:
    async with (
        _services(database_url) as (target, env, processes),
        await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn,
    ):
        processes.extend(await _start_workers(env, target, conn, WORKERS))
        async with Client(target) as client:

            async def submit() -> int:
                return int((await client.submit("echo", b"")).id)

            async def finished() -> list[tuple[int, float]]:
                cur = await conn.execute(
                    "SELECT id, extract(epoch FROM finished_at)::float8 FROM lowtide.tasks WHERE state = 'completed'"
                )
                return [(int(r[0]), float(r[1])) for r in await cur.fetchall()]

            # The first task registers the queue and warms every path; every task after is alike.
            await submit()
            await _wait_for(conn, "SELECT count(*) FROM lowtide.tasks WHERE state = 'completed'", 1, 30)
            roles = {"scheduler": [processes[0].pid], "workers": [p.pid for p in processes[1:]]}
            yield System(submit, finished, roles, conn)


@asynccontextmanager
async def _pgqueuer(database_url: str) -> AsyncIterator[System]:
    setup = await asyncpg.connect(database_url)
    try:
        await Queries(AsyncpgDriver(setup)).install()
    finally:
        await setup.close()
    argv = [*pgqueuer_bench.WORKER_ARGV, "--mode=continuous"]
    consumers = []
    try:
        for _ in range(CONSUMERS):
            consumers.append(await _fleet._spawn("bench.pgqueuer_worker", argv, database_url))
        await asyncio.wait_for(asyncio.gather(*(_fleet._await_ready(p) for p in consumers)), 60)
        await asyncio.gather(*(_fleet._release(p) for p in consumers))
        async with (
            asyncpg.create_pool(database_url, min_size=POOL_SIZE, max_size=POOL_SIZE) as pool,
            await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn,
        ):
            queries = Queries(AsyncpgPoolDriver(pool))

            async def submit() -> int:
                (job_id,) = await queries.enqueue(ENTRYPOINT, None, 0)
                return int(job_id)

            async def finished() -> list[tuple[int, float]]:
                cur = await conn.execute(
                    "SELECT job_id, extract(epoch FROM created)::float8 FROM pgqueuer_log WHERE status = 'successful'"
                )
                return [(int(r[0]), float(r[1])) for r in await cur.fetchall()]

            await submit()
            done = "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"
            await _wait_for(conn, done, 1, 30)
            yield System(submit, finished, {"workers": [p.pid for p in consumers]}, conn)
    finally:
        await _fleet._stop(consumers)


SYSTEMS = {"lowtide": _lowtide, "pgqueuer": _pgqueuer}


async def _offer(system: System, rate: int, cpu: CpuWindow) -> tuple[dict[int, float], list[float], int]:
    """Fires rate * DURATION_S submits on schedule; returns, per stored id, the wall time its
    submit was due, the submit latencies (ms, from when due) and how many failed."""
    count = int(rate * DURATION_S)
    due_at: dict[int, float] = {}
    latencies: list[float] = []
    failed = 0

    async def one(due_wall: float, due_mono: float) -> None:
        nonlocal failed
        try:
            # asyncio.timeout, not wait_for: no second task a submit in the generator's loop.
            async with asyncio.timeout(SUBMIT_TIMEOUT_S):
                task_id = await system.submit()
        except Exception:
            failed += 1
            return
        latencies.append((time.monotonic() - due_mono) * 1000)
        due_at[task_id] = due_wall

    start_mono, start_wall = time.monotonic(), time.time()
    inflight: set[asyncio.Task[None]] = set()
    fired = 0
    next_sample = start_mono + 0.5
    while fired < count:
        now = time.monotonic()
        # Every submit due by now is fired, each at its own scheduled time.
        while fired < count and start_mono + fired / rate <= now:
            offset = fired / rate
            task = asyncio.create_task(one(start_wall + offset, start_mono + offset))
            inflight.add(task)
            task.add_done_callback(inflight.discard)
            fired += 1
        if now >= next_sample:
            cpu.sample()
            next_sample = now + 0.5
        if fired < count:
            await asyncio.sleep(max(0.0, start_mono + fired / rate - time.monotonic()))
    while inflight:
        await asyncio.wait(set(inflight), timeout=0.5)
        cpu.sample()
    return due_at, latencies, failed


async def _run(name: str, database_url: str, rate: int) -> dict[str, Any]:
    async with SYSTEMS[name](database_url) as system:
        conn = system.conn
        await asyncio.sleep(STATS_FLUSH_S)
        # This process's own heap (both systems' clients, asyncpg, psycopg: ~100,000 objects) is
        # kept out of its full garbage collections: one walking it stopped the firing of submits
        # and the reading of answers for tens of ms, counted against whichever system was loaded.
        gc.collect()
        gc.freeze()
        # How fast the host runs fixed work just before the load (the system under test idle).
        host = cpu_loop_ms(3)
        # PostgreSQL's share is the run's own backends: the machine's other databases are not its.
        async with run_backends(conn) as backends:
            cpu = CpuWindow(system.roles, backends)
            commits = await committed(conn)
            cpu.start()
            generator = cpu_seconds(os.getpid())
            due_at, latencies, failed = await _offer(system, rate, cpu)
            # Waits for every stored task to finish (or the grace to pass), reading every 0.2 s.
            deadline = time.monotonic() + FINISH_GRACE_S
            while True:
                done = {i: t for i, t in await system.finished() if i in due_at}
                if len(done) >= len(due_at) or time.monotonic() > deadline:
                    break
                cpu.sample()
                await asyncio.sleep(0.2)
            tasks = max(1, len(done))
            used = cpu.per_task(tasks)
        generator = cpu_seconds(os.getpid()) - generator
        await asyncio.sleep(STATS_FLUSH_S)
        # This side's own reads (the first count, the polls, this one) are a few of many thousands.
        commits = await committed(conn) - commits
    first_due = min(due_at.values(), default=0.0)
    span = max(done.values(), default=first_due) - first_due
    finish_ms = [(t - due_at[i]) * 1000 for i, t in done.items()]
    kept = not failed and len(done) == len(due_at) and bool(latencies)
    p99 = _percentile(latencies, 0.99) if latencies else None
    return {
        "offered_per_s": rate,
        "submitted": len(due_at),
        "failed_submits": failed,
        "finished": len(done),
        "completed_per_s": round(len(done) / span, 1) if span > 0 else None,
        "cpu_us_per_task": used,
        # Not in the system's figures: what firing and timing the submits cost this process.
        "load_generator_cpu_us_per_task": round(generator / tasks * 1e6, 1),
        "commits_per_task": round(commits / tasks, 2),
        "submit_ms": {"p50": _percentile(latencies, 0.5), "p99": p99} if latencies else None,
        "submit_to_finished_ms": (
            {"p50": _percentile(finish_ms, 0.5), "p99": _percentile(finish_ms, 0.99)} if finish_ms else None
        ),
        "kept": kept and p99 is not None and p99 <= KEPT_P99_MS,
        "host_loop_ms": host,
    }


def _line(name: str, run: dict[str, Any]) -> str:
    cpu = run["cpu_us_per_task"] or {}
    submit, finish = run["submit_ms"] or {}, run["submit_to_finished_ms"] or {}
    return (
        f"[steady] {name} {run['offered_per_s']}/s: {run['completed_per_s']}/s done, "
        f"{cpu.get('total')} us CPU a task, {run['commits_per_task']} commits, "
        f"submit p50/p99 {submit.get('p50')}/{submit.get('p99')} ms, "
        f"to finished {finish.get('p50')}/{finish.get('p99')} ms, "
        f"{run['failed_submits']} failed{'' if run['kept'] else ', not kept'}"
        f" (host loop {run['host_loop_ms']['median']} ms)"
    )


def next_probe(runs: list[dict[str, Any]]) -> int | None:
    """The rate to try next to narrow a system's saturation rate, from its runs so far: halfway
    (to a multiple of SATURATION_STEP) between the highest rate it kept and the lowest above
    that it did not keep; None once the two are at most SATURATION_STEP apart, or nothing above
    the highest kept was missed."""
    kept = max((int(r["offered_per_s"]) for r in runs if r["kept"]), default=0)
    missed = min((int(r["offered_per_s"]) for r in runs if not r["kept"] and r["offered_per_s"] > kept), default=None)
    if missed is None or missed - kept <= SATURATION_STEP:
        return None
    middle = round((kept + missed) / 2 / SATURATION_STEP) * SATURATION_STEP
    return min(max(middle, kept + SATURATION_STEP), missed - SATURATION_STEP)


async def _one(name: str, server_url: str, rate: int) -> dict[str, Any]:
    async with throwaway_database(server_url, f"bench_steady_{name}") as url:
        run = await _run(name, url, rate)
    print(_line(name, run), file=sys.stderr, flush=True)
    return run


async def steady(server_url: str, systems: tuple[str, ...] = ("lowtide", "pgqueuer")) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
    for nth, rate in enumerate((*RATES, *MORE)):
        # The order alternates from rate to rate: neither system always runs on the warmer machine.
        order = systems if nth % 2 == 0 else tuple(reversed(systems))
        kept = False
        for name in order:
            run = await _one(name, server_url, rate)
            runs[name].append(run)
            kept = kept or run["kept"]
        if rate not in RATES and not kept:
            break
    for name, made in runs.items():
        while (probe := next_probe(made)) is not None:
            made.append(await _one(name, server_url, probe))
        made.sort(key=lambda run: int(run["offered_per_s"]))
    saturation = {name: max((r["offered_per_s"] for r in made if r["kept"]), default=0) for name, made in runs.items()}
    report: dict[str, Any] = {
        "lowtide_workers": WORKERS,
        "slots_per_worker": SLOTS,
        "pgqueuer_consumers": CONSUMERS,
        "pgqueuer_pool": POOL_SIZE,
        "pgqueuer_settings": pgqueuer_bench.SETTINGS | {"mode": "continuous"},
        "duration_s": DURATION_S,
        "kept_submit_p99_ms": KEPT_P99_MS,
        "saturation_step_per_s": SATURATION_STEP,
        "runs": runs,
        "saturation_per_s": saturation,
        "method": "open loop: each submit fired when due, many in flight on one gRPC channel / asyncpg pool; "
        "latencies from when each submit was due; CPU from /proc (bench._cpu), load generator apart; "
        "pg_stat_database xact_commit delta per finished task",
    }
    if saturation.get("pgqueuer"):
        report["saturation_lowtide_vs_pgqueuer"] = round(saturation.get("lowtide", 0) / saturation["pgqueuer"], 2)
    return report
