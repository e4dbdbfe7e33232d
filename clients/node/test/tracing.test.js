'use strict';
// The trace context a worker reads from its assignment's headers (W3C traceparent/tracestate).
const test = require('node:test');
const assert = require('node:assert/strict');
const { traceContext, runTraced } = require('../lib/tracing');

test('a valid traceparent gives the trace and parent span ids, flags and tracestate', () => {
  const headers = {
    traceparent: '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01',
    tracestate: 'lowtide=t61rcWkgMzE',
  };
  assert.deepEqual(traceContext(headers), {
    traceId: '0af7651916cd43dd8448eb211c80319c',
    spanId: 'b7ad6b7169203331',
    traceFlags: 1,
    traceState: 'lowtide=t61rcWkgMzE',
  });
});

test('no or an invalid traceparent gives null', () => {
  for (const traceparent of [
    undefined,
    '',
    '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331',
    'ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01',
    '00-00000000000000000000000000000000-b7ad6b7169203331-01',
    '00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01',
    '00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01',
  ]) {
    assert.equal(traceContext(traceparent === undefined ? {} : { traceparent }), null, String(traceparent));
  }
});

test('an untraced attempt just runs, and its result or error comes back', async () => {
  assert.equal(await runTraced(null, {}, async () => 'done'), 'done');
  await assert.rejects(runTraced(null, {}, async () => { throw new Error('boom'); }), /boom/);
});

test('with @opentelemetry/api and an SDK, a traced attempt runs in a task.run span continuing the task trace', async () => {
  const otel = require('@opentelemetry/api');
  const { NodeTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } = require('@opentelemetry/sdk-trace-node');
  const exporter = new InMemorySpanExporter();
  const provider = new NodeTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
  provider.register();
  try {
    const trace = traceContext({
      traceparent: '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01',
      tracestate: 'lowtide=t61rcWkgMzE',
    });
    const inside = await runTraced(trace, { 'lowtide.task.id': 1 }, async () => {
      await new Promise((resolve) => setTimeout(resolve, 5));
      return otel.trace.getActiveSpan().spanContext();
    });
    await assert.rejects(
      runTraced(trace, { 'lowtide.task.id': 2 }, async () => { throw new TypeError('bad payload'); }),
      /bad payload/,
    );
    const [run, failed] = exporter.getFinishedSpans();
    assert.equal(run.name, 'task.run');
    assert.equal(run.spanContext().traceId, '0af7651916cd43dd8448eb211c80319c');
    assert.equal(run.parentSpanContext.spanId, 'b7ad6b7169203331');
    assert.equal(run.kind, otel.SpanKind.CONSUMER);
    assert.equal(run.attributes['lowtide.task.id'], 1);
    assert.equal(inside.spanId, run.spanContext().spanId, 'the span is active while the activity runs');
    assert.equal(run.spanContext().traceState.get('lowtide'), 't61rcWkgMzE');
    assert.equal(failed.status.code, otel.SpanStatusCode.ERROR);
    assert.equal(failed.attributes['error.type'], 'TypeError');
  } finally {
    await provider.shutdown();
    otel.trace.disable();
    otel.context.disable();
    otel.propagation.disable();
  }
});
