"""How much caution pays on a feed, and for which window (part of lowtide.forecast_calibration;
pure, no I/O).

The longest window's caution comes from how far the lowest value that came in each of the record's
jobs of that window was from the lowest the forecast showed at the job's arrival, in that point's
expected errors (its `gaps`, lowtide.forecast_replay). A start now cannot be undone, while a later
one is planned again on every new forecast: a prophet who knew the values to come would wait
whenever that gap is below 0, and take all of it. A planner that learns the future as it comes
cannot, and the classic answer to stopping on values that come one by one (the prophet
inequality: hold out for half of what the prophet expects, and get at least half of what he
gets) is half of it. So the longest window's caution is half the median gap: below 0 where the
feed's forecasts miss how low the values go over a day (a real feed's forecasts smooth out the
dips they do not see coming), above 0 where the lowest of its noisy points is lower than what
comes (the winner's curse), near 0 where the lowest forecast is what comes. It is a median over
every covered job of the record, where choosing among cautions by re-play has too few
independent days of long windows to say it.

A task is planned with the caution of the window it has left (its latest start less now): a 4 h
window's is chosen by re-play (`choose`), and one between 4 h and the longest has the caution
between theirs (linear in the log of the window). The re-play plans its jobs the same way. First
the one caution for every window under which the record's jobs of every window started clearly
cheapest; then, by window, the 4 h window's own caution is the one under which the record's 4 h
jobs started clearly cheapest (a 4 h job is planned with it throughout, a longer one mostly with
the caution its gaps set: pooled with them, a 4 h window's caution is pulled to what suits a
day's); the caution by window is kept unless the jobs of every window started clearly cheaper
under the one caution for every window (a forecast whose lowest point says nothing of when the
lowest value comes, as one whose swings are mostly noise, gains nothing from holding out for it).
That "clearly" counts the jobs as independent only as far as the feed's errors let them be
(`independent_jobs`): one arrives every hour, of every window, and where a forecast's error
persists along it, a day's jobs all meet the same miss, and a caution that paid on one paid on the
day's (one day's luck, not 24 days'). A 4 h job's values are the day-long jobs' around it too, so
every job counts as alike as the longest window's. Where its errors are independent point to
point, as a noisy feed's, they count in full.

Until the record re-plays enough jobs to choose by (about its first day), the caution is `cold`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from lowtide import forecast_replay as replay
from lowtide.forecast_replay import CAUTIONS, JOB_SLACKS, JOB_STRIDE, MIN_JOBS, paying

_HOUR = timedelta(hours=1)

# Of the gap a prophet would wait for, the share a planner that learns the future as it comes
# holds out for (the prophet inequality's threshold); and the most caution it makes either way
# (as many expected errors as the widest caution tried by re-play).
PROPHET_SHARE = 0.5
MAX_CAUTION = max(CAUTIONS)
# The caution a feed's forecasts are planned with, corrected by a learned follow, until the record
# re-plays enough jobs to choose one (`cold`): the mildest below 0 that the re-play tries.
COLD_CAUTION = -0.25


@dataclass(frozen=True, slots=True)
class Choice:
    """The variant to plan with (None: the bare forecasts), its column of the grid (see
    `choose`), and how many jobs said so."""

    variant: int | None
    column: int
    jobs: int


def choose(
    jobs: Sequence[tuple[timedelta, Sequence[float]]],
    variants: int,
    width: int,
    default: int,
    persistence: float = 0.0,
) -> Choice:
    """`jobs`: each re-played job's window and its cost under each variant and each of `width`
    (caution, slope) (variant by variant: each caution of `CAUTIONS` for every window, then each
    falling to the longest window's own), then on the bare forecasts; `default` the column that
    holds without a clear gain. First the variant and caution for every window that started the
    jobs clearly cheapest; then, of that variant's cautions falling to the longest window's own,
    the one that started the shortest window's jobs clearly cheapest (else the same caution),
    kept unless the jobs started clearly cheaper with the one caution for every window, counted
    as `independent_jobs` by the feed's `persistence`."""
    costs = [cost for _, cost in jobs]
    if len(costs) < MIN_JOBS:
        return Choice(0, default, len(costs))
    bare = variants * width
    single = [i for i in range(bare + 1) if i == bare or i % width < len(CAUTIONS)]
    chosen = paying(costs, default, single)
    if chosen == bare:
        return Choice(None, 0, len(costs))
    by_window = chosen + len(CAUTIONS)
    if width <= len(CAUTIONS):
        return Choice(*divmod(chosen, width), len(costs))
    # The shortest window's caution, by window, from its own jobs (the longer ones have theirs
    # mostly from their gaps).
    shortest = [cost for window, cost in jobs if window == JOB_SLACKS[0]]
    if len(shortest) >= MIN_JOBS:
        first = by_window - chosen % width
        by_window = paying(shortest, by_window, range(first, first + len(CAUTIONS)))
    independent = independent_jobs(len(jobs), persistence)
    if paying(costs, by_window, [chosen], independent) == by_window:
        chosen = by_window
    return Choice(*divmod(chosen, width), len(costs))


def independent_jobs(jobs: int, persistence: float) -> float:
    """How many independent jobs `jobs` re-played jobs (one every JOB_STRIDE, of every window)
    amount to, on a feed whose error `persistence` (how much of a point's error the point an hour
    later shares) stands for how alike two jobs an hour apart fare. Any two jobs arriving within
    the longest window of each other share values and forecasts (a 4 h job's are those of the
    day-long jobs around it); alike in that share, the jobs count as groups of the longest
    window's JOB_STRIDEs (a design effect of 1 + (size - 1) x persistence): all of them for
    independent errors, about one a longest window for errors that persist in full."""
    alike = max(0.0, min(1.0, persistence))
    return jobs / (1 + (JOB_SLACKS[-1] / JOB_STRIDE - 1) * alike)


def longest(gaps: Sequence[float]) -> float | None:
    """The longest window's caution from its jobs' `gaps` (see the module's docstring); None with
    fewer than MIN_JOBS of them."""
    if len(gaps) < MIN_JOBS:
        return None
    return max(-MAX_CAUTION, min(MAX_CAUTION, PROPHET_SHARE * statistics.median(gaps)))


def slope(caution: float, longest: float | None) -> float:
    """How much the caution falls per doubling of a task's window from the shortest re-played
    (`caution`) to the longest (`longest`; None: the same caution for every window)."""
    if longest is None:
        return 0.0
    return (caution - longest) / math.log2(JOB_SLACKS[-1] / JOB_SLACKS[0])


def cold(persistence: float) -> float:
    """The caution before the record re-plays `MIN_JOBS` jobs, from how much of a point's error the
    point an hour later shares (`persistence`, as learned: blended toward 0 while the record is
    short). A start now cannot be undone, while a later one is planned again on every new
    forecast, so a later start is worth a little more than its expected value: `COLD_CAUTION`.
    That holds where the forecast's errors persist along it (a level or a ramp off for hours, as a
    real feed's): its lowest point then says where the low values come. Where its errors are
    independent from point to point, the lowest of many points is lower than what comes (the
    winner's curse, which the follow takes out only in part) and the expected values (0) are
    planned on. Between, the share of `COLD_CAUTION` that the errors persist."""
    share = max(0.0, min(1.0, persistence))
    return COLD_CAUTION * share if share > 0 else 0.0


class Variant(replay.Calibration, Protocol):
    """A way of reading the forecasts (lowtide.forecast_calibration.Calibration)."""

    @property
    def follow(self) -> tuple[float, ...]: ...

    def persists(self, later: timedelta) -> float: ...


@dataclass(frozen=True, slots=True)
class Chosen:
    """The variant to plan with (its index), the caution (a 4 h window's) and how it falls per
    doubling of the window, how many jobs were re-played, and whether the bare forecasts won."""

    variant: int
    caution: float
    slope: float
    jobs: int
    raw: bool = False


def chosen(
    issued: Sequence[replay.Issued],
    actuals: dict[datetime, float],
    variants: Sequence[Variant],
    now: datetime,
    prior_caution: float,
) -> Chosen:
    """Of the `variants` (the figures corrected in different ways) and the bare forecasts, the
    one and caution under which the window's jobs, re-played, started clearly cheapest (else
    the first at its default); by window, a 4 h window's from its 4 h jobs and the longest's from
    its jobs' gaps, unless one for every window started them clearly cheaper."""
    first = variants[0]
    # Only from jobs of the longest window whose forecasts covered it: never stretched from
    # short ones to long ones (a feed's past, seeded half an hour ahead, says nothing of it).
    ends = [longest(replay.gaps(issued, actuals, v, now, JOB_SLACKS[-1])) for v in variants]
    grids = [[*((c, 0.0) for c in CAUTIONS), *((c, slope(c, end)) for c in CAUTIONS)] for end in ends]
    # The default caution: the prior's without a learned follow, else the expected values'.
    default = CAUTIONS.index(0.0 if first.follow else prior_caution)
    jobs = replay.replayed(issued, actuals, variants, now, grids)
    got = choose(jobs, len(variants), len(grids[0]), default, first.persists(_HOUR))
    if got.jobs < MIN_JOBS and first.follow:
        # Too few jobs re-played to choose by (about the record's first day): cold.
        return Chosen(0, cold(first.persists(_HOUR)), 0.0, got.jobs)
    if got.variant is None:
        return Chosen(0, 0.0, 0.0, got.jobs, raw=True)
    caution, falls = grids[got.variant][got.column]
    return Chosen(got.variant, caution, falls, got.jobs)
