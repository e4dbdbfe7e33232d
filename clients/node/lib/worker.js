'use strict';
// A lowtide worker for Node.js: one WorkerService.Connect stream carries the hello, assignments,
// batched results, heartbeats, slot changes, cancels and drain (see protos/lowtide/v1/worker.proto).
const { EventEmitter } = require('node:events');
const grpc = require('@grpc/grpc-js');
const { loadLowtide } = require('./protos');
const { toMillis } = require('./duration');
const { channelSettings } = require('./security');

/** Thrown by an activity for a failure that retrying cannot fix: the task fails at once. */
class NonRetryableError extends Error {
  constructor(message) {
    super(message);
    this.name = 'NonRetryableError';
    this.nonRetryable = true;
  }
}

const key = (ref) => `${ref.task_id}:${ref.attempt}`;

class Worker extends EventEmitter {
  /**
   * @param {object} options
   * @param {string} options.target scheduler address, host:port
   * @param {Record<string, (payload: Buffer, ctx: object) => any>} options.activities by type name
   * @param {string} [options.pool] default "default"
   * @param {string[]} [options.queues] default ["default"]
   * @param {number} [options.slots] attempts run at once, default 4
   * @param {string} [options.workerId] stable across reconnects; the scheduler picks one when empty
   * @param {number} [options.resultDelayMs] results finished this close together go in one message
   * @param {string} [options.token] bearer token (a worker-role token when the scheduler has auth on)
   * @param {string|Buffer} [options.ca] TLS: the CA to trust (PEM text, Buffer or file path)
   * @param {string|Buffer} [options.cert] mutual TLS: this worker's certificate, with `key`
   * @param {string|Buffer} [options.key] mutual TLS: its private key
   */
  constructor({
    target,
    activities,
    pool = 'default',
    queues = ['default'],
    slots = 4,
    workerId = '',
    resultDelayMs = 5,
    token,
    ca,
    cert,
    key,
  }) {
    super();
    if (!target) throw new Error('target is required (host:port of the scheduler)');
    if (!activities || Object.keys(activities).length === 0) throw new Error('register at least one activity');
    if (!Number.isInteger(slots) || slots < 1) throw new Error('slots must be a positive integer');
    this.target = target;
    this.activities = activities;
    this.pool = pool;
    this.queues = queues;
    this.slots = slots;
    this.workerId = workerId;
    this.resultDelayMs = resultDelayMs;
    // Checked here, so a missing file or a cert without its key fails at construction.
    this._channel = channelSettings({ token, ca, cert, key });
    this.heartbeatIntervalMs = 2000;
    this.running = new Map();
    this.draining = false;
    this._pending = [];
    this._flushTimer = null;
    this._heartbeatTimer = null;
    this._call = null;
    this._ended = false;
    this.closed = new Promise((resolve) => {
      this._resolveClosed = resolve;
    });
  }

  /** Connects and says hello; resolves with the Welcome once the scheduler accepted it. */
  start() {
    const lowtide = loadLowtide();
    this._client = new lowtide.WorkerService(this.target, this._channel.credentials, this._channel.options);
    const call = this._client.Connect();
    this._call = call;
    const welcomed = new Promise((resolve, reject) => {
      this._welcome = { resolve, reject };
    });
    call.on('data', (message) => this._receive(message));
    call.on('error', (error) => this._finish(error));
    call.on('end', () => this._finish(null));
    call.write({
      hello: {
        worker_id: this.workerId,
        pool: this.pool,
        queues: this.queues,
        activity_types: Object.keys(this.activities).map((name) => ({ name, local: false })),
        slots: this.slots,
      },
    });
    return welcomed;
  }

  /** Takes no new work, lets running attempts finish and report, then closes the stream. */
  async stop() {
    if (this._ended) return this.closed;
    if (!this.draining) {
      this.draining = true;
      // Zero slots: the scheduler pushes nothing more while the running attempts finish.
      this._write({ slot_update: { slots: 0 } });
    }
    await this._settle();
    return this.closed;
  }

  /** Closes the stream at once: running attempts are aborted and, unreported, retried elsewhere. */
  close() {
    if (this._call && !this._ended) this._call.cancel();
    else if (!this._call) this._finish(null);
    return this.closed;
  }

  _receive(message) {
    switch (message.message) {
      case 'welcome':
        this.workerId = message.welcome.worker_id;
        this.heartbeatIntervalMs = toMillis(message.welcome.heartbeat_interval) || this.heartbeatIntervalMs;
        this._scheduleHeartbeat();
        this.emit('welcome', message.welcome);
        this._welcome.resolve(message.welcome);
        break;
      case 'assignments':
        for (const assignment of message.assignments.assignments) this._run(assignment);
        break;
      case 'cancel':
        for (const ref of message.cancel.tasks) this._cancel(ref);
        break;
      case 'drain':
        this.draining = true;
        this.emit('drain', message.drain.reason);
        this._settle();
        break;
      case 'rejected':
        this.emit('rejected', message.rejected.reports);
        break;
      default:
        break;
    }
  }

  _run(assignment) {
    const ref = { task_id: assignment.task.task_id, attempt: assignment.task.attempt };
    const controller = new AbortController();
    const entry = {
      ref,
      controller,
      heartbeatTimeoutMs: toMillis(assignment.heartbeat_timeout),
    };
    this.running.set(key(ref), entry);
    this._scheduleHeartbeat();
    const ctx = {
      taskId: ref.task_id,
      attempt: ref.attempt,
      activityType: assignment.activity_type,
      queue: assignment.queue,
      // Aborted when the scheduler cancels the attempt; its result would not be applied.
      signal: controller.signal,
      heartbeat: () => this._heartbeat(),
    };
    this.emit('assigned', ctx);
    const fn = this.activities[assignment.activity_type];
    entry.done = (async () => {
      if (!fn) throw Object.assign(new Error(`no activity ${assignment.activity_type} here`), { name: 'UnknownActivity' });
      return fn(Buffer.from(assignment.payload), ctx);
    })().then(
      (value) => this._report(entry, { success: Buffer.from(value ?? '') }),
      (error) =>
        this._report(entry, {
          failure: {
            error_type: (error && error.name) || 'Error',
            message: String((error && error.message) || error),
            non_retryable: Boolean(error && error.nonRetryable),
          },
        }),
    );
  }

  _report(entry, outcome) {
    // A cancelled attempt is no longer this worker's: its slot is already free, and a report
    // would only be refused.
    if (this.running.get(key(entry.ref)) !== entry) return;
    this.running.delete(key(entry.ref));
    this._pending.push({ task: entry.ref, ...outcome });
    if (this._flushTimer === null) this._flushTimer = setTimeout(() => this._flush(), this.resultDelayMs);
    this.emit('finished', entry.ref, outcome);
  }

  _flush() {
    if (this._flushTimer !== null) clearTimeout(this._flushTimer);
    this._flushTimer = null;
    if (this._pending.length === 0) return;
    const results = this._pending;
    this._pending = [];
    this._write({ results: { results } });
    this.emit('reported', results.length);
  }

  _cancel(ref) {
    const entry = this.running.get(key(ref));
    if (!entry) return;
    this.running.delete(key(ref));
    entry.controller.abort(new Error('cancelled by the scheduler'));
    this.emit('cancelled', ref);
  }

  _heartbeat() {
    this._write({ heartbeat: { running: [...this.running.values()].map((e) => e.ref) } });
    this._scheduleHeartbeat();
  }

  // Often enough for the lease (the scheduler's interval) and for every running attempt's own
  // heartbeat timeout (three beats per timeout, so one late beat does not lose it).
  _scheduleHeartbeat() {
    if (this._ended) return;
    let delay = this.heartbeatIntervalMs;
    for (const entry of this.running.values()) {
      if (entry.heartbeatTimeoutMs > 0) delay = Math.min(delay, entry.heartbeatTimeoutMs / 3);
    }
    if (this._heartbeatTimer !== null) clearTimeout(this._heartbeatTimer);
    this._heartbeatTimer = setTimeout(() => this._heartbeat(), Math.max(50, delay));
  }

  async _settle() {
    await Promise.allSettled([...this.running.values()].map((e) => e.done));
    this._flush();
    if (this._call && !this._ended) this._call.end();
  }

  _write(message) {
    if (this._call && !this._ended) this._call.write(message);
  }

  _finish(error) {
    if (this._ended) return;
    this._ended = true;
    for (const timer of [this._flushTimer, this._heartbeatTimer]) if (timer !== null) clearTimeout(timer);
    for (const entry of this.running.values()) entry.controller.abort(new Error('stream closed'));
    if (this._welcome) this._welcome.reject(error || new Error('the scheduler ended the stream before its welcome'));
    if (this._client) this._client.close();
    if (error && error.code !== grpc.status.CANCELLED) this.emit('error', error);
    this.emit('closed', error);
    this._resolveClosed(error);
  }
}

module.exports = { Worker, NonRetryableError };
