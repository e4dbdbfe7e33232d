"""Dependencies: a dependent waits, runs after its dependencies complete, fails when one does
not; a fixed start waits for its time and its dependencies both."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import grpc
import pytest

from lowtide_client import Client, TaskState, Worker
from scheduler_service.server import Scheduler

COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")
FAILED = TaskState.Value("TASK_STATE_FAILED")
PENDING = TaskState.Value("TASK_STATE_PENDING")


def recording_worker(scheduler: Scheduler, order: list[str], pool: str = "default") -> Worker:
    worker = Worker(target=scheduler.target, pool=pool, slots=4)

    async def step(payload: bytes) -> bytes:
        name, _, seconds = payload.decode().partition(":")
        await asyncio.sleep(float(seconds or 0))
        order.append(name)
        return payload

    worker.register("step", step)
    return worker


async def test_a_dependent_runs_after_all_its_dependencies(fixed_scheduler: Scheduler) -> None:
    order: list[str] = []
    async with Client(fixed_scheduler.target) as client:
        a = await client.submit("step", "a:0.3")
        b = await client.submit("step", "b:0.1")
        c = await client.submit("step", "c", depends_on=[a.id, b.id])
        assert (c.state, c.dependencies_pending, list(c.depends_on)) == (PENDING, 2, [a.id, b.id])
        explained = await client.explain(c.id)
        assert explained.reasons[0] == "dependencies"
        async with recording_worker(fixed_scheduler, order):
            done = await client.wait(c.id, timeout=timedelta(seconds=10))
    assert done.state == COMPLETED
    assert order.index("c") > max(order.index("a"), order.index("b"))


async def test_a_failed_dependency_fails_its_dependents_transitively(fixed_scheduler: Scheduler) -> None:
    async with Client(fixed_scheduler.target) as client:
        a = await client.submit("step", "a")
        b = await client.submit("step", "b", depends_on=[a.id])
        c = await client.submit("step", "c", depends_on=[b.id])
        await client.cancel(a.id)
        b_after, c_after = await client.get(b.id), await client.get(c.id)
    assert (b_after.state, b_after.last_failure.error_type) == (FAILED, "DependencyFailed")
    assert f"dependency task {a.id} did not complete" == b_after.last_failure.message
    assert (c_after.state, c_after.last_failure.message) == (FAILED, f"dependency task {b.id} did not complete")


async def test_unknown_or_already_failed_dependencies_are_refused(fixed_scheduler: Scheduler) -> None:
    async with Client(fixed_scheduler.target) as client:
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await client.submit("step", depends_on=[987654])
        gone = await client.submit("step")
        await client.cancel(gone.id)
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await client.submit("step", depends_on=[gone.id])
    assert unknown.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "depends_on: no task 987654" in (unknown.value.details() or "")
    assert ended.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"task {gone.id} already ended cancelled" in (ended.value.details() or "")


async def test_a_fixed_start_waits_for_its_time_and_its_dependencies(fixed_scheduler: Scheduler) -> None:
    order: list[str] = []
    async with Client(fixed_scheduler.target) as client, recording_worker(fixed_scheduler, order, pool="two"):
        early = await client.submit("step", "early")
        fixed = await client.submit(
            "step",
            "fixed",
            pool="two",
            depends_on=[early.id],
            start_in=timedelta(seconds=1),
            estimated_duration=timedelta(seconds=1),
        )
        done = await client.wait(fixed.id, timeout=timedelta(seconds=10))
        late = await client.submit("step", "late:1.5")
        after_late = await client.submit(
            "step",
            "after",
            pool="two",
            depends_on=[late.id],
            start_in=timedelta(milliseconds=200),
            start_tolerance=timedelta(milliseconds=100),
            estimated_duration=timedelta(seconds=1),
        )
        missed = await client.wait(after_late.id, timeout=timedelta(seconds=10))
    assert done.state == COMPLETED and done.start_hit
    assert order.index("fixed") > order.index("early")
    # Its dependency finished late: the start was missed (run late), and the reason says why.
    assert (missed.state, missed.missed, missed.miss_reason) == (
        COMPLETED,
        True,
        "its dependencies had not completed by the start + tolerance",
    )
