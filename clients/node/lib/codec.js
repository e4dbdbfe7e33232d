'use strict';
// Payload encodings, as the protos describe them (TaskSpec.payload): a task whose headers say
// `content-type: application/json` carries a UTF-8 JSON payload, and its result is JSON too.
// Without that header the payload is raw bytes (a Buffer), and so is the result.

const CONTENT_TYPE = 'content-type';
const JSON_TYPE = 'application/json';

function isJson(headers) {
  return Boolean(headers) && String(headers[CONTENT_TYPE] || '').split(';')[0].trim() === JSON_TYPE;
}

/** The value an activity gets: the parsed JSON for a JSON task, else the payload as a Buffer. */
function decodePayload(payload, headers) {
  const bytes = Buffer.from(payload);
  if (!isJson(headers)) return bytes;
  return bytes.length === 0 ? null : JSON.parse(bytes.toString('utf8'));
}

/** The result bytes: for a JSON task anything but a Buffer is JSON-encoded; else as before. */
function encodeResult(value, headers) {
  if (Buffer.isBuffer(value) || value instanceof Uint8Array) return Buffer.from(value);
  if (isJson(headers)) return value === undefined ? Buffer.alloc(0) : Buffer.from(JSON.stringify(value), 'utf8');
  return Buffer.from(value ?? '');
}

/** A payload to submit: a Buffer or string as it is; any other value as JSON, with its header. */
function encodePayload(value, headers = {}) {
  if (Buffer.isBuffer(value) || typeof value === 'string' || value instanceof Uint8Array) {
    return { payload: Buffer.from(value), headers };
  }
  return { payload: Buffer.from(JSON.stringify(value), 'utf8'), headers: { [CONTENT_TYPE]: JSON_TYPE, ...headers } };
}

/** A task's result: parsed when the task is a JSON one, else a Buffer. */
function decodeResult(task) {
  return decodePayload(task.result || Buffer.alloc(0), task.headers);
}

module.exports = { CONTENT_TYPE, JSON_TYPE, isJson, decodePayload, encodeResult, encodePayload, decodeResult };
