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
