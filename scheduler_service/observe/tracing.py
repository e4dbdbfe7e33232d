"""One trace per task: its W3C trace context travels in the task's headers.

Why it works this way: docs/architecture/observe.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from scheduler_service.domain.model import NewTask, Outcome
from scheduler_service.domain.timings import Timings
from scheduler_service.rows.claims import ClaimedRow
from scheduler_service.wire.inbound import MAX_HEADERS, MAX_HEADERS_BYTES

# Only the W3C trace context (traceparent, tracestate): bounded, whatever OTEL_PROPAGATORS says.
W3C = TraceContextTextMapPropagator()


def with_trace_context(tasks: Sequence[NewTask]) -> Sequence[NewTask]:
    """The tasks, each whose submitter set no traceparent carrying the current span's context;
    a task whose headers leave no room for it within their bounds (wire.inbound.headers) goes without."""
    carrier: dict[str, str] = {}
    W3C.inject(carrier)
    if "traceparent" not in carrier:
        return tasks
    return [t if "traceparent" in t.headers else _traced(t, carrier) for t in tasks]


def _traced(task: NewTask, carrier: Mapping[str, str]) -> NewTask:
    headers = {**task.headers, **carrier}
    size = sum(len(k.encode()) + len(v.encode()) for k, v in headers.items())
    if len(headers) > MAX_HEADERS or size > MAX_HEADERS_BYTES:
        return task
    return dataclasses.replace(task, headers=headers)


def task_context(headers: Mapping[str, str] | None) -> Context | None:
    """The trace context a task's headers carry, or None."""
    if not headers or "traceparent" not in headers:
        return None
    context = W3C.extract(headers)
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def _ns(at: datetime) -> int:
    return int(at.timestamp() * 1e9)


SUBMIT_STREAM = "/lowtide.v1.SchedulerService/SubmitStream"


class TaskTraces:
    """The spans of tasks' paths through the scheduler, on the service's tracer."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer

    @contextlib.contextmanager
    def stream_submit(self, trace_context: Mapping[str, str], ref: int) -> Iterator[None]:
        """The span of one submit of a SubmitStream, as the gRPC instrumentation makes one of each
        SubmitTask call: the child of the trace context the submit carries, else a trace of its
        own (not the stream's: one stream carries a process's submits for as long as it lives).
        Current while the submit is stored, so its task carries it (with_trace_context)."""
        parent = task_context(trace_context) or Context()
        attributes = {"rpc.system": "grpc", "rpc.service": "lowtide.v1.SchedulerService", "rpc.method": "SubmitStream"}
        with self._tracer.start_as_current_span(
            SUBMIT_STREAM,
            context=parent,
            kind=SpanKind.SERVER,
            attributes={**attributes, "lowtide.submit.ref": str(ref)},
        ):
            yield

    def held(self, context: Context, row: ClaimedRow, reason: str, began: datetime, released: datetime) -> None:
        """The task waited from `began` to `released` on a cost hold or a planned release."""
        seconds = max(0.0, (released - began).total_seconds())
        span = self._tracer.start_span(
            "task.held",
            context=context,
            start_time=_ns(began),
            attributes={
                "lowtide.task.id": row.id,
                "lowtide.hold.reason": reason,
                "lowtide.hold.seconds": seconds,
                "lowtide.queue": row.queue,
                "lowtide.activity_type": row.activity_type,
            },
        )
        span.end(end_time=max(_ns(released), _ns(began)))

    def dispatched(self, context: Context, row: ClaimedRow, claimed_ns: int) -> None:
        """Claimed at `claimed_ns`, sent to its worker now."""
        span = self._tracer.start_span(
            "task.dispatch",
            context=context,
            kind=SpanKind.PRODUCER,
            start_time=claimed_ns,
            attributes={
                "lowtide.task.id": row.id,
                "lowtide.task.attempt": row.attempt,
                "lowtide.queue": row.queue,
                "lowtide.activity_type": row.activity_type,
                "lowtide.worker.id": row.worker_id,
            },
        )
        span.end()

    def sent(self, rows: Sequence[ClaimedRow], figures: Sequence[Timings], claimed_ns: int) -> dict[int, Context]:
        """The spans of the traced rows just sent to a worker: how long each waited on a hold (if
        it did: the time-held histogram's figure) and its dispatch. Their contexts, by task id."""
        contexts = {}
        for row, timing in zip(rows, figures, strict=True):
            context = task_context(row.headers)
            if context is None:
                continue
            contexts[row.id] = context
            if timing.held is not None and timing.held_between is not None:
                self.held(context, row, timing.held[0], *timing.held_between)
            self.dispatched(context, row, claimed_ns)
        return contexts

    def recorded(self, context: Context, outcome: Outcome, received_ns: int) -> None:
        """The worker's report, received at `received_ns`, is written now."""
        attributes: dict[str, str | int] = {
            "lowtide.task.id": outcome.task_id,
            "lowtide.task.attempt": outcome.attempt,
            # completed, failed (for good) or pending (a retry is due at run_at).
            "lowtide.task.status": outcome.state.value,
        }
        if outcome.failure is not None:
            attributes["error.type"] = outcome.failure.error_type
        span = self._tracer.start_span("task.result", context=context, start_time=received_ns, attributes=attributes)
        if outcome.failure is not None:
            span.set_status(Status(StatusCode.ERROR, outcome.failure.message[:200]))
        span.end()


def now_ns() -> int:
    return time.time_ns()
