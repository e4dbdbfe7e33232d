-- The task queue, worker leases and the leader lease.

CREATE TABLE lowtide.tasks (
    id                          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue                       text NOT NULL,
    kind                        text NOT NULL CHECK (kind IN ('activity', 'workflow')),
    activity_type               text NOT NULL,
    payload                     bytea NOT NULL,
    priority                    integer NOT NULL DEFAULT 0,
    idempotency_key             text,
    -- A held task stays pending: holds never write to this table.
    state                       text NOT NULL DEFAULT 'pending' CHECK (state IN (
                                    'pending', 'running', 'completed', 'failed', 'cancelled',
                                    'timed_out', 'skipped', 'shed')),
    attempt                     integer NOT NULL DEFAULT 0,
    max_attempts                integer NOT NULL,
    initial_backoff_ms          bigint NOT NULL,
    backoff_coefficient         double precision NOT NULL,
    max_backoff_ms              bigint NOT NULL,
    non_retryable_error_types   text[] NOT NULL DEFAULT '{}',
    schedule_to_start_ms        bigint,
    start_to_close_ms           bigint,
    heartbeat_ms                bigint,
    created_at                  timestamptz NOT NULL DEFAULT now(),
    -- Not claimed before this time: the submit time, or the end of a retry's backoff.
    run_at                      timestamptz NOT NULL DEFAULT now(),
    schedule_to_start_deadline  timestamptz,
    started_at                  timestamptz,
    finished_at                 timestamptz,
    worker_id                   text,
    close_deadline              timestamptz,
    heartbeat_deadline          timestamptz,
    result                      bytea,
    error_type                  text,
    error_message               text,
    error_non_retryable         boolean,
    cancel_requested            boolean NOT NULL DEFAULT false
);

CREATE UNIQUE INDEX tasks_idempotency_key ON lowtide.tasks (idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- The claim walks this index once per (queue, type) it may take, so types in the skip list
-- (held or at their concurrency limit) cost nothing however many of their rows wait.
CREATE INDEX tasks_claim ON lowtide.tasks (queue, activity_type, priority DESC, run_at, id)
    WHERE state = 'pending';

CREATE INDEX tasks_running_worker ON lowtide.tasks (worker_id) WHERE state = 'running';
CREATE INDEX tasks_running_type ON lowtide.tasks (activity_type) WHERE state = 'running';
CREATE INDEX tasks_close_deadline ON lowtide.tasks (close_deadline)
    WHERE state = 'running' AND close_deadline IS NOT NULL;
CREATE INDEX tasks_heartbeat_deadline ON lowtide.tasks (heartbeat_deadline)
    WHERE state = 'running' AND heartbeat_deadline IS NOT NULL;
CREATE INDEX tasks_schedule_to_start_deadline ON lowtide.tasks (schedule_to_start_deadline)
    WHERE state = 'pending' AND schedule_to_start_deadline IS NOT NULL;
CREATE INDEX tasks_state_id ON lowtide.tasks (state, id);

-- One row per connected worker; its lease is renewed by heartbeats on the worker's stream.
CREATE TABLE lowtide.workers (
    id                text PRIMARY KEY,
    pool              text NOT NULL,
    queues            text[] NOT NULL,
    activity_types    text[] NOT NULL,
    slots             integer NOT NULL,
    scheduler_id      text NOT NULL,
    connected_at      timestamptz NOT NULL DEFAULT now(),
    lease_expires_at  timestamptz NOT NULL
);

-- Time-driven work runs on one scheduler replica: the holder of an unexpired lease here.
CREATE TABLE lowtide.leader (
    name        text PRIMARY KEY,
    holder      text NOT NULL,
    expires_at  timestamptz NOT NULL
);
