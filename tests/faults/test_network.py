"""Fault 6: trouble on the worker stream. A stream cut in the middle of its results, a worker
that stops reading while work is due, and a client that opens thousands of streams."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import grpc
import pytest

from lowtide_client import Client, TaskState, Worker, task_spec
from lowtide_proto.lowtide.v1 import task_pb2, worker_pb2, worker_pb2_grpc
from scheduler_service.fleet.sessions import MAX_OUTBOX
from scheduler_service.server import Scheduler, start_scheduler
from tests.conftest import make_config
from tests.deploy.node import ensure_node_modules, node_or_skip
from tests.faults.support import RawWorker, connected_workers, counting_worker, kill_all, nap_worker, serving, states
from tests.helpers import eventually, on_loopback

COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")


async def assignments(raw: RawWorker, count: int) -> list[worker_pb2.Assignment]:
    got: list[worker_pb2.Assignment] = []
    while len(got) < count:
        message = await raw.read()
        if message.WhichOneof("message") == "assignments":
            got.extend(message.assignments.assignments)
    return got


async def test_a_stream_cut_mid_results_keeps_what_was_reported(
    scheduler: Scheduler, database_url: str, tmp_path: Path
) -> None:
    processes: list[subprocess.Popen[bytes]] = []
    raw = RawWorker(scheduler.target, "cut-off", slots=4)
    try:
        await raw.connect()
        async with Client(scheduler.target) as client:
            tasks = await client.submit_many(task_spec("count", str(i)) for i in range(4))
            held = await assignments(raw, 4)
            refs = [(a.task.task_id, a.task.attempt) for a in held]
            reported, unreported = refs[:2], refs[2:]
            await raw.report(reported, result=b"raw")

            # The scheduler has the two results (they are applied) when the stream is cut.
            async def applied() -> bool:
                got = [await client.get(t) for t, _ in reported]
                return all(g.state == COMPLETED for g in got)

            await eventually(applied, within=10)
            await raw.close()

            # The other two go to the next worker as new attempts; the two reported do not run again.
            out = tmp_path / "count.txt"
            processes.append(
                counting_worker(scheduler.target, out, slots=4, worker_id="next", log=tmp_path / "worker.log")
            )

            async def all_completed() -> bool:
                got = [await client.get(t.id) for t in tasks]
                return all(g.state == COMPLETED for g in got)

            await eventually(all_completed, within=30, interval=0.1)
            for task_id, _ in reported:
                got = await client.get(task_id)
                assert (got.attempt, got.result) == (1, b"raw")
            for task_id, _ in unreported:
                got = await client.get(task_id)
                assert got.attempt == 2 and got.last_failure.error_type == "WorkerLost"
            ran = sorted(out.read_text().split())
            assert ran == sorted([(await client.get(t)).payload.decode() for t, _ in unreported])
    finally:
        await raw.close()
        kill_all(processes)


async def test_a_worker_that_stops_reading_is_not_buffered_for_without_bound(
    scheduler: Scheduler, database_url: str, tmp_path: Path
) -> None:
    processes: list[subprocess.Popen[bytes]] = []
    raw = RawWorker(scheduler.target, "deaf", slots=3)
    try:
        await raw.connect()
        session = scheduler.registry.get("deaf")
        assert session is not None
        processes.append(
            counting_worker(
                scheduler.target, tmp_path / "count.txt", slots=8, worker_id="reader", log=tmp_path / "w.log"
            )
        )
        await eventually(lambda: connected_workers(database_url), within=30, interval=0.1)
        # It still heartbeats, so its lease (2 s here) outlasts the rest of the work however slow
        # a loaded machine makes that: what it holds stays held because it is alive, not read.
        beats = asyncio.create_task(raw.beat(0.3))
        async with Client(scheduler.target) as client:
            await client.submit_many(task_spec("count", str(i)) for i in range(300))

            # The reading worker does the work the deaf one cannot take.
            async def rest_done() -> bool:
                return (await states(database_url)).get("completed", 0) == 297

            await eventually(rest_done, within=60, interval=0.2)
        beats.cancel()
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await beats
        # The deaf worker was given its 3 slots' worth and no more.
        assert len(session.in_flight) == 3
        waiting: list[worker_pb2.SchedulerMessage] = list(session.outbox._queue)  # type: ignore[attr-defined]
        queued = sum(len(m.assignments.assignments) for m in waiting)
        assert queued <= 3

        # Nor do its own reports fill the scheduler: each stale report is answered with a
        # rejection the deaf worker never reads. The scheduler gives up on it instead.
        bogus = [task_pb2.TaskRef(task_id=10**9 + n, attempt=1) for n in range(100)]
        flood = worker_pb2.WorkerMessage(
            results=worker_pb2.Results(results=[worker_pb2.TaskResult(task=r, success=b"x") for r in bogus])
        )
        most = 0
        for _ in range(3000):
            if raw.call.done():
                break
            try:
                await asyncio.wait_for(raw.call.write(flood), 5)
            except (asyncio.InvalidStateError, grpc.aio.AioRpcError, TimeoutError):
                break
            most = max(most, session.outbox.qsize())
        assert most <= MAX_OUTBOX + 2 * 3
        # The scheduler ended the deaf worker's stream (RESOURCE_EXHAUSTED; the worker, not
        # reading, never sees it) and gave its three attempts to the worker that reads.
        await eventually(lambda: asyncio.sleep(0, scheduler.registry.get("deaf") is None), within=10)

        async def everything_done() -> bool:
            return (await states(database_url)).get("completed", 0) == 300

        await eventually(everything_done, within=30, interval=0.1)
        assert await serving(scheduler.target)
    finally:
        await raw.close()
        kill_all(processes)


@pytest.fixture
async def patient_scheduler(database_url: str) -> AsyncIterator[Scheduler]:
    """A scheduler whose leases outlast a busy moment: 2,000 streams opened by the test process,
    which runs this scheduler too, can hold its event loop past the usual 2 s test lease, and a
    lost lease would fail the test for a reason that is not the one it is about."""
    config = make_config(lease_timeout=timedelta(seconds=20), leader_lease=timedelta(seconds=20))
    running = await start_scheduler(config, database_url=database_url)
    yield running
    await running.stop(grace=1.0)


@pytest.mark.slow
async def test_thousands_of_streams_from_one_client_do_not_crowd_out_others(
    patient_scheduler: Scheduler, tmp_path: Path
) -> None:
    scheduler = patient_scheduler
    processes: list[subprocess.Popen[bytes]] = []
    channel = grpc.aio.insecure_channel(scheduler.target)
    calls = []
    try:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        for n in range(2000):
            call = stub.Connect()
            calls.append(call)
            hello = worker_pb2.Hello(
                worker_id=f"crowd-{n}", slots=1, activity_types=[worker_pb2.ActivityType(name="never")]
            )
            await call.write(worker_pb2.WorkerMessage(hello=hello))
        processes.append(
            counting_worker(
                scheduler.target, tmp_path / "count.txt", slots=4, worker_id="other", log=tmp_path / "w.log"
            )
        )
        async with Client(scheduler.target) as client:
            task = await client.submit("count", payload=b"served")
            done = await client.wait(task.id, timeout=timedelta(seconds=60))
            assert done.state == COMPLETED
        assert await serving(scheduler.target)
    finally:
        for call in calls:
            call.cancel()
        await channel.close()
        kill_all(processes)


class _EndsUnderLoad(worker_pb2_grpc.WorkerServiceServicer):
    """Plays a scheduler that ends each worker stream while the worker is busy writing: it hands
    out a burst of no-op work of `activity`, so results are on their way, and ends the stream a
    few milliseconds later with `code` (UNAVAILABLE, as a stopping scheduler does; or INTERNAL,
    as a proxy in front does when its connection to the scheduler resets)."""

    BURST = 1_000

    def __init__(self, code: grpc.StatusCode, activity: str = "count") -> None:
        self.code = code
        self.activity = activity
        self.streams = 0

    # Written with context.write() rather than as a generator, so the stub's signature differs.
    async def Connect(  # type: ignore[override]
        self, request_iterator: AsyncIterator[worker_pb2.WorkerMessage], context: grpc.aio.ServicerContext
    ) -> None:
        await anext(request_iterator)
        self.streams += 1
        welcome = worker_pb2.Welcome(worker_id="under-load")
        welcome.heartbeat_interval.FromSeconds(5)
        welcome.lease_timeout.FromSeconds(30)
        await context.write(worker_pb2.SchedulerMessage(welcome=welcome))
        first = (self.streams - 1) * self.BURST
        for start in range(first, first + self.BURST, 50):
            refs = [task_pb2.TaskRef(task_id=i + 1, attempt=1) for i in range(start, start + 50)]
            work = [worker_pb2.Assignment(task=ref, activity_type=self.activity) for ref in refs]
            await context.write(worker_pb2.SchedulerMessage(assignments=worker_pb2.Assignments(assignments=work)))
        reading = asyncio.ensure_future(self._read(request_iterator))
        await asyncio.sleep(0.005)
        reading.cancel()
        if self.code == grpc.StatusCode.INTERNAL:
            await context.abort(self.code, "Received RST_STREAM with error code 2")
        await context.abort(self.code, "the scheduler is shutting down")

    async def _read(self, request_iterator: AsyncIterator[worker_pb2.WorkerMessage]) -> None:
        async for _ in request_iterator:
            pass


@asynccontextmanager
async def _serving(scheduler: _EndsUnderLoad) -> AsyncIterator[str]:
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(scheduler, server)
    async with on_loopback(server) as target:
        yield target


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL], ids=lambda c: c.name)
async def test_a_worker_whose_stream_ends_while_it_writes_connects_again(code: grpc.StatusCode) -> None:
    # An UNAVAILABLE end can reach the worker as INTERNAL ("Internal error from Core") when a
    # write of its failed as the stream ended (grpc/grpc#36066), and a proxy's reset is INTERNAL
    # anyway. The worker must take either for the ended stream it is and connect again, every
    # time, rather than stop with an error. Five ends in a row (before the worker knew, about two
    # in three of the UNAVAILABLE ones stopped it).
    scheduler = _EndsUnderLoad(code)
    async with _serving(scheduler) as target:
        worker = Worker(target=target, slots=_EndsUnderLoad.BURST)
        worker.register("count", lambda payload: payload)
        running = asyncio.create_task(worker.run())
        try:

            async def ended_five_times() -> bool:
                if running.done():
                    raise AssertionError(f"the worker stopped: {running.exception()!r}")
                return scheduler.streams > 5

            await eventually(ended_five_times, within=60)
        finally:
            worker.stop()
            await asyncio.gather(running, return_exceptions=True)


async def test_a_node_worker_whose_stream_ends_with_internal_connects_again(tmp_path: Path) -> None:
    node = node_or_skip()
    await ensure_node_modules()
    scheduler = _EndsUnderLoad(grpc.StatusCode.INTERNAL, activity="n_nap")
    log = tmp_path / "node.log"
    async with _serving(scheduler) as target:
        process = nap_worker(node, target, "under-load", log, nap_ms=0)
        try:

            async def ended_three_times() -> bool:
                if process.poll() is not None:
                    raise AssertionError(f"the worker stopped: {log.read_text(errors='replace')}")
                return scheduler.streams > 3

            await eventually(ended_three_times, within=60)
        finally:
            kill_all([process])
