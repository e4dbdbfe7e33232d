"""Nothing a Python activity returns or raises ends its worker process: a result it cannot send,
sys.exit(), an exception that cannot be printed each fail that attempt, with a clear error type,
and the worker runs the next task."""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta

from lowtide_client import Client, TaskState
from scheduler_service.server import Scheduler

FAILED = TaskState.Value("TASK_STATE_FAILED")
COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")


async def test_no_activity_ends_the_worker_process(scheduler: Scheduler) -> None:
    worker = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.process.unruly_worker",
        "--target",
        scheduler.target,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with Client(scheduler.target) as client:
            failures = {}
            for activity in ("dict", "exit", "exit_async", "unprintable"):
                task = await client.submit(activity, b"x", max_attempts=1)
                done = await client.wait(task.id, timeout=timedelta(seconds=30))
                assert done.state == FAILED, (activity, done, worker.returncode)
                failures[activity] = (done.last_failure.error_type, done.last_failure.message)
            assert failures["dict"] == ("TypeError", "activity 'dict' returned dict; return bytes, str or None")
            assert failures["exit"] == ("SystemExit", "3")
            assert failures["exit_async"] == ("SystemExit", "4")
            assert failures["unprintable"][0] == "Unprintable"
            assert "cannot be turned into text" in failures["unprintable"][1]
            task = await client.submit("fine", b"still here")
            done = await client.wait(task.id, timeout=timedelta(seconds=30))
            assert (done.state, done.result) == (COMPLETED, b"still here")
        assert worker.returncode is None
    finally:
        if worker.returncode is None:
            worker.kill()
        await asyncio.wait_for(worker.communicate(), 30)
