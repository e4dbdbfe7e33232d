"""Idle workers beat every Welcome.idle_heartbeat_interval, busy ones every heartbeat_interval
(issue 15): an idle worker keeps its lease between its rarer beats and still gets work; a silent
idle worker is still dropped, after the idle interval plus the lease; work sent to a worker that
went silent while idle is lost `lease_timeout` after it was sent, as for any busy worker; and the
heartbeats of many busy workers push their attempts' heartbeat deadlines in one statement."""

from __future__ import annotations

import asyncio
import itertools
from datetime import timedelta

import grpc

from lowtide_client import Client, TaskState, Worker
from lowtide_proto.lowtide.v1 import task_pb2, worker_pb2
from scheduler_service.server import Scheduler, start_scheduler
from tests.conftest import make_config
from tests.faults.support import RawWorker, query
from tests.helpers import eventually

RUNNING = TaskState.Value("TASK_STATE_RUNNING")
COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")

LEASE = timedelta(seconds=2)
BUSY = timedelta(milliseconds=300)


async def _scheduler(database_url: str, idle: timedelta) -> Scheduler:
    config = make_config(lease_timeout=LEASE, heartbeat_interval=BUSY, idle_heartbeat_interval=idle)
    return await start_scheduler(config, database_url=database_url)


async def _lease_left(database_url: str, worker_id: str) -> float:
    """Seconds of lease the worker has in the database (0 when it has none left)."""
    rows = await query(
        database_url,
        "SELECT extract(epoch FROM lease_expires_at - now())::float8 FROM lowtide.workers"
        f" WHERE id = '{worker_id}' AND lease_expires_at > now()",
    )
    return float(rows[0][0]) if rows else 0.0  # type: ignore[arg-type]


async def _assignment(raw: RawWorker) -> task_pb2.TaskRef:
    while (message := await raw.read()).WhichOneof("message") != "assignments":
        pass
    ref: task_pb2.TaskRef = message.assignments.assignments[0].task
    return ref


def _beat(*refs: task_pb2.TaskRef) -> worker_pb2.WorkerMessage:
    return worker_pb2.WorkerMessage(heartbeat=worker_pb2.Heartbeat(running=list(refs)))


async def test_an_idle_worker_beating_at_the_idle_interval_keeps_its_lease_and_gets_work(database_url: str) -> None:
    """Beats 2.5 s apart with a 2 s lease: an idle worker is not dropped between them."""
    idle = timedelta(milliseconds=2500)
    scheduler = await _scheduler(database_url, idle)
    raw = RawWorker(scheduler.target, "idle-beater")
    try:
        welcome = await raw.connect()
        assert welcome.idle_heartbeat_interval.ToTimedelta() == idle
        assert welcome.heartbeat_interval.ToTimedelta() == BUSY
        for _ in range(3):
            # The worker's own cadence (what a worker that runs nothing does), not a wait for the test.
            await asyncio.sleep(idle.total_seconds())
            await raw.call.write(_beat())
        # 7.5 s after its hello, almost four leases: still connected (its lease runs past its next
        # beat), and given work.
        assert await _lease_left(database_url, "idle-beater") > 1.0
        async with Client(scheduler.target) as client:
            task = await client.submit("count", "1", max_attempts=1)
            ref = await _assignment(raw)
            assert ref.task_id == task.id
            await raw.report([(ref.task_id, ref.attempt)], result=b"after idling")
            done = await client.wait(task.id, timeout=timedelta(seconds=10))
        assert (done.state, done.attempt, done.result) == (COMPLETED, 1, b"after idling")
    finally:
        await raw.close()
        await scheduler.stop(grace=0.5)


async def test_a_silent_idle_worker_is_dropped_after_the_idle_interval_and_its_lease(database_url: str) -> None:
    scheduler = await _scheduler(database_url, timedelta(seconds=2))
    raw = RawWorker(scheduler.target, "idle-silent")
    try:
        await raw.connect()

        async def dropped() -> bool:
            return await _lease_left(database_url, "idle-silent") == 0.0

        # Its lease (idle 2 s + lease 2 s from its hello) runs out: it is given no work.
        await eventually(dropped, within=30)
        async with Client(scheduler.target) as client:
            task = await client.submit("count", "1", max_attempts=1)
            status = await client.status()
            assert sum(p.workers for p in status.pools) == 0, status.pools
            # Its next heartbeat ends its stream: connect again with a new Hello.
            await raw.call.write(_beat())
            try:
                while (await raw.read()).WhichOneof("message") != "assignments":
                    pass
                raise AssertionError("a dropped worker was given work")
            except grpc.aio.AioRpcError as ended:
                assert ended.code() == grpc.StatusCode.UNAVAILABLE
                assert "lease ran out" in (ended.details() or "")
            assert (await client.get(task.id)).attempt == 0
    finally:
        await raw.close()
        await scheduler.stop(grace=0.5)


async def test_work_sent_to_a_worker_silent_since_it_idled_is_lost_after_lease_timeout(database_url: str) -> None:
    """Idle lease 32 s, busy lease 2 s: the work is lost well before the idle lease runs out."""
    scheduler = await _scheduler(database_url, timedelta(seconds=30))
    raw = RawWorker(scheduler.target, "idle-then-silent")
    try:
        await raw.connect()

        async def idle_lease() -> bool:
            return await _lease_left(database_url, "idle-then-silent") > 20

        await eventually(idle_lease, within=10)
        async with Client(scheduler.target) as client:
            task = await client.submit("count", "1", max_attempts=2, initial_backoff=timedelta(seconds=60))
            ref = await _assignment(raw)
            assert ref.task_id == task.id

            async def lost() -> bool:
                now = await client.get(task.id)
                return now.attempt == 1 and now.last_failure.error_type == "WorkerLost"

            await eventually(lost, within=15)
    finally:
        await raw.close()
        await scheduler.stop(grace=0.5)


async def test_a_python_worker_beats_at_the_idle_interval_and_at_the_busy_one_while_it_runs(
    database_url: str,
) -> None:
    """Idle interval 3 s (lease 2 s): between tasks the worker's heartbeats come seconds apart, not
    every 300 ms; a task running twice the lease still completes on its first attempt."""
    scheduler = await _scheduler(database_url, timedelta(seconds=3))
    beats: list[float] = []
    try:
        async with Worker(target=scheduler.target, worker_id="py-idle", slots=1) as worker:

            async def nap(payload: bytes) -> bytes:
                await asyncio.sleep(float(payload))
                return payload

            worker.register("nap", nap)

            async def heard_twice_idle() -> bool:
                session = scheduler.registry.get("py-idle")
                if session is not None and session.lease.heard_at not in beats:
                    beats.append(session.lease.heard_at)
                return len(beats) >= 3

            await eventually(heard_twice_idle, within=30, interval=0.02)
            gaps = [later - earlier for earlier, later in itertools.pairwise(beats)]
            assert min(gaps) > 1.5, gaps
            async with Client(scheduler.target) as client:
                task = await client.submit("nap", "4", max_attempts=1)
                done = await client.wait(task.id, timeout=timedelta(seconds=30))
            assert (done.state, done.attempt) == (COMPLETED, 1), done
    finally:
        await scheduler.stop(grace=0.5)


async def test_the_heartbeats_of_many_busy_workers_push_their_deadlines_in_one_statement(database_url: str) -> None:
    """Twenty workers, each running an attempt with a 1 s heartbeat timeout, beat together every
    300 ms: their attempts outlive the timeout several times over, in far fewer statements than
    heartbeats; the one worker that stops listing its attempt loses it as HeartbeatTimeout."""
    scheduler = await _scheduler(database_url, timedelta(seconds=30))
    raws = [RawWorker(scheduler.target, f"busy-{i}") for i in range(20)]
    try:
        async with Client(scheduler.target) as client:
            tasks = [
                await client.submit("count", str(i), max_attempts=1, heartbeat_timeout=timedelta(seconds=1))
                for i in range(len(raws))
            ]
            for raw in raws:
                await raw.connect()
            refs = [await _assignment(raw) for raw in raws]
            assert sorted(r.task_id for r in refs) == sorted(t.id for t in tasks)
            beats = scheduler.parts.leases.beats
            writes = beats.writes
            rounds = 12
            for _ in range(rounds):
                for raw, ref in zip(raws, refs, strict=True):
                    # The first worker keeps its lease but no longer lists its attempt.
                    await raw.call.write(_beat() if raw is raws[0] else _beat(ref))
                # The workers' own cadence (busy: every heartbeat interval).
                await asyncio.sleep(BUSY.total_seconds())
            # 3.6 s: the others' attempts ran past their 1 s heartbeat timeout three times over.
            for ref in refs[1:]:
                assert (await client.get(ref.task_id)).state == RUNNING
            # A statement per round at most (one per 100 ms window), not one per heartbeat (240).
            assert beats.writes - writes <= 2 * rounds, beats.writes - writes

            async def timed_out() -> bool:
                first = await client.get(refs[0].task_id)
                return first.last_failure.error_type == "HeartbeatTimeout"

            await eventually(timed_out, within=10)
    finally:
        for raw in raws:
            await raw.close()
        await scheduler.stop(grace=0.5)
