-- Planned release: held tasks with a latest start are released at the cheapest forecast window.

ALTER TABLE lowtide.tasks
    -- The latest the task may start (its deadline minus its estimated duration, or max_defer).
    ADD COLUMN latest_start timestamptz,
    ADD COLUMN planned_release_at timestamptz,
    ADD COLUMN planned_intensity double precision,
    ADD COLUMN plan_reason text;

CREATE INDEX tasks_plannable ON lowtide.tasks (id)
    WHERE state = 'pending' AND attempt = 0 AND latest_start IS NOT NULL;
