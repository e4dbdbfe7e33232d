-- A pool's claim ranks the tasks placed in it with its other due work, best priority first, and
-- reads them off the index in that order (sql/claims.sql, _placed_here): priority before the
-- planned release, as tasks_claim_regular has it before run_at.

DROP INDEX lowtide.tasks_claim_placed;
CREATE INDEX tasks_claim_placed ON lowtide.tasks (planned_pool, queue, activity_type, priority DESC, planned_release_at, id)
    WHERE state = 'pending' AND planned_pool IS NOT NULL AND start_at IS NULL AND resources IS NULL;
