"""Writing the outcomes of a batch of attempts: tasks nothing depends on are written in one
statement of their own, the rest with their dependents in a transaction. A try that fails between
the two keeps what it wrote, so the next try applies the rest and counts the whole batch."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from lowtide.db import Database, apply_migrations
from lowtide.db.connector import Transaction
from lowtide.errors import DatabaseUnavailable
from scheduler_service.domain.model import Kind, NewTask, Outcome, RetryPolicy, State
from scheduler_service.rows.tasks import FinishedRow, UnblockedRow
from scheduler_service.store import Store
from scheduler_service.tasks.submission import store_tasks
from tests.helpers import eventually


class _LosesTheTransaction(Database):
    """The real database, gone for the first transaction asked of it (as when the server
    restarts between a batch's two writes)."""

    lost = 1

    def transaction(self, *, planned: bool = False) -> contextlib._AsyncGeneratorContextManager[Transaction]:
        if self.lost:
            self.lost -= 1
            raise DatabaseUnavailable("database unavailable: the server closed the connection")
        return super().transaction(planned=planned)


async def _running(conn: psycopg.AsyncConnection[Any], count: int) -> list[int]:
    cur = await conn.execute(
        "INSERT INTO lowtide.tasks (queue, kind, activity_type, payload, max_attempts, initial_backoff_ms,"
        " backoff_coefficient, max_backoff_ms, state, attempt, worker_id, started_at)"
        " SELECT 'default', 'activity', 'a', ''::bytea, 1, 1000, 2, 60000, 'running', 1, 'w', now()"
        " FROM generate_series(1, %s) RETURNING id",
        (count,),
    )
    return [row[0] for row in await cur.fetchall()]


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    await apply_migrations(database_url)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as connection:
        yield connection


async def test_a_batch_cut_between_its_two_writes_is_applied_whole_by_the_next_try(
    database_url: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    alone = await _running(conn, 3)
    [depended_on] = await _running(conn, 1)
    cur = await conn.execute(
        "INSERT INTO lowtide.tasks (queue, kind, activity_type, payload, max_attempts, initial_backoff_ms,"
        " backoff_coefficient, max_backoff_ms, deps_pending, run_at)"
        " VALUES ('default', 'activity', 'a', '', 1, 1000, 2, 60000, 1, 'infinity') RETURNING id"
    )
    [[dependent]] = await cur.fetchall()
    await conn.execute(
        "INSERT INTO lowtide.task_dependencies (task_id, depends_on) VALUES (%s, %s)", (dependent, depended_on)
    )
    await conn.execute("UPDATE lowtide.tasks SET has_dependents = true WHERE id = %s", (depended_on,))

    released: list[UnblockedRow] = []
    db = _LosesTheTransaction(database_url, min_size=1, max_size=2)
    await db.open()
    try:
        store = Store(db, on_unblocked=released.extend)
        batch = [(Outcome(i, 1, State.COMPLETED, result=b"done"), "w") for i in [*alone, depended_on]]
        written: dict[tuple[int, int], FinishedRow] = {}
        with pytest.raises(DatabaseUnavailable):
            await store.finish(batch, written)
        # The tasks nothing depends on were written by the first statement, and say so.
        assert set(written) == {(i, 1) for i in alone}
        cur = await conn.execute("SELECT state FROM lowtide.tasks WHERE id = %s", (depended_on,))
        assert await cur.fetchone() == ("running",)

        applied = await store.finish(batch, written)
    finally:
        await db.close()
    assert set(applied) == {(i, 1) for i in [*alone, depended_on]}
    cur = await conn.execute(
        "SELECT id, state, result FROM lowtide.tasks WHERE id = ANY(%s) ORDER BY id", ([*alone, depended_on],)
    )
    assert await cur.fetchall() == [(i, "completed", b"done") for i in sorted([*alone, depended_on])]
    # The dependent was released with its dependency, in the dependency's transaction.
    assert [r.id for r in released] == [dependent]
    cur = await conn.execute("SELECT deps_pending FROM lowtide.tasks WHERE id = %s", (dependent,))
    assert await cur.fetchone() == (0,)


async def test_stale_reports_in_a_batch_are_left_out_of_both_writes(
    database_url: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    fresh, taken_back = await _running(conn, 2)
    await conn.execute(
        "UPDATE lowtide.tasks SET state = 'pending', attempt = 1, worker_id = NULL WHERE id = %s", (taken_back,)
    )
    db = Database(database_url, min_size=1, max_size=2)
    await db.open()
    try:
        store = Store(db, on_unblocked=lambda rows: None)
        applied = await store.finish(
            [(Outcome(fresh, 1, State.COMPLETED, result=b""), "w"), (Outcome(taken_back, 1, State.COMPLETED), "w")]
        )
    finally:
        await db.close()
    assert set(applied) == {(fresh, 1)}
    cur = await conn.execute("SELECT id, state FROM lowtide.tasks ORDER BY id")
    assert await cur.fetchall() == [(fresh, "completed"), (taken_back, "pending")]


async def _tasks_read(conn: psycopg.AsyncConnection[Any]) -> int:
    """Rows of lowtide.tasks read by scans since the database was made, as its backends reported."""
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    cur = await conn.execute(
        "SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) FROM pg_stat_user_tables "
        "WHERE schemaname = 'lowtide' AND relname = 'tasks'"
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


_PLAIN = NewTask("default", Kind.ACTIVITY, "b", b"", 0, None, RetryPolicy(3, timedelta(1), 2.0, timedelta(60)),
                 None, None, None)  # fmt: skip


@pytest.mark.parametrize("by", ["completer", "group insert"])
async def test_a_finish_after_the_table_grew_reads_only_its_own_tasks(
    database_url: str, conn: psycopg.AsyncConnection[Any], by: str
) -> None:
    """The first finishes of a fresh database run while lowtide.tasks holds a handful of rows. A
    plan PostgreSQL kept from then (psycopg prepares a statement run five times; a group of single
    submits' connection at once) scanned the whole table for each report: once 40,000 tasks were
    stored, 50 ms for one finish, and the finishes fell behind a burst of work. The completer's
    finish is planned for the table as it is, each time; a group's insert, which writes the
    reports lent to it, keeps the plan it made first, which probes each report's task by its id."""
    trickle = await _running(conn, 20)
    db = Database(database_url, min_size=1, max_size=1, planned_max=1)
    await db.open()
    store = Store(db, on_unblocked=lambda rows: None)

    async def finish(task_id: int) -> None:
        report = [(Outcome(task_id, 1, State.COMPLETED, result=b""), "w")]
        if by == "completer":
            await store.finish(report)
        else:
            # A single submit's group, the report lent to it (tasks/submission.py).
            finished: dict[tuple[int, int], FinishedRow] = {}
            await store_tasks(store, [_PLAIN], stored={}, planned=True, finishing=report, finished=finished)
            assert list(finished) == [(task_id, 1)]

    try:
        for task_id in trickle:
            await finish(task_id)
        backlog = await _running(conn, 40_000)
        await finish(backlog[0])
        cur = await conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND backend_type = 'client backend'"
        )
        backends = [row[0] for row in await cur.fetchall()]
    finally:
        await db.close()

    # Its backends report what they read as they exit, before they leave pg_stat_activity: read
    # once they have all left (a count polled until it passed the trickle's could be the trickle's
    # alone, flushed while idle, the finish measured not reported yet).
    async def gone() -> bool:
        cur = await conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (backends,))
        row = await cur.fetchone()
        return row is not None and row[0] == 0

    assert backends
    await eventually(gone, within=30)
    assert len(trickle) + 1 <= await _tasks_read(conn) < 1_000
