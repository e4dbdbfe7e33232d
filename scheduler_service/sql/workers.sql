-- Workers and replicas: registration, leases, leadership, purges (store/workers.py).
-- Fragments ({{_name}}) are shared by every file of this folder.

-- maintenance_due --
-- What the leader's tick has to do, in one statement: for each of its statements, whether a row
-- may be due now. Each looks for its statement's own condition (the fragments they share), without
-- what makes the statement pass a row by (a lock, a paused queue, dependencies), so nothing due is
-- ever missed; a tick with nothing due costs this statement alone.
SELECT EXISTS (SELECT 1 FROM lowtide.schedules WHERE NOT paused AND next_fire_at <= %(horizon)s) AS schedules,
       EXISTS (SELECT 1 FROM lowtide.tasks WHERE {{_start_deadline_passed}}) AS start_deadlines,
       EXISTS (SELECT 1 FROM lowtide.tasks t WHERE {{_start_missed}}) AS misses,
       EXISTS ({{_expired_candidates}}) AS expired_attempts,
       -- The longest-finished task, first on tasks_finished_at whatever the plan: an EXISTS with
       -- the retention as a parameter became a scan of the whole table in the generic plan of
       -- the prepared statement (550 ms a tick with 2,300,000 tasks kept).
       COALESCE(%(retention_ms)s::bigint > 0
                AND (SELECT t.finished_at FROM lowtide.tasks t
                     WHERE {{_finished}}
                     ORDER BY t.finished_at LIMIT 1)
                    < now() - %(retention_ms)s::bigint * interval '1 millisecond', false) AS purge

-- _start_deadline_passed --
-- A pending task past its schedule_to_start deadline: what expire_schedule_to_start ends (unless
-- it waits on dependencies or its queue is paused) and maintenance_due looks for.
state = 'pending' AND schedule_to_start_deadline < now()

-- upsert_worker --
-- Records a connected worker and starts its lease, with the name of the token it connected with
-- (NULL: auth off). A worker id recorded for another token is not taken over
-- (no row written) while that worker's lease runs or it has attempts running: only its own
-- token's worker may (worker_attach.may_take_over, the same rule within one replica).
INSERT INTO lowtide.workers AS w (id, pool, queues, activity_types, slots, scheduler_id, lease_expires_at, token_name)
VALUES (%(id)s, %(pool)s, %(queues)s, %(activity_types)s, %(slots)s, %(scheduler_id)s,
        now() + %(lease_ms)s * interval '1 millisecond', %(token_name)s)
ON CONFLICT (id) DO UPDATE
SET pool = EXCLUDED.pool, queues = EXCLUDED.queues, activity_types = EXCLUDED.activity_types,
    slots = EXCLUDED.slots, scheduler_id = EXCLUDED.scheduler_id, connected_at = now(),
    lease_expires_at = EXCLUDED.lease_expires_at, token_name = EXCLUDED.token_name
WHERE w.token_name IS NULL OR EXCLUDED.token_name IS NULL OR w.token_name = EXCLUDED.token_name
   OR (w.lease_expires_at <= now()
       AND NOT EXISTS (SELECT 1 FROM lowtide.tasks t WHERE t.worker_id = w.id AND t.state = 'running'))

-- renew_worker_leases --
-- Sets the leases of the workers this replica heard a heartbeat from since its last renewal (or
-- whose lease length changed: they began or stopped running attempts, or changed slots), one
-- statement per tick for all of them, each only while it still runs and the worker is this
-- replica's: a worker left out of RETURNING lost its lease (or went elsewhere) and is not renewed.
-- Each gets its own lease from now (ms, computed by leases.py from when it was last heard from).
-- Ids come joined by E'\x1f', slot counts and leases by commas (three parameters for any number
-- of workers).
UPDATE lowtide.workers w
SET lease_expires_at = now() + r.lease_ms * interval '1 millisecond', slots = r.slots
FROM unnest(string_to_array(%(ids)s::text, E'\x1f'), string_to_array(%(slots)s::text, ',')::int[],
            string_to_array(%(lease_ms)s::text, ',')::int[]) AS r(id, slots, lease_ms)
WHERE w.id = r.id AND w.scheduler_id = %(scheduler_id)s AND w.lease_expires_at > now()
RETURNING w.id

-- delete_worker --
-- Forgets a worker whose stream has closed, unless it has connected to another replica meanwhile.
DELETE FROM lowtide.workers WHERE id = %(id)s AND scheduler_id = %(scheduler_id)s

-- _finished --
-- A task in one of the six end states (t: the task); tasks_finished_at holds these.
t.state IN ('completed', 'failed', 'cancelled', 'timed_out', 'skipped', 'shed')

-- purge_finished --
-- Deletes the longest-finished tasks kept for %(retention_ms)s since they finished (0: kept for
-- ever), at most %(limit)s, in the order of tasks_finished_at (their dependency edges, reservations
-- and schedule links go with them). maintenance_due looks for the first of them.
DELETE FROM lowtide.tasks
WHERE id IN (
    SELECT t.id FROM lowtide.tasks t
    WHERE {{_finished}}
      AND %(retention_ms)s::bigint > 0
      AND t.finished_at < now() - %(retention_ms)s::bigint * interval '1 millisecond'
    ORDER BY t.finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)

-- delete_expired_workers --
-- Forgets workers whose lease ran out and who run nothing any more.
DELETE FROM lowtide.workers w
WHERE w.lease_expires_at < now()
  AND NOT EXISTS (SELECT 1 FROM lowtide.tasks t WHERE t.state = 'running' AND t.worker_id = w.id)

-- seen_and_lead --
-- Records that this scheduler replica runs (its start, then a sign of life every maintenance
-- interval) and takes or keeps the named leader lease, in one statement; says whether this holder
-- has the lease, and whether another replica has shown a sign of life within the lease (then
-- this one tells the others which tasks it finished, for their WaitTask waiters).
WITH seen AS (
    INSERT INTO lowtide.scheduler_replicas (id) VALUES (%(holder)s)
    ON CONFLICT (id) DO UPDATE SET seen_at = now(), stopped = false
),
lead AS (
    INSERT INTO lowtide.leader (name, holder, expires_at)
    VALUES (%(name)s, %(holder)s, now() + %(ttl_ms)s * interval '1 millisecond')
    ON CONFLICT (name) DO UPDATE
    SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
    WHERE lowtide.leader.holder = EXCLUDED.holder OR lowtide.leader.expires_at < now()
    RETURNING holder
)
SELECT EXISTS (SELECT 1 FROM lead) AS leading,
       EXISTS (SELECT 1 FROM lowtide.scheduler_replicas r
               WHERE r.id <> %(holder)s AND NOT r.stopped
                 AND r.seen_at > now() - %(ttl_ms)s * interval '1 millisecond') AS others

-- resign --
-- Gives up the named leader lease.
DELETE FROM lowtide.leader WHERE name = %(name)s AND holder = %(holder)s

-- replica_stopped --
-- Records that this scheduler replica stopped (cleanly) now.
UPDATE lowtide.scheduler_replicas SET seen_at = now(), stopped = true WHERE id = %(id)s

-- forget_replicas --
-- Forgets replicas not seen for a week (they explain no miss detected now).
DELETE FROM lowtide.scheduler_replicas WHERE seen_at < now() - interval '7 days'

-- now --
-- The database's clock, which every deadline is measured against.
SELECT now() AS now

-- _start_missed --
-- A fixed start's first attempt not started by start + tolerance and not yet marked (t: the
-- task): what missed_fixed takes and maintenance_due looks for. The first bound follows from the
-- second (a tolerance counts as 50 ms at least) and keeps the look on tasks_start_unmarked, among
-- the starts already past.
t.state = 'pending' AND t.start_at IS NOT NULL AND t.attempt = 0 AND NOT t.missed
  AND t.start_at < now() - interval '50 milliseconds'
  AND t.start_at + GREATEST(t.start_tolerance_ms, 50) * interval '1 millisecond' < now()
