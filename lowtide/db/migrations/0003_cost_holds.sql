-- Cost holds: paused queues, max_defer, and the signal at submission and at dispatch.

ALTER TABLE lowtide.tasks
    ADD COLUMN max_defer_ms bigint,
    -- created_at + max_defer: a held task past it is claimed anyway.
    ADD COLUMN hold_deadline timestamptz,
    ADD COLUMN released_by text,
    ADD COLUMN signal_at_submit double precision,
    ADD COLUMN signal_at_dispatch double precision;

-- Held (queue, type) pairs are still walked for workflow tasks, which are never held, and for
-- tasks whose max_defer has passed: each through its own small index, so neither walk reads the
-- held backlog.
CREATE INDEX tasks_claim_workflow ON lowtide.tasks (queue, activity_type, priority DESC, run_at, id)
    WHERE state = 'pending' AND kind = 'workflow';
CREATE INDEX tasks_hold_deadline ON lowtide.tasks (queue, activity_type, hold_deadline)
    WHERE state = 'pending' AND hold_deadline IS NOT NULL;

-- A paused queue is claimed from by nobody and its schedule_to_start timers stop.
CREATE TABLE lowtide.queues (
    name       text PRIMARY KEY,
    paused     boolean NOT NULL DEFAULT false,
    paused_at  timestamptz
);
