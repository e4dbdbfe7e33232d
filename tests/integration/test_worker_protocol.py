"""The worker stream's promises at its edges, seen by workers speaking the protocol by hand over a
real channel: a second stream under the same worker id, a worker that never heartbeats, bytes
that are no message, a result with no outcome, and the rejection counter on /metrics."""

from __future__ import annotations

import asyncio
import urllib.request
from datetime import timedelta

import grpc
import pytest

from lowtide_client import Client, TaskState, Worker
from lowtide_proto.lowtide.v1 import task_pb2, worker_pb2
from scheduler_service.server import Scheduler, start_scheduler
from tests.conftest import make_config
from tests.faults.support import RawWorker
from tests.helpers import eventually

PENDING = TaskState.Value("TASK_STATE_PENDING")
RUNNING = TaskState.Value("TASK_STATE_RUNNING")
COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")

CONNECT = "/lowtide.v1.WorkerService/Connect"


async def _status_of(raw: RawWorker) -> grpc.aio.AioRpcError:
    """Reads the raw worker's stream to its end; returns the status it ended with."""
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        while True:
            if await asyncio.wait_for(raw.call.read(), 10) is grpc.aio.EOF:
                break
    return ended.value


async def test_a_newer_stream_for_the_same_worker_id_takes_over_the_attempts_it_lists(scheduler: Scheduler) -> None:
    async with Client(scheduler.target) as client:
        task = await client.submit("count", "1", max_attempts=2, initial_backoff=timedelta(hours=1))
        older = RawWorker(scheduler.target, "twin")
        newer = RawWorker(scheduler.target, "twin")
        try:
            await older.connect()
            ref = await older.assignment()
            assert ref == (task.id, 1)
            await newer.connect(running=[ref])
            ended = await _status_of(older)
            assert ended.code() == grpc.StatusCode.ABORTED
            assert ended.details() == "replaced by a newer stream for worker id twin"
            # The attempt is the newer stream's now: its report is applied.
            await newer.report([ref], result=b"from the newer stream")
            done = await client.wait(task.id, timeout=timedelta(seconds=10))
            assert (done.state, done.attempt, done.result) == (COMPLETED, 1, b"from the newer stream")
        finally:
            await older.close()
            await newer.close()


async def test_a_newer_stream_that_does_not_list_an_attempt_loses_it_with_that_reason(scheduler: Scheduler) -> None:
    async with Client(scheduler.target) as client:
        task = await client.submit("count", "1", max_attempts=2, initial_backoff=timedelta(hours=1))
        older = RawWorker(scheduler.target, "twin")
        newer = RawWorker(scheduler.target, "twin")
        try:
            await older.connect()
            assert await older.assignment() == (task.id, 1)
            await newer.connect()
            ended = await _status_of(older)
            assert ended.code() == grpc.StatusCode.ABORTED
            lost = await client.get(task.id)
            assert (lost.state, lost.attempt, lost.last_failure.error_type) == (PENDING, 1, "WorkerLost")
            assert "replaced by a newer stream for worker id twin" in lost.last_failure.message
            # A late report of the old attempt through the old stream changes nothing.
            assert (await client.get(task.id)).state == PENDING
        finally:
            await older.close()
            await newer.close()


async def test_a_worker_that_never_heartbeats_loses_one_attempt_not_all(scheduler: Scheduler) -> None:
    """Lease 2 s: the silent worker's attempt is lost once, then it gets nothing more, so the
    task's next attempt goes to a worker that keeps its lease. Its first heartbeat, much later,
    ends its stream with UNAVAILABLE (reconnect) instead of renewing a lease that is gone."""
    async with Client(scheduler.target) as client:
        task = await client.submit("count", "1", max_attempts=3, initial_backoff=timedelta(milliseconds=100))
        silent = RawWorker(scheduler.target, "silent")
        try:
            await silent.connect()
            assert await silent.assignment() == (task.id, 1)

            async def lost_once() -> bool:
                now = await client.get(task.id)
                return now.attempt == 1 and now.state == PENDING and now.last_failure.error_type == "WorkerLost"

            await eventually(lost_once, within=20)
            async with Worker(target=scheduler.target, worker_id="steady") as steady:
                steady.register("count", lambda payload: payload)
                done = await client.wait(task.id, timeout=timedelta(seconds=30))
            assert (done.state, done.attempt, done.worker_id) == (COMPLETED, 2, "steady")
            await silent.call.write(worker_pb2.WorkerMessage(heartbeat=worker_pb2.Heartbeat()))
            ended = await _status_of(silent)
            assert ended.code() == grpc.StatusCode.UNAVAILABLE
            assert "lease ran out" in (ended.details() or "")
        finally:
            await silent.close()


@pytest.mark.parametrize("after_hello", [False, True])
async def test_bytes_that_are_no_message_on_connect_get_invalid_argument(
    scheduler: Scheduler, after_hello: bool
) -> None:
    async with grpc.aio.insecure_channel(scheduler.target) as channel:
        # Identity serializers: the bytes go on the wire as they are.
        call = channel.stream_stream(CONNECT)()
        if after_hello:
            hello = worker_pb2.Hello(worker_id="raw-bytes", slots=1, activity_types=[worker_pb2.ActivityType(name="x")])
            await call.write(worker_pb2.WorkerMessage(hello=hello).SerializeToString())
            welcome = worker_pb2.SchedulerMessage.FromString(await call.read())
            assert welcome.WhichOneof("message") == "welcome"
        await call.write(b"\xff\xff\xff\xff\xff")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            while await asyncio.wait_for(call.read(), 10) is not grpc.aio.EOF:
                pass
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = refused.value.details() or ""
    assert details.startswith(f"request: not a valid {CONNECT} message"), details
    assert "DecodeError" not in details
    # The scheduler serves on.
    good = RawWorker(scheduler.target, "after-the-garbage")
    try:
        assert (await good.connect()).worker_id == "after-the-garbage"
    finally:
        await good.close()


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


async def test_every_refused_report_is_counted_with_its_reason(scheduler: Scheduler) -> None:
    port = scheduler.metrics.metrics.port
    assert port
    async with Client(scheduler.target) as client:
        task = await client.submit("count", "1")
        raw = RawWorker(scheduler.target, "reporter")
        try:
            await raw.connect()
            ref = await raw.assignment()
            # A result with no outcome: refused with a reason that says so, the attempt kept.
            empty = worker_pb2.TaskResult(task=task_pb2.TaskRef(task_id=ref[0], attempt=ref[1]))
            await raw.call.write(worker_pb2.WorkerMessage(results=worker_pb2.Results(results=[empty])))
            answer = await raw.read()
            assert answer.WhichOneof("message") == "rejected", answer
            assert answer.rejected.reports[0].reason == "the result has no outcome: set success or failure"
            assert (await client.get(task.id)).state == RUNNING
            # Two reports for attempts this worker does not hold.
            await raw.report([(ref[0], ref[1] + 1), (ref[0] + 1000, 1)])
            answer = await raw.read()
            assert answer.rejected.reports[0].reason == "the attempt is not held by this worker"
            # The kept attempt is still this worker's to report.
            await raw.report([ref], result=b"at last")
            assert (await client.wait(task.id, timeout=timedelta(seconds=10))).state == COMPLETED
        finally:
            await raw.close()

    async def counted() -> str:
        text = await asyncio.to_thread(_scrape, port)
        wanted = [
            'lowtide_report_rejected_total{reason="no_outcome"} 1.0',
            'lowtide_report_rejected_total{reason="not_held"} 2.0',
        ]
        return text if all(line in text for line in wanted) else ""

    await eventually(counted, within=15)


async def test_reports_that_free_no_slot_start_no_claim(database_url: str) -> None:
    """Each report that frees slots asks its group for a claim; one that frees none (empty, or for
    attempts the worker does not hold) asks for nothing. Before, each asked: a worker sending empty
    reports without pause kept claims running back to back, 1,600 statements a second."""
    scheduler = await start_scheduler(make_config(poll_interval=timedelta(minutes=5)), database_url=database_url)
    raw = RawWorker(scheduler.target, "noisy", slots=4)
    try:
        await raw.connect()
        await eventually(lambda: _claims_settled(scheduler))
        before = scheduler.dispatcher.claims_run
        for n in range(300):
            await raw.call.write(worker_pb2.WorkerMessage(results=worker_pb2.Results()))
            await raw.report([(10_000 + n, 1)])
        # Read back in order: every stale report was answered, so all were applied.
        rejected = 0
        while rejected < 300:
            message = await raw.read()
            if message.WhichOneof("message") == "rejected":
                rejected += len(message.rejected.reports)
        assert scheduler.dispatcher.claims_run == before
    finally:
        await raw.close()
        await scheduler.stop(grace=0.5)


async def _claims_settled(scheduler: Scheduler) -> bool:
    """No claim running, so the connect's own has been counted."""
    before = scheduler.dispatcher.claims_run
    await asyncio.sleep(0.1)
    return scheduler.dispatcher.claims_run == before and not any(g.claims for g in scheduler.registry.groups())


async def test_a_worker_sending_slot_updates_without_pause_is_ended_and_others_work_on(scheduler: Scheduler) -> None:
    """A SlotUpdate may start a claim, so a stream may send only so many a second
    (domain.allowance): one that sends them without pause ends with RESOURCE_EXHAUSTED naming the
    limit, and the scheduler serves the other workers on."""
    noisy = RawWorker(scheduler.target, "slot-flipper", slots=4)
    try:
        await noisy.connect()
        # Each asks for an answer, read before the next is sent: no write of ours meets the end
        # of the stream (grpc.aio would report INTERNAL for the write in place of its status).
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            for _ in range(1_000):
                update = worker_pb2.SlotUpdate(slots=4, answer=True)
                await noisy.call.write(worker_pb2.WorkerMessage(slot_update=update))
                assert (await noisy.read()).WhichOneof("message") == "slots_taken"
        assert ended.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "sends slot and hold updates faster than 50 a second (in a burst, 100)" in (ended.value.details() or "")
    finally:
        await noisy.close()
    async with Client(scheduler.target) as client, Worker(target=scheduler.target, worker_id="calm") as calm:
        calm.register("count", lambda payload: payload)
        task = await client.submit("count", "1")
        done = await client.wait(task.id, timeout=timedelta(seconds=10))
    assert done.state == COMPLETED
