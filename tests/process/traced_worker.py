"""A traced worker process: `python -m tests.process.traced_worker --target T`.

It sets up tracing as an application would, with the OpenTelemetry SDK and the OTLP exporter
configured by the standard OTEL_* variables, and runs lowtide_client's Worker, which continues
each task's trace from its assignment. Activities: `echo` returns its payload; `boom` raises
ValueError. SIGTERM stops it gracefully; its spans are flushed before it exits.
"""

from __future__ import annotations

import argparse
import asyncio

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from lowtide_client import Worker


async def run(target: str) -> None:
    worker = Worker(target=target, slots=4)

    @worker.activity("echo")
    async def echo(payload: bytes) -> bytes:
        return payload

    @worker.activity("train")
    async def train(payload: bytes) -> bytes:
        return payload

    @worker.activity("boom")
    async def boom(payload: bytes) -> bytes:
        raise ValueError(f"cannot take {payload!r}")

    await worker.run(install_signal_handlers=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="traced_worker")
    parser.add_argument("--target", required=True)
    args = parser.parse_args()
    provider = TracerProvider(resource=Resource.create())
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    try:
        asyncio.run(run(args.target))
    finally:
        provider.shutdown()


if __name__ == "__main__":
    main()
