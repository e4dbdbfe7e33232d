"""A worker's report waiting to be written rides with the next group of single submits: the group's
insert and the report's finish are one commit (workers/completer.py lends it, tasks/submission.py
writes it). Still written alone when no submit comes, or when the group fails, and a report the
database refuses never fails a submit."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from lowtide.db import CommittedUnread
from lowtide_client import Client, TaskState
from scheduler_service.domain.model import Failure, Kind, NewTask, Outcome, RetryPolicy, State
from scheduler_service.rows.tasks import TaskRow
from scheduler_service.server import Scheduler, start_scheduler
from scheduler_service.store import submissions
from tests.conftest import make_config
from tests.helpers import eventually

COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")


@pytest.fixture
async def scheduler(database_url: str) -> AsyncIterator[Scheduler]:
    # No poll and no worker: nothing claims or ends the tasks but what a test does.
    scheduler = await start_scheduler(make_config(poll_interval=timedelta(minutes=10)), database_url=database_url)
    try:
        yield scheduler
    finally:
        await scheduler.stop(grace=0.5)


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as connection:
        yield connection


async def _running(conn: psycopg.AsyncConnection[Any]) -> int:
    """A task whose first attempt runs on worker w (as a claim would leave it)."""
    # w must have a live lease, or the leader's first maintenance tick may end
    # the attempt (WorkerLost) before the test's report is written: the tests failed now and then.
    await conn.execute(
        "INSERT INTO lowtide.workers (id, pool, queues, activity_types, slots, scheduler_id, lease_expires_at)"
        " VALUES ('w', 'default', '{default}', '{echo}', 1, 'elsewhere', now() + interval '1 hour')"
        " ON CONFLICT (id) DO NOTHING"
    )
    cur = await conn.execute(
        "INSERT INTO lowtide.tasks (queue, kind, activity_type, payload, max_attempts, initial_backoff_ms,"
        " backoff_coefficient, max_backoff_ms, state, attempt, worker_id, started_at)"
        " VALUES ('default', 'activity', 'echo', ''::bytea, 1, 1000, 2, 60000, 'running', 1, 'w', now()) RETURNING id"
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def _row(conn: psycopg.AsyncConnection[Any], task_id: int) -> tuple[str, int]:
    """The task's state, and the transaction that wrote its row as it is now."""
    cur = await conn.execute("SELECT state, xmin::text::bigint FROM lowtide.tasks WHERE id = %s", (task_id,))
    row = await cur.fetchone()
    assert row is not None
    return str(row[0]), int(row[1])


def _task(headers: dict[str, str] | None = None) -> NewTask:
    retry = RetryPolicy(3, timedelta(seconds=1), 2.0, timedelta(seconds=10))
    return NewTask("default", Kind.ACTIVITY, "echo", b"new", 0, None, retry, None, None, None, headers=headers or {})


def _flowing(scheduler: Scheduler) -> None:
    """Single submits as a steady flow brings them: a report waits for the next one."""
    for _ in range(5):
        scheduler.parts.completer.submitted()


async def _submit(scheduler: Scheduler, task: NewTask) -> TaskRow:
    stored: dict[int, TaskRow] = {}
    [submitted] = await scheduler.parts.api.submission.submit([task], None, stored)
    return stored[submitted.id]


def _first_rows_unreadable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first rows an insert of submitted tasks returns cannot be read (as a value no loader
    takes would fail them): the insert has committed by then."""
    failed: list[bool] = []

    def row(**columns: Any) -> TaskRow:
        if not failed:
            failed.append(True)
            raise ValueError("a row this test cannot read")
        return TaskRow(**columns)

    monkeypatch.setattr(submissions, "TaskRow", row)


async def _stored_new(conn: psycopg.AsyncConnection[Any]) -> int:
    cur = await conn.execute("SELECT count(*) FROM lowtide.tasks WHERE payload = 'new'::bytea")
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def test_a_group_stored_but_unread_is_not_written_again(
    scheduler: Scheduler, conn: psycopg.AsyncConnection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """a group whose insert committed but whose rows failed to be read was
    written again, each task alone: every task stored twice, one copy answered."""
    _first_rows_unreadable(monkeypatch)
    # Two submits at once: one group, one insert.
    answers = await asyncio.gather(_submit(scheduler, _task()), _submit(scheduler, _task()), return_exceptions=True)
    assert [type(a) for a in answers] == [CommittedUnread, CommittedUnread]
    assert await _stored_new(conn) == 2


async def test_a_group_stored_with_a_report_but_unread_is_not_written_again(
    scheduler: Scheduler, conn: psycopg.AsyncConnection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """the insert that also wrote a report, committed but its rows unread, was
    tried again without the report: the task stored twice."""
    ran = await _running(conn)
    completer = scheduler.parts.completer
    _flowing(scheduler)
    completer.add(Outcome(ran, 1, State.COMPLETED, result=b"done"), None)
    _first_rows_unreadable(monkeypatch)
    with pytest.raises(CommittedUnread):
        await _submit(scheduler, _task())
    assert await _stored_new(conn) == 1
    # The report committed with it stays written, and the completer is left with nothing.
    assert (await _row(conn, ran))[0] == "completed"
    await asyncio.wait_for(completer.flushed(), 10)
    assert completer.unwritten() == set()


async def test_a_group_stored_but_not_handed_over_is_submitted_once(
    scheduler: Scheduler, conn: psycopg.AsyncConnection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """a failure sending a stored group's tasks to the slots they were handed
    to (a message that cannot be made) failed the group, which was then written again task by
    task: every task stored twice, and no submit answered."""

    async def cannot_send(*_: Any) -> None:
        raise ValueError("an assignment this test cannot make")

    monkeypatch.setattr(scheduler.parts.api.submission._handoff, "send", cannot_send)
    rows = await asyncio.gather(_submit(scheduler, _task()), _submit(scheduler, _task()))
    assert len({row.id for row in rows}) == 2
    assert await _stored_new(conn) == 2


async def test_a_waiting_report_is_written_in_the_next_group_s_commit(
    scheduler: Scheduler, conn: psycopg.AsyncConnection[Any]
) -> None:
    ran = await _running(conn)
    completer = scheduler.parts.completer
    _flowing(scheduler)
    completer.add(Outcome(ran, 1, State.COMPLETED, result=b"done"), None)
    new = await _submit(scheduler, _task())
    (state, finished_by), (new_state, inserted_by) = await _row(conn, ran), await _row(conn, new.id)
    # The finish and the insert are one transaction: one commit for both.
    assert (state, new_state) == ("completed", "pending")
    assert finished_by == inserted_by
    # And the completer counted and answered it as one it wrote: a waiter is told, nothing is left.
    async with Client(scheduler.target) as client:
        done = await client.wait(ran, timeout=timedelta(seconds=10))
    assert (done.state, done.result) == (COMPLETED, b"done")
    await asyncio.wait_for(completer.flushed(), 10)
    assert completer.unwritten() == set()


async def test_a_waiting_report_is_written_alone_when_no_submit_comes(
    scheduler: Scheduler, conn: psycopg.AsyncConnection[Any]
) -> None:
    ran = await _running(conn)
    _flowing(scheduler)
    scheduler.parts.completer.add(Outcome(ran, 1, State.COMPLETED, result=b"done"), None)

    async def completed() -> bool:
        return (await _row(conn, ran))[0] == "completed"

    await eventually(completed, within=10)
    assert scheduler.parts.completer.unwritten() == set()


async def test_a_group_the_database_refuses_leaves_its_report_to_the_completer(
    scheduler: Scheduler, conn: psycopg.AsyncConnection[Any]
) -> None:
    ran = await _running(conn)
    _flowing(scheduler)
    scheduler.parts.completer.add(Outcome(ran, 1, State.COMPLETED, result=b"done"), None)
    # The database refuses the header (the API would refuse it before): the group's insert fails
    # twice, with the report and alone, and the report's finish is rolled back with it.
    with pytest.raises(psycopg.errors.DataError):
        await _submit(scheduler, _task({"h": "\x00"}))

    async def written_alone() -> tuple[str, int] | None:
        state, by = await _row(conn, ran)
        return (state, by) if state == "completed" else None

    await eventually(written_alone, within=10)
    async with Client(scheduler.target) as client:
        listed = await client.list(page_size=10)
    assert [t.id for t in listed.tasks] == [ran]


async def test_a_report_the_database_refuses_never_fails_a_submit(
    scheduler: Scheduler, conn: psycopg.AsyncConnection[Any]
) -> None:
    good, bad = await _running(conn), await _running(conn)
    completer = scheduler.parts.completer
    _flowing(scheduler)
    completer.add(Outcome(good, 1, State.COMPLETED, result=b"done"), None)
    # PostgreSQL stores no NUL in text: this report fails any statement that carries it.
    refused = Failure("Boom", "a NUL \x00 here", non_retryable=True)
    completer.add(Outcome(bad, 1, State.FAILED, failure=refused), None)
    new = await _submit(scheduler, _task())
    assert (await _row(conn, new.id))[0] == "pending"

    async def good_written() -> bool:
        return (await _row(conn, good))[0] == "completed"

    # The completer writes the reports the group gave back one by one, and leaves out the refused one.
    await eventually(good_written, within=10)
    await asyncio.wait_for(completer.flushed(), 10)
    assert (await _row(conn, bad))[0] == "running"


async def test_a_submit_never_waits_on_a_lock_held_on_a_lent_report_s_task(
    scheduler: Scheduler, conn: psycopg.AsyncConnection[Any], database_url: str
) -> None:
    """the finish lent to a group waited for a row lock like any UPDATE, and the
    submit with it; cancelled then (statement or lock timeout, a deadlock victim: OperationalError,
    so DatabaseUnavailable), it failed the submit. A locked task is left to the completer now."""
    ran = await _running(conn)
    completer = scheduler.parts.completer
    async with await psycopg.AsyncConnection.connect(database_url) as locker:
        # Another transaction holds the task's row (a submission locking its dependencies FOR
        # SHARE, a release or a cancel in flight).
        await locker.execute("SELECT 1 FROM lowtide.tasks WHERE id = %s FOR SHARE", (ran,))
        _flowing(scheduler)
        completer.add(Outcome(ran, 1, State.COMPLETED, result=b"done"), None)
        submit = asyncio.ensure_future(_submit(scheduler, _task()))
        try:
            new = await asyncio.wait_for(asyncio.shield(submit), 5)
        finally:
            await locker.rollback()
            await asyncio.wait_for(submit, 10)
    assert (await _row(conn, new.id))[0] == "pending"

    async def finished() -> bool:
        return (await _row(conn, ran))[0] == "completed"

    await eventually(finished, within=10)


async def test_the_completer_outlives_a_failure_after_a_batch_and_groups_do_not_lend_to_a_dead_one(
    scheduler: Scheduler, conn: psycopg.AsyncConnection[Any]
) -> None:
    """an exception in what follows a written batch (a waiter, a metric, a span)
    ended the completer's loop, and nothing watches it (server.py). Groups of submits went on
    lending it reports and giving them back to a list nobody reads: finishes committed, but
    waiters, retries, stale answers, dependents and flushes (a stream's end) never came."""
    completer = scheduler.parts.completer
    first, second = await _running(conn), await _running(conn)
    applied = completer._on_applied
    calls = 0

    def fails_once(ids: list[int]) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a bug after the write")
        applied(ids)

    completer._on_applied = fails_once
    completer.add(Outcome(first, 1, State.COMPLETED, result=b"done"), None)
    await asyncio.wait_for(completer.flushed(), 10)
    # The next report, carried by a group this time, is still counted and answered.
    _flowing(scheduler)
    completer.add(Outcome(second, 1, State.COMPLETED, result=b"done"), None)
    await _submit(scheduler, _task())
    await asyncio.wait_for(completer.flushed(), 5)
    assert completer.unwritten() == set()
    assert calls >= 2
