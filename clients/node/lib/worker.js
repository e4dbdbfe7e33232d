'use strict';
// A lowtide worker for Node.js: one WorkerService.Connect stream carries the hello, assignments,
// batched results, heartbeats, slot changes, cancels and drain (see protos/lowtide/v1/worker.proto).
// The worker keeps a stream up until stop() or close(): after a Drain (the scheduler is going)
// it finishes and reports what it runs, closes that stream and connects again with backoff,
// listing in its hello whatever still runs.
const { EventEmitter } = require('node:events');
const grpc = require('@grpc/grpc-js');
const { loadLowtide } = require('./protos');
const { toMillis } = require('./duration');
const { channelSettings } = require('./security');
const { traceContext, runTraced } = require('./tracing');
const { decodePayload, encodeResult } = require('./codec');

/** Thrown by an activity for a failure that retrying cannot fix: the task fails at once. */
class NonRetryableError extends Error {
  constructor(message) {
    super(message);
    this.name = 'NonRetryableError';
    this.nonRetryable = true;
  }
}

const key = (ref) => `${ref.task_id}:${ref.attempt}`;

// Statuses after which a worker connects again: the scheduler stopped or drained the stream
// (OK, UNAVAILABLE), or the connection broke. Any other status is an error to fix (a refused
// hello, ABORTED when a newer stream took this worker id over), not to retry.
const RECONNECT = new Set([grpc.status.OK, grpc.status.UNAVAILABLE, grpc.status.CANCELLED]);

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
   * @param {number} [options.reconnectInitialMs] first reconnect delay, doubling (default 100)
   * @param {number} [options.reconnectMaxMs] longest reconnect delay (default 5000, and at most a
   *   quarter of the scheduler's lease, so running attempts are kept)
   * @param {number} [options.stopGraceMs] how long stop() lets running attempts finish (default 30000)
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
    reconnectInitialMs = 100,
    reconnectMaxMs = 5000,
    stopGraceMs = 30000,
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
    this.reconnectInitialMs = reconnectInitialMs;
    this.reconnectMaxMs = reconnectMaxMs;
    this.stopGraceMs = stopGraceMs;
    // Checked here, so a missing file or a cert without its key fails at construction.
    this._channel = channelSettings({ token, ca, cert, key });
    this.heartbeatIntervalMs = 2000;
    // While nothing runs: the welcome's idle_heartbeat_interval (null: beat at heartbeatIntervalMs).
    this.idleHeartbeatIntervalMs = null;
    this._lastHeartbeat = 0; // Date.now() of the current stream's last heartbeat (or its welcome)
    // Attempts and unsent results outlive a stream: the next hello lists them, and the results
    // follow its welcome.
    this.running = new Map();
    this._pending = [];
    // stop() was called: no new work, finish, report, close for good.
    this.draining = false;
    this._flushTimer = null;
    this._heartbeatTimer = null;
    this._reconnectTimer = null;
    this._call = null; // the current stream, null while disconnected
    this._welcomed = false; // the current stream's welcome has arrived
    this._halfClosed = false; // the current stream's request side is closed: write nothing more
    this._streamDraining = false; // the scheduler sent Drain on the current stream
    this._delayMs = reconnectInitialMs;
    this._capMs = reconnectMaxMs;
    this._ended = false;
    this.closed = new Promise((resolve) => {
      this._resolveClosed = resolve;
    });
  }

  /**
   * Connects and says hello; resolves with the first Welcome, and rejects (the worker is then
   * closed) when that first stream fails: the scheduler refused the hello, or cannot be reached.
   * From then on the worker keeps a stream up: after a Drain, an UNAVAILABLE or a broken
   * connection it connects again with backoff, listing its running attempts in the hello.
   */
  start() {
    const lowtide = loadLowtide();
    this._client = new lowtide.WorkerService(this.target, this._channel.credentials, this._channel.options);
    const welcomed = new Promise((resolve, reject) => {
      this._welcome = { resolve, reject };
    });
    this._connect();
    return welcomed;
  }

  /** Takes no new work, lets running attempts finish and report, then closes the stream. */
  async stop() {
    if (this._ended) return this.closed;
    if (!this.draining) {
      this.draining = true;
      // Zero slots: the scheduler pushes nothing more while the running attempts finish.
      this._write({ slot_update: { slots: 0 } });
      this._stopTimer = setTimeout(() => this.close(), this.stopGraceMs);
      this._stopTimer.unref?.();
    }
    await this._settle();
    return this.closed;
  }

  /** Closes the stream at once: running attempts are aborted and, unreported, retried elsewhere. */
  close() {
    if (this._ended) return this.closed;
    const call = this._call;
    this._finish(null);
    if (call) call.cancel();
    return this.closed;
  }

  _connect() {
    this._reconnectTimer = null;
    if (this._ended) return;
    const call = this._client.Connect();
    this._call = call;
    this._welcomed = false;
    this._halfClosed = false;
    this._streamDraining = false;
    call.on('data', (message) => this._receive(call, message));
    call.on('error', (error) => this._streamEnded(call, error));
    call.on('end', () => this._streamEnded(call, null));
    call.write({
      hello: {
        worker_id: this.workerId,
        pool: this.pool,
        queues: this.queues,
        activity_types: Object.keys(this.activities).map((name) => ({ name, local: false })),
        slots: this.slots,
        // Still ours from an earlier stream: running, or finished with the result not yet sent.
        running: [...this.running.values()].map((e) => e.ref).concat(this._pending.map((r) => r.task)),
      },
    });
  }

  _receive(call, message) {
    if (call !== this._call) return;
    switch (message.message) {
      case 'welcome': {
        this._welcomed = true;
        this._everWelcomed = true;
        this.workerId = message.welcome.worker_id;
        this.heartbeatIntervalMs = toMillis(message.welcome.heartbeat_interval) || this.heartbeatIntervalMs;
        this.idleHeartbeatIntervalMs = toMillis(message.welcome.idle_heartbeat_interval) || null;
        this._lastHeartbeat = Date.now();
        const lease = toMillis(message.welcome.lease_timeout);
        // Reconnect well within the lease, or the scheduler gives the running attempts away.
        this._capMs = lease > 0 ? Math.min(this.reconnectMaxMs, lease / 4) : this.reconnectMaxMs;
        this._delayMs = this.reconnectInitialMs;
        this._scheduleHeartbeat();
        if (this.draining) this._write({ slot_update: { slots: 0 } });
        this._flush();
        this.emit('welcome', message.welcome);
        if (this._welcome) this._welcome.resolve(message.welcome);
        if (this.draining) this._settle();
        break;
      }
      case 'assignments':
        for (const assignment of message.assignments.assignments) {
          if (this._streamDraining || this.draining) this.emit('declined', assignment.task);
          else this._run(assignment);
        }
        break;
      case 'cancel':
        for (const ref of message.cancel.tasks) this._cancel(ref);
        break;
      case 'drain':
        // The scheduler is going: take nothing new here, finish and report what runs, close
        // this stream, and connect again (the next hello lists whatever still runs).
        this._streamDraining = true;
        this.emit('drain', message.drain.reason, message.drain);
        this._settleStream(call);
        break;
      case 'rejected':
        for (const report of message.rejected.reports) this._forget(report.task);
        this.emit('rejected', message.rejected.reports);
        break;
      default:
        break;
    }
  }

  _run(assignment) {
    const ref = { task_id: assignment.task.task_id, attempt: assignment.task.attempt };
    if (this.running.has(key(ref))) return;
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
      // The task's headers as submitted ({ traceparent: '00-…' }, say); {} for none.
      headers: { ...assignment.headers },
      // Its W3C trace context ({ traceId, spanId, traceFlags, traceState }), or null: see lib/tracing.js.
      trace: traceContext(assignment.headers),
      // Aborted when the scheduler cancels the attempt; its result would not be applied.
      signal: controller.signal,
      heartbeat: () => this._heartbeat(),
    };
    this.emit('assigned', ctx);
    const fn = this.activities[assignment.activity_type];
    entry.done = (async () => {
      if (!fn) throw Object.assign(new Error(`no activity ${assignment.activity_type} here`), { name: 'UnknownActivity' });
      const attributes = {
        'lowtide.task.id': Number(ref.task_id),
        'lowtide.task.attempt': ref.attempt,
        'lowtide.activity_type': assignment.activity_type,
      };
      // A JSON task's payload arrives parsed, and what the activity returns is sent as JSON.
      return runTraced(ctx.trace, attributes, () => fn(decodePayload(assignment.payload, assignment.headers), ctx));
    })().then(
      (value) => this._report(entry, { success: encodeResult(value, assignment.headers) }),
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
    // Disconnected: the results wait for the next stream's welcome.
    if (this._pending.length === 0 || !this._writable()) return;
    const results = this._pending;
    this._pending = [];
    this._call.write({ results: { results } });
    this.emit('reported', results.length);
  }

  _cancel(ref) {
    const entry = this.running.get(key(ref));
    this._pending = this._pending.filter((r) => key(r.task) !== key(ref));
    if (!entry) return;
    this.running.delete(key(ref));
    entry.controller.abort(new Error('cancelled by the scheduler'));
    this.emit('cancelled', ref);
  }

  _forget(ref) {
    const entry = this.running.get(key(ref));
    this._pending = this._pending.filter((r) => key(r.task) !== key(ref));
    if (!entry) return;
    this.running.delete(key(ref));
    entry.controller.abort(new Error('the scheduler refused the report: no longer this worker\'s'));
  }

  _heartbeat() {
    this._write({ heartbeat: { running: [...this.running.values()].map((e) => e.ref) } });
    this._lastHeartbeat = Date.now();
    this._scheduleHeartbeat();
  }

  // Often enough for the lease (the scheduler's interval) and for every running attempt's own
  // heartbeat timeout (three beats per timeout, so one late beat does not lose it); with nothing
  // running and no result unsent, every idle interval the welcome names. Counted from the last
  // heartbeat, so attempts starting often never put the next one off.
  _scheduleHeartbeat() {
    if (this._heartbeatTimer !== null) clearTimeout(this._heartbeatTimer);
    this._heartbeatTimer = null;
    if (!this._writable()) return;
    const idle = this.running.size === 0 && this._pending.length === 0;
    let period = this.heartbeatIntervalMs;
    if (idle && this.idleHeartbeatIntervalMs) period = Math.max(period, this.idleHeartbeatIntervalMs);
    for (const entry of this.running.values()) {
      if (entry.heartbeatTimeoutMs > 0) period = Math.min(period, entry.heartbeatTimeoutMs / 3);
    }
    const delay = Math.max(50, period) - (Date.now() - this._lastHeartbeat);
    this._heartbeatTimer = setTimeout(() => this._heartbeat(), Math.max(0, delay));
  }

  // Everything running finished and reported: then close the stream's request side, and the
  // scheduler ends it. (Attempts started while waiting are waited for too.)
  async _allDone() {
    while (this.running.size > 0) await Promise.allSettled([...this.running.values()].map((e) => e.done));
    this._flush();
  }

  async _settleStream(call) {
    await this._allDone();
    if (call === this._call) this._halfClose();
  }

  async _settle() {
    await this._allDone();
    this._halfClose();
  }

  _halfClose() {
    if (!this._writable()) return;
    this._halfClosed = true;
    if (this._heartbeatTimer !== null) clearTimeout(this._heartbeatTimer);
    this._heartbeatTimer = null;
    this._call.end();
  }

  _writable() {
    return this._call !== null && this._welcomed && !this._halfClosed && !this._ended;
  }

  _write(message) {
    if (this._writable()) this._call.write(message);
  }

  _streamEnded(call, error) {
    if (call !== this._call || this._ended) return;
    this._call = null;
    this._welcomed = false;
    if (this._heartbeatTimer !== null) clearTimeout(this._heartbeatTimer);
    this._heartbeatTimer = null;
    if (this.draining && this.running.size === 0 && this._pending.length === 0) {
      this._finish(null);
      return;
    }
    const code = error ? error.code : grpc.status.OK;
    // The first stream must be welcomed (start() rejects otherwise); later ones are retried.
    if (!this._everWelcomed || !RECONNECT.has(code)) {
      this._finish(error);
      return;
    }
    const delay = this._delayMs;
    this._delayMs = Math.min(this._delayMs * 2, this._capMs);
    this.emit('reconnecting', { delayMs: delay, reason: error ? error.details || error.message : 'stream ended' });
    this._reconnectTimer = setTimeout(() => this._connect(), delay);
  }

  _finish(error) {
    if (this._ended) return;
    this._ended = true;
    for (const timer of [this._flushTimer, this._heartbeatTimer, this._reconnectTimer, this._stopTimer]) {
      if (timer) clearTimeout(timer);
    }
    for (const entry of this.running.values()) entry.controller.abort(new Error('worker closed'));
    this._call = null;
    if (this._welcome) this._welcome.reject(error || new Error('the worker closed before a welcome'));
    if (this._client) this._client.close();
    if (error) this.emit('error', error);
    this.emit('closed', error);
    this._resolveClosed(error);
  }
}

module.exports = { Worker, NonRetryableError };
