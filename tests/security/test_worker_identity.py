"""A worker id is its token's: with auth on, a worker token cannot take over another token's
worker id, on the same replica or on another, so it can neither end that worker's stream nor take
its attempts and report their results. The same token may (a worker reconnecting), and so may
anyone once the id's worker has gone."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import grpc
import psycopg
import pytest

from lowtide.auth import hash_token
from lowtide.config import TokenEntry
from lowtide_client import Client, TaskState
from scheduler_service.server import Scheduler, start_scheduler
from tests.conftest import make_config
from tests.faults.support import RawWorker, query
from tests.helpers import eventually
from tests.security.conftest import AUTH, TOKENS

COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")
OTHER = "w-secret-other"
TWO_WORKER_TOKENS = replace(AUTH, tokens=(*AUTH.tokens, TokenEntry("other-worker", "worker", hash_token(OTHER))))


async def _scheduler(database_url: str) -> Scheduler:
    return await start_scheduler(replace(make_config(), auth=TWO_WORKER_TOKENS), database_url=database_url)


async def _refused(raw: RawWorker, running: list[tuple[int, int]]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await raw.connect(running=running)
    return refused.value


async def _workers(database_url: str) -> list[tuple[str, str, str]]:
    rows = await query(database_url, "SELECT id, token_name, scheduler_id FROM lowtide.workers ORDER BY id")
    return [(str(r[0]), str(r[1]), str(r[2])) for r in rows]


@pytest.mark.parametrize("replicas", [1, 2])
async def test_another_token_cannot_take_a_connected_workers_id(database_url: str, replicas: int) -> None:
    """Same replica (the session in memory) and another one (the worker's row): refused with
    PERMISSION_DENIED, naming the worker id; the worker keeps its stream and its attempt, and its
    own result is the one stored."""
    first = await _scheduler(database_url)
    second = await _scheduler(database_url) if replicas == 2 else first
    owner = RawWorker(first.target, "gpu-7", token=TOKENS["worker"])
    thief = RawWorker(second.target, "gpu-7", token=OTHER)
    try:
        async with Client(first.target, token=TOKENS["submitter"]) as client:
            task = await client.submit("count", "1")
            await owner.connect()
            ref = await owner.assignment()
            before = await _workers(database_url)
            assert [(w, t) for w, t, _ in before] == [("gpu-7", "worker-token")]

            refused = await _refused(thief, running=[ref])
            assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "worker id 'gpu-7' is in use by a worker of another token" in (refused.details() or "")
            assert await _workers(database_url) == before

            # The owner's stream was not ended, and the attempt is still its own to report.
            await owner.report([ref], result=b"from the owner")
            done = await client.wait(task.id, timeout=timedelta(seconds=10))
            assert (done.state, done.result) == (COMPLETED, b"from the owner")
    finally:
        await owner.close()
        await thief.close()
        if second is not first:
            await second.stop(grace=0.5)
        await first.stop(grace=0.5)


async def test_the_same_token_reconnects_and_the_id_is_free_once_its_worker_left(database_url: str) -> None:
    scheduler = await _scheduler(database_url)
    older = RawWorker(scheduler.target, "gpu-8", token=TOKENS["worker"])
    newer = RawWorker(scheduler.target, "gpu-8", token=TOKENS["worker"])
    later = RawWorker(scheduler.target, "gpu-8", token=OTHER)
    try:
        await older.connect()
        # A worker coming back with its own token takes its id over, as without auth.
        await newer.connect()
        with pytest.raises(grpc.aio.AioRpcError) as replaced:
            while True:
                await older.read()
        assert replaced.value.code() == grpc.StatusCode.ABORTED
        await newer.close()
        # Gone (its row forgotten): the id is anyone's.
        await eventually(lambda: _no_workers(database_url))
        await later.connect()
        assert [(w, t) for w, t, _ in await _workers(database_url)] == [("gpu-8", "other-worker")]
    finally:
        for raw in (older, newer, later):
            await raw.close()
        await scheduler.stop(grace=0.5)


async def _no_workers(database_url: str) -> bool:
    return not await _workers(database_url)


async def test_an_id_left_by_a_dead_replica_is_free_once_its_lease_ran_out(database_url: str) -> None:
    """A worker whose replica died leaves its row behind: its id stays its token's while the lease
    runs, and is free for another token's worker once it has run out (and none of its attempts run)."""
    scheduler = await _scheduler(database_url)
    try:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            await conn.execute(
                "INSERT INTO lowtide.workers (id, pool, queues, activity_types, slots, scheduler_id, lease_expires_at,"
                " token_name) VALUES ('gpu-9', 'default', '{default}', '{count}', 1, 'a-dead-replica',"
                " now() + interval '1 hour', 'worker-token')"
            )
            early = RawWorker(scheduler.target, "gpu-9", token=OTHER)
            try:
                assert (await _refused(early, running=[])).code() == grpc.StatusCode.PERMISSION_DENIED
            finally:
                await early.close()
            assert [(w, t) for w, t, _ in await _workers(database_url)] == [("gpu-9", "worker-token")]
            await conn.execute("UPDATE lowtide.workers SET lease_expires_at = now() - interval '1 minute'")
        late = RawWorker(scheduler.target, "gpu-9", token=OTHER)
        try:
            await late.connect()
            assert [(w, t) for w, t, _ in await _workers(database_url)] == [("gpu-9", "other-worker")]
        finally:
            await late.close()
    finally:
        await scheduler.stop(grace=0.5)
