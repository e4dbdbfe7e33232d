'use strict';
// A Node worker for the drain test, built on clients/node: `n_nap` sleeps NAP_MS (default 1500)
// and returns its payload. Prints one line per stream event (welcome, drain, reconnecting) and per
// nap started, which the test reads. Configured by LOWTIDE_TARGET and WORKER_ID; SIGTERM stops it.
const { Worker } = require('../../clients/node/lib');

const nap = Number(process.env.NAP_MS || 1500);
const worker = new Worker({
  target: process.env.LOWTIDE_TARGET,
  workerId: process.env.WORKER_ID,
  slots: 2,
  activities: {
    n_nap: async (payload) => {
      console.log(`started ${payload.toString()}`);
      await new Promise((resolve) => setTimeout(resolve, nap));
      return payload;
    },
  },
});
worker.on('welcome', (welcome) => console.log(`welcome ${welcome.worker_id}`));
worker.on('drain', (reason) => console.log(`drain ${reason}`));
worker.on('reconnecting', ({ delayMs, reason }) => console.log(`reconnecting in ${delayMs} ms: ${reason}`));
worker.on('error', (error) => console.log(`error ${error.message}`));
process.on('SIGTERM', () => worker.stop());
worker.start().catch((error) => {
  console.log(`refused ${error.message}`);
  process.exit(1);
});
worker.closed.then((error) => process.exit(error ? 1 : 0));
