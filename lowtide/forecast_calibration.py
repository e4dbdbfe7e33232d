"""A feed's forecast error, learned from its own record: the forecasts it issued and the values
that came (see docs/explanation/forecast-error.md).

From the pairs (forecast point, actual value) of a rolling window it learns, by lead time: the
bias (the median of actual / forecast - 1) and the spread around it (1.4826 x the median absolute
deviation, a standard deviation robust to outliers), each blended toward a prior while there are
few forecasts to learn from. Then it learns how much caution pays on this feed: it re-plays the
window's jobs (one start chosen in a window, re-planned on each issued forecast, as the planner
scores starts) under each caution, and keeps the one whose starts were cheapest in fact.

Nothing here does I/O or reads a clock: the signal service and the carbon bench feed it the same
way, with only what was known at `now`.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from lowtide import forecast_caution, forecast_profile
from lowtide.forecast_error import ErrorModel, HorizonError
from lowtide.forecast_follow import Followed, FollowFit
from lowtide.forecast_replay import CAUTION_WINDOW, CAUTIONS, JOB_SLACKS, JOB_STRIDE, MIN_JOBS, windowed

__all__ = [
    "BUCKET_EDGES_H",
    "CAUTIONS",
    "CAUTION_WINDOW",
    "JOB_SLACKS",
    "JOB_STRIDE",
    "MIN_JOBS",
    "PRIOR_CAUTION",
    "WINDOW",
    "Bucket",
    "Calibration",
    "Issued",
    "Record",
    "prior_calibration",
]

_HOUR = timedelta(hours=1)
WINDOW = timedelta(days=14)
# Lead-time buckets (hours; the last is open): finer near, where the error changes fastest.
BUCKET_EDGES_H = (0.0, 0.5, 1, 2, 3, 4, 6, 8, 12, 16, 20, 24, 30, 36, 42, 48)
# How many issued forecasts the prior weighs as: a bucket learned from that many has the data's
# figures and the prior's at half weight each.
PRIOR_FORECASTS = 8
# The planner's default caution without a record (those tried on it: forecast_replay.CAUTIONS).
PRIOR_CAUTION = 1.0
_MAD_TO_SIGMA = 1.4826
# The leads a plan made on a forecast issued earlier sees as its present (feeds issue one every
# half hour to few hours), and at most one forecast per `ANCHOR_STRIDE` for learning how errors
# persist (each weighs 12 x 96 pairs).
ANCHOR_LEAD = timedelta(hours=6)
ANCHOR_STRIDE = timedelta(hours=1)
# A relative error beyond this is a bad value (a zero actual, a units slip), not a forecast's error.
_WILD = 5.0


@dataclass(frozen=True, slots=True)
class Issued:
    """One forecast as its feed issued it: (target time, value) points, in time order."""

    issued_at: datetime
    points: tuple[tuple[datetime, float], ...]


@dataclass(frozen=True, slots=True)
class Bucket:
    lo_h: float
    hi_h: float
    forecasts: int
    samples: int
    bias: float
    stddev: float


@dataclass(frozen=True, slots=True)
class Calibration:
    """What the record taught at `at`: per lead bucket the bias and error (blended with the
    prior), and the caution that paid (`caution_jobs` re-played; 0 when the prior's was kept),
    a 4 h window's, falling by `caution_slope` per doubling of the window (`caution_for`)."""

    at: datetime
    buckets: tuple[Bucket, ...]
    caution: float = PRIOR_CAUTION
    caution_jobs: int = 0
    caution_slope: float = 0.0
    days: float = 0.0
    # How much of a forecast's error now is still there `BUCKET_EDGES_H[i]` hours later (the
    # regression of the later error on the earlier; 0 without a record).
    persistence: tuple[float, ...] = ()
    # Per bucket of time from the present: how much of the change a forecast predicts from the
    # present the values then followed (`follow`: 1 the forecast's shape holds, below 1 its swings
    # are partly noise), and the relative error left around it. Empty without a record: then
    # `correct` moves by `persistence`.
    follow: tuple[float, ...] = ()
    residual: tuple[float, ...] = ()
    # The record says to plan on the forecasts as issued (no correction, no error, caution 0):
    # re-played, they started the window's jobs clearly cheaper than the corrected ones.
    raw: bool = False
    # The follow applies to the forecast as issued, its bias by lead left in: the record's jobs,
    # re-played, started clearly cheaper so.
    follow_raw: bool = False
    # The feed's day profile at `at` (lowtide.forecast_profile), and per bucket of time from the
    # present the share of its change the values made beside the forecast's (empty: none).
    profile: tuple[float, ...] = ()
    profile_share: tuple[float, ...] = ()

    def without_profile(self) -> Calibration:
        return dataclasses.replace(self, profile=(), profile_share=()) if self.profile_share else self

    def caution_for(self, window: timedelta) -> float:
        """The caution for a task whose latest start is `window` after now (or its earliest)."""
        return windowed(self.caution, self.caution_slope, window)

    def _bucket(self, lead: timedelta) -> Bucket:
        return self.buckets[_bucket_of(lead)]

    def stddev(self, lead: timedelta) -> float:
        return self._bucket(lead).stddev if lead > timedelta(0) else 0.0

    def bias(self, lead: timedelta) -> float:
        return self._bucket(lead).bias if lead > timedelta(0) else 0.0

    def samples(self, lead: timedelta) -> int:
        return self._bucket(lead).samples

    def learned(self, lead: timedelta) -> bool:
        """Whether the figures at this lead come mostly from the record (else from the prior)."""
        return self._bucket(lead).forecasts >= PRIOR_FORECASTS

    def persists(self, later: timedelta) -> float:
        if not self.persistence:
            return 0.0
        return self.persistence[_bucket_of(later)]

    def correct(
        self,
        issued_at: datetime,
        points: Iterable[tuple[datetime, float]],
        *,
        now: datetime | None = None,
        actual: float | None = None,
    ) -> list[tuple[datetime, float, float]]:
        """The points with their bias taken out and the error learned for their lead:
        (time, value, relative error). Given the value `actual` at `now` and a point of the
        forecast at or before it, the error the forecast makes now is known, and the later
        points are moved by as much of it as the record says persists."""
        listed = sorted(points)
        out = [(at, value * (1 + self.bias(at - issued_at)), self.stddev(at - issued_at)) for at, value in listed]
        if now is None or actual is None:
            return out
        if self.follow:
            return self._followed(listed, out, now, actual)
        current = bisect.bisect_right(listed, (now, float("inf"))) - 1
        if current < 0 or out[current][1] <= 0:
            return out
        error = actual / out[current][1] - 1
        return [(at, v * (1 + self.persists(at - now) * error) if at > now else v, e) for at, v, e in out]

    def _followed(
        self,
        listed: Sequence[tuple[datetime, float]],
        out: list[tuple[datetime, float, float]],
        now: datetime,
        actual: float,
    ) -> list[tuple[datetime, float, float]]:
        """The later points as the present `actual` plus the learned share of the change the
        forecast predicts from the present (its value now, or `actual` when it starts later): the
        error it makes at present is taken as lasting along it (real forecast errors are a level
        or a ramp off for hours: a whole ramp comes early or late)."""
        # On the forecast with its bias by lead taken out (a bias that differs by lead is a
        # change the forecast predicts and the values do not make), unless the record said not.
        if self.follow_raw:
            out = [(at, raw, error) for (at, raw), (_, _, error) in zip(listed, out, strict=True)]
        anchor = _anchor([(at, v) for at, v, _ in out], now, actual)
        if anchor <= 0 or actual <= 0:
            return out
        moved = []
        for at, value, error in out:
            if at <= now:
                moved.append((at, value, error))
                continue
            b = _bucket_of(at - now)
            change = self.follow[b] * (value / anchor - 1)
            if self.profile_share:
                change += self.profile_share[b] * forecast_profile.change(self.profile, now, at)
            expected = max(0.0, actual * (1 + change))
            moved.append((at, expected, self.residual[b]))
        return moved


@functools.lru_cache(maxsize=4096)
def _bucket_of(lead: timedelta) -> int:
    """The bucket of `BUCKET_EDGES_H` a lead is in (a record's leads are few: cached)."""
    return max(0, bisect.bisect_right(BUCKET_EDGES_H, max(0.0, lead / _HOUR)) - 1)


def _anchor(listed: Sequence[tuple[datetime, float]], now: datetime, actual: float) -> float:
    """The forecast's value for the present: its point at or before `now` (the interval `now` is
    in), or the present's own value when the forecast starts after it."""
    current = bisect.bisect_right(listed, (now, float("inf"))) - 1
    return listed[current][1] if current >= 0 else actual


def prior_calibration(at: datetime, prior: ErrorModel | None = None) -> Calibration:
    model = prior or HorizonError()
    buckets = []
    for i, lo in enumerate(BUCKET_EDGES_H):
        hi = BUCKET_EDGES_H[i + 1] if i + 1 < len(BUCKET_EDGES_H) else float("inf")
        mid = lo + 0.5 if hi == float("inf") else (lo + hi) / 2
        buckets.append(Bucket(lo, hi, 0, 0, 0.0, model.stddev(mid * _HOUR)))
    return Calibration(at, tuple(buckets))


@dataclass
class Record:
    """The forecasts a feed issued and the values that came, over a rolling window."""

    window: timedelta = WINDOW
    issued: list[Issued] = field(default_factory=list)
    actuals: dict[datetime, float] = field(default_factory=dict)

    def add_forecast(self, forecast: Issued) -> None:
        """Kept in issue order; one issued at the same time as a kept one replaces it."""
        if not self.issued or forecast.issued_at > self.issued[-1].issued_at:
            self.issued.append(forecast)
            return
        at = bisect.bisect_left([f.issued_at for f in self.issued], forecast.issued_at)
        if self.issued[at].issued_at == forecast.issued_at:
            self.issued[at] = forecast
        else:
            self.issued.insert(at, forecast)

    def add_actual(self, at: datetime, value: float) -> None:
        self.actuals[at] = value

    def forget_before(self, start: datetime) -> None:
        self.issued = [f for f in self.issued if f.issued_at >= start]
        self.actuals = {t: v for t, v in self.actuals.items() if t >= start}

    def learn(self, now: datetime, prior: ErrorModel | None = None) -> Calibration:
        """What the record up to `now` teaches (nothing after `now` is read)."""
        start = now - self.window
        base = prior_calibration(now, prior)
        errors: list[list[float]] = [[] for _ in BUCKET_EDGES_H]
        issues: list[set[datetime]] = [set() for _ in BUCKET_EDGES_H]
        first: datetime | None = None
        for forecast in self.issued:
            if not (start <= forecast.issued_at <= now):
                continue
            for at, value in forecast.points:
                actual = self.actuals.get(at)
                if actual is None or at > now or value <= 0 or actual <= 0:
                    continue
                error = actual / value - 1
                if abs(error) > _WILD:
                    continue
                b = _bucket_of(at - forecast.issued_at)
                errors[b].append(error)
                issues[b].add(forecast.issued_at)
                first = forecast.issued_at if first is None else min(first, forecast.issued_at)
        buckets = tuple(
            _blend(prior_b, sample, len(seen))
            for prior_b, sample, seen in zip(base.buckets, errors, issues, strict=True)
        )
        days = (now - first) / timedelta(days=1) if first else 0.0
        persistence = self._persistence(Calibration(now, buckets), start, now)
        profiles = forecast_profile.Rolling([(at, v) for at, v in self.actuals.items() if at <= now])
        profile = profiles.at(now)
        fit = self._follow(Calibration(now, buckets), base, start, now, profiles)
        calibration = _fitted(Calibration(now, buckets, days=days, persistence=persistence), fit, profile)
        if not fit.follow:
            return self._cautious([calibration], now)
        # The same learned on the forecasts as issued (the prior's bias is 0): a short record's
        # bias by lead is noisy, and a level bias comes out with the present anyway.
        raw = _fitted(calibration, self._follow(base, base, start, now, profiles), profile, follow_raw=True)
        return self._cautious([calibration, raw], now)

    def _cautious(self, variants: Sequence[Calibration], now: datetime) -> Calibration:
        """The variant and caution the record's re-play chose (forecast_caution.chosen)."""
        got = forecast_caution.chosen(self.issued, self.actuals, variants, now, PRIOR_CAUTION)
        return dataclasses.replace(
            variants[got.variant], caution=got.caution, caution_slope=got.slope, caution_jobs=got.jobs, raw=got.raw
        )

    def _follow(
        self,
        biased: Calibration,
        prior: Calibration,
        start: datetime,
        now: datetime,
        profiles: forecast_profile.Rolling,
    ) -> Followed:
        """Per bucket of time from an anchor (a present a plan sees: a point of lead up to
        `ANCHOR_LEAD`, or the issue itself for a forecast that starts after it), how the actual
        relative change from the anchor followed the change the forecast predicted (its bias by
        lead, as `biased` learned it, taken out) and the change the day profile of the week
        before the issue makes (lowtide.forecast_follow). Empty without a record."""
        fit = FollowFit(len(BUCKET_EDGES_H))
        last: datetime | None = None
        for forecast in self.issued:
            if not (start <= forecast.issued_at <= now) or (last and forecast.issued_at - last < ANCHOR_STRIDE):
                continue
            last = forecast.issued_at
            known = [
                (at, v * (1 + biased.bias(at - forecast.issued_at)), self.actuals[at])
                for at, v in forecast.points
                if at <= now and at in self.actuals
            ]
            known = [(at, v, a) for at, v, a in known if v > 0 and a > 0 and abs(a / v - 1) <= _WILD]
            anchors = [(at, v, a) for at, v, a in known if at - forecast.issued_at <= ANCHOR_LEAD]
            issue_actual = self.actuals.get(forecast.issued_at)
            if forecast.points and forecast.points[0][0] > forecast.issued_at and issue_actual:
                anchors.insert(0, (forecast.issued_at, issue_actual, issue_actual))
            profile = profiles.at(forecast.issued_at) if anchors else ()
            for u, fu, au in anchors:
                for at, v, a in known:
                    x, y = v / fu - 1, a / au - 1
                    if at > u and abs(x) <= _WILD and abs(y) <= _WILD:
                        z = forecast_profile.change(profile, u, at)
                        fit.add(_bucket_of(at - u), forecast.issued_at, x, z, y)
        return fit.fitted([b.stddev for b in prior.buckets], PRIOR_FORECASTS)

    def _persistence(self, calibration: Calibration, start: datetime, now: datetime) -> tuple[float, ...]:
        """Per bucket of time later, the regression of a forecast's error then on its error at a
        point of lead up to `ANCHOR_LEAD` (the leads a plan sees as the present), bias taken out;
        in [0, 1], blended toward 0 as the errors are toward the prior."""
        products = [0.0] * len(BUCKET_EDGES_H)
        squares = [0.0] * len(BUCKET_EDGES_H)
        seen: list[set[datetime]] = [set() for _ in BUCKET_EDGES_H]
        last: datetime | None = None
        for forecast in self.issued:
            if not (start <= forecast.issued_at <= now) or (last and forecast.issued_at - last < ANCHOR_STRIDE):
                continue
            last = forecast.issued_at
            errors = []
            for at, value, _ in calibration.correct(forecast.issued_at, forecast.points):
                actual = self.actuals.get(at)
                if actual is not None and at <= now and value > 0 and abs(actual / value - 1) <= _WILD:
                    errors.append((at, actual / value - 1))
            for i, (at, error) in enumerate(errors):
                if at - forecast.issued_at > ANCHOR_LEAD:
                    break
                for later, other in errors[i + 1 :]:
                    b = _bucket_of(later - at)
                    products[b] += error * other
                    squares[b] += error * error
                    seen[b].add(forecast.issued_at)
        out = []
        for p, q, issues in zip(products, squares, seen, strict=True):
            slope = min(1.0, max(0.0, p / q)) if q > 0 else 0.0
            out.append(slope * len(issues) / (len(issues) + PRIOR_FORECASTS))
        return tuple(out)


def _fitted(
    calibration: Calibration, fit: Followed, profile: tuple[float, ...], follow_raw: bool = False
) -> Calibration:
    """`calibration` with the follow `fit` learned, and the day profile where it has a share."""
    share = fit.profile if any(fit.profile) else ()
    return dataclasses.replace(
        calibration,
        follow=fit.follow,
        residual=fit.residual,
        profile=profile if share else (),
        profile_share=share,
        follow_raw=follow_raw,
    )


def _blend(prior: Bucket, errors: list[float], forecasts: int) -> Bucket:
    if not errors:
        return prior
    bias = statistics.median(errors)
    spread = _MAD_TO_SIGMA * statistics.median(abs(e - bias) for e in errors) / (1 + bias)
    weight = forecasts / (forecasts + PRIOR_FORECASTS)
    stddev = weight * spread + (1 - weight) * prior.stddev
    return Bucket(prior.lo_h, prior.hi_h, forecasts, len(errors), weight * bias, stddev)
