-- Where and when: the pools a task may run in, and the one its planned release chose.

ALTER TABLE lowtide.tasks
    -- NULL: any pool that runs its type (a task that names none).
    ADD COLUMN pools text[],
    -- The pool the planner placed it in: until its latest start only that pool's workers claim it.
    ADD COLUMN planned_pool text;
