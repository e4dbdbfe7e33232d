'use strict';
// The activity context (lib/context.js) against a real scheduler at LOWTIDE_TARGET
// (tests/deploy/test_node_worker.py starts one and runs these): attempt and deadline, a logger
// whose lines carry the task id, heartbeat details stored on the task, and cancellation seen
// through ctx.signal / ctx.cancelled / ctx.throwIfCancelled().
const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const { once } = require('node:events');
const { Worker, SchedulerClient } = require('../lib');

const target = process.env.LOWTIDE_TARGET;
if (!target) throw new Error('set LOWTIDE_TARGET to a running scheduler (host:port); `make test` does');
const client = new SchedulerClient(target);
const LIMIT = { timeout: 20000 };
const workers = new Set();
after(async () => {
  await Promise.all([...workers].map((worker) => worker.close()));
  client.close();
});

// Resolves once check() is truthy (polled), or rejects naming what never came.
async function eventually(check, what, withinMs = 15000) {
  const end = Date.now() + withinMs;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > end) throw new Error(`never happened: ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

// A logger as a user passes one: it keeps what it is given.
function recordingLogger() {
  const lines = [];
  const logger = {};
  for (const level of ['debug', 'info', 'warn', 'error']) logger[level] = (...args) => lines.push([level, ...args]);
  return { logger, lines };
}

async function started(options) {
  const worker = new Worker({ target, ...options });
  workers.add(worker);
  await worker.start();
  return worker;
}

test('an activity sees its attempt and deadline, logs with its task id, and its heartbeat details are stored', LIMIT, async () => {
  const { logger, lines } = recordingLogger();
  const seen = [];
  let release;
  const released = new Promise((resolve) => { release = resolve; });
  const activities = {
    nc_step: async (payload, ctx) => {
      seen.push(ctx);
      ctx.logger.info('stepping', { step: 3 });
      ctx.heartbeat({ done: 3, of: 10 });
      await released;
      if (ctx.attempt === 1) throw new Error('first attempt fails');
      ctx.heartbeat('second attempt');
      return payload;
    },
  };
  const worker = await started({ activities, logger, slots: 1 });
  const before = Date.now();
  const submitted = await client.submit('nc_step', 'x', { startToCloseTimeoutMs: 5 * 60000, maxAttempts: 2 });
  const stored = await eventually(async () => {
    const task = await client.get(submitted.id);
    return Buffer.from(task.heartbeat_details).toString() === '{"done":3,"of":10}' && task;
  }, 'the heartbeat details stored on the task');
  assert.equal(stored.state, 'TASK_STATE_RUNNING');
  release();
  const done = await eventually(async () => {
    const task = await client.wait(submitted.id, 5000);
    return task.state === 'TASK_STATE_COMPLETED' && task;
  }, 'the second attempt completing');
  await worker.stop();
  assert.equal(Buffer.from(done.heartbeat_details).toString(), 'second attempt');
  assert.deepEqual(seen.map((ctx) => [ctx.taskId, ctx.attempt, ctx.activityType]), [
    [submitted.id, 1, 'nc_step'],
    [submitted.id, 2, 'nc_step'],
  ]);
  const ctx = seen[0];
  assert.ok(ctx.deadline instanceof Date, String(ctx.deadline));
  // Five minutes from the submit, within the clock skew of one machine.
  assert.ok(ctx.deadline.getTime() > before + 4 * 60000 && ctx.deadline.getTime() < Date.now() + 6 * 60000, ctx.deadline.toISOString());
  assert.equal(ctx.cancelled, false);
  assert.deepEqual(lines[0], ['info', `task_id=${submitted.id} attempt=1 stepping`, { step: 3 }]);
});

test('a logger with child() gets a child bound to the task id and attempt', LIMIT, async () => {
  const bound = [];
  const logger = {
    child(bindings) {
      return { info: (message) => bound.push({ ...bindings, message }) };
    },
  };
  const worker = await started({ activities: { nc_child: async (_p, ctx) => { ctx.logger.info('hi'); return 'ok'; } }, logger });
  const submitted = await client.submit('nc_child');
  const task = await client.wait(submitted.id, 10000);
  await worker.stop();
  assert.equal(task.state, 'TASK_STATE_COMPLETED');
  assert.deepEqual(bound, [{ task_id: submitted.id, attempt: 1, activity_type: 'nc_child', message: 'hi' }]);
});

test('too large heartbeat details are refused in the activity, and the task fails with that error', LIMIT, async () => {
  const activities = { nc_large: async (_p, ctx) => { ctx.heartbeat(Buffer.alloc(4097)); return 'never'; } };
  const worker = await started({ activities });
  const submitted = await client.submit('nc_large', '', { maxAttempts: 1 });
  const task = await client.wait(submitted.id, 10000);
  await worker.stop();
  assert.equal(task.state, 'TASK_STATE_FAILED');
  assert.equal(task.last_failure.error_type, 'RangeError');
  assert.equal(task.last_failure.message, 'heartbeat details are 4097 bytes; the limit is 4096');
  assert.equal(Buffer.from(task.heartbeat_details).length, 0);
});

test('a cancel reaches a running activity: ctx.signal aborts, ctx.cancelled turns true, throwIfCancelled throws', LIMIT, async () => {
  const observed = [];
  const activities = {
    nc_loop: async (_p, ctx) => {
      ctx.heartbeat({ looping: true });
      while (!ctx.cancelled) await new Promise((resolve) => setTimeout(resolve, 20));
      try {
        ctx.throwIfCancelled();
      } catch (error) {
        observed.push(error.message);
      }
      return 'unused';
    },
  };
  const worker = await started({ activities, slots: 1 });
  const assigned = once(worker, 'assigned');
  const submitted = await client.submit('nc_loop');
  const [ctx] = await assigned;
  await eventually(async () => Buffer.from((await client.get(submitted.id)).heartbeat_details).length > 0, 'the details');
  const aborted = once(ctx.signal, 'abort');
  assert.equal((await client.cancel(submitted.id)).state, 'TASK_STATE_CANCELLED');
  await aborted;
  await eventually(() => observed.length === 1, 'the activity seeing its cancel');
  await worker.stop();
  assert.deepEqual(observed, ['cancelled by the scheduler']);
  assert.equal((await client.get(submitted.id)).state, 'TASK_STATE_CANCELLED');
});
