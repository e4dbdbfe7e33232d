"""The dispatcher's claims and the submit groups' inserts run on connections of their own whose
statements keep PostgreSQL's generic plan (lowtide.db.connector); every other statement keeps
custom plans, which its optional filters need."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import timedelta

import psycopg
from psycopg import sql

from lowtide.db import Database
from scheduler_service.domain.model import Kind, NewTask, RetryPolicy
from scheduler_service.domain.planning import RELEASE_LEAD
from scheduler_service.store.base import Q
from scheduler_service.store.submissions import _task_columns
from tests.integration.plans import task_rows_read


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
        **_task_columns([task]),
        "deps_pending": [0],
        "submitted_by": None,
        "signal": None,
        "signals": [None],
        "release_lead": RELEASE_LEAD,
        "wake": "",
        "workers": ["w1"],
    }
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", Q["insert_tasks_handed"])))
    text = re.sub(r"%\((\w+)\)s", lambda m: f"${names.index(m[1]) + 1}", Q["insert_tasks_handed"])
    execute = sql.SQL("EXECUTE insert_handed({})").format(sql.SQL(", ").join(sql.Literal(params[n]) for n in names))
    with psycopg.connect(database_url, autocommit=True, options="-c plan_cache_mode=force_generic_plan") as conn:
        conn.execute(
            "INSERT INTO lowtide.workers (id, pool, queues, activity_types, slots, scheduler_id, lease_expires_at) "
            "VALUES ('w1', 'default', '{default}', '{echo}', 4, 's1', now() + interval '1 hour')"
        )
        conn.execute(sql.SQL("PREPARE insert_handed AS {}").format(sql.SQL(text)))
        with conn.transaction(force_rollback=True):
            conn.execute(execute)  # planned now, on the empty table
        conn.execute(
            "INSERT INTO lowtide.tasks (queue, kind, activity_type, payload, max_attempts, initial_backoff_ms, "
            "backoff_coefficient, max_backoff_ms) "
            "SELECT 'default', 'activity', 'other', '', 3, 1000, 2.0, 60000 FROM generate_series(1, 20000)"
        )
        with conn.transaction(force_rollback=True):
            (plan,) = conn.execute(sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) {}").format(execute)).fetchone()  # type: ignore[misc]
    assert task_rows_read((json.loads(plan) if isinstance(plan, str) else plan)[0]) < 10
