'use strict';
// The task's W3C trace context, from the headers the scheduler sends with each assignment
// (traceparent, tracestate). A worker sees it as ctx.trace; when @opentelemetry/api can be
// required (the application installs it with its SDK), each traced attempt runs inside a
// `task.run` span that continues the task's trace, active while the activity runs, so spans the
// activity makes are its children. Without @opentelemetry/api nothing else happens.

const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/;

/** { traceId, spanId, traceFlags, traceState } from the headers, or null when absent or invalid. */
function traceContext(headers) {
  const match = TRACEPARENT.exec(String((headers && headers.traceparent) || '').trim());
  if (!match) return null;
  const [, version, traceId, spanId, flags, rest] = match;
  // Version ff is invalid; version 00 has nothing after the flags; all-zero ids are invalid.
  if (version === 'ff' || (version === '00' && rest) || /^0+$/.test(traceId) || /^0+$/.test(spanId)) return null;
  return { traceId, spanId, traceFlags: parseInt(flags, 16), traceState: headers.tracestate || '' };
}

let api;
function openTelemetry() {
  if (api === undefined) {
    try {
      api = require('@opentelemetry/api');
    } catch {
      api = null;
    }
  }
  return api;
}

/**
 * Runs fn() inside the attempt's task.run span when there is a trace context and
 * @opentelemetry/api is available; otherwise just runs it.
 */
function runTraced(trace, attributes, fn) {
  const otel = trace ? openTelemetry() : null;
  if (!otel) return fn();
  const parent = otel.trace.setSpanContext(otel.ROOT_CONTEXT, {
    traceId: trace.traceId,
    spanId: trace.spanId,
    traceFlags: trace.traceFlags,
    isRemote: true,
    ...(trace.traceState && otel.createTraceState ? { traceState: otel.createTraceState(trace.traceState) } : {}),
  });
  const tracer = otel.trace.getTracer('lowtide-worker');
  const options = { kind: otel.SpanKind.CONSUMER, attributes };
  return tracer.startActiveSpan('task.run', options, parent, async (span) => {
    try {
      return await fn();
    } catch (error) {
      span.recordException(error);
      span.setStatus({ code: otel.SpanStatusCode.ERROR, message: String((error && error.message) || error) });
      span.setAttribute('error.type', (error && error.name) || 'Error');
      throw error;
    } finally {
      span.end();
    }
  });
}

module.exports = { traceContext, runTraced };
