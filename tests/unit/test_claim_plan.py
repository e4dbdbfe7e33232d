"""The claim plan: types at their limit are skipped, held ones walked apart, others capped."""

from __future__ import annotations

from scheduler_service.domain.claim_plan import Source, at_limit, effective_limits, plan_claim, skip_sources


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


def test_the_claim_applies_the_lower_of_the_static_and_adaptive_limits() -> None:
    assert effective_limits({"a": 5, "b": 3}, {"a": 2, "b": 9, "c": 4}) == {"a": 2, "b": 3, "c": 4}


def test_the_skip_list_names_its_three_sources() -> None:
    static, adaptive = {"a": 5}, {"a": 3}
    assert skip_sources("a", static=static, adaptive=adaptive, running=2, held=False) == ()
    assert skip_sources("a", static=static, adaptive=adaptive, running=3, held=False) == (Source.ADAPTIVE_LIMIT,)
    both = (Source.ADAPTIVE_LIMIT, Source.STATIC_LIMIT)
    assert skip_sources("a", static=static, adaptive=adaptive, running=5, held=False) == both
    # A cost-held type is held whatever its limits.
    assert skip_sources("a", static=static, adaptive=adaptive, running=0, held=True) == (Source.COST_HOLD,)
    assert skip_sources("a", static={}, adaptive={"a": 1}, running=1, held=True) == (
        Source.COST_HOLD,
        Source.ADAPTIVE_LIMIT,
    )
