"""With tens of thousands of attempts running, the statements that end or beat for a batch of them
read the rows they name, and the leader's tick reads a row per worker, not every running attempt:
their cost follows the batch or the fleet, not the work in flight. Statistics lag behind
(autoanalyze waits for a tenth of a big table to change, while a fleet's ramp-up starts attempts by
the ten thousand), and a plan made on statistics that saw few attempts running read all of them
through a running-only index: 84 ms a completion batch of 64 with 60,000 running, against 2.4 ms by
id; the tick's look for expired attempts read all of them whatever the statistics (59 ms with
60,000 running on 500 workers, against 2.7 ms)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from scheduler_service.domain.model import Kind, NewTask, Outcome, RetryPolicy, State
from scheduler_service.domain.planning import RELEASE_LEAD
from scheduler_service.store.base import Q
from scheduler_service.store.submissions import handed_group
from scheduler_service.store.tasks import finish_params
from tests.integration.plans import generic_rows_read, rows_read

RUNNING = 20_000
BATCH = 64
_PLAIN = NewTask("default", Kind.ACTIVITY, "b", b"", 0, None, RetryPolicy(3, timedelta(1), 2.0, timedelta(60)),
                 None, None, None)  # fmt: skip


@pytest.fixture
def many_running(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A database whose statistics were taken when 20 attempts ran, with 20,000 running now (and
    no autovacuum to catch up meanwhile)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE lowtide.tasks SET (autovacuum_enabled = false)")
        conn.execute(
            """
            INSERT INTO lowtide.tasks (queue, kind, activity_type, payload, state, worker_id, attempt,
                                       started_at, run_at, max_attempts, initial_backoff_ms,
                                       backoff_coefficient, max_backoff_ms, heartbeat_ms)
            SELECT 'default', 'activity', 'work', '', CASE WHEN g <= 20 THEN 'running' ELSE 'completed' END,
                   'w1', 1, now(), now(), 3, 1000, 2.0, 60000, 30000
            FROM generate_series(1, %s) AS g
            """,
            (2 * RUNNING,),
        )
        conn.execute("ANALYZE lowtide.tasks")
        conn.execute("UPDATE lowtide.tasks SET state = 'running' WHERE id <= %s", (RUNNING,))
        yield conn


def test_a_completion_batch_reads_the_attempts_it_ends(many_running: psycopg.Connection[Any]) -> None:
    outcomes = [(Outcome(task_id, 1, State.COMPLETED, result=b"ok"), "w1") for task_id in range(1000, 1000 + BATCH)]
    for name in ("finish_independent_attempts", "finish_attempts"):
        assert rows_read(many_running, Q[name], finish_params(outcomes)) == BATCH, name


def test_a_completion_batch_written_with_a_group_s_insert_reads_the_attempts_it_ends(
    many_running: psycopg.Connection[Any],
) -> None:
    # Written with the insert of a group of single submits (store/submissions.py), on the
    # connections whose statements keep one generic plan: that plan reads them by id too.
    outcomes = [(Outcome(task_id, 1, State.COMPLETED, result=b"ok"), "w1") for task_id in range(1000, 1000 + BATCH)]
    params = finish_params(outcomes)
    assert generic_rows_read(many_running, Q["finish_independent_attempts"], params) == BATCH
    # The insert that writes reports lent to it reads each twice (locked, then ended), never the running set.
    group: dict[str, Any] = {"group": handed_group([_PLAIN], [None], [None])}
    group |= {"submitted_by": None, "signal": None, "release_lead": RELEASE_LEAD, "wake": ""}
    assert generic_rows_read(many_running, Q["insert_tasks_handed_finishing"], group | params) <= 2 * BATCH


def test_a_heartbeat_batch_reads_the_attempts_it_names(many_running: psycopg.Connection[Any]) -> None:
    ids = list(range(1000, 1000 + BATCH))
    params = {"ids": ids, "attempts": [1] * BATCH, "workers": "\x1f".join(["w1"] * BATCH), "ages": [0] * BATCH}
    assert rows_read(many_running, Q["heartbeat_attempts"], params) == BATCH


def test_claimed_attempts_handed_back_are_read_by_id(many_running: psycopg.Connection[Any]) -> None:
    ids = list(range(1000, 1000 + BATCH))
    params = {"ids": ids, "attempts": [1] * BATCH, "worker_ids": ["w1"] * BATCH, "release_lead": timedelta(seconds=1)}
    assert rows_read(many_running, Q["unclaim_tasks"], params) == BATCH


def test_the_leader_s_tick_reads_a_row_per_worker_not_per_running_attempt(
    many_running: psycopg.Connection[Any],
) -> None:
    # 20,000 attempts of one live worker and nothing due: the tick's look for expired attempts
    # reads the one worker's first attempt (the skip scan), not all 20,000 (and the look for
    # tasks past their retention the longest-finished task alone).
    many_running.execute(
        "INSERT INTO lowtide.workers (id, pool, queues, activity_types, slots, scheduler_id, lease_expires_at) "
        "VALUES ('w1', 'default', '{default}', '{work}', 100000, 'replica', now() + interval '1 hour')"
    )
    params = {"horizon": datetime.now(UTC), "retention_ms": 86_400_000}
    assert rows_read(many_running, Q["maintenance_due"], params) <= 3
    assert many_running.execute(Q["maintenance_due"], params).fetchone() == (False, False, False, False, False)


def test_attempts_of_a_worker_whose_lease_ran_out_or_whose_row_is_gone_expire_and_no_others(
    database_url: str,
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO lowtide.workers (id, pool, queues, activity_types, slots, scheduler_id, lease_expires_at) "
            "VALUES ('live', 'default', '{default}', '{work}', 4, 'replica', now() + interval '1 hour'), "
            "       ('late', 'default', '{default}', '{work}', 4, 'replica', now() - interval '1 second')"
        )
        conn.execute(
            """
            INSERT INTO lowtide.tasks (queue, kind, activity_type, payload, state, worker_id, attempt,
                                       started_at, run_at, max_attempts, initial_backoff_ms,
                                       backoff_coefficient, max_backoff_ms, close_deadline, heartbeat_deadline)
            VALUES ('default', 'activity', 'work', 'live', 'running', 'live', 1, now(), now(), 3, 1000, 2.0, 60000,
                    now() + interval '1 hour', NULL),
                   ('default', 'activity', 'work', 'late', 'running', 'late', 1, now(), now(), 3, 1000, 2.0, 60000,
                    now() + interval '1 hour', NULL),
                   ('default', 'activity', 'work', 'ghost', 'running', 'ghost', 1, now(), now(), 3, 1000, 2.0, 60000,
                    NULL, NULL),
                   ('default', 'activity', 'work', 'closed', 'running', 'live', 1, now(), now(), 3, 1000, 2.0, 60000,
                    now() - interval '1 second', NULL),
                   ('default', 'activity', 'work', 'silent', 'running', 'live', 1, now(), now(), 3, 1000, 2.0, 60000,
                    NULL, now() - interval '1 second')
            """
        )
        due = conn.execute(Q["maintenance_due"], {"horizon": datetime.now(UTC), "retention_ms": 0}).fetchone()
        assert due is not None and due[3] is True
        rows = conn.execute(
            "SELECT t.payload, e.reason FROM (" + Q["expired_attempts"] + ") e JOIN lowtide.tasks t USING (id)",
            {"limit": 100},
        ).fetchall()
        assert sorted((bytes(p).decode(), r) for p, r in rows) == [
            ("closed", "StartToCloseTimeout"),
            ("ghost", "WorkerLost"),
            ("late", "WorkerLost"),
            ("silent", "HeartbeatTimeout"),
        ]
