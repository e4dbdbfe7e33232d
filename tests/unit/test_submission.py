"""Submission decisions without a database: idempotent keys, dependencies, max_depth, the wake payload."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from scheduler_service.domain.fixed import FixedStart, MissPolicy
from scheduler_service.domain.model import Kind, NewTask, RetryPolicy
from scheduler_service.domain.submission import (
    Overload,
    Submitted,
    counted,
    ended_dependency,
    first_new,
    parse_wake,
    pending_dependencies,
    submitted,
    unknown_dependencies,
    wake_payload,
    wanted_dependencies,
)

RETRY = RetryPolicy(3, timedelta(seconds=1), 2.0, timedelta(minutes=1))
FIXED = FixedStart(datetime(2026, 1, 1, tzinfo=UTC), timedelta(minutes=1), MissPolicy.SKIP, timedelta(minutes=5))


def task(
    key: str | None = None,
    *,
    queue: str = "default",
    activity_type: str = "work",
    kind: Kind = Kind.ACTIVITY,
    depends_on: tuple[int, ...] = (),
    fixed: FixedStart | None = None,
) -> NewTask:
    return NewTask(
        queue=queue,
        kind=kind,
        activity_type=activity_type,
        payload=b"",
        priority=0,
        idempotency_key=key,
        retry=RETRY,
        schedule_to_start=None,
        start_to_close=None,
        heartbeat=None,
        depends_on=depends_on,
        fixed=fixed,
    )


def test_a_key_stored_before_or_earlier_in_the_batch_creates_nothing() -> None:
    batch = [task("a"), task(), task("a"), task("b"), task("c"), task()]
    assert first_new(batch, {"b": 7}) == [0, 1, 4, 5]
    # The store returns (id, key) of what it inserted, in any order.
    inserted = [(12, "c"), (10, "a"), (13, None), (11, None)]
    assert submitted(batch, inserted, {"b": 7}) == [
        Submitted(10, True),
        Submitted(11, True),
        Submitted(10, False),
        Submitted(7, False),
        Submitted(12, True),
        Submitted(13, True),
    ]


def test_a_key_another_submit_stored_meanwhile_maps_to_that_task() -> None:
    batch = [task("a"), task("b")]
    # "a" lost the race: the insert skipped it and a second read found its id.
    assert submitted(batch, [(20, "b")], {"a": 5}) == [Submitted(5, False), Submitted(20, True)]


@given(st.lists(st.sampled_from([None, "a", "b", "c"]), max_size=30), st.sets(st.sampled_from(["a", "b", "c"])))
def test_every_task_gets_one_id_and_one_key_one_id(keys: list[str | None], stored: set[str]) -> None:
    batch = [task(k) for k in keys]
    existing = {k: 100 + i for i, k in enumerate(sorted(stored))}
    fresh = first_new(batch, existing)
    inserted = [(1000 + n, batch[i].idempotency_key) for n, i in enumerate(fresh)]
    out = submitted(batch, inserted, existing)
    first: dict[str, int] = {}
    for t, s in zip(batch, out, strict=True):
        key = t.idempotency_key
        if key is None:
            assert s.created
        elif key in existing:
            assert s == Submitted(existing[key], False)
        else:
            assert s.created == (key not in first)
            assert first.setdefault(key, s.id) == s.id
    ids = [s.id for s in out if s.created]
    assert len(ids) == len(set(ids)) == len(fresh)


def test_dependencies_unknown_ended_and_pending() -> None:
    batch = [task(depends_on=(3, 1)), task(depends_on=(1,)), task()]
    wanted = wanted_dependencies(batch)
    assert wanted == [1, 3]
    assert unknown_dependencies(wanted, {1: "pending"}) == [3]
    states = {1: "completed", 3: "running"}
    assert ended_dependency(wanted, states) is None
    assert pending_dependencies(batch, states) == [1, 0, 0]
    assert ended_dependency(wanted, {1: "completed", 3: "cancelled"}) == (3, "cancelled")


def test_reject_refuses_past_max_depth_and_names_the_queue() -> None:
    limit = Overload(max_depth=5, policy="reject")
    assert limit.rejection("q", depth=3, adding=2) is None
    message = limit.rejection("q", depth=4, adding=2)
    assert message is not None and "queue q is full: 4 claimable tasks pending, max_depth 5" in message
    assert limit.excess(depth=4, adding=2) == 0


def test_shedding_policies_end_what_is_over_max_depth() -> None:
    limit = Overload(max_depth=5, policy="shed_oldest")
    assert limit.rejection("q", depth=9, adding=9) is None
    assert limit.excess(depth=4, adding=3) == 2
    assert limit.excess(depth=1, adding=3) == 0
    assert limit.shed_reason("q") == "queue q over max_depth 5 (shed_oldest)"


def test_fixed_starts_held_types_and_other_queues_do_not_count() -> None:
    limit = Overload(max_depth=1, policy="reject", held=frozenset({"report"}))
    batch = [
        task(),
        task(fixed=FIXED),
        task(activity_type="report"),
        task(activity_type="report", kind=Kind.WORKFLOW),
        task(queue="other"),
    ]
    assert counted(limit, "default", batch) == 2


def test_wake_payload_names_pairs_until_too_long() -> None:
    payload = wake_payload([task(), task(queue="b"), task()])
    assert json.loads(payload) == {"origin": None, "pairs": [["b", "work"], ["default", "work"]]}
    assert parse_wake(payload) == (None, [("b", "work"), ("default", "work")])
    many = [task(queue=f"queue-{i:04}") for i in range(500)]
    assert parse_wake(wake_payload(many, "replica-1")) == ("replica-1", None)


def test_a_wake_names_the_replica_that_woke_itself() -> None:
    assert parse_wake(wake_payload([task()], "replica-1")) == ("replica-1", [("default", "work")])


def test_wake_payloads_of_the_earlier_form_and_garbage_wake_every_group_of_every_replica() -> None:
    assert parse_wake('[["default", "work"]]') == (None, [("default", "work")])
    for payload in ("*", "", "{", "[1]", '{"origin": 3, "pairs": 7}', "null"):
        assert parse_wake(payload) == (None, None)
