"""A scheduler's background loop that fails is noticed: logged at once and the replica marked
failed, which `serve` answers by stopping and exiting for `lowtide up` or the orchestrator to start
it afresh. One cancelled (the replica stopping) is not a failure."""

from __future__ import annotations

import asyncio
import contextlib
from functools import partial

from scheduler_service.server import _loop_ended


async def test_a_loop_that_fails_marks_the_replica_failed() -> None:
    failed = asyncio.Event()

    async def broken() -> None:
        raise RuntimeError("a bug in a loop")

    task = asyncio.create_task(broken(), name="completer")
    task.add_done_callback(partial(_loop_ended, failed))
    with contextlib.suppress(RuntimeError):
        await task
    await asyncio.wait_for(failed.wait(), 5)


async def test_a_loop_cancelled_on_stop_is_no_failure() -> None:
    failed = asyncio.Event()
    started = asyncio.Event()

    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(forever(), name="completer")
    task.add_done_callback(partial(_loop_ended, failed))
    await started.wait()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    # The done callbacks have run once the task's awaiter resumes; let the loop turn once more.
    await asyncio.sleep(0)
    assert not failed.is_set()
