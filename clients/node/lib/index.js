'use strict';
const path = require('node:path');

// Required from a checkout (`require('./clients/node/lib')`) before `npm ci` has been run there,
// the library would fail on its first require with "Cannot find module '@grpc/grpc-js'": say
// what to do instead.
for (const dependency of ['@grpc/grpc-js', '@grpc/proto-loader']) {
  try {
    require.resolve(dependency);
  } catch (error) {
    if (error.code !== 'MODULE_NOT_FOUND') throw error;
    const folder = path.dirname(__dirname);
    throw Object.assign(
      new Error(
        `lowtide-worker: its dependency ${dependency} is not installed. Run \`npm ci\` once in ${folder} ` +
          '(or `npm install` the package where you use it), then start again.',
      ),
      { code: 'MODULE_NOT_FOUND' },
    );
  }
}

const { Worker, NonRetryableError } = require('./worker');
const { SchedulerClient } = require('./client');
const { loadLowtide, PROTO_DIR } = require('./protos');
const { fromEnv } = require('./security');
const { decodeResult, encodePayload, CONTENT_TYPE, JSON_TYPE } = require('./codec');

module.exports = {
  Worker,
  NonRetryableError,
  SchedulerClient,
  loadLowtide,
  PROTO_DIR,
  fromEnv,
  decodeResult,
  encodePayload,
  CONTENT_TYPE,
  JSON_TYPE,
};
