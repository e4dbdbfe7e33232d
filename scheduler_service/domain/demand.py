"""Work expected to be submitted: what a plan leaves room for.

Why it works this way: docs/architecture/holds.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from scheduler_service.domain.planning import PlanTask

LOOKBACK = timedelta(days=1)
# At most this many expected tasks are planned (the plan's cost grows with them).
MAX_EXPECTED = 2000


@dataclass(frozen=True, slots=True)
class Submitted:
    """`count` deferrable tasks submitted at `at` (or in a bucket starting then), with this
    slack (latest start - submission) and estimated duration."""

    at: datetime
    slack: timedelta
    duration: timedelta
    count: int = 1


def expected_arrivals(
    recent: Iterable[Submitted], now: datetime, *, lookback: timedelta = LOOKBACK, limit: int = MAX_EXPECTED
) -> list[PlanTask]:
    """The work submitted in (now - lookback, now], expected again `lookback` later, as tasks
    with negative ids (so they never collide with a real task's), earliest first."""
    expected: list[PlanTask] = []
    for s in sorted(recent, key=lambda s: s.at):
        if not (now - lookback < s.at <= now) or s.slack < timedelta(0):
            continue
        at = s.at + lookback
        for _ in range(max(0, s.count)):
            if len(expected) >= limit:
                return expected
            expected.append(PlanTask(-1 - len(expected), at, at + s.slack, s.duration))
    return expected
