-- Dependencies between tasks, named resources, and queue overload policies.

ALTER TABLE lowtide.tasks
    -- Dependencies not yet completed; while above zero the task is not due (run_at is 9999-01-01).
    ADD COLUMN deps_pending integer NOT NULL DEFAULT 0,
    -- Set on a task others depend on, so finishing it settles them (and only then).
    ADD COLUMN has_dependents boolean NOT NULL DEFAULT false,
    ADD COLUMN shed_reason text,
    -- Named amounts ({"gpu": 1}) the task needs while it runs; NULL for none.
    ADD COLUMN resources jsonb;

-- Tasks that need resources are claimed on their own path (their amounts must fit what is free),
-- so the regular claim's index leaves them out.
DROP INDEX lowtide.tasks_claim_regular;
CREATE INDEX tasks_claim_regular ON lowtide.tasks (queue, activity_type, priority DESC, run_at, id)
    WHERE state = 'pending' AND start_at IS NULL AND resources IS NULL;
CREATE INDEX tasks_claim_resources ON lowtide.tasks (queue, priority DESC, run_at, id)
    WHERE state = 'pending' AND resources IS NOT NULL;
CREATE INDEX tasks_running_resources ON lowtide.tasks (id) WHERE state = 'running' AND resources IS NOT NULL;

CREATE TABLE lowtide.task_dependencies (
    task_id     bigint NOT NULL REFERENCES lowtide.tasks (id) ON DELETE CASCADE,
    depends_on  bigint NOT NULL REFERENCES lowtide.tasks (id) ON DELETE CASCADE,
    PRIMARY KEY (task_id, depends_on)
);
CREATE INDEX task_dependencies_depends_on ON lowtide.task_dependencies (depends_on);
