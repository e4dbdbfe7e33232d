"""Claimed work is never stranded: PostgreSQL killed (SIGKILL, every process at once) in the middle
of a drain, at several moments of the dispatch cycle, or the scheduler killed between a claim and
its send. Afterwards every task completes, and none is left `running` without a worker running it.

The moment that stranded work is a commit whose answer never came: the claim is written, the
connection dies, and the scheduler cannot tell it from a claim that failed. The tests make that
moment at will: PostgreSQL is told to wait, after each commit is written, for a standby that does
not exist (synchronous replication), so commits are held written-but-unanswered until the kill.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from lowtide_client import Client, task_spec
from scheduler_service.store.base import Q
from tests.faults.support import (
    Postgres,
    connected_workers,
    counting_worker,
    executions,
    free_port,
    kill_all,
    logs_of,
    query,
    service_process,
    sigkill,
    states,
    until_serving,
)
from tests.helpers import eventually

TASKS = 12_000
WORKERS = 3
SLOTS = 64
NAP = 0.2
# A lease far longer than any outage here: workers heartbeat throughout, so nothing may count on
# a lease running out to end what a claim left behind (with the default 10 s, an outage of more
# than that ends every attempt as WorkerLost and hides the defect).
SETTINGS = {"lease_timeout": "60s", "heartbeat_interval": "1s"}


def _opening(*names: str) -> tuple[str, ...]:
    """How the named statements begin, as PostgreSQL shows them (up to their first parameter)."""
    return tuple(Q[name].split("%(")[0][:60] for name in names)


# A claim's statements, and a batch of completions'.
CLAIM = _opening("claim_tasks", "claim_pair")
FINISH = _opening("finish_attempts", "finish_independent_attempts")


async def _stuck(url: str) -> str:
    rows = await query(
        url,
        "SELECT worker_id, attempt, count(*) FROM lowtide.tasks WHERE state = 'running' "
        "GROUP BY worker_id, attempt ORDER BY 1, 2",
    )
    return ", ".join(f"{worker} attempt {attempt}: {count}" for worker, attempt, count in rows) or "none"


async def _all_done(url: str, logs: list[Path], *, within: float = 90) -> None:
    async def done() -> dict[str, int] | None:
        now = await states(url)
        return now if now == {"completed": TASKS} else None

    try:
        await eventually(done, within=within, interval=0.25)
    except AssertionError as error:
        stuck = await _stuck(url)
        raise AssertionError(f"{error}\nrunning (worker, attempt: tasks): {stuck}\n{logs_of(logs)}") from None


async def _progress(url: str, at_least: int, logs: list[Path]) -> None:
    async def far_enough() -> bool:
        return (await states(url)).get("completed", 0) >= at_least

    try:
        await eventually(far_enough, within=90, interval=0.02)
    except AssertionError as error:
        sessions = await query(
            url,
            "SELECT state, wait_event, left(query, 60) FROM pg_stat_activity WHERE backend_type = 'client backend'",
        )
        raise AssertionError(f"{error}: {await states(url)}; {sessions}\n{logs_of(logs)}") from None


async def _held(postgres: Postgres, *statements: tuple[str, ...], attempts: int = 3) -> None:
    """Holds commits until a statement of each kind waits for its answer (its commit written). A
    hold that catches the drain where a kind cannot come (every task finished, the next claims
    held: no finish can follow) is let go, and tried again once tasks run."""
    for attempt in range(attempts):
        await postgres.hold_commits()
        missing: str | None = None
        for statement in statements:

            async def waiting(statement: tuple[str, ...] = statement) -> bool:
                return await postgres.waiting_commits(statement) > 0

            try:
                await eventually(waiting, within=10, interval=0.02)
            except AssertionError as error:
                missing = f"no {statement!r} held: {error}"
                break
        if missing is None:
            return
        if attempt == attempts - 1:
            sessions = await query(
                postgres.url,
                "SELECT state, wait_event, left(query, 60) FROM pg_stat_activity WHERE backend_type = 'client backend'",
            )
            raise AssertionError(f"{missing}; {await states(postgres.url)}; {sessions}")
        await postgres.release_commits()

        async def running() -> bool:
            return (await states(postgres.url)).get("running", 0) > 0

        await eventually(running, within=30, interval=0.02)


async def _drain(
    url: str,
    tmp_path: Path,
    act: Callable[[str, list[Path], list[subprocess.Popen[bytes]]], Awaitable[None]],
    settings: dict[str, str] = SETTINGS,
) -> None:
    """A drain of TASKS by WORKERS workers of SLOTS slots, with `act` done in the middle of it
    (given the scheduler's address, the logs, and the processes: the scheduler first)."""
    target = f"127.0.0.1:{free_port()}"
    logs = [tmp_path / "scheduler.log", *(tmp_path / f"worker-{n}.log" for n in range(WORKERS))]
    outs = [tmp_path / f"count-{n}.txt" for n in range(WORKERS)]
    processes: list[subprocess.Popen[bytes]] = []
    try:
        processes.append(service_process("scheduler", url, logs[0], {"listen": target, **settings}))
        await until_serving(target, logs[0])
        ids = {f"counter-{n}" for n in range(WORKERS)}
        for n in range(WORKERS):
            worker = counting_worker(target, outs[n], slots=SLOTS, worker_id=f"counter-{n}", log=logs[1 + n], nap=NAP)
            processes.append(worker)

        async def all_connected() -> bool:
            return await connected_workers(url) == ids

        await eventually(all_connected, within=30, interval=0.1)
        async with Client(target) as client:
            await client.submit_many(task_spec("nap", str(i)) for i in range(TASKS))
        await act(target, logs, processes)
        await _all_done(url, logs)
        assert set(executions(outs)) == {str(i) for i in range(TASKS)}
    finally:
        kill_all(processes)


@pytest.mark.slow
async def test_postgres_killed_mid_drain_strands_nothing(postgres: Postgres, tmp_path: Path) -> None:
    url = postgres.url

    async def kill_and_start(pause: float) -> None:
        await asyncio.to_thread(postgres.kill)
        await asyncio.sleep(pause)  # bounded: the database stays away a moment
        await asyncio.to_thread(postgres.start)

    async def outages(target: str, logs: list[Path], processes: list[subprocess.Popen[bytes]]) -> None:
        # 1. Claims written, their answers held: killed before the scheduler hears of them.
        await _progress(url, TASKS // 10, logs)
        await _held(postgres, CLAIM)
        await kill_and_start(2.0)
        # 2. Anywhere in the cycle: no commit held.
        await _progress(url, TASKS * 3 // 10, logs)
        await kill_and_start(1.0)
        # 3. Claims and completions written, neither answered.
        await _progress(url, TASKS * 5 // 10, logs)
        await _held(postgres, CLAIM, FINISH)
        await kill_and_start(3.0)

    await _drain(url, tmp_path, outages)


@pytest.mark.slow
async def test_scheduler_killed_between_claim_and_send_strands_nothing(postgres: Postgres, tmp_path: Path) -> None:
    url = postgres.url
    # Half a lease between the looks for strays; still far longer than any pause here.
    settings = {**SETTINGS, "lease_timeout": "20s"}

    async def restart(target: str, logs: list[Path], processes: list[subprocess.Popen[bytes]]) -> None:
        processes[0] = service_process("scheduler", url, logs[0], {"listen": target, **settings})
        await until_serving(target, logs[0])

    async def kills(target: str, logs: list[Path], processes: list[subprocess.Popen[bytes]]) -> None:
        # 1. The claim is written; the scheduler dies before its answer comes, so nothing is sent.
        # The claim lands before the next scheduler starts: the workers' hellos do not list it.
        await _progress(url, TASKS // 5, logs)
        await _held(postgres, CLAIM)
        sigkill(processes[0])
        await postgres.release_commits()
        await restart(target, logs, processes)
        # 2. The same, but the dead scheduler's claim lands only once the workers are back on the
        # next one (its session still waits, as PostgreSQL does not notice a client gone while it
        # waits), after they said what they hold: nothing but a look at the database finds it.
        await _progress(url, TASKS // 2, logs)
        await _held(postgres, CLAIM)
        sigkill(processes[0])
        killed_at = (await query(url, "SELECT now()"))[0][0]
        # Its other held commits (a lease renewal, say) would lock the next scheduler out.
        await postgres.release_commits_but(CLAIM)
        await postgres.commit_locally_from_now()
        await restart(target, logs, processes)

        async def all_back() -> bool:
            # Each worker given work by the next scheduler: it has taken the worker's hello, and
            # ended what was recorded as the worker's and not listed in it, before its first claim.
            # Work started since, whether still running or done: at any one look, a worker may be
            # between batches.
            rows = await query(
                url,
                f"SELECT count(DISTINCT worker_id) FROM lowtide.tasks WHERE started_at > '{killed_at}'::timestamptz",
            )
            return rows[0][0] == WORKERS

        try:
            await eventually(all_back, within=60, interval=0.1)
        except AssertionError as error:
            started = await query(
                url,
                "SELECT worker_id, state, count(*) FROM lowtide.tasks "
                f"WHERE started_at > '{killed_at}'::timestamptz GROUP BY 1, 2 ORDER BY 1, 2",
            )
            sessions = await query(
                url,
                "SELECT state, wait_event, left(query, 60) FROM pg_stat_activity WHERE backend_type = 'client backend'",
            )
            raise AssertionError(
                f"{error}: started since the kill {started}; {await states(url)}; {sessions}\n{logs_of(logs)}"
            ) from None
        await postgres.release_commits()

    await _drain(url, tmp_path, kills, settings)
