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
const { runTraced } = require('./tracing');
const { decodePayload, encodeResult, describe } = require('./codec');
const { DEADLINE_GRACE_MS, DETAILS_DELAY_MS, encodeDetails, makeContext, toDate } = require('./context');

/** Thrown by an activity for a failure that retrying cannot fix: the task fails at once. */
class NonRetryableError extends Error {
  constructor(message) {
    super(message);
    this.name = 'NonRetryableError';
    this.nonRetryable = true;
  }
}

const key = (ref) => `${ref.task_id}:${ref.attempt}`;

/**
 * The TaskFailure for whatever an activity threw: an Error, or any other value (a string, null,
 * an object without a usable toString). Never throws, so a failure is always reported.
 */
function failureOf(error) {
  let errorType = 'Error';
  let nonRetryable = false;
  try {
    if (error && typeof error.name === 'string' && error.name) errorType = error.name;
    nonRetryable = Boolean(error && error.nonRetryable);
  } catch {
    // A getter that throws: the defaults say enough.
  }
  return { error_type: errorType, message: describe(error), non_retryable: nonRetryable };
}

// How long a stopping worker waits for the scheduler to answer its zero slots (a round trip,
// normally) before it stops waiting.
const ANSWER_TIMEOUT_MS = 5000;

// Statuses after which a worker connects again: the scheduler stopped or drained the stream
// (OK, UNAVAILABLE), or the connection broke (CANCELLED; INTERNAL, which the scheduler never
// ends a stream with, is what a proxy in front reports when its connection to the scheduler
// resets). Any other status is an error to fix (a refused hello, ABORTED when a newer stream took
// this worker id over), not to retry.
const RECONNECT = new Set([grpc.status.OK, grpc.status.UNAVAILABLE, grpc.status.CANCELLED, grpc.status.INTERNAL]);

class Worker extends EventEmitter {
  /** @param {import('../index').WorkerOptions} options (each one is described in index.d.ts) */
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
    logger = console,
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
    this.logger = logger;
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
    this._detailsTimer = null; // a heartbeat soon, for details an activity reported
    this._reconnectTimer = null;
    this._call = null; // the current stream, null while disconnected
    this._welcomed = false; // the current stream's welcome has arrived
    this._halfClosed = false; // the current stream's request side is closed: write nothing more
    this._streamDraining = false; // the scheduler sent Drain on the current stream
    this._answered = false; // the current stream's scheduler answers a SlotUpdate (slots_taken)
    this._slotsTaken = null; // while stopping: resolved once nothing more is on its way to us
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
      this._askForNoSlots();
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
    this._assignmentsRead = 0; // assignment entries read on this stream (Heartbeat.assignments_read)
    call.on('data', (message) => this._receive(call, message));
    call.on('error', (error) => this._streamEnded(call, error));
    call.on('end', () => this._streamEnded(call, null));
    call.write({
      hello: {
        worker_id: this.workerId,
        pool: this.pool,
        queues: this.queues,
        activity_types: Object.keys(this.activities).map((name) => ({ name, local: false })),
        // Stopping, it connects only to report: one slot (the fewest a hello may name), filled by
        // what it lists, so the scheduler's first claim for the stream finds none free.
        slots: this.draining ? 1 : this.slots,
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
        this._answered = Boolean(message.welcome.answers_slot_updates);
        this._scheduleHeartbeat();
        if (this.draining) this._askForNoSlots();
        this._flush();
        this.emit('welcome', message.welcome);
        if (this._welcome) this._welcome.resolve(message.welcome);
        if (this.draining) this._settle();
        break;
      }
      case 'assignments':
        this._assignmentsRead += message.assignments.assignments.length;
        for (const assignment of message.assignments.assignments) {
          // Sent before the scheduler took in our stop: it runs, unless the stream can no longer
          // carry its result (then the scheduler gives it to another worker as WorkerLost).
          if (this._streamDraining || this._halfClosed) this.emit('declined', assignment.task);
          else this._run(assignment);
        }
        break;
      case 'cancel':
        for (const ref of message.cancel.tasks) this._cancel(ref);
        break;
      case 'slots_taken':
        if (!message.slots_taken.slots) this._slotsTakenResolve();
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
    const deadline = toDate(assignment.start_to_close_deadline);
    const entry = { ref, controller, heartbeatTimeoutMs: toMillis(assignment.heartbeat_timeout), details: null };
    this.running.set(key(ref), entry);
    // Past its deadline (and a grace for clock skew) the scheduler has failed the attempt: abort it.
    const untilDeadline = deadline === null ? null : deadline.getTime() - Date.now() + DEADLINE_GRACE_MS;
    if (untilDeadline !== null && untilDeadline < 2 ** 31 - 1) {
      entry.deadlineTimer = setTimeout(() => this._drop(entry, 'its start-to-close deadline passed'), Math.max(0, untilDeadline));
    }
    this._scheduleHeartbeat();
    const heartbeat = (details) => this._reportDetails(entry, details);
    const ctx = makeContext({ assignment, ref, controller, deadline, logger: this.logger, heartbeat });
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
      const value = await runTraced(ctx.trace, attributes, () =>
        fn(decodePayload(assignment.payload, assignment.headers), ctx),
      );
      // A result that cannot be encoded fails this attempt (a TypeError saying why), here, where
      // the failure is reported like any other: never an unhandled rejection that ends the process.
      return encodeResult(value, assignment.headers);
    })().then(
      (success) => this._report(entry, { success }),
      (error) => this._report(entry, { failure: failureOf(error) }),
    );
  }

  _report(entry, outcome) {
    // A cancelled attempt is no longer this worker's: its slot is already free, and a report
    // would only be refused.
    if (this.running.get(key(entry.ref)) !== entry) return;
    // Details reported just before the end go first, while the attempt still runs.
    if (entry.details !== null) this._heartbeat();
    this._drop(entry, null);
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
    this._drop(entry, 'cancelled by the scheduler');
    this.emit('cancelled', ref);
  }

  _forget(ref) {
    const entry = this.running.get(key(ref));
    this._pending = this._pending.filter((r) => key(r.task) !== key(ref));
    if (entry) this._drop(entry, "the scheduler refused the report: no longer this worker's");
  }

  // The attempt is no longer running here: finished (reason null) or taken away (its signal is
  // aborted with the reason, and its result will not be reported).
  _drop(entry, reason) {
    if (this.running.get(key(entry.ref)) !== entry) return;
    this.running.delete(key(entry.ref));
    if (entry.deadlineTimer) clearTimeout(entry.deadlineTimer);
    if (reason !== null) entry.controller.abort(new Error(reason));
  }

  // ctx.heartbeat(): at once without details; with details (the newest wins) within DETAILS_DELAY_MS.
  _reportDetails(entry, details) {
    if (details === undefined) {
      this._heartbeat();
      return;
    }
    const data = encodeDetails(details);
    if (this.running.get(key(entry.ref)) !== entry) return;
    entry.details = data;
    if (this._detailsTimer === null) this._detailsTimer = setTimeout(() => this._heartbeat(), DETAILS_DELAY_MS);
  }

  _heartbeat() {
    if (this._detailsTimer !== null) clearTimeout(this._detailsTimer);
    this._detailsTimer = null;
    if (this._writable()) {
      const entries = [...this.running.values()];
      const details = entries.filter((e) => e.details !== null).map((e) => ({ task: e.ref, details: e.details }));
      for (const entry of entries) entry.details = null;
      const running = entries.map((e) => e.ref);
      // Every attempt still ours (results not yet sent included), and how many assignments were
      // read meanwhile: the scheduler hands out again what it sent and this worker never got.
      // Not while stopping: attempts given up then are lost (WorkerLost), not put back.
      const heartbeat = { running: running.concat(this._pending.map((r) => r.task)), details };
      if (!(this.draining || this._streamDraining || this._halfClosed)) heartbeat.assignments_read = this._assignmentsRead;
      this._call.write({ heartbeat });
      this._lastHeartbeat = Date.now();
      this.emit('heartbeat', running);
    }
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
    // Until the scheduler has taken our zero slots in, work it sent before may still arrive
    // (waited for ANSWER_TIMEOUT_MS at most: a scheduler that does not answer is not waited on).
    while (this._slotsTaken) await this._slotsTaken.promise;
    await this._allDone();
    this._halfClose();
  }

  // Zero slots, asking the scheduler to say when it has taken that in (slots_taken); a scheduler
  // that does not answer (older than the field) is not waited for.
  _askForNoSlots() {
    if (!this._writable()) return;
    if (this._answered && !this._slotsTaken) {
      let resolve;
      const promise = new Promise((done) => {
        resolve = done;
      });
      const timer = setTimeout(() => this._slotsTakenResolve(), ANSWER_TIMEOUT_MS);
      timer.unref?.();
      this._slotsTaken = { promise, resolve, timer };
    }
    this._write({ slot_update: { slots: 0, answer: true } });
  }

  _slotsTakenResolve() {
    if (this._slotsTaken === null) return;
    clearTimeout(this._slotsTaken.timer);
    this._slotsTaken.resolve();
    this._slotsTaken = null;
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
    this._slotsTakenResolve(); // nothing more can come on this stream
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
    this._slotsTakenResolve();
    for (const timer of [this._flushTimer, this._heartbeatTimer, this._detailsTimer, this._reconnectTimer, this._stopTimer]) {
      if (timer) clearTimeout(timer);
    }
    for (const entry of [...this.running.values()]) this._drop(entry, 'worker closed');
    this._call = null;
    if (this._welcome) this._welcome.reject(error || new Error('the worker closed before a welcome'));
    if (this._client) this._client.close();
    if (error) this.emit('error', error);
    this.emit('closed', error);
    this._resolveClosed(error);
  }
}

module.exports = { Worker, NonRetryableError };
