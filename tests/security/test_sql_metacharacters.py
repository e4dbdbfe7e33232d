"""SQL metacharacters in every string field a caller controls are data, never SQL: stored and
echoed verbatim, or refused with INVALID_ARGUMENT, and nothing else is touched."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import grpc
import pytest

from lowtide.config import SignalDefinition
from lowtide_client import Client, SignalClient
from lowtide_proto.lowtide.v1 import scheduler_pb2, scheduler_pb2_grpc, task_pb2
from scheduler_service.server import Scheduler
from signal_service.server import SignalServer, start_signal_service
from tests.signal.conftest import signal_config

NASTY = [
    "'",
    "''",
    "x'; DROP TABLE lowtide.tasks; --",
    "-- comment",
    "a;b",
    "%s",
    "%(x)s",
    "%%",
    "\\",
    "\\'; --",
    '"quoted"',
    "$1",
    "E'\\x41'",
    "*/ /*",
    "ümlaut ✓",
]


async def test_task_fields_keep_metacharacters_verbatim(scheduler: Scheduler) -> None:
    async with Client(scheduler.target) as client:
        stored = []
        for i, text in enumerate(NASTY):
            task = await client.submit(
                text,
                text.encode(),
                queue=text,
                idempotency_key=f"{text}-{i}",
                non_retryable_error_types=[text],
            )
            stored.append(task)
            again = await client.get(task.id)
            assert (again.activity_type, again.queue, again.payload, again.idempotency_key) == (
                text,
                text,
                text.encode(),
                f"{text}-{i}",
            )
            assert list(again.retry_policy.non_retryable_error_types) == [text]
            # The same idempotency key finds the same task, however it is quoted.
            assert (await client.submit(text, b"", queue=text, idempotency_key=f"{text}-{i}")).id == task.id
        # Filters are values too: each finds exactly its own task, none matches more.
        for text, task in zip(NASTY, stored, strict=True):
            by_queue = (await client.list(queue=text)).tasks
            by_type = (await client.list(activity_type=text)).tasks
            assert [t.id for t in by_queue] == [task.id] == [t.id for t in by_type], text
        everything = (await client.list(page_size=100)).tasks
    assert len(everything) == len(NASTY)


async def test_a_batch_and_bad_page_tokens_with_metacharacters(scheduler: Scheduler) -> None:
    async with grpc.aio.insecure_channel(scheduler.target) as channel:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        batch = [task_pb2.TaskSpec(activity_type=t, queue=t, payload=t.encode()) for t in NASTY]
        reply = await stub.SubmitTasks(scheduler_pb2.SubmitTasksRequest(tasks=batch))
        assert len(reply.tasks) == len(NASTY)
        for text in NASTY:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.ListTasks(scheduler_pb2.ListTasksRequest(page_token=text))
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        listed = await stub.ListTasks(scheduler_pb2.ListTasksRequest(page_size=100))
    assert sorted(t.activity_type for t in listed.tasks) == sorted(NASTY)


async def test_schedule_fields_keep_metacharacters_verbatim(scheduler: Scheduler) -> None:
    async with Client(scheduler.target) as client:
        for text in NASTY:
            made = await client.create_schedule(
                text,
                "0 3 * * *",
                text,
                text.encode(),
                queue=text,
                pool=text,
                time_zone="UTC",
                estimated_duration=timedelta(minutes=1),
            )
            assert (made.name, made.activity_type, made.queue, made.pool, made.payload) == (
                text,
                text,
                text,
                text,
                text.encode(),
            )
        listed = {s.name: s for s in await client.list_schedules()}
        assert set(listed) == set(NASTY)
        for text in NASTY:
            # A cron expression or time zone made of metacharacters is refused, naming the field.
            for field, cron, time_zone in (("cron", text, "UTC"), ("time_zone", "0 3 * * *", text)):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await client.create_schedule(
                        f"other {text}", cron, "echo", time_zone=time_zone, estimated_duration=timedelta(minutes=1)
                    )
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (field, text)
            paused = await client.pause_schedule(text)
            assert paused.schedule.paused
            assert not (await client.resume_schedule(text)).paused
        # Deleting one name deletes that schedule only.
        await client.delete_schedule(NASTY[2])
        assert {s.name for s in await client.list_schedules()} == set(NASTY) - {NASTY[2]}


@pytest.fixture
async def nasty_signals(database_url: str) -> AsyncIterator[SignalServer]:
    defined = {text: SignalDefinition(unit=f"u{text}", threshold=1.0) for text in NASTY}
    running = await start_signal_service(signal_config(defined), database_url=database_url)
    yield running
    await running.stop(grace=0.5)


async def test_signal_names_units_and_sources_keep_metacharacters(nasty_signals: SignalServer) -> None:
    async with SignalClient(nasty_signals.target) as client:
        for i, text in enumerate(NASTY):
            state = await client.set(float(i), name=text, unit=f"u{text}", source=text)
            assert (state.name, state.unit, state.source, state.value) == (text, f"u{text}", text, float(i))
        for i, text in enumerate(NASTY):
            assert (await client.get(text)).value == float(i)
            assert [p.value for p in await client.history(text)] == [float(i)]
        # A unit that is not the signal's own is refused, however it is quoted.
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await client.set(1.0, name=NASTY[0], unit="' OR 1=1 --")
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert {s.name for s in await client.list()} >= set(NASTY)
