"""A service's telemetry in one place: traces and metrics through the OpenTelemetry SDK.

Configured the standard way, from the environment (the OpenTelemetry SDK's variables):

- `OTEL_TRACES_EXPORTER`: `none` (the default: no tracer provider, no span work at all) or `otlp`;
- `OTEL_METRICS_EXPORTER`: `prometheus` (the default: `/metrics` on the service's port), `otlp`,
  both as `prometheus,otlp`, or `none`;
- `OTEL_EXPORTER_OTLP_PROTOCOL` (or the `_TRACES_` / `_METRICS_` one): `grpc` (the default, as the
  Python SDK's own) or `http/protobuf`;
- the OTLP exporters read `OTEL_EXPORTER_OTLP_ENDPOINT`, `_HEADERS`, `_TIMEOUT` and the rest
  themselves, the periodic reader `OTEL_METRIC_EXPORT_INTERVAL`, the batch span processor
  `OTEL_BSP_*`, and the resource `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`;
  `service.name` defaults to the service's own name (`lowtide-scheduler`, `lowtide-signal`).

The providers become the process's global ones unless one is set already (several services in
one process, as in the tests, keep their own), so `opentelemetry-instrument` and libraries see them.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from lowtide.errors import ConfigError
from lowtide.histograms import Histograms, WithHistograms
from lowtide.metrics import Metrics, start_metrics

TRACES_EXPORTERS = frozenset({"otlp"})
METRICS_EXPORTERS = frozenset({"prometheus", "otlp"})
PROTOCOLS = ("grpc", "http/protobuf")


@dataclass
class Telemetry:
    """What a service reports through: its metrics, and its tracer (None while tracing is off,
    so the hot path checks once and does no span work)."""

    resource: Resource
    metrics: Metrics
    tracer_provider: TracerProvider | None = None
    # Where the spans go (batched): an OTLP exporter, or None.
    span_exporter: Any = None

    @property
    def tracer(self) -> trace.Tracer | None:
        if self.tracer_provider is None:
            return None
        return self.tracer_provider.get_tracer("lowtide")

    def shutdown(self) -> None:
        """Flushes and stops both: the spans and points still batched are exported first."""
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        self.metrics.shutdown()


def exporters(variable: str, known: frozenset[str], default: str, environ: Mapping[str, str]) -> list[str]:
    """The exporters an OTEL_*_EXPORTER variable names (comma-separated); `none` names none."""
    value = environ.get(variable, "").strip() or default
    names = [name.strip().lower() for name in value.split(",") if name.strip()]
    if names == ["none"]:
        return []
    unknown = [name for name in names if name not in known]
    if unknown:
        choices = ", ".join(sorted(known | {"none"}))
        raise ConfigError(f"{variable}={value!r}: unknown exporter {unknown[0]!r}; use {choices}, comma-separated")
    return list(dict.fromkeys(names))


def protocol(signal: str, environ: Mapping[str, str]) -> str:
    """The OTLP protocol of one signal: its own variable first, then the general one."""
    variable = f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL"
    if not environ.get(variable):
        variable = "OTEL_EXPORTER_OTLP_PROTOCOL"
    value = environ.get(variable, "").strip() or "grpc"
    if value not in PROTOCOLS:
        raise ConfigError(f"{variable}={value!r}: use {' or '.join(PROTOCOLS)}")
    return value


def resource(service: str) -> Resource:
    """The SDK's resource (OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME), named after the
    service unless the environment names it."""
    detected = Resource.create()
    if str(detected.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        return detected.merge(Resource({SERVICE_NAME: service}))
    return detected


def _span_exporter(environ: Mapping[str, str]) -> Any:
    if protocol("traces", environ) == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # type: ignore[assignment]
    return OTLPSpanExporter()


def _metric_reader(environ: Mapping[str, str], histograms: Histograms) -> MetricReader:
    if protocol("metrics", environ) == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter  # type: ignore[assignment]
    return PeriodicExportingMetricReader(WithHistograms(OTLPMetricExporter(), histograms))


def start_telemetry(service: str, metrics_listen: str, environ: Mapping[str, str] | None = None) -> Telemetry:
    """The service's providers, as the environment configures them (see the module's doc)."""
    environ = os.environ if environ is None else environ
    wanted = exporters("OTEL_METRICS_EXPORTER", METRICS_EXPORTERS, "prometheus", environ)
    described = resource(service)
    histograms = Histograms(service, described)
    readers = [_metric_reader(environ, histograms)] if "otlp" in wanted else []
    exported = start_metrics(
        service,
        metrics_listen,
        resource=described,
        prometheus="prometheus" in wanted,
        readers=readers,
        histograms=histograms,
    )
    telemetry = Telemetry(described, exported)
    try:
        traced = start_tracing(described, environ)
    except Exception:
        exported.shutdown()
        raise
    if traced is not None:
        telemetry.tracer_provider, telemetry.span_exporter = traced
    if not isinstance(metrics.get_meter_provider(), MeterProvider):
        metrics.set_meter_provider(exported.provider)
    return telemetry


def start_tracing(described: Resource, environ: Mapping[str, str] | None = None) -> tuple[TracerProvider, Any] | None:
    """A tracer provider exporting (batched) as OTEL_TRACES_EXPORTER says, made the global one
    unless one is set already, and its exporter; None while tracing is off (the default)."""
    environ = os.environ if environ is None else environ
    if "otlp" not in exporters("OTEL_TRACES_EXPORTER", TRACES_EXPORTERS, "none", environ):
        return None
    exporter = _span_exporter(environ)
    provider = TracerProvider(resource=described)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(provider)
    return provider, exporter


def server_interceptors(telemetry: Telemetry) -> list[Any]:
    """A span per RPC while tracing is on: the standard grpc.aio server interceptor, first, so a
    call auth refuses is traced too. OTEL_PYTHON_GRPC_EXCLUDED_SERVICES leaves services out
    (compose leaves out grpc.health.v1.Health, which its health checks call every few seconds)."""
    if telemetry.tracer_provider is None:
        return []
    from opentelemetry.instrumentation.grpc import filters

    excluded = [s.strip() for s in os.environ.get("OTEL_PYTHON_GRPC_EXCLUDED_SERVICES", "").split(",") if s.strip()]
    keep = filters.negate(filters.any_of(*(filters.service_name(s) for s in excluded))) if excluded else None
    return [_rpc_spans(telemetry.tracer_provider, keep)]


def _rpc_spans(provider: TracerProvider, keep: Any) -> Any:
    """The standard interceptor, taught one thing: a streaming handler that writes its responses
    with `context.write` and returns (WorkerService/Connect, health's Watch) is awaited, as grpc.aio
    does, rather than iterated (which fails every such call). Async-generator handlers are unchanged."""
    from opentelemetry.instrumentation.grpc import _aio_server
    from opentelemetry.instrumentation.grpc.version import __version__

    class Interceptor(_aio_server.OpenTelemetryAioServerInterceptor):
        def _intercept_aio_server_stream(self, behavior: Any, handler_call_details: Any) -> Any:
            if inspect.isasyncgenfunction(behavior):
                return super()._intercept_aio_server_stream(behavior, handler_call_details)  # type: ignore[no-untyped-call]
            return self._intercept_aio_server_unary(behavior, handler_call_details)  # type: ignore[no-untyped-call]

    # The tracer aio_server_interceptor() would make: the instrumentation's name and schema.
    tracer = provider.get_tracer(
        "opentelemetry.instrumentation.grpc", __version__, schema_url="https://opentelemetry.io/schemas/1.11.0"
    )
    return Interceptor(tracer, filter_=keep)  # type: ignore[no-untyped-call]
