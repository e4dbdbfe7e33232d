"""Workers over the real stream: completion, retries, fencing, timeouts, cancel, priorities and
concurrency limits, against a real scheduler and database."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import grpc
import pytest

from lowtide.config import Config, TypeConfig
from lowtide_client import Client, NonRetryableError, TaskState, Worker, task_spec
from lowtide_proto.lowtide.v1 import task_pb2, worker_pb2, worker_pb2_grpc
from scheduler_service.domain.model import Outcome, State
from scheduler_service.server import Scheduler, start_scheduler
from tests.conftest import make_config
from tests.helpers import eventually

COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")
FAILED = TaskState.Value("TASK_STATE_FAILED")
TIMED_OUT = TaskState.Value("TASK_STATE_TIMED_OUT")
CANCELLED = TaskState.Value("TASK_STATE_CANCELLED")
PENDING = TaskState.Value("TASK_STATE_PENDING")


async def test_a_worker_completes_tasks_with_their_results(scheduler: Scheduler) -> None:
    worker = Worker(target=scheduler.target, slots=4)

    @worker.activity("upper")
    def upper(payload: bytes) -> bytes:
        return payload.upper()

    async with Client(scheduler.target) as client, worker:
        task = await client.submit("upper", b"hi")
        done = await client.wait(task.id, timeout=timedelta(seconds=10))
    assert (done.state, done.result, done.attempt) == (COMPLETED, b"HI", 1)


async def test_failures_back_off_and_stop_at_max_attempts(scheduler: Scheduler) -> None:
    calls: list[float] = []
    worker = Worker(target=scheduler.target, slots=2)

    @worker.activity("flaky")
    async def flaky(payload: bytes) -> bytes:
        calls.append(asyncio.get_running_loop().time())
        raise RuntimeError("still broken")

    async with Client(scheduler.target) as client, worker:
        task = await client.submit(
            "flaky", max_attempts=3, initial_backoff=timedelta(milliseconds=200), backoff_coefficient=2.0
        )
        done = await client.wait(task.id, timeout=timedelta(seconds=10))
    assert (done.state, done.attempt) == (FAILED, 3)
    assert done.last_failure.error_type == "RuntimeError" and done.last_failure.message == "still broken"
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert len(calls) == 3
    assert gaps[0] >= 0.19 and gaps[1] >= 0.39  # 200 ms, then 400 ms


async def test_a_non_retryable_error_fails_at_once(scheduler: Scheduler) -> None:
    worker = Worker(target=scheduler.target, slots=1)

    @worker.activity("charge")
    def charge(payload: bytes) -> bytes:
        raise NonRetryableError("card declined")

    async with Client(scheduler.target) as client, worker:
        task = await client.submit("charge", max_attempts=5)
        done = await client.wait(task.id, timeout=timedelta(seconds=10))
    assert (done.state, done.attempt, done.last_failure.non_retryable) == (FAILED, 1, True)


async def test_higher_priority_runs_first_and_fifo_within_a_priority(scheduler: Scheduler) -> None:
    order: list[bytes] = []
    async with Client(scheduler.target) as client:
        await client.submit_many(
            [
                task_spec("record", b"low-1", priority=0),
                task_spec("record", b"low-2", priority=0),
                task_spec("record", b"high-1", priority=5),
                task_spec("record", b"high-2", priority=5),
            ]
        )
        worker = Worker(target=scheduler.target, slots=1)

        @worker.activity("record")
        def record(payload: bytes) -> bytes:
            order.append(payload)
            return payload

        async with worker:
            await eventually(lambda: _count(len(order) == 4))
    assert order == [b"high-1", b"high-2", b"low-1", b"low-2"]


async def _count(value: bool) -> bool:
    return value


async def test_cancel_of_a_running_task_stops_it_on_its_worker(scheduler: Scheduler) -> None:
    started = asyncio.Event()
    stopped = asyncio.Event()
    worker = Worker(target=scheduler.target, slots=1)

    @worker.activity("long")
    async def long(payload: bytes) -> bytes:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            stopped.set()
            raise
        return b""

    async with Client(scheduler.target) as client, worker:
        task = await client.submit("long")
        await asyncio.wait_for(started.wait(), 10)
        cancelled = await client.cancel(task.id)
        await asyncio.wait_for(stopped.wait(), 10)
        after = await client.get(task.id)
    assert cancelled.state == after.state == CANCELLED


async def test_start_to_close_timeout_fails_the_attempt_and_retries(scheduler: Scheduler) -> None:
    attempts: list[int] = []
    worker = Worker(target=scheduler.target, slots=2)

    @worker.activity("stuck")
    async def stuck(payload: bytes) -> bytes:
        attempts.append(1)
        await asyncio.sleep(30)
        return b""

    async with Client(scheduler.target) as client, worker:
        task = await client.submit(
            "stuck",
            max_attempts=2,
            initial_backoff=timedelta(milliseconds=50),
            start_to_close_timeout=timedelta(milliseconds=300),
        )
        done = await client.wait(task.id, timeout=timedelta(seconds=10))
    assert (done.state, done.attempt) == (TIMED_OUT, 2)
    assert done.last_failure.error_type == "StartToCloseTimeout"
    assert len(attempts) == 2


async def test_schedule_to_start_timeout_ends_a_task_nobody_takes(scheduler: Scheduler) -> None:
    async with Client(scheduler.target) as client:
        task = await client.submit("nobody-runs-this", schedule_to_start_timeout=timedelta(milliseconds=300))
        done = await client.wait(task.id, timeout=timedelta(seconds=10))
    assert (done.state, done.attempt) == (TIMED_OUT, 0)
    assert done.last_failure.error_type == "ScheduleToStartTimeout"


async def test_a_leader_tick_with_nothing_due_runs_none_of_its_timeout_statements(
    scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idle leader's tick is one statement that finds nothing due; the statements that end
    timed-out work run once something is due, and end it."""
    ran: Counter[str] = Counter()

    def counting(name: str) -> Any:
        real = getattr(scheduler.store, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            ran[name] += 1
            return real(*args, **kwargs)

        return counted

    for name in ("expire_schedule_to_start", "apply_misses", "expired_attempts"):
        monkeypatch.setattr(scheduler.store, name, counting(name))
    await scheduler.parts.maintenance.tick()
    assert not ran
    async with Client(scheduler.target) as client:
        task = await client.submit("nobody-runs-this", schedule_to_start_timeout=timedelta(milliseconds=300))
        done = await client.wait(task.id, timeout=timedelta(seconds=10))
    assert (done.state, done.last_failure.error_type) == (TIMED_OUT, "ScheduleToStartTimeout")
    assert ran["expire_schedule_to_start"] >= 1
    assert ran["apply_misses"] == ran["expired_attempts"] == 0


async def test_a_type_at_its_concurrency_limit_waits(database_url: str) -> None:
    config: Config = replace(make_config(), types={"gpu": TypeConfig(max_concurrency=2)})
    scheduler = await start_scheduler(config, database_url=database_url)
    running = 0
    peak = 0
    worker = Worker(target=scheduler.target, slots=8)

    @worker.activity("gpu")
    async def gpu(payload: bytes) -> bytes:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.1)
        running -= 1
        return b""

    try:
        async with Client(scheduler.target) as client, worker:
            ids = [s.id for s in await client.submit_many([task_spec("gpu") for _ in range(10)])]
            for task_id in ids:
                assert (await client.wait(task_id, timeout=timedelta(seconds=20))).state == COMPLETED
    finally:
        await scheduler.stop(grace=1.0)
    assert peak == 2


async def test_a_stale_report_is_refused_and_changes_nothing(scheduler: Scheduler) -> None:
    """A worker reports an attempt it does not hold: it is told so, and the task is untouched."""
    async with Client(scheduler.target) as client:
        task = await client.submit("other")
        async with grpc.aio.insecure_channel(scheduler.target) as channel:
            stub = worker_pb2_grpc.WorkerServiceStub(channel)
            outgoing: asyncio.Queue[worker_pb2.WorkerMessage] = asyncio.Queue()
            hello = worker_pb2.Hello(
                worker_id="impostor", activity_types=[worker_pb2.ActivityType(name="unrelated")], slots=1
            )
            await outgoing.put(worker_pb2.WorkerMessage(hello=hello))
            stale = worker_pb2.TaskResult(task=task_pb2.TaskRef(task_id=task.id, attempt=1), success=b"forged")
            await outgoing.put(worker_pb2.WorkerMessage(results=worker_pb2.Results(results=[stale])))

            async def requests() -> AsyncIterator[worker_pb2.WorkerMessage]:
                while True:
                    yield await outgoing.get()

            call = stub.Connect(requests())
            replies = []
            async for reply in call:
                replies.append(reply)
                if reply.WhichOneof("message") == "rejected":
                    break
            call.cancel()
        after = await client.get(task.id)
    rejected = replies[-1].rejected.reports[0]
    assert (rejected.task.task_id, rejected.task.attempt) == (task.id, 1)
    assert (after.state, after.result, after.attempt) == (PENDING, b"", 0)


async def test_a_hello_without_runnable_types_is_refused(scheduler: Scheduler) -> None:
    async with grpc.aio.insecure_channel(scheduler.target) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        hello = worker_pb2.Hello(worker_id="w", activity_types=[worker_pb2.ActivityType(name="x", local=True)], slots=1)

        async def requests() -> AsyncIterator[worker_pb2.WorkerMessage]:
            yield worker_pb2.WorkerMessage(hello=hello)
            await asyncio.sleep(5)

        call = stub.Connect(requests())
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in call:
                pass
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "hello.activity_types" in (caught.value.details() or "")


async def test_a_worker_that_stops_heartbeating_loses_its_task(scheduler: Scheduler) -> None:
    """A silent worker (stream open, no heartbeats) loses its attempt after lease_timeout; the
    attempt is counted, another worker runs it, and the silent one is told to stop."""
    async with Client(scheduler.target) as client, grpc.aio.insecure_channel(scheduler.target) as channel:
        task = await client.submit("quiet", b"x", max_attempts=3, initial_backoff=timedelta(milliseconds=50))
        outgoing: asyncio.Queue[worker_pb2.WorkerMessage] = asyncio.Queue()
        hello = worker_pb2.Hello(worker_id="silent", activity_types=[worker_pb2.ActivityType(name="quiet")], slots=1)
        await outgoing.put(worker_pb2.WorkerMessage(hello=hello))

        async def requests() -> AsyncIterator[worker_pb2.WorkerMessage]:
            while True:
                yield await outgoing.get()

        call = worker_pb2_grpc.WorkerServiceStub(channel).Connect(requests())
        kinds: list[str] = []
        async for reply in call:
            kinds.append(reply.WhichOneof("message") or "")
            if kinds[-1] == "cancel":
                break
        call.cancel()
        worker = Worker(target=scheduler.target, slots=1)
        worker.register("quiet", lambda payload: payload)
        async with worker:
            done = await client.wait(task.id, timeout=timedelta(seconds=10))
    assert kinds == ["welcome", "assignments", "cancel"]
    assert (done.state, done.attempt, done.last_failure.error_type) == (COMPLETED, 2, "WorkerLost")


async def test_the_completer_flushed_waits_for_reports_taken_so_far_not_for_a_pause_in_the_flow(
    scheduler: Scheduler,
) -> None:
    # A worker's release (its attempts back to pending as WorkerLost) and a reconnecting worker's
    # attach first wait for the reports already taken to be written. Under a steady flow of
    # reports from other workers the completer never runs dry, so a wait for it to be idle would
    # last as long as the flow (an attach gave up after 5 s; a release had no bound).
    completer = scheduler.parts.completer
    stop = asyncio.Event()

    async def flow() -> None:
        task_id = 10**12  # no such task: each report is written and found stale
        while not stop.is_set():
            for _ in range(20):
                task_id += 1
                completer.add(Outcome(task_id=task_id, attempt=1, state=State.COMPLETED, result=b""), None)
            await asyncio.sleep(0)

    flowing = asyncio.create_task(flow())
    try:
        await asyncio.sleep(0.2)
        await asyncio.wait_for(completer.flushed(), 10)
        assert not flowing.done(), "the flow stopped before the wait ended"
    finally:
        stop.set()
        await flowing
