"""Start worker processes, release them together, and time how long they take to drain a queue.

Protocol with a worker module (see `bench._handshake`): the worker imports its library and opens
its connections, prints `ready`, and blocks until it reads `go` on stdin. The clock starts when
every worker is ready, so interpreter start-up, imports and connection set-up are not counted;
what is counted is the library's own worker start (registration, LISTEN, ...) and the work.

Start and end are both PostgreSQL timestamps (`clock_timestamp()` just before `go`, and the
completion time the library itself records on the last job), so the figure does not depend on how
often this side polls, and both ends come from the same clock even on a remote server.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import LiteralString

import psycopg
from psycopg.rows import TupleRow

from bench import _handshake
from bench._cpu import CpuWindow, run_backends

READY_TIMEOUT_S = 60.0
POLL_INTERVAL_S = 0.2
STOP_GRACE_S = 5.0
# The parent directory of the `bench` package, so `python -m bench.<worker>` resolves in the
# child whatever its working directory.
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)


@dataclass(frozen=True)
class Progress:
    """SQL, run against the run's database, that tells how far the workers are.

    `counts` returns one row `(finished, failed)`: jobs in a terminal state, and those of them
    that did not succeed. `finished_at` returns one row: the timestamptz of the last completion.
    """

    counts: LiteralString
    finished_at: LiteralString


def _child_env(database_url: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    # In the environment rather than on the command line, where `ps` would show any password.
    env[_handshake.DATABASE_URL_ENV] = database_url
    return env


async def _spawn(module: str, argv: Sequence[str], database_url: str) -> asyncio.subprocess.Process:
    # stderr is inherited: a worker's warnings and tracebacks belong with our progress output,
    # and stdout carries only the handshake so it never mixes into the JSON on ours.
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        module,
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=_child_env(database_url),
    )


async def _await_ready(proc: asyncio.subprocess.Process) -> None:
    assert proc.stdout is not None
    # Anything a library prints at import time comes first; only EOF (the worker died) is fatal.
    while line := await proc.stdout.readline():
        if line.strip() == _handshake.READY.encode():
            return
    code = await proc.wait()
    raise RuntimeError(f"worker pid {proc.pid} exited with {code} before it was ready")


async def _release(proc: asyncio.subprocess.Process) -> None:
    assert proc.stdin is not None
    proc.stdin.write(_handshake.GO.encode() + b"\n")
    await proc.stdin.drain()
    proc.stdin.close()


async def _stop(procs: Sequence[asyncio.subprocess.Process]) -> None:
    """Terminate what still runs, then kill what ignores that; every child is reaped."""
    alive = [p for p in procs if p.returncode is None]
    for proc in alive:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
    for proc in alive:
        try:
            await asyncio.wait_for(proc.wait(), STOP_GRACE_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


async def _fetch_one(conn: psycopg.AsyncConnection[TupleRow], query: LiteralString) -> TupleRow:
    cur = await conn.execute(query)
    row = await cur.fetchone()
    assert row is not None
    return row


@dataclass(frozen=True)
class Run:
    """One timed drain: `tasks` jobs worked by `processes` worker processes."""

    processes: int
    tasks: int
    elapsed_s: float
    # Cross-checks on elapsed_s: when this side saw the last job done (poll granularity), and
    # when the last worker process had exited.
    observed_s: float
    workers_exited_s: float
    # CPU per task of the workers and of PostgreSQL while they drained (bench._cpu).
    cpu_us_per_task: dict[str, float] | None = None

    @property
    def tasks_per_s(self) -> float:
        return self.tasks / self.elapsed_s

    def as_json(self) -> dict[str, object]:
        return {
            "processes": self.processes,
            "tasks": self.tasks,
            "elapsed_s": round(self.elapsed_s, 3),
            "tasks_per_s": round(self.tasks_per_s, 1),
            "observed_s": round(self.observed_s, 3),
            "workers_exited_s": round(self.workers_exited_s, 3),
            "cpu_us_per_task": self.cpu_us_per_task,
        }


async def _drained(
    conn: psycopg.AsyncConnection[TupleRow],
    procs: Sequence[asyncio.subprocess.Process],
    *,
    tasks: int,
    progress: Progress,
    deadline: float,
    timeout_s: float,
    cpu: CpuWindow,
) -> int:
    """Waits until `tasks` jobs are finished, looking every POLL_INTERVAL_S; how many failed."""
    while True:
        finished, failed = await _fetch_one(conn, progress.counts)
        if finished >= tasks:
            return int(failed)
        if all(p.returncode is not None for p in procs):
            codes = [p.returncode for p in procs]
            raise RuntimeError(f"workers exited ({codes}) with {finished}/{tasks} jobs finished")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{finished}/{tasks} jobs finished after {timeout_s:.0f} s")
        cpu.sample()
        await asyncio.sleep(POLL_INTERVAL_S)


async def drain_with_workers(
    *,
    database_url: str,
    module: str,
    argv: Sequence[str],
    processes: int,
    tasks: int,
    progress: Progress,
    timeout_s: float,
    label: str,
) -> Run:
    """Run `processes` copies of `python -m module *argv` until `tasks` jobs are finished.

    The workers find `database_url` in the environment (`bench._handshake.database_url()`).

    Everything is bounded by `timeout_s` (workers are killed past it) and the workers are
    stopped and reaped however this ends, including by cancellation.
    """
    procs: list[asyncio.subprocess.Process] = []
    deadline = time.monotonic() + timeout_s
    try:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            for _ in range(processes):
                # Appended one by one so that `finally` reaps those started if a later one fails.
                procs.append(await _spawn(module, argv, database_url))
            await asyncio.wait_for(asyncio.gather(*(_await_ready(p) for p in procs)), min(READY_TIMEOUT_S, timeout_s))

            (started_at,) = await _fetch_one(conn, "SELECT clock_timestamp()")
            wall_start = time.monotonic()
            # PostgreSQL's share: the backends of the run's database (bench._cpu.run_backends).
            async with run_backends(conn) as backends:
                cpu = CpuWindow({"workers": [p.pid for p in procs]}, backends)
                cpu.start()
                await asyncio.gather(*(_release(p) for p in procs))
                failed = await _drained(
                    conn, procs, tasks=tasks, progress=progress, deadline=deadline, timeout_s=timeout_s, cpu=cpu
                )
                observed_s = time.monotonic() - wall_start
                used = cpu.per_task(tasks)
            (finished_at,) = await _fetch_one(conn, progress.finished_at)

        # The workers stop by themselves once the queue is empty; give them until the deadline.
        codes = await asyncio.wait_for(
            asyncio.gather(*(p.wait() for p in procs)), max(deadline - time.monotonic(), 1.0)
        )
        exited_s = time.monotonic() - wall_start
        if any(codes):
            raise RuntimeError(f"workers exited with {codes} after finishing the jobs")
        if failed:
            raise RuntimeError(f"{failed}/{tasks} jobs did not succeed")
    finally:
        await _stop(procs)

    assert isinstance(started_at, datetime.datetime)
    assert isinstance(finished_at, datetime.datetime)
    run = Run(
        processes=processes,
        tasks=tasks,
        elapsed_s=(finished_at - started_at).total_seconds(),
        observed_s=observed_s,
        workers_exited_s=exited_s,
        cpu_us_per_task=used,
    )
    print(
        f"[{label}] {processes} worker process(es): {run.tasks_per_s:,.0f} jobs/s",
        file=sys.stderr,
        flush=True,
    )
    return run
