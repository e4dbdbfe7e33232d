"""`lowtide queue pause|resume` against a real scheduler: a typo is refused with the closest known
name and leaves no queue behind; --create (and the API's `create`) pauses a new queue on purpose."""

from __future__ import annotations

import grpc
import pytest

from lowtide_client import Client
from scheduler_service.server import Scheduler
from tests.integration.test_cli import lowtide


async def test_pausing_a_queue_nobody_used_is_refused_with_a_did_you_mean(scheduler: Scheduler) -> None:
    target = scheduler.target
    run = await lowtide("queue", "pause", "defualt", "--target", target)
    assert run.code == 1
    assert "NOT_FOUND" in run.err and "queue 'defualt'" in run.err and "did you mean 'default'?" in run.err
    assert "--create" in run.err
    run = await lowtide("queue", "resume", "defualt", "--target", target)
    assert run.code == 1 and "NOT_FOUND" in run.err and "did you mean 'default'?" in run.err
    async with Client(target) as client:
        assert "defualt" not in {q.name for q in (await client.status()).queues}
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await client.pause_queue("defualt")
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        # A queue a task went to is known, as "default" always is.
        await client.submit("nobody-runs-this", queue="reports")
    for known in ("reports", "default"):
        run = await lowtide("queue", "pause", known, "--target", target, "--json")
        assert run.code == 0, run.err
        run = await lowtide("queue", "resume", known, "--target", target)
        assert (run.code, run.out.strip()) == (0, f"queue {known} running")


async def test_create_pauses_a_new_queue_on_purpose(scheduler: Scheduler) -> None:
    run = await lowtide("queue", "pause", "nightly", "--create", "--target", scheduler.target)
    assert (run.code, run.out.strip()) == (0, "queue nightly paused")
    async with Client(scheduler.target) as client:
        assert (await client.pause_queue("later", create=True)).paused
        paused = {q.name for q in (await client.status()).queues if q.paused}
        assert {"nightly", "later"} <= paused
