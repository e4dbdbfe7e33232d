-- The checker's reads of the soak's own database, on a read-only connection.

-- tasks --
-- Every task after `after` (by id), with the soak's tag: the payload up to its first '|'.
SELECT t.id, t.idempotency_key, t.activity_type, t.state, t.attempt, t.worker_id,
       extract(epoch FROM t.started_at)::float8 AS started_at, t.released_by, t.signal_at_dispatch,
       extract(epoch FROM t.start_at)::float8 AS start_at, t.start_tolerance_ms, t.start_hit, t.missed,
       t.miss_reason,
       convert_from(substring(t.payload FROM 1 FOR greatest(position('\x7c'::bytea IN substring(t.payload FROM 1 FOR 64)) - 1, 0)), 'UTF8') AS tag
FROM lowtide.tasks t
WHERE t.id > %(after)s::bigint
ORDER BY t.id

-- unfinished --
-- The tasks not yet ended (pending or running), with the same columns as `tasks`.
SELECT t.id, t.idempotency_key, t.activity_type, t.state, t.attempt, t.worker_id,
       extract(epoch FROM t.started_at)::float8 AS started_at, t.released_by, t.signal_at_dispatch,
       extract(epoch FROM t.start_at)::float8 AS start_at, t.start_tolerance_ms, t.start_hit, t.missed,
       t.miss_reason, NULL::text AS tag
FROM lowtide.tasks t
WHERE t.state IN ('pending', 'running')
ORDER BY t.id

-- signal_history --
-- The default signal's values that became visible after `after` (epoch seconds), each dated by
-- its transaction's commit (track_commit_timestamp; recorded_at, its transaction's start, where
-- the commit time is unknown): a value is the signal from when others can read it.
SELECT extract(epoch FROM h.visible_at)::float8 AS at, h.value
FROM (
    SELECT value, COALESCE(pg_xact_commit_timestamp(xmin), recorded_at) AS visible_at
    FROM lowtide.signal_history
    WHERE name = %(name)s
) h
WHERE h.visible_at > to_timestamp(%(after)s::float8)
ORDER BY h.visible_at
