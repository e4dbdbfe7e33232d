"""Every message `lowtide task explain` can print, word for word, and checked for grammar: each
branch of the explanation, with every reason a cost hold and a release plan can give."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from scheduler_service.domain.explain import Surroundings, TaskFacts, explain
from scheduler_service.domain.holds import HoldPolicy, HoldState, OnStale, SignalView, initial_hold, next_hold
from scheduler_service.domain.placement import PlaceTask, Region, place
from scheduler_service.domain.planning import Capacity, Forecast, PlanTask, plan

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
SINCE = datetime(2026, 3, 1, 11, 50, 5, tzinfo=UTC)
OFF = HoldState(False, None, "")
ON = HoldState(True, SINCE, "x")
PENDING = TaskFacts("pending", "default", "activity", "train", 0, NOW, NOW)


def grid(value: float | None, *, stale: bool = False) -> SignalView:
    return SignalView("grid", value, 400.0, value is None or value > 400, stale, "gCO2/kWh")


def held_by(hold: HoldState, facts: TaskFacts = PENDING) -> str:
    return explain(facts, Surroundings(now=NOW, held=True, hold=replace(hold, since=SINCE), workers_for_type=1))[0]


HELD = "held: activity type train is cost-deferrable and "
SINCE_TEXT = " (the hold has been active since 11:50:05)"


def cases() -> list[tuple[str, str]]:
    """(what the scheduler said, what it should say) for every kind of message."""
    out: list[tuple[str, str]] = []

    def add(said: str, expected: str) -> None:
        out.append((said, expected))

    # The hold's reasons, as they appear in a held task's explanation.
    add(
        held_by(next_hold(OFF, grid(520), HoldPolicy(), NOW)),
        HELD + "signal grid is 520 gCO2/kWh, above its threshold of 400" + SINCE_TEXT,
    )
    add(
        held_by(next_hold(OFF, grid(520, stale=True), HoldPolicy(), NOW)),
        HELD + "the last value of signal grid, 520 gCO2/kWh, is stale (on_stale = hold)" + SINCE_TEXT,
    )
    add(
        held_by(next_hold(ON, grid(350), HoldPolicy(release_below=300), NOW)),
        HELD + "signal grid is 350 gCO2/kWh, not yet below release_below 300" + SINCE_TEXT,
    )
    add(
        held_by(next_hold(ON, grid(100), HoldPolicy(min_hold=timedelta(minutes=15)), NOW)),
        HELD + "the hold has lasted less than min_hold (15m)" + SINCE_TEXT,
    )
    add(held_by(initial_hold(HoldPolicy(), NOW)), HELD + "no signal value has arrived yet" + SINCE_TEXT)
    add(
        held_by(initial_hold(HoldPolicy(on_stale=OnStale.RELEASE), NOW)),
        HELD + "no signal value has arrived yet (on_stale = release does not apply: it releases a value that "
        "went stale, and this scheduler has had no value since it started)" + SINCE_TEXT,
    )
    # The reasons a hold is off, as `lowtide status` shows them.
    add(
        next_hold(ON, grid(120), HoldPolicy(), NOW).reason,
        "signal grid is 120 gCO2/kWh, not above its threshold of 400",
    )
    add(
        next_hold(ON, grid(520, stale=True), HoldPolicy(on_stale=OnStale.RELEASE), NOW).reason,
        "the last value of signal grid, 520 gCO2/kWh, is stale (on_stale = release)",
    )
    with_deadline = replace(PENDING, hold_deadline=datetime(2026, 3, 1, 13, 0, tzinfo=UTC))
    add(
        held_by(next_hold(OFF, grid(520), HoldPolicy(), NOW), with_deadline),
        HELD
        + "signal grid is 520 gCO2/kWh, above its threshold of 400"
        + SINCE_TEXT
        + "; it runs anyway at 13:00:00 (max_defer)",
    )

    # Everything else a pending task can wait for.
    paused = Surroundings(now=NOW, queue_paused_since=SINCE, workers_for_type=1)
    add(explain(PENDING, paused)[0], "queue default has been paused since 11:50:05")
    for count, expected in ((1, "waiting for 1 dependency to complete"), (2, "waiting for 2 dependencies to complete")):
        waiting = replace(PENDING, dependencies_pending=count)
        add(explain(waiting, Surroundings(now=NOW, workers_for_type=1))[0], expected)
    backoff = replace(PENDING, attempt=1, run_at=NOW + timedelta(seconds=3))
    add(
        explain(backoff, Surroundings(now=NOW, workers_for_type=1))[0],
        "waiting out its retry backoff until 12:00:03 (3.0s left)",
    )
    limited = Surroundings(now=NOW, limit=2, running_of_type=2, workers_for_type=1)
    add(explain(PENDING, limited)[0], "activity type train is at its concurrency limit (2/2)")
    add(explain(PENDING, Surroundings(now=NOW))[0], "no connected worker runs activity type train on queue default")
    add(explain(PENDING, Surroundings(now=NOW, workers_for_type=1))[0], "ready: waiting for a free worker slot")
    add(
        explain(PENDING, replace(paused, limit=1, running_of_type=1, workers_for_type=0))[0],
        "queue default has been paused since 11:50:05; activity type train is at its concurrency limit (1/1); "
        "no connected worker runs activity type train on queue default",
    )

    # Planned release, with the reasons the planner gives.
    start = NOW
    forecast = Forecast.of((start + timedelta(minutes=30 * i), v) for i, v in enumerate((300, 200, 100, 250, 50)))
    task = PlanTask(1, start, start + timedelta(minutes=90), timedelta(minutes=30))
    [cheapest] = plan([task], forecast, Capacity(max_running=10), NOW, signal_low=False)
    planned = replace(
        PENDING,
        run_at=cheapest.release_at,
        planned_release_at=cheapest.release_at,
        planned_intensity=cheapest.expected_intensity,
        plan_reason=cheapest.reason,
    )
    add(
        explain(planned, Surroundings(now=NOW, workers_for_type=1))[0],
        "planned release at 13:00:00, forecast mean 100: lowest forecast mean 100 over 30m for a start in "
        "[2026-03-01T12:00:00+00:00, 2026-03-01T13:30:00+00:00]",
    )
    [unplanned] = plan([task], None, Capacity(max_running=10), NOW, signal_low=False)
    fallback = replace(planned, run_at=unplanned.release_at, planned_release_at=unplanned.release_at)
    fallback = replace(fallback, planned_intensity=None, plan_reason=unplanned.reason)
    add(
        explain(fallback, Surroundings(now=NOW, workers_for_type=1))[0],
        "planned release at 13:30:00: no forecast; held until the signal falls under its threshold, at the latest "
        "2026-03-01T13:30:00+00:00",
    )

    # Where and when: placed in the cleaner of two pools, released there, and run.
    central = Forecast.of((start + timedelta(minutes=30 * i), v) for i, v in enumerate((200, 190, 180, 240, 250)))
    west = Forecast.of((start + timedelta(minutes=30 * i), v) for i, v in enumerate((260, 255, 250, 245, 240)))
    regions = [
        Region("eu-central", central, Capacity(2), unit="gCO2/kWh"),
        Region("eu-west", west, Capacity(2), unit="gCO2/kWh"),
    ]
    [where] = place([PlaceTask(task, ("eu-west", "eu-central"))], regions, NOW, resolution=timedelta(minutes=5))
    placed = replace(
        PENDING,
        run_at=where.plan.release_at,
        planned_release_at=where.plan.release_at,
        planned_intensity=where.plan.expected_intensity,
        plan_reason=where.reason,
        planned_pool=where.region,
        latest_start=start + timedelta(minutes=90),
    )
    add(
        explain(placed, Surroundings(now=NOW, workers_for_type=1))[0],
        "planned release in pool eu-central at 13:00:00, forecast mean 180: eu-central at 13:00: 180 gCO2/kWh "
        "against 260 gCO2/kWh in eu-west now; lowest forecast mean 180 over 30m for a start in "
        "[2026-03-01T12:00:00+00:00, 2026-03-01T13:30:00+00:00]",
    )
    add(
        explain(replace(placed, planned_release_at=NOW), Surroundings(now=NOW, workers_for_type=1))[0],
        "released in pool eu-central: only its workers take it until its latest start at 13:30:00, then any pool "
        "it names (eu-central at 13:00: 180 gCO2/kWh against 260 gCO2/kWh in eu-west now; lowest forecast mean "
        "180 over 30m for a start in [2026-03-01T12:00:00+00:00, 2026-03-01T13:30:00+00:00])",
    )
    add(
        explain(replace(placed, state="completed"), Surroundings(now=NOW))[0],
        "completed: the task has ended; placed in pool eu-central: eu-central at 13:00: 180 gCO2/kWh against 260 "
        "gCO2/kWh in eu-west now; lowest forecast mean 180 over 30m for a start in "
        "[2026-03-01T12:00:00+00:00, 2026-03-01T13:30:00+00:00]",
    )

    # Running and finished tasks.
    running = replace(PENDING, state="running", attempt=2, worker_id="w-1", started_at=SINCE)
    add(explain(running, Surroundings(now=NOW))[0], "running: attempt 2 on worker w-1 since 11:50:05")
    add(explain(replace(PENDING, state="completed"), Surroundings(now=NOW))[0], "completed: the task has ended")
    released = replace(PENDING, state="failed", released_by="max_defer")
    add(
        explain(released, Surroundings(now=NOW))[0],
        "failed: the task has ended (released by max_defer while held)",
    )
    return out


CASES = cases()


@pytest.mark.parametrize(("said", "expected"), CASES, ids=[e[:50] for _, e in CASES])
def test_each_message_word_for_word(said: str, expected: str) -> None:
    assert said == expected


# A clause says what something is once: "signal grid is 520 gCO2/kWh is stale" says it twice.
_TWO_VERBS = re.compile(r"\bis\b(?:(?!\band\b)[^;:,()])*\bis\b")


@pytest.mark.parametrize("said", [s for s, _ in CASES], ids=[e[:50] for _, e in CASES])
def test_each_message_reads_as_english(said: str) -> None:
    for clause in re.split(r"[;:]", said):
        assert not _TWO_VERBS.search(clause), f"two verbs in one clause: {clause!r}"
    assert not re.search(r"\b1 (dependencies|tasks|slots|workers)\b", said)
    # Durations as the configuration writes them (15m), never Python's timedelta (0:15:00).
    assert not re.search(r"\b\d+ days?, |\b0:\d\d:\d\d\b", said)
    assert "None" not in said and "  " not in said and "()" not in said
    assert not said.endswith((" ", ".", ";", ":"))
