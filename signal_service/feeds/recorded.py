"""Replays a recording of a real feed: the forecasts it issued (CSV `issued_at,target,forecast`) and
the values that came (CSV `target,actual`), at a speed factor, from a chosen start, looping at the
end or holding the last value. The bundled recording, `uk-2023-03`, is the UK Carbon Intensity
API's national forecasts of 14 to 19 March 2023 and the values of 14 to 21 March.

At each recorded issue time (scaled by the speed) the feed's forecast becomes that recorded
forecast, every point of it as issued, bare values as the real feed gave them (the calibration
learns their error); never one issued later than where the replay is. The signal is the actual
value of the interval the replay is in.

As the trace replay (`replay.py`), the position is a pure function of the time since the replay
began, and every recorded time is put on the wall clock the same way (the replay's start at the
moment it began, then `speed` times faster), so a forecast polled twice is the same forecast and
stored once.
"""

from __future__ import annotations

import bisect
import csv
import io
import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path

from lowtide.errors import ConfigError
from signal_service.domain import Point, Reading

# The recordings shipped with the project, by name: (forecasts, actuals) in signal_service/data.
BUNDLED = {"uk-2023-03": ("uk_national_2023-03_forecasts.csv", "uk_national_2023-03_actuals.csv")}
# A recording is read whole: files past this are refused rather than read.
MAX_FILE_BYTES = 64 * 1024 * 1024
# A forecast with more points than this (a 72 h forecast at 5 minutes has 864) is refused.
MAX_POINTS_PER_FORECAST = 5000
_MIN_INTERVAL = 0.05


@dataclass(frozen=True, slots=True)
class Issue:
    """One recorded forecast: when it was issued, and its points (target time, value) in order."""

    issued_at: datetime
    points: tuple[tuple[datetime, float], ...]


@dataclass(frozen=True, slots=True)
class Recording:
    issues: tuple[Issue, ...]
    actuals: tuple[Point, ...]


def _number(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


def _time(text: str) -> datetime:
    at = datetime.fromisoformat(text.strip())
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def _rows(text: str, header: list[str], *, where: str) -> list[tuple[int, list[str]]]:
    rows = csv.reader(io.StringIO(text))
    first = next(rows, None)
    if first is None or [h.strip() for h in first[: len(header)]] != header:
        raise ConfigError(f"{where}: expected a CSV with the header {','.join(header)!r}")
    return [(number, row) for number, row in enumerate(rows, start=2) if row]


def read_forecasts(text: str, *, where: str) -> tuple[Issue, ...]:
    """The issued forecasts of a CSV `issued_at,target,forecast`, oldest issue first."""
    by_issue: dict[datetime, dict[datetime, float]] = {}
    for number, row in _rows(text, ["issued_at", "target", "forecast"], where=where):
        try:
            issued, target, value = _time(row[0]), _time(row[1]), _number(row[2])
        except (ValueError, IndexError):
            raise ConfigError(
                f"{where}: line {number}: expected 'issued_at,target,forecast', got {','.join(row)!r}"
            ) from None
        points = by_issue.setdefault(issued, {})
        if len(points) >= MAX_POINTS_PER_FORECAST:
            raise ConfigError(f"{where}: the forecast issued at {row[0]} has over {MAX_POINTS_PER_FORECAST} points")
        points[target] = value
    if not by_issue:
        raise ConfigError(f"{where}: no forecast in it")
    return tuple(Issue(at, tuple(sorted(points.items()))) for at, points in sorted(by_issue.items()))


def read_actuals(text: str, *, where: str) -> tuple[Point, ...]:
    """The values that came, of a CSV `target,actual` (each the value of the interval from its time)."""
    actuals = {}
    for number, row in _rows(text, ["target", "actual"], where=where):
        try:
            actuals[_time(row[0])] = _number(row[1])
        except (ValueError, IndexError):
            raise ConfigError(f"{where}: line {number}: expected 'target,actual', got {','.join(row)!r}") from None
    if len(actuals) < 2:
        raise ConfigError(f"{where}: a recording needs at least two actual values")
    return tuple(Point(at, value) for at, value in sorted(actuals.items()))


def _read(path: str, key: str) -> str:
    try:
        with Path(path).expanduser().open(encoding="utf-8", errors="replace") as file:
            text = file.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        raise ConfigError(f"[signal] {key}: cannot read {path}: {error.strerror}") from None
    if len(text) > MAX_FILE_BYTES:
        raise ConfigError(f"[signal] {key}: {path} is over {MAX_FILE_BYTES // (1024 * 1024)} MiB")
    return text


def load_recording(name: str = "", *, forecasts: str = "", actuals: str = "") -> Recording:
    """The recording in the files `forecasts` and `actuals` (both or neither), else the bundled one named."""
    if bool(forecasts) != bool(actuals):
        raise ConfigError("[signal] recorded_forecasts, recorded_actuals: give both files, or neither")
    if forecasts:
        return Recording(
            read_forecasts(_read(forecasts, "recorded_forecasts"), where=forecasts),
            read_actuals(_read(actuals, "recorded_actuals"), where=actuals),
        )
    if name not in BUNDLED:
        raise ConfigError(f"[signal] recording: {name!r} is not one of {', '.join(BUNDLED)}")
    data = resources.files("signal_service.data")
    issued, came = BUNDLED[name]
    return Recording(
        read_forecasts(data.joinpath(issued).read_text(), where=issued),
        read_actuals(data.joinpath(came).read_text(), where=came),
    )


class Recorded:
    """A recording played as a feed (see the module's docstring)."""

    source = "recorded"
    unit = "gCO2/kWh"
    has_forecast = True

    def __init__(
        self,
        recording: Recording,
        *,
        speed: float,
        start: datetime | None = None,
        loop: bool = True,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if speed <= 0:
            raise ConfigError("[signal] replay_speed: must be above 0")
        self._issues = recording.issues
        self._issued = [i.issued_at for i in self._issues]
        self._actuals = recording.actuals
        self._times = [a.at for a in self._actuals]
        step = sorted(b - a for a, b in itertools.pairwise(self._times))[(len(self._times) - 1) // 2]
        # The replay begins at the first issue (before it there is no forecast) and ends one step
        # past the last value, so that looping plays the last value as long as the others.
        self._first = self._issued[0]
        if self._first >= self._times[-1]:
            raise ConfigError("[signal] recorded_forecasts: its first forecast is issued after the last actual value")
        self._span = self._times[-1] + step - self._first
        if start is not None and start.tzinfo is None:
            start = start.replace(tzinfo=UTC)
        if start is not None and not self._first <= start <= self._times[-1]:
            raise ConfigError(
                f"[signal] replay_start: {start.isoformat()} is outside the recording "
                f"({self._first.isoformat()} to {self._times[-1].isoformat()})"
            )
        self._start = start or self._first
        self._speed = speed
        self._loop = loop
        self._clock = clock
        self._began = clock()
        self._began_wall = wall_clock()

    @property
    def time_scale(self) -> float:
        """Recorded time per wall-clock time: the forecast's leads, in the recording's own time."""
        return self._speed

    def _played(self) -> timedelta:
        """Recorded time since the first issue, across laps."""
        played = self._start - self._first + timedelta(seconds=(self._clock() - self._began) * self._speed)
        return played if self._loop else min(played, self._times[-1] - self._first)

    def _where(self) -> tuple[int, datetime]:
        """The lap, and the recorded time in it, where the replay is now."""
        lap, offset = divmod(self._played(), self._span)
        return lap, self._first + offset

    def recorded_time(self) -> datetime:
        """Where the replay is now, in the recording's time (within a lap)."""
        return self._where()[1]

    def wall(self, at: datetime, lap: int = 0) -> datetime:
        """The wall-clock time at which the replay plays recorded time `at` of lap `lap`."""
        return self._began_wall + (at - self._start + lap * self._span) / self._speed

    def issue_now(self) -> Issue | None:
        """The recorded forecast issued latest at or before where the replay is; None before the first."""
        index = bisect.bisect_right(self._issued, self.recorded_time()) - 1
        return self._issues[index] if index >= 0 else None

    async def current(self) -> Reading:
        """The value that came for the interval the replay is in, observed at its start."""
        lap, at = self._where()
        index = max(0, bisect.bisect_right(self._times, at) - 1)
        actual = self._actuals[index]
        return Reading(actual.value, self.wall(actual.at, lap), self.unit)

    async def forecast(self) -> list[Point]:
        lap, at = self._where()
        index = bisect.bisect_right(self._issued, at) - 1
        if index < 0:
            return []
        return [Point(self.wall(t, lap), v) for t, v in self._issues[index].points]

    def _until_next(self, times: Sequence[datetime]) -> float:
        """Wall-clock seconds until the replay reaches the next of `times` (an issue or a value)."""
        at = self.recorded_time()
        index = bisect.bisect_right(times, at)
        following = times[index] if index < len(times) else self._first + self._span
        return (following - at).total_seconds() / self._speed

    def forecast_issue(self) -> tuple[int, int]:
        """Which recorded forecast is the feed's now (lap, issue; -1 before the first): the runner
        asks for the forecast again as soon as this changes, whatever its refresh."""
        lap, at = self._where()
        return lap, bisect.bisect_right(self._issued, at) - 1

    def interval(self, refresh: float) -> float:
        """Poll as each value comes and each forecast is issued (just after), and at least every `refresh`."""
        following = min(self._until_next(self._times), self._until_next(self._issued))
        return min(refresh, max(_MIN_INTERVAL, following + 0.001))

    async def aclose(self) -> None:
        return None
