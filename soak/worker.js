'use strict';
// A soak worker in Node, the twin of soak/worker.py: the same activities, and the same record
// (a JSON line when an attempt begins, one when it ends) appended to SOAK_OUT. Configured by
// LOWTIDE_TARGET, WORKER_ID, SOAK_OUT, SOAK_POOL, SOAK_QUEUE and SOAK_SLOTS; SIGTERM stops it.
const fs = require('fs');
const path = require('path');
const { Worker } = require(path.join(__dirname, '..', 'clients', 'node', 'lib'));

const id = process.env.WORKER_ID;
const out = fs.openSync(process.env.SOAK_OUT, 'a');
const pool = process.env.SOAK_POOL || 'default';

function record(fields) {
  fs.writeSync(out, `${JSON.stringify({ w: id, p: process.pid, ...fields })}\n`);
}

class Flaky extends Error {
  constructor(message) {
    super(message);
    this.name = 'Flaky';
  }
}

class Doomed extends Error {
  constructor(message) {
    super(message);
    this.name = 'Doomed';
  }
}

function activity(name) {
  return async (payload, ctx) => {
    record({ t: Number(ctx.taskId), a: ctx.attempt, s: Date.now() / 1000 });
    let ok = false;
    try {
      const nap = Number(ctx.headers['soak-nap-ms'] || 0);
      await new Promise((resolve) => setTimeout(resolve, nap));
      if (name === 'flaky' && ctx.attempt < Number(ctx.headers['soak-fail-until'] || 0)) {
        throw new Flaky(`attempt ${ctx.attempt} fails`);
      }
      if (name === 'doomed') throw new Doomed('this task never succeeds');
      ok = true;
      return Buffer.from('ok');
    } finally {
      record({ t: Number(ctx.taskId), a: ctx.attempt, e: Date.now() / 1000, ok });
    }
  };
}

const names = pool === 'fixed' ? ['fixed'] : ['plain', 'defer', 'flaky', 'doomed'];
const worker = new Worker({
  target: process.env.LOWTIDE_TARGET,
  workerId: id,
  pool,
  queues: [process.env.SOAK_QUEUE || 'default'],
  slots: Number(process.env.SOAK_SLOTS || 8),
  activities: Object.fromEntries(names.map((name) => [name, activity(name)])),
});
worker.on('error', (error) => console.error(`error ${error.message}`));
process.on('SIGTERM', () => worker.stop());
worker.start().catch((error) => {
  console.error(`refused ${error.message}`);
  process.exit(1);
});
worker.closed.then((error) => process.exit(error ? 1 : 0));
