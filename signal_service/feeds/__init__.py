"""Feeds: small adapters that read the signal from a grid-data API or a trace, and the loop
that stores what they read. `make_feed(config)` picks the one `[signal] feed` names."""

from __future__ import annotations

from datetime import datetime

from lowtide.config import SignalConfig
from lowtide.errors import ConfigError
from lowtide.forecast_error import ErrorModel, model_named
from signal_service.feeds import electricitymaps, uk_carbon_intensity, watttime
from signal_service.feeds.base import Feed, FeedError, HttpJson
from signal_service.feeds.electricitymaps import ElectricityMaps
from signal_service.feeds.replay import Replay, load_trace
from signal_service.feeds.uk_carbon_intensity import UkCarbonIntensity
from signal_service.feeds.watttime import WattTime

FEEDS = ("static", "replay", "uk-carbon-intensity", "electricitymaps", "watttime")

__all__ = ["FEEDS", "Feed", "FeedError", "feed_unit", "make_feed"]


def feed_unit(config: SignalConfig) -> str:
    """The unit of the values the configured feed gives (the default signal's unit)."""
    return watttime.UNITS[config.watttime_signal] if config.feed == "watttime" else "gCO2/kWh"


def make_feed(config: SignalConfig) -> Feed | None:
    """The configured feed; None for `static`, where only SetSignal changes the value."""
    timeout = config.timeout.total_seconds()
    if config.feed == "static":
        return None
    if config.feed == "replay":
        start = None
        if config.replay_start:
            try:
                start = datetime.fromisoformat(config.replay_start)
            except ValueError:
                raise ConfigError(f"[signal] replay_start: {config.replay_start!r} is not an ISO 8601 time") from None
        return Replay(
            load_trace(config.replay_file),
            speed=config.replay_speed,
            start=start,
            loop=config.replay_loop,
            forecast_model=_forecast_model(config),
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
