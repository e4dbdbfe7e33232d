'use strict';
// A small promise-based client of SchedulerService: submit, get, wait, cancel.
const { loadLowtide } = require('./protos');
const { fromMillis } = require('./duration');
const { channelSettings } = require('./security');
const { encodePayload } = require('./codec');
const { SubmitStream } = require('./submit_stream');

function timestamp(name, date) {
  if (!(date instanceof Date) || Number.isNaN(date.getTime())) {
    throw new TypeError(`${name} must be a valid Date (got ${String(date)})`);
  }
  const ms = date.getTime();
  const seconds = Math.floor(ms / 1000);
  return { seconds, nanos: (ms - seconds * 1000) * 1e6 };
}

// A list of pool names: a bare string would be spread into letters, each sent as a pool.
function poolNames(pools) {
  if (!Array.isArray(pools) || !pools.every((p) => typeof p === 'string')) {
    throw new TypeError(`pools must be an array of pool names (got ${JSON.stringify(pools)})`);
  }
  return [...pools];
}

class SchedulerClient {
  /** `security`: { token, ca, cert, key } (see security.js), e.g. `fromEnv()`; plaintext without. */
  constructor(target, security = {}) {
    const lowtide = loadLowtide();
    const { credentials, options } = channelSettings(security);
    this._stub = new lowtide.SchedulerService(target, credentials, options);
    // Every submit of this client on one SubmitStream (SubmitTask where the scheduler has none).
    this._submits = new SubmitStream(this._stub, (task) => this._call('SubmitTask', { task }));
  }

  _call(method, request) {
    return new Promise((resolve, reject) => {
      this._stub[method](request, (error, response) => (error ? reject(error) : resolve(response)));
    });
  }

  /**
   * Submits one task and returns it as stored. `payload` is a Buffer or a string (sent as it is),
   * or any other value, sent as JSON with `content-type: application/json`, which a typed
   * Python activity decodes into its parameter's type; `decodeResult(task)` reads the result.
   */
  async submit(activityType, payload = '', options = {}) {
    const encoded = encodePayload(payload, options.headers || {});
    const task = {
      activity_type: activityType,
      payload: encoded.payload,
      queue: options.queue || '',
    };
    if (options.maxAttempts) task.retry_policy = { max_attempts: options.maxAttempts };
    if (options.heartbeatTimeoutMs) task.heartbeat_timeout = fromMillis(options.heartbeatTimeoutMs);
    if (options.startToCloseTimeoutMs) task.start_to_close_timeout = fromMillis(options.startToCloseTimeoutMs);
    if (Object.keys(encoded.headers).length > 0) task.headers = encoded.headers;
    // The pools it may run in (configured [pools.NAME]); none: any pool that runs its type.
    if (options.pools !== undefined && options.pools !== null) task.pools = poolNames(options.pools);
    // A deferrable task's window: finish by `deadline` or start by `latestStart` (Dates), running
    // about `estimatedDurationMs`; the scheduler plans its release (with pools, where and when).
    if (options.deadline !== undefined) task.deadline = timestamp('deadline', options.deadline);
    if (options.latestStart !== undefined) task.latest_start = timestamp('latestStart', options.latestStart);
    if (options.estimatedDurationMs) task.estimated_duration = fromMillis(options.estimatedDurationMs);
    return (await this._submits.submit(task)).task;
  }

  async get(id) {
    return (await this._call('GetTask', { id })).task;
  }

  /** Waits up to `timeoutMs` for the task to finish; returns it, finished or not. */
  async wait(id, timeoutMs = 10000) {
    return (await this._call('WaitTask', { id, timeout: fromMillis(timeoutMs) })).task;
  }

  async cancel(id) {
    return (await this._call('CancelTask', { id })).task;
  }

  close() {
    this._submits.close();
    this._stub.close();
  }
}

module.exports = { SchedulerClient };
