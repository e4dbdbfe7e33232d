"""The signal sections of lowtide's configuration: `[signal]` (the signal service and the feed of
the default signal) and `[signals.NAME]` (a named signal and its feed), declared as in
`lowtide.config.schema`, which re-exports them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from lowtide.config.rules import (
    DAY,
    LONGEST,
    MIN,
    MS,
    H,
    S,
    finite,
    key,
    listen_address,
    listen_address_or_off,
    one_of,
    within,
)

# The feeds signal_service.feeds.make_feed knows.
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
# Electricity Maps' emissionFactorType values; the first is the API's default and ours.
EMISSION_FACTORS = ("lifecycle", "direct")
# WattTime's signals: its index (a percentile, no forecast) or its marginal emissions (MOER, in
# lbs/MWh, with the forecast; subscribers only). The first is the default.
WATTTIME_SIGNALS = ("index", "moer")


@dataclass(frozen=True)
class SignalConfig:
    """The signal service, and the feed that drives the default signal (`[cost] signal`)."""

    listen: str = key("127.0.0.1:50052", listen_address)
    # Prometheus /metrics (empty: not served).
    metrics_listen: str = key("127.0.0.1:9465", listen_address_or_off)
    # static (SetSignal only), replay, recorded, uk-carbon-intensity, electricitymaps, watttime,
    # energy-charts or entsoe (docs/how-to/feeds.md).
    feed: str = key("static", one_of(*FEEDS))
    # The default signal's unit; empty means the feed's own (gCO2/kWh; for watttime percentile,
    # or lbs/MWh with watttime_signal = "moer").
    unit: str = ""
    # With no update for this long the signal is marked stale and subscribers are told.
    stale_after: timedelta = key(1 * H, within(1 * S, LONGEST))
    # How often a feed is polled; the grid APIs publish every 5 to 30 minutes.
    refresh: timedelta = key(5 * MIN, within(100 * MS, 1 * DAY))
    # How often each signal's forecast calibration learns again from its record (the forecasts
    # the feed issued and the values that came; docs/explanation/forecast-error.md).
    calibrate_every: timedelta = key(10 * MIN, within(100 * MS, 1 * DAY))
    # The error a bare forecast's points are stated with (and planned on) until the calibration
    # has learned the feed's own: a relative error (one standard deviation) growing from
    # forecast_error_prior_1h one hour ahead to forecast_error_prior_24h a day ahead (in
    # proportion under an hour, at the same rate beyond). Per lead, the calibration blends from
    # it toward the record's figures as forecasts come: half each after 8 issued forecasts.
    forecast_error_prior_1h: float = key(0.03, within(0.0, 1.0))
    forecast_error_prior_24h: float = key(0.15, within(0.0, 1.0))
    # At start, a feed that publishes its past forecasts beside the values that came (the UK
    # Carbon Intensity API, national) stores this many days of them for the calibration (a
    # request a day, skipped for days already stored), within calibration_seed_timeout; 0: none.
    # They teach it the error at the shortest leads only (docs/explanation/forecast-error.md).
    calibration_seed_days: int = key(14, within(0, 14))
    calibration_seed_timeout: timedelta = key(1 * MIN, within(1 * S, 1 * H))
    # Replay: trace seconds played per wall-clock second (1440 = one day per minute), from
    # replay_start (ISO 8601; empty = the trace's first row), of replay_file (empty = bundled GB 2020).
    replay_speed: float = key(1440.0, within(0.0, 1e9, above=True))
    replay_start: str = ""
    replay_file: str = ""
    # At the trace's end: start again (true), or hold its last value (false).
    replay_loop: bool = True
    # The replay's forecast error model: horizon (an error growing from replay_forecast_error_1h
    # one hour ahead to replay_forecast_error_24h a day ahead, correlated in time, with ramps
    # shifted in time, as real day-ahead forecasts are) or iid (the trace ahead times
    # (1 + replay_forecast_error x N(0, 1)), independently per row; 0 hands planners the future).
    replay_forecast_model: str = key("horizon", one_of("horizon", "iid"))
    # Whether the replay's forecast points state the model's error (false: bare values, as the
    # real feeds give; the calibration learns it).
    replay_states_error: bool = True
    replay_forecast_error: float = key(0.05, within(0.0, 1.0))
    replay_forecast_error_1h: float = key(0.03, within(0.0, 1.0))
    replay_forecast_error_24h: float = key(0.15, within(0.0, 1.0))
    # Recorded (played at replay_speed from replay_start, looping as replay_loop says): the
    # forecasts a real feed issued and the values that came. A bundled recording (uk-2023-03: the
    # UK Carbon Intensity API, national, 14-21 March 2023), or your own two CSV files,
    # recorded_forecasts (`issued_at,target,forecast`) and recorded_actuals (`target,actual`).
    recording: str = key("uk-2023-03", one_of("uk-2023-03"))
    # Recorded: your own forecasts, CSV `issued_at,target,forecast` (empty: the bundled recording).
    recorded_forecasts: str = ""
    # Recorded: your own values that came, CSV `target,actual` (given with recorded_forecasts).
    recorded_actuals: str = ""
    # Empty base_url means the feed's public API.
    base_url: str = ""
    token: str = ""
    username: str = ""
    password: str = ""
    # UK Carbon Intensity region id, Electricity Maps zone, WattTime region, or the bidding zone
    # of a price feed (DE-LU; for entsoe also its EIC code, 10Y1001A1001A82H).
    region: str = ""
    # Electricity Maps' emission factor (its emissionFactorType): lifecycle (construction and
    # fuel supply included, the API's default) or direct (combustion only).
    emission_factor: str = key(EMISSION_FACTORS[0], one_of(*EMISSION_FACTORS))
    # WattTime's signal: index (/v3/signal-index, a percentile; WattTime has no forecast of it,
    # so none) or moer (/v3/forecast: the current value and the forecast, both in lbs/MWh; a
    # plan with forecasts). Never converted into one another.
    watttime_signal: str = key(WATTTIME_SIGNALS[0], one_of(*WATTTIME_SIGNALS))
    timeout: timedelta = key(10 * S, within(100 * MS, 10 * MIN))


@dataclass(frozen=True)
class SignalDefinition:
    """A named signal, from `[signals.NAME]`: its threshold, and the feed that drives it with
    that feed's options (the keys of `[signal]` of the same names). With no feed it is set
    through SetSignal only; the default signal (`[cost] signal`) with no feed here takes
    `[signal]`'s."""

    # Empty: the feed's own unit (gCO2/kWh when set by hand only).
    unit: str = ""
    threshold: float = key(400.0, finite)
    # The plausible range of its values (unset: the unit's, signal_service.domain.PLAUSIBLE): a
    # value outside is refused, from SetSignal and from a feed alike (the signal keeps its last).
    min: float | None = key(None, finite)
    max: float | None = key(None, finite)
    # Empty: static here, or for the default signal the feed `[signal]` names.
    feed: str = key("", one_of("", *FEEDS))
    region: str = ""
    base_url: str = ""
    token: str = key("", secret=True)
    username: str = ""
    password: str = key("", secret=True)
    emission_factor: str = key(EMISSION_FACTORS[0], one_of(*EMISSION_FACTORS))
    watttime_signal: str = key(WATTTIME_SIGNALS[0], one_of(*WATTTIME_SIGNALS))
    replay_file: str = ""
    replay_start: str = ""
    replay_speed: float = key(1440.0, within(0.0, 1e9, above=True))
    replay_loop: bool = True
    # The recorded feed's bundled recording, or its own two files (as `[signal]`'s).
    recording: str = key("uk-2023-03", one_of("uk-2023-03"))
    recorded_forecasts: str = ""
    recorded_actuals: str = ""
    # Unset: `[signal]`'s. A day-ahead price changes once an hour (or every 15 minutes): a
    # stale_after shorter than that marks it stale between two prices.
    refresh: timedelta | None = key(None, within(100 * MS, 1 * DAY))
    timeout: timedelta | None = key(None, within(100 * MS, 10 * MIN))
    stale_after: timedelta | None = key(None, within(1 * S, LONGEST))
    # Unset: `[signal]`'s. The prior of this signal's forecast calibration.
    forecast_error_prior_1h: float | None = key(None, within(0.0, 1.0))
    forecast_error_prior_24h: float | None = key(None, within(0.0, 1.0))

    @property
    def has_feed(self) -> bool:
        return self.feed not in ("", "static")

    def forecast_error_prior(self, base: SignalConfig) -> tuple[float, float]:
        """(error at 1 h, error at 24 h) of this signal's prior: its own, else `[signal]`'s."""
        at_1h, at_24h = self.forecast_error_prior_1h, self.forecast_error_prior_24h
        return (
            base.forecast_error_prior_1h if at_1h is None else at_1h,
            base.forecast_error_prior_24h if at_24h is None else at_24h,
        )
