'use strict';
// Loads the lowtide contract from the .proto files at run time: nothing here is generated, so
// the package's protos/ (a copy of the repository's protos/lowtide, written by `make proto` and
// checked by `make proto-check`; or LOWTIDE_PROTO_DIR) are the only definition of the protocol.
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_DIR = process.env.LOWTIDE_PROTO_DIR || path.resolve(__dirname, '..', 'protos');

let cached = null;

function loadLowtide() {
  if (cached === null) {
    const definition = protoLoader.loadSync(
      ['lowtide/v1/worker.proto', 'lowtide/v1/scheduler.proto'],
      {
        includeDirs: [PROTO_DIR],
        keepCase: true,
        // Task ids are int64; as Numbers they stay exact below 2^53, far past any real id.
        longs: Number,
        enums: String,
        defaults: true,
        oneofs: true,
      },
    );
    cached = grpc.loadPackageDefinition(definition).lowtide.v1;
  }
  return cached;
}

module.exports = { loadLowtide, PROTO_DIR };
