"""A feed's day profile: the mean of its values by half hour of the UTC day over the last week,
as a second reading of the change from the present beside the forecast's own (see
docs/explanation/forecast-error.md#the-day-profile).

A grid's values have a shape by time of day (the evening peak, the midday solar dip) that a
forecast can miss on a bad day: a forecast issued at noon may put a dip at 16:00 where the
evening rise comes every day. The calibration learns, by lead, how much of the change the
profile makes between two times of day the values then made, beside the share of the forecast's
own change (lowtide.forecast_calibration): where the forecast already carries the day's shape,
the profile adds nothing and its share is learned near 0.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

# Half hours of the day, and the days of values a profile is the mean of.
SLOTS = 48
DAYS = 7
_SLOT = timedelta(minutes=30)
_SPAN = timedelta(days=DAYS)

Profile = tuple[float, ...]


def slot(at: datetime) -> int:
    return (at.hour * 60 + at.minute) // 30


def day_profile(values: Iterable[tuple[datetime, float]]) -> Profile:
    """The mean of `values` by half hour of the day; a half hour with none takes the nearest
    one's (a feed with a value an hour has every other one), and () without a positive value."""
    sums, counts = [0.0] * SLOTS, [0] * SLOTS
    for at, value in values:
        if value > 0:
            sums[slot(at)] += value
            counts[slot(at)] += 1
    means = [s / c if c else None for s, c in zip(sums, counts, strict=True)]
    if not any(counts):
        return ()
    filled = []
    for i in range(SLOTS):
        for d in range(SLOTS):
            near = means[(i - d) % SLOTS] or means[(i + d) % SLOTS]
            if near:
                filled.append(near)
                break
    return tuple(filled)


def change(profile: Sequence[float], start: datetime, end: datetime) -> float:
    """The relative change the profile makes from `start`'s time of day to `end`'s (0 without one)."""
    if not profile:
        return 0.0
    frm, to = profile[slot(start)], profile[slot(end)]
    return to / frm - 1 if frm > 0 and to > 0 else 0.0


class Rolling:
    """The profile of the week before any moment, over one set of values (sorted once; each
    moment's profile made once)."""

    def __init__(self, values: Sequence[tuple[datetime, float]]) -> None:
        self._values = sorted((at, v) for at, v in values if v > 0)
        self._times = [at for at, _ in self._values]
        self._made: dict[datetime, Profile] = {}

    def at(self, now: datetime) -> Profile:
        """The profile of the values in (now - DAYS, now]."""
        made = self._made.get(now)
        if made is None:
            lo = bisect.bisect_right(self._times, now - _SPAN)
            hi = bisect.bisect_right(self._times, now)
            made = self._made[now] = day_profile(self._values[lo:hi])
        return made
