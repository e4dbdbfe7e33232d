"""The rows of a task placed in a pool (where and when), as a new user of regions would notice
them: who may take it, and from when.

A placed task is stored alike by each of the three inserts a submit may take: alone
(insert_tasks), answered whole (insert_tasks_whole), or in a group of single submits one of which
is handed straight to an idle slot (insert_tasks_handed). Stored otherwise, every pool it names
could take it from its planned release on, not only the one it was placed in. And when a later
plan places it no more, the hold decides from the release it was placed for, in any of its pools.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from lowtide.db import Database
from scheduler_service.domain.model import Kind, NewTask, RetryPolicy
from scheduler_service.domain.planning import RELEASE_LEAD
from scheduler_service.store.base import Q
from scheduler_service.store.submissions import SubmissionWrites

RETRY = RetryPolicy(3, timedelta(seconds=1), 2.0, timedelta(seconds=60))
# A worker of the default pool with free slots for type `plain`: a group's task of that type is handed to it.
IDLE_WORKER = (
    "INSERT INTO lowtide.workers (id, pool, queues, activity_types, slots, scheduler_id, lease_expires_at) "
    "VALUES ('w1', 'default', '{default}', '{plain}', 4, 's1', now() + interval '1 hour')"
)


@dataclass(frozen=True, slots=True)
class Stored:
    payload: bytes
    state: str
    run_at: datetime
    hold_deadline: datetime | None
    planned_pool: str | None


@dataclass(frozen=True, slots=True)
class State:
    state: str


async def test_a_placed_task_is_stored_alike_by_every_insert(database_url: str) -> None:
    now = datetime.now(UTC)
    latest = now + timedelta(hours=6)
    db = Database(database_url, min_size=1, max_size=2)
    await db.open()
    try:
        await db.execute(IDLE_WORKER)

        async def submit(path: str) -> None:
            placed = NewTask(
                "default", Kind.ACTIVITY, "render", path.encode(), 0, None, RETRY, None, None, None,
                latest_start=latest, duration=timedelta(minutes=30),
                planned_release_at=now + timedelta(hours=1), planned_intensity=120.0, plan_reason="placed",
                pools=("eu-west", "eu-central"), planned_pool="eu-central",
            )  # fmt: skip
            # Of a type of its own: a pending task of its type would go first, and this one wait.
            plain = NewTask(
                "default", Kind.ACTIVITY, f"plain-{path}", b"plain-" + path.encode(), 0, None, RETRY, None, None, None
            )
            writes = SubmissionWrites(db, set())
            workers: list[str | None] | None = [None, "w1"] if path == "handed" else None
            await writes.insert(
                [placed, plain],
                deps_pending=[0, 0],
                signal=None,
                submitted_by=None,
                wake="",
                whole=path != "alone",
                workers=workers,
            )

        for path in ("alone", "whole", "handed"):
            await submit(path)
        rows = await db.fetch_as(
            Stored,
            "SELECT payload, state, run_at, hold_deadline, planned_pool FROM lowtide.tasks "
            "WHERE activity_type = 'render' ORDER BY id",
        )
        # Held for its own pool until its latest start, however it was stored.
        stored = {bytes(r.payload).decode(): (r.state, r.run_at, r.hold_deadline, r.planned_pool) for r in rows}
        held = ("pending", latest - RELEASE_LEAD, latest - RELEASE_LEAD, "eu-central")
        assert stored == dict.fromkeys(("alone", "whole", "handed"), held)
        # The group really was the handed one: its plain task was stored running on the idle worker.
        handed = await db.fetch_as(State, "SELECT state FROM lowtide.tasks WHERE payload = 'plain-handed'::bytea")
        assert handed == [State("running")]
    finally:
        await db.close()


async def test_a_placed_task_no_forecast_covers_any_more_is_due_in_any_pool_from_its_release(database_url: str) -> None:
    """Placed, then planned again with no forecast covering its window (the feed went quiet): the
    threshold hold decides from the release it was placed for, in any pool it names, as for a task
    never placed. It stayed due only at its latest start, whatever the signal."""
    now = datetime.now(UTC)
    latest, release = now + timedelta(hours=6), now + timedelta(hours=1)
    db = Database(database_url, min_size=1, max_size=2)
    await db.open()
    try:
        task = NewTask(
            "default", Kind.ACTIVITY, "render", b"placed", 0, None, RETRY, None, None, None,
            latest_start=latest, duration=timedelta(minutes=30), planned_release_at=release,
            planned_intensity=120.0, plan_reason="placed", pools=("eu-west", "eu-central"), planned_pool="eu-central",
        )  # fmt: skip
        ((task_id, _),) = await SubmissionWrites(db, set()).insert(
            [task], deps_pending=[0], signal=None, submitted_by=None, wake=""
        )
        threshold = {
            "ids": [task_id],
            "release_ats": [None],
            "intensities": [None],
            "reasons": ["no forecast; held until the signal falls under its threshold"],
            "planned_pools": [None],
            "release_lead": RELEASE_LEAD,
        }
        await db.execute(Q["apply_plans"], threshold)
        rows = await db.fetch_as(
            Stored, "SELECT payload, state, run_at, hold_deadline, planned_pool FROM lowtide.tasks WHERE id = %(id)s",
            {"id": task_id},
        )  # fmt: skip
        assert [(r.run_at, r.hold_deadline, r.planned_pool) for r in rows] == [(release, latest - RELEASE_LEAD, None)]
    finally:
        await db.close()


@dataclass(frozen=True, slots=True)
class Columns:
    id: int
    stored: dict[str, object]


async def test_a_group_stores_every_column_of_a_task_as_a_batch_does(database_url: str) -> None:
    """A group of single submits reaches PostgreSQL as one JSON parameter (handed_group), a batch
    as an array a column: the same task comes out the same, to the last byte and microsecond."""
    now = datetime(2026, 12, 7, 3, 40, 1, 234567, tzinfo=UTC)
    task = NewTask(
        "émissions", Kind.ACTIVITY, "render", b"\x00\xff\\x41\"{}", -7, None,
        RetryPolicy(9, timedelta(milliseconds=1500), 1.1, timedelta(minutes=3), ("ValueError", "Ünïcode \"E\"")),
        timedelta(seconds=90), timedelta(milliseconds=2500), timedelta(seconds=7), max_defer=timedelta(hours=5),
        pool="eu-west", resources={"gpu": 2, "licence": 1}, latest_start=now + timedelta(hours=5),
        duration=timedelta(minutes=30), planned_release_at=now + timedelta(hours=1, microseconds=1),
        planned_intensity=123.456789012345678, plan_reason='forecast "low" \\ at 04:00 🌊\n',
        pools=("eu-west", "eu-central"), planned_pool="eu-central",
        headers={"traceparent": "00-abc-01", "note": "tab\there \"quoted\" é 🌊 \u2028"},
    )  # fmt: skip
    # Of a type of its own, handed to the idle worker: the group takes the handed insert.
    plain = NewTask("default", Kind.ACTIVITY, "plain", b"", 0, None, RETRY, None, None, None)
    db = Database(database_url, min_size=1, max_size=2)
    await db.open()
    try:
        await db.execute(IDLE_WORKER)
        as_batch = SubmissionWrites(db, set())
        ((batch_id, _),) = await as_batch.insert(
            [task], deps_pending=[0], signal=0.1, signals=[1e-300], submitted_by="me", wake="", whole=True
        )
        as_group = SubmissionWrites(db, set())
        (group_id, _), (plain_id, _) = await as_group.insert(
            [task, plain], deps_pending=[0, 0], signal=0.1, signals=[1e-300, None], submitted_by="me", wake="",
            whole=True, workers=[None, "w1"],
        )  # fmt: skip
        rows = await db.fetch_as(
            Columns,
            # What depends on the moment of the insert aside.
            "SELECT id, to_jsonb(t) - '{id,created_at,updated_at,run_at,schedule_to_start_deadline}'::text[] AS stored "
            "FROM lowtide.tasks t WHERE id = ANY(%(ids)s) ORDER BY id",
            {"ids": [batch_id, group_id]},
        )
        assert [r.id for r in rows] == [batch_id, group_id]
        assert rows[0].stored == rows[1].stored
        assert rows[1].stored["payload"] == "\\x00ff5c783431227b7d"
        assert as_group.stored[group_id].payload == task.payload
        assert as_group.stored[plain_id].state == "running"
    finally:
        await db.close()
