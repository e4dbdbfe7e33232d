'use strict';
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
