"""Each signal's forecast calibration: the forecasts its feed issued and the values that came are
kept in PostgreSQL (a rolling window), what they teach is learned by lowtide.forecast_calibration
and stored, and every forecast point is published with an expected error: the feed's own, else
the one learned for its lead, else the prior's (see docs/explanation/forecast-error.md).

Any replica may learn (the same record teaches the same; the newest stored wins) and every
replica states what is stored, so they agree. A replayed feed runs faster than the clock: its
times are scaled by its speed, so a lead is counted in the feed's own time."""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import itertools
import json
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation

from lowtide.db import Database, load_queries
from lowtide.forecast_calibration import WINDOW, Bucket, Calibration, Issued, Record, prior_calibration
from lowtide.forecast_error import ErrorModel, HorizonError
from lowtide.metrics import Metrics
from signal_service.domain import SignalForecast

log = logging.getLogger("lowtide.signal")
Q = load_queries("signal_service.sql", "calibration.sql")

# The record a learning reads at most (a fast replay issues a forecast every poll): the newest
# forecasts, and the values that came over the same span.
MAX_FORECASTS = 700
MAX_ACTUALS = 20_000
LEARN_EVERY = timedelta(minutes=10)
FEED, PRIOR = "feed", "prior"
ONE_POINT_STEP = timedelta(minutes=30)


@dataclass(frozen=True, slots=True)
class IssuedRow:
    issued_at: datetime
    at: list[datetime]
    value: list[float]


@dataclass(frozen=True, slots=True)
class ActualRow:
    at: datetime
    value: float


@dataclass(frozen=True, slots=True)
class Count:
    count: int


@dataclass(frozen=True, slots=True)
class CalibrationRow:
    signal: str
    learned_at: datetime
    body: dict[str, Any]


def error_source(calibration: Calibration, lead: timedelta) -> str:
    if not calibration.learned(lead):
        return PRIOR
    return f"learned over {calibration.days:.1f} days"


class Calibrations:
    """The stored calibration of every signal, and the hooks that keep its record."""

    def __init__(
        self,
        db: Database,
        *,
        scales: Mapping[str, float] | None = None,
        prior: ErrorModel | None = None,
        priors: Mapping[str, ErrorModel] | None = None,
        every: timedelta = LEARN_EVERY,
    ) -> None:
        self._db = db
        self._scales = dict(scales or {})
        # The prior of each signal (`[signals.NAME] forecast_error_prior_*`), else `prior`.
        self._prior = prior or HorizonError()
        self._priors = dict(priors or {})
        self._every = every
        self._learned: dict[str, Calibration] = {}
        self._last_learn: dict[str, datetime] = {}
        # How often each signal's record was said to have grown (learn_soon): a learning that
        # began before the last of those did not see all of it.
        self._grown: dict[str, int] = {}

    def scale(self, name: str) -> float:
        return self._scales.get(name, 1.0)

    def learned(self) -> dict[str, Calibration]:
        return dict(self._learned)

    def prior(self, name: str) -> ErrorModel:
        return self._priors.get(name, self._prior)

    def current(self, name: str, now: datetime) -> Calibration:
        return self._learned.get(name) or prior_calibration(now, self.prior(name))

    def apply(self, forecast: SignalForecast) -> SignalForecast:
        """The forecast with every point stating an expected error and where it comes from; of a
        feed that states none, with the learned bias of each point and the calibration itself,
        which the planner corrects the points with (lowtide.calibrated_forecast)."""
        if not forecast.points or forecast.issued_at is None:
            return forecast
        issued, scale = forecast.issued_at, self.scale(forecast.name)
        calibration = self.current(forecast.name, issued)
        stated = []
        for p in forecast.points:
            if p.expected_error is not None:
                stated.append(dataclasses.replace(p, error_source=FEED))
                continue
            lead = (p.at - issued) * scale
            stated.append(
                dataclasses.replace(
                    p,
                    expected_error=calibration.stddev(lead),
                    error_source=error_source(calibration, lead),
                    bias=calibration.bias(lead),
                )
            )
        if any(p.error_source == FEED for p in stated):
            # The feed states its errors: planned on as stated, with no correction.
            return dataclasses.replace(forecast, points=tuple(stated))
        return dataclasses.replace(forecast, points=tuple(stated), calibration=calibration, lead_scale=scale)

    async def record_forecast(self, forecast: SignalForecast) -> None:
        if not forecast.points or forecast.issued_at is None:
            return
        params = {
            "name": forecast.name,
            "issued_at": forecast.issued_at,
            "at": [p.at for p in forecast.points],
            "values": [p.value for p in forecast.points],
        }
        await self._db.execute(Q["record_issued_forecast"], params)

    async def record_actual(self, name: str, at: datetime, value: float) -> None:
        await self._db.execute(Q["record_actual"], {"name": name, "at": at, "value": value})

    async def record_past(self, name: str, pairs: Sequence[tuple[datetime, float, float]], *, lead: timedelta) -> None:
        """A feed's past (time, forecast, value that came), each forecast as issued `lead` before
        its time (see signal_service/feeds/seed.py)."""
        if not pairs:
            return
        params = {
            "name": name,
            "lead": lead,
            "at": [at for at, _, _ in pairs],
            "forecast": [forecast for _, forecast, _ in pairs],
            "actual": [actual for _, _, actual in pairs],
        }
        await self._db.execute(Q["record_past_forecasts"], params)

    async def actuals_between(self, name: str, start: datetime, end: datetime) -> int:
        row = await self._db.fetch_one_as(Count, Q["count_actuals"], {"name": name, "start": start, "end": end})
        return 0 if row is None else row.count

    async def load(self) -> None:
        """Takes what any replica learned last."""
        for row in await self._db.fetch_as(CalibrationRow, Q["calibrations"]):
            self._learned[row.signal] = _decode(row.body)

    async def maybe_learn(self, names: list[str], now: datetime) -> None:
        """Learns each signal's calibration again when the last is older than `every`."""
        for name in names:
            last = self._last_learn.get(name)
            if last is not None and now - last < self._every:
                continue
            grown = self._grown.get(name, 0)
            await self.learn(name, now)
            # Only once learned: a learning the database refused is tried again at the next tick;
            # and not when the record grew while it learned (the seeding stored the past meanwhile):
            # what it missed is learned at the next tick, not a day later.
            if self._grown.get(name, 0) == grown:
                self._last_learn[name] = now

    def learn_soon(self, name: str) -> None:
        """The signal's calibration is learned again at the next `maybe_learn` (its record has
        just grown: signal_service/feeds/seed.py), by the one loop that learns and loads."""
        self._grown[name] = self._grown.get(name, 0) + 1
        self._last_learn.pop(name, None)

    async def learn(self, name: str, now: datetime) -> Calibration:
        scale = self.scale(name)
        since = now - WINDOW / scale
        params = {"name": name, "since": since}
        issued_rows = await self._db.fetch_as(IssuedRow, Q["issued_forecasts"], {**params, "limit": MAX_FORECASTS})
        actual_rows = await self._db.fetch_as(ActualRow, Q["actuals"], {**params, "limit": MAX_ACTUALS})
        record = _record(issued_rows, actual_rows, origin=since, scale=scale)
        learned = await asyncio.to_thread(record.learn, _scaled(now, since, scale), self.prior(name))
        if scale != 1.0:
            # A replay's times are rescaled from a moving origin: its time of day is no profile's.
            learned = learned.without_profile()
        body = json.dumps(_encode(learned))
        saved = await self._db.execute(Q["save_calibration"], {"name": name, "learned_at": now, "body": body})
        await self._db.execute(Q["trim_issued_forecasts"], {**params, "keep": MAX_FORECASTS})
        await self._db.execute(Q["trim_actuals"], params)
        if saved:
            # Not when a later learning (another replica's, or one that began after this one)
            # was stored first: the next load() takes that one.
            self._learned[name] = learned
        return learned


def register_calibration_metrics(metrics: Metrics, calibrations: Calibrations) -> None:
    """Each signal's learned error and bias by lead bucket (`lead`: the bucket's start, hours),
    and the forecast points it was learned from."""

    def observe(field: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            for name, calibration in calibrations.learned().items():
                for b in calibration.buckets:
                    yield Observation(getattr(b, field), {"signal": name, "lead": f"{b.lo_h:g}"})

        return callback

    meter = metrics.meter
    meter.create_observable_gauge(
        "lowtide.signal.forecast.error", callbacks=[observe("stddev")], description="Expected relative error by lead"
    )
    meter.create_observable_gauge(
        "lowtide.signal.forecast.bias", callbacks=[observe("bias")], description="Learned bias (actual/forecast - 1)"
    )
    meter.create_observable_gauge(
        "lowtide.signal.forecast.samples",
        callbacks=[observe("samples")],
        unit="{point}",
        description="Forecast points the error was learned from",
    )


def _scaled(at: datetime, origin: datetime, scale: float) -> datetime:
    return origin + (at - origin) * scale


def _record(issued: list[IssuedRow], actuals: list[ActualRow], *, origin: datetime, scale: float) -> Record:
    """The record in the feed's time, each forecast's points on the grid of its own step (a
    replay's wall-clock times jitter with its polls), each matched with the first value observed
    in its interval."""
    record = Record()
    seen = [_scaled(a.at, origin, scale) for a in actuals]
    anchor: datetime | None = None
    for row in sorted(issued, key=lambda r: r.issued_at):
        times = [_scaled(t, origin, scale) for t in row.at]
        if not times:
            continue
        # A forecast of one point (a feed's past, seeded at start) covers the half hour from it.
        step = ONE_POINT_STEP
        if len(times) > 1:
            step = max(timedelta(minutes=1), sorted(b - a for a, b in itertools.pairwise(times))[len(times) // 2 - 1])
        # One grid for the whole record, in phase with the feed's own times (its first forecast's
        # first point). Not with the window's start, a moment of the clock: that moved a point by up
        # to half a step, so a lead of 30 minutes was learned as one of 27 (in the bucket below)
        # when the learning ran late in a half hour.
        anchor = anchor or times[0]
        grid = [anchor + round((t - anchor) / step) * step for t in times]
        record.add_forecast(Issued(_scaled(row.issued_at, origin, scale), tuple(zip(grid, row.value, strict=True))))
        # Paired at the point's own time: its grid time may be up to half a step off it.
        for raw, at in zip(times, grid, strict=True):
            j = bisect.bisect_left(seen, raw)
            if at not in record.actuals and j < len(seen) and seen[j] < raw + step:
                record.add_actual(at, actuals[j].value)
    return record


def _encode(calibration: Calibration) -> dict[str, Any]:
    return {
        "at": calibration.at.isoformat(),
        # JSON has no infinity: the last bucket's open end is null.
        "buckets": [
            [b.lo_h, None if math.isinf(b.hi_h) else b.hi_h, *dataclasses.astuple(b)[2:]] for b in calibration.buckets
        ],
        "caution": calibration.caution,
        "caution_jobs": calibration.caution_jobs,
        "caution_slope": calibration.caution_slope,
        "days": calibration.days,
        "persistence": list(calibration.persistence),
        "follow": list(calibration.follow),
        "residual": list(calibration.residual),
        "raw": calibration.raw,
        "follow_raw": calibration.follow_raw,
        "profile": list(calibration.profile),
        "profile_share": list(calibration.profile_share),
    }


def _decode(body: Mapping[str, Any]) -> Calibration:
    return Calibration(
        at=datetime.fromisoformat(body["at"]),
        buckets=tuple(Bucket(b[0], math.inf if b[1] is None else b[1], *b[2:]) for b in body["buckets"]),
        caution=body["caution"],
        caution_jobs=body["caution_jobs"],
        # Stored before the caution fell with the window: the same for every window.
        caution_slope=body.get("caution_slope", 0.0),
        days=body["days"],
        persistence=tuple(body["persistence"]),
        # Stored before the calibration learned them: absent.
        follow=tuple(body.get("follow", ())),
        residual=tuple(body.get("residual", ())),
        raw=bool(body.get("raw", False)),
        follow_raw=bool(body.get("follow_raw", False)),
        # Stored before the day profile was learned: none.
        profile=tuple(body.get("profile", ())),
        profile_share=tuple(body.get("profile_share", ())),
    )
