"""Two statements sent together (Database.fetch_both: one pipeline, one Sync) are one transaction:
both are committed, or neither (a group's insert and the workers' reports it writes, tasks.md)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from lowtide.db import Database


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as connection:
        yield connection


async def _state(conn: psycopg.AsyncConnection[Any], row_id: int) -> str:
    cur = await conn.execute("SELECT state FROM t WHERE id = %s", (row_id,))
    row = await cur.fetchone()
    assert row is not None
    return str(row[0])


@dataclass(frozen=True)
class _Id:
    id: int


async def test_two_statements_sent_together_commit_together_or_not_at_all(
    database_url: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    await conn.execute("CREATE TABLE t (id int PRIMARY KEY, state text)")
    await conn.execute("INSERT INTO t VALUES (1, 'running')")
    end = (_Id, "UPDATE t SET state = 'completed' WHERE id = %(id)s RETURNING id", {"id": 1})
    fails = (_Id, "SELECT 1 / %(zero)s AS id", {"zero": 0})
    db = Database(database_url, min_size=1, max_size=1, planned_max=1)
    await db.open()
    try:
        # The second fails: the first is rolled back with it. The first fails: the second is not run.
        for first, second in ((end, fails), (fails, end)):
            with pytest.raises(psycopg.errors.DivisionByZero):
                await db.fetch_both(first, second, planned=True)
            assert await _state(conn, 1) == "running"
        # Both succeed, on the connection they failed on before.
        read = (_Id, "SELECT count(*)::int AS id FROM t WHERE id = %(id)s AND state = 'completed'", {"id": 1})
        assert await db.fetch_both(end, read, planned=True) == ([_Id(1)], [_Id(1)])
        assert await _state(conn, 1) == "completed"
    finally:
        await db.close()


async def test_a_second_statement_that_fails_before_it_is_sent_rolls_back_the_first(
    database_url: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    """an error raised on the client once the first statement is queued (a
    parameter that cannot be adapted, a cancellation) leaves the pipeline block, whose exit sends
    a Sync: the first statement is committed alone, and the caller (tasks/submission.py) then
    retries the insert without the reports: stored twice."""
    await conn.execute("CREATE TABLE t (id int PRIMARY KEY, state text)")
    await conn.execute("INSERT INTO t VALUES (1, 'running')")
    end = (_Id, "UPDATE t SET state = 'completed' WHERE id = %(id)s RETURNING id", {"id": 1})
    unsendable = (_Id, "SELECT %(x)s::int AS id", {"x": object()})
    db = Database(database_url, min_size=1, max_size=1, planned_max=1)
    await db.open()
    try:
        with pytest.raises(psycopg.ProgrammingError):
            await db.fetch_both(end, unsendable, planned=True)
        assert await _state(conn, 1) == "running"
    finally:
        await db.close()
