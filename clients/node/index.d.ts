// Type declarations of the public API of lowtide-worker (lib/index.js), written by hand.
import { EventEmitter } from 'node:events';

/** Token and TLS settings of a connection; plaintext without any. */
export interface Security {
  /** Bearer token (a worker-role token for a worker when the scheduler has auth on). */
  token?: string;
  /** TLS: the CA to trust (PEM text, Buffer or file path). */
  ca?: string | Buffer;
  /** Mutual TLS: this side's certificate, with `key`. */
  cert?: string | Buffer;
  /** Mutual TLS: its private key. */
  key?: string | Buffer;
}

/** A W3C trace context taken from a task's `traceparent` header. */
export interface TraceContext {
  traceId: string;
  spanId: string;
  traceFlags: number;
  traceState?: string;
}

/** The logger of an attempt: its lines carry the task id and attempt (see WorkerOptions.logger). */
export interface TaskLogger {
  debug(message: unknown, ...rest: unknown[]): void;
  info(message: unknown, ...rest: unknown[]): void;
  warn(message: unknown, ...rest: unknown[]): void;
  error(message: unknown, ...rest: unknown[]): void;
  [key: string]: unknown;
}

/** What an activity is given beside its payload. */
export interface ActivityContext {
  taskId: number;
  /** 1 for the first attempt, then 2, 3… on each retry. */
  attempt: number;
  activityType: string;
  queue: string;
  /** The start-to-close deadline (on the scheduler's clock), or null for a task without one. */
  deadline: Date | null;
  /** The task's headers as submitted; {} for none. */
  headers: Record<string, string>;
  /** Its trace context, or null. */
  trace: TraceContext | null;
  /**
   * Aborted when the attempt is cancelled: the scheduler cancels it, its deadline passes (with 5 s
   * of grace), or the worker closes. Its result would not be applied.
   */
  signal: AbortSignal;
  /** True once `signal` is aborted. */
  readonly cancelled: boolean;
  /** Throws the abort reason once cancelled (`signal.throwIfAborted()`). */
  throwIfCancelled(): void;
  /**
   * Tells the scheduler the attempt is alive (for tasks with a heartbeat timeout). With details
   * (a Buffer as it is, a string as UTF-8, anything else as JSON; at most 4096 bytes, else a
   * RangeError) they are stored on the task, the newest winning, and shown by `lowtide task get`
   * (Task.heartbeat_details); they go out within about 100 ms.
   */
  heartbeat(details?: unknown): void;
  /** Lines carrying task_id and attempt: a child of WorkerOptions.logger, or it with a prefix. */
  logger: TaskLogger;
  [key: string]: unknown;
}

/**
 * An activity: gets the payload (a Buffer, or the parsed value of a JSON task, one with
 * `content-type: application/json`) and returns (or resolves to) the result: a Buffer or a string,
 * or for a JSON task any value, sent as JSON. Throws to fail the attempt.
 */
export type Activity = (payload: any, ctx: ActivityContext) => unknown;

export interface WorkerOptions extends Security {
  /** Scheduler address, host:port. */
  target: string;
  /** The activities, by type name. */
  activities: Record<string, Activity>;
  /** Default "default". */
  pool?: string;
  /** Default ["default"]. */
  queues?: string[];
  /** Attempts run at once, default 4. */
  slots?: number;
  /** Stable across reconnects; the scheduler picks one when empty. */
  workerId?: string;
  /** Results finished this close together go in one message (default 5). */
  resultDelayMs?: number;
  /** First reconnect delay, doubling (default 100). */
  reconnectInitialMs?: number;
  /** Longest reconnect delay (default 5000, and at most a quarter of the scheduler's lease, so running attempts are kept). */
  reconnectMaxMs?: number;
  /** How long stop() lets running attempts finish (default 30000). */
  stopGraceMs?: number;
  /**
   * What each attempt's `ctx.logger` writes to (default `console`). One with `child(bindings)`
   * (pino, bunyan, winston) gets a child bound to { task_id, attempt, activity_type }; any other
   * gets its lines prefixed with `task_id=… attempt=…`.
   */
  logger?: { child?(bindings: Record<string, unknown>): unknown; [level: string]: any };
}

/** The scheduler's answer to the worker's hello. */
export interface Welcome {
  worker_id: string;
  [key: string]: unknown;
}

/** A worker: one Connect stream to the scheduler, reconnecting by itself. */
export class Worker extends EventEmitter {
  constructor(options: WorkerOptions);
  readonly target: string;
  /** True once stop() was called or the scheduler asked the worker to drain. */
  readonly draining: boolean;
  /** Settles when the worker has closed: with the error that closed it, or undefined/null after stop(). */
  readonly closed: Promise<Error | null | undefined>;
  /** Connects; resolves with the welcome, rejects when that first stream fails. */
  start(): Promise<Welcome>;
  /**
   * Takes no new work (and runs what the scheduler sent before it took that in), lets running
   * attempts finish and report, then closes the stream.
   */
  stop(): Promise<Error | null | undefined>;
  /** Closes the stream at once: running attempts are aborted and, unreported, retried elsewhere. */
  close(): Promise<Error | null | undefined>;
}

/** Thrown by an activity: the attempt fails without a retry. */
export class NonRetryableError extends Error {
  constructor(message: string);
}

/** A task as the scheduler returns it (the lowtide.v1.Task message, field names as in the proto). */
export interface Task {
  id: number;
  activity_type: string;
  queue: string;
  state: string;
  attempt: number;
  payload: Buffer;
  result: Buffer;
  /** What the activity last reported with ctx.heartbeat(details); empty for none. */
  heartbeat_details: Buffer;
  headers: Record<string, string>;
  [field: string]: unknown;
}

export interface SubmitOptions {
  queue?: string;
  maxAttempts?: number;
  heartbeatTimeoutMs?: number;
  /** An attempt running longer fails (and may be retried); the activity sees it as ctx.deadline. */
  startToCloseTimeoutMs?: number;
  headers?: Record<string, string>;
  /** The pools it may run in (each a configured [pools.NAME]); none: any pool that runs its type. */
  pools?: string[];
  /** A deferrable task's window: finish by `deadline`, or start by `latestStart`. */
  deadline?: Date;
  latestStart?: Date;
  /** How long it runs, about: what the plan counts on (and `deadline` less it is its latest start). */
  estimatedDurationMs?: number;
}

/** A promise-based client of SchedulerService. */
export class SchedulerClient {
  constructor(target: string, security?: Security);
  /** Submits one task; returns the stored task. A Buffer or string is sent as it is, any other value as JSON. */
  submit(activityType: string, payload?: unknown, options?: SubmitOptions): Promise<Task>;
  get(id: number): Promise<Task>;
  /** Waits up to `timeoutMs` (default 10000) for the task to finish; returns it, finished or not. */
  wait(id: number, timeoutMs?: number): Promise<Task>;
  cancel(id: number): Promise<Task>;
  close(): void;
}

/** The lowtide.v1 package loaded from the package's protos (grpc-js service constructors and messages). */
export function loadLowtide(): Record<string, any>;

/** Where the .proto files are loaded from: the package's protos/, or LOWTIDE_PROTO_DIR. */
export const PROTO_DIR: string;

/** Token and TLS files from the environment (LOWTIDE_TOKEN, LOWTIDE_CA, LOWTIDE_CERT, LOWTIDE_KEY). */
export function fromEnv(env?: Record<string, string | undefined>): Security;

/** The header naming a payload's (and its result's) encoding. */
export const CONTENT_TYPE: 'content-type';
/** Its value for a JSON task. */
export const JSON_TYPE: 'application/json';

/** A payload to submit: a Buffer or string as it is; any other value as JSON, with its header added. */
export function encodePayload(
  value: unknown,
  headers?: Record<string, string>,
): { payload: Buffer; headers: Record<string, string> };

/** A task's result: the parsed value for a JSON task, else a Buffer. */
export function decodeResult(task: Pick<Task, 'result' | 'headers'>): any;
