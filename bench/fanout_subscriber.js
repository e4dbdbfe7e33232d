'use strict';
// The fan-out benchmark's subscriber process in Node (@grpc/grpc-js, the library the Node client
// uses), speaking the same protocol as fanout_subscriber.py: opens COUNT Subscribe streams, says
// `ready` once each has its first state, records when each later version arrives, and at the end
// of stdin prints {version: last arrival (epoch seconds)} as JSON. Lighter than Python's grpc.aio
// per message, so that on a small machine the clients take less CPU from the service measured.
const path = require('node:path');
const { createRequire } = require('node:module');
const { performance } = require('node:perf_hooks');

const nodeClient = createRequire(path.resolve(__dirname, '..', 'clients', 'node', 'package.json'));
const grpc = nodeClient('@grpc/grpc-js');
const protoLoader = nodeClient('@grpc/proto-loader');

const CHANNELS = 8;
const [target, countText] = process.argv.slice(2);
const count = Number(countText);

const definition = protoLoader.loadSync(['lowtide/v1/signal.proto'], {
  includeDirs: [path.resolve(__dirname, '..', 'protos')],
  longs: Number,
  defaults: true,
});
const { SignalService } = grpc.loadPackageDefinition(definition).lowtide.v1;
const clients = Array.from(
  { length: CHANNELS },
  // A connection of its own for each, as the Python subscriber's channels have.
  () => new SignalService(target, grpc.credentials.createInsecure(), { 'grpc.use_local_subchannel_pool': 1 }),
);

const last = new Map();
const calls = [];
let waiting = count;
let stopping = false;
for (let i = 0; i < count; i++) {
  const call = clients[i % CHANNELS].Subscribe({});
  let seenFirst = false;
  call.on('data', (response) => {
    const now = (performance.timeOrigin + performance.now()) / 1000;
    const version = response.state.version;
    if (!(last.get(version) >= now)) last.set(version, now);
    if (!seenFirst) {
      seenFirst = true;
      if (--waiting === 0) process.stdout.write('ready\n');
    }
  });
  call.on('error', (error) => {
    if (!stopping) {
      process.stderr.write(`subscriber ${i}: ${error.message}\n`);
      process.exit(1);
    }
  });
  calls.push(call);
}

process.stdin.resume();
process.stdin.on('end', () => {
  stopping = true;
  for (const call of calls) call.cancel();
  process.stdout.write(`${JSON.stringify(Object.fromEntries(last))}\n`, () => process.exit(0));
});
