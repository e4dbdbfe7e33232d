'use strict';
// The example worker docker compose runs: `echo` returns its payload, `upper` upper-cases it.
// Configured by environment: LOWTIDE_TARGET (default 127.0.0.1:50051), LOWTIDE_POOL,
// LOWTIDE_QUEUES, LOWTIDE_ACTIVITY_TYPES, LOWTIDE_SLOTS, and as the lowtide CLI LOWTIDE_TOKEN
// (a worker-role token when the scheduler has auth on), LOWTIDE_CA (TLS), LOWTIDE_CERT and
// LOWTIDE_KEY (mutual TLS). SIGTERM drains: no new work, running attempts finish and report,
// then it exits.
const { Worker, fromEnv } = require('../lib');

const all = {
  echo: async (payload) => payload,
  upper: async (payload) => payload.toString().toUpperCase(),
};
const list = (text, fallback) => (text || fallback).split(',').map((s) => s.trim()).filter(Boolean);
const names = list(process.env.LOWTIDE_ACTIVITY_TYPES, 'echo,upper');
const unknown = names.filter((name) => !(name in all));
if (unknown.length) {
  console.error(`unknown activity type(s) ${unknown.join(', ')}; this example has ${Object.keys(all).join(', ')}`);
  process.exit(2);
}

const worker = new Worker({
  target: process.env.LOWTIDE_TARGET || '127.0.0.1:50051',
  pool: process.env.LOWTIDE_POOL || 'default',
  queues: list(process.env.LOWTIDE_QUEUES, 'default'),
  slots: Number(process.env.LOWTIDE_SLOTS || 8),
  activities: Object.fromEntries(names.map((name) => [name, all[name]])),
  ...fromEnv(),
});
worker.on('error', (error) => console.error(`worker stream failed: ${error.message}`));
for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => worker.stop());

worker.start().then(
  (welcome) => console.log(`node worker ${welcome.worker_id} connected to ${worker.target}`),
  (error) => {
    console.error(`cannot connect to ${worker.target}: ${error.message}`);
    process.exit(1);
  },
);
// The worker reconnects by itself after a scheduler's Drain or an outage; it closes only after
// stop() (exit 0) or on an error to fix, such as a refused hello (exit 1, so the container restarts).
worker.closed.then((error) => process.exit(error || !worker.draining ? 1 : 0));
