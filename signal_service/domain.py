"""The signal's rules, as pure functions over small frozen values: when a signal is high, which
values are refused, and when a signal is stale. Nothing here does I/O or reads the clock."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from lowtide.errors import InvalidArgument

# Units whose values cannot be negative. Power prices can (and do) go below zero, so a signal in
# any other unit may carry a negative value.
_NON_NEGATIVE_UNITS = frozenset({"gCO2/kWh", "gCO2eq/kWh", "lbs/MWh", "lbsCO2/MWh", "percentile", "percent"})


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
    expected relative error (one standard deviation: 0.05 is 5 %)."""

    at: datetime
    value: float
    expected_error: float | None = None


@dataclass(frozen=True, slots=True)
class SignalForecast:
    """A feed's forecast for a signal, as issued: `version` grows with each new one (0: none
    yet), and an empty `points` is a forecast too (the feed stopped giving one)."""

    name: str
    points: tuple[Point, ...]
    source: str
    version: int
    issued_at: datetime | None


def is_high(value: float | None, threshold: float) -> bool:
    """High while the value is over the threshold, and until the first value arrives: work that
    waits for a low signal must not start on the strength of a value nobody has seen."""
    return value is None or value > threshold


def validate_value(value: float, unit: str, *, field: str = "value") -> float:
    """The value, if it can be stored for a signal in `unit`; InvalidArgument naming `field` if not."""
    if math.isnan(value):
        raise InvalidArgument(field, "is NaN; send a number")
    if math.isinf(value):
        raise InvalidArgument(field, "is infinite; send a finite number")
    if value < 0 and unit in _NON_NEGATIVE_UNITS:
        raise InvalidArgument(field, f"is {value:g}, but a value in {unit} cannot be negative")
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
