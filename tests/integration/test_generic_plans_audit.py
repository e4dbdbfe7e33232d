"""Every statement lowtide runs over and over (submits, claims, heartbeats, leases, finishes'
neighbours, the leader's tick, the planner's reads, the console's polls), planned when the tables
are all but empty, as on a fresh install (never analyzed: PostgreSQL assumes 10 pages), or just
analyzed with 200 rows (what autovacuum does after the first 50 writes: 8 pages, where a sequential
scan costs less than one index probe), then run with 20,000 tasks pending, 20,000 running and
20,000 finished: it must read about what it returns, locks or counts, not the backlog. The claims
and the group inserts keep the generic plan made then (lowtide.db.connector); every other statement
is planned as it runs, with the statistics the table had (a plan kept so, once psycopg prepared a
statement, read the backlog for a score of them: the heartbeats, the hand-backs, the finishes, the
leader's tick, the dependencies)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from lowtide.db.connector import _GENERIC_PLANS
from scheduler_service.domain.model import Kind, NewTask, Outcome, RetryPolicy, State
from scheduler_service.domain.planning import RELEASE_LEAD
from scheduler_service.store.base import Q
from scheduler_service.store.submissions import handed_group, task_columns
from scheduler_service.store.tasks import finish_params
from tests.integration.plans import rows_read_planned_before_each

PENDING, RUNNING, FINISHED = 1_000, 21_000, 41_000  # the first id of each part of the backlog
BATCH = 64
WORKERS = 100

_COLUMNS = "queue, kind, activity_type, payload, max_attempts, initial_backoff_ms, backoff_coefficient, max_backoff_ms"
_VALUES = "'default', 'activity', 'echo', '', 3, 1000, 2.0, 60000"
_WORKERS = (
    "INSERT INTO lowtide.workers (id, pool, queues, activity_types, slots, scheduler_id, lease_expires_at) "
    "SELECT 'w' || n, 'default', '{{default}}', '{{echo}}', 256, 's1', now() + interval '1 hour' "
    "FROM generate_series(1, {n}) AS n ON CONFLICT DO NOTHING"
)


def _setup(rows: int, *, analyze: bool) -> list[str]:
    """Two workers and a few tasks of every state; ids the backlog does not use (it gives its own)."""
    setup = [
        _WORKERS.format(n=2),
        "ALTER TABLE lowtide.tasks SET (autovacuum_enabled = false)",
        "SELECT setval('lowtide.tasks_id_seq', 10000000)",
        f"INSERT INTO lowtide.tasks (id, {_COLUMNS}, state, attempt, worker_id, finished_at, heartbeat_deadline, "
        "                          close_deadline) OVERRIDING SYSTEM VALUE "
        f"SELECT g, {_VALUES}, (ARRAY['pending', 'running', 'completed', 'completed'])[1 + g % 4], "
        "       CASE WHEN g % 4 = 0 THEN 0 ELSE 1 END, CASE WHEN g % 4 = 0 THEN NULL ELSE 'w1' END, "
        "       CASE WHEN g % 4 >= 2 THEN now() END, CASE WHEN g % 4 = 1 THEN now() + interval '1 hour' END, "
        "       CASE WHEN g % 4 = 1 THEN now() + interval '1 hour' END "
        f"FROM generate_series(1, {rows}) AS g",
    ]
    return [*setup, "ANALYZE lowtide.tasks", "ANALYZE lowtide.workers"] if analyze else setup


def _part(first: int, columns: str, values: str) -> str:
    return (
        f"INSERT INTO lowtide.tasks (id, {_COLUMNS}{columns}) OVERRIDING SYSTEM VALUE "
        f"SELECT g, {_VALUES}{values} FROM generate_series({first}, {first + 19_999}) AS g"
    )


_BACKLOG = [
    _WORKERS.format(n=WORKERS),
    _part(PENDING, ", schedule_to_start_deadline", ", now() + interval '1 hour'"),
    _part(
        RUNNING,
        ", state, attempt, worker_id, started_at, close_deadline, heartbeat_deadline, heartbeat_ms",
        f", 'running', 1, 'w' || (1 + g % {WORKERS}), now(), now() + interval '1 hour', "
        "now() + interval '1 hour', 60000",
    ),
    _part(FINISHED, ", state, attempt, worker_id, started_at, finished_at", ", 'completed', 1, 'w1', now(), now()"),
]

_running = list(range(RUNNING, RUNNING + BATCH))
_their_workers = [f"w{1 + i % WORKERS}" for i in _running]
_pending = list(range(PENDING, PENDING + BATCH))
_finished = list(range(FINISHED, FINISHED + BATCH))
_of_w1 = [i for i in range(RUNNING, RUNNING + 1000) if 1 + i % WORKERS == 1][:4]
_slots = {"workers": "w1\x1fw2", "free": "64,64", "signal": None, "pool": "default", "release_lead": RELEASE_LEAD}
_task = NewTask("default", Kind.ACTIVITY, "echo", b"", 0, None, RetryPolicy(3, timedelta(1), 2.0, timedelta(60)),
                None, None, None)  # fmt: skip
_insert = {**task_columns([_task], [None]), "deps_pending": [0], "submitted_by": None, "signal": None,
           "release_lead": RELEASE_LEAD, "wake": ""}  # fmt: skip
_handed = {"submitted_by": None, "signal": None, "release_lead": RELEASE_LEAD, "wake": "",
           "group": handed_group([_task], ["w1"], [None])}  # fmt: skip
_reports = [(Outcome(i, 1, State.COMPLETED, result=b""), w) for i, w in zip(_running, _their_workers, strict=True)]
# A worker's own running attempts, read by a statement about some of them: what it runs, not the backlog.
_OWN_RUNNING = 20_000 // WORKERS + 8
_PLANNED = _GENERIC_PLANS  # the claims' and the group insert's connections
_PREPARED = None  # any other: never prepared, planned on each run (lowtide.db.connector)

# name: (params, connections, rows it may read: what it returns, locks or counts, and its LIMIT)
STATEMENTS: dict[str, tuple[dict[str, Any], str | None, int]] = {
    "claim_pair": ({**_slots, "queue": "default", "activity_type": "echo", "cap": 128}, _PLANNED, 2 * 256 + 144),
    "claim_tasks": (
        {
            **_slots,
            "queues": ["default"],
            "types": ["echo"],
            "caps": [256],
            "held_queues": [],
            "held_types": [],
            "held_caps": [],
        },
        _PLANNED,
        2 * 256 + 144,
    ),
    "claim_fixed_due": ({**_slots, "queues": ["default"], "types": ["echo"]}, _PREPARED, 8),
    "insert_tasks_handed": (_handed, _PLANNED, 8),
    # A group's insert with the reports lent to it (a batch of 64): each report's task probed by its id.
    "insert_tasks_handed_finishing": ({**_handed, **finish_params(_reports)}, _PLANNED, 8 + 2 * BATCH),
    "insert_tasks": (_insert, _PREPARED, 8),
    "tasks_by_idempotency_key": ({"keys": ["k1", "k2"], "submitted_by": None}, _PREPARED, 8),
    "lock_dependencies": ({"ids": _pending[:3]}, _PREPARED, 8),
    "insert_dependencies": ({"task_ids": [PENDING + 100], "depends_on": [FINISHED + 100]}, _PREPARED, 8),
    "unclaim_tasks": (
        {"ids": _running, "attempts": [1] * BATCH, "worker_ids": _their_workers, "release_lead": RELEASE_LEAD},
        _PREPARED,
        2 * BATCH,
    ),
    "return_strays": (
        {
            "ids": _running,
            "attempts": [1] * BATCH,
            "worker_ids": _their_workers,
            "release_lead": RELEASE_LEAD,
            "scheduler_id": "s1",
        },
        _PREPARED,
        2 * BATCH,
    ),
    "heartbeat_attempts": (
        {"ids": _running, "attempts": [1] * BATCH, "workers": "\x1f".join(_their_workers), "ages": [0] * BATCH},
        _PREPARED,
        2 * BATCH,
    ),
    "heartbeat_details": (
        {"ids": _of_w1, "attempts": [1] * len(_of_w1), "details": [b"x"] * len(_of_w1), "worker_id": "w1"},
        _PREPARED,
        _OWN_RUNNING,
    ),
    "adopt_attempts": ({"ids": _of_w1, "attempts": [1] * len(_of_w1), "worker_id": "w1"}, _PREPARED, _OWN_RUNNING),
    "running_attempts_of_worker": ({"worker_id": "w1", "scheduler_id": "s1"}, _PREPARED, 2 * 20_000 // WORKERS + 200),
    "running_on_workers": ({"scheduler_id": "s1", "worker_ids": ["w1", "w2"]}, _PREPARED, 4 * 20_000 // WORKERS + 200),
    "claim_by_ids": ({"ids": _pending, "slot_workers": ["w1"] * BATCH, "signal": None}, _PREPARED, 2 * BATCH),
    "resource_candidates": (
        {"queues": ["default"], "types": ["echo"], "pool": "default", "held": [], "limit": 64},
        _PREPARED,
        8,
    ),
    "resources_in_use": ({}, _PREPARED, 8),
    "finished_among": ({"ids": _finished}, _PREPARED, 2 * BATCH),
    "release_dependents": ({"ids": _finished}, _PREPARED, 8),
    "fail_dependents": ({"ids": _finished}, _PREPARED, 8),
    "expired_attempts": ({"limit": 1000}, _PREPARED, 4 * WORKERS),
    "expire_schedule_to_start": ({"limit": 1000}, _PREPARED, 8),
    "maintenance_due": ({"horizon": datetime.now(UTC), "retention_ms": 86_400_000}, _PREPARED, 4 * WORKERS),
    "purge_finished": ({"retention_ms": 86_400_000, "limit": 1000}, _PREPARED, 8),
    "delete_expired_workers": ({}, _PREPARED, 8),
    "upcoming_fixed": ({"pools": ["gpu"], "horizon": datetime.now(UTC) + timedelta(hours=1)}, _PREPARED, 8),
    "missed_fixed": ({"lease_ms": 10_000}, _PREPARED, 8),
    "mark_missed": ({"ids": _pending[:10], "reasons": ["r"] * 10, "kinds": ["k"] * 10}, _PREPARED, 20),
    "apply_plans": (
        {
            "ids": _pending,
            "release_ats": [datetime.now(UTC)] * BATCH,
            "intensities": [1.0] * BATCH,
            "reasons": ["r"] * BATCH,
            "planned_pools": [None] * BATCH,
            "release_lead": RELEASE_LEAD,
        },
        _PREPARED,
        2 * BATCH,
    ),
    "plannable_tasks": ({}, _PREPARED, 8),
    "planned_by_pool": ({}, _PREPARED, 8),
    "upcoming_releases": ({"horizon": timedelta(minutes=5)}, _PREPARED, 8),
    "recent_deferrable": ({"lookback": timedelta(days=1), "types": ["echo"]}, _PREPARED, 8),
    "unstarted_schedule_tasks": ({"id": 1}, _PREPARED, 8),
    "get_task": ({"id": PENDING + 5}, _PREPARED, 8),
    "cancel_task": ({"id": PENDING + 5}, _PREPARED, 8),
    "list_tasks_in_state": ({"state": "running", "before_id": None, "limit": 50}, _PREPARED, 60),
    "next_task_id": ({}, _PREPARED, 8),
}

_SETUPS = {"fresh": _setup(3, analyze=False), "analyzed": _setup(200, analyze=True)}
_read: dict[str, dict[str, int]] = {}


def _rows_read(database_url: str, setup: str, name: str) -> int:
    """Each setup's statements measured together, the first time one of them is asked for."""
    if setup not in _read:
        statements = {n: (Q[n], params, options) for n, (params, options, _) in STATEMENTS.items()}
        _read[setup] = rows_read_planned_before_each(database_url, statements, _SETUPS[setup], _BACKLOG)
    return _read[setup][name]


def _cases() -> list[Any]:
    return [pytest.param(setup, name, id=f"{setup}-{name}") for setup in _SETUPS for name in STATEMENTS]


@pytest.mark.slow
@pytest.mark.parametrize(("setup", "name"), _cases())
def test_a_statement_planned_on_a_small_table_reads_no_backlog_later(database_url: str, setup: str, name: str) -> None:
    read = _rows_read(database_url, setup, name)
    assert read <= STATEMENTS[name][2], f"{name} planned on the {setup} table read {read} rows of lowtide.tasks"
