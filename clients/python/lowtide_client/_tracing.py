"""The worker's span of each attempt, in the task's trace (issue 17); and the trace context a
submit sends over the SubmitStream.

The scheduler sends the task's W3C trace context in Assignment.headers (`traceparent`,
`tracestate`). When opentelemetry-api is installed (`pip install lowtide-client[tracing]`) the
worker runs each traced attempt inside a `task.run` span continuing that context, on the global
tracer provider, which the application configures (the SDK and an exporter, or
`opentelemetry-instrument`); spans the activity makes are its children. Without opentelemetry-api,
or for a task that carries no trace context, nothing is done.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

try:
    from opentelemetry import trace as _trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # opentelemetry-api is optional: the worker runs untraced without it
    _trace = None  # type: ignore[assignment]

__all__ = ["attempt_span", "failed", "inject_context", "traced"]


def inject_context(carrier: MutableMapping[str, str]) -> None:
    """Puts the current span's W3C trace context (traceparent, tracestate) into `carrier` (a
    SubmitStream message's trace_context); nothing without opentelemetry-api or a current span."""
    if _trace is not None:
        TraceContextTextMapPropagator().inject(carrier)


def traced(headers: Mapping[str, str]) -> bool:
    """Whether an attempt with these headers gets a span (tracing installed, a trace context sent)."""
    return _trace is not None and "traceparent" in headers


@contextlib.contextmanager
def attempt_span(headers: Mapping[str, str], *, task_id: int, attempt: int, activity_type: str) -> Iterator[Any]:
    """The attempt's span (current while it runs), or None when there is none to make."""
    if _trace is None or "traceparent" not in headers:
        yield None
        return
    context = TraceContextTextMapPropagator().extract(dict(headers))
    tracer = _trace.get_tracer("lowtide_client")
    attributes: dict[str, str | int] = {
        "lowtide.task.id": task_id,
        "lowtide.task.attempt": attempt,
        "lowtide.activity_type": activity_type,
    }
    with tracer.start_as_current_span(
        "task.run", context=context, kind=_trace.SpanKind.CONSUMER, attributes=attributes
    ) as span:
        yield span


def failed(span: Any, error: BaseException) -> None:
    """Marks the attempt's span (if any) failed with `error`."""
    if span is not None and _trace is not None:
        try:
            span.record_exception(error)
            text = f"{type(error).__name__}: {error}"
        except Exception:  # an exception whose __str__ raises still fails its span
            text = type(error).__name__
        span.set_status(_trace.Status(_trace.StatusCode.ERROR, text[:200]))
        span.set_attribute("error.type", type(error).__name__)
