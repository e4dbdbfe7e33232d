"""Work expected to be submitted: what a plan leaves room for.

A pool that runs only a few tasks at once cannot put all of them into the cheapest window, and
the tasks pending now are not the only ones that want it: work keeps being submitted, and the
tasks submitted in an hour will want the same cheap night, with less time left to wait for
another one. A plan that sees only the pending tasks fills the night with them, and the later
ones find it full and run at a dear hour. So the planner is told what work to expect, and plans
it beside the pending tasks (it takes room but gets no plan; a pending task is never refused
room for it).

The estimate is the seasonal naive forecast of demand: the deferrable work submitted over the
last day, each with its slack (latest start - submission) and duration, is expected again a day
later. It costs one aggregate query over the last day, and it is right for steady or daily
work; for work that comes in bursts it expects the last day's burst again, which makes the plan
leave room that may go unused (a pending task still takes it when it has no other).
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
