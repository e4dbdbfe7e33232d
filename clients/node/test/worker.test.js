'use strict';
// Runs against a real scheduler at LOWTIDE_TARGET (tests/deploy/test_node_worker.py starts one
// and runs these). The scheduler there beats every 300 ms and loses a silent worker after 2 s.
// For the drain test, that wrapper sends a Drain to any worker whose id starts with "drain-"
// once it runs an attempt (once per id): the scheduler side of a drain, through the scheduler's
// own stream.
const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const { setTimeout: sleep } = require('node:timers/promises');
const { once } = require('node:events');
const { Worker, NonRetryableError, SchedulerClient } = require('../lib');

const target = process.env.LOWTIDE_TARGET;
if (!target) throw new Error('set LOWTIDE_TARGET to a running scheduler (host:port); `make test` does');
const client = new SchedulerClient(target);
// A test that waits for something that never comes fails, with its name, instead of hanging;
// whatever it left connected is closed at the end, so the process exits.
const LIMIT = { timeout: 20000 };
const workers = new Set();
after(async () => {
  await Promise.all([...workers].map((worker) => worker.close()));
  client.close();
});

function newWorker(options) {
  const worker = new Worker({ target, ...options });
  workers.add(worker);
  return worker;
}

// Each test has its own activity types, so no other test's worker takes its tasks.
async function withWorker(options, body) {
  const worker = newWorker(options);
  try {
    const welcome = await worker.start();
    return await body(worker, welcome);
  } finally {
    await worker.stop();
  }
}

async function finished(id) {
  const task = await client.wait(id, 10000);
  assert.notEqual(task.state, 'TASK_STATE_PENDING', `task ${id} still pending`);
  assert.notEqual(task.state, 'TASK_STATE_RUNNING', `task ${id} still running`);
  return task;
}

test('connects: the hello is answered by a welcome with the lease terms', LIMIT, async () => {
  await withWorker({ workerId: 'node-hello', activities: { n_hello: async (p) => p } }, async (_worker, welcome) => {
    assert.equal(welcome.worker_id, 'node-hello');
    assert.ok(Number(welcome.heartbeat_interval.nanos) > 0 || Number(welcome.heartbeat_interval.seconds) > 0);
    assert.ok(Number(welcome.lease_timeout.seconds) >= 1);
  });
});

test('takes assigned tasks and reports their results in batches', LIMIT, async () => {
  const tasks = [];
  for (let i = 0; i < 20; i += 1) tasks.push(await client.submit('n_echo', `payload-${i}`));
  const batches = [];
  await withWorker({ slots: 8, activities: { n_echo: async (p) => Buffer.concat([p, Buffer.from('!')]) } }, async (worker) => {
    worker.on('reported', (count) => batches.push(count));
    for (const [i, submitted] of tasks.entries()) {
      const task = await finished(submitted.id);
      assert.equal(task.state, 'TASK_STATE_COMPLETED');
      assert.equal(task.attempt, 1);
      assert.equal(Buffer.from(task.result).toString(), `payload-${i}!`);
    }
  });
  assert.equal(batches.reduce((a, b) => a + b, 0), 20);
  // The backlog was there before the worker: its first claim fills all 8 slots at once, and
  // those results travel together.
  assert.ok(Math.max(...batches) > 1, `every result went alone: ${batches}`);
});

test('reports failures: retried per policy, or at once when non-retryable', LIMIT, async () => {
  let calls = 0;
  const activities = {
    n_boom: async () => {
      calls += 1;
      throw new Error('boom');
    },
    n_fatal: async () => {
      throw new NonRetryableError('cannot ever work');
    },
  };
  await withWorker({ activities }, async () => {
    const boom = await client.submit('n_boom', '', { maxAttempts: 2 });
    const fatal = await client.submit('n_fatal', '', { maxAttempts: 5 });
    // The retry waits out the default 1 s backoff.
    let task = await client.wait(boom.id, 10000);
    while (task.state === 'TASK_STATE_PENDING' || task.state === 'TASK_STATE_RUNNING') task = await client.wait(boom.id, 10000);
    assert.equal(task.state, 'TASK_STATE_FAILED');
    assert.equal(task.attempt, 2);
    assert.equal(calls, 2);
    assert.equal(task.last_failure.error_type, 'Error');
    assert.equal(task.last_failure.message, 'boom');
    task = await finished(fatal.id);
    assert.equal(task.state, 'TASK_STATE_FAILED');
    assert.equal(task.attempt, 1);
    assert.equal(task.last_failure.error_type, 'NonRetryableError');
  });
});

test('an activity sees the headers its task was submitted with, and their trace context', LIMIT, async () => {
  const activities = {
    n_headers: async (_payload, ctx) => JSON.stringify({ headers: ctx.headers, trace: ctx.trace }),
  };
  await withWorker({ activities }, async () => {
    const headers = { traceparent: '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01' };
    const submitted = await client.submit('n_headers', '', { headers });
    const task = await finished(submitted.id);
    assert.equal(task.state, 'TASK_STATE_COMPLETED', JSON.stringify(task.last_failure));
    const seen = JSON.parse(Buffer.from(task.result).toString());
    assert.deepEqual(seen.headers, headers);
    assert.deepEqual(seen.trace, {
      traceId: '0af7651916cd43dd8448eb211c80319c',
      spanId: 'b7ad6b7169203331',
      traceFlags: 1,
      traceState: '',
    });
    assert.deepEqual(task.headers, headers);
  });
});

test('heartbeats keep an attempt longer than its heartbeat timeout alive', LIMIT, async () => {
  const activities = { n_long: async () => { await sleep(4000); return 'done'; } };
  await withWorker({ activities }, async () => {
    // 1.5 s without a heartbeat would fail the attempt; it runs 4 s, past the 2 s lease too. (The
    // worker beats every 500 ms here; 600 ms, beaten every 200 ms, timed out once on a loaded
    // machine running both test processes.)
    const submitted = await client.submit('n_long', '', { heartbeatTimeoutMs: 1500, maxAttempts: 1 });
    const task = await finished(submitted.id);
    assert.equal(task.state, 'TASK_STATE_COMPLETED', JSON.stringify(task.last_failure));
    assert.equal(Buffer.from(task.result).toString(), 'done');
  });
});

test('beats at the welcome\'s idle interval while nothing runs, at the busy one while an attempt runs', LIMIT, async () => {
  const activities = { n_beat: async () => { await sleep(1500); return 'done'; } };
  await withWorker({ workerId: 'node-beat', activities }, async (worker, welcome) => {
    // The scheduler here: busy every 300 ms, idle every 30 s (its default).
    const idleMs = Number(welcome.idle_heartbeat_interval.seconds) * 1000;
    assert.ok(idleMs >= 10000, `idle interval ${idleMs} ms`);
    const beats = [];
    worker.on('heartbeat', (running) => beats.push(running.length));
    await sleep(1200); // four busy intervals, idle
    assert.deepEqual(beats, [], 'an idle worker beat at the busy interval');
    const submitted = await client.submit('n_beat', '', { maxAttempts: 1 });
    const task = await finished(submitted.id);
    assert.equal(task.state, 'TASK_STATE_COMPLETED', JSON.stringify(task.last_failure));
    // 1.5 s of running at 300 ms: several beats, each listing the attempt.
    assert.ok(beats.filter((running) => running === 1).length >= 3, JSON.stringify(beats));
  });
});

test('a result it cannot encode, or any value thrown, fails that attempt and the worker runs on', LIMIT, async () => {
  const unhandled = [];
  const onUnhandled = (reason) => unhandled.push(reason);
  process.on('unhandledRejection', onUnhandled);
  const activities = {
    // The README's train returns an object: for a task that is not JSON that is no result.
    n_object: async () => ({ loss: 0.025 }),
    n_number: async () => 42,
    n_bigint: async () => ({ big: 10n }),
    n_null_proto: async () => {
      throw Object.create(null);
    },
    n_string_thrown: async () => {
      throw 'plain text';
    },
    n_fine: async (p) => p,
  };
  try {
    await withWorker({ slots: 2, activities }, async (worker) => {
      const failedWith = async (type, payload) => {
        const submitted = await client.submit(type, payload, { maxAttempts: 1 });
        const task = await finished(submitted.id);
        assert.equal(task.state, 'TASK_STATE_FAILED', `${type}: ${JSON.stringify(task)}`);
        return task.last_failure;
      };
      let failure = await failedWith('n_object', 'raw bytes');
      assert.equal(failure.error_type, 'TypeError');
      assert.match(failure.message, /the result is an object, and the task is not JSON .*return a Buffer or a string/);
      failure = await failedWith('n_number', '');
      assert.equal(failure.error_type, 'TypeError');
      failure = await failedWith('n_bigint', { as: 'json' });
      assert.equal(failure.error_type, 'TypeError');
      assert.match(failure.message, /cannot be encoded as JSON/);
      failure = await failedWith('n_null_proto', '');
      assert.equal(failure.error_type, 'Error');
      assert.match(failure.message, /cannot be turned into text/);
      failure = await failedWith('n_string_thrown', '');
      assert.deepEqual([failure.error_type, failure.message], ['Error', 'plain text']);
      // Still connected, still working: the next task completes on the same worker.
      const next = await client.submit('n_fine', 'still here');
      const task = await finished(next.id);
      assert.equal(task.state, 'TASK_STATE_COMPLETED');
      assert.equal(worker.running.size, 0);
    });
    assert.deepEqual(unhandled, []);
  } finally {
    process.off('unhandledRejection', onUnhandled);
  }
});

test('honours a cancel: the activity is aborted and its slot freed', LIMIT, async () => {
  const activities = {
    n_wait: (_payload, ctx) =>
      new Promise((_resolve, reject) => ctx.signal.addEventListener('abort', () => reject(ctx.signal.reason))),
    n_quick: async (p) => p,
  };
  await withWorker({ slots: 1, activities }, async (worker) => {
    const assigned = once(worker, 'assigned');
    const submitted = await client.submit('n_wait');
    const [ctx] = await assigned;
    assert.equal(ctx.taskId, submitted.id);
    const cancelledEvent = once(worker, 'cancelled');
    const cancelled = await client.cancel(submitted.id);
    assert.equal(cancelled.state, 'TASK_STATE_CANCELLED');
    const [ref] = await cancelledEvent;
    assert.equal(ref.task_id, submitted.id);
    assert.ok(ctx.signal.aborted);
    // Its one slot is free again: the next task runs.
    const quick = await client.submit('n_quick', 'next');
    assert.equal((await finished(quick.id)).state, 'TASK_STATE_COMPLETED');
    assert.equal((await client.get(submitted.id)).state, 'TASK_STATE_CANCELLED');
  });
});

test('honours a drain: finishes what it runs, reports it, closes that stream and connects again', LIMIT, async () => {
  const worker = newWorker({
    workerId: `drain-${process.pid}`,
    activities: { n_drain: async (p) => { await sleep(300); return p; } },
  });
  const drained = once(worker, 'drain');
  await worker.start();
  const welcomedAgain = once(worker, 'welcome');
  const running = await client.submit('n_drain', 'finish me');
  const [reason, drain] = await drained;
  assert.ok(reason.length > 0);
  assert.ok(drain.grace, 'a drain carries its grace');
  const task = await finished(running.id);
  assert.equal(task.state, 'TASK_STATE_COMPLETED');
  assert.equal(task.attempt, 1);
  assert.equal(Buffer.from(task.result).toString(), 'finish me');
  // The drained stream is closed and a new one welcomed: work flows again, on the same worker id.
  const [welcome] = await welcomedAgain;
  assert.equal(welcome.worker_id, `drain-${process.pid}`);
  const later = await client.submit('n_drain', 'the next stream takes me');
  const next = await finished(later.id);
  assert.equal(next.state, 'TASK_STATE_COMPLETED');
  assert.equal(next.worker_id, `drain-${process.pid}`);
  await worker.stop();
  assert.equal(await worker.closed, null);
});

test('a task is submitted with its window and the pools it may run in', LIMIT, async () => {
  const latestStart = new Date(Date.now() + 3600 * 1000);
  const submitted = await client.submit('n_window', 'w', {
    latestStart,
    estimatedDurationMs: 90000,
    pools: ['default'],
  });
  const task = await client.get(submitted.id);
  assert.equal(Number(task.latest_start.seconds), Math.floor(latestStart.getTime() / 1000));
  assert.equal(Number(task.estimated_duration.seconds), 90);
  assert.deepEqual(task.pools, ['default']);
  await client.cancel(submitted.id);
  await assert.rejects(client.submit('n_window', 'w', { latestStart: 'tomorrow' }), /latestStart must be a valid Date/);
  // A bare string is not spread into one-letter pools.
  await assert.rejects(client.submit('n_window', 'w', { pools: 'eu-west' }), /pools must be an array of pool names/);
  // null, as undefined: any pool.
  const anywhere = await client.submit('n_window', 'w', { latestStart, pools: null });
  assert.deepEqual((await client.get(anywhere.id)).pools, []);
  await client.cancel(anywhere.id);
});
