'use strict';
// Single submits over one SchedulerService.SubmitStream call: every `submit` of a client goes out
// on one long-lived stream, answered by its `ref`, instead of a SubmitTask call each (a call costs
// the scheduler several times what a submit on the stream does). The submits made in one turn of
// the event loop go out together in one message; nothing waits to fill one. What the caller sees
// is what SubmitTask gives: the stored task, or an error with the `code`, `details` and
// `metadata` (the binary trailing metadata) the scheduler chose. A scheduler without SubmitStream
// (UNIMPLEMENTED) is sent SubmitTask calls from then on; a stream that breaks (UNAVAILABLE) sends
// the submits it had not answered as SubmitTask calls, with the caveat of any retry: one sent just
// before it broke may have been stored, and an idempotency key makes that safe.
const grpc = require('@grpc/grpc-js');

// The most submits the scheduler takes in one message.
const MAX_SUBMITS_PER_MESSAGE = 1000;
// Submits go together while their message stays within about this (a larger one goes alone, as
// a SubmitTask call would carry it): well within any receive limit a scheduler sets.
const MESSAGE_BYTES = 1024 * 1024;
// A submit's size beside its payload, counted generously (its headers are few and short).
const SUBMIT_OVERHEAD_BYTES = 1024;
// A stream with nothing unanswered is ended after this long: an open call keeps a Node process
// alive, and a script's last submit should not.
const IDLE_MS = 200;

function submitError(code, details, metadata = new grpc.Metadata()) {
  const error = new Error(`${code} ${grpc.status[code] || 'UNKNOWN'}: ${details}`);
  return Object.assign(error, { code, details, metadata });
}

function answerError({ code, message, trailing }) {
  const metadata = new grpc.Metadata();
  for (const [key, value] of Object.entries(trailing || {})) metadata.add(key, Buffer.from(value));
  return submitError(code, message, metadata);
}

function submitBytes({ task }) {
  return (task.payload ? task.payload.length : 0) + SUBMIT_OVERHEAD_BYTES;
}

class SubmitStream {
  /** `unary(task)`: the submit as a SubmitTask call (its response), where the stream is not. */
  constructor(stub, unary) {
    this._stub = stub;
    this._unary = unary;
    this._nextRef = 1;
    this._onlyUnary = false;
    this._stream = null;
  }

  submit(task) {
    if (this._onlyUnary) return this._unary(task);
    const stream = this._stream || this._open();
    const ref = this._nextRef++;
    clearTimeout(stream.idle);
    return new Promise((resolve, reject) => {
      stream.waiting.set(ref, { task, resolve, reject });
      stream.outbox.push({ ref, task });
      if (stream.outbox.length === 1) setImmediate(() => this._flush(stream));
    });
  }

  _open() {
    const call = this._stub.SubmitStream();
    const stream = { call, outbox: [], waiting: new Map(), ended: false, idle: undefined };
    call.on('data', (message) => {
      for (const answer of message.answers) {
        const waiting = stream.waiting.get(answer.ref);
        if (waiting === undefined) continue;
        stream.waiting.delete(answer.ref);
        if (answer.outcome === 'submitted') waiting.resolve(answer.submitted);
        else waiting.reject(answerError(answer.error));
      }
      if (stream.waiting.size === 0) stream.idle = setTimeout(() => this._end(stream), IDLE_MS).unref();
    });
    call.on('error', (error) => this._ended(stream, error));
    call.on('end', () => this._ended(stream, submitError(grpc.status.UNAVAILABLE, 'the submit stream ended')));
    this._stream = stream;
    return stream;
  }

  _flush(stream) {
    while (stream.outbox.length > 0 && !stream.ended) {
      let count = 1;
      let size = submitBytes(stream.outbox[0]);
      while (count < stream.outbox.length && count < MAX_SUBMITS_PER_MESSAGE) {
        size += submitBytes(stream.outbox[count]);
        if (size > MESSAGE_BYTES) break;
        count += 1;
      }
      stream.call.write({ submits: stream.outbox.splice(0, count) });
    }
  }

  // Every submit it had not answered: sent as SubmitTask calls (UNAVAILABLE, UNIMPLEMENTED), or
  // failed with the stream's error.
  _ended(stream, error) {
    if (stream.ended) return;
    stream.ended = true;
    if (this._stream === stream) this._stream = null;
    if (error.code === grpc.status.UNIMPLEMENTED) this._onlyUnary = true;
    const again = error.code === grpc.status.UNIMPLEMENTED || error.code === grpc.status.UNAVAILABLE;
    for (const { task, resolve, reject } of stream.waiting.values()) {
      if (again) this._unary(task).then(resolve, reject);
      else reject(error);
    }
    stream.waiting.clear();
  }

  // Ends an idle stream; the next submit opens another.
  _end(stream) {
    if (stream.waiting.size === 0 && !stream.ended) this._close(stream);
  }

  _close(stream) {
    clearTimeout(stream.idle);
    stream.ended = true;
    if (this._stream === stream) this._stream = null;
    stream.call.end();
  }

  close() {
    if (this._stream !== null) this._close(this._stream);
  }
}

module.exports = { SubmitStream, MAX_SUBMITS_PER_MESSAGE };
