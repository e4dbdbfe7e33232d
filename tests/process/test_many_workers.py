"""Worker processes, as users run them: many tasks over several processes (each task runs
exactly once), and a worker killed with SIGKILL in the middle of a task (the task runs again
elsewhere)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest

from lowtide_client import Client, Task, TaskState, task_spec
from scheduler_service.server import Scheduler, start_scheduler
from tests.conftest import make_config
from tests.helpers import eventually

COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")
RUNNING = TaskState.Value("TASK_STATE_RUNNING")

REPO = Path(__file__).resolve().parents[2]
TASKS = 10_000
WORKERS = 4


def counting_worker(
    target: str, out: Path, *, slots: int, worker_id: str, log: Path, nap: float | None = None, level: str = "WARNING"
) -> subprocess.Popen[bytes]:
    """Starts `python -m tests.process.counting_worker`; its log goes to `log` (read on failure)."""
    env = dict(os.environ, LOWTIDE_LOG_LEVEL=level)
    with log.open("ab") as stderr:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.process.counting_worker",
                "--target",
                target,
                "--out",
                str(out),
                "--slots",
                str(slots),
                "--worker-id",
                worker_id,
                *(["--nap", str(nap)] if nap is not None else []),
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )


def kill_all(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.kill()
    for process in processes:
        process.wait(timeout=10)


async def connected_workers(database_url: str) -> set[str]:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT id FROM lowtide.workers")
        return {str(row[0]) for row in await cur.fetchall()}


async def task_states(database_url: str) -> dict[str, int]:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT state, count(*) FROM lowtide.tasks GROUP BY state")
        return {str(state): int(count) for state, count in await cur.fetchall()}


def logs_of(paths: list[Path]) -> str:
    return "\n".join(f"--- {p.name}:\n{p.read_text(errors='replace')[-3000:]}" for p in paths if p.exists())


@pytest.fixture
async def roomy_scheduler(database_url: str) -> AsyncIterator[Scheduler]:
    """The usual test scheduler, but with a lease a busy two-core machine cannot miss: a lost lease
    re-runs tasks by design (at least once), and this test is about the normal case."""
    running = await start_scheduler(make_config(lease_timeout=timedelta(seconds=10)), database_url=database_url)
    yield running
    await running.stop(grace=1.0)


@pytest.mark.slow
async def test_ten_thousand_tasks_over_four_processes_each_run_exactly_once(
    roomy_scheduler: Scheduler, database_url: str, tmp_path: Path
) -> None:
    scheduler = roomy_scheduler
    outs = [tmp_path / f"count-{n}.txt" for n in range(WORKERS)]
    logs = [tmp_path / f"worker-{n}.log" for n in range(WORKERS)]
    ids = {f"counter-{n}" for n in range(WORKERS)}
    processes = [
        counting_worker(scheduler.target, outs[n], slots=32, worker_id=f"counter-{n}", log=logs[n])
        for n in range(WORKERS)
    ]
    try:
        # Every process connected before the first submit, so the work can spread.
        async def all_connected() -> bool:
            return await connected_workers(database_url) == ids

        await eventually(all_connected, within=30, interval=0.1)

        async with Client(scheduler.target) as client:
            submitted = await client.submit_many(task_spec("count", str(i)) for i in range(TASKS))
        assert len(submitted) == TASKS and all(s.created for s in submitted)

        async def all_done() -> dict[str, int] | None:
            states = await task_states(database_url)
            return states if states.get("completed") == TASKS else None

        try:
            await eventually(all_done, within=90, interval=0.25)
        except AssertionError as error:
            raise AssertionError(f"{error}\nworker logs:\n{logs_of(logs)}") from None

        # Stopped as a user would (SIGTERM): each process drains and exits cleanly.
        for process in processes:
            process.send_signal(signal.SIGTERM)

        async def all_exited() -> bool:
            return all(p.poll() is not None for p in processes)

        await eventually(all_exited, within=20, interval=0.1)
        assert [p.returncode for p in processes] == [0] * WORKERS, logs_of(logs)
    finally:
        kill_all(processes)

    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FILTER (WHERE state = 'completed' AND attempt = 1 AND result = payload),"
            " count(*) FROM lowtide.tasks"
        )
        row = await cur.fetchone()
    assert row == (TASKS, TASKS)

    lines = [line for out in outs if out.exists() for line in out.read_text().splitlines()]
    runs = Counter(lines)
    twice = sorted((int(k) for k, v in runs.items() if v > 1))
    assert twice == [], f"{len(twice)} tasks ran more than once, e.g. {twice[:10]}"
    assert set(runs) == {str(i) for i in range(TASKS)}
    busy = [out.name for out in outs if out.exists() and out.stat().st_size > 0]
    assert len(busy) >= 2, f"only {busy} did any work"


async def test_a_worker_killed_mid_task_loses_it_to_another_worker(
    scheduler: Scheduler, database_url: str, tmp_path: Path
) -> None:
    logs = [tmp_path / "worker-a.log", tmp_path / "worker-b.log"]
    processes: list[subprocess.Popen[bytes]] = []
    try:
        a = counting_worker(scheduler.target, tmp_path / "a.txt", slots=2, worker_id="worker-a", log=logs[0])
        processes.append(a)

        async def connected(*names: str) -> bool:
            return set(names) <= await connected_workers(database_url)

        await eventually(lambda: connected("worker-a"), within=30, interval=0.1)
        async with Client(scheduler.target) as client:
            task = await client.submit(
                "hang",
                max_attempts=3,
                initial_backoff=timedelta(milliseconds=100),
                start_to_close_timeout=timedelta(minutes=10),
            )

            async def running_on(worker_id: str, attempt: int) -> Task | None:
                got = await client.get(task.id)
                if (got.state, got.worker_id, got.attempt) == (RUNNING, worker_id, attempt):
                    return got
                return None

            await eventually(lambda: running_on("worker-a", 1), within=10)
            # B connects only now, so it is A that holds the first attempt.
            b = counting_worker(scheduler.target, tmp_path / "b.txt", slots=2, worker_id="worker-b", log=logs[1])
            processes.append(b)
            await eventually(lambda: connected("worker-a", "worker-b"), within=30, interval=0.1)

            os.kill(a.pid, signal.SIGKILL)
            try:
                again = await eventually(lambda: running_on("worker-b", 2), within=10, interval=0.1)
            except AssertionError as error:
                raise AssertionError(f"{error}\ntask now: {await client.get(task.id)}\n{logs_of(logs)}") from None
        assert again is not None
        assert again.last_failure.error_type == "WorkerLost"
        assert not again.last_failure.non_retryable
        assert b.poll() is None
    finally:
        kill_all(processes)
