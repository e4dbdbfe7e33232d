"""Histograms for figures recorded once per task on the hot path, exported with the SDK's own.

The OpenTelemetry SDK spends about 7 µs on each `Histogram.record` on this kind of machine (a
Measurement made, its attributes copied and hashed, the view matched, then bucketed). At a few
per task that was a fifth of the scheduler's CPU in a drain. A `Histogram` here is only the
bucketing: a bisect and a few additions per value, per label set. Its points are added to what
the SDK collects, as points of the same OpenTelemetry data model (cumulative, explicit buckets),
wherever that goes: the Prometheus reader of the service (`PrometheusReader`, so the names and
the text are the exporter's own) and an OTLP exporter (`WithHistograms`). Counters and gauges,
recorded per batch or observed, stay on the SDK's instruments.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import Any

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.metrics.export import Histogram as HistogramData
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

# A label set, as (name, value) pairs: made once per (queue, type) by the caller and reused, so
# recording hashes a small tuple and copies nothing.
Labels = tuple[tuple[str, str], ...]


class _Point:
    __slots__ = ("counts", "max", "min", "sum")

    def __init__(self, buckets: int) -> None:
        self.counts = [0] * buckets
        self.sum = 0.0
        self.min = float("inf")
        self.max = float("-inf")


class Histogram:
    """A cumulative histogram with explicit bucket bounds, as OpenTelemetry's: a value equal to a
    bound counts in the bucket that bound closes (Prometheus' `le`)."""

    def __init__(self, name: str, *, unit: str, description: str, bounds: Sequence[float]) -> None:
        self.name = name
        self.unit = unit
        self.description = description
        # As given: an int bound reads `le="1"`, as the SDK's own histogram writes it.
        self.bounds = tuple(bounds)
        self._points: dict[Labels, _Point] = {}
        # The Prometheus endpoint collects from its own thread.
        self._lock = threading.Lock()

    def record(self, value: float, labels: Labels) -> None:
        with self._lock:
            point = self._points.get(labels)
            if point is None:
                point = self._points[labels] = _Point(len(self.bounds) + 1)
            point.counts[bisect_left(self.bounds, value)] += 1
            point.sum += value
            point.min = min(point.min, value)
            point.max = max(point.max, value)

    def record_many(self, values: Sequence[float], labels: Labels) -> None:
        """`record` for each of `values` (a batch's tasks of one label set), under one lock."""
        if not values:
            return
        bounds = self.bounds
        with self._lock:
            point = self._points.get(labels)
            if point is None:
                point = self._points[labels] = _Point(len(bounds) + 1)
            counts = point.counts
            for value in values:
                counts[bisect_left(bounds, value)] += 1
            point.sum += sum(values)
            point.min = min(point.min, *values)
            point.max = max(point.max, *values)

    def points(self, start_ns: int, now_ns: int) -> list[HistogramDataPoint]:
        with self._lock:
            taken = [(labels, list(p.counts), p.sum, p.min, p.max) for labels, p in self._points.items()]
        return [
            HistogramDataPoint(
                attributes=dict(labels),
                start_time_unix_nano=start_ns,
                time_unix_nano=now_ns,
                count=sum(counts),
                sum=total,
                bucket_counts=counts,
                explicit_bounds=self.bounds,
                min=low,
                max=high,
                exemplars=[],
            )
            for labels, counts, total, low, high in taken
        ]


class Histograms:
    """A service's hot-path histograms, and what adds their points to the SDK's collections."""

    def __init__(self, scope: str, resource: Resource | None = None) -> None:
        self._scope = InstrumentationScope(scope)
        self.resource = resource or Resource.create({"service.name": scope})
        self._histograms: list[Histogram] = []
        self._start_ns = time.time_ns()

    def create(self, name: str, *, unit: str = "", description: str, bounds: Sequence[float]) -> Histogram:
        histogram = Histogram(name, unit=unit, description=description, bounds=bounds)
        self._histograms.append(histogram)
        return histogram

    def __iter__(self) -> Iterator[Histogram]:
        return iter(self._histograms)

    def added_to(self, data: MetricsData | None) -> MetricsData | None:
        """`data` (what the SDK collected) with these histograms' points in a scope of their own."""
        now = time.time_ns()
        metrics = [
            Metric(
                name=h.name,
                description=h.description,
                unit=h.unit,
                data=HistogramData(points, AggregationTemporality.CUMULATIVE),
            )
            for h in self._histograms
            if (points := h.points(self._start_ns, now))
        ]
        if not metrics:
            return data
        scope = ScopeMetrics(scope=self._scope, metrics=metrics, schema_url="")
        if data is None or not data.resource_metrics:
            return MetricsData(resource_metrics=[ResourceMetrics(self.resource, [scope], schema_url="")])
        first, *rest = data.resource_metrics
        merged = ResourceMetrics(first.resource, [*first.scope_metrics, scope], first.schema_url)
        return MetricsData(resource_metrics=[merged, *rest])


class PrometheusReader(PrometheusMetricReader):
    """The Prometheus reader, with the histograms' points in every collection it serves (the SDK
    hands one over once any of its own instruments has a figure: the services count from start)."""

    def __init__(self, histograms: Histograms, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._histograms = histograms

    def _receive_metrics(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> None:
        combined = self._histograms.added_to(metrics_data)
        super()._receive_metrics(combined, timeout_millis, **kwargs)  # type: ignore[arg-type]


class WithHistograms(MetricExporter):
    """An exporter (OTLP's) that sends the histograms' points with every export. They are
    cumulative whatever temporality the exporter prefers for the SDK's own instruments."""

    def __init__(self, exporter: MetricExporter, histograms: Histograms) -> None:
        super().__init__(
            preferred_temporality=exporter._preferred_temporality,
            preferred_aggregation=exporter._preferred_aggregation,
        )
        self.exporter = exporter
        self._histograms = histograms

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        combined = self._histograms.added_to(metrics_data) or metrics_data
        return self.exporter.export(combined, timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.exporter.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.exporter.shutdown(timeout_millis=timeout_millis, **kwargs)
