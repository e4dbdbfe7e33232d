-- Submits: tasks, their dependencies and reservations stored, overload shed (store/submissions.py).
-- Fragments ({{_name}}) are shared by every file of this folder.

-- _insert_tasks --
-- A batch of tasks inserted, but a row whose idempotency key the same submitter used already.
INSERT INTO lowtide.tasks (
    queue, kind, activity_type, payload, priority, idempotency_key,
    max_attempts, initial_backoff_ms, backoff_coefficient, max_backoff_ms, non_retryable_error_types,
    schedule_to_start_ms, start_to_close_ms, heartbeat_ms, schedule_to_start_deadline,
    max_defer_ms, hold_deadline, signal_at_submit,
    pool, start_at, start_tolerance_ms, on_miss, estimated_duration_ms, run_at, deps_pending, resources,
    latest_start, planned_release_at, planned_intensity, plan_reason, submitted_by, headers,
    pools, planned_pool
)
SELECT n.queue, n.kind, n.activity_type, n.payload, n.priority, n.idempotency_key,
       n.max_attempts, n.initial_backoff_ms, n.backoff_coefficient, n.max_backoff_ms,
       string_to_array(n.non_retryable, E'\x1f'),
       n.schedule_to_start_ms, n.start_to_close_ms, n.heartbeat_ms,
       -- A task waiting for dependencies is not due, and its start deadline waits too.
       CASE WHEN n.deps_pending = 0
            THEN COALESCE(n.start_at, now()) + n.schedule_to_start_ms * interval '1 millisecond' END,
       n.max_defer_ms,
       -- Fixed starts are never held: their start was promised at admission. A latest start
       -- releases the task a scheduling step (release_lead) before it, so it starts by then. A
       -- task placed in a pool is released to the others only then (as apply_plans sets it).
       CASE WHEN n.kind = 'activity' AND n.start_at IS NULL AND n.planned_pool IS NOT NULL
            THEN n.latest_start - %(release_lead)s::interval
            WHEN n.kind = 'activity' AND n.start_at IS NULL
            THEN LEAST(n.latest_start - %(release_lead)s::interval, n.planned_release_at) END,
       -- The signal where the task may run now (a task naming pools: the cleanest of theirs).
       n.signal_at_submit,
       n.pool, n.start_at, n.start_tolerance_ms, n.on_miss, n.estimated_duration_ms,
       CASE WHEN n.deps_pending > 0 THEN '9999-01-01 00:00:00+00'::timestamptz
            WHEN n.planned_pool IS NOT NULL THEN GREATEST(n.latest_start - %(release_lead)s::interval, now())
            ELSE COALESCE(n.start_at, GREATEST(n.planned_release_at, now()), now()) END,
       n.deps_pending, n.resources::jsonb,
       n.latest_start, n.planned_release_at, n.planned_intensity, n.plan_reason, %(submitted_by)s::text,
       n.headers::jsonb, string_to_array(n.allowed_pools, E'\x1f'), n.planned_pool
FROM unnest(
    %(queue)s::text[], %(kind)s::text[], %(activity_type)s::text[], %(payload)s::bytea[],
    %(priority)s::int[], %(idempotency_key)s::text[], %(max_attempts)s::int[],
    %(initial_backoff_ms)s::bigint[], %(backoff_coefficient)s::float8[], %(max_backoff_ms)s::bigint[],
    %(non_retryable)s::text[], %(schedule_to_start_ms)s::bigint[], %(start_to_close_ms)s::bigint[],
    %(heartbeat_ms)s::bigint[], %(max_defer_ms)s::bigint[], %(pool)s::text[],
    %(start_at)s::timestamptz[], %(start_tolerance_ms)s::bigint[], %(on_miss)s::text[],
    %(estimated_duration_ms)s::bigint[], %(deps_pending)s::int[], %(resources)s::text[],
    %(latest_start)s::timestamptz[], %(planned_release_at)s::timestamptz[], %(planned_intensity)s::float8[],
    %(plan_reason)s::text[], %(headers)s::text[], %(allowed_pools)s::text[], %(planned_pool)s::text[],
    %(signal_at_submit)s::float8[]
) WITH ORDINALITY AS n(queue, kind, activity_type, payload, priority, idempotency_key, max_attempts,
                      initial_backoff_ms, backoff_coefficient, max_backoff_ms, non_retryable,
                      schedule_to_start_ms, start_to_close_ms, heartbeat_ms, max_defer_ms, pool,
                      start_at, start_tolerance_ms, on_miss, estimated_duration_ms, deps_pending, resources,
                      latest_start, planned_release_at, planned_intensity, plan_reason, headers,
                      allowed_pools, planned_pool, signal_at_submit, ord)
ORDER BY n.ord
ON CONFLICT (idempotency_key, submitted_by) WHERE idempotency_key IS NOT NULL DO NOTHING

-- _wake_if_stored --
-- Wakes every replica's dispatch at commit (as notify_wake) when the statement stored any task.
woken AS (
    SELECT pg_notify('lowtide_wake', %(wake)s) FROM (SELECT FROM inserted LIMIT 1) AS stored
)

-- insert_tasks --
-- Stores a batch of tasks (the id and key of each one stored), and wakes every replica's dispatch
-- in the same statement: a submission of plain tasks is this one statement, without a transaction.
WITH inserted AS (
    {{_insert_tasks}}
    RETURNING id, idempotency_key
),
{{_wake_if_stored}}
SELECT id, idempotency_key FROM inserted LEFT JOIN woken ON true

-- insert_tasks_whole --
-- insert_tasks for a submission that answers with the tasks as stored (SubmitTask): each whole,
-- so nothing is read back after. Only plain tasks are stored this way, which depend on nothing.
-- Its text stays under 4 KB (as compacted, lowtide/db/queries.py): psycopg parses a longer one
-- again on every execution (about 0.2 ms of the scheduler's CPU an insert).
WITH inserted AS (
    {{_insert_tasks}}
    RETURNING *
),
{{_wake_if_stored}}
SELECT t.*, NULL::bigint[] AS depends_on FROM inserted t LEFT JOIN woken ON true

-- _insert_handed --
-- The insert of insert_tasks_whole for a group of plain single submits (no key, dependency or fixed
-- start; see tasks/submit_groups.py) some of which this replica hands straight to an idle slot.
-- %(group)s holds the tasks as JSON, an object a task keyed by column, with `worker`, the worker
-- it is handed to (NULL: none): psycopg dumps one parameter far faster than an array a column
-- (store/submissions.py, handed_group). A task with a worker is stored as its first attempt
-- running on that worker, as a claim would start it (_start_attempt), unless its queue is paused,
-- the worker's lease ran out, or a due task of its queue and type waits already (that one goes
-- first: the new one is stored pending and claimed in turn).
-- Each check is a probe per task (OFFSET 0 keeps PostgreSQL from hashing a subquery instead): the
-- statement keeps one generic plan (store/submissions.py), made while the table may be near empty,
-- and a hashed check would then read every due pending task on every insert once a backlog grows.
INSERT INTO lowtide.tasks (
    queue, kind, activity_type, payload, priority, max_attempts, initial_backoff_ms,
    backoff_coefficient, max_backoff_ms, non_retryable_error_types, schedule_to_start_ms,
    start_to_close_ms, heartbeat_ms, schedule_to_start_deadline, max_defer_ms, hold_deadline,
    signal_at_submit, pool, estimated_duration_ms, run_at, resources, latest_start,
    planned_release_at, planned_intensity, plan_reason, submitted_by, headers, pools, planned_pool,
    state, attempt, worker_id, started_at, close_deadline, heartbeat_deadline, signal_at_dispatch
)
SELECT n.queue, n.kind, n.activity_type, n.payload, n.priority, n.max_attempts, n.initial_backoff_ms,
       n.backoff_coefficient, n.max_backoff_ms, string_to_array(n.non_retryable, E'\x1f'),
       n.schedule_to_start_ms, n.start_to_close_ms, n.heartbeat_ms,
       CASE WHEN h.worker_id IS NULL THEN now() + n.schedule_to_start_ms * interval '1 millisecond' END,
       n.max_defer_ms,
       -- As _insert_tasks (a plain task has no fixed start; one placed in a pool is the
       -- others' only from its latest start).
       CASE WHEN n.kind = 'activity' AND n.planned_pool IS NOT NULL THEN n.latest_start - %(release_lead)s::interval
            WHEN n.kind = 'activity' THEN LEAST(n.latest_start - %(release_lead)s::interval, n.planned_release_at) END,
       n.signal_at_submit, n.pool, n.estimated_duration_ms,
       CASE WHEN n.planned_pool IS NOT NULL THEN GREATEST(n.latest_start - %(release_lead)s::interval, now())
            ELSE GREATEST(n.planned_release_at, now()) END,
       n.resources::jsonb, n.latest_start, n.planned_release_at, n.planned_intensity, n.plan_reason,
       %(submitted_by)s::text, n.headers::jsonb, string_to_array(n.allowed_pools, E'\x1f'), n.planned_pool,
       CASE WHEN h.worker_id IS NULL THEN 'pending' ELSE 'running' END,
       CASE WHEN h.worker_id IS NULL THEN 0 ELSE 1 END,
       h.worker_id, h.at, h.at + n.start_to_close_ms * interval '1 millisecond',
       -- Handed only to pools not bound to a signal of their own: the default signal's value.
       h.at + n.heartbeat_ms * interval '1 millisecond', CASE WHEN h.at IS NOT NULL THEN %(signal)s::float8 END
FROM ROWS FROM (json_to_recordset(%(group)s::json) AS (
    queue text, kind text, activity_type text, payload bytea, priority int, max_attempts int,
    initial_backoff_ms bigint, backoff_coefficient float8, max_backoff_ms bigint, non_retryable text,
    schedule_to_start_ms bigint, start_to_close_ms bigint, heartbeat_ms bigint, max_defer_ms bigint,
    pool text, estimated_duration_ms bigint, resources text, latest_start timestamptz,
    planned_release_at timestamptz, planned_intensity float8, plan_reason text, headers text, worker text,
    allowed_pools text, planned_pool text, signal_at_submit float8
)) WITH ORDINALITY AS n
LEFT JOIN LATERAL (
    SELECT n.worker AS worker_id, now() AS at
    WHERE n.worker IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM lowtide.queues q WHERE q.name = n.queue AND q.paused OFFSET 0)
      AND EXISTS (SELECT 1 FROM lowtide.workers w WHERE w.id = n.worker AND w.lease_expires_at > now() OFFSET 0)
      AND NOT EXISTS (
          SELECT 1 FROM lowtide.tasks t
          WHERE t.state = 'pending' AND t.start_at IS NULL AND t.resources IS NULL AND t.queue = n.queue
            AND t.activity_type = n.activity_type AND t.run_at <= now()
          OFFSET 0
      )
) h ON true
ORDER BY n.ordinality
RETURNING *

-- _woken_if_pending --
-- Wakes every replica's dispatch at commit (as notify_wake) when the group stored a pending task.
woken AS (
    SELECT pg_notify('lowtide_wake', %(wake)s) FROM (SELECT FROM inserted WHERE state = 'pending' LIMIT 1) AS stored
)

-- insert_tasks_handed --
-- A group of plain single submits stored, some handed to idle slots (_insert_handed). Every
-- column of each task (a TaskRow); a plain task depends on nothing.
WITH inserted AS (
    {{_insert_handed}}
),
{{_woken_if_pending}}
SELECT t.*, NULL::bigint[] AS depends_on FROM inserted t LEFT JOIN woken ON true

-- insert_tasks_handed_finishing --
-- insert_tasks_handed with workers' reports written in the same statement, one round trip and one
-- commit for both (tasks/submission.py lends them to the group). The reports applied (_finish_lent)
-- come back in the last column of the first task's row (NULL in the others), a JSON array of
-- [id, attempt, state, has_dependents, queue, activity_type, run time in seconds]. The two writes
-- change different rows, and neither reads what the other writes. Over 4 KB: run positional
-- (lowtide.db.queries.Positional), so psycopg does not parse it on every execution.
WITH {{_finish_lent}},
inserted AS (
    {{_insert_handed}}
),
{{_woken_if_pending}}
SELECT t.*, NULL::bigint[] AS depends_on,
       CASE WHEN t.id = (SELECT min(id) FROM inserted) THEN (
           SELECT json_agg(json_build_array(f.id, f.attempt, f.state, f.has_dependents, f.queue, f.activity_type,
                                            extract(epoch FROM f.run_time)))
           FROM finished f
       ) END AS finished
FROM inserted t LEFT JOIN woken ON true

-- tasks_by_idempotency_key --
-- The ids of this submitter's existing tasks with these idempotency keys (NULL: auth off).
SELECT id, idempotency_key FROM lowtide.tasks
WHERE idempotency_key = ANY(%(keys)s::text[]) AND submitted_by IS NOT DISTINCT FROM %(submitted_by)s::text

-- register_queues --
-- Records the queues new tasks go to (once per queue), so an idle queue keeps its metrics.
INSERT INTO lowtide.queues (name)
SELECT DISTINCT q FROM unnest(%(queues)s::text[]) AS q
ON CONFLICT (name) DO NOTHING

-- lock_pools --
-- Serialises admission per pool across replicas, until the transaction ends.
SELECT pg_advisory_xact_lock(hashtext('lowtide.pool:' || p)) FROM unnest(%(pools)s::text[]) AS p ORDER BY p

-- overlapping_reservations --
-- Reservations of live fixed-start tasks in a pool that overlap a window.
SELECT r.task_id, r.window_start, r.window_end
FROM lowtide.reservations r
JOIN lowtide.tasks t ON t.id = r.task_id AND t.state IN ('pending', 'running')
WHERE r.pool = %(pool)s AND r.window_start < %(window_end)s AND r.window_end > %(window_start)s

-- insert_reservations --
-- Books the windows of newly admitted fixed starts.
INSERT INTO lowtide.reservations (task_id, pool, window_start, window_end)
SELECT * FROM unnest(%(task_ids)s::bigint[], %(pools)s::text[], %(starts)s::timestamptz[], %(ends)s::timestamptz[])

-- lock_dependencies --
-- The tasks a submission depends on, locked against finishing until it commits (so none can
-- finish unseen between this check and the dependency rows being written).
SELECT id, state FROM lowtide.tasks WHERE id = ANY(%(ids)s::bigint[]) FOR SHARE

-- insert_dependencies --
-- Records what new tasks depend on, and marks the tasks depended on.
WITH rows AS (
    INSERT INTO lowtide.task_dependencies (task_id, depends_on)
    SELECT * FROM unnest(%(task_ids)s::bigint[], %(depends_on)s::bigint[])
    RETURNING depends_on
)
UPDATE lowtide.tasks SET has_dependents = true WHERE id IN (SELECT depends_on FROM rows)

-- lock_queues --
-- Serialises submits to queues with a max_depth, until the transaction ends.
SELECT pg_advisory_xact_lock(hashtext('lowtide.queue:' || q)) FROM unnest(%(queues)s::text[]) AS q ORDER BY q

-- claimable_depth --
-- Pending tasks of a queue that count against max_depth: not fixed starts, not held. Counted in
-- two parts, each on the claim index that holds it (regular work; work that needs resources), so
-- a submit to a limited queue reads that queue's pending tasks, not the table: one condition for
-- both, which no index matched, read every pending task or the whole table (250 ms a submit, under
-- the queue's lock, with 2,300,000 tasks kept).
SELECT ((SELECT count(*) FROM lowtide.tasks
         WHERE queue = %(queue)s AND state = 'pending' AND start_at IS NULL AND resources IS NULL
           AND NOT (activity_type = ANY(%(held)s::text[]) AND kind = 'activity'))
      + (SELECT count(*) FROM lowtide.tasks
         WHERE queue = %(queue)s AND state = 'pending' AND start_at IS NULL AND resources IS NOT NULL
           AND NOT (activity_type = ANY(%(held)s::text[]) AND kind = 'activity')))::int AS depth

-- shed_lowest --
-- Sheds the lowest-priority claimable pending tasks of a queue (newest first among equals).
UPDATE lowtide.tasks t
SET state = 'shed', finished_at = now(), shed_reason = %(reason)s, schedule_to_start_deadline = NULL
WHERE t.id IN (
    SELECT id FROM lowtide.tasks
    WHERE queue = %(queue)s AND state = 'pending' AND start_at IS NULL
      AND NOT (activity_type = ANY(%(held)s::text[]) AND kind = 'activity')
    ORDER BY priority ASC, created_at DESC, id DESC
    LIMIT %(count)s
    FOR UPDATE SKIP LOCKED
)
RETURNING t.id, t.state, t.has_dependents

-- shed_oldest --
-- Sheds the oldest claimable pending tasks of a queue.
UPDATE lowtide.tasks t
SET state = 'shed', finished_at = now(), shed_reason = %(reason)s, schedule_to_start_deadline = NULL
WHERE t.id IN (
    SELECT id FROM lowtide.tasks
    WHERE queue = %(queue)s AND state = 'pending' AND start_at IS NULL
      AND NOT (activity_type = ANY(%(held)s::text[]) AND kind = 'activity')
    ORDER BY created_at ASC, id ASC
    LIMIT %(count)s
    FOR UPDATE SKIP LOCKED
)
RETURNING t.id, t.state, t.has_dependents
