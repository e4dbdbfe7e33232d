'use strict';
// What an activity gets beside its payload (`ctx`, see index.d.ts ActivityContext): its task and
// attempt, the start-to-close deadline, the task's headers and trace context, heartbeats with
// details (stored on the task, shown by `lowtide task get`), cancellation (`ctx.signal`, aborted
// when the scheduler cancels the attempt, its deadline passes or the worker closes) and a logger
// whose lines carry the task id. The same as the Python client's `lowtide_client.activity.context()`.
const { traceContext } = require('./tracing');

/** Heartbeat details are at most this many bytes encoded (the scheduler ends a stream that sends more). */
const MAX_DETAILS_BYTES = 4096;
/** An attempt still running this long after its deadline is abandoned (the scheduler has failed it). */
const DEADLINE_GRACE_MS = 5000;
/** Reported heartbeat details go out within about this long (several reports in between: the last wins). */
const DETAILS_DELAY_MS = 100;
const LEVELS = ['debug', 'info', 'warn', 'error'];

/** Details as bytes: a Buffer as it is, a string as UTF-8, anything else as JSON; none: empty. */
function encodeDetails(details) {
  let data;
  if (details === undefined || details === null) data = Buffer.alloc(0);
  else if (Buffer.isBuffer(details) || details instanceof Uint8Array) data = Buffer.from(details);
  else if (typeof details === 'string') data = Buffer.from(details, 'utf8');
  else data = Buffer.from(JSON.stringify(details), 'utf8');
  if (data.length > MAX_DETAILS_BYTES) {
    throw new RangeError(`heartbeat details are ${data.length} bytes; the limit is ${MAX_DETAILS_BYTES}`);
  }
  return data;
}

/** A google.protobuf.Timestamp as a Date; null when unset. */
function toDate(timestamp) {
  if (!timestamp) return null;
  const ms = Number(timestamp.seconds || 0) * 1000 + Math.floor(Number(timestamp.nanos || 0) / 1e6);
  return ms > 0 ? new Date(ms) : null;
}

/**
 * The attempt's logger. A logger with `child()` (pino, bunyan, winston) gets a child bound to
 * { task_id, attempt, activity_type }; any other (console by default) gets its lines prefixed
 * with `task_id=… attempt=…`, as the Python client's activity logger writes them.
 */
function taskLogger(base, fields) {
  if (typeof base.child === 'function') return base.child(fields);
  const prefix = `task_id=${fields.task_id} attempt=${fields.attempt}`;
  const logger = { fields };
  for (const level of LEVELS) {
    const write = typeof base[level] === 'function' ? base[level] : base.log;
    logger[level] = (message, ...rest) => write.call(base, `${prefix} ${message}`, ...rest);
  }
  return logger;
}

/**
 * The ctx of one attempt. `heartbeat(details)` is the worker's: it sends (or, with details,
 * schedules) a heartbeat for this attempt.
 */
function makeContext({ assignment, ref, controller, deadline, logger, heartbeat }) {
  const fields = { task_id: ref.task_id, attempt: ref.attempt, activity_type: assignment.activity_type };
  return {
    taskId: ref.task_id,
    attempt: ref.attempt,
    activityType: assignment.activity_type,
    queue: assignment.queue,
    // The start-to-close deadline on the scheduler's clock, or null for a task without one.
    deadline,
    // The task's headers as submitted ({ traceparent: '00-…' }, say); {} for none.
    headers: { ...assignment.headers },
    // Its W3C trace context ({ traceId, spanId, traceFlags, traceState }), or null: see lib/tracing.js.
    trace: traceContext(assignment.headers),
    // Aborted when the attempt is cancelled; its result would not be applied.
    signal: controller.signal,
    get cancelled() {
      return controller.signal.aborted;
    },
    throwIfCancelled() {
      controller.signal.throwIfAborted();
    },
    heartbeat,
    logger: taskLogger(logger, fields),
  };
}

module.exports = { DEADLINE_GRACE_MS, DETAILS_DELAY_MS, MAX_DETAILS_BYTES, encodeDetails, makeContext, toDate };
