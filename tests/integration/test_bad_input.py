"""Bad input, through a real gRPC client: every mistake is refused with the status a caller can
act on and a message naming the field, nothing of a refused request is stored, and the service
(and the workers connected to it) carry on as before."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any

import grpc
import psycopg
from google.protobuf import duration_pb2
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from lowtide_client import Client, TaskState, Worker
from lowtide_proto.lowtide.v1 import (
    scheduler_pb2,
    scheduler_pb2_grpc,
    task_pb2,
    worker_pb2,
    worker_pb2_grpc,
)
from scheduler_service.server import Scheduler
from scheduler_service.workers.reader import MAX_ACTIVITY_TYPES, MAX_LISTED, MAX_PAIRS, MAX_QUEUES

MIB = 1024 * 1024
COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")
PENDING = TaskState.Value("TASK_STATE_PENDING")
INVALID = grpc.StatusCode.INVALID_ARGUMENT

Call = Callable[[Any], Awaitable[Any]]


async def refusal(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str]:
    """The status and message a call failed with; a call that succeeds is reported as OK."""
    try:
        await call
    except grpc.aio.AioRpcError as error:
        return error.code(), error.details() or ""
    return grpc.StatusCode.OK, ""


async def count_tasks(database_url: str) -> int:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT count(*) FROM lowtide.tasks")
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


def spec(activity_type: str = "echo", **fields: Any) -> task_pb2.TaskSpec:
    return task_pb2.TaskSpec(activity_type=activity_type, **fields)


def submit_one(stub: Any, task: task_pb2.TaskSpec) -> Awaitable[Any]:
    call: Awaitable[Any] = stub.SubmitTask(scheduler_pb2.SubmitTaskRequest(task=task))
    return call


async def test_bad_requests_are_refused_naming_the_field_and_store_nothing(
    scheduler: Scheduler, database_url: str
) -> None:
    async with Client(scheduler.target) as client:
        await client.submit("echo", b"before")
    before = await count_tasks(database_url)
    async with grpc.aio.insecure_channel(scheduler.target) as channel:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        unknown_id = 10**12
        unknown_state = scheduler_pb2.ListTasksRequest(state=99)  # type: ignore[arg-type]  # on purpose
        cases: list[tuple[str, Awaitable[Any], grpc.StatusCode, str]] = [
            ("no task at all", stub.SubmitTask(scheduler_pb2.SubmitTaskRequest()), INVALID, "task"),
            ("empty activity_type", submit_one(stub, spec("")), INVALID, "activity_type"),
            (
                "negative start_to_close",
                submit_one(stub, spec(start_to_close_timeout=duration_pb2.Duration(seconds=-5))),
                INVALID,
                "start_to_close_timeout",
            ),
            (
                "absurd start_to_close",
                submit_one(stub, spec(start_to_close_timeout=duration_pb2.Duration(seconds=10**9))),
                INVALID,
                "start_to_close_timeout",
            ),
            (
                "absurd schedule_to_start",
                submit_one(stub, spec(schedule_to_start_timeout=duration_pb2.Duration(seconds=10**9))),
                INVALID,
                "schedule_to_start_timeout",
            ),
            ("unknown kind", submit_one(stub, spec(kind=99)), INVALID, "kind"),
            (
                "payload over 1 MiB",
                submit_one(stub, spec(payload=b"x" * (MIB + 1))),
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "payload",
            ),
            (
                "get of an unknown id",
                stub.GetTask(scheduler_pb2.GetTaskRequest(id=unknown_id)),
                grpc.StatusCode.NOT_FOUND,
                str(unknown_id),
            ),
            (
                "cancel of an unknown id",
                stub.CancelTask(scheduler_pb2.CancelTaskRequest(id=unknown_id)),
                grpc.StatusCode.NOT_FOUND,
                str(unknown_id),
            ),
            ("list with an unknown state", stub.ListTasks(unknown_state), INVALID, "state"),
            (
                "101 non-retryable error types",
                submit_one(
                    stub,
                    spec(retry_policy=task_pb2.RetryPolicy(non_retryable_error_types=[f"E{i}" for i in range(101)])),
                ),
                INVALID,
                "non_retryable_error_types",
            ),
            (
                "a batch with one bad task",
                stub.SubmitTasks(
                    scheduler_pb2.SubmitTasksRequest(tasks=[spec(payload=b"0"), spec(payload=b"1"), spec(""), spec()])
                ),
                INVALID,
                "tasks[2].activity_type",
            ),
            (
                "a batch with one task too large",
                stub.SubmitTasks(scheduler_pb2.SubmitTasksRequest(tasks=[spec(), spec(payload=b"x" * (MIB + 1))])),
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "tasks[1].payload",
            ),
            (
                "a batch naming 100,001 dependencies in all",
                stub.SubmitTasks(
                    scheduler_pb2.SubmitTasksRequest(
                        tasks=[spec(depends_on=range(1, 1001)) for _ in range(100)] + [spec(depends_on=[1])]
                    )
                ),
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "100,001 dependencies",
            ),
        ]
        seen = [(label, *await refusal(call)) for label, call, _, _ in cases]
        wanted = [(label, code, field) for label, _, code, field in cases]
        got = [
            (label, code, field if field in details else details)
            for (label, code, details), (_, _, _, field) in zip(seen, cases, strict=True)
        ]
        assert got == wanted
        assert await count_tasks(database_url) == before

        # Still answering: a good submit (a payload of exactly the limit) is stored and readable.
        good = await stub.SubmitTask(scheduler_pb2.SubmitTaskRequest(task=spec(payload=b"y" * MIB)))
        read = await stub.GetTask(scheduler_pb2.GetTaskRequest(id=good.task.id))
    assert (read.task.state, len(read.task.payload)) == (PENDING, MIB)
    assert await count_tasks(database_url) == before + 1


async def test_text_the_database_cannot_store_is_an_invalid_argument(scheduler: Scheduler, database_url: str) -> None:
    """PostgreSQL text cannot hold NUL; such a field is the caller's mistake, not an internal error."""
    async with grpc.aio.insecure_channel(scheduler.target) as channel:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        got = {
            "submit": await refusal(submit_one(stub, spec(idempotency_key="order\x0042"))),
            "batch": await refusal(
                stub.SubmitTasks(scheduler_pb2.SubmitTasksRequest(tasks=[spec(), spec(idempotency_key="k\x00")]))
            ),
            # Another field refused too (checked first or not): the key is still never looked up.
            "submit, unknown kind": await refusal(submit_one(stub, spec(kind=99, idempotency_key="order\x0042"))),
            "batch, unknown kind": await refusal(
                stub.SubmitTasks(scheduler_pb2.SubmitTasksRequest(tasks=[spec(kind=99, idempotency_key="k\x00")]))
            ),
            "list by queue": await refusal(stub.ListTasks(scheduler_pb2.ListTasksRequest(queue="q\x00"))),
            "list by type": await refusal(stub.ListTasks(scheduler_pb2.ListTasksRequest(activity_type="t\x00"))),
        }
    assert {k: code for k, (code, _) in got.items()} == dict.fromkeys(got, INVALID), got
    assert "idempotency_key" in got["submit"][1] and "tasks[1].idempotency_key" in got["batch"][1]
    assert "idempotency_key" in got["submit, unknown kind"][1]
    assert "tasks[0].idempotency_key" in got["batch, unknown kind"][1]
    assert await count_tasks(database_url) == 0


async def test_a_page_token_the_service_never_gave_out_is_an_invalid_argument(scheduler: Scheduler) -> None:
    async with grpc.aio.insecure_channel(scheduler.target) as channel:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        got = {
            token: await refusal(stub.ListTasks(scheduler_pb2.ListTasksRequest(page_token=token)))
            for token in ("abc", "-1", "²", "9" * 30)
        }
    assert {t: code for t, (code, _) in got.items()} == dict.fromkeys(got, INVALID), got
    assert all("page_token" in details for _, details in got.values()), got


async def open_stream(target: str, messages: list[worker_pb2.WorkerMessage]) -> tuple[grpc.StatusCode, str]:
    """Sends `messages` on a fresh Connect stream, keeps it open, and returns how it ended."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)

        async def requests() -> AsyncIterator[worker_pb2.WorkerMessage]:
            for message in messages:
                yield message
            await asyncio.sleep(30)

        call = stub.Connect(requests())

        async def read_all() -> None:
            async for _ in call:
                pass

        try:
            return await refusal(asyncio.wait_for(read_all(), 10))
        finally:
            call.cancel()


def hello(worker_id: str, slots: int = 1, held_types: Sequence[str] = ()) -> worker_pb2.WorkerMessage:
    # A type no task has, so the scheduler never hands these streams real work.
    types = [worker_pb2.ActivityType(name="nothing-submits-this")]
    return worker_pb2.WorkerMessage(
        hello=worker_pb2.Hello(worker_id=worker_id, activity_types=types, slots=slots, held_types=held_types)
    )


async def test_a_garbage_worker_is_refused_while_a_real_worker_keeps_working(scheduler: Scheduler) -> None:
    heartbeat = worker_pb2.WorkerMessage(heartbeat=worker_pb2.Heartbeat())
    results = worker_pb2.WorkerMessage(
        results=worker_pb2.Results(
            results=[worker_pb2.TaskResult(task=task_pb2.TaskRef(task_id=1, attempt=1), success=b"forged")]
        )
    )
    garbage: list[tuple[str, list[worker_pb2.WorkerMessage], grpc.StatusCode, str]] = [
        ("a heartbeat first", [heartbeat], grpc.StatusCode.FAILED_PRECONDITION, "hello"),
        ("results first", [results], grpc.StatusCode.FAILED_PRECONDITION, "hello"),
        ("an empty message first", [worker_pb2.WorkerMessage()], grpc.StatusCode.FAILED_PRECONDITION, "hello"),
        ("a second hello", [hello("g-twice"), hello("g-twice")], grpc.StatusCode.FAILED_PRECONDITION, "hello"),
        ("an empty message later", [hello("g-empty"), worker_pb2.WorkerMessage()], INVALID, "message"),
        ("zero slots", [hello("g-zero", slots=0)], INVALID, "hello.slots"),
        ("a held type with no name", [hello("g-held", held_types=["render", ""])], INVALID, "hello.held_types"),
    ]
    worker = Worker(target=scheduler.target, slots=4, worker_id="real-worker")

    @worker.activity("echo")
    async def echo(payload: bytes) -> bytes:
        await asyncio.sleep(0.01)
        return payload

    async with Client(scheduler.target) as client, worker:
        first = await client.submit("echo", b"before")
        assert (await client.wait(first.id, timeout=timedelta(seconds=10))).state == COMPLETED

        async def submit_and_wait(n: int) -> list[task_pb2.Task]:
            tasks = [await client.submit("echo", str(i)) for i in range(n)]
            return [await client.wait(t.id, timeout=timedelta(seconds=15)) for t in tasks]

        # The garbage streams come and go while the real worker runs tasks submitted meanwhile.
        done, *endings = await asyncio.gather(
            submit_and_wait(20), *(open_stream(scheduler.target, messages) for _, messages, _, _ in garbage)
        )
        after = await submit_and_wait(5)
    got = [
        (label, code, field if field in details else details)
        for (label, _, _, field), (code, details) in zip(garbage, endings, strict=True)
    ]
    assert got == [(label, code, field) for label, _, code, field in garbage]
    assert [(t.state, t.attempt, t.worker_id, t.result) for t in done + after] == [
        (COMPLETED, 1, "real-worker", str(i).encode()) for i in [*range(20), *range(5)]
    ]


def _refs(count: int) -> list[task_pb2.TaskRef]:
    return [task_pb2.TaskRef(task_id=i + 1, attempt=1) for i in range(count)]


def _over_the_limits() -> list[tuple[str, list[worker_pb2.WorkerMessage], str]]:
    """Worker messages each naming one thing more than the scheduler takes, and the field named."""

    def big_hello(worker_id: str, *, types: int = 1, queues: int = 0, **lists: Any) -> worker_pb2.WorkerMessage:
        named = [worker_pb2.ActivityType(name=f"nothing-submits-this-{i}") for i in range(types)]
        message = worker_pb2.Hello(
            worker_id=worker_id, activity_types=named, slots=1, queues=[f"q{i}" for i in range(queues)], **lists
        )
        return worker_pb2.WorkerMessage(hello=message)

    many_types = [f"t{i}" for i in range(MAX_ACTIVITY_TYPES + 1)]
    over = MAX_LISTED + 1
    return [
        ("activity types", [big_hello("b-types", types=MAX_ACTIVITY_TYPES + 1)], "hello.activity_types"),
        ("queues", [big_hello("b-queues", queues=MAX_QUEUES + 1)], "hello.queues"),
        (
            "(queue, type) pairs",
            [big_hello("b-pairs", types=MAX_PAIRS // MAX_QUEUES + 1, queues=MAX_QUEUES)],
            "pairs, over the limit",
        ),
        ("listed attempts", [big_hello("b-running", running=_refs(over))], "hello.running"),
        ("own deferrable types", [big_hello("b-own", cost_deferrable_activities=many_types)], "hello.cost_deferrable"),
        ("held types", [big_hello("b-held", held_types=many_types)], "hello.held_types"),
        (
            "results",
            [
                hello("b-results"),
                worker_pb2.WorkerMessage(
                    results=worker_pb2.Results(
                        results=[worker_pb2.TaskResult(task=r, success=b"") for r in _refs(over)]
                    )
                ),
            ],
            "results.results",
        ),
        (
            "heartbeat attempts",
            [hello("b-beat"), worker_pb2.WorkerMessage(heartbeat=worker_pb2.Heartbeat(running=_refs(over)))],
            "heartbeat.running",
        ),
        (
            "heartbeat details",
            [
                hello("b-details"),
                worker_pb2.WorkerMessage(
                    heartbeat=worker_pb2.Heartbeat(
                        details=[worker_pb2.HeartbeatDetails(task=r, details=b"") for r in _refs(over)]
                    )
                ),
            ],
            "heartbeat.details",
        ),
        (
            "held types of a hold update",
            [hello("b-update"), worker_pb2.WorkerMessage(hold_update=worker_pb2.HoldUpdate(held_types=many_types))],
            "hold_update.held_types",
        ),
    ]


async def test_a_worker_message_naming_more_than_the_limits_is_refused_before_it_costs_anything(
    scheduler: Scheduler, database_url: str
) -> None:
    # Each of these fits in a message, but walking it would cost the scheduler's event loop
    # seconds (a hello of 1,000 queues x 1,000 types, 14 KB, held it 3 s): refused on sight,
    # naming the field and the limit, while a real worker keeps working.
    cases = _over_the_limits()
    worker = Worker(target=scheduler.target, slots=4, worker_id="real-worker")
    worker.register("echo", lambda payload: payload)
    async with Client(scheduler.target) as client, worker:
        endings = await asyncio.gather(*(open_stream(scheduler.target, messages) for _, messages, _ in cases))
        done = await client.wait((await client.submit("echo", b"after")).id, timeout=timedelta(seconds=30))
    got = [
        (label, code, field if field in details else details)
        for (label, _, field), (code, details) in zip(cases, endings, strict=True)
    ]
    assert got == [(label, INVALID, field) for label, _, field in cases]
    assert (done.state, done.result) == (COMPLETED, b"after")
    refused_hellos = [m[0].hello.worker_id for _, m, _ in cases if len(m) == 1]
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT id FROM lowtide.workers WHERE id = ANY(%s)", (refused_hellos,))
        assert await cur.fetchall() == [], "a refused hello recorded its worker"


DURATIONS = ("schedule_to_start_timeout", "start_to_close_timeout", "heartbeat_timeout")
FIELDS = ("activity_type", "queue", "kind", "payload", *DURATIONS)
MAX_SECONDS = 366 * 86400


def good_values(name: str) -> st.SearchStrategy[Any]:
    """Values of a spec field the scheduler accepts."""
    if name in ("activity_type", "queue"):
        return st.from_regex(r"[a-z][a-z0-9_.-]{0,30}", fullmatch=True)
    if name == "kind":
        return st.sampled_from([0, 1, 2])
    if name == "payload":
        return st.integers(0, 64) | st.integers(MIB - 2, MIB)
    if name == "heartbeat_timeout":  # at least 1s
        return st.none() | st.builds(
            duration_pb2.Duration, seconds=st.integers(1, MAX_SECONDS), nanos=st.integers(0, 10**9 - 1)
        )
    return (
        st.none()
        | st.builds(duration_pb2.Duration, seconds=st.integers(1, MAX_SECONDS), nanos=st.integers(0, 10**9 - 1))
        | st.builds(duration_pb2.Duration, seconds=st.just(0), nanos=st.integers(1000, 10**9 - 1))
    )


def any_values(name: str) -> st.SearchStrategy[Any]:
    """Anything the field can carry, mostly what the scheduler must refuse."""
    if name == "activity_type":
        return st.text(max_size=220)
    if name == "queue":
        return st.text(max_size=12) | st.text(min_size=195, max_size=205)
    if name == "kind":
        return st.integers(-3, 99)
    if name == "payload":
        return st.integers(0, 2 * MIB) | st.integers(MIB - 2, MIB + 2)
    return st.builds(
        duration_pb2.Duration,
        seconds=st.integers(-(10**10), 10**10) | st.integers(MAX_SECONDS - 1, MAX_SECONDS + 1),
        nanos=st.integers(-2 * 10**9, 2 * 10**9),
    )


@st.composite
def task_specs(draw: st.DrawFn) -> tuple[task_pb2.TaskSpec, frozenset[str]]:
    """A spec, and the fields given arbitrary values (the others are valid)."""
    arbitrary = frozenset(draw(st.sets(st.sampled_from(FIELDS), max_size=3)))
    value = {name: draw(any_values(name) if name in arbitrary else good_values(name)) for name in FIELDS}
    message = task_pb2.TaskSpec(
        activity_type=value["activity_type"],
        queue=value["queue"],
        kind=value["kind"],
        priority=draw(st.integers(-(2**31), 2**31 - 1)),
        payload=b"p" * value["payload"],
    )
    for name in DURATIONS:
        if value[name] is not None:
            getattr(message, name).CopyFrom(value[name])
    return message, arbitrary


@settings(
    max_examples=50,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=task_specs())
async def test_any_submit_is_stored_or_refused_naming_a_wrong_field(
    scheduler: Scheduler, case: tuple[task_pb2.TaskSpec, frozenset[str]]
) -> None:
    task, arbitrary = case
    async with grpc.aio.insecure_channel(scheduler.target) as channel:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        try:
            submitted = await submit_one(stub, task)
        except grpc.aio.AioRpcError as error:
            code, details = error.code(), error.details() or ""
            event(code.name)
            # Only a field that was given an arbitrary value may be blamed, and it is named.
            assert code in (INVALID, grpc.StatusCode.RESOURCE_EXHAUSTED), (code, details)
            assert details.split(":", 1)[0] in arbitrary, (details, arbitrary)
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                assert len(task.payload) > MIB
            return
        event("OK")
        stored = (await stub.GetTask(scheduler_pb2.GetTaskRequest(id=submitted.task.id))).task
    assert (stored.activity_type, stored.queue, stored.priority, stored.payload) == (
        task.activity_type,
        task.queue or "default",
        task.priority,
        task.payload,
    )
