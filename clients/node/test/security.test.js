'use strict';
// Token auth and mutual TLS, against a scheduler with both on at LOWTIDE_TARGET
// (tests/deploy/test_node_worker.py starts one and sets LOWTIDE_TOKEN, a worker-role token,
// LOWTIDE_SUBMIT_TOKEN, a submitter-role one, and LOWTIDE_CA, LOWTIDE_CERT, LOWTIDE_KEY).
// Skipped against the plaintext scheduler of the other tests.
const { test } = require('node:test');
const assert = require('node:assert/strict');
const grpc = require('@grpc/grpc-js');
const { Worker, SchedulerClient, fromEnv } = require('../lib');

const target = process.env.LOWTIDE_TARGET;
const security = fromEnv();
const skip = security.token && security.ca ? false : 'needs LOWTIDE_TOKEN and LOWTIDE_CA (a scheduler with auth and TLS on)';
const OPTIONS = { skip, timeout: 20000 };

// A refused worker's stream fails: that is the point here, not an unhandled 'error' event.
function refusedWorker(options) {
  const worker = new Worker({ target, activities: { n_secure: async (p) => p }, ...options });
  worker.on('error', () => {});
  return worker;
}

test('with its token over mutual TLS, a worker connects and runs a task', OPTIONS, async () => {
  const client = new SchedulerClient(target, { ...security, token: process.env.LOWTIDE_SUBMIT_TOKEN });
  const worker = new Worker({ target, ...security, activities: { n_secure: async (p) => Buffer.from(`${p} safely`) } });
  try {
    const welcome = await worker.start();
    assert.ok(welcome.worker_id);
    const task = await client.submit('n_secure', 'run');
    const done = await client.wait(task.id, 10000);
    assert.equal(done.state, 'TASK_STATE_COMPLETED');
    assert.equal(done.result.toString(), 'run safely');
  } finally {
    await worker.stop();
    client.close();
  }
});

test('without a token the worker is refused with UNAUTHENTICATED', OPTIONS, async () => {
  const worker = refusedWorker({ ...security, token: undefined });
  await assert.rejects(worker.start(), (error) => error.code === grpc.status.UNAUTHENTICATED);
  await worker.close();
});

test('a submitter token cannot serve as a worker: PERMISSION_DENIED', OPTIONS, async () => {
  const token = process.env.LOWTIDE_SUBMIT_TOKEN;
  const worker = refusedWorker({ ...security, token });
  await assert.rejects(worker.start(), (error) => error.code === grpc.status.PERMISSION_DENIED);
  await worker.close();
});

test('plaintext to a TLS scheduler fails to connect, token or not', OPTIONS, async () => {
  const worker = refusedWorker({ token: security.token });
  await assert.rejects(worker.start(), (error) => error.code === grpc.status.UNAVAILABLE);
  await worker.close();
});

test('a client certificate without its key is refused at construction', { skip }, () => {
  assert.throws(() => new Worker({ target, ca: security.ca, cert: security.cert, activities: { a: async (p) => p } }), /cert and key go together/);
});
