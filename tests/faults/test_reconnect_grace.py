"""A worker's stream cut by the network while it runs attempts (a proxy's reset, a blip): with a
reconnect grace the worker reconnects, lists the attempts and keeps them, so each runs once;
without one (the default) they are given up at the cut and run again. A worker that does not come
back loses them when the grace runs out, to this replica or, once it has reconnected elsewhere,
to none. A stream the scheduler ended, or the worker left (no slots asked, then closed), is not
waited for."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import pytest

from lowtide_client import Client, TaskState, Worker
from lowtide_proto.lowtide.v1 import worker_pb2
from scheduler_service.server import Scheduler, start_scheduler
from tests.conftest import make_config
from tests.deploy.node import ensure_node_modules, node_or_skip
from tests.faults.support import RawWorker, Relay, kill_all, nap_worker
from tests.helpers import eventually, scrape_metrics

COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")
RUNNING = TaskState.Value("TASK_STATE_RUNNING")
PENDING = TaskState.Value("TASK_STATE_PENDING")
# Long enough that only the stream's end (or the grace) can release an attempt in these tests.
LEASE = timedelta(seconds=120)


@asynccontextmanager
async def _scheduler(database_url: str, grace: timedelta) -> AsyncIterator[Scheduler]:
    config = make_config(lease_timeout=LEASE, heartbeat_interval=timedelta(seconds=1), reconnect_grace=grace)
    scheduler = await start_scheduler(config, database_url=database_url)
    try:
        yield scheduler
    finally:
        await scheduler.stop(grace=1.0)


class _Held:
    """An in-process worker whose `hold` activity records each run and waits to be let go."""

    def __init__(self, target: str, worker_id: str) -> None:
        self.worker_id = worker_id
        self.runs: list[bytes] = []
        self.cancelled = 0
        self.go = asyncio.Event()
        self.worker = Worker(target=target, worker_id=worker_id, slots=2)
        self.worker.register("hold", self._hold)
        self._running: asyncio.Task[None] | None = None

    async def _hold(self, payload: bytes) -> bytes:
        self.runs.append(payload)
        try:
            await self.go.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return b"done " + payload

    async def __aenter__(self) -> _Held:
        self._running = asyncio.create_task(self.worker.run())
        return self

    async def __aexit__(self, *_: object) -> None:
        self.worker.stop()
        assert self._running is not None
        await asyncio.gather(self._running, return_exceptions=True)


def _connected(scheduler: Scheduler, worker_id: str) -> bool:
    return scheduler.registry.get(worker_id) is not None


def _now(check: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    """A probe for `eventually` of a condition read in this process."""

    async def probe() -> bool:
        return check()

    return probe


@pytest.mark.parametrize(
    ("grace", "attempts", "runs"),
    [(timedelta(0), 2, 2), (timedelta(seconds=30), 1, 1)],
    ids=["no grace (the default)", "a 30 s grace"],
)
async def test_an_attempt_cut_off_by_the_network_runs_once_within_the_reconnect_grace(
    database_url: str, grace: timedelta, attempts: int, runs: int
) -> None:
    async with _scheduler(database_url, grace) as scheduler:
        path = Relay(scheduler.target)
        target = await path.start()
        try:
            async with Client(scheduler.target) as client, _Held(target, "blip") as held:
                task = await client.submit("hold", b"x", max_attempts=3, initial_backoff=timedelta(milliseconds=50))
                await eventually(_now(lambda: held.runs == [b"x"]), within=30)
                assert path.cut() > 0

                # The worker reconnects through the same path, its attempt listed in its hello.
                await eventually(_now(lambda: path.connections >= 2 and _connected(scheduler, "blip")), within=30)
                if attempts == 2:
                    # Given up at the cut: the scheduler stops the listed attempt, and runs it again.
                    await eventually(_now(lambda: held.cancelled == 1 and len(held.runs) == 2), within=30)
                held.go.set()

                async def completed() -> bool:
                    return (await client.get(task.id)).state == COMPLETED

                await eventually(completed, within=30)
                done = await client.get(task.id)
                assert (done.attempt, done.result) == (attempts, b"done x")
                assert held.runs == [b"x"] * runs
                assert done.last_failure.error_type == ("WorkerLost" if attempts == 2 else "")

            # The cut is counted with what followed it, for whoever tunes the grace.
            outcome = "released" if attempts == 2 else "reconnected"
            line = f'lowtide_worker_stream_cut_total{{outcome="{outcome}"}} 1.0'
            port = scheduler.metrics.metrics.port
            assert port is not None

            async def counted() -> bool:
                return line in await asyncio.to_thread(scrape_metrics, port)

            await eventually(counted, within=15)
        finally:
            await path.close()


async def test_a_worker_that_does_not_come_back_loses_its_attempt_when_the_grace_runs_out(database_url: str) -> None:
    grace = timedelta(seconds=2)
    async with _scheduler(database_url, grace) as scheduler, Client(scheduler.target) as client:
        task = await client.submit("hold", b"y", max_attempts=3, initial_backoff=timedelta(milliseconds=50))
        raw = RawWorker(scheduler.target, "gone", activity="hold")
        await raw.connect()
        message = await raw.read()
        assert message.WhichOneof("message") == "assignments"
        loop = asyncio.get_running_loop()
        await raw.close()  # the call cancelled: as a cut, to the scheduler
        gone_at = loop.time()
        assert (await client.get(task.id)).state == RUNNING

        async with _Held(scheduler.target, "next") as held:
            held.go.set()

            async def completed() -> bool:
                return (await client.get(task.id)).state == COMPLETED

            await eventually(completed, within=30)
            # Not before the grace: the attempt waited for its worker that long (the scheduler
            # runs in this event loop, so its clock is this one).
            assert loop.time() - gone_at >= grace.total_seconds()
        done = await client.get(task.id)
        assert (done.attempt, done.last_failure.error_type) == (2, "WorkerLost")
        assert held.runs == [b"y"]


@pytest.mark.parametrize("how", ["ended by the scheduler", "left by the worker"])
async def test_a_stream_that_did_not_break_is_not_waited_for(database_url: str, how: str) -> None:
    # The grace is longer than the test may wait: only a release at the stream's end passes.
    async with _scheduler(database_url, timedelta(seconds=100)) as scheduler, Client(scheduler.target) as client:
        task = await client.submit("hold", b"z", max_attempts=3, initial_backoff=timedelta(hours=1))
        raw = RawWorker(scheduler.target, "leaves", activity="hold")
        try:
            await raw.connect()
            assert (await raw.read()).WhichOneof("message") == "assignments"
            if how == "ended by the scheduler":
                await raw.call.write(worker_pb2.WorkerMessage(hello=raw.hello))  # a second hello: refused
            else:
                # How a worker leaves: it asks for no slots, then closes its side of the stream.
                await raw.call.write(worker_pb2.WorkerMessage(slot_update=worker_pb2.SlotUpdate(slots=0)))
                await raw.call.done_writing()

            async def released() -> bool:
                now = await client.get(task.id)
                return now.state == PENDING and now.last_failure.error_type == "WorkerLost"

            await eventually(released, within=30)
        finally:
            await raw.close()


async def test_a_worker_back_on_another_replica_keeps_its_attempt_when_the_first_one_s_grace_runs_out(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="lowtide.scheduler.workers")
    grace = timedelta(seconds=3)
    async with _scheduler(database_url, grace) as first, _scheduler(database_url, grace) as second:
        path = Relay(first.target)
        target = await path.start()
        try:
            async with Client(first.target) as client, _Held(target, "mover") as held:
                task = await client.submit("hold", b"m", max_attempts=3, initial_backoff=timedelta(milliseconds=50))
                await eventually(_now(lambda: held.runs == [b"m"]), within=30)
                # The load balancer sends the worker's next connection to the other replica.
                path.upstream = second.target
                assert path.cut() > 0
                await eventually(_now(lambda: _connected(second, "mover")), within=30)

                def first_gave_up() -> bool:
                    return any(
                        r.getMessage() == "worker.disconnected" and getattr(r, "worker_id", None) == "mover"
                        for r in caplog.records
                    )

                # The first replica's grace runs out; the attempt is the other replica's by then.
                await eventually(_now(first_gave_up), within=30)
                gone = [r for r in caplog.records if r.getMessage() == "worker.disconnected"]
                assert [getattr(r, "lost", None) for r in gone] == [0]
                assert (await client.get(task.id)).state == RUNNING
                held.go.set()

                async def completed() -> bool:
                    return (await client.get(task.id)).state == COMPLETED

                await eventually(completed, within=30)
                done = await client.get(task.id)
                assert (done.attempt, done.result, held.runs) == (1, b"done m", [b"m"])
        finally:
            await path.close()


async def test_a_node_worker_cut_off_by_the_network_keeps_its_attempt_within_the_grace(
    database_url: str, tmp_path: Path
) -> None:
    # The Node library lists its running attempts in the hello of its next stream too.
    node = node_or_skip()
    await ensure_node_modules()
    log = tmp_path / "node.log"

    def text() -> str:
        return log.read_text() if log.exists() else ""

    async with _scheduler(database_url, timedelta(seconds=30)) as scheduler, Client(scheduler.target) as client:
        path = Relay(scheduler.target)
        target = await path.start()
        process = nap_worker(node, target, "node-blip", log, nap_ms=4000)
        try:
            task = await client.submit("n_nap", b"n", max_attempts=3, initial_backoff=timedelta(milliseconds=50))
            await eventually(_now(lambda: "started n" in text()), within=60)
            assert path.cut() > 0
            await eventually(_now(lambda: text().count("welcome node-blip") == 2), within=30)

            async def completed() -> bool:
                return (await client.get(task.id)).state == COMPLETED

            await eventually(completed, within=30)
            done = await client.get(task.id)
            assert (done.attempt, done.result, text().count("started n")) == (1, b"n", 1), text()
        finally:
            kill_all([process])
            await path.close()
