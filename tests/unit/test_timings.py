"""What the task histograms record of a sent attempt (domain.timings), with pinned times."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from scheduler_service.domain.timings import (
    COST_HOLD,
    OTHER,
    PLANNED_RELEASE,
    HoldEpisode,
    LabelCap,
    timings,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


class SentAttempt(NamedTuple):
    """A claimed row's timing columns (domain.timings.Due), and nothing else."""

    run_at: datetime
    started_at: datetime
    released_by: str | None
    hold_deadline: datetime | None
    planned_since: datetime | None


ROW = SentAttempt(
    run_at=at(0),
    started_at=at(3),
    released_by=None,
    hold_deadline=None,
    planned_since=None,
)


def test_unheld_work_waits_from_due_to_start_and_is_claimable_from_due() -> None:
    figures = timings(ROW, deferrable=False, sent_at=at(3.5), episode=HoldEpisode(at(-10), at(-5)))
    assert (figures.queue_wait, figures.dispatch_latency, figures.held) == (3, 3.5, None)


def test_a_retry_waits_from_the_end_of_its_backoff() -> None:
    retry = ROW._replace(run_at=at(2))
    assert timings(retry, deferrable=False, sent_at=at(3), episode=None).queue_wait == 1


def test_work_a_cost_hold_held_counts_from_its_due_time_to_the_holds_end() -> None:
    held = ROW._replace(started_at=at(61))
    figures = timings(held, deferrable=True, sent_at=at(61.2), episode=HoldEpisode(at(-30), at(60)))
    assert figures.held == (COST_HOLD, 60)
    # It was due all along: the queue wait includes the hold; dispatch counts from the release.
    assert figures.queue_wait == 61
    assert abs(figures.dispatch_latency - 1.2) < 1e-9


def test_a_hold_that_began_after_the_submission_counts_from_its_start() -> None:
    held = ROW._replace(started_at=at(61))
    assert timings(held, deferrable=True, sent_at=at(61), episode=HoldEpisode(at(20), at(60))).held == (COST_HOLD, 40)


def test_work_submitted_after_the_hold_ended_or_of_a_type_never_held_has_no_time_held() -> None:
    episode = HoldEpisode(at(-30), at(-1))
    assert timings(ROW, deferrable=True, sent_at=at(3), episode=episode).held is None
    assert timings(ROW, deferrable=False, sent_at=at(3), episode=HoldEpisode(at(-30), at(2))).held is None


def test_work_released_by_its_max_defer_counts_to_its_deadline_while_the_hold_lasts() -> None:
    row = ROW._replace(released_by="max_defer", hold_deadline=at(40), started_at=at(40.5))
    figures = timings(row, deferrable=True, sent_at=at(40.6), episode=HoldEpisode(at(10), None))
    assert figures.held == (COST_HOLD, 30)
    assert abs(figures.dispatch_latency - 0.6) < 1e-9


def test_a_planned_release_counts_from_the_submission_to_the_release() -> None:
    planned = ROW._replace(run_at=at(600), planned_since=at(0), started_at=at(600.1))
    figures = timings(planned, deferrable=True, sent_at=at(600.2), episode=HoldEpisode(at(-30), None))
    assert figures.held == (PLANNED_RELEASE, 600)
    assert abs(figures.queue_wait - 0.1) < 1e-9


def test_times_from_two_clocks_never_go_negative() -> None:
    figures = timings(ROW._replace(started_at=at(-0.01)), deferrable=False, sent_at=at(-1), episode=None)
    assert (figures.queue_wait, figures.dispatch_latency) == (0, 0)


def test_a_label_keeps_the_configured_values_and_the_first_seen_then_says_other() -> None:
    cap = LabelCap({"train", "index"}, 2)
    seen = [cap(v) for v in ["a", "train", "b", "c", "a", "index", "d"]]
    assert seen == ["a", "train", "b", OTHER, "a", "index", OTHER]
    assert LabelCap({"train"}, 0)("a") == OTHER
