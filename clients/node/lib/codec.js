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

/**
 * The result bytes: for a JSON task anything but a Buffer is JSON-encoded; else a Buffer, a
 * string (UTF-8) or nothing (null, undefined). Any other value throws a TypeError that says what
 * to return instead: the worker fails that attempt with it.
 */
function encodeResult(value, headers) {
  if (Buffer.isBuffer(value) || value instanceof Uint8Array) return Buffer.from(value);
  if (isJson(headers)) {
    if (value === undefined) return Buffer.alloc(0);
    let text;
    try {
      text = JSON.stringify(value);
    } catch (error) {
      throw new TypeError(`the result cannot be encoded as JSON: ${describe(error)}`);
    }
    // JSON.stringify gives undefined for a function or a symbol.
    if (text === undefined) throw new TypeError(`the result cannot be encoded as JSON: a ${typeof value}`);
    return Buffer.from(text, 'utf8');
  }
  if (value === undefined || value === null) return Buffer.alloc(0);
  if (typeof value === 'string') return Buffer.from(value, 'utf8');
  throw new TypeError(
    `the result is ${Array.isArray(value) ? 'an array' : typeof value === 'object' ? 'an object' : `a ${typeof value}`}, and the task is not JSON (no ${CONTENT_TYPE}: ${JSON_TYPE} ` +
      'header): return a Buffer or a string, or submit the task as JSON (SchedulerClient.submit with an object, ' +
      '`lowtide task submit --json-payload`)',
  );
}

/** An error's message, or a word for a thrown value that has none (never throws). */
function describe(error) {
  try {
    if (error && typeof error === 'object' && typeof error.message === 'string' && error.message) return error.message;
    return String(error);
  } catch {
    return `a thrown ${typeof error} that cannot be turned into text`;
  }
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

module.exports = { CONTENT_TYPE, JSON_TYPE, isJson, decodePayload, encodeResult, encodePayload, decodeResult, describe };
