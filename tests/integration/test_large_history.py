"""With a large table — a backlog and the history of finished tasks that retention keeps — the
statements a replica runs on its own every few hundred milliseconds read what they are about, not
the table: the leader's tick looks for missed fixed starts among the starts already past, the
pools' fixed-start figures read the fixed starts alone, and a submit to a queue with max_depth
counts that queue's pending tasks. Before, both read every row: with a backlog
of 1,000,000 and 1,300,000 tasks finished, half a second each, and the tick (every 500 ms) alone
kept a core of PostgreSQL busy with nothing to do."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from scheduler_service.store.base import Q
from tests.integration.plans import generic_rows_read, rows_read

BACKLOG = 40_000
FINISHED = 20_000
FIXED_OUTCOMES = 10_000  # finished fixed starts of pool "gpu": one in five a miss

_COLUMNS = "queue, kind, activity_type, payload, max_attempts, initial_backoff_ms, backoff_coefficient, max_backoff_ms"
_VALUES = "'default', 'activity', 'work', '', 3, 1000, 2.0, 60000"


@pytest.fixture
def large(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"INSERT INTO lowtide.tasks ({_COLUMNS}) SELECT {_VALUES} FROM generate_series(1, %s)", (BACKLOG,))
        conn.execute(
            f"INSERT INTO lowtide.tasks ({_COLUMNS}, state, attempt, finished_at, pool, start_at, "
            "                          start_tolerance_ms, on_miss, start_hit) "
            f"SELECT {_VALUES}, 'completed', 1, now(), 'gpu', now() - interval '1 hour', 1000, 'run_late', g %% 5 <> 0 "
            "FROM generate_series(1, %s) AS g",
            (FIXED_OUTCOMES,),
        )
        conn.execute(
            f"INSERT INTO lowtide.tasks ({_COLUMNS}, state, attempt, finished_at) "
            f"SELECT {_VALUES}, 'completed', 1, now() FROM generate_series(1, %s)",
            (FINISHED,),
        )
        conn.execute("VACUUM ANALYZE lowtide.tasks")
        yield conn


def _fixed_start(conn: psycopg.Connection[Any], *, started_ago_ms: int, tolerance_ms: int | None) -> None:
    conn.execute(
        f"INSERT INTO lowtide.tasks ({_COLUMNS}, pool, start_at, run_at, start_tolerance_ms, on_miss) "
        f"VALUES ({_VALUES}, 'gpu', now() - %(ago)s * interval '1 millisecond', "
        "        now() - %(ago)s * interval '1 millisecond', %(tolerance)s, 'run_late')",
        {"ago": started_ago_ms, "tolerance": tolerance_ms},
    )


def _due_params() -> dict[str, Any]:
    return {"horizon": datetime.now(UTC), "retention_ms": 86_400_000}


def _misses_due(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute(Q["maintenance_due"], _due_params()).fetchone()
    assert row is not None
    return bool(row[2])


def test_the_leader_s_tick_does_not_read_the_backlog_or_the_history(large: psycopg.Connection[Any]) -> None:
    # The history finished a moment ago, within a day's retention: the look for tasks to purge
    # reads the longest-finished task alone, whether the tick's statement is planned for its
    # values or, once prepared, for any (where a retention given as a parameter read the table).
    params = _due_params()
    assert rows_read(large, Q["maintenance_due"], params) == 1
    assert generic_rows_read(large, Q["maintenance_due"], params) == 1
    assert large.execute(Q["maintenance_due"], params).fetchone() == (False, False, False, False, False)


def test_the_tick_still_sees_every_missed_fixed_start_and_none_within_its_tolerance(
    large: psycopg.Connection[Any],
) -> None:
    # Within its tolerance (1 s, started 300 ms ago), and a start still ahead: nothing due.
    _fixed_start(large, started_ago_ms=300, tolerance_ms=1000)
    _fixed_start(large, started_ago_ms=-60_000, tolerance_ms=0)
    assert not _misses_due(large)
    # Without a tolerance a start counts 50 ms: one 200 ms past is missed, and what the tick
    # reads is the starts already past, not the backlog.
    _fixed_start(large, started_ago_ms=200, tolerance_ms=None)
    assert _misses_due(large)
    assert rows_read(large, Q["maintenance_due"], _due_params()) <= 3
    missed = large.execute(Q["missed_fixed"], {"lease_ms": 10_000}).fetchall()
    assert len(missed) == 1


def test_the_pools_fixed_start_figures_read_the_fixed_starts_alone(large: psycopg.Connection[Any]) -> None:
    _fixed_start(large, started_ago_ms=-60_000, tolerance_ms=1000)
    _fixed_start(large, started_ago_ms=-120_000, tolerance_ms=1000)
    assert rows_read(large, Q["pool_fixed_stats"], {}) == FIXED_OUTCOMES + 2
    (stats,) = large.execute(Q["pool_fixed_stats"]).fetchall()
    pool, ahead, hit_rate = stats
    assert pool == "gpu"
    assert len(ahead) == 2 and ahead[0] < ahead[1]
    assert hit_rate == pytest.approx(0.8)


def test_a_limited_queue_s_depth_is_counted_from_its_own_pending_tasks(large: psycopg.Connection[Any]) -> None:
    # Each submit to a queue with max_depth counts it, under the queue's lock: on the claim
    # indexes it reads that queue's few pending tasks, not the backlog of others or the history.
    large.execute(
        f"INSERT INTO lowtide.tasks ({_COLUMNS}, resources) "
        f"SELECT 'limited', 'activity', 'work', '', 3, 1000, 2.0, 60000, "
        "       CASE WHEN g % 2 = 0 THEN '{\"gpu\": 1}'::jsonb END "
        "FROM generate_series(1, 6) AS g"
    )
    params = {"queue": "limited", "held": []}
    assert large.execute(Q["claimable_depth"], params).fetchone() == (6,)
    assert rows_read(large, Q["claimable_depth"], params) == 6
