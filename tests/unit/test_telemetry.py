"""How a service's telemetry follows the standard OTEL_* variables: nothing exported unless
configured, Prometheus the default for metrics, OTLP over grpc or http/protobuf, the service's
own name unless the environment names one, and a clear error for a value lowtide cannot use."""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetrics
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpans
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

from lowtide.errors import ConfigError
from lowtide.histograms import PrometheusReader, WithHistograms
from lowtide.telemetry import Telemetry, start_telemetry


def _start(monkeypatch: pytest.MonkeyPatch, **environ: str) -> Telemetry:
    for name in ("OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    return start_telemetry("lowtide-scheduler", "")


def _readers(telemetry: Telemetry) -> list[type]:
    return sorted((type(r) for r in telemetry.metrics.readers), key=lambda t: t.__name__)


def test_by_default_no_tracer_and_prometheus_metrics_only(monkeypatch: pytest.MonkeyPatch) -> None:
    telemetry = _start(monkeypatch)
    try:
        assert telemetry.tracer is None
        assert _readers(telemetry) == [PrometheusReader]
        assert telemetry.resource.attributes["service.name"] == "lowtide-scheduler"
    finally:
        telemetry.shutdown()


def test_otlp_traces_and_both_metric_exporters(monkeypatch: pytest.MonkeyPatch) -> None:
    telemetry = _start(
        monkeypatch,
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_METRICS_EXPORTER="prometheus,otlp",
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:1",
        OTEL_SERVICE_NAME="scheduler-eu",
        OTEL_RESOURCE_ATTRIBUTES="deployment.environment=staging",
    )
    try:
        assert telemetry.tracer is not None
        assert isinstance(telemetry.span_exporter, GrpcSpans)
        assert _readers(telemetry) == [PeriodicExportingMetricReader, PrometheusReader]
        [otlp] = [r for r in telemetry.metrics.readers if isinstance(r, PeriodicExportingMetricReader)]
        assert isinstance(otlp._exporter, WithHistograms)
        assert isinstance(otlp._exporter.exporter, GrpcMetrics)
        assert telemetry.resource.attributes["service.name"] == "scheduler-eu"
        assert telemetry.resource.attributes["deployment.environment"] == "staging"
    finally:
        telemetry.shutdown()


def test_http_protobuf_and_metrics_over_otlp_only(monkeypatch: pytest.MonkeyPatch) -> None:
    telemetry = _start(
        monkeypatch,
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_METRICS_EXPORTER="otlp",
        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:1",
    )
    try:
        exporter = telemetry.span_exporter
        assert isinstance(exporter, HttpSpans)
        assert exporter._endpoint == "http://127.0.0.1:1/v1/traces"
        assert _readers(telemetry) == [PeriodicExportingMetricReader]
        assert telemetry.metrics.port is None
    finally:
        telemetry.shutdown()


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("OTEL_TRACES_EXPORTER", "zipkin", "OTEL_TRACES_EXPORTER='zipkin': unknown exporter 'zipkin'; use none, otlp"),
        ("OTEL_METRICS_EXPORTER", "prometheus,statsd", "unknown exporter 'statsd'; use none, otlp, prometheus"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json", "OTEL_EXPORTER_OTLP_PROTOCOL='http/json': use grpc or http/pro"),
    ],
)
def test_a_value_lowtide_cannot_use_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        _start(monkeypatch, **{"OTEL_TRACES_EXPORTER": "otlp", variable: value})
    assert message in str(refused.value)
