"""The one path every change takes, whoever makes it (SetSignal, a feed, another replica's
NOTIFY, the stale check): validated, stored, then published to this replica's subscribers.
Forecasts take the same path: stored when new, announced, published beside the state."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from lowtide.config import Config
from lowtide.errors import ConfigError, NotFound
from signal_service.calibration import Calibrations
from signal_service.domain import (
    Point,
    Reading,
    SignalForecast,
    SignalState,
    ValueRange,
    check_source,
    check_unit,
    validate_value,
)
from signal_service.fanout import Fanout
from signal_service.store import SignalStore

log = logging.getLogger("lowtide.signal")


@dataclass(frozen=True, slots=True)
class Definition:
    name: str
    unit: str
    threshold: float
    accepted: ValueRange | None = None

    @property
    def values(self) -> ValueRange:
        """The values it accepts: as configured, else its unit's plausible range."""
        return self.accepted or ValueRange.of(self.unit)


def definitions(config: Config, *, units: Mapping[str, str]) -> dict[str, Definition]:
    """The configured signals, each in its unit (`units`: the configured one, else its feed's)
    and with its range (`[signals.NAME] min` and `max`, else the unit's): the default one (`[cost]
    signal`, with `[cost] defer_threshold`) and every `[signals.NAME]`."""
    default = config.cost.signal

    def accepted(name: str) -> ValueRange:
        table = config.signals.get(name)
        found = ValueRange.of(units[name], table.min if table else None, table.max if table else None)
        if found.low >= found.high:
            raise ConfigError(f"[signals.{name}] min and max: the range {found} {units[name]} is empty")
        return found

    found = {name: Definition(name, units[name], d.threshold, accepted(name)) for name, d in config.signals.items()}
    found[default] = Definition(default, units[default], config.cost.defer_threshold, accepted(default))
    return found


class Signals:
    def __init__(
        self,
        store: SignalStore,
        fanout: Fanout,
        defined: Mapping[str, Definition],
        *,
        default: str,
        calibrations: Calibrations | None = None,
    ) -> None:
        self.store = store
        self.fanout = fanout
        self.defined = dict(defined)
        self.default = default
        self.calibrations = calibrations

    def _calibrated(self, forecast: SignalForecast) -> SignalForecast:
        """The forecast with each point's expected error (the feed's, else the calibration's)."""
        return forecast if self.calibrations is None else self.calibrations.apply(forecast)

    def resolve(self, name: str) -> Definition:
        """The signal's definition; an empty name means the default signal."""
        definition = self.defined.get(name or self.default)
        if definition is None:
            known = ", ".join(sorted(self.defined))
            raise NotFound(f"no signal named {name!r}; configured signals: {known}")
        return definition

    async def start(self) -> None:
        """Creates or updates the configured signals, then loads every state (a restart resumes
        the last stored value, marked stale by the stale check if it is old)."""
        for definition in self.defined.values():
            if definition.unit == "percentile" and not 0 <= definition.threshold <= 100:
                # e.g. the watttime feed with the gCO2/kWh default of 400: never high.
                log.warning(
                    "signal.threshold_out_of_range",
                    extra={"signal": definition.name, "threshold": definition.threshold, "unit": definition.unit},
                )
            await self.store.ensure(definition.name, unit=definition.unit, threshold=definition.threshold)
        await self.resync()

    async def resync(self) -> None:
        """Publishes whatever the database holds that this replica has not seen: the safety net
        for a NOTIFY lost while the listening connection was down. A forecast (a hundred points)
        is read only when its version shows it is new here."""
        for state, forecast_version in await self.store.snapshot():
            if state.name in self.defined:
                self.fanout.publish(state)
                if forecast_version > self.fanout.forecast_version(state.name):
                    await self.reload_forecast(state.name)

    async def reload_forecast(self, name: str) -> SignalForecast | None:
        """The stored forecast, published here if it is newer than what this replica holds."""
        forecast = await self.store.forecast(name)
        if forecast is None:
            return None
        forecast = self._calibrated(forecast)
        if forecast.version:
            self.fanout.publish_forecast(forecast)
        return forecast

    async def set_forecast(self, name: str, points: Sequence[Point], *, source: str) -> SignalForecast | None:
        """Stores a feed's forecast and publishes it, when it differs from the stored one; the
        new forecast, or None when it was the same. Points are validated as values are."""
        definition = self.resolve(name)
        for point in points:
            validate_value(
                point.value, definition.unit, field="forecast", accepted=definition.values, signal=definition.name
            )
        ordered = sorted(points, key=lambda p: p.at)
        forecast = await self.store.set_forecast(definition.name, ordered, source=source)
        if forecast is None:
            return None
        if self.calibrations is not None:
            # The record the calibration learns from: the forecast as the feed issued it.
            await self.calibrations.record_forecast(forecast)
        forecast = self._calibrated(forecast)
        self.fanout.publish_forecast(forecast)
        return forecast

    async def confirm(self, name: str, version: int) -> None:
        """A feed answered again with the value of `version`: it still holds (fresh, announced
        as a new version so that subscribers know it has not merely gone quiet)."""
        state = await self.store.touch(name, version)
        if state is not None:
            self.fanout.publish(state)

    async def reload(self, name: str) -> SignalState:
        """The stored state, published here if it is newer than what this replica holds."""
        definition = self.resolve(name)
        state = await self.store.get(definition.name)
        if state is None:
            raise NotFound(f"signal {definition.name!r} is not stored yet; is the service starting?")
        self.fanout.publish(state)
        return state

    async def set(
        self,
        name: str,
        value: float,
        *,
        unit: str = "",
        observed_at: datetime | None = None,
        source: str = "manual",
    ) -> SignalState:
        """Validates and stores a value; a refused value (InvalidArgument) changes nothing."""
        definition = self.resolve(name)
        check_unit(unit, definition.unit)
        check_source(source)
        validate_value(value, definition.unit, accepted=definition.values, signal=definition.name)
        reading = Reading(value, observed_at or datetime.now(UTC), definition.unit)
        state = await self.store.record(definition.name, reading, source=source)
        if state is None:
            raise NotFound(f"signal {definition.name!r} is not stored yet; is the service starting?")
        if self.calibrations is not None:
            await self.calibrations.record_actual(definition.name, reading.observed_at, value)
        self.fanout.publish(state)
        log.debug(
            "signal.set",
            extra={"signal": state.name, "value": state.value, "source": source, "version": state.version},
        )
        return state
