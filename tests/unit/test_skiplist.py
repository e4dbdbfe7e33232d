"""The claim plan: types at their limit are skipped, others capped at their room."""

from __future__ import annotations

from scheduler_service.domain.skiplist import at_limit, plan_claim


def test_a_type_at_its_limit_is_in_the_skip_list() -> None:
    assert at_limit({"a": 2, "b": 5}, {"a": 2, "b": 4}) == frozenset({"a"})


def test_limited_types_are_capped_at_their_room_and_others_at_the_batch() -> None:
    plan = plan_claim(["b", "a", "c"], 10, limits={"a": 3, "c": 1}, running={"a": 1, "c": 1})
    assert plan.types == ("a", "b")
    assert plan.caps == (2, 10)
    assert plan.skipped == frozenset({"c"})


def test_held_types_are_skipped_like_types_at_their_limit() -> None:
    plan = plan_claim(["a", "b"], 4, limits={}, running={}, held={"b"})
    assert (plan.types, plan.skipped) == (("a",), frozenset({"b"}))


def test_nothing_to_claim_when_every_type_is_skipped() -> None:
    assert plan_claim(["a"], 4, limits={"a": 1}, running={"a": 1}).empty
