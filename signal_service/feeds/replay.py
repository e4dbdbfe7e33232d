"""Replays a grid trace (CSV `Time,Carbon Intensity`, or a price trace `Time,Price`; times in UTC) at a speed
factor, from a chosen start, looping at the end or holding the last value.

The position in the trace is a pure function of the time since the replay began, so a replay
restarted with the same start plays the same values, and polling more or less often skips
values rather than slowing the trace down.

Its forecast is the trace ahead, 48 hours of it (as the UK Carbon Intensity API publishes), put
through a forecast error model (`lowtide.forecast_error`; by default an error growing with the
horizon, correlated in time, with ramps shifted in time), each point stating the model's expected
error at its horizon: a planner that used the trace's future itself would look better than any
real forecast lets it be.
"""

from __future__ import annotations

import bisect
import csv
import io
import random
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path

from lowtide.errors import ConfigError
from lowtide.forecast_error import ErrorModel
from signal_service.domain import Point, Reading

BUNDLED = "gb_2020_carbon_intensity.csv"
# Polls of a fast replay are at most this frequent, whatever the speed.
_MIN_INTERVAL = 0.05
_FORECAST_HORIZON = timedelta(hours=48)


# The headers a trace may have: a carbon intensity, or a power price (which may be negative).
TRACE_HEADERS = (["Time", "Carbon Intensity"], ["Time", "Price"])


def read_trace(text: str, *, where: str) -> list[Point]:
    rows = csv.reader(io.StringIO(text))
    header = next(rows, None)
    if header is None or [h.strip() for h in header[:2]] not in TRACE_HEADERS:
        raise ConfigError(f"{where}: expected a CSV with the header 'Time,Carbon Intensity' or 'Time,Price'")
    points = []
    for number, row in enumerate(rows, start=2):
        if not row:
            continue
        try:
            at = datetime.fromisoformat(row[0])
            points.append(Point(at if at.tzinfo else at.replace(tzinfo=UTC), float(row[1])))
        except (ValueError, IndexError):
            raise ConfigError(f"{where}: line {number}: expected 'time,value', got {','.join(row)!r}") from None
    if len(points) < 2:
        raise ConfigError(f"{where}: a trace needs at least two rows")
    points.sort(key=lambda p: p.at)
    return points


def trace_unit(path: str = "") -> str:
    """The unit of the trace at path, from its header: EUR/MWh for `Time,Price`, else gCO2/kWh
    (the bundled trace's)."""
    if not path:
        return "gCO2/kWh"
    try:
        with Path(path).expanduser().open(encoding="utf-8", errors="replace") as trace:
            header = trace.readline(200)
    except OSError as error:
        raise ConfigError(f"[signal] replay_file: cannot read {path}: {error.strerror}") from None
    return "EUR/MWh" if [h.strip() for h in header.split(",")[:2]] == ["Time", "Price"] else "gCO2/kWh"


def load_trace(path: str = "") -> list[Point]:
    """The trace at path, or the bundled GB 2020 one."""
    if path:
        try:
            return read_trace(Path(path).expanduser().read_text(), where=path)
        except OSError as error:
            raise ConfigError(f"[signal] replay_file: cannot read {path}: {error.strerror}") from None
    return read_trace(resources.files("signal_service.data").joinpath(BUNDLED).read_text(), where=BUNDLED)


class Replay:
    source = "replay"
    unit = "gCO2/kWh"
    has_forecast = True

    def __init__(
        self,
        trace: Sequence[Point],
        *,
        speed: float,
        start: datetime | None = None,
        loop: bool = True,
        forecast_model: ErrorModel | None = None,
        forecast_seed: int = 0,
        states_error: bool = True,
        clock: Callable[[], float] = time.monotonic,
        unit: str = "gCO2/kWh",
    ) -> None:
        # A price trace replays in EUR/MWh (trace_unit), negative prices and all.
        self.unit = unit
        if speed <= 0:
            raise ConfigError("[signal] replay_speed: must be above 0")
        self._trace = list(trace)
        self._times = [p.at for p in self._trace]
        first, last = self._times[0], self._times[-1]
        if start is not None and start.tzinfo is None:
            start = start.replace(tzinfo=UTC)
        if start is not None and not first <= start <= last:
            raise ConfigError(f"[signal] replay_start: {start.isoformat()} is outside the trace ({first} to {last})")
        self._start = start or first
        # One step past the last row, so that looping plays the last row for as long as the others.
        self._step = self._times[1] - first
        self._span = last - first + self._step
        self._speed = speed
        self._loop = loop
        self._forecast_model = forecast_model
        self._forecast_seed = forecast_seed
        self._states_error = states_error
        self._clock = clock
        self._began = clock()

    @property
    def time_scale(self) -> float:
        """Trace time per wall-clock time: the forecast's leads, in the trace's own time."""
        return self._speed

    def trace_time(self) -> datetime:
        """Where the replay is in the trace now."""
        played = timedelta(seconds=(self._clock() - self._began) * self._speed)
        offset = self._start - self._times[0] + played
        if self._loop:
            offset %= self._span
        else:
            offset = min(offset, self._times[-1] - self._times[0])
        return self._times[0] + offset

    def forecast_issue(self) -> tuple[int, int]:
        """The lap and row the replay is in: a new forecast is issued at each row, and the runner
        asks for it then, whatever its refresh (at a day per minute, a refresh of 5 minutes would
        leave the 2 minutes a forecast covers long past before the next one)."""
        played = self._start - self._times[0] + timedelta(seconds=(self._clock() - self._began) * self._speed)
        return (played // self._span if self._loop else 0), self._index(self.trace_time())

    def _index(self, at: datetime) -> int:
        return max(0, bisect.bisect_right(self._times, at) - 1)

    async def current(self) -> Reading:
        # observed_at is the wall-clock time: the replayed value stands for "now" in a demo or a
        # benchmark, and a 2020 timestamp would make it look ancient.
        point = self._trace[self._index(self.trace_time())]
        return Reading(point.value, datetime.now(UTC), self.unit)

    async def forecast(self) -> list[Point]:
        """The rows ahead in the trace (48 hours of trace time), at the wall-clock times the
        replay will reach them, with the configured error model's error and expected error."""
        at = self.trace_time()
        now = datetime.now(UTC)
        index = self._index(at)
        ahead_at, truth = self._ahead(index)
        model = self._forecast_model
        if model is None:
            return [Point(now + (t - at) / self._speed, v) for t, v in zip(ahead_at, truth[1:], strict=True)]
        # The error is drawn afresh at each row (a new forecast is issued every half hour), and
        # is the same for every poll within the row, so the forecast does not jitter between
        # polls and a replay restarted with the same start forecasts the same.
        noise = random.Random(f"{self._forecast_seed}:{self._times[index].isoformat()}")
        values = model.perturb(truth, self._step, noise)[1:]
        here = self._times[index]
        return [
            Point(now + (t - at) / self._speed, v, model.stddev(t - here) if self._states_error else None)
            for t, v in zip(ahead_at, values, strict=True)
        ]

    def _ahead(self, index: int) -> tuple[list[datetime], list[float]]:
        """The trace times of the rows in the 48 hours after row `index` (looping or not), and
        the true values: the current row's first, then those rows'."""
        times, truth = [], [self._trace[index].value]
        ahead = 1
        while True:
            position = index + ahead
            if position >= len(self._trace) and not self._loop:
                break
            laps, position = divmod(position, len(self._trace))
            trace_at = self._times[position] + laps * self._span
            # Measured from the current row, as the grid APIs count from the current half hour.
            if trace_at - self._times[index] >= _FORECAST_HORIZON:
                break
            times.append(trace_at)
            truth.append(self._trace[position].value)
            ahead += 1
        return times, truth

    def interval(self, refresh: float) -> float:
        """Poll once per trace row (at speed), so that every row is played."""
        return min(refresh, max(_MIN_INTERVAL, self._step.total_seconds() / self._speed))

    async def aclose(self) -> None:
        return None
