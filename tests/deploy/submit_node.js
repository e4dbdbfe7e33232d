'use strict';
// The Node client's submits (tests/deploy/test_node_submit_stream.py), against the scheduler at
// LOWTIDE_TARGET: 200 submits at once and one the scheduler refuses, each with its own answer,
// then one more, then eight large ones at once. Prints one JSON line: the tasks' ids and payloads,
// the refusal's code, details and trailing metadata keys, whether the submits went on a stream,
// and the large ones' payload lengths and first letters. `node submit_node.js close` closes its
// client at the end; `leave` does not (the process must still exit).
const { SchedulerClient } = require('../../clients/node/lib');

async function main() {
  const client = new SchedulerClient(process.env.LOWTIDE_TARGET);
  const bad = client._submits.submit({ activity_type: 'echo', start_to_close_timeout: { seconds: -5 } });
  const many = Promise.all(Array.from({ length: 200 }, (_, i) => client.submit('echo', `n${i}`)));
  const onStream = client._submits._stream !== null;
  const refused = await bad.then(() => null, (error) => ({
    code: error.code,
    details: error.details,
    metadata: Object.keys(error.metadata.getMap()),
  }));
  const tasks = await many;
  const later = await client.submit('echo', 'later');
  // Eight of 900 kB at once: 7.2 MB of answers, more than a client receives in one message.
  const letters = [...'abcdefgh'];
  const big = await Promise.all(letters.map((letter) => client.submit('echo', letter.repeat(900000))));
  if (process.argv[2] === 'close') client.close();
  const stored = [...tasks, later].map((task) => [task.id, task.payload.toString()]);
  const bigBack = big.map((task) => `${task.payload.length}:${String.fromCharCode(task.payload[0])}`);
  console.log(JSON.stringify({ stored, refused, onStream, bigBack }));
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
