"""How much of the change a forecast predicts from the present the values then made, learned per
bucket of time ahead (lowtide.forecast_calibration): the least-squares slope, through 0, of the
actual relative change `y` on the forecast's predicted change `x`, with the robust spread of what
it leaves; then the share of what it leaves that the change `z` the feed's day profile makes
between the same two times of day explains (lowtide.forecast_profile). Each is blended toward the
forecast as issued (follow 1, no profile) and the prior's error by how many forecasts the bucket
was learned from.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

# The most a forecast's predicted change is followed (a short record can regress steeper than 1).
MAX_FOLLOW = 1.5
_MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True, slots=True)
class Followed:
    """Per bucket: the share of the forecast's change followed, the relative error left around
    it, and the share of the day profile's change (all 0 where the profile told nothing)."""

    follow: tuple[float, ...] = ()
    residual: tuple[float, ...] = ()
    profile: tuple[float, ...] = ()


@dataclass
class _Sums:
    xx: float = 0.0
    xz: float = 0.0
    zz: float = 0.0
    xy: float = 0.0
    zy: float = 0.0
    pairs: list[tuple[float, float, float]] = field(default_factory=list)
    forecasts: set[datetime] = field(default_factory=set)

    def slopes(self) -> tuple[float, float]:
        """The forecast's slope (least squares of y on x, in [0, MAX_FOLLOW]), then the profile's
        share of what that leaves (least squares on z, in [0, 1]: a day's shape the values go
        against is a profile that tells nothing). The forecast is read first, as it was before
        there was a profile: the profile only corrects what the forecast's own change misses, and
        never damps the change it does carry (the lows of a windy day are the forecast's to see)."""
        follow = min(MAX_FOLLOW, max(0.0, self.xy / self.xx)) if self.xx > 0 else 1.0
        share = min(1.0, max(0.0, (self.zy - follow * self.xz) / self.zz)) if self.zz > 0 else 0.0
        return follow, share


class FollowFit:
    """Pairs (x, z, y) added by bucket and forecast, then fitted (`fitted`)."""

    def __init__(self, buckets: int) -> None:
        self._sums = [_Sums() for _ in range(buckets)]

    def add(self, bucket: int, issued_at: datetime, x: float, z: float, y: float) -> None:
        s = self._sums[bucket]
        s.xx += x * x
        s.xz += x * z
        s.zz += z * z
        s.xy += x * y
        s.zy += z * y
        s.pairs.append((x, z, y))
        s.forecasts.add(issued_at)

    def fitted(self, prior_error: Sequence[float], prior_forecasts: int) -> Followed:
        """Each bucket's slopes and residual, blended toward (1, 0) and `prior_error` as a bucket
        learned from `prior_forecasts` forecasts is at half weight; empty without a pair."""
        if not any(s.forecasts for s in self._sums):
            return Followed()
        follow, residual, share = [], [], []
        for s, prior in zip(self._sums, prior_error, strict=True):
            weight = len(s.forecasts) / (len(s.forecasts) + prior_forecasts)
            slope, part = s.slopes()
            spread = prior
            if len(s.pairs) >= 2:
                left = [y - slope * x for x, _, y in s.pairs]
                middle = statistics.median(left)
                spread = _MAD_TO_SIGMA * statistics.median(abs(e - middle) for e in left)
            follow.append(weight * slope + (1 - weight))
            residual.append(weight * spread + (1 - weight) * prior)
            share.append(weight * part)
        return Followed(tuple(follow), tuple(residual), tuple(share))
