"""The signal service's metrics: each signal's value, high and stale flags, each feed's fetches
and errors (labelled by feed and signal), and the number of subscribers. All are read at scrape time from memory."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from opentelemetry.metrics import CallbackOptions, Observation

from lowtide.metrics import Metrics
from signal_service.fanout import Fanout
from signal_service.feeds.runner import FeedStats


# The 0/1 gauges have unit {state}, not "1": an OTLP -> Prometheus path appends `_ratio` to a
# gauge of unit "1" (lowtide_signal_high_ratio), the Prometheus reader does not.
def register_signal_metrics(metrics: Metrics, fanout: Fanout, feeds: Mapping[str, tuple[str, FeedStats]]) -> None:
    """`feeds`: each polled signal's feed (its source name) and counts."""
    meter = metrics.meter

    def states() -> Iterable[tuple[dict[str, str], float | None, bool, bool]]:
        for state in fanout.all():
            yield {"signal": state.name, "unit": state.unit}, state.value, state.high, state.stale

    def value(options: CallbackOptions) -> Iterable[Observation]:
        for labels, current, _, _ in states():
            if current is not None:
                yield Observation(current, labels)

    def threshold(options: CallbackOptions) -> Iterable[Observation]:
        for state in fanout.all():
            yield Observation(state.threshold, {"signal": state.name, "unit": state.unit})

    def high(options: CallbackOptions) -> Iterable[Observation]:
        for labels, _, is_high, _ in states():
            yield Observation(1 if is_high else 0, labels)

    def stale(options: CallbackOptions) -> Iterable[Observation]:
        for labels, _, _, is_stale in states():
            yield Observation(1 if is_stale else 0, labels)

    def subscribers(options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(fanout.subscriber_count)

    def fetches(options: CallbackOptions) -> Iterable[Observation]:
        for signal, (feed, stats) in feeds.items():
            yield Observation(stats.fetches, {"feed": feed, "signal": signal})

    def errors(options: CallbackOptions) -> Iterable[Observation]:
        for signal, (feed, stats) in feeds.items():
            yield Observation(stats.errors, {"feed": feed, "signal": signal, "kind": "value"})
            yield Observation(stats.forecast_errors, {"feed": feed, "signal": signal, "kind": "forecast"})

    meter.create_observable_gauge("lowtide.signal.value", callbacks=[value], description="The signal's value")
    meter.create_observable_gauge("lowtide.signal.threshold", callbacks=[threshold], description="Above it: high")
    for name, callback, what in [("high", high, "1 while high"), ("stale", stale, "1 while stale")]:
        meter.create_observable_gauge(f"lowtide.signal.{name}", callbacks=[callback], unit="{state}", description=what)
    meter.create_observable_gauge(
        "lowtide.signal.subscribers", callbacks=[subscribers], unit="{subscriber}", description="Open Subscribe streams"
    )
    meter.create_observable_counter(
        "lowtide.signal.feed.fetches", callbacks=[fetches], unit="{fetch}", description="Feed polls"
    )
    meter.create_observable_counter(
        "lowtide.signal.feed.errors", callbacks=[errors], unit="{error}", description="Bad or failed feed answers"
    )
