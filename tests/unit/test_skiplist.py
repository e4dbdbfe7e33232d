"""The claim plan: types at their limit are skipped, held ones walked apart, others capped."""

from __future__ import annotations

from scheduler_service.domain.skiplist import at_limit, plan_claim


def test_a_type_at_its_limit_is_in_the_skip_list() -> None:
    assert at_limit({"a": 2, "b": 5}, {"a": 2, "b": 4}) == frozenset({"a"})


def test_limited_types_are_capped_at_their_room_and_others_at_the_batch() -> None:
    plan = plan_claim(["q"], ["b", "a", "c"], 10, limits={"a": 3, "c": 1}, running={"a": 1, "c": 1})
    assert plan.open == (("q", "a", 2), ("q", "b", 10))
    assert plan.at_limit == frozenset({"c"})


def test_held_types_are_planned_apart_per_queue() -> None:
    plan = plan_claim(["q1", "q2"], ["a", "b"], 4, limits={}, running={}, held={"q1": frozenset({"b"})})
    assert plan.open == (("q1", "a", 4), ("q2", "a", 4), ("q2", "b", 4))
    assert plan.held == (("q1", "b", 4),)


def test_nothing_to_claim_when_every_type_is_at_its_limit() -> None:
    assert plan_claim(["q"], ["a"], 4, limits={"a": 1}, running={"a": 1}).empty
