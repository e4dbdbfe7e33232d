"""SubmitStream: single submits over one stream, each answered by its ref as SubmitTask would
answer it (the task stored, or the status SubmitTask ends with), one submit's error ending only
that submit. The Python client's `submit` goes this way; a scheduler without it is sent
SubmitTask calls."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import psycopg
from google.protobuf import duration_pb2

from lowtide_client import Client
from lowtide_proto.lowtide.v1 import scheduler_pb2, scheduler_pb2_grpc, task_pb2
from scheduler_service.api.submit_stream import serve_submit_stream
from scheduler_service.server import Scheduler
from tests.helpers import eventually, submit_task_only_scheduler

INVALID = grpc.StatusCode.INVALID_ARGUMENT


async def _stored(database_url: str) -> dict[int, bytes]:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT id, payload FROM lowtide.tasks")
        return {int(row[0]): bytes(row[1]) for row in await cur.fetchall()}


async def test_concurrent_submits_of_one_client_each_get_their_own_task(
    scheduler: Scheduler, database_url: str
) -> None:
    async with Client(scheduler.target) as client:
        tasks = await asyncio.gather(*(client.submit("echo", f"n{i}".encode()) for i in range(200)))
        stream = client._submits._stream
        assert stream is not None and stream.open, "the submits went over the stream, which stays open"
    assert [t.payload for t in tasks] == [f"n{i}".encode() for i in range(200)]
    assert await _stored(database_url) == {t.id: t.payload for t in tasks}


async def test_a_bad_submit_fails_alone_with_the_status_submit_task_gives(
    scheduler: Scheduler, database_url: str
) -> None:
    bad = task_pb2.TaskSpec(activity_type="echo", start_to_close_timeout=duration_pb2.Duration(seconds=-5))
    async with grpc.aio.insecure_channel(scheduler.target) as channel:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        try:
            await stub.SubmitTask(scheduler_pb2.SubmitTaskRequest(task=bad))
            raise AssertionError("SubmitTask took a negative timeout")
        except grpc.aio.AioRpcError as error:
            unary = (error.code(), error.details())
    async with Client(scheduler.target) as client:
        outcomes = await asyncio.gather(
            client.submit("echo", b"before"),
            client._submits.submit(bad),
            client.submit("echo", b"after"),
            return_exceptions=True,
        )
        await client.submit("echo", b"later")
        stream = client._submits._stream
        assert stream is not None and stream.open
    before, refused, after = outcomes
    assert isinstance(refused, grpc.aio.AioRpcError)
    assert (refused.code(), refused.details()) == unary
    assert unary[0] == INVALID and "start_to_close_timeout" in (unary[1] or "")
    assert isinstance(before, task_pb2.Task) and isinstance(after, task_pb2.Task)
    assert sorted((await _stored(database_url)).values()) == [b"after", b"before", b"later"]


def _message(*submits: scheduler_pb2.StreamedSubmit) -> scheduler_pb2.SubmitStreamRequest:
    return scheduler_pb2.SubmitStreamRequest(submits=submits)


def _echo(ref: int, **fields: Any) -> scheduler_pb2.StreamedSubmit:
    return scheduler_pb2.StreamedSubmit(ref=ref, task=task_pb2.TaskSpec(activity_type="echo"), **fields)


async def test_each_answer_names_its_ref_and_a_malformed_submit_is_refused_alone(scheduler: Scheduler) -> None:
    requests = [
        _message(_echo(7), scheduler_pb2.StreamedSubmit(ref=2**64 - 1), _echo(9)),
        _message(_echo(11, trace_context={f"k{i}": "v" for i in range(9)})),
        _message(_echo(12, trace_context={"tracestate": "x" * 513}), _echo(13)),
    ]
    async with grpc.aio.insecure_channel(scheduler.target) as channel:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        answers = {a.ref: a async for m in stub.SubmitStream(iter(requests), timeout=30) for a in m.answers}
    assert set(answers) == {7, 2**64 - 1, 9, 11, 12, 13}, "every submit answered once the client ended its side"
    stored = {answers[ref].submitted.task.id for ref in (7, 9, 13) if answers[ref].submitted.created}
    assert len(stored) == 3, "each good submit of a message is a task of its own"
    refused = answers[2**64 - 1].error
    assert (refused.code, refused.message) == (INVALID.value[0], "task: is required")
    # A trace context is W3C's two entries: more, or longer, is refused before it is read.
    assert (answers[11].error.code, answers[11].error.message) == (
        INVALID.value[0],
        "trace_context: 9 entries, more than 8",
    )
    assert answers[12].error.code == INVALID.value[0] and "more than 512 bytes" in answers[12].error.message


async def _ended_by(scheduler: Scheduler, bodies: list[bytes]) -> tuple[list[Any], grpc.StatusCode, str]:
    """The answers a raw stream of these message bodies got, and the status that ended it."""
    path = "/lowtide.v1.SchedulerService/SubmitStream"
    answers: list[Any] = []
    async with grpc.aio.insecure_channel(scheduler.target) as channel:
        decode = scheduler_pb2.SubmitStreamResponse.FromString
        call = channel.stream_stream(path, response_deserializer=decode)(iter(bodies), timeout=30)
        try:
            async for message in call:
                answers.extend(message.answers)
        except grpc.aio.AioRpcError as error:
            return answers, error.code(), error.details() or ""
    raise AssertionError("the stream ended without a status")


async def test_a_message_that_is_no_request_ends_the_stream_once_the_submits_before_it_are_answered(
    scheduler: Scheduler, database_url: str
) -> None:
    good = _message(scheduler_pb2.StreamedSubmit(ref=1, task=task_pb2.TaskSpec(activity_type="echo", payload=b"kept")))
    answers, code, details = await _ended_by(scheduler, [good.SerializeToString(), b"\x0a\x01\xff"])
    assert [(a.ref, a.submitted.task.payload) for a in answers] == [(1, b"kept")]
    assert code == INVALID and "not a valid" in details, (code, details)
    assert list((await _stored(database_url)).values()) == [b"kept"]
    async with Client(scheduler.target) as client:
        assert (await client.submit("echo", b"still")).payload == b"still"


async def test_a_message_of_no_submits_or_of_more_than_a_thousand_ends_the_stream(
    scheduler: Scheduler, database_url: str
) -> None:
    for bad, count in ((_message(), 0), (_message(*(_echo(ref) for ref in range(1001))), 1001)):
        bodies = [_message(_echo(1)).SerializeToString(), bad.SerializeToString()]
        answers, code, details = await _ended_by(scheduler, bodies)
        assert [a.ref for a in answers if a.submitted.created] == [1]
        assert (code, details) == (INVALID, f"submits: {count} in one message, not 1 to 1000")
    assert len(await _stored(database_url)) == 2, "only the good messages' submits were stored"


async def test_a_client_whose_stream_broke_submits_again_on_a_new_one(scheduler: Scheduler) -> None:
    async with Client(scheduler.target) as client:
        await client.submit("echo", b"first")
        first = client._submits._stream
        assert first is not None
        first.call.cancel()
        await asyncio.wait({first.reader}, timeout=10)
        assert not first.open
        again = await client.submit("echo", b"second")
        second = client._submits._stream
    assert again.payload == b"second"
    assert second is not None and second is not first


async def test_a_scheduler_without_submit_stream_is_sent_submit_task_calls() -> None:
    """An older scheduler answers SubmitStream UNIMPLEMENTED: the client's submits go as SubmitTask
    calls, that one and every later one. (A gRPC server of SubmitTask alone stands in for it.)"""
    calls: list[str] = []

    async def submit_task(request: scheduler_pb2.SubmitTaskRequest, context: Any) -> scheduler_pb2.SubmitTaskResponse:
        calls.append(request.task.activity_type)
        task = task_pb2.Task(id=len(calls), payload=request.task.payload)
        return scheduler_pb2.SubmitTaskResponse(task=task, created=True)

    async with submit_task_only_scheduler(submit_task) as target, Client(target) as client:
        first = await client.submit("a", b"1")
        second = await client.submit("b", b"2")
    assert (first.id, first.payload, second.id, second.payload) == (1, b"1", 2, b"2")
    assert calls == ["a", "b"]


async def test_a_client_that_takes_no_answers_is_not_read_past_1024_unanswered_submits() -> None:
    """While 1,024 submits of a stream are unanswered (stored, their answers not yet written to a
    client that reads none), the scheduler reads no more of the stream: what one client sends is
    bounded, however many messages it has queued. (The handler itself, its writes held back.)"""
    written = asyncio.Event()
    stored: list[task_pb2.TaskSpec] = []
    read: list[int] = []

    class HeldWrites:
        async def write(self, message: scheduler_pb2.SubmitStreamResponse) -> None:
            await written.wait()

    async def submit_one(spec: task_pb2.TaskSpec, submitter: str | None) -> scheduler_pb2.SubmitTaskResponse:
        stored.append(spec)
        return scheduler_pb2.SubmitTaskResponse(task=task_pb2.Task(id=len(stored)), created=True)

    async def requests() -> AsyncIterator[scheduler_pb2.SubmitStreamRequest]:
        for nth in range(3):
            read.append(nth)
            yield _message(*(_echo(nth * 1000 + i) for i in range(1000)))

    serving = asyncio.create_task(serve_submit_stream(submit_one, None, None, requests(), HeldWrites()))

    async def two_stored() -> bool:
        return len(stored) == 2000

    await eventually(two_stored)
    # Unbounded, the third message would have been read before any of the second's was stored.
    assert read == [0, 1] and len(stored) == 2000, "1,000 then 2,000 unanswered: the third message is not read"
    written.set()
    await asyncio.wait_for(serving, 30)
    assert read == [0, 1, 2] and len(stored) == 3000


async def test_large_submits_made_at_once_each_come_back_within_what_a_client_receives(
    scheduler: Scheduler, database_url: str
) -> None:
    """Twenty submits of 900 kB at once: 18 MB do not go in one request (a scheduler receives at
    most 16 MiB in one by default), nor their answers in one response (a gRPC client receives at
    most 4 MiB in one by default)."""
    payloads = [bytes([i]) * 900_000 for i in range(20)]
    async with Client(scheduler.target) as client:
        tasks = await asyncio.gather(*(client.submit("echo", payload) for payload in payloads))
    assert [t.payload for t in tasks] == payloads
    assert sorted((await _stored(database_url)).values()) == sorted(payloads)
