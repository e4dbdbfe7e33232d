"""SyncClient against a real scheduler: submit (by name and typed), get, wait, list and cancel,
from plain blocking code. The scheduler and worker run on the test's event loop, so the blocking
code runs in a thread, as it would in a script beside a remote scheduler."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta

import pytest

from lowtide_client import SyncClient, Worker
from lowtide_proto.lowtide.v1 import task_pb2
from scheduler_service.server import Scheduler


@dataclass
class Pair:
    a: int
    b: int


@dataclass
class Sum:
    total: int


def add(pair: Pair) -> Sum:
    return Sum(total=pair.a + pair.b)


def _script(target: str) -> tuple[Sum, task_pb2.Task, task_pb2.Task, list[int], task_pb2.Task]:
    with SyncClient(target) as client:
        typed = client.submit(add, Pair(a=2, b=40))
        total = typed.result(timeout=timedelta(seconds=20))
        echoed = client.submit("echo", b"hi")
        waited = client.wait(echoed.id, timeout=timedelta(seconds=20))
        listed = [task.id for task in client.list(activity_type="add").tasks]
        parked = client.submit("nobody_runs_this")
        cancelled = client.cancel(parked.id)
        assert client.get(parked.id).state == task_pb2.TASK_STATE_CANCELLED
    return total, waited, cancelled, listed, typed.task


async def test_the_sync_client_submits_waits_lists_and_cancels(scheduler: Scheduler) -> None:
    worker = Worker(target=scheduler.target, slots=2)
    worker.register("add", add)
    worker.register("echo", lambda payload: payload)
    async with worker:
        total, waited, cancelled, listed, typed = await asyncio.to_thread(_script, scheduler.target)
    assert total == Sum(total=42)
    assert waited.state == task_pb2.TASK_STATE_COMPLETED and waited.result == b"hi"
    assert cancelled.state == task_pb2.TASK_STATE_CANCELLED
    assert listed == [typed.id]


def _paused_then_resumed(target: str) -> tuple[bool, int, bool, task_pb2.Task]:
    with SyncClient(target) as client:
        paused = client.pause_queue("default")
        held = client.submit("echo", b"later")
        # Paused: nothing claims it, however long the script looks.
        state = client.get(held.id).state
        resumed = client.resume_queue("default")
        return paused.paused, state, resumed.paused, client.wait(held.id, timeout=timedelta(seconds=20))


async def test_the_sync_client_pauses_and_resumes_a_queue(scheduler: Scheduler) -> None:
    worker = Worker(target=scheduler.target, slots=1)
    worker.register("echo", lambda payload: payload)
    async with worker:
        paused, state, still_paused, done = await asyncio.to_thread(_paused_then_resumed, scheduler.target)
    assert paused and not still_paused
    assert state == task_pb2.TASK_STATE_PENDING
    assert done.state == task_pb2.TASK_STATE_COMPLETED and done.result == b"later"


def test_a_closed_sync_client_says_so() -> None:
    client = SyncClient("127.0.0.1:1")
    client.close()
    client.close()  # twice is fine
    with pytest.raises(RuntimeError, match="closed"):
        client.get(1)
