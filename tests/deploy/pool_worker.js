'use strict';
// A Node worker of clients/node in the pool POOL (its `train` returns "node POOL: " and the
// payload), for the where-and-when test. Configured by LOWTIDE_TARGET, WORKER_ID and POOL;
// prints "welcome" once connected; SIGTERM stops it.
const { Worker } = require('../../clients/node/lib');

const pool = process.env.POOL;
const worker = new Worker({
  target: process.env.LOWTIDE_TARGET,
  workerId: process.env.WORKER_ID,
  pool,
  slots: 1,
  activities: {
    train: async (payload) => Buffer.from(`node ${pool}: ${payload.toString()}`),
  },
});
worker.on('welcome', (welcome) => console.log(`welcome ${welcome.worker_id}`));
worker.on('error', (error) => console.log(`error ${error.message}`));
process.on('SIGTERM', () => worker.stop());
worker.start().catch((error) => {
  console.log(`refused ${error.message}`);
  process.exit(1);
});
worker.closed.then((error) => process.exit(error ? 1 : 0));
