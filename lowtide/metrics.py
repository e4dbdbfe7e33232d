"""Metrics through the OpenTelemetry SDK, exported for Prometheus (and OTLP when configured).

Each service has its own MeterProvider and Prometheus registry (so several services in one
process, as in the tests, never mix their figures) and serves `/metrics` on its own port:
9464 for the scheduler, 9465 for the signal service. OpenTelemetry names (`lowtide.queue.depth`)
reach Prometheus as `lowtide_queue_depth`. Which readers a service has is lowtide.telemetry's
choice (OTEL_METRICS_EXPORTER).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.metrics import Meter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, generate_latest, start_http_server

from lowtide.histograms import Histograms, PrometheusReader
from lowtide.listen import refused


@dataclass
class Metrics:
    meter: Meter
    provider: MeterProvider
    registry: CollectorRegistry
    # The histograms recorded per task (lowtide.histograms), exported beside the meter's figures.
    histograms: Histograms
    server: Any = None
    # Where the figures go: a Prometheus reader (served as /metrics), a periodic OTLP one, or both.
    readers: Sequence[MetricReader] = ()

    @property
    def port(self) -> int | None:
        return None if self.server is None else int(self.server.server_port)

    def text(self) -> str:
        """What a Prometheus scrape would read now."""
        return generate_latest(self.registry).decode()

    def shutdown(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        self.provider.shutdown()


def start_metrics(
    service: str,
    listen: str,
    *,
    resource: Resource | None = None,
    prometheus: bool = True,
    readers: Sequence[MetricReader] = (),
    histograms: Histograms | None = None,
) -> Metrics:
    """Starts the service's meter with `readers` and, if `prometheus`, a Prometheus reader served
    as /metrics on `listen` (host:port) unless it is empty. `histograms`: the ones `readers`
    export already (lowtide.telemetry wraps an OTLP exporter with them), else new."""
    registry = CollectorRegistry()
    resource = resource or Resource.create({"service.name": service})
    histograms = histograms or Histograms(service, resource)
    every = list(readers)
    if prometheus:
        every.append(PrometheusReader(histograms, registry=registry, scope_info_enabled=False))
    provider = MeterProvider(metric_readers=every, resource=resource)
    metrics = Metrics(provider.get_meter(service), provider, registry, histograms, readers=tuple(every))
    if listen and prometheus:
        host, _, port = listen.rpartition(":")
        try:
            server, _thread = start_http_server(int(port), addr=host or "127.0.0.1", registry=registry)
        except (OSError, ValueError) as error:
            provider.shutdown()
            reason = str(error.strerror or error).lower() if isinstance(error, OSError) else "not a host:port"
            raise refused(f"[{service.removeprefix('lowtide-')}] metrics_listen", listen, reason) from None
        metrics.server = server
    return metrics
