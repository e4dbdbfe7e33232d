-- Dependencies between tasks, and queue overload policies.

ALTER TABLE lowtide.tasks
    -- Dependencies not yet completed; while above zero the task is not due (run_at is 9999-01-01).
    ADD COLUMN deps_pending integer NOT NULL DEFAULT 0,
    -- Set on a task others depend on, so finishing it settles them (and only then).
    ADD COLUMN has_dependents boolean NOT NULL DEFAULT false,
    ADD COLUMN shed_reason text;

CREATE TABLE lowtide.task_dependencies (
    task_id     bigint NOT NULL REFERENCES lowtide.tasks (id) ON DELETE CASCADE,
    depends_on  bigint NOT NULL REFERENCES lowtide.tasks (id) ON DELETE CASCADE,
    PRIMARY KEY (task_id, depends_on)
);
CREATE INDEX task_dependencies_depends_on ON lowtide.task_dependencies (depends_on);
