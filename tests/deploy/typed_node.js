'use strict';
// The Node side of the typed round trips (tests/deploy/test_typed_round_trips.py), built on
// clients/node, against the scheduler at LOWTIDE_TARGET.
//   node typed_node.js worker   runs `train` until SIGTERM: gets the parsed JSON params, returns
//                               an object; prints "welcome" once connected. Also `progress`: its
//                               context (attempt, deadline) as one JSON line, a heartbeat with
//                               details, then it waits for its cancel and prints how it saw it.
//   node typed_node.js submit   submits `score` with a plain object (JSON), waits for it, and
//                               prints the decoded result as one JSON line.
const { Worker, SchedulerClient, decodeResult } = require('../../clients/node/lib');

const target = process.env.LOWTIDE_TARGET;

async function submit() {
  const client = new SchedulerClient(target);
  const task = await client.submit('score', { name: 'node', values: [1, 2, 3.5], nested: { weight: 2 } });
  const done = await client.wait(task.id, 20000);
  console.log(JSON.stringify({ state: done.state, result: decodeResult(done) }));
  client.close();
}

function work() {
  const worker = new Worker({
    target,
    activities: {
      train: async (params) => ({
        loss: params.learning_rate * params.epochs,
        // What the activity got, as a check that it was decoded (not a Buffer).
        seen: Buffer.isBuffer(params) ? 'buffer' : typeof params,
        tags: params.tags.map((tag) => tag.toUpperCase()),
      }),
      progress: async (params, ctx) => {
        const deadline = ctx.deadline && ctx.deadline.toISOString();
        console.log(JSON.stringify({ event: 'started', taskId: ctx.taskId, attempt: ctx.attempt, deadline }));
        ctx.logger.info('stepping');
        ctx.heartbeat({ epoch: params.epoch, of: 10 });
        await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve));
        console.log(JSON.stringify({ event: 'cancelled', taskId: ctx.taskId, reason: ctx.signal.reason.message }));
        return null;
      },
    },
  });
  worker.on('welcome', () => console.log('welcome'));
  process.on('SIGTERM', () => worker.stop());
  worker.start();
  worker.closed.then((error) => process.exit(error ? 1 : 0));
}

if (process.argv[2] === 'submit') {
  submit().catch((error) => {
    console.error(error);
    process.exit(1);
  });
} else {
  work();
}
