"""The dispatcher's claims and the submit groups' inserts run on connections of their own whose
statements keep PostgreSQL's generic plan (lowtide.db.connector); every other statement keeps
custom plans, which its optional filters need."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from lowtide.db import Database
from lowtide.db.connector import _GENERIC_PLANS
from scheduler_service.domain.model import Kind, NewTask, RetryPolicy
from scheduler_service.domain.planning import RELEASE_LEAD
from scheduler_service.store.base import Q
from scheduler_service.store.submissions import handed_group
from tests.integration.plans import rows_read_planned_before


@dataclass(frozen=True, slots=True)
class Setting:
    plan_cache_mode: str


async def test_planned_statements_keep_generic_plans_and_the_rest_custom_ones(database_url: str) -> None:
    db = Database(database_url, min_size=1, max_size=2, planned_max=1)
    await db.open()
    try:
        show = "SELECT current_setting('plan_cache_mode') AS plan_cache_mode"
        assert await db.fetch_as(Setting, show, planned=True) == [Setting("force_generic_plan")]
        async with db.transaction(planned=True) as tx:
            assert await tx.fetch_one_as(Setting, show) == Setting("force_generic_plan")
        assert await db.fetch_as(Setting, show) == [Setting("auto")]
        async with db.transaction() as tx:
            assert await tx.fetch_one_as(Setting, show) == Setting("auto")
    finally:
        await db.close()


def test_the_group_insert_planned_on_an_empty_table_reads_no_backlog_later(database_url: str) -> None:
    """The insert of a group of single submits keeps one generic plan (store/submissions.py), made
    when the table may be all but empty. Planned so, its check for older due work of the task's
    queue and type was a hash of every due pending task, built on every insert: with a backlog of
    20,000 tasks of another type, 20,000 rows read for each submit. It is a probe per task."""
    task = NewTask("default", Kind.ACTIVITY, "echo", b"", 0, None, RetryPolicy(3, timedelta(1), 2.0, timedelta(60)),
                   None, None, None)  # fmt: skip
    params = {
        "group": handed_group([task], ["w1"], [None]),
        "submitted_by": None,
        "signal": None,
        "release_lead": RELEASE_LEAD,
        "wake": "",
    }
    worker = (
        "INSERT INTO lowtide.workers (id, pool, queues, activity_types, slots, scheduler_id, lease_expires_at) "
        "VALUES ('w1', 'default', '{default}', '{echo}', 4, 's1', now() + interval '1 hour')"
    )
    backlog = _BACKLOG.format(activity_type="other")
    assert rows_read_planned_before(database_url, Q["insert_tasks_handed"], params, [worker], [backlog]) < 10


_BACKLOG = (
    "INSERT INTO lowtide.tasks (queue, kind, activity_type, payload, max_attempts, initial_backoff_ms, "
    "backoff_coefficient, max_backoff_ms) "
    "SELECT 'default', 'activity', '{activity_type}', '', 3, 1000, 2.0, 60000 FROM generate_series(1, 20000)"
)
_WORKERS = (
    "INSERT INTO lowtide.workers (id, pool, queues, activity_types, slots, scheduler_id, lease_expires_at) "
    "SELECT 'w' || n, 'default', '{{default}}', '{{echo}}', 64, 's1', now() + interval '1 hour' "
    "FROM generate_series(1, 2) AS n"
)


@pytest.mark.parametrize("statement", ["claim_pair", "claim_tasks"])
def test_a_claim_planned_on_an_empty_table_reads_no_backlog_later(database_url: str, statement: str) -> None:
    """A claim keeps one generic plan (lowtide.db.connector), made when the table may be all but
    empty. Planned so, locking the candidates it chose joined them with the table by walking every
    pending task: behind a burst of single submits, a claim of 64 slots read the whole backlog, the
    claims grew dearer as the backlog grew, and at 1,000 submits a second a few hundred were done.
    With 20,000 tasks of its type waiting, a claim reads about its candidates (twice its slots)."""
    slots: dict[str, Any] = {
        "workers": "w1\x1fw2",
        "free": "64,64",
        "signal": None,
        "pool": "default",
        "release_lead": timedelta(seconds=1),
    }
    if statement == "claim_pair":
        params = {**slots, "queue": "default", "activity_type": "echo", "cap": 128}
    else:
        held: dict[str, list[Any]] = {"held_queues": [], "held_types": [], "held_caps": []}
        params = {**slots, "queues": ["default"], "types": ["echo"], "caps": [256], **held}
    read = rows_read_planned_before(
        database_url, Q[statement], params, [_WORKERS.format()], [_BACKLOG.format(activity_type="echo")]
    )
    # The 256 candidates read off the index, each looked up again to lock it, and the 128 updated.
    assert read <= 2 * 256 + 128 + 16


def test_a_claim_on_its_connections_is_not_compiled(database_url: str) -> None:
    """Sequential scans are off where the claims run, and the planner's penalty for a scan it must
    make all the same (the paused queues, read whole) put every claim's cost over `jit_above_cost`:
    PostgreSQL compiled each claim (30 ms to 2 s on a 2-core machine) before running it."""
    params = {
        "workers": "w1",
        "free": "4",
        "signal": None,
        "pool": "default",
        "release_lead": timedelta(seconds=1),
        "queues": ["default", "default"],
        "types": ["echo", "limited"],
        "caps": [8, 1],
        "held_queues": [],
        "held_types": [],
        "held_caps": [],
    }
    with psycopg.connect(database_url, autocommit=True, options=_GENERIC_PLANS) as conn:
        conn.execute(_WORKERS.format())
        conn.execute(_BACKLOG.format(activity_type="echo"))
        with conn.transaction(force_rollback=True):
            (plan,) = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + Q["claim_tasks"], params).fetchone()  # type: ignore[misc]
    assert "JIT" not in (json.loads(plan) if isinstance(plan, str) else plan)[0]
