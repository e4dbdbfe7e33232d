-- lowtide: outside a transaction
-- The leader's tick asks every maintenance_interval whether a fixed start was missed (_start_missed),
-- and the metrics and status read every pool's fixed-start hit rate. Neither had an index to go by,
-- so both read the whole table, history included: with a backlog of 1,000,000 and 1,300,000 tasks
-- finished, half a second each, and the tick's alone kept a core of PostgreSQL busy.
-- Built concurrently (see lowtide.db.migrations): the replicas still running write on meanwhile.

-- First attempts of fixed starts not started and not marked missed, by start time.
CREATE INDEX CONCURRENTLY IF NOT EXISTS tasks_start_unmarked ON lowtide.tasks (start_at)
    WHERE state = 'pending' AND start_at IS NOT NULL AND attempt = 0 AND NOT missed;

-- Every recorded fixed-start outcome (hit or miss) by pool, read without the table.
CREATE INDEX CONCURRENTLY IF NOT EXISTS tasks_start_outcome ON lowtide.tasks (pool, start_hit)
    WHERE start_hit IS NOT NULL;
