"""A listing filtered by queue or activity type does a bounded read a page, however large the
table: no index finds a queue's tasks newest first, and a page for a rare queue read every task
(590 ms for 2,300,000; a table kept for a week at 100 tasks a second holds 60,000,000). Each page
now looks among FILTER_WINDOW ids and says where to go on; paging still finds every match, newest
first."""

from __future__ import annotations

from typing import Any

import psycopg

from lowtide_client import Client
from scheduler_service.api.scheduler import FILTER_WINDOW
from scheduler_service.server import Scheduler
from scheduler_service.store.base import Q
from tests.integration.plans import rows_read

BULK = 2 * FILTER_WINDOW + 50_000


def _fill(database_url: str) -> list[int]:
    """BULK tasks on queue "bulk" with three on queue "rare" among them (near the start, the
    middle and the end); returns the rare ones' ids, newest first."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO lowtide.tasks (queue, kind, activity_type, payload, max_attempts, initial_backoff_ms, "
            "                           backoff_coefficient, max_backoff_ms, state, attempt, finished_at) "
            "SELECT CASE WHEN g IN (10, %(mid)s, %(end)s) THEN 'rare' ELSE 'bulk' END, 'activity', 'work', '', "
            "       3, 1000, 2.0, 60000, 'completed', 1, now() "
            "FROM generate_series(1, %(n)s) AS g",
            {"n": BULK, "mid": BULK // 2, "end": BULK - 10},
        )
        conn.execute("VACUUM ANALYZE lowtide.tasks")
        rows = conn.execute("SELECT id FROM lowtide.tasks WHERE queue = 'rare' ORDER BY id DESC").fetchall()
    return [r[0] for r in rows]


async def test_paging_a_rare_queue_finds_every_task_newest_first_in_bounded_pages(
    scheduler: Scheduler, database_url: str
) -> None:
    rare = _fill(database_url)
    found: list[int] = []
    pages = 0
    token = ""
    async with Client(scheduler.target) as client:
        while True:
            page = await client.list(queue="rare", page_size=2, page_token=token)
            if not pages:
                # The newest FILTER_WINDOW ids hold one of them: a short page, and a token to go on.
                assert [t.id for t in page.tasks] == rare[:1] and page.next_page_token
            pages += 1
            assert len(page.tasks) <= 2
            found.extend(t.id for t in page.tasks)
            token = page.next_page_token
            if not token:
                break
        # Unfiltered and by state, a page is full while there is more: no window there.
        whole = await client.list(page_size=1000)
        assert len(whole.tasks) == 1000 and whole.next_page_token
    assert found == rare
    assert pages >= BULK // FILTER_WINDOW


def test_a_filtered_page_reads_at_most_its_window(database_url: str) -> None:
    _fill(database_url)
    params: dict[str, Any] = {
        "queue": "rare",
        "state": None,
        "activity_type": None,
        "before_id": None,
        "from_id": BULK + 1 - FILTER_WINDOW,
        "limit": 51,
    }
    with psycopg.connect(database_url, autocommit=True) as conn:
        assert rows_read(conn, Q["list_tasks"], params) <= FILTER_WINDOW
        assert rows_read(conn, Q["list_tasks"], {**params, "state": "completed"}) <= FILTER_WINDOW


def test_a_page_by_state_reads_that_page_even_under_many_newer_tasks_of_other_states(database_url: str) -> None:
    # A backlog of 150,000 pending tasks older than BULK finished ones: a page of the pending
    # reads the page on the state's index, not every newer finished task on the way down the
    # primary key (which the planner chose for a plain state = ..., guessing the pending spread
    # evenly among the rest, and read all BULK of them).
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO lowtide.tasks (queue, kind, activity_type, payload, max_attempts, initial_backoff_ms, "
            "                           backoff_coefficient, max_backoff_ms) "
            "SELECT 'old', 'activity', 'work', '', 3, 1000, 2.0, 60000 FROM generate_series(1, 150000)"
        )
    _fill(database_url)
    params: dict[str, Any] = {
        "queue": None,
        "state": "pending",
        "activity_type": None,
        "before_id": None,
        "from_id": None,
        "limit": 51,
    }
    with psycopg.connect(database_url, autocommit=True) as conn:
        page = conn.execute(Q["list_tasks_in_state"], params).fetchall()
        assert rows_read(conn, Q["list_tasks_in_state"], params) == 51
    assert len(page) == 51
