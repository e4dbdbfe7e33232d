"""What the scheduler records a worker as running is checked against what the worker runs: an
attempt the worker does not hold (its assignment lost on the way, or its claim's answer lost with
the database connection, so never sent) is put back, its attempt not counted, and handed out again
within about a lease; an assignment still on its way when the worker reported is not."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import grpc
import psycopg
import pytest

from lowtide_client import Client, TaskState
from lowtide_proto.lowtide.v1 import task_pb2, worker_pb2
from scheduler_service.server import Scheduler, start_scheduler
from tests.conftest import make_config
from tests.faults.support import RawWorker
from tests.helpers import eventually, scrape_metrics

COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")
# make_config's lease: whatever a worker does not hold is handed out again within about this.
LEASE = timedelta(seconds=2)


class Listening:
    """A RawWorker whose stream is read in the background, so the test may write heartbeats
    (one writer) while it waits for what the scheduler sends."""

    def __init__(self, raw: RawWorker) -> None:
        self.raw = raw
        self.assignments: asyncio.Queue[task_pb2.TaskRef] = asyncio.Queue()
        self.rejected: list[tuple[int, int]] = []
        self._reader: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while (message := await self.raw.call.read()) is not grpc.aio.EOF:
            kind = message.WhichOneof("message")
            if kind == "assignments":
                for assignment in message.assignments.assignments:
                    self.assignments.put_nowait(assignment.task)
            elif kind == "rejected":
                self.rejected += [(r.task.task_id, r.task.attempt) for r in message.rejected.reports]

    async def beat(self, running: list[tuple[int, int]], read: int | None) -> None:
        refs = [task_pb2.TaskRef(task_id=t, attempt=a) for t, a in running]
        heartbeat = worker_pb2.Heartbeat(running=refs)
        if read is not None:
            heartbeat.assignments_read = read
        await self.raw.call.write(worker_pb2.WorkerMessage(heartbeat=heartbeat))

    async def next_assignment(self, running: list[tuple[int, int]], read: int) -> tuple[int, int]:
        """Heartbeats (listing `running`, having read `read`) until the next assignment comes."""

        async def assigned() -> task_pb2.TaskRef | None:
            if self.assignments.empty():
                await self.beat(running, read)
                return None
            return self.assignments.get_nowait()

        # About a lease (two looks half a lease apart), on a loaded machine: ten.
        ref = await eventually(assigned, within=10 * LEASE.total_seconds(), interval=0.1)
        assert ref is not None
        return (ref.task_id, ref.attempt)

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        await self.raw.close()


@pytest.fixture
async def scheduler(database_url: str) -> AsyncIterator[Scheduler]:
    running = await start_scheduler(make_config(lease_timeout=LEASE), database_url=database_url)
    yield running
    await running.stop(grace=0.5)


@pytest.fixture
async def worker(scheduler: Scheduler) -> AsyncIterator[Listening]:
    listening = Listening(RawWorker(scheduler.target, "forgetful", slots=1))
    await listening.raw.connect()
    listening.start()
    yield listening
    await listening.close()


async def test_an_assignment_the_worker_says_it_does_not_hold_is_handed_out_again_uncounted(
    scheduler: Scheduler, worker: Listening
) -> None:
    async with Client(scheduler.target) as client:
        task = await client.submit("count", "1", max_attempts=1)
        first = await worker.next_assignment([], read=0)
        assert first == (task.id, 1)
        # Lost on the way: the worker read one assignment and holds nothing.
        again = await worker.next_assignment([], read=1)
        # Handed out again as the same attempt: the lost one never ran, so it is not counted (with
        # max_attempts=1, a counted one would have failed the task).
        assert again == (task.id, 1)
        await worker.raw.report([again])
        done = await client.wait(task.id, timeout=timedelta(seconds=30))
        assert (done.state, done.attempt) == (COMPLETED, 1)
        assert worker.rejected == []


async def test_an_assignment_still_on_its_way_when_the_worker_reported_stays_its_own(
    scheduler: Scheduler, worker: Listening
) -> None:
    async with Client(scheduler.target) as client:
        task = await client.submit("count", "1")
        ref = await worker.next_assignment([], read=0)
        # Written before the assignment reached it: it had read none, so the list says nothing of it.
        for _ in range(3):
            await worker.beat([], read=0)
            await asyncio.sleep(LEASE.total_seconds() / 2)
        await worker.raw.report([ref], result=b"mine")
        done = await client.wait(task.id, timeout=timedelta(seconds=30))
        assert (done.state, done.attempt, done.result) == (COMPLETED, 1, b"mine")
        assert worker.rejected == []
        assert worker.assignments.empty()


async def test_an_attempt_recorded_for_the_worker_but_never_sent_is_handed_out_again_within_a_lease(
    scheduler: Scheduler, worker: Listening, database_url: str
) -> None:
    async with Client(scheduler.target) as client:
        busy = await client.submit("count", "busy")
        assert await worker.next_assignment([], read=0) == (busy.id, 1)
        stray = await client.submit("count", "stray", max_attempts=1)
        # What a claim whose commit's answer was lost leaves: the row is the worker's, its
        # session never sent it (the worker's one slot is taken, so no claim would take it).
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            await conn.execute(
                "UPDATE lowtide.tasks SET state = 'running', attempt = attempt + 1, worker_id = 'forgetful', "
                "started_at = now() WHERE id = %(id)s",
                {"id": stray.id},
            )
        await worker.raw.report([(busy.id, 1)])
        ref = await worker.next_assignment([], read=1)
        assert ref == (stray.id, 1)
        await worker.raw.report([ref])
        done = await client.wait(stray.id, timeout=timedelta(seconds=30))
        assert (done.state, done.attempt) == (COMPLETED, 1)
    # An operator sees the sweep's work in the metrics, not only in the logs.
    port = scheduler.metrics.metrics.port
    assert port is not None

    async def counted() -> bool:
        return "lowtide_dispatch_strays_returned_total 1.0" in await asyncio.to_thread(scrape_metrics, port)

    await eventually(counted, within=15)
