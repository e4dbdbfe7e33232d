-- Queues and pools: pause, backlog counts, carbon totals, planned release (store/queues.py).
-- Fragments ({{_name}}) are shared by every file of this folder.

-- stored_signal --
-- A signal's state as the signal service stored it: read when its NOTIFY (lowtide_signal) says it
-- changed, so a change committed by a signal service that died or froze before streaming it still
-- reaches the scheduler's hold (the stream is the fast path, the row the truth).
SELECT name, value, threshold, stale, unit, version FROM lowtide.signals WHERE name = %(name)s

-- pause_queue --
-- Pauses a queue (from now; pausing a paused queue keeps its first pause time).
INSERT INTO lowtide.queues (name, paused, paused_at) VALUES (%(name)s, true, now())
ON CONFLICT (name) DO UPDATE
SET paused = true, paused_at = COALESCE(lowtide.queues.paused_at, now())
RETURNING name, paused_at

-- resume_queue --
-- Resumes a queue; returns how long it was paused (NULL when it was not).
WITH old AS (
    SELECT name, paused_at FROM lowtide.queues WHERE name = %(name)s AND paused FOR UPDATE
)
UPDATE lowtide.queues q SET paused = false, paused_at = NULL
FROM old WHERE q.name = old.name
RETURNING q.name, now() - old.paused_at AS paused_for

-- shift_schedule_to_start --
-- A pause suspends schedule_to_start: push the queue's pending deadlines back by its length.
UPDATE lowtide.tasks
SET schedule_to_start_deadline = schedule_to_start_deadline + %(paused_for)s::interval
WHERE queue = %(name)s AND state = 'pending' AND schedule_to_start_deadline IS NOT NULL

-- mark_idle_queues --
-- Queues with no task due or running now (all but %(busy)s, from the backlog's last count) are
-- idle from now on; the others are not. Only rows that change are written. Busy names are looked
-- up in a hash made once (IN over a subquery), not searched through per queue as = ANY(array)
-- may be: thousands of queues against thousands of busy ones.
UPDATE lowtide.queues q
SET idle_since = CASE WHEN b.busy THEN NULL ELSE now() END
FROM (
    SELECT name, name IN (SELECT unnest(%(busy)s::text[])) AS busy FROM lowtide.queues
) b
WHERE b.name = q.name AND b.busy = (q.idle_since IS NOT NULL)

-- forget_idle_queues --
-- Forgets queues idle for %(retention_ms)s (0: never), neither paused nor in %(kept)s (configured),
-- that have no pending or running task at all (one waiting for a later start or a dependency
-- keeps its queue), at most %(limit)s at a time. The tasks still pending or running are read
-- once, by state, only when some queue is due.
DELETE FROM lowtide.queues q
WHERE q.name IN (
    SELECT name FROM lowtide.queues
    WHERE NOT paused AND %(retention_ms)s::bigint > 0
      AND idle_since < now() - %(retention_ms)s::bigint * interval '1 millisecond'
      AND name <> ALL(%(kept)s::text[])
    ORDER BY idle_since
    LIMIT %(limit)s
)
AND q.name NOT IN (SELECT t.queue FROM lowtide.tasks t WHERE t.state IN ('pending', 'running'))

-- known_queues --
-- Every queue the database knows: submitted to or paused once, or served by a connected worker.
SELECT name FROM lowtide.queues
UNION
SELECT unnest(queues) FROM lowtide.workers WHERE lease_expires_at > now()

-- paused_queues --
-- The queues paused now.
SELECT name, paused_at FROM lowtide.queues WHERE paused

-- pending_by_queue_and_type --
-- Pending counts and oldest ages per (queue, type), for status and the queue metrics.
SELECT queue, activity_type, kind, count(*)::bigint AS depth,
       extract(epoch FROM now() - min(run_at))::float8 AS oldest_age
FROM lowtide.tasks
WHERE state = 'pending' AND run_at <= now()
GROUP BY queue, activity_type, kind

-- running_by_queue --
-- Running attempts per queue.
SELECT queue, count(*)::bigint AS running FROM lowtide.tasks WHERE state = 'running' GROUP BY queue

-- carbon_totals --
-- For these types: tasks dispatched with a known signal, and the sums of the signal at their
-- submission and at their dispatch (the totals, see add_carbon_totals).
SELECT activity_type, tasks, sum_at_submit, sum_at_dispatch
FROM lowtide.carbon_totals
WHERE activity_type = ANY(%(types)s::text[])

-- add_carbon_totals --
-- Adds a replica's dispatches since its last call to the carbon totals: per type (in order, so
-- that two replicas adding the same types never wait on each other in a cycle), how many first
-- attempts were dispatched with a known signal and the sums of the signal at submit and dispatch.
INSERT INTO lowtide.carbon_totals AS c (activity_type, tasks, sum_at_submit, sum_at_dispatch)
SELECT * FROM unnest(%(types)s::text[], %(tasks)s::bigint[], %(at_submit)s::float8[], %(at_dispatch)s::float8[])
ORDER BY 1
ON CONFLICT (activity_type) DO UPDATE
SET tasks = c.tasks + EXCLUDED.tasks, sum_at_submit = c.sum_at_submit + EXCLUDED.sum_at_submit,
    sum_at_dispatch = c.sum_at_dispatch + EXCLUDED.sum_at_dispatch

-- workers_for_type --
-- Connected workers (any replica) that run this type on this queue.
SELECT count(*)::int AS workers FROM lowtide.workers
WHERE %(activity_type)s = ANY(activity_types) AND %(queue)s = ANY(queues) AND lease_expires_at > now()

-- pools --
-- Connected workers per pool, their slots, and how many of those run an attempt now. A worker
-- that is leaving (SlotUpdate 0) or has fewer slots than it runs attempts still occupies a slot
-- per attempt: its slots count as at least its running attempts, so busy never exceeds slots.
SELECT w.pool, count(*)::int AS workers, sum(GREATEST(w.slots, COALESCE(r.running, 0)))::int AS slots,
       COALESCE(sum(r.running), 0)::int AS busy
FROM lowtide.workers w
LEFT JOIN (
    SELECT worker_id, count(*) AS running FROM lowtide.tasks WHERE state = 'running' GROUP BY worker_id
) r ON r.worker_id = w.id
WHERE w.lease_expires_at > now()
GROUP BY w.pool
ORDER BY w.pool

-- pool_slots --
-- Slots of the connected workers (any replica's) that run any of these types, by pool: the room
-- the planner plans work naming no pool in (one row per pool).
SELECT pool, sum(slots)::int AS slots
FROM lowtide.workers
WHERE lease_expires_at > now() AND activity_types && %(types)s::text[]
GROUP BY pool
ORDER BY pool

-- pool_types --
-- Which of these types the connected workers (any replica's) of each pool run, and on which
-- queues: the pools a task naming pools may be placed in (one row per pool, queue and type).
SELECT DISTINCT pool, queue, activity_type
FROM lowtide.workers, unnest(queues) AS queue, unnest(activity_types) AS activity_type
WHERE lease_expires_at > now() AND activity_type = ANY(%(types)s::text[])

-- planned_by_pool --
-- Held first attempts the plan placed in each pool (tasks naming pools), not released yet: how
-- many, and the soonest (its release, id and forecast mean). One row per pool, whatever the count.
SELECT DISTINCT ON (planned_pool) planned_pool AS pool,
       (count(*) OVER (PARTITION BY planned_pool))::int AS planned,
       id AS next_task_id, planned_release_at AS next_at, planned_intensity AS next_intensity
FROM lowtide.tasks
WHERE state = 'pending' AND attempt = 0 AND latest_start IS NOT NULL AND planned_pool IS NOT NULL
  AND planned_release_at > now()
ORDER BY planned_pool, planned_release_at, id

-- plannable_tasks --
-- Pending first attempts with a latest start: the tasks whose release the planner chooses.
SELECT id, queue, activity_type, kind, created_at, latest_start, estimated_duration_ms, planned_release_at,
       pools, planned_pool
FROM lowtide.tasks
WHERE state = 'pending' AND attempt = 0 AND latest_start IS NOT NULL AND start_at IS NULL
  AND deps_pending = 0
ORDER BY latest_start
LIMIT 5000

-- recent_deferrable --
-- First attempts with a latest start submitted over the last `lookback`, of these types, counted
-- in 5-minute buckets by queue and type (and whether they named pools) with their mean slack and
-- duration: the work the planner expects again (bounded: 576 buckets a day for each queue and type).
SELECT date_bin('5 minutes', created_at, TIMESTAMPTZ '2000-01-01 00:00:00+00') AS at,
       queue, activity_type, kind, pools IS NOT NULL AS named_pools,
       (avg(EXTRACT(EPOCH FROM latest_start - created_at)) * 1000)::bigint AS slack_ms,
       avg(estimated_duration_ms)::bigint AS estimated_duration_ms,
       count(*)::int AS count
FROM lowtide.tasks
WHERE latest_start IS NOT NULL AND created_at > now() - %(lookback)s::interval
  AND activity_type = ANY(%(types)s::text[])
GROUP BY 1, 2, 3, 4, 5
ORDER BY 1
LIMIT 20000

-- apply_plans --
-- Moves planned tasks' release (never past their latest start) and records why, and for a task
-- naming pools the one its plan placed it in (NULL: any of them).
-- A placed task is due for other pools (its run_at, hold_deadline) only from its latest start; its
-- own pool's claims take it from planned_release_at on (claims.sql, _placed_here).
UPDATE lowtide.tasks t
SET run_at = CASE WHEN p.pool IS NOT NULL THEN GREATEST(t.latest_start - %(release_lead)s::interval, now())
                  -- Placed no more (no forecast covers it now): due in any pool it names from the
                  -- release it was placed for, as a task never placed keeps its last release.
                  WHEN p.release_at IS NULL AND t.planned_pool IS NOT NULL THEN GREATEST(t.planned_release_at, now())
                  WHEN p.release_at IS NULL THEN t.run_at ELSE GREATEST(p.release_at, now()) END,
    hold_deadline = CASE WHEN p.pool IS NOT NULL THEN t.latest_start - %(release_lead)s::interval
                         ELSE LEAST(t.latest_start - %(release_lead)s::interval, p.release_at) END,
    planned_release_at = p.release_at,
    planned_intensity = p.intensity,
    plan_reason = p.reason,
    planned_pool = p.pool
FROM unnest(%(ids)s::bigint[], %(release_ats)s::timestamptz[], %(intensities)s::float8[], %(reasons)s::text[],
            %(planned_pools)s::text[])
     AS p(id, release_at, intensity, reason, pool)
-- Each found by its id: `IS NOT DISTINCT FROM` keeps the index of states out of the plan, which
-- a table not yet analyzed made the outer of a join with the plans, every pending task read for
-- each (tasks.sql, _finish_fenced).
WHERE t.id = p.id AND t.state IS NOT DISTINCT FROM 'pending' AND t.attempt = 0

-- notify_plans --
-- Tells every replica that releases were planned, so each sets its own wake-up timers for them.
SELECT pg_notify('lowtide_plan', '')

-- upcoming_releases --
-- When planned tasks are due within a horizon (their release, or just before their latest start
-- if earlier): the times a replica wakes its dispatchers at, so work is claimed then, not a poll later.
SELECT DISTINCT due
FROM lowtide.tasks, LATERAL (SELECT LEAST(hold_deadline, planned_release_at) AS due) d
WHERE state = 'pending' AND attempt = 0 AND latest_start IS NOT NULL
  AND due > now() AND due <= now() + %(horizon)s::interval
ORDER BY due
LIMIT 1000
