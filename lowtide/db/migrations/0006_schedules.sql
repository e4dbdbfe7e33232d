-- Recurring schedules: each fire time of a cron expression becomes a fixed-start task.

CREATE TABLE lowtide.schedules (
    id                     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name                   text NOT NULL UNIQUE,
    cron                   text NOT NULL,
    time_zone              text NOT NULL,
    activity_type          text NOT NULL,
    queue                  text NOT NULL,
    pool                   text NOT NULL,
    payload                bytea NOT NULL DEFAULT ''::bytea,
    priority               integer NOT NULL DEFAULT 0,
    start_tolerance_ms     bigint NOT NULL,
    on_miss                text NOT NULL CHECK (on_miss IN ('run_late', 'skip')),
    -- Resolved at creation (the request's, else the type's configured default).
    estimated_duration_ms  bigint NOT NULL,
    paused                 boolean NOT NULL DEFAULT false,
    -- Bumped on each resume and part of the tasks' idempotency keys: an occurrence whose task
    -- was cancelled by a pause gets a new task once the schedule is resumed.
    generation             integer NOT NULL DEFAULT 0,
    -- The next fire time not yet turned into a task (or refused).
    next_fire_at           timestamptz NOT NULL,
    last_fire_at           timestamptz,
    last_task_id           bigint,
    last_conflict          text,
    last_conflict_at       timestamptz,
    conflicts              bigint NOT NULL DEFAULT 0,
    created_at             timestamptz NOT NULL DEFAULT now()
);
-- The materializer reads the active schedules due within its lookahead.
CREATE INDEX schedules_due ON lowtide.schedules (next_fire_at) WHERE NOT paused;

-- The tasks a schedule created, one per fire time (and generation), so that pausing or deleting
-- it can cancel those that have not reached their start.
CREATE TABLE lowtide.schedule_tasks (
    schedule_id  bigint NOT NULL REFERENCES lowtide.schedules (id) ON DELETE CASCADE,
    task_id      bigint NOT NULL REFERENCES lowtide.tasks (id) ON DELETE CASCADE,
    fire_at      timestamptz NOT NULL,
    PRIMARY KEY (schedule_id, task_id)
);
CREATE INDEX schedule_tasks_task ON lowtide.schedule_tasks (task_id);
