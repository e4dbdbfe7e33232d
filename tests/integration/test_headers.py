"""Task headers (a trace context, say): what a submitter attaches reaches the worker of each
attempt in its assignment and comes back from GetTask and ListTasks; headers out of bounds are
refused naming the header and the limit, and nothing is stored."""

from __future__ import annotations

import grpc
import psycopg

from lowtide_client import Client, task_spec
from lowtide_proto.lowtide.v1 import scheduler_pb2, scheduler_pb2_grpc, task_pb2
from scheduler_service.server import Scheduler
from tests.faults.support import RawWorker

TRACE = {
    "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "tracestate": "lowtide=t61rcWkgMzE",
}


async def _assigned_headers(raw: RawWorker) -> dict[int, dict[str, str]]:
    """The headers of the assignments on the raw worker's stream, by task id, up to the first batch."""
    while True:
        message = await raw.read()
        if message.WhichOneof("message") == "assignments":
            return {a.task.task_id: dict(a.headers) for a in message.assignments.assignments}


async def test_headers_reach_the_worker_in_its_assignment_and_come_back_from_get_and_list(
    scheduler: Scheduler,
) -> None:
    async with Client(scheduler.target) as client:
        task = await client.submit("count", "1", headers=TRACE)
        [other] = await client.submit_many([task_spec("count", "2", headers={"x-tenant": "blue"})])
        plain = await client.submit("count", "3")
        assert dict(task.headers) == TRACE
        raw = RawWorker(scheduler.target, "headers", slots=3)
        try:
            await raw.connect()
            assigned: dict[int, dict[str, str]] = {}
            while len(assigned) < 3:
                assigned |= await _assigned_headers(raw)
        finally:
            await raw.close()
        assert assigned == {task.id: TRACE, other.id: {"x-tenant": "blue"}, plain.id: {}}
        assert dict((await client.get(task.id)).headers) == TRACE
        listed = {t.id: dict(t.headers) for t in (await client.list()).tasks}
        assert listed == {task.id: TRACE, other.id: {"x-tenant": "blue"}, plain.id: {}}


async def _count_tasks(database_url: str) -> int:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        row = await (await conn.execute("SELECT count(*) FROM lowtide.tasks")).fetchone()
    assert row is not None
    return int(row[0])


async def test_headers_out_of_bounds_are_refused_naming_the_header_and_the_limit(
    scheduler: Scheduler, database_url: str
) -> None:
    many = {f"h{i}": "v" for i in range(33)}
    heavy = {f"h{i}": "v" * 1000 for i in range(9)}
    cases = [
        (many, "headers: 33 headers is over the limit of 32"),
        ({"k" * 129: "v"}, "headers: key '" + "k" * 40 + "...': 129 bytes is over the limit of 128"),
        ({"trace parent": "v"}, "headers: key 'trace parent': must be letters, digits"),
        ({"": "v"}, "headers: key '': must be letters"),
        ({"big": "v" * 1025}, "headers[big]: 1025 bytes is over the limit of 1024"),
        ({"crlf": "a\r\nInjected: 1"}, "headers[crlf]: must not contain control characters"),
        (heavy, "headers: 9018 bytes of keys and values is over the limit of 8192"),
    ]
    async with grpc.aio.insecure_channel(scheduler.target) as channel:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        refused = []
        for headers, expected in cases:
            try:
                await stub.SubmitTask(scheduler_pb2.SubmitTaskRequest(task=task_spec("count", headers=headers)))
            except grpc.aio.AioRpcError as error:
                refused.append((error.code(), (error.details() or "")[: len(expected)]))
        assert refused == [(grpc.StatusCode.INVALID_ARGUMENT, message) for _, message in cases]
        batch = [task_spec("count"), task_spec("count", headers={"big": "v" * 1025})]
        try:
            await stub.SubmitTasks(scheduler_pb2.SubmitTasksRequest(tasks=batch))
            raise AssertionError("a batch with headers out of bounds was stored")
        except grpc.aio.AioRpcError as error:
            assert (error.code(), error.details()) == (
                grpc.StatusCode.INVALID_ARGUMENT,
                "tasks[1].headers[big]: 1025 bytes is over the limit of 1024",
            )
        assert await _count_tasks(database_url) == 0
        # At each limit exactly: stored, and read back whole.
        edge = {f"h{i}": "v" for i in range(31)} | {"k" * 128: "v" * 1024}
        request = scheduler_pb2.SubmitTaskRequest(task=task_pb2.TaskSpec(activity_type="count", headers=edge))
        response = await stub.SubmitTask(request)
        read = await stub.GetTask(scheduler_pb2.GetTaskRequest(id=response.task.id))
    assert dict(read.task.headers) == edge
