"""An OTLP receiver for the tests: a real grpc server implementing the collector's
TraceService/Export and MetricsService/Export (opentelemetry-proto), standing where the
OpenTelemetry Collector would be. It keeps every span it is sent, with the service.name of the
resource it came from, and every histogram data point by metric name."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.trace.v1 import trace_pb2


@dataclass(frozen=True)
class Received:
    """One span as received: the service that sent it, and the span."""

    service: str
    span: trace_pb2.Span

    @property
    def name(self) -> str:
        return self.span.name

    @property
    def trace_id(self) -> str:
        return self.span.trace_id.hex()

    @property
    def span_id(self) -> str:
        return self.span.span_id.hex()

    @property
    def parent_id(self) -> str:
        return self.span.parent_span_id.hex()

    def attribute(self, key: str) -> Any:
        for kv in self.span.attributes:
            if kv.key == key:
                value = kv.value
                return getattr(value, value.WhichOneof("value") or "string_value")
        return None


def _service(resource_spans: trace_pb2.ResourceSpans) -> str:
    for kv in resource_spans.resource.attributes:
        if kv.key == "service.name":
            return str(kv.value.string_value)
    return ""


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, spans: list[Received]) -> None:
        self._spans = spans

    async def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        for resource_spans in request.resource_spans:
            service = _service(resource_spans)
            for scope_spans in resource_spans.scope_spans:
                self._spans.extend(Received(service, span) for span in scope_spans.spans)
        return trace_service_pb2.ExportTraceServiceResponse()


class _MetricsService(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, histograms: dict[str, list[metrics_pb2.HistogramDataPoint]]) -> None:
        self._histograms = histograms

    async def Export(
        self, request: metrics_service_pb2.ExportMetricsServiceRequest, context: Any
    ) -> metrics_service_pb2.ExportMetricsServiceResponse:
        for resource_metrics in request.resource_metrics:
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    if metric.WhichOneof("data") == "histogram":
                        self._histograms.setdefault(metric.name, []).extend(metric.histogram.data_points)
        return metrics_service_pb2.ExportMetricsServiceResponse()


def attributes(point: metrics_pb2.HistogramDataPoint) -> dict[str, str]:
    return {kv.key: kv.value.string_value for kv in point.attributes}


class OtlpReceiver:
    """`async with OtlpReceiver(port) as receiver`: serves OTLP/gRPC on 127.0.0.1:port (0: any free)."""

    def __init__(self, port: int = 0) -> None:
        self.spans: list[Received] = []
        self.histograms: dict[str, list[metrics_pb2.HistogramDataPoint]] = {}
        self._server = grpc.aio.server()
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(  # type: ignore[no-untyped-call]
            _TraceService(self.spans), self._server
        )
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(  # type: ignore[no-untyped-call]
            _MetricsService(self.histograms), self._server
        )
        self.port = self._server.add_insecure_port(f"127.0.0.1:{port}")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> OtlpReceiver:
        await self._server.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._server.stop(None)

    def named(self, name: str) -> list[Received]:
        return [s for s in self.spans if s.name == name]

    def in_trace(self, trace_id: str) -> Iterator[Received]:
        return (s for s in self.spans if s.trace_id == trace_id)
