"""The signal's rules, as pure functions over small frozen values: when a signal is high, which
values are refused, and when a signal is stale. Nothing here does I/O or reads the clock."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from lowtide.errors import InvalidArgument
from lowtide.forecast_calibration import Calibration

# Units whose values cannot be negative. Power prices can (and do) go below zero, so a signal in
# any other unit may carry a negative value.
_NON_NEGATIVE_UNITS = frozenset({"gCO2/kWh", "gCO2eq/kWh", "lbs/MWh", "lbsCO2/MWh", "percentile", "percent"})


# The values a signal in each unit can plausibly take, low to high: a value outside is a typo or
# a broken feed (1e308 would hold work for days and flatten every chart), never the grid. Wide
# enough for the real extremes: carbon intensity tops out near 1,300 gCO2/kWh (coal, in g and in
# lbs/MWh); a day-ahead price may go negative, and the European market's harmonised limits
# (-500 and +4,000 EUR/MWh, raised in steps when prices come near) fit with room.
PLAUSIBLE: dict[str, tuple[float, float]] = {
    "gCO2/kWh": (0.0, 2_000.0),
    "gCO2eq/kWh": (0.0, 2_000.0),
    "lbs/MWh": (0.0, 4_500.0),
    "lbsCO2/MWh": (0.0, 4_500.0),
    "percentile": (0.0, 100.0),
    "percent": (0.0, 100.0),
    "EUR/MWh": (-1_000.0, 10_000.0),
}
# Any other unit (set by hand, or a feed in another currency): a bound only against the absurd.
OTHER_UNITS = (-1e6, 1e6)


@dataclass(frozen=True, slots=True)
class ValueRange:
    """The values a signal accepts, inclusive."""

    low: float
    high: float

    @classmethod
    def of(cls, unit: str, low: float | None = None, high: float | None = None) -> ValueRange:
        """The unit's plausible range, with either end replaced where configured."""
        default_low, default_high = PLAUSIBLE.get(unit, OTHER_UNITS)
        return cls(default_low if low is None else low, default_high if high is None else high)

    def __str__(self) -> str:
        return f"{self.low:g} to {self.high:g}"


@dataclass(frozen=True, slots=True)
class SignalState:
    """A signal's latest state as stored; `high` is derived so that no copy can disagree."""

    name: str
    unit: str
    threshold: float
    value: float | None
    observed_at: datetime | None
    source: str
    version: int
    stale: bool

    @property
    def high(self) -> bool:
        return is_high(self.value, self.threshold)


@dataclass(frozen=True, slots=True)
class Reading:
    """One value from a feed or an operator."""

    value: float
    observed_at: datetime
    unit: str


@dataclass(frozen=True, slots=True)
class Point:
    """A value at a time: one entry of a history or a forecast. A forecast point may state its
    expected relative error (one standard deviation: 0.05 is 5 %), and where it comes from (the
    feed, the signal's calibration or its prior: signal_service.calibration)."""

    at: datetime
    value: float
    expected_error: float | None = None
    error_source: str = ""
    # The learned bias at the point's lead (actual / forecast - 1), when its error is not the feed's.
    bias: float | None = None


@dataclass(frozen=True, slots=True)
class SignalForecast:
    """A feed's forecast for a signal, as issued: `version` grows with each new one (0: none
    yet), and an empty `points` is a forecast too (the feed stopped giving one)."""

    name: str
    points: tuple[Point, ...]
    source: str
    version: int
    issued_at: datetime | None
    # What the signal's calibration learned, when the points' errors are its (not the feed's),
    # and the feed's time per wall-clock time its leads are counted in (a replay's speed).
    calibration: Calibration | None = None
    lead_scale: float = 1.0


def is_high(value: float | None, threshold: float) -> bool:
    """High while the value is over the threshold, and until the first value arrives: work that
    waits for a low signal must not start on the strength of a value nobody has seen."""
    return value is None or value > threshold


def validate_value(
    value: float, unit: str, *, field: str = "value", accepted: ValueRange | None = None, signal: str = ""
) -> float:
    """The value, if it can be stored for a signal in `unit` whose range is `accepted` (default:
    the unit's plausible range); InvalidArgument naming `field` and the range if not."""
    if math.isnan(value):
        raise InvalidArgument(field, "is NaN; send a number")
    if math.isinf(value):
        raise InvalidArgument(field, "is infinite; send a finite number")
    if value < 0 and unit in _NON_NEGATIVE_UNITS:
        raise InvalidArgument(field, f"is {value:g}, but a value in {unit} cannot be negative")
    accepted = accepted or ValueRange.of(unit)
    if not accepted.low <= value <= accepted.high:
        table = f"[signals.{signal}]" if signal else "[signals.NAME]"
        raise InvalidArgument(
            field,
            f"is {value:g}, outside the plausible range of {accepted} {unit}"
            f"{f' of signal {signal}' if signal else ''}; a value there is refused as a typo or a broken "
            f"feed (set {table} min and max to change the range)",
        )
    return value


def check_unit(given: str, expected: str, *, field: str = "unit") -> None:
    """A value in another unit is refused rather than converted: a conversion lowtide guessed
    (marginal vs average intensity, percentile vs grams) would silently move every hold."""
    if given and given != expected:
        raise InvalidArgument(field, f"is {given!r}, but this signal is in {expected!r}")


MAX_SOURCE_CHARS = 200


def check_source(source: str, *, field: str = "source") -> str:
    """Who set a value, as stored and shown: bounded, and printable (PostgreSQL text cannot hold
    NUL, and a control character would garble a log line or a terminal)."""
    if len(source) > MAX_SOURCE_CHARS:
        raise InvalidArgument(field, f"is {len(source)} characters long; at most {MAX_SOURCE_CHARS}")
    bad = next((c for c in source if not c.isprintable()), None)
    if bad is not None:
        raise InvalidArgument(field, f"contains the control character U+{ord(bad):04X}")
    return source


def is_stale(updated_at: datetime | None, stale_after: timedelta, now: datetime) -> bool:
    """Stale once no value has been stored for longer than stale_after. A signal that never had
    a value is not stale: it is high already, and there is nothing old to distrust."""
    return updated_at is not None and now - updated_at > stale_after
