"""Cost-hold decisions: high until the first value, hysteresis, staleness, held types, wake-ups."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from scheduler_service.domain.explain import Surroundings, TaskFacts, explain
from scheduler_service.domain.holds import (
    NO_SIGNAL,
    HoldConfig,
    HoldPolicy,
    HoldState,
    OnStale,
    SignalView,
    held_types,
    local_conflicts,
    max_defer_due,
    next_hold,
    wakeup_route,
)

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
START = HoldState(True, NOW, NO_SIGNAL)


def grid(value: float | None, *, high: bool | None = None, stale: bool = False) -> SignalView:
    is_high = (value is None or value > 400) if high is None else high
    return SignalView("grid", value, 400.0, is_high, stale, "gCO2/kWh")


def test_the_hold_is_on_until_the_first_value_arrives() -> None:
    assert next_hold(START, None, HoldPolicy(), NOW).active
    assert next_hold(START, grid(None), HoldPolicy(), NOW).active
    assert not next_hold(START, grid(120), HoldPolicy(), NOW).active


def test_the_hold_follows_the_threshold_and_says_why() -> None:
    state = next_hold(HoldState(False, None, ""), grid(520), HoldPolicy(), NOW)
    assert state.active and state.since == NOW
    assert state.reason == "signal grid is 520 gCO2/kWh, above its threshold of 400"


def test_release_below_keeps_the_hold_until_the_value_is_lower() -> None:
    policy = HoldPolicy(release_below=300)
    held = HoldState(True, NOW, "x")
    assert next_hold(held, grid(350), policy, NOW).active
    assert not next_hold(held, grid(250), policy, NOW).active


def test_min_hold_keeps_a_fresh_hold_on() -> None:
    policy = HoldPolicy(min_hold=timedelta(minutes=10))
    held = HoldState(True, NOW, "x")
    assert next_hold(held, grid(100), policy, NOW + timedelta(minutes=5)).active
    assert not next_hold(held, grid(100), policy, NOW + timedelta(minutes=10)).active


def test_a_stale_signal_holds_or_releases_as_configured() -> None:
    off = HoldState(False, None, "")
    assert next_hold(off, grid(100, stale=True), HoldPolicy(on_stale=OnStale.HOLD), NOW).active
    assert not next_hold(off, grid(100, stale=True), HoldPolicy(on_stale=OnStale.RELEASE), NOW).active


def test_held_types_per_queue_and_per_worker() -> None:
    config = HoldConfig(frozenset({"train"}), {"batch": frozenset({"index"})})
    on = HoldState(True, NOW, "x")
    off = HoldState(False, None, "")
    assert held_types("default", hold=on, config=config) == {"train"}
    assert held_types("batch", hold=on, config=config, worker_deferrable=["report"]) == {"train", "index", "report"}
    assert held_types("batch", hold=off, config=config, worker_held=["mine"]) == {"mine"}


def test_a_hold_naming_a_local_activity_is_a_conflict() -> None:
    assert local_conflicts({"train", "inline"}, {"inline"}) == {"inline"}


def test_wakeups_for_held_types_are_parked() -> None:
    held = frozenset({"train"})
    assert wakeup_route(["train"], ["train", "echo"], held) == "park"
    assert wakeup_route(["train", "echo"], ["train", "echo"], held) == "wake"
    assert wakeup_route(["other"], ["train"], held) == "ignore"


def test_max_defer_releases_a_long_held_task() -> None:
    assert max_defer_due(NOW, timedelta(hours=1), NOW + timedelta(hours=1))
    assert not max_defer_due(NOW, timedelta(hours=1), NOW + timedelta(minutes=59))
    assert not max_defer_due(NOW, None, NOW + timedelta(days=9))


def test_explain_names_the_hold_and_the_signal() -> None:
    facts = TaskFacts("pending", "default", "activity", "train_model", 0, NOW, NOW)
    hold = HoldState(True, datetime(2026, 3, 1, 12, 3, 10, tzinfo=UTC), "signal grid is 520 gCO2/kWh, above 400")
    text, codes = explain(facts, Surroundings(now=NOW, held=True, hold=hold, workers_for_type=1))
    assert text == (
        "held: activity type train_model is cost-deferrable and signal grid is 520 gCO2/kWh, above 400"
        " (the hold has been active since 12:03:10)"
    )
    assert codes == ["cost_hold"]


def test_explain_lists_every_reason_and_ready_when_none() -> None:
    facts = TaskFacts("pending", "q", "activity", "t", 1, NOW + timedelta(seconds=3), NOW)
    _, codes = explain(facts, Surroundings(now=NOW, queue_paused_since=NOW, limit=1, running_of_type=1))
    assert codes == ["queue_paused", "backoff", "concurrency_limit", "no_worker"]
    ready = TaskFacts("pending", "q", "activity", "t", 0, NOW, NOW)
    assert explain(ready, Surroundings(now=NOW, workers_for_type=2)) == (
        "ready: waiting for a free worker slot",
        ["ready"],
    )


def test_explain_says_which_source_of_the_skip_list_holds_a_task_back() -> None:
    facts = TaskFacts("pending", "q", "activity", "api", 0, NOW, NOW)
    at_adaptive = Surroundings(
        now=NOW,
        limit=50,
        adaptive_limit=18,
        adaptive_reason="run time 1.90x its baseline",
        running_of_type=18,
        workers_for_type=1,
    )
    text, codes = explain(facts, at_adaptive)
    assert codes == ["adaptive_limit"]
    assert text == "activity type api is at its adaptive concurrency limit (18/18; run time 1.90x its baseline)"
    hold = HoldState(True, None, "signal grid is 520 gCO2/kWh, above 400")
    held = replace(at_adaptive, held=True, hold=hold, running_of_type=0)
    assert explain(facts, held)[1] == ["cost_hold"]
    # At both limits the lower one is named first; under the adaptive one only the static binds.
    assert explain(facts, replace(at_adaptive, limit=10, running_of_type=20))[1] == [
        "concurrency_limit",
        "adaptive_limit",
    ]
    assert explain(facts, replace(at_adaptive, limit=10, running_of_type=12))[1] == ["concurrency_limit"]
