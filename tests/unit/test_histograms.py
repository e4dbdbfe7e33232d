"""lowtide.histograms against the OpenTelemetry SDK's own histogram: the same values, bounds and
labels read the same on the Prometheus endpoint, and the points reach an OTLP exporter."""

from __future__ import annotations

import re

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    HistogramDataPoint,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from prometheus_client import CollectorRegistry, generate_latest

from lowtide.histograms import Histograms, WithHistograms
from lowtide.metrics import start_metrics

BOUNDS = (0.005, 0.01, 0.1, 1, 10)
# On a bound, between bounds, under the first and over the last.
VALUES = [0.0, 0.005, 0.0051, 0.01, 0.05, 0.1, 1, 3, 10, 11, 1e6]


def _series(text: str, name: str) -> list[str]:
    """The sample lines of one metric, the name left out, in order."""
    return [line.removeprefix(name) for line in text.splitlines() if line.startswith(name)]


def test_a_histogram_reads_on_prometheus_as_the_sdk_histogram_of_the_same_values() -> None:
    metrics = start_metrics("lowtide-test", "")
    try:
        ours = metrics.histograms.create("lowtide.test.ours", unit="s", description="ours", bounds=BOUNDS)
        # The SDK hands over a collection once one of its instruments has a figure (a service has many).
        metrics.meter.create_counter("lowtide.test.finished").add(1)
        for value in VALUES:
            ours.record(value, (("activity_type", "echo"), ("queue", "default")))
        ours.record(2, (("activity_type", "other"), ("queue", "default")))
        text = metrics.text()
    finally:
        metrics.shutdown()
    registry = CollectorRegistry()
    view = View(instrument_name="lowtide.test.sdk", aggregation=ExplicitBucketHistogramAggregation(BOUNDS))
    reader = PrometheusMetricReader(registry=registry, scope_info_enabled=False)
    provider = MeterProvider(metric_readers=[reader], views=[view])
    try:
        theirs = provider.get_meter("lowtide-test").create_histogram("lowtide.test.sdk", unit="s", description="ours")
        for value in VALUES:
            theirs.record(value, {"queue": "default", "activity_type": "echo"})
        theirs.record(2, {"queue": "default", "activity_type": "other"})
        expected = generate_latest(registry).decode()
    finally:
        provider.shutdown()
    mine = _series(text, "lowtide_test_ours_seconds")
    assert mine == _series(expected, "lowtide_test_sdk_seconds")
    # Cumulative buckets, `le` closing each: 0.005 holds 0 and 0.005; +Inf every value.
    assert '_bucket{activity_type="echo",le="0.005",queue="default"} 2.0' in mine
    assert '_bucket{activity_type="echo",le="+Inf",queue="default"} 11.0' in mine
    assert '_count{activity_type="other",queue="default"} 1.0' in mine
    assert re.search(r"^# HELP lowtide_test_ours_seconds ours$", text, re.M)


class _Kept(MetricExporter):
    """Keeps what it is given (the OTLP exporter's place in the pipeline, without the network)."""

    def __init__(self) -> None:
        super().__init__()
        self.exports: list[MetricsData] = []

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: object) -> MetricExportResult:
        self.exports.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
        pass


def _points(data: MetricsData, name: str) -> list[HistogramDataPoint]:
    return [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
        for point in metric.data.data_points
        if isinstance(point, HistogramDataPoint)
    ]


def test_a_batch_recorded_at_once_reads_as_its_values_recorded_one_by_one() -> None:
    labels = (("activity_type", "echo"), ("queue", "default"))
    texts = []
    for batched in (False, True):
        metrics = start_metrics("lowtide-test", "")
        try:
            histogram = metrics.histograms.create("lowtide.test.batch", unit="s", description="b", bounds=BOUNDS)
            metrics.meter.create_counter("lowtide.test.finished").add(1)
            if batched:
                histogram.record_many(VALUES[:4], labels)
                histogram.record_many([], labels)
                histogram.record_many(VALUES[4:], labels)
            else:
                for value in VALUES:
                    histogram.record(value, labels)
            texts.append(_series(metrics.text(), "lowtide_test_batch_seconds"))
        finally:
            metrics.shutdown()
    assert texts[0] == texts[1]
    assert '_count{activity_type="echo",queue="default"} 11.0' in texts[1]


def test_the_points_go_out_with_every_export_beside_the_sdk_figures() -> None:
    kept = _Kept()
    histograms = Histograms("lowtide-test")
    reader = PeriodicExportingMetricReader(WithHistograms(kept, histograms), export_interval_millis=3_600_000)
    metrics = start_metrics("lowtide-test", "", prometheus=False, readers=[reader], histograms=histograms)
    try:
        run = metrics.histograms.create("lowtide.test.run", unit="s", description="run", bounds=BOUNDS)
        metrics.meter.create_counter("lowtide.test.finished").add(3)
        for value in (0.002, 0.5, 0.5):
            run.record(value, (("queue", "default"),))
        reader.force_flush()
        run.record(20, (("queue", "default"),))
        reader.force_flush()
    finally:
        metrics.shutdown()
    first, second = kept.exports[0], kept.exports[1]
    [point] = _points(first, "lowtide.test.run")
    assert (point.count, point.sum, point.min, point.max) == (3, 1.002, 0.002, 0.5)
    assert list(point.bucket_counts) == [1, 0, 0, 2, 0, 0]
    assert list(point.explicit_bounds) == list(BOUNDS)
    assert dict(point.attributes or {}) == {"queue": "default"}
    # Cumulative: the second export counts all four.
    [later] = _points(second, "lowtide.test.run")
    assert (later.count, list(later.bucket_counts)) == (4, [1, 0, 0, 2, 0, 1])
    assert later.start_time_unix_nano == point.start_time_unix_nano < later.time_unix_nano
    names = {m.name for r in first.resource_metrics for s in r.scope_metrics for m in s.metrics}
    assert "lowtide.test.finished" in names
