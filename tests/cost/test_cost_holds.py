"""Cost holds, every seed rule, through a real signal service, scheduler, database and worker."""

from __future__ import annotations

import asyncio
import logging
import urllib.request
from collections.abc import AsyncIterator
from datetime import timedelta

import grpc
import pytest

from lowtide.errors import ConfigError
from lowtide_client import Client, CostHold, TaskKind, TaskState, Worker, task_spec
from lowtide_proto.lowtide.v1 import scheduler_pb2, scheduler_pb2_grpc, worker_pb2, worker_pb2_grpc
from scheduler_service.server import start_scheduler
from signal_service.server import SignalServer
from tests.cost.conftest import Pair, cost_config
from tests.helpers import eventually, on_loopback

PENDING = TaskState.Value("TASK_STATE_PENDING")
COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")
TIMED_OUT = TaskState.Value("TASK_STATE_TIMED_OUT")
WORKFLOW = TaskKind.Value("TASK_KIND_WORKFLOW")


def worker_for(pair: Pair, *types: str, slots: int = 4, **options: object) -> Worker:
    worker = Worker(target=pair.scheduler.target, queues=["default", "batch"], slots=slots, **options)  # type: ignore[arg-type]

    async def run(payload: bytes) -> bytes:
        await asyncio.sleep(float(payload.decode() or 0))
        return payload

    for name in types:
        worker.register(name, run)
    return worker


async def state_of(client: Client, task_id: int) -> tuple[int, int]:
    task = await client.get(task_id)
    return task.state, task.attempt


async def test_held_until_the_first_value_then_released_by_a_fall(pair: Pair) -> None:
    async with Client(pair.scheduler.target) as client, worker_for(pair, "train", "echo"):
        train = await client.submit("train")
        echo = await client.submit("echo")
        assert (await client.wait(echo.id, timeout=timedelta(seconds=60))).state == COMPLETED
        # No value has arrived: the signal counts as high, the held type waits, attempt untouched.
        await asyncio.sleep(0.3)
        assert await state_of(client, train.id) == (PENDING, 0)
        await pair.set_signal(520)
        await asyncio.sleep(0.3)
        assert await state_of(client, train.id) == (PENDING, 0)
        # The fall wakes dispatch by push: the poll interval here is a minute, so a wait of a
        # third of it (generous for a loaded machine) ends only if the push woke it.
        await pair.set_signal(120)
        done = await client.wait(train.id, timeout=timedelta(seconds=20))
    assert (done.state, done.attempt) == (COMPLETED, 1)
    assert done.signal_at_dispatch == 120


async def test_held_work_takes_no_slot_and_other_types_run(pair: Pair) -> None:
    await pair.set_signal(520)
    async with Client(pair.scheduler.target) as client, worker_for(pair, "train", "echo", slots=1):
        held = [s.id for s in await client.submit_many([task_spec("train") for _ in range(5)])]
        echoes = [s.id for s in await client.submit_many([task_spec("echo") for _ in range(5)])]
        for task_id in echoes:
            assert (await client.wait(task_id, timeout=timedelta(seconds=60))).state == COMPLETED
        for task_id in held:
            assert await state_of(client, task_id) == (PENDING, 0)


async def test_workflow_tasks_always_run(pair: Pair) -> None:
    await pair.set_signal(520)
    async with Client(pair.scheduler.target) as client, worker_for(pair, "train"):
        workflow = await client.submit("train", kind=WORKFLOW)
        activity = await client.submit("train")
        assert (await client.wait(workflow.id, timeout=timedelta(seconds=60))).state == COMPLETED
        assert await state_of(client, activity.id) == (PENDING, 0)


async def test_a_task_claimed_before_the_rise_runs(pair: Pair) -> None:
    await pair.set_signal(100)
    async with Client(pair.scheduler.target) as client, worker_for(pair, "train"):
        task = await client.submit("train", b"0.5")
        await eventually(lambda: _running(client, task.id))
        await pair.set_signal(600)
        done = await client.wait(task.id, timeout=timedelta(seconds=60))
    assert (done.state, done.attempt) == (COMPLETED, 1)


async def _running(client: Client, task_id: int) -> bool:
    return (await client.get(task_id)).state == TaskState.Value("TASK_STATE_RUNNING")


async def test_per_queue_holds_and_the_workers_own_deferrable_types(pair: Pair) -> None:
    await pair.set_signal(520)
    worker = worker_for(pair, "index", "report_card", cost_deferrable_activities=["report_card"])
    async with Client(pair.scheduler.target) as client, worker:
        on_batch = await client.submit("index", queue="batch")
        on_default = await client.submit("index")
        own = await client.submit("report_card")
        assert (await client.wait(on_default.id, timeout=timedelta(seconds=60))).state == COMPLETED
        await asyncio.sleep(0.3)
        assert await state_of(client, on_batch.id) == (PENDING, 0)
        assert await state_of(client, own.id) == (PENDING, 0)
        await pair.set_signal(50)
        assert (await client.wait(on_batch.id, timeout=timedelta(seconds=5))).state == COMPLETED
        assert (await client.wait(own.id, timeout=timedelta(seconds=5))).state == COMPLETED


async def test_a_worker_predicate_holds_its_types_whatever_the_signal(pair: Pair) -> None:
    await pair.set_signal(50)
    expensive = True
    worker = worker_for(
        pair,
        "render",
        cost_holds=[CostHold(lambda: expensive, ["render"])],
        hold_check_interval=timedelta(milliseconds=50),
    )
    async with Client(pair.scheduler.target) as client, worker:
        # Submitted at once, perhaps before the worker's stream is open: its Hello holds the type.
        task = await client.submit("render")
        await asyncio.sleep(0.4)
        assert await state_of(client, task.id) == (PENDING, 0)
        expensive = False
        assert (await client.wait(task.id, timeout=timedelta(seconds=5))).state == COMPLETED


async def test_schedule_to_start_keeps_running_during_a_hold(pair: Pair) -> None:
    await pair.set_signal(520)
    async with Client(pair.scheduler.target) as client, worker_for(pair, "train"):
        task = await client.submit("train", schedule_to_start_timeout=timedelta(milliseconds=300))
        done = await client.wait(task.id, timeout=timedelta(seconds=60))
    assert (done.state, done.attempt, done.last_failure.error_type) == (TIMED_OUT, 0, "ScheduleToStartTimeout")


async def test_a_queue_pause_suspends_schedule_to_start(pair: Pair) -> None:
    async with Client(pair.scheduler.target) as client, grpc.aio.insecure_channel(pair.scheduler.target) as channel:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        paused = await stub.PauseQueue(scheduler_pb2.PauseQueueRequest(queue="default"))
        assert paused.queue.paused
        task = await client.submit("echo", schedule_to_start_timeout=timedelta(milliseconds=400))
        async with worker_for(pair, "echo"):
            await asyncio.sleep(0.8)
            # Past its deadline, but the queue is paused: neither run nor timed out.
            assert await state_of(client, task.id) == (PENDING, 0)
            await stub.ResumeQueue(scheduler_pb2.ResumeQueueRequest(queue="default"))
            done = await client.wait(task.id, timeout=timedelta(seconds=5))
    assert done.state == COMPLETED


async def test_max_defer_runs_a_held_task_anyway_and_says_so(pair: Pair) -> None:
    await pair.set_signal(520)
    async with Client(pair.scheduler.target) as client, worker_for(pair, "train"):
        task = await client.submit("train", max_defer=timedelta(milliseconds=300))
        done = await client.wait(task.id, timeout=timedelta(seconds=60))
    assert (done.state, done.released_by) == (COMPLETED, "max_defer")


async def test_explain_status_and_carbon_accounting(pair: Pair) -> None:
    await pair.set_signal(520)
    async with Client(pair.scheduler.target) as client, grpc.aio.insecure_channel(pair.scheduler.target) as channel:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        held = await client.submit("train")
        await client.submit("echo")
        explained = await stub.ExplainTask(scheduler_pb2.ExplainTaskRequest(id=held.id))
        status = await stub.GetStatus(scheduler_pb2.GetStatusRequest())
        assert explained.reasons[0] == "cost_hold"
        assert "activity type train is cost-deferrable and signal grid is 520" in explained.explanation
        assert "above its threshold of 400" in explained.explanation
        [default] = [q for q in status.queues if q.name == "default"]
        # Held work is counted apart from the claimable backlog.
        assert (default.held_depth, default.depth, default.cost_hold) == (1, 1, True)
        assert status.hold.active and status.hold.value == 520
        async with worker_for(pair, "train", "echo"):
            await pair.set_signal(150)
            done = await client.wait(held.id, timeout=timedelta(seconds=5))
        status = await stub.GetStatus(scheduler_pb2.GetStatusRequest())
    assert (done.signal_at_submit, done.signal_at_dispatch) == (520, 150)
    [train] = [c for c in status.carbon if c.activity_type == "train"]
    assert (train.mean_at_submit, train.mean_at_dispatch) == (520, 150)


async def test_release_below_keeps_holding_between_the_two_levels(signal: SignalServer, database_url: str) -> None:
    scheduler = await start_scheduler(cost_config(signal.target, release_below=300.0), database_url=database_url)
    pair = Pair(signal, scheduler, None)  # type: ignore[arg-type]
    try:
        from lowtide_client import SignalClient

        async with (
            SignalClient(signal.target) as signals,
            Client(scheduler.target) as client,
            worker_for(pair, "train"),
        ):
            await signals.set(520)
            task = await client.submit("train")
            await signals.set(350)  # under the threshold, over release_below
            await asyncio.sleep(0.4)
            assert await state_of(client, task.id) == (PENDING, 0)
            await signals.set(250)
            assert (await client.wait(task.id, timeout=timedelta(seconds=5))).state == COMPLETED
    finally:
        await scheduler.stop(grace=0.5)


async def test_dispatch_references_of_held_types_are_parked_then_released(pair: Pair) -> None:
    await pair.set_signal(520)
    async with Client(pair.scheduler.target) as client, worker_for(pair, "train"):
        await eventually(lambda: _connected(pair))
        task = await client.submit("train")
        await eventually(lambda: _parked(pair, 1))
        await pair.set_signal(100)
        await eventually(lambda: _parked(pair, 0))
        assert (await client.wait(task.id, timeout=timedelta(seconds=5))).state == COMPLETED


async def _connected(pair: Pair) -> bool:
    return len(pair.scheduler.registry) > 0


async def _parked(pair: Pair, count: int) -> bool:
    return len(pair.scheduler.dispatcher.parked) == count


async def test_a_hold_naming_a_local_activity_is_refused(pair: Pair, signal: SignalServer, database_url: str) -> None:
    bad = cost_config(signal.target, deferrable_activities=("inline",))
    with pytest.raises(ConfigError, match="local activity inline"):
        await start_scheduler(bad, database_url=database_url)

    async def hello(holds: dict[str, list[str]]) -> AsyncIterator[worker_pb2.WorkerMessage]:
        yield worker_pb2.WorkerMessage(
            hello=worker_pb2.Hello(
                worker_id="w-local",
                slots=1,
                activity_types=[
                    worker_pb2.ActivityType(name="sum"),
                    worker_pb2.ActivityType(name="lookup", local=True),
                ],
                **holds,  # type: ignore[arg-type]
            )
        )
        await asyncio.sleep(5)

    # A worker's own deferrable types, and the types its own predicate holds as it connects.
    for holds in ({"cost_deferrable_activities": ["lookup"]}, {"held_types": ["lookup"]}):
        async with grpc.aio.insecure_channel(pair.scheduler.target) as channel:
            call = worker_pb2_grpc.WorkerServiceStub(channel).Connect(hello(holds))
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async for _ in call:
                    pass
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION, holds
        assert "local activity lookup" in (caught.value.details() or ""), holds


def test_the_python_worker_refuses_a_hold_on_a_local_activity() -> None:
    worker = Worker(cost_deferrable_activities=["lookup"])
    worker.register("lookup", lambda payload: payload, local=True)
    with pytest.raises(ValueError, match="local activity lookup"):
        asyncio.run(worker.run())


async def test_metrics_show_held_work_apart_and_the_hold_gauge(pair: Pair) -> None:
    await pair.set_signal(520)
    async with Client(pair.scheduler.target) as client:
        await client.submit_many([task_spec("train") for _ in range(3)] + [task_spec("echo")])
    port = pair.scheduler.metrics.metrics.port
    assert port

    async def scrape() -> str:
        def get() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                return str(response.read().decode())

        text = await asyncio.to_thread(get)
        return text if 'lowtide_queue_held_depth{queue="default"} 3.0' in text else ""

    text = await eventually(scrape)
    assert 'lowtide_queue_depth{queue="default"} 1.0' in text
    assert 'lowtide_cost_hold{queue="default",signal="grid"} 1.0' in text


async def test_a_worker_predicate_holds_from_the_moment_it_connects(pair: Pair) -> None:
    # Work of a type the worker's own hold holds is pending before the worker connects: none of
    # it may be claimed for the worker, not even in the moment after its Hello.
    await pair.set_signal(50)
    async with Client(pair.scheduler.target) as client:
        held = [s.id for s in await client.submit_many([task_spec("render") for _ in range(20)])]
        worker = worker_for(
            pair,
            "render",
            "echo",
            slots=20,
            cost_holds=[CostHold(lambda: True, ["render"])],
            hold_check_interval=timedelta(milliseconds=50),
        )
        async with worker:
            echo = await client.submit("echo")
            assert (await client.wait(echo.id, timeout=timedelta(seconds=60))).state == COMPLETED
            assert [await state_of(client, task_id) for task_id in held] == [(PENDING, 0)] * len(held)


class _OlderScheduler(worker_pb2_grpc.WorkerServiceServicer):
    """A scheduler from before Hello.held_types: it welcomes a worker and records what the worker
    sends on the stream, and reads nothing from the Hello but that it came."""

    def __init__(self) -> None:
        self.received: list[worker_pb2.WorkerMessage] = []

    async def Connect(
        self, request_iterator: AsyncIterator[worker_pb2.WorkerMessage], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[worker_pb2.SchedulerMessage]:
        welcome = worker_pb2.Welcome(worker_id="older")
        welcome.heartbeat_interval.FromSeconds(5)
        welcome.lease_timeout.FromSeconds(30)
        reader = asyncio.ensure_future(self._read(request_iterator))
        try:
            yield worker_pb2.SchedulerMessage(welcome=welcome)
            await reader
        finally:
            reader.cancel()

    async def _read(self, request_iterator: AsyncIterator[worker_pb2.WorkerMessage]) -> None:
        async for message in request_iterator:
            self.received.append(message)


async def test_an_older_scheduler_still_learns_a_workers_holds_from_its_first_hold_update() -> None:
    # The Hello names the held types now, but a scheduler that predates the field ignores it; the
    # worker must still tell it in a HoldUpdate after the Welcome, or its held work would run there.
    older = _OlderScheduler()
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(older, server)
    async with on_loopback(server) as target:
        worker = Worker(
            target=target,
            slots=2,
            cost_holds=[CostHold(lambda: True, ["render"])],
            hold_check_interval=timedelta(seconds=60),
        )
        worker.register("render", lambda payload: payload)
        async with worker:

            async def hold_updates() -> list[list[str]]:
                return [list(m.hold_update.held_types) for m in older.received if m.HasField("hold_update")]

            await eventually(hold_updates, within=30)
            kinds = [m.WhichOneof("message") for m in older.received]
        assert kinds[0] == "hello"
        assert list(older.received[0].hello.held_types) == ["render"]
        assert (await hold_updates())[0] == ["render"]


async def test_a_held_type_no_connected_worker_registers_is_said_once(
    pair: Pair, caplog: pytest.LogCaptureFixture
) -> None:
    """The hold names `train` (everywhere) and `index` (queue batch): while a worker registering
    `train` is connected, two registering neither connect in turn; only `index` is said to have
    no worker, and once."""
    caplog.set_level(logging.WARNING, logger="lowtide.scheduler.workers")

    def worker(name: str) -> Worker:
        made = Worker(target=pair.scheduler.target, queues=["default", "batch"], slots=1)
        made.register(name, lambda payload: payload)
        return made

    async def connected(count: int) -> bool:
        return len(pair.scheduler.registry) == count

    async with worker("train"):
        await eventually(lambda: connected(1))
        for _ in range(2):
            async with worker("echo"):
                await eventually(lambda: connected(2))
            await eventually(lambda: connected(1))
    said = [r.__dict__.get("activity_type") for r in caplog.records if r.getMessage() == "cost_hold.unregistered_type"]
    assert said == ["index"]
