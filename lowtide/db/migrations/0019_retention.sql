-- lowtide: outside a transaction
-- Finished tasks are deleted once [scheduler] retention has passed since they finished: the
-- leader finds them, and finds that none are due, by when they finished. Built concurrently (see
-- lowtide.db.migrations): on a table that kept every task so far this is the long one.
CREATE INDEX CONCURRENTLY IF NOT EXISTS tasks_finished_at ON lowtide.tasks (finished_at)
    WHERE state IN ('completed', 'failed', 'cancelled', 'timed_out', 'skipped', 'shed');
