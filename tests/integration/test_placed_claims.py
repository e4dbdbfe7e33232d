"""A claim for one pool does not read the work placed in another: tasks the plan placed in
eu-central, waiting for their planned release or released there and waiting for its slots, cost
an eu-west claim nothing until their latest start (as held work costs a claim nothing), while
eu-central's claim takes them from their planned release on. EXPLAIN ANALYZE of the statements
dispatch runs, on a table of 20,000 placed tasks."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from scheduler_service.store.base import Q
from tests.integration.plans import rows_read

PLACED = 10_000
_COLUMNS = "queue, kind, activity_type, payload, max_attempts, initial_backoff_ms, backoff_coefficient, max_backoff_ms"
_VALUES = "'default', 'activity', 'train', '', 3, 1000, 2.0, 60000"
# As apply_plans stores a placed task: due for other pools from its latest start only.
_PLACED = (
    f"INSERT INTO lowtide.tasks ({_COLUMNS}, pools, planned_pool, latest_start, run_at, hold_deadline, "
    "planned_release_at) "
    f"SELECT {_VALUES}, '{{eu-west,eu-central}}', 'eu-central', now() + interval '8 hours', "
    "now() + interval '8 hours' - interval '1 second', now() + interval '8 hours' - interval '1 second', "
    "now() + %(release)s::interval FROM generate_series(1, %(count)s)"
)


def _fill(conn: psycopg.Connection[Any], *, placed: bool) -> None:
    conn.execute("DELETE FROM lowtide.tasks")
    conn.execute("DELETE FROM lowtide.workers")
    for worker, pool in (("west", "eu-west"), ("central", "eu-central")):
        conn.execute(
            "INSERT INTO lowtide.workers (id, pool, queues, activity_types, slots, scheduler_id, lease_expires_at) "
            "VALUES (%s, %s, '{default}', '{train}', 10, 's', now() + interval '1 hour')",
            (worker, pool),
        )
    conn.execute(f"INSERT INTO lowtide.tasks ({_COLUMNS}) SELECT {_VALUES} FROM generate_series(1, 10)")
    if placed:
        # Half waiting for their planned release, half released in eu-central and waiting there.
        conn.execute(_PLACED, {"release": "1 hour", "count": PLACED})
        conn.execute(_PLACED, {"release": "-1 minute", "count": PLACED})
    conn.execute("VACUUM ANALYZE lowtide.tasks")


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(database_url, autocommit=True) as connection:
        yield connection


def _claims(conn: psycopg.Connection[Any], worker: str, pool: str) -> dict[str, int]:
    slot = {"workers": worker, "free": "10", "signal": None, "pool": pool, "release_lead": timedelta(seconds=1)}
    pair = {**slot, "queue": "default", "activity_type": "train", "cap": 10}
    held = {**slot, "queues": [], "types": [], "caps": [], "held_queues": ["default"], "held_types": ["train"]}
    opened = {**slot, "queues": ["default"], "types": ["train"], "caps": [20], "held_queues": [], "held_types": []}
    return {
        "claim_pair": rows_read(conn, Q["claim_pair"], pair),
        "claim_tasks held": rows_read(conn, Q["claim_tasks"], {**held, "held_caps": [20]}),
        "claim_tasks open": rows_read(conn, Q["claim_tasks"], {**opened, "held_caps": []}),
    }


def test_an_other_pool_s_claim_reads_nothing_placed_elsewhere(conn: psycopg.Connection[Any]) -> None:
    _fill(conn, placed=True)
    # Ten tasks to take and 20,000 placed in eu-central: each statement reads what it takes (and
    # the index entries and rows it updates), never the placed ones. Before, a claim read past
    # every placed task that was released in its own pool (10,000 here).
    for statement, read in _claims(conn, "west", "eu-west").items():
        assert read <= 100, statement


def test_the_pool_a_task_was_placed_in_takes_it_from_its_planned_release(conn: psycopg.Connection[Any]) -> None:
    _fill(conn, placed=True)
    slot = {"workers": "central", "free": "10", "signal": None, "pool": "eu-central"}
    pair = {**slot, "queue": "default", "activity_type": "train", "cap": 10, "release_lead": timedelta(seconds=1)}
    with conn.transaction(force_rollback=True):
        taken = conn.execute(Q["claim_pair"], pair).fetchall()
    assert len(taken) == 10
    ids = [row[0] for row in taken]
    released = conn.execute(
        "SELECT count(*) FROM lowtide.tasks WHERE id = ANY(%s) AND planned_pool = 'eu-central' "
        "AND planned_release_at <= now()",
        (ids,),
    ).fetchone()
    assert released == (10,)
    # West's claim takes the ten tasks that name no pool, none of eu-central's.
    with conn.transaction(force_rollback=True):
        west = conn.execute(Q["claim_pair"], {**pair, "workers": "west", "pool": "eu-west"}).fetchall()
        assert len(west) == 10
        placed = conn.execute(
            "SELECT count(*) FROM lowtide.tasks WHERE id = ANY(%s) AND planned_pool IS NOT NULL",
            ([row[0] for row in west],),
        ).fetchone()
    assert placed == (0,)


def test_a_retry_of_a_placed_task_runs_in_any_pool_it_names_after_its_backoff(conn: psycopg.Connection[Any]) -> None:
    _fill(conn, placed=False)
    conn.execute(
        f"INSERT INTO lowtide.tasks ({_COLUMNS}, pools, planned_pool, latest_start, run_at, hold_deadline, "
        "planned_release_at, attempt) "
        f"SELECT {_VALUES}, '{{eu-west,eu-central}}', 'eu-central', now() + interval '8 hours', "
        "now() + %(backoff)s::interval, now() - interval '1 minute', now() - interval '1 minute', 1 "
        "FROM generate_series(1, 2)",
        {"backoff": "1 hour"},
    )
    conn.execute("DELETE FROM lowtide.tasks WHERE pools IS NULL")
    slot = {"free": "10", "signal": None, "release_lead": timedelta(seconds=1)}
    pair = {**slot, "queue": "default", "activity_type": "train", "cap": 10}
    for worker, pool in (("west", "eu-west"), ("central", "eu-central")):
        with conn.transaction(force_rollback=True):
            # Waiting out its backoff: no pool takes it, its own neither.
            assert conn.execute(Q["claim_pair"], {**pair, "workers": worker, "pool": pool}).fetchall() == []
    conn.execute("UPDATE lowtide.tasks SET run_at = now() - interval '1 second'")
    for worker, pool in (("west", "eu-west"), ("central", "eu-central")):
        with conn.transaction(force_rollback=True):
            assert len(conn.execute(Q["claim_pair"], {**pair, "workers": worker, "pool": pool}).fetchall()) == 2


def test_a_placed_task_handed_back_is_due_for_the_other_pools_only_at_its_latest_start(
    conn: psycopg.Connection[Any],
) -> None:
    _fill(conn, placed=False)
    conn.execute("DELETE FROM lowtide.tasks")
    conn.execute(_PLACED, {"release": "-1 minute", "count": 1})
    slot = {"free": "10", "signal": None, "release_lead": timedelta(seconds=1)}
    pair = {**slot, "queue": "default", "activity_type": "train", "cap": 10}
    [claimed] = conn.execute(Q["claim_pair"], {**pair, "workers": "central", "pool": "eu-central"}).fetchall()
    # Its worker left before it was sent: back as it was, eu-west's claim does not take it.
    back = {"ids": [claimed[0]], "attempts": [1], "worker_ids": ["central"], "release_lead": timedelta(seconds=1)}
    conn.execute(Q["unclaim_tasks"], back)
    assert conn.execute(Q["claim_pair"], {**pair, "workers": "west", "pool": "eu-west"}).fetchall() == []
    assert len(conn.execute(Q["claim_pair"], {**pair, "workers": "central", "pool": "eu-central"}).fetchall()) == 1


@pytest.mark.parametrize("statement", ["claim_pair", "claim_tasks"])
def test_a_placed_task_waits_behind_better_priority_and_goes_before_worse(
    conn: psycopg.Connection[Any], statement: str
) -> None:
    # One slot in eu-central, a task placed there and released a minute ago (priority 0), and a
    # task naming no pool due now: the claim takes the better priority first, whichever it is.
    _fill(conn, placed=False)
    conn.execute("DELETE FROM lowtide.tasks")
    conn.execute(_PLACED, {"release": "-1 minute", "count": 1})
    conn.execute(f"INSERT INTO lowtide.tasks ({_COLUMNS}, priority) SELECT {_VALUES}, 5")
    params = _one_slot_params()

    def first_taken() -> str:
        with conn.transaction(force_rollback=True):
            [row] = conn.execute(Q[statement], params).fetchall()
            found = conn.execute("SELECT planned_pool FROM lowtide.tasks WHERE id = %s", (row[0],)).fetchone()
        assert found is not None
        return "placed" if found[0] else "regular"

    assert first_taken() == "regular"
    conn.execute("UPDATE lowtide.tasks SET priority = 9 WHERE planned_pool IS NOT NULL")
    assert first_taken() == "placed"
    # Equal priorities: the placed task is due since its release, before the other was submitted.
    conn.execute("UPDATE lowtide.tasks SET priority = 5")
    assert first_taken() == "placed"


def _one_slot_params() -> dict[str, Any]:
    return {
        "workers": "central",
        "free": "1",
        "signal": None,
        "pool": "eu-central",
        "release_lead": timedelta(seconds=1),
        "queue": "default",
        "activity_type": "train",
        "cap": 1,
        "queues": ["default"],
        "types": ["train"],
        "caps": [2],
        "held_queues": [],
        "held_types": [],
        "held_caps": [],
    }


@pytest.mark.parametrize("statement", ["claim_pair", "claim_tasks"])
def test_a_placed_task_of_better_priority_released_later_goes_first(
    conn: psycopg.Connection[Any], statement: str
) -> None:
    # Three placed tasks of priority 0 released two minutes ago, one of priority 9
    # released a minute ago, and a task naming no pool of priority 5; one slot. Ranked "with the
    # pool's other due work by priority", the priority-9 task goes first.
    _fill(conn, placed=False)
    conn.execute("DELETE FROM lowtide.tasks")
    conn.execute(_PLACED, {"release": "-2 minutes", "count": 3})
    conn.execute(_PLACED, {"release": "-1 minute", "count": 1})
    conn.execute("UPDATE lowtide.tasks SET priority = 9 WHERE planned_release_at > now() - interval '90 seconds'")
    conn.execute(f"INSERT INTO lowtide.tasks ({_COLUMNS}, priority) SELECT {_VALUES}, 5")
    with conn.transaction(force_rollback=True):
        [row] = conn.execute(Q[statement], _one_slot_params()).fetchall()
        found = conn.execute("SELECT priority FROM lowtide.tasks WHERE id = %s", (row[0],)).fetchone()
    assert found == (9,)


def test_claim_pair_locks_no_row_it_does_not_take(database_url: str, conn: psycopg.Connection[Any]) -> None:
    # One placed task released (priority 0) and one task naming no pool (priority 5), and
    # two claimers of one slot each. While the first claim's statement has not committed, the
    # second must still find the task the first did not take.
    _fill(conn, placed=False)
    conn.execute("DELETE FROM lowtide.tasks")
    conn.execute(_PLACED, {"release": "-1 minute", "count": 1})
    conn.execute(f"INSERT INTO lowtide.tasks ({_COLUMNS}, priority) SELECT {_VALUES}, 5")
    with psycopg.connect(database_url) as first, psycopg.connect(database_url, autocommit=True) as second:
        taken = first.execute(Q["claim_pair"], _one_slot_params()).fetchall()
        assert len(taken) == 1
        with second.transaction(force_rollback=True):
            other = second.execute(Q["claim_pair"], _one_slot_params()).fetchall()
        first.rollback()
    assert len(other) == 1
