"""Claims meeting other claims, with the plan they keep on their own connections (generic, planned
on an all but empty table, lowtide.db.connector): a claim reads its candidates without locks, then
locks them one by one (_lock_chosen, sql/claims.sql). A candidate another claim took and committed
in between is skipped, not taken twice; a claim locks only the rows it takes, however many slots
it fills, so another claimer finds all the rest. Two real connections, ordered by locks, no sleeps."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from lowtide.db import apply_migrations
from lowtide.db.connector import _GENERIC_PLANS
from scheduler_service.store import Q
from tests.helpers import eventually

_TASKS = (
    "INSERT INTO lowtide.tasks (queue, kind, activity_type, payload, max_attempts, initial_backoff_ms,"
    " backoff_coefficient, max_backoff_ms, priority) "
    "SELECT 'default', 'activity', 'a', ''::bytea, 1, 1000, 2, 60000, {priority} FROM generate_series(1, {n}) AS g"
)
_WORKERS = (
    "INSERT INTO lowtide.workers (id, pool, queues, activity_types, slots, scheduler_id, lease_expires_at)"
    " SELECT w, 'default', '{default}', '{a}', 4096, 'test', now() + interval '1 hour'"
    " FROM unnest(ARRAY['first', 'second', 'third']) AS w"
)
# Shadows pg_catalog's generate_series(int, int) for the connection whose search_path puts its
# schema first: the claim's slots (_claim_slots) call it once the statement's snapshot is taken and
# before any candidate is read, so the claim waits there while the test holds the advisory lock.
_GATE = """
CREATE SCHEMA gate;
CREATE FUNCTION gate.generate_series(a int, b int) RETURNS SETOF int LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_lock_shared(4242);
    PERFORM pg_advisory_unlock_shared(4242);
    RETURN QUERY SELECT pg_catalog.generate_series(a, b);
END $$
"""


def _params(statement: str, workers: str, free: str) -> dict[str, Any]:
    params: dict[str, Any] = {
        "workers": workers,
        "free": free,
        "signal": None,
        "pool": "default",
        "release_lead": timedelta(seconds=1),
    }
    if statement == "claim_pair":
        return {**params, "queue": "default", "activity_type": "a", "cap": 100_000}
    return {
        **params,
        "queues": ["default"],
        "types": ["a"],
        "caps": [100_000],
        "held_queues": ["default"],
        "held_types": ["b"],
        "held_caps": [100_000],
    }


async def _planned(database_url: str, *, options: str = "") -> psycopg.AsyncConnection[dict[str, Any]]:
    """A connection as the claims' (its statements prepared at once, each keeping its generic plan)."""
    return await psycopg.AsyncConnection.connect(
        database_url, autocommit=True, prepare_threshold=0, row_factory=dict_row, options=f"{_GENERIC_PLANS} {options}"
    )


@pytest.mark.parametrize("statement", ["claim_pair", "claim_tasks"])
async def test_a_candidate_another_claim_took_and_committed_after_the_read_is_skipped(
    database_url: str, statement: str
) -> None:
    # The best task (priority 9) is a candidate of the gated claim, whose snapshot saw it pending;
    # before the gated claim locks it, another claim takes it and commits. The gated claim must
    # find it running when it locks it (the re-check of the row's latest version) and fill its 3
    # slots with the next 3, not start the task a second time.
    await apply_migrations(database_url)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as admin:
        await admin.execute(_WORKERS)
        await admin.execute(_TASKS.format(priority=1, n=10))
        await admin.execute(_TASKS.format(priority=9, n=1))
        await admin.execute(_GATE)
        gated = await _planned(database_url, options="-c search_path=gate,pg_catalog")
        other = await _planned(database_url)
        try:
            # Planned on the table as it is now (what the connection keeps), before the gate closes.
            async with gated.transaction(force_rollback=True):
                await gated.execute(Q[statement], _params(statement, "second", "3"))
            await admin.execute("SELECT pg_advisory_lock(4242)")
            pid = gated.info.backend_pid
            claim = asyncio.ensure_future(gated.execute(Q[statement], _params(statement, "second", "3")))

            async def waiting() -> bool:
                cur = await admin.execute(
                    "SELECT 1 FROM pg_locks WHERE pid = %s AND locktype = 'advisory' AND NOT granted", (pid,)
                )
                return await cur.fetchone() is not None

            await eventually(waiting, within=30)
            taken = await (await other.execute(Q["claim_pair"], _params("claim_pair", "first", "1"))).fetchall()
            await admin.execute("SELECT pg_advisory_unlock(4242)")
            second = await (await claim).fetchall()
        finally:
            await gated.close()
            await other.close()
        rows = await (
            await admin.execute("SELECT id, attempt, worker_id FROM lowtide.tasks WHERE state = 'running'")
        ).fetchall()
    assert [(r["priority"], r["worker_id"]) for r in taken] == [(9, "first")]
    assert sorted(r["priority"] for r in second) == [1, 1, 1]
    assert taken[0]["id"] not in {r["id"] for r in second}
    assert sorted((r[1], r[2]) for r in rows) == [(1, "first"), (1, "second"), (1, "second"), (1, "second")]


@pytest.mark.parametrize("statement", ["claim_pair", "claim_tasks"])
async def test_a_claim_of_many_slots_locks_only_the_rows_it_takes(database_url: str, statement: str) -> None:
    # A claim of 2,000 slots, planned on an empty table and run with 5,000 waiting (some of them
    # locked by another claimer), stays open: it took 2,000, and every other pending task can
    # still be locked by another claimer (a plan locking before it stops at the claim's slots
    # would leave some locked that nobody takes).
    await apply_migrations(database_url)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as admin:
        await admin.execute(_WORKERS)
        claimer = await _planned(database_url)
        params = _params(statement, "first\x1fsecond", "1000,1000")
        try:
            async with claimer.transaction(force_rollback=True):
                await claimer.execute(Q[statement], params)  # planned now, on an empty table
            await admin.execute(_TASKS.format(priority="g % 3", n=5000))
            async with await psycopg.AsyncConnection.connect(database_url) as holder:
                # Another claimer holds every 7th of the best tasks: skipped, the claim goes past them.
                await holder.execute("SELECT id FROM lowtide.tasks WHERE priority = 2 AND id % 7 = 0 FOR UPDATE")
                async with claimer.transaction(force_rollback=True):
                    took = await (await claimer.execute(Q[statement], params)).fetchall()
                    cur = await admin.execute(
                        "SELECT count(*) FROM (SELECT id FROM lowtide.tasks WHERE state = 'pending'"
                        " FOR UPDATE SKIP LOCKED) AS free"
                    )
                    free = (await cur.fetchone() or (0,))[0]
                    held = await (
                        await holder.execute("SELECT count(*) FROM lowtide.tasks WHERE id % 7 = 0 AND priority = 2")
                    ).fetchone()
        finally:
            await claimer.close()
    assert len(took) == 2000
    assert all(r["id"] % 7 != 0 or r["priority"] != 2 for r in took)
    assert held is not None
    assert free == 5000 - 2000 - held[0]
