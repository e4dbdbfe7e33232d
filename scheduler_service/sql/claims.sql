-- Claims: tasks handed to workers' free slots, and what a claim must respect (store/claims.py).
-- Fragments ({{_name}}) are shared by every file of this folder.

-- lock_types --
-- Serialises claims of concurrency-limited types across replicas, until the transaction ends.
SELECT pg_advisory_xact_lock(hashtext('lowtide.type:' || t))
FROM unnest(%(types)s::text[]) AS t ORDER BY t

-- count_running_by_type --
-- How many attempts of each of these types run now.
SELECT activity_type, count(*)::int AS running
FROM lowtide.tasks
WHERE state = 'running' AND activity_type = ANY(%(types)s::text[])
GROUP BY activity_type

-- _start_attempt --
-- What every claim sets on the attempts it starts (regular, fixed-due and chosen by id alike),
-- each for the worker of its `slot`; a fixed start's first attempt records whether it started
-- within its tolerance.
state = 'running',
    attempt = t.attempt + 1,
    worker_id = slot.worker_id,
    started_at = now(),
    close_deadline = now() + t.start_to_close_ms * interval '1 millisecond',
    heartbeat_deadline = now() + t.heartbeat_ms * interval '1 millisecond',
    schedule_to_start_deadline = NULL,
    start_hit = CASE WHEN t.start_at IS NOT NULL AND t.attempt = 0
        THEN abs(extract(epoch FROM now() - t.start_at)) * 1000 <= GREATEST(t.start_tolerance_ms, 50)
        ELSE t.start_hit END,
    -- A task placed in a pool was due for the others only from its latest start: started, it
    -- is due since its planned release, as any planned task (its timings, a retry's hold). Every
    -- other task keeps both as they are.
    run_at = CASE WHEN t.planned_pool IS NULL THEN t.run_at ELSE LEAST(t.run_at, t.planned_release_at) END,
    hold_deadline = CASE WHEN t.planned_pool IS NULL THEN t.hold_deadline
        ELSE LEAST(t.hold_deadline, t.planned_release_at) END,
    signal_at_dispatch = %(signal)s::float8

-- _started_attempt --
-- What every claim returns of each attempt it started (a ClaimedRow, scheduler_service/rows/claims.py):
-- what the worker is sent, its worker, and its timing (with what the task histograms need: when
-- it became due and started, what released it, the signal at dispatch and at submission (for the
-- carbon totals), and for a first attempt held by its planned release its submission; the columns
-- most rows have NULL cost nothing).
t.id, t.attempt, t.worker_id, t.queue, t.kind, t.activity_type, t.payload, t.max_attempts,
          t.initial_backoff_ms, t.backoff_coefficient, t.max_backoff_ms, t.non_retryable_error_types,
          t.close_deadline, t.heartbeat_ms, t.priority, t.run_at, t.start_at, t.start_tolerance_ms,
          t.start_hit, t.pool, NULLIF(t.headers, '{}'::jsonb) AS headers, t.started_at, t.released_by,
          t.hold_deadline, CASE WHEN t.planned_release_at IS NOT NULL AND t.attempt = 1 THEN t.created_at END
          AS planned_since, t.signal_at_dispatch, t.signal_at_submit

-- _pool_allows --
-- The task (t) may be taken by the regular branches of a claim for the workers of pool %(pool)s:
-- it names no pools, or names this one and was not placed here (a task placed here comes by
-- _placed_here from its planned release on). A task placed in a pool is due for the regular
-- branches only from its latest start (its run_at, a release lead before it, apply_plans), from
-- when any pool it names may take it: until then no other pool's claim reads it. The plan is for
-- its first attempt: a retry waits out its backoff and runs in any pool it names.
(t.pools IS NULL
 OR %(pool)s::text = ANY(t.pools) AND (t.attempt > 0 OR t.planned_pool IS DISTINCT FROM %(pool)s::text))

-- _placed_here --
-- Tasks the plan placed in pool %(pool)s (t, on tasks_claim_placed) whose planned release has come,
-- of the (queue, type) pair p: released by their plan whether or not a cost hold holds the pair.
t.state = 'pending' AND t.planned_pool = %(pool)s::text AND t.start_at IS NULL AND t.resources IS NULL
    AND t.queue = p.queue AND t.activity_type = p.activity_type AND t.planned_release_at <= now() AND t.attempt = 0

-- _claim_slots --
-- The free slots a claim fills, in the order rows are handed out (domain.dispatch.hand_out): one
-- slot of every worker of %(workers)s in turn (the dispatcher rotates who is first), while each
-- has one of its %(free)s left, numbered from 1. Both lists come as one string each (ids joined
-- by E'\x1f', which no worker id contains; counts by commas): a thousand workers are two
-- parameters, not two thousand array elements to encode. Workers whose lease has run out are left
-- out, so none of them gets a row until it is heard from again.
given AS (
    SELECT s.worker_id, s.free, s.ord
    FROM unnest(string_to_array(%(workers)s::text, E'\x1f'), string_to_array(%(free)s::text, ',')::int[])
         WITH ORDINALITY AS s(worker_id, free, ord)
),
live AS (
    SELECT w.id FROM lowtide.workers w
    WHERE w.id IN (SELECT worker_id FROM given) AND w.lease_expires_at > now()
),
slots AS (
    SELECT g.worker_id, row_number() OVER (ORDER BY k.turn, g.ord) AS nth
    FROM given g
    CROSS JOIN LATERAL generate_series(1, g.free) AS k(turn)
    WHERE g.worker_id IN (SELECT id FROM live)
)

-- _lock_chosen --
-- A candidate (c) a claim chose, locked unless another claimer holds it, if still pending: looked
-- up by its id, one at a time in the claim's order, until the claim has what it takes (so it locks
-- only the rows it takes). Written as a lookup per candidate, not as a join of the candidates with
-- the table: a claim keeps one generic plan (lowtide.db.connector), and one made while the table
-- was all but empty joined them by walking every pending task, a claim's cost growing with the
-- backlog (at 1,000 single submits a second it collapsed to a few hundred done).
SELECT t.id FROM lowtide.tasks t WHERE t.id = c.id AND t.state = 'pending' FOR UPDATE SKIP LOCKED

-- claim_tasks --
-- Takes due pending tasks for the workers of one dispatch group (sessions that may run the same
-- work) up to their free slots, in one statement that also records each attempt for its worker:
-- the n-th row taken goes to the n-th slot. Best priority first, FIFO within a priority, each
-- type capped at its room, paused queues left alone. Open (queue, type) pairs are walked on the
-- pending index; held pairs only for workflow tasks (never held) and for tasks past their
-- max_defer, each on its own small index. So held rows are never read, and a claim costs the same
-- with a million of them waiting. Twice as many candidates as slots are read without locks, then
-- locked in order, skipping those another claimer is taking, until every slot has one: a claim
-- locks only the rows it takes, and concurrent claimers (other groups, other replicas) do not
-- come back empty while work is waiting. %(caps)s are planned for twice the slots for the same
-- reason; a type's cap never exceeds its room under its concurrency limit.
WITH {{_claim_slots}},
paused AS (
    SELECT name FROM lowtide.queues WHERE paused
),
open_pairs AS (
    SELECT p.queue, p.activity_type, p.cap
    FROM unnest(%(queues)s::text[], %(types)s::text[], %(caps)s::int[]) AS p(queue, activity_type, cap)
    WHERE p.queue NOT IN (SELECT name FROM paused) AND EXISTS (SELECT 1 FROM live)
),
held_pairs AS (
    SELECT p.queue, p.activity_type, p.cap
    FROM unnest(%(held_queues)s::text[], %(held_types)s::text[], %(held_caps)s::int[])
         AS p(queue, activity_type, cap)
    WHERE p.queue NOT IN (SELECT name FROM paused) AND EXISTS (SELECT 1 FROM live)
),
candidates AS (
    SELECT c.id, c.priority, c.run_at, p.activity_type, p.cap, NULL::text AS released_by
    FROM open_pairs p
    CROSS JOIN LATERAL (
        SELECT t.id, t.priority, t.run_at
        FROM lowtide.tasks t
        WHERE t.state = 'pending' AND t.start_at IS NULL AND t.resources IS NULL AND t.queue = p.queue
          AND t.activity_type = p.activity_type AND t.run_at <= now() AND {{_pool_allows}}
        ORDER BY t.priority DESC, t.run_at, t.id
        LIMIT p.cap
    ) c
    UNION ALL
    SELECT c.id, c.priority, c.run_at, p.activity_type, p.cap, NULL::text
    FROM held_pairs p
    CROSS JOIN LATERAL (
        SELECT t.id, t.priority, t.run_at
        FROM lowtide.tasks t
        WHERE t.state = 'pending' AND t.kind = 'workflow' AND t.start_at IS NULL AND t.resources IS NULL
          AND t.queue = p.queue
          AND t.activity_type = p.activity_type AND t.run_at <= now() AND {{_pool_allows}}
        ORDER BY t.priority DESC, t.run_at, t.id
        LIMIT p.cap
    ) c
    UNION ALL
    SELECT c.id, c.priority, c.run_at, p.activity_type, p.cap, 'max_defer'
    FROM held_pairs p
    CROSS JOIN LATERAL (
        SELECT t.id, t.priority, t.run_at
        FROM lowtide.tasks t
        WHERE t.state = 'pending' AND t.hold_deadline IS NOT NULL AND t.resources IS NULL AND t.queue = p.queue
          AND t.activity_type = p.activity_type AND t.hold_deadline <= now() AND t.run_at <= now()
          AND {{_pool_allows}}
        ORDER BY t.hold_deadline
        LIMIT p.cap
    ) c
    UNION ALL
    SELECT c.id, c.priority, c.run_at, p.activity_type, p.cap, NULL::text
    FROM (SELECT * FROM open_pairs UNION ALL SELECT * FROM held_pairs) p
    CROSS JOIN LATERAL (
        -- Due since its planned release: ranked with the rest by priority, then by that.
        SELECT t.id, t.priority, t.planned_release_at AS run_at
        FROM lowtide.tasks t
        WHERE {{_placed_here}}
        ORDER BY t.priority DESC, t.planned_release_at, t.id
        LIMIT p.cap
    ) c
),
ranked AS (
    SELECT candidates.*,
           row_number() OVER (PARTITION BY activity_type ORDER BY priority DESC, run_at, id) AS nth
    FROM candidates
),
chosen AS (
    SELECT id, released_by, row_number() OVER (ORDER BY priority DESC, run_at, id) AS ord
    FROM ranked WHERE nth <= cap
    ORDER BY priority DESC, run_at, id
    LIMIT 2 * (SELECT count(*) FROM slots)
),
locked AS (
    SELECT l.id, c.released_by, c.ord
    FROM (SELECT * FROM chosen ORDER BY ord) c
    CROSS JOIN LATERAL ({{_lock_chosen}}) l
    ORDER BY c.ord
    LIMIT (SELECT count(*) FROM slots)
),
taken AS (
    SELECT id, released_by, row_number() OVER (ORDER BY ord) AS nth FROM locked
)
UPDATE lowtide.tasks t
SET {{_start_attempt}},
    released_by = taken.released_by
FROM taken JOIN slots slot USING (nth)
WHERE t.id = taken.id
RETURNING {{_started_attempt}}

-- claim_pair --
-- claim_tasks for the common case of one open (queue, type) pair and nothing held (workers of
-- one type, or a group whose other types are at their limits): up to twice the free slots (or
-- the pair's cap) are read off the pending index in order without locks, with as many of the
-- tasks the plan placed in this pool whose release has come (best priority first, then the
-- earliest released); they are ranked together, best priority first, a placed task due since its
-- planned release, and locked in that rank, skipping those another claimer is taking, until every
-- slot has one: a claim locks only the rows it takes, and a concurrent claimer finds the rest.
-- The n-th row taken goes to the n-th slot.
WITH {{_claim_slots}},
pair AS (
    SELECT %(queue)s::text AS queue, %(activity_type)s::text AS activity_type
    WHERE EXISTS (SELECT 1 FROM live)
      AND NOT EXISTS (SELECT 1 FROM lowtide.queues q WHERE q.name = %(queue)s::text AND q.paused)
),
placed AS (
    SELECT t.id, t.priority, t.planned_release_at AS due
    FROM lowtide.tasks t
    WHERE t.state = 'pending' AND t.planned_pool = %(pool)s::text AND t.start_at IS NULL AND t.resources IS NULL
      AND t.queue = %(queue)s::text AND t.activity_type = %(activity_type)s::text
      AND t.planned_release_at <= now() AND t.attempt = 0 AND EXISTS (SELECT 1 FROM pair)
    ORDER BY t.priority DESC, t.planned_release_at, t.id
    LIMIT 2 * LEAST(%(cap)s::int, (SELECT count(*) FROM slots))
),
regular AS (
    SELECT t.id, t.priority, t.run_at AS due
    FROM lowtide.tasks t
    WHERE t.state = 'pending' AND t.start_at IS NULL AND t.resources IS NULL AND t.queue = %(queue)s::text
      AND t.activity_type = %(activity_type)s::text AND t.run_at <= now() AND {{_pool_allows}}
      AND EXISTS (SELECT 1 FROM pair)
    ORDER BY t.priority DESC, t.run_at, t.id
    LIMIT 2 * LEAST(%(cap)s::int, (SELECT count(*) FROM slots))
),
chosen AS (
    SELECT id, row_number() OVER (ORDER BY priority DESC, due, id) AS ord
    FROM (SELECT * FROM placed UNION ALL SELECT * FROM regular) AS both_
),
locked AS (
    SELECT l.id, c.ord
    FROM (SELECT * FROM chosen ORDER BY ord) c
    CROSS JOIN LATERAL ({{_lock_chosen}}) l
    ORDER BY c.ord
    LIMIT LEAST(%(cap)s::int, (SELECT count(*) FROM slots))
),
taken AS (
    SELECT id, row_number() OVER (ORDER BY ord) AS nth FROM locked
)
UPDATE lowtide.tasks t
SET {{_start_attempt}},
    released_by = NULL
FROM taken JOIN slots slot USING (nth)
WHERE t.id = taken.id
RETURNING {{_started_attempt}}

-- _unplace_back --
-- A first attempt of a task placed in a pool (t), handed back: due for the other pools again only
-- from its latest start, as before its claim (_start_attempt made it due since its release).
run_at = CASE WHEN t.planned_pool IS NOT NULL AND t.attempt = 1
    THEN GREATEST(t.latest_start - %(release_lead)s::interval, t.run_at) ELSE t.run_at END,
    hold_deadline = CASE WHEN t.planned_pool IS NOT NULL AND t.attempt = 1
        THEN t.latest_start - %(release_lead)s::interval ELSE t.hold_deadline END

-- unclaim_tasks --
-- Hands claimed attempts back untouched (their worker left before they were sent). Each found by
-- its id (see _finish_fenced).
UPDATE lowtide.tasks t
SET state = 'pending', attempt = t.attempt - 1, worker_id = NULL, started_at = NULL, {{_unplace_back}},
    close_deadline = NULL, heartbeat_deadline = NULL,
    schedule_to_start_deadline = t.run_at + t.schedule_to_start_ms * interval '1 millisecond'
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(worker_ids)s::text[]) AS u(id, attempt, worker_id)
WHERE t.id = u.id AND t.attempt = u.attempt AND t.state IS NOT DISTINCT FROM 'running'
  AND t.worker_id = u.worker_id

-- _fixed_claimable --
-- A fixed start (t) may be claimed: a retry, a late run its miss policy allowed, or a first
-- attempt still within start + tolerance. One past it waits for the leader to mark it missed,
-- which applies its on_miss (skip, or run late) and says why: claimed as if on time (while the
-- leader was away, or between its ticks), a skip ran late and nothing said it was missed.
(t.attempt > 0 OR t.missed
 OR t.start_at + GREATEST(t.start_tolerance_ms, 50) * interval '1 millisecond' >= now())

-- claim_fixed_due --
-- Takes due fixed-start tasks of a pool (at their start, retries, late runs) for the workers of
-- one dispatch group, earliest first, ahead of regular work, each recorded for the worker of its
-- slot (see _claim_slots; the slots here include held ones). Cost holds never apply: the start
-- was promised. Only the rows taken are locked.
WITH {{_claim_slots}},
due AS (
    SELECT t.id, t.run_at
    FROM lowtide.tasks t
    WHERE t.state = 'pending' AND t.start_at IS NOT NULL AND t.pool = %(pool)s AND t.run_at <= now()
      AND t.resources IS NULL AND {{_fixed_claimable}}
      AND EXISTS (SELECT 1 FROM live)
      AND t.queue = ANY(%(queues)s::text[]) AND t.activity_type = ANY(%(types)s::text[])
      AND t.queue NOT IN (SELECT name FROM lowtide.queues WHERE paused)
    ORDER BY t.run_at, t.id
    LIMIT (SELECT count(*) FROM slots)
    FOR UPDATE SKIP LOCKED
),
taken AS (
    SELECT id, row_number() OVER (ORDER BY run_at, id) AS nth FROM due
)
UPDATE lowtide.tasks t
SET {{_start_attempt}}
FROM taken JOIN slots slot USING (nth)
WHERE t.id = taken.id
RETURNING {{_started_attempt}}

-- lock_resources --
-- Serialises claims of tasks that need resources, across replicas, until the transaction ends.
SELECT pg_advisory_xact_lock(hashtext('lowtide.resources'))

-- resources_in_use --
-- The amounts of each resource held by running attempts.
SELECT r.key AS name, sum(r.value::int)::int AS used
FROM lowtide.tasks t, jsonb_each_text(t.resources) AS r
WHERE t.state = 'running' AND t.resources IS NOT NULL
GROUP BY r.key

-- resource_candidates --
-- Due tasks that need resources and that this worker may take: its pool's due fixed starts
-- first, then by priority and FIFO; held (queue, type) pairs only for workflow tasks and for tasks
-- the plan placed in this pool, from their planned release.
SELECT t.id, t.resources, t.start_at IS NOT NULL AS fixed
FROM lowtide.tasks t
WHERE t.state = 'pending' AND t.resources IS NOT NULL
  AND t.queue = ANY(%(queues)s::text[]) AND t.activity_type = ANY(%(types)s::text[])
  AND t.queue NOT IN (SELECT name FROM lowtide.queues WHERE paused)
  AND (t.start_at IS NOT NULL AND t.run_at <= now() AND t.pool = %(pool)s AND {{_fixed_claimable}}
       OR t.start_at IS NULL AND t.planned_pool = %(pool)s::text AND t.planned_release_at <= now() AND t.attempt = 0
       OR t.start_at IS NULL AND t.run_at <= now() AND {{_pool_allows}}
          AND NOT (t.kind = 'activity' AND (t.queue || E'\x1f' || t.activity_type) = ANY(%(held)s::text[])))
ORDER BY (t.start_at IS NOT NULL) DESC, t.priority DESC,
    CASE WHEN t.planned_pool = %(pool)s::text AND t.attempt = 0 THEN t.planned_release_at ELSE t.run_at END, t.id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- claim_by_ids --
-- Marks chosen tasks running, each for its worker (the resource path picks them and their
-- workers in Python); nothing for a worker whose lease has run out.
UPDATE lowtide.tasks t
SET {{_start_attempt}}
FROM unnest(%(ids)s::bigint[], %(slot_workers)s::text[]) AS slot(id, worker_id)
WHERE t.id = slot.id AND t.state = 'pending'
  AND slot.worker_id IN (SELECT w.id FROM lowtide.workers w
                         WHERE w.id = ANY(%(slot_workers)s::text[]) AND w.lease_expires_at > now())
RETURNING {{_started_attempt}}

-- running_on_workers --
-- The attempts recorded as running on these workers of this replica, to find those their
-- sessions never handed them (strays.py); by the running-attempts-per-worker index.
SELECT t.id, t.attempt, t.worker_id
FROM lowtide.tasks t
JOIN lowtide.workers w ON w.id = t.worker_id AND w.scheduler_id = %(scheduler_id)s
WHERE t.state = 'running' AND t.worker_id = ANY(%(worker_ids)s::text[])

-- return_strays --
-- Puts attempts that never reached their worker back as they were before their claim (the
-- attempt not counted: it never ran), fenced like unclaim_tasks and by the worker's replica. One
-- past its start_to_close or heartbeat deadline is left to maintenance, which ends it as timed
-- out (a worker gives up an attempt past its deadline: it may have run).
UPDATE lowtide.tasks t
SET state = 'pending', attempt = t.attempt - 1, worker_id = NULL, started_at = NULL, {{_unplace_back}},
    close_deadline = NULL, heartbeat_deadline = NULL,
    schedule_to_start_deadline = t.run_at + t.schedule_to_start_ms * interval '1 millisecond'
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(worker_ids)s::text[]) AS u(id, attempt, worker_id)
WHERE t.id = u.id AND t.attempt = u.attempt AND t.state IS NOT DISTINCT FROM 'running'
  AND t.worker_id = u.worker_id
  AND (t.close_deadline IS NULL OR t.close_deadline > now())
  AND (t.heartbeat_deadline IS NULL OR t.heartbeat_deadline > now())
  AND EXISTS (SELECT 1 FROM lowtide.workers w WHERE w.id = u.worker_id AND w.scheduler_id = %(scheduler_id)s)
RETURNING t.id, t.attempt, t.worker_id
