-- Fixed starts and reservations.

ALTER TABLE lowtide.tasks
    ADD COLUMN pool text NOT NULL DEFAULT 'default',
    ADD COLUMN start_at timestamptz,
    ADD COLUMN start_tolerance_ms bigint,
    ADD COLUMN on_miss text CHECK (on_miss IN ('run_late', 'skip')),
    ADD COLUMN estimated_duration_ms bigint,
    ADD COLUMN missed boolean NOT NULL DEFAULT false,
    ADD COLUMN miss_reason text,
    ADD COLUMN start_hit boolean;

-- Regular work is claimed per (queue, type); fixed-start tasks are claimed per pool, ahead of it.
CREATE INDEX tasks_claim_regular ON lowtide.tasks (queue, activity_type, priority DESC, run_at, id)
    WHERE state = 'pending' AND start_at IS NULL;
DROP INDEX lowtide.tasks_claim;
CREATE INDEX tasks_fixed_due ON lowtide.tasks (pool, run_at)
    WHERE state = 'pending' AND start_at IS NOT NULL;

-- One row per admitted fixed start: the interval it occupies in its pool. It counts while its
-- task is pending or running.
CREATE TABLE lowtide.reservations (
    task_id       bigint PRIMARY KEY REFERENCES lowtide.tasks (id) ON DELETE CASCADE,
    pool          text NOT NULL,
    window_start  timestamptz NOT NULL,
    window_end    timestamptz NOT NULL
);
CREATE INDEX reservations_pool_window ON lowtide.reservations (pool, window_start, window_end);
