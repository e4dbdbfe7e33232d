"""Fault 1: the scheduler is killed (SIGKILL) in the middle of 10,000 tasks and started again on
the same address. Nothing is lost, nothing is recorded twice, and every re-run is a new attempt."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from lowtide_client import Client, task_spec
from tests.faults.support import (
    RawWorker,
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

TASKS = 10_000
WORKERS = 4
SLOTS = 32
# Each task naps this long on its worker after its line is written. No-op tasks move through a
# worker's slots in step, and a scheduler has instants with none of them on record as running:
# a kill landing there showed nothing (it happened on a loaded machine). The tasks seen running
# just before the kill are still running at it.
NAP = 0.05

SETTINGS = {
    "lease_timeout": "6s",
    "heartbeat_interval": "500ms",
    "maintenance_interval": "200ms",
    # The killed scheduler's leader lease must run out before its successor does time-driven work.
    "leader_lease": "2s",
}


@pytest.mark.slow
async def test_a_scheduler_killed_mid_run_loses_nothing_and_records_every_rerun(
    database_url: str, tmp_path: Path
) -> None:
    port = free_port()
    target = f"127.0.0.1:{port}"
    logs = [tmp_path / "scheduler-1.log", tmp_path / "scheduler-2.log"]
    logs += [tmp_path / f"worker-{n}.log" for n in range(WORKERS)]
    outs = [tmp_path / f"count-{n}.txt" for n in range(WORKERS)]
    processes: list[subprocess.Popen[bytes]] = []
    try:
        first = service_process("scheduler", database_url, logs[0], {"listen": target, **SETTINGS})
        processes.append(first)
        await until_serving(target, logs[0])
        ids = {f"counter-{n}" for n in range(WORKERS)}
        for n in range(WORKERS):
            processes.append(
                counting_worker(target, outs[n], slots=SLOTS, worker_id=f"counter-{n}", log=logs[2 + n], nap=NAP)
            )

        async def all_connected() -> bool:
            return await connected_workers(database_url) == ids

        await eventually(all_connected, within=30, interval=0.1)
        async with Client(target) as client:
            submitted = await client.submit_many(task_spec("nap", str(i)) for i in range(TASKS))
        assert len(submitted) == TASKS

        async def well_under_way() -> bool:
            # A fifth done, and a worker's worth of attempts out now: the kill lands mid-run.
            now = await states(database_url)
            return now.get("completed", 0) >= TASKS // 5 and now.get("running", 0) >= SLOTS

        await eventually(well_under_way, within=60, interval=0.05)
        sigkill(first)
        # Nothing writes to the database now: what it records as running is what was in flight,
        # including results the workers had sent that the dead scheduler had not yet written.
        in_flight = (await states(database_url)).get("running", 0)
        assert in_flight > 0, (
            f"the kill came between batches; the test would show nothing: {await states(database_url)}"
        )

        second = service_process("scheduler", database_url, logs[1], {"listen": target, **SETTINGS})
        processes.append(second)

        async def all_done() -> dict[str, int] | None:
            now = await states(database_url)
            return now if now.get("completed") == TASKS else None

        try:
            await eventually(all_done, within=120, interval=0.25)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{logs_of(logs)}") from None

        rows = await query(database_url, "SELECT id, payload, attempt, result = payload FROM lowtide.tasks")
        assert len(rows) == TASKS
        assert all(same for *_, same in rows), "a task's recorded result is not its own payload"
        runs = executions(outs)
        assert set(runs) == {str(i) for i in range(TASKS)}, "some task never ran"
        extra = sum(count - 1 for count in runs.values())
        assert extra <= in_flight, f"{extra} re-runs, but only {in_flight} tasks were in flight at the kill"
        # Each run beyond the first came from a new claim, which is a new attempt on record.
        attempts = {bytes(payload).decode(): int(attempt) for _, payload, attempt, _ in rows}  # type: ignore[call-overload]
        undercounted = [p for p, count in runs.items() if count > attempts[p]]
        assert undercounted == [], f"ran more often than their attempts say: {undercounted[:10]}"

        # A report under a lease that was lost (attempt 1 of a task now on attempt 2, or one the
        # scheduler ended) is refused, and changes nothing.
        task_id, payload, attempt, _ = max(rows, key=lambda r: int(r[2]))  # type: ignore[call-overload]
        stale = (int(task_id), 1 if int(attempt) > 1 else int(attempt))  # type: ignore[call-overload]
        raw = RawWorker(target, "late-reporter")
        try:
            await raw.connect(running=[stale])
            # Listed in the hello but no longer this worker's: it is told to stop it at once.
            cancel = await raw.read()
            assert [(r.task_id, r.attempt) for r in cancel.cancel.tasks] == [stale], cancel
            await raw.report([stale], result=b"forged")
            answer = await raw.read()
            assert answer.WhichOneof("message") == "rejected", answer
            assert [(r.task.task_id, r.task.attempt) for r in answer.rejected.reports] == [stale]
        finally:
            await raw.close()
        after = await query(database_url, f"SELECT result, state FROM lowtide.tasks WHERE id = {int(task_id)}")  # type: ignore[call-overload]
        assert after == [(payload, "completed")]
    finally:
        kill_all(processes)
