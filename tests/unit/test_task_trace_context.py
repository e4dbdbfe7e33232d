"""A submission's trace context goes into each task's headers: unless the submitter set a
traceparent, and only within the headers' bounds; nothing without an active span."""

from __future__ import annotations

import dataclasses

from opentelemetry.sdk.trace import TracerProvider

from scheduler_service.observe.tracing import task_context, with_trace_context
from tests.unit.test_submission import task


def test_the_active_span_goes_into_headers_the_submitter_left_without_a_traceparent() -> None:
    tracer = TracerProvider().get_tracer("test")
    own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    plain = task()
    tenant = dataclasses.replace(task(), headers={"x-tenant": "blue"})
    traced = dataclasses.replace(task(), headers={"traceparent": own})
    full = dataclasses.replace(task(), headers={f"h{i}": "v" for i in range(32)})
    assert with_trace_context([plain]) == [plain], "no active span: nothing to carry"
    with tracer.start_as_current_span("submit") as span:
        out = with_trace_context([plain, tenant, traced, full])
    ids = span.get_span_context()
    expected = f"00-{ids.trace_id:032x}-{ids.span_id:016x}-{ids.trace_flags:02x}"
    assert out[0].headers == {"traceparent": expected}
    assert out[1].headers == {"x-tenant": "blue", "traceparent": expected}
    assert out[2].headers == {"traceparent": own}, "the submitter's own context is kept"
    assert out[3] is full, "33 headers would be over the limit of 32"
    context = task_context(out[0].headers)
    assert context is not None
    assert task_context({}) is None
    assert task_context(None) is None
    assert task_context({"traceparent": "not-a-traceparent"}) is None
