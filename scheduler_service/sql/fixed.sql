-- Fixed starts: upcoming and missed starts, their pools' figures (store/fixed.py).
-- Fragments ({{_name}}) are shared by every file of this folder.

-- upcoming_fixed --
-- First attempts of fixed-start tasks in these pools starting before a horizon, for slot holds
-- (a late one that runs late keeps its hold while it waits for dependencies or resources).
SELECT id, pool, queue, activity_type, start_at, start_tolerance_ms, on_miss, estimated_duration_ms
FROM lowtide.tasks
WHERE state = 'pending' AND start_at IS NOT NULL AND attempt = 0
  AND pool = ANY(%(pools)s::text[]) AND start_at <= %(horizon)s
ORDER BY start_at
LIMIT 1000

-- missed_fixed --
-- First attempts not started by start + tolerance (not yet marked), locked, with what explains
-- it: the queue's pause, the pool's workers (all, and those that run the task's queue and type),
-- their slots and what runs on them, and whether any scheduler replica ran at the start time
-- (a replica counts as running until it stopped, or until its last sign of life + %(lease_ms)s).
SELECT t.id, t.pool, t.queue, t.activity_type, t.on_miss, t.start_at, t.deps_pending > 0 AS dependencies_pending,
       t.resources IS NOT NULL AS needs_resources,
       EXISTS (SELECT 1 FROM lowtide.queues q WHERE q.name = t.queue AND q.paused) AS queue_paused,
       pw.workers_in_pool, pw.workers_for_type, pw.slots, pb.busy, pb.busy_fixed,
       EXISTS (SELECT 1 FROM lowtide.scheduler_replicas s
               WHERE s.started_at <= t.start_at
                 AND t.start_at <= CASE WHEN s.stopped THEN s.seen_at
                                        ELSE s.seen_at + %(lease_ms)s * interval '1 millisecond' END)
           AS scheduler_ran,
       (SELECT max(s.seen_at) FROM lowtide.scheduler_replicas s WHERE s.seen_at < t.start_at) AS down_from,
       (SELECT min(s.started_at) FROM lowtide.scheduler_replicas s WHERE s.started_at > t.start_at) AS down_to
FROM lowtide.tasks t
CROSS JOIN LATERAL (
    SELECT count(*)::int AS workers_in_pool,
           count(*) FILTER (WHERE t.queue = ANY(w.queues) AND t.activity_type = ANY(w.activity_types))::int
               AS workers_for_type,
           COALESCE(sum(w.slots) FILTER (WHERE t.queue = ANY(w.queues) AND t.activity_type = ANY(w.activity_types)),
                    0)::int AS slots
    FROM lowtide.workers w
    WHERE w.pool = t.pool AND w.lease_expires_at > now()
) pw
CROSS JOIN LATERAL (
    SELECT count(*)::int AS busy, count(*) FILTER (WHERE r.start_at IS NOT NULL)::int AS busy_fixed
    FROM lowtide.tasks r
    JOIN lowtide.workers w ON w.id = r.worker_id
    WHERE r.state = 'running' AND w.pool = t.pool AND w.lease_expires_at > now()
      AND t.queue = ANY(w.queues) AND t.activity_type = ANY(w.activity_types)
) pb
WHERE {{_start_missed}}
ORDER BY t.start_at
LIMIT 1000
FOR UPDATE OF t SKIP LOCKED

-- mark_missed --
-- Applies miss policies: skip ends the task; run_late marks it missed and leaves it due.
UPDATE lowtide.tasks t
SET missed = true,
    miss_reason = m.reason,
    state = CASE WHEN t.on_miss = 'skip' THEN 'skipped' ELSE t.state END,
    finished_at = CASE WHEN t.on_miss = 'skip' THEN now() ELSE t.finished_at END,
    start_hit = false
FROM unnest(%(ids)s::bigint[], %(reasons)s::text[], %(kinds)s::text[]) AS m(id, reason, kind)
WHERE t.id = m.id AND t.state = 'pending'
RETURNING t.id, t.pool, t.state, m.reason, m.kind, t.has_dependents

-- pool_fixed_stats --
-- Per pool: the start times of admitted fixed starts not started yet, and the hit rate of first
-- attempts (NULL before any). Each part on its own index (tasks_fixed_due, tasks_start_outcome), so
-- neither reads the rest of the table.
WITH ahead AS (
    SELECT pool, array_agg(start_at ORDER BY start_at) AS ahead
    FROM lowtide.tasks
    WHERE state = 'pending' AND start_at IS NOT NULL AND attempt = 0
    GROUP BY pool
), outcomes AS (
    SELECT pool, avg(CASE WHEN start_hit THEN 1.0 ELSE 0.0 END)::float8 AS hit_rate
    FROM lowtide.tasks
    WHERE start_hit IS NOT NULL
    GROUP BY pool
)
SELECT pool, a.ahead, o.hit_rate
FROM ahead a
FULL JOIN outcomes o USING (pool)

-- live_reservations --
-- The windows of admitted fixed starts not finished yet (capacity a release plan must leave), and
-- the pool each books.
SELECT r.window_start, r.window_end, r.pool
FROM lowtide.reservations r
JOIN lowtide.tasks t ON t.id = r.task_id AND t.state IN ('pending', 'running')
WHERE r.window_end > now()
