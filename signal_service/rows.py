"""Typed rows of the signal service's queries (sql/queries.sql): frozen dataclasses whose fields
are the queries' columns, filled by psycopg's `class_row` through `Database.fetch_as`, and turned
into domain values by the store."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from signal_service.domain import Point, SignalForecast, SignalState


@dataclass(frozen=True, slots=True)
class SignalRow:
    """A signal's latest state (`get_signal`, `record_value`)."""

    name: str
    unit: str
    threshold: float
    # None until the first value arrives.
    value: float | None
    observed_at: datetime | None
    source: str
    version: int
    stale: bool
    # When this service last stored a value: staleness counts from here.
    updated_at: datetime

    def state(self) -> SignalState:
        return SignalState(
            name=self.name,
            unit=self.unit,
            threshold=self.threshold,
            value=self.value,
            observed_at=self.observed_at,
            source=self.source,
            version=self.version,
            stale=self.stale,
        )


@dataclass(frozen=True, slots=True)
class ListedSignal(SignalRow):
    """A signal's latest state with the version of its forecast, 0 before any (`list_signals`)."""

    forecast_version: int


@dataclass(frozen=True, slots=True)
class ForecastRow:
    """A signal's forecast as two arrays of the same length (`get_forecast`, `set_forecast`)."""

    name: str
    forecast_at: list[datetime]
    forecast_value: list[float]
    forecast_expected_error: list[float | None]
    forecast_source: str
    forecast_version: int
    forecast_issued_at: datetime | None

    def forecast(self) -> SignalForecast:
        errors = self.forecast_expected_error or [None] * len(self.forecast_at)
        points = tuple(
            Point(at, value, error)
            for at, value, error in zip(self.forecast_at, self.forecast_value, errors, strict=True)
        )
        return SignalForecast(
            name=self.name,
            points=points,
            source=self.forecast_source,
            version=self.forecast_version,
            issued_at=self.forecast_issued_at,
        )


@dataclass(frozen=True, slots=True)
class FreshSignal:
    """A signal with a value and no stale mark, with the database's clock (`fresh_signals`)."""

    name: str
    version: int
    updated_at: datetime
    now: datetime


@dataclass(frozen=True, slots=True)
class HistoryValue:
    """One value of a signal's history (`history`)."""

    value: float
    observed_at: datetime
