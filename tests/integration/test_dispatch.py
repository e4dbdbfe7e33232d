"""Central dispatch (issue 15) over real gRPC streams and a real database: workers of mixed pools,
queues and types each get only what they may run and none starves; a burst is shared fairly
between equal workers; an idle fleet of 1,000 streams causes no claim between the replica's polls;
a replica's own NOTIFY claims nothing, and nothing waits for the poll that a wake can find."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

import grpc
import psycopg
import pytest

from lowtide.config import Config, TypeConfig
from lowtide.db import Database, apply_migrations
from lowtide_client import Client, Worker, task_spec
from lowtide_proto.lowtide.v1 import worker_pb2, worker_pb2_grpc
from scheduler_service.server import Scheduler, start_scheduler
from scheduler_service.store import Q, Store
from tests.conftest import make_config
from tests.faults.support import RawWorker, states
from tests.helpers import eventually

# name, pool, queues, activity types
MIXED = [
    ("only-a", "default", ("default",), ("a",)),
    ("a-and-b", "default", ("default",), ("a", "b")),
    ("b-on-gpu", "gpu", ("default",), ("b",)),
    ("c-on-q2", "default", ("q2",), ("c",)),
    ("a-and-c-both-queues", "batch", ("default", "q2"), ("a", "c")),
]
PER_TYPE = 60


def _recording(
    ran: dict[str, list[tuple[str, str]]], worker: str, name: str, everyone: asyncio.Event
) -> Callable[[bytes], Awaitable[bytes]]:
    """An activity that records (queue, type) for the worker (the payload starts with the queue),
    then holds its slot until every worker has run something (at most 30 s): the workers that
    were served stay busy, so the rest of the work can only go to one not served yet, however a
    loaded machine orders the claims. A starved worker shows as one that never ran."""

    async def run(payload: bytes) -> bytes:
        ran[worker].append((payload.decode().split(":")[0], name))
        if {w for w, runs in ran.items() if runs} >= {w for w, *_ in MIXED}:
            everyone.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(everyone.wait(), 30)
        return b""

    return run


async def test_workers_of_mixed_pools_and_types_get_only_what_they_may_run_and_none_starves(
    scheduler: Scheduler, database_url: str
) -> None:
    ran: dict[str, list[tuple[str, str]]] = defaultdict(list)
    everyone = asyncio.Event()
    workers = []
    for name, pool, queues, types in MIXED:
        worker = Worker(target=scheduler.target, pool=pool, queues=queues, slots=2, worker_id=name)
        for activity in types:
            worker.register(activity, _recording(ran, name, activity, everyone))
        workers.append(worker)
    async with contextlib.AsyncExitStack() as stack, Client(scheduler.target) as client:
        for worker in workers:
            await stack.enter_async_context(worker)
        await eventually(lambda: _registered(scheduler, len(MIXED)))
        specs = [
            task_spec(t, f"{q}:{i}".encode(), queue=q)
            for t, q in (("a", "default"), ("b", "default"), ("c", "q2"))
            for i in range(PER_TYPE)
        ]
        await client.submit_many(specs)

        async def all_completed() -> bool:
            return await states(database_url) == {"completed": 3 * PER_TYPE}

        await eventually(all_completed, within=60, interval=0.1)
    allowed = {name: {(q, t) for q in queues for t in types} for name, _, queues, types in MIXED}
    for name, runs in ran.items():
        assert set(runs) <= allowed[name], (name, set(runs) - allowed[name])
    assert {name for name, runs in ran.items() if runs} == {name for name, *_ in MIXED}
    assert sum(len(runs) for runs in ran.values()) == 3 * PER_TYPE


async def _registered(scheduler: Scheduler, count: int) -> bool:
    return len(scheduler.registry) == count


async def test_a_burst_is_shared_fairly_between_equal_workers(scheduler: Scheduler, database_url: str) -> None:
    tasks, count = 800, 8
    ran: Counter[str] = Counter()
    workers = []
    for i in range(count):
        worker = Worker(target=scheduler.target, slots=4, worker_id=f"equal-{i}")

        async def run(payload: bytes, name: str = f"equal-{i}") -> bytes:
            ran[name] += 1
            await asyncio.sleep(0.01)
            return b""

        worker.register("burst", run)
        workers.append(worker)
    async with contextlib.AsyncExitStack() as stack, Client(scheduler.target) as client:
        for worker in workers:
            await stack.enter_async_context(worker)
        await eventually(lambda: _registered(scheduler, count))
        await client.submit_many([task_spec("burst", str(i).encode()) for i in range(tasks)])

        async def all_completed() -> bool:
            return await states(database_url) == {"completed": tasks}

        await eventually(all_completed, within=60, interval=0.1)
    share = tasks / count
    assert sum(ran.values()) == tasks
    # Equal workers, equally fast: each within a quarter of its fair share.
    assert all(0.75 * share <= ran[f"equal-{i}"] <= 1.25 * share for i in range(count)), ran


async def _idle_stream(stub: worker_pb2_grpc.WorkerServiceStub, worker_id: str) -> None:
    hello = worker_pb2.Hello(worker_id=worker_id, slots=4, activity_types=[worker_pb2.ActivityType(name="idle")])
    outgoing: asyncio.Queue[worker_pb2.WorkerMessage] = asyncio.Queue()
    outgoing.put_nowait(worker_pb2.WorkerMessage(hello=hello))

    async def messages() -> AsyncIterator[worker_pb2.WorkerMessage]:
        while True:
            yield await outgoing.get()

    async for message in stub.Connect(messages()):
        if message.WhichOneof("message") == "welcome":
            interval = message.welcome.heartbeat_interval.ToTimedelta().total_seconds()
            asyncio.get_running_loop().call_later(interval, _beat, outgoing, interval)


def _beat(outgoing: asyncio.Queue[worker_pb2.WorkerMessage], interval: float) -> None:
    outgoing.put_nowait(worker_pb2.WorkerMessage(heartbeat=worker_pb2.Heartbeat()))
    asyncio.get_running_loop().call_later(interval, _beat, outgoing, interval)


async def test_an_ask_starts_its_groups_claim_at_once(scheduler: Scheduler) -> None:
    """A wake (here as a submit or a freed slot makes it) starts the group's claim in the same
    turn of the event loop, not when the dispatcher's own loop next looks."""
    worker = Worker(target=scheduler.target, slots=2)

    @worker.activity("asked")
    async def asked(payload: bytes) -> bytes:
        return payload

    async with worker:

        async def one_quiet_group() -> bool:
            groups = scheduler.registry.groups()
            return len(groups) == 1 and groups[0].claims == 0

        await eventually(one_quiet_group, within=30)
        group = scheduler.registry.groups()[0]
        scheduler.registry.want_group(group)
        # No await between the ask and the look: only a claim started by the ask itself counts.
        assert group.claims == 1
        async with Client(scheduler.target) as client:
            task = await client.submit("asked", b"x")
            done = await client.wait(task.id, timeout=timedelta(seconds=10))
        assert done.result == b"x"


async def test_a_thousand_idle_streams_cause_no_claim_between_the_replicas_polls(database_url: str) -> None:
    # The scheduler's own counters (pg_stat_statements is not assumed to be installed): claim
    # statements run by the dispatcher, lease renewals, and the replica's polls.
    config = make_config(heartbeat_interval=timedelta(seconds=1), lease_timeout=timedelta(seconds=10))
    scheduler = await start_scheduler(config, database_url=database_url)
    fleet = 1000
    channels = [grpc.aio.insecure_channel(scheduler.target) for _ in range(4)]
    streams = [
        asyncio.create_task(_idle_stream(worker_pb2_grpc.WorkerServiceStub(channels[i % 4]), f"idle-{i}"))
        for i in range(fleet)
    ]
    try:
        await eventually(lambda: _registered(scheduler, fleet), within=60)
        dispatcher, leases = scheduler.dispatcher, scheduler.parts.leases
        await _polls(scheduler, 1)
        claims, renewals, polls = dispatcher.claims_run, leases.renewals, dispatcher.polls
        await _polls(scheduler, polls + 4)
        # One group (they may all run the same work): per poll one claim of due fixed starts and
        # one of regular work, each for a few of the 1,000 (the claims of the poll counted first
        # may run inside the window too); a claim per worker would be 4,000 or more.
        assert dispatcher.claims_run - claims <= 2 * (dispatcher.polls - polls + 1)
        # One renewal per tick (half the heartbeat interval) for every stream heard from.
        ticks = (dispatcher.polls - polls) * config.scheduler.poll_interval / (config.scheduler.heartbeat_interval / 2)
        assert leases.renewals - renewals <= ticks + 2
        assert len(scheduler.registry) == fleet
    finally:
        for stream in streams:
            stream.cancel()
        for channel in channels:
            await channel.close()
        await scheduler.stop(grace=1.0)


async def test_work_only_a_poll_finds_goes_to_the_whole_group_in_that_poll(database_url: str) -> None:
    # A poll with no wake claims for a few slots only; when that comes back full the group claims
    # for the rest at once. Work announced by no wake (the queue resumed behind the scheduler's
    # back, as by a replica whose NOTIFY was lost) is all started within one poll, not a few
    # slots a poll. Each activity holds its slot until all have started, so no freed slot wakes
    # the group and only the poll can find the work.
    config = make_config(poll_interval=timedelta(seconds=1))
    scheduler = await start_scheduler(config, database_url=database_url)
    count, slots = 40, 4
    tasks = count * slots
    started_in_poll: list[int] = []
    everyone = asyncio.Event()

    async def hold(payload: bytes) -> bytes:
        started_in_poll.append(scheduler.dispatcher.polls)
        if len(started_in_poll) == tasks:
            everyone.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(everyone.wait(), 30)
        return b""

    workers = []
    for i in range(count):
        worker = Worker(target=scheduler.target, slots=slots, worker_id=f"polled-{i}")
        worker.register("unannounced", hold)
        workers.append(worker)
    try:
        async with (
            contextlib.AsyncExitStack() as stack,
            Client(scheduler.target) as client,
            await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn,
        ):
            for worker in workers:
                await stack.enter_async_context(worker)
            await eventually(lambda: _registered(scheduler, count))
            await client.pause_queue("default")
            await client.submit_many([task_spec("unannounced", b"") for _ in range(tasks)])
            await conn.execute("UPDATE lowtide.queues SET paused = false WHERE name = 'default'")

            async def all_completed() -> bool:
                return await states(database_url) == {"completed": tasks}

            await eventually(all_completed, within=60, interval=0.1)
    finally:
        await scheduler.stop(grace=1.0)
    assert len(started_in_poll) == tasks
    # All in the poll that found them (or the one after, should a slow machine start the last
    # of them only then): a claim of the probe's few slots a poll would take 20 polls.
    assert max(started_in_poll) - min(started_in_poll) <= 1, Counter(started_in_poll)


async def _polls(scheduler: Scheduler, at_least: int) -> None:
    async def polled() -> bool:
        return scheduler.dispatcher.polls >= at_least

    await eventually(polled, within=30)


async def _two_workers(conn: psycopg.AsyncConnection[Any], *, queues: list[str], types: list[str]) -> None:
    """Workers "first" and "second" (8 slots each, leases a minute long), as a replica records them."""
    for worker in ("first", "second"):
        await conn.execute(
            "INSERT INTO lowtide.workers (id, pool, queues, activity_types, slots, scheduler_id, lease_expires_at)"
            " VALUES (%s, 'default', %s, %s, 8, 'test', now() + interval '1 minute')",
            (worker, queues, types),
        )


async def test_a_claim_locks_only_the_rows_it_takes(database_url: str) -> None:
    # One claim of 2 slots over two types stays open (its transaction uncommitted); a second claim
    # of 8 slots meanwhile takes all 8 others: the first locked its 2, not 2 of each type.
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await apply_migrations(database_url)
        await _two_workers(conn, queues=["default"], types=["a", "b"])
        await conn.execute(
            "INSERT INTO lowtide.tasks (queue, kind, activity_type, payload, max_attempts, initial_backoff_ms,"
            " backoff_coefficient, max_backoff_ms)"
            " SELECT 'default', 'activity', t, ''::bytea, 1, 1000, 2, 60000"
            " FROM unnest(ARRAY['a', 'b']) AS t, generate_series(1, 5)"
        )
        db = Database(database_url, min_size=1, max_size=2)
        await db.open()
        try:
            store = Store(db, on_unblocked=lambda rows: None)
            async with db.transaction() as open_claim:
                params = {
                    "workers": "first",
                    "free": "2",
                    "queues": ["default", "default"],
                    "types": ["a", "b"],
                    "caps": [4, 4],
                    "held_queues": [],
                    "held_types": [],
                    "held_caps": [],
                    "signal": None,
                    "pool": "default",
                    "release_lead": timedelta(seconds=1),
                }
                first = await open_claim.fetch(Q["claim_tasks"], params)
                second = await store.claim(
                    slots=[("second", 8)], queues=["default"], worker_types=["a", "b"], limits={}
                )
        finally:
            await db.close()
    assert len(first) == 2
    assert len(second) == 8 and {r.worker_id for r in second} == {"second"}
    assert not {r["id"] for r in first} & {r.id for r in second}


async def test_a_claim_of_one_type_takes_rows_off_the_index_past_those_another_claim_holds(database_url: str) -> None:
    # Workers of one type claim on the pending index directly (claim_pair): a claim of 3 slots stays
    # open, a second of 8 meanwhile takes the 7 others, best priority first, and neither takes a
    # task of the paused queue or a task not due yet.
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await apply_migrations(database_url)
        await _two_workers(conn, queues=["default", "stopped"], types=["a"])
        columns = (
            "INSERT INTO lowtide.tasks (queue, kind, activity_type, payload, max_attempts, initial_backoff_ms,"
            " backoff_coefficient, max_backoff_ms, priority, run_at)"
        )
        await conn.execute(
            columns + " SELECT 'default', 'activity', 'a', ''::bytea, 1, 1000, 2, 60000, n, now()"
            " FROM generate_series(1, 10) AS n"
        )
        await conn.execute(
            columns + " VALUES ('default', 'activity', 'a', '', 1, 1000, 2, 60000, 99, now() + interval '1 hour')"
        )
        await conn.execute(columns + " VALUES ('stopped', 'activity', 'a', '', 1, 1000, 2, 60000, 99, now())")
        await conn.execute("INSERT INTO lowtide.queues (name, paused) VALUES ('stopped', true)")
        db = Database(database_url, min_size=1, max_size=2)
        await db.open()
        try:
            store = Store(db, on_unblocked=lambda rows: None)
            params = {
                "workers": "first",
                "free": "3",
                "queue": "default",
                "activity_type": "a",
                "cap": 3,
                "signal": None,
                "pool": "default",
                "release_lead": timedelta(seconds=1),
            }
            async with db.transaction() as open_claim:
                first = await open_claim.fetch(Q["claim_pair"], params)
                second = await store.claim(slots=[("second", 8)], queues=["default"], worker_types=["a"], limits={})
            paused = await store.claim(slots=[("second", 8)], queues=["stopped"], worker_types=["a"], limits={})
        finally:
            await db.close()
    assert sorted(r["priority"] for r in first) == [8, 9, 10]
    assert sorted(r.priority for r in second) == [1, 2, 3, 4, 5, 6, 7]
    assert {r.worker_id for r in second} == {"second"}
    assert paused == []


async def test_wait_task_returns_on_any_replica_once_the_task_finishes(database_url: str) -> None:
    # The worker is on one replica, the waiting client on the other: the waiter there is resolved
    # by the finishing replica's NOTIFY (or its own check), not by a query of its own per waiter.
    first = await start_scheduler(make_config(), database_url=database_url)
    second = await start_scheduler(make_config(), database_url=database_url)
    release = asyncio.Event()
    worker = Worker(target=first.target, slots=2)

    @worker.activity("gate")
    async def gate(payload: bytes) -> bytes:
        await release.wait()
        return payload

    try:
        async with worker, Client(second.target) as client:
            task = await client.submit("gate", b"done")
            waiting = asyncio.create_task(client.wait(task.id, timeout=timedelta(seconds=30)))
            await eventually(lambda: _running(first))
            assert not waiting.done()
            release.set()
            done = await waiting
        assert (done.result, done.attempt) == (b"done", 1)
        assert await states(database_url) == {"completed": 1}
    finally:
        await second.stop(grace=1.0)
        await first.stop(grace=1.0)


async def _running(scheduler: Scheduler) -> bool:
    return any(session.in_flight for session in scheduler.registry)


# The replica's poll, out of the way: what is claimed then was claimed on a wake alone.
NO_POLL = timedelta(minutes=10)


async def _echo(payload: bytes) -> bytes:
    return payload


async def test_a_replica_s_own_notify_claims_nothing(database_url: str) -> None:
    # The submit wakes the replica's dispatch itself, so its NOTIFY (which tells the other
    # replicas) does not wake it a second time: a task on an idle replica costs the claim of its
    # submit and the one of the slot its result frees. (25 claims for these 10 tasks before.)
    scheduler = await start_scheduler(make_config(poll_interval=NO_POLL), database_url=database_url)
    worker = Worker(target=scheduler.target, slots=4, worker_id="single")
    worker.register("echo", _echo)
    tasks = 10
    try:
        async with worker, Client(scheduler.target) as client:
            await eventually(lambda: _registered(scheduler, 1))

            async def quiet() -> bool:
                groups = scheduler.registry.groups()
                return len(groups) == 1 and groups[0].claims == 0

            await eventually(quiet)
            claims = scheduler.dispatcher.claims_run
            for i in range(tasks):
                task = await client.submit("echo", b"%d" % i)
                done = await client.wait(task.id, timeout=timedelta(seconds=10))
                assert done.result == b"%d" % i
            await eventually(quiet)
            assert scheduler.dispatcher.claims_run - claims <= 2 * tasks
    finally:
        await scheduler.stop(grace=1.0)


async def test_with_the_poll_far_off_a_backlog_and_a_limited_type_drain_on_freed_slots(database_url: str) -> None:
    # A backlog larger than the slots: each freed slot claims the next task; a type at its
    # concurrency limit is claimed again once its running attempts are written as ended. Neither
    # waits for the replica's poll.
    config: Config = replace(make_config(poll_interval=NO_POLL), types={"limited": TypeConfig(max_concurrency=1)})
    scheduler = await start_scheduler(config, database_url=database_url)
    worker = Worker(target=scheduler.target, slots=4, worker_id="freed")
    worker.register("echo", _echo)
    worker.register("limited", _echo)
    try:
        async with worker, Client(scheduler.target) as client:
            await eventually(lambda: _registered(scheduler, 1))
            await client.submit_many([task_spec("echo", b"") for _ in range(40)])
            await client.submit_many([task_spec("limited", b"") for _ in range(5)])

            async def all_completed() -> bool:
                return await states(database_url) == {"completed": 45}

            await eventually(all_completed, within=30, interval=0.1)
            assert scheduler.dispatcher.polls == 0
    finally:
        await scheduler.stop(grace=1.0)


async def test_a_submit_on_one_replica_wakes_the_workers_of_another_at_once(database_url: str) -> None:
    # Each replica skips the wake-up NOTIFY it sent itself; another replica's still wakes it.
    config = make_config(poll_interval=NO_POLL)
    submitted_to = await start_scheduler(config, database_url=database_url)
    serving = await start_scheduler(config, database_url=database_url)
    worker = Worker(target=serving.target, slots=2, worker_id="elsewhere")
    worker.register("echo", _echo)
    try:
        async with (
            worker,
            Client(submitted_to.target) as client,
            await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn,
        ):
            await eventually(lambda: _registered(serving, 1))

            async def both_listen() -> bool:
                cur = await conn.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND query = 'LISTEN \"lowtide_done\"'"
                )
                row = await cur.fetchone()
                return row is not None and row[0] == 2

            await eventually(both_listen)
            for i in range(3):
                task = await client.submit("echo", b"%d" % i)
                done = await client.wait(task.id, timeout=timedelta(seconds=10))
                assert done.result == b"%d" % i
        assert serving.dispatcher.polls == submitted_to.dispatcher.polls == 0
    finally:
        await serving.stop(grace=1.0)
        await submitted_to.stop(grace=1.0)


@pytest.mark.parametrize("failure", ["RuntimeError", "StartToCloseTimeout"])
async def test_a_retry_is_claimed_when_its_backoff_ends_not_at_the_next_poll(database_url: str, failure: str) -> None:
    # The first attempt fails: the worker reports an error (the completer writes the retry), or
    # it runs past its start-to-close deadline (the leader's maintenance ends it). Either way the
    # retry wakes dispatch when its backoff ends; the poll is ten minutes off.
    scheduler = await start_scheduler(make_config(poll_interval=NO_POLL), database_url=database_url)
    worker = Worker(target=scheduler.target, slots=4, worker_id="retrying")
    attempts: list[float] = []

    @worker.activity("flaky")
    async def flaky(payload: bytes) -> bytes:
        attempts.append(asyncio.get_running_loop().time())
        if len(attempts) == 1:
            if failure == "RuntimeError":
                raise RuntimeError("the first attempt fails")
            await asyncio.sleep(30)  # past the deadline: the scheduler ends the attempt
        return b"second"

    try:
        async with worker, Client(scheduler.target) as client:
            await eventually(lambda: _registered(scheduler, 1))
            task = await client.submit(
                "flaky",
                b"",
                max_attempts=2,
                initial_backoff=timedelta(milliseconds=300),
                start_to_close_timeout=timedelta(milliseconds=500),
            )
            done = await client.wait(task.id, timeout=timedelta(seconds=20))
        assert (done.result, done.attempt, done.last_failure.error_type) == (b"second", 2, failure)
        assert attempts[1] - attempts[0] >= 0.3
        assert scheduler.dispatcher.polls == 0
    finally:
        await scheduler.stop(grace=1.0)


async def test_a_retry_after_its_worker_was_lost_is_claimed_when_its_backoff_ends(database_url: str) -> None:
    # The stream of the worker running the first attempt is cut: the scheduler ends the attempt
    # as WorkerLost at once, and the retry wakes dispatch when its backoff ends (the poll is off).
    scheduler = await start_scheduler(make_config(poll_interval=NO_POLL), database_url=database_url)
    lost = RawWorker(scheduler.target, "lost", activity="flaky")
    survivor = Worker(target=scheduler.target, slots=1, worker_id="survivor")
    survivor.register("flaky", _echo)
    try:
        async with Client(scheduler.target) as client:
            await lost.connect()
            task = await client.submit("flaky", b"again", max_attempts=2, initial_backoff=timedelta(milliseconds=300))
            assert (await lost.read()).WhichOneof("message") == "assignments"
            async with survivor:
                await eventually(lambda: _registered(scheduler, 2))
                lost.call.cancel()
                done = await client.wait(task.id, timeout=timedelta(seconds=20))
        assert (done.result, done.attempt, done.last_failure.error_type) == (b"again", 2, "WorkerLost")
        assert scheduler.dispatcher.polls == 0
    finally:
        await lost.close()
        await scheduler.stop(grace=1.0)
