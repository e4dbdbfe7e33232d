-- Where and when: the claims of a pool read the tasks placed in it from their planned release on,
-- and no other pool's claim reads them before their latest start (sql/claims.sql, _placed_here).

CREATE INDEX tasks_claim_placed ON lowtide.tasks (planned_pool, queue, activity_type, planned_release_at)
    WHERE state = 'pending' AND planned_pool IS NOT NULL AND start_at IS NULL AND resources IS NULL;
