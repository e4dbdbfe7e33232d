-- Finished tasks are deleted once [scheduler] retention has passed since they finished: the
-- leader finds them, and finds that none are due, by when they finished.
CREATE INDEX tasks_finished_at ON lowtide.tasks (finished_at)
    WHERE state IN ('completed', 'failed', 'cancelled', 'timed_out', 'skipped', 'shed');
