"""Feeds: small adapters that read a signal from a grid-data or power-price API or a trace, and
the loop that stores what they read. Every signal may have its own feed (`[signals.NAME] feed`);
the default signal's may also be named by `[signal] feed`. `feed_settings(config)` says which
signal has which, `make_feed` builds one."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from lowtide.config import Config, SignalConfig
from lowtide.errors import ConfigError
from lowtide.forecast_error import ErrorModel, model_named
from signal_service.feeds import electricitymaps, energy_charts, entsoe, uk_carbon_intensity, watttime
from signal_service.feeds.base import Feed, FeedError, HttpJson
from signal_service.feeds.electricitymaps import ElectricityMaps
from signal_service.feeds.energy_charts import EnergyCharts
from signal_service.feeds.entsoe import Entsoe
from signal_service.feeds.prices import UNIT as PRICE_UNIT
from signal_service.feeds.recorded import Recorded, load_recording
from signal_service.feeds.replay import Replay, load_trace, trace_unit
from signal_service.feeds.uk_carbon_intensity import UkCarbonIntensity
from signal_service.feeds.watttime import WattTime

FEEDS = (
    "static",
    "replay",
    "recorded",
    "uk-carbon-intensity",
    "electricitymaps",
    "watttime",
    "energy-charts",
    "entsoe",
)

__all__ = ["FEEDS", "Feed", "FeedError", "FeedSettings", "feed_settings", "feed_unit", "make_feed"]

# The `[signals.NAME]` keys that configure its feed, named as `[signal]`'s.
_FEED_KEYS = (
    "region",
    "base_url",
    "token",
    "username",
    "password",
    "emission_factor",
    "watttime_signal",
    "replay_file",
    "replay_start",
    "replay_speed",
    "replay_loop",
    "recording",
    "recorded_forecasts",
    "recorded_actuals",
)


@dataclass(frozen=True)
class FeedSettings:
    """One signal's feed: its options (`[signal]`'s keys) and the section they came from."""

    signal: str
    options: SignalConfig
    where: str

    @property
    def feed(self) -> str:
        return self.options.feed


def feed_settings(config: Config) -> dict[str, FeedSettings]:
    """Every configured signal's feed settings, the default signal's first. A `[signals.NAME]`
    with a feed takes its options from its own section, the rest (refresh, timeout, stale_after
    unless it sets them; the replay's forecast model) from `[signal]`; the default signal with
    no feed of its own takes `[signal]`'s. Naming a feed in both is refused."""
    default = config.cost.signal
    found: dict[str, FeedSettings] = {}
    own = config.signals.get(default)
    if own is not None and own.has_feed and config.signal.feed != "static":
        raise ConfigError(
            f"[signals.{default}] feed: the default signal's feed is also named by [signal] feed "
            f"({config.signal.feed!r}); name it in one place"
        )
    if own is None or not own.has_feed:
        found[default] = FeedSettings(default, config.signal, "[signal]")
    for name, definition in config.signals.items():
        if name == default and name in found:
            continue
        base = config.signal
        options = replace(
            base,
            feed=definition.feed or "static",
            unit=definition.unit,
            refresh=definition.refresh or base.refresh,
            timeout=definition.timeout or base.timeout,
            stale_after=definition.stale_after or base.stale_after,
            **{key: getattr(definition, key) for key in _FEED_KEYS},
        )
        found[name] = FeedSettings(name, options, f"[signals.{name}]")
    return found


def feed_unit(config: SignalConfig) -> str:
    """The unit of the values the configured feed gives."""
    if config.feed == "watttime":
        return watttime.UNITS[config.watttime_signal]
    if config.feed in ("energy-charts", "entsoe"):
        return PRICE_UNIT
    if config.feed == "replay":
        return trace_unit(config.replay_file)
    return "gCO2/kWh"


def make_feed(config: SignalConfig, *, where: str = "[signal]") -> Feed | None:
    """The configured feed; None for `static`, where only SetSignal changes the value. A key the
    feed refuses is named in `where`, the section it came from."""
    try:
        return _make_feed(config)
    except ConfigError as error:
        raise ConfigError(str(error).replace("[signal]", where)) from None


def _start(config: SignalConfig) -> datetime | None:
    if not config.replay_start:
        return None
    try:
        return datetime.fromisoformat(config.replay_start)
    except ValueError:
        raise ConfigError(f"[signal] replay_start: {config.replay_start!r} is not an ISO 8601 time") from None


def _make_feed(config: SignalConfig) -> Feed | None:
    timeout = config.timeout.total_seconds()
    if config.feed == "static":
        return None
    if config.feed == "recorded":
        recording = load_recording(
            config.recording, forecasts=config.recorded_forecasts, actuals=config.recorded_actuals
        )
        return Recorded(recording, speed=config.replay_speed, start=_start(config), loop=config.replay_loop)
    if config.feed == "replay":
        start = _start(config)
        return Replay(
            load_trace(config.replay_file),
            speed=config.replay_speed,
            start=start,
            loop=config.replay_loop,
            forecast_model=_forecast_model(config),
            unit=trace_unit(config.replay_file),
            states_error=config.replay_states_error,
        )
    if config.feed == "uk-carbon-intensity":
        http = HttpJson(config.base_url or uk_carbon_intensity.PUBLIC_URL, timeout=timeout)
        return UkCarbonIntensity(http, region=config.region)
    if config.feed == "electricitymaps":
        http = HttpJson(config.base_url or electricitymaps.PUBLIC_URL, timeout=timeout)
        return ElectricityMaps(http, zone=config.region, token=config.token, emission_factor=config.emission_factor)
    if config.feed == "watttime":
        http = HttpJson(config.base_url or watttime.PUBLIC_URL, timeout=timeout)
        return WattTime(
            http,
            username=config.username,
            password=config.password,
            region=config.region,
            signal=config.watttime_signal,
        )
    if config.feed == "energy-charts":
        http = HttpJson(config.base_url or energy_charts.PUBLIC_URL, timeout=timeout)
        return EnergyCharts(http, zone=config.region)
    if config.feed == "entsoe":
        http = HttpJson(config.base_url or entsoe.PUBLIC_URL, timeout=timeout)
        return Entsoe(http, zone=config.region, token=config.token)
    raise ConfigError(f"[signal] feed: {config.feed!r} is not one of {', '.join(FEEDS)}")


def _forecast_model(config: SignalConfig) -> ErrorModel:
    if config.replay_forecast_error_1h > config.replay_forecast_error_24h:
        raise ConfigError("[signal] replay_forecast_error_1h: must not be above replay_forecast_error_24h")
    return model_named(
        config.replay_forecast_model,
        relative=config.replay_forecast_error,
        at_1h=config.replay_forecast_error_1h,
        at_24h=config.replay_forecast_error_24h,
    )
