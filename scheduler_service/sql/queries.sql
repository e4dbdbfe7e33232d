-- _insert_tasks --
-- A batch of tasks inserted, but a row whose idempotency key the same submitter used already.
INSERT INTO lowtide.tasks (
    queue, kind, activity_type, payload, priority, idempotency_key,
    max_attempts, initial_backoff_ms, backoff_coefficient, max_backoff_ms, non_retryable_error_types,
    schedule_to_start_ms, start_to_close_ms, heartbeat_ms, schedule_to_start_deadline,
    max_defer_ms, hold_deadline, signal_at_submit,
    pool, start_at, start_tolerance_ms, on_miss, estimated_duration_ms, run_at, deps_pending, resources,
    latest_start, planned_release_at, planned_intensity, plan_reason, submitted_by, headers
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
       -- releases the task a scheduling step (release_lead) before it, so it starts by then.
       CASE WHEN n.kind = 'activity' AND n.start_at IS NULL
            THEN LEAST(n.latest_start - %(release_lead)s::interval, n.planned_release_at) END,
       %(signal)s::float8,
       n.pool, n.start_at, n.start_tolerance_ms, n.on_miss, n.estimated_duration_ms,
       CASE WHEN n.deps_pending > 0 THEN '9999-01-01 00:00:00+00'::timestamptz
            ELSE COALESCE(n.start_at, GREATEST(n.planned_release_at, now()), now()) END,
       n.deps_pending, n.resources::jsonb,
       n.latest_start, n.planned_release_at, n.planned_intensity, n.plan_reason, %(submitted_by)s::text,
       n.headers::jsonb
FROM unnest(
    %(queues)s::text[], %(kinds)s::text[], %(activity_types)s::text[], %(payloads)s::bytea[],
    %(priorities)s::int[], %(idempotency_keys)s::text[], %(max_attempts)s::int[],
    %(initial_backoff_ms)s::bigint[], %(backoff_coefficients)s::float8[], %(max_backoff_ms)s::bigint[],
    %(non_retryable)s::text[], %(schedule_to_start_ms)s::bigint[], %(start_to_close_ms)s::bigint[],
    %(heartbeat_ms)s::bigint[], %(max_defer_ms)s::bigint[], %(pools)s::text[],
    %(start_ats)s::timestamptz[], %(start_tolerance_ms)s::bigint[], %(on_miss)s::text[],
    %(estimated_duration_ms)s::bigint[], %(deps_pending)s::int[], %(resources)s::text[],
    %(latest_starts)s::timestamptz[], %(planned_release_ats)s::timestamptz[], %(planned_intensities)s::float8[],
    %(plan_reasons)s::text[], %(headers)s::text[]
) WITH ORDINALITY AS n(queue, kind, activity_type, payload, priority, idempotency_key, max_attempts,
                      initial_backoff_ms, backoff_coefficient, max_backoff_ms, non_retryable,
                      schedule_to_start_ms, start_to_close_ms, heartbeat_ms, max_defer_ms, pool,
                      start_at, start_tolerance_ms, on_miss, estimated_duration_ms, deps_pending, resources,
                      latest_start, planned_release_at, planned_intensity, plan_reason, headers, ord)
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
-- so nothing is read back after.
WITH inserted AS (
    {{_insert_tasks}}
    RETURNING *
),
{{_wake_if_stored}}
SELECT {{_task_row}}, t.payload, t.result, t.heartbeat_details FROM inserted t LEFT JOIN woken ON true

-- tasks_by_idempotency_key --
-- The ids of this submitter's existing tasks with these idempotency keys (NULL: auth off).
SELECT id, idempotency_key FROM lowtide.tasks
WHERE idempotency_key = ANY(%(keys)s::text[]) AND submitted_by IS NOT DISTINCT FROM %(submitted_by)s::text

-- notify_wake --
-- Wakes the dispatchers of every replica (at commit); the payload names the new (queue, type)
-- pairs, so a replica can park a wake-up whose types are all held.
SELECT pg_notify('lowtide_wake', %(payload)s)

-- _task_row --
-- A task whole (a TaskRow, scheduler_service/rows/tasks.py) but for its payload and result, which
-- a listing leaves out: every column of lowtide.tasks, and what the task depends on.
t.id, t.queue, t.kind, t.activity_type, t.priority, t.idempotency_key, t.state, t.attempt,
       t.max_attempts, t.initial_backoff_ms, t.backoff_coefficient, t.max_backoff_ms,
       t.non_retryable_error_types, t.schedule_to_start_ms, t.start_to_close_ms, t.heartbeat_ms,
       t.created_at, t.run_at, t.schedule_to_start_deadline, t.started_at, t.finished_at, t.worker_id,
       t.close_deadline, t.heartbeat_deadline, t.error_type, t.error_message, t.error_non_retryable,
       t.cancel_requested, t.max_defer_ms, t.hold_deadline, t.released_by, t.signal_at_submit,
       t.signal_at_dispatch, t.pool, t.start_at, t.start_tolerance_ms, t.on_miss, t.estimated_duration_ms,
       t.missed, t.miss_reason, t.start_hit, t.deps_pending, t.has_dependents, t.shed_reason, t.resources,
       t.latest_start, t.planned_release_at, t.planned_intensity, t.plan_reason, t.submitted_by,
       t.headers, (SELECT array_agg(d.depends_on ORDER BY d.depends_on) FROM lowtide.task_dependencies d
        WHERE d.task_id = t.id) AS depends_on

-- get_task --
-- One task, whole, with what it depends on.
SELECT {{_task_row}}, t.payload, t.result, t.heartbeat_details
FROM lowtide.tasks t WHERE t.id = %(id)s

-- list_tasks --
-- A page of tasks, newest first, without payloads and results.
SELECT {{_task_row}}, ''::bytea AS payload, NULL::bytea AS result, NULL::bytea AS heartbeat_details
FROM lowtide.tasks t
WHERE (%(queue)s::text IS NULL OR t.queue = %(queue)s::text)
  AND (%(state)s::text IS NULL OR t.state = %(state)s::text)
  AND (%(activity_type)s::text IS NULL OR t.activity_type = %(activity_type)s::text)
  AND (%(before_id)s::bigint IS NULL OR t.id < %(before_id)s::bigint)
  AND (%(from_id)s::bigint IS NULL OR t.id >= %(from_id)s::bigint)
ORDER BY t.id DESC
LIMIT %(limit)s

-- list_tasks_in_state --
-- A page of tasks in one state, newest first (list_tasks filtered by state alone), read on
-- tasks_state_id.
-- The state is given as a range of (state, id), not as state = ..., so that the order asked for
-- is one only that index gives: with the state fixed, the planner could walk the primary key down
-- from the newest task and filter by state instead, and did, on a guess that the state's tasks
-- are spread evenly (a page of pending tasks under 1,300,000 newer finished ones read all of
-- those, 674 ms).
SELECT {{_task_row}}, ''::bytea AS payload, NULL::bytea AS result, NULL::bytea AS heartbeat_details
FROM lowtide.tasks t
WHERE (t.state, t.id) > (%(state)s::text, 0)
  AND (t.state, t.id) < (%(state)s::text, COALESCE(%(before_id)s::bigint, 9223372036854775807))
ORDER BY t.state DESC, t.id DESC
LIMIT %(limit)s

-- next_task_id --
-- One above the newest task's id (1 with no tasks): where a filtered listing's first page starts.
SELECT COALESCE(max(id), 0) + 1 AS id FROM lowtide.tasks

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
          AND t.activity_type = p.activity_type AND t.run_at <= now()
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
          AND t.activity_type = p.activity_type AND t.run_at <= now()
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
        ORDER BY t.hold_deadline
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
    SELECT t.id, c.released_by, c.ord
    FROM chosen c JOIN lowtide.tasks t ON t.id = c.id
    WHERE t.state = 'pending'
    ORDER BY c.ord
    LIMIT (SELECT count(*) FROM slots)
    FOR UPDATE OF t SKIP LOCKED
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
-- one type, or a group whose other types are at their limits): rows are taken straight off the
-- pending index in order and locked as they are read, skipping those another claimer is taking,
-- up to the free slots or the pair's cap. Nothing is read twice and nothing is locked that is
-- not taken. Which slot a row goes to follows the order they were locked in.
WITH {{_claim_slots}},
locked AS (
    SELECT t.id
    FROM lowtide.tasks t
    WHERE t.state = 'pending' AND t.start_at IS NULL AND t.resources IS NULL AND t.queue = %(queue)s::text
      AND t.activity_type = %(activity_type)s::text AND t.run_at <= now()
      AND EXISTS (SELECT 1 FROM live)
      AND NOT EXISTS (SELECT 1 FROM lowtide.queues q WHERE q.name = %(queue)s::text AND q.paused)
    ORDER BY t.priority DESC, t.run_at, t.id
    LIMIT LEAST(%(cap)s::int, (SELECT count(*) FROM slots))
    FOR UPDATE OF t SKIP LOCKED
),
taken AS (
    SELECT id, row_number() OVER () AS nth FROM locked
)
UPDATE lowtide.tasks t
SET {{_start_attempt}},
    released_by = NULL
FROM taken JOIN slots slot USING (nth)
WHERE t.id = taken.id
RETURNING {{_started_attempt}}

-- unclaim_tasks --
-- Hands claimed attempts back untouched (their worker left before they were sent). Each found by
-- its id (see _finish_fenced).
UPDATE lowtide.tasks t
SET state = 'pending', attempt = t.attempt - 1, worker_id = NULL, started_at = NULL,
    close_deadline = NULL, heartbeat_deadline = NULL,
    schedule_to_start_deadline = t.run_at + t.schedule_to_start_ms * interval '1 millisecond'
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(worker_ids)s::text[]) AS u(id, attempt, worker_id)
WHERE t.id = u.id AND t.attempt = u.attempt AND t.state IS NOT DISTINCT FROM 'running'
  AND t.worker_id = u.worker_id

-- _finish_fenced --
-- Applies what follows a batch of attempts, fenced by (id, attempt, running, worker): a report
-- for an attempt that is no longer the worker's changes nothing and is left out of RETURNING,
-- which also gives the attempt's labels and run time for the task metrics. Each row is found by
-- its id: `IS NOT DISTINCT FROM 'running'` (state is never NULL, so it means `=`) keeps the
-- running-only indexes out of the plan, whose scan reads every running attempt and which the
-- planner picks when its statistics say few run (with 60,000 running after an ANALYZE that saw
-- 20: 84 ms a batch of 64, against 2.4 ms by id).
UPDATE lowtide.tasks t
SET state = o.state,
    result = o.result,
    error_type = COALESCE(o.error_type, t.error_type),
    error_message = COALESCE(o.error_message, t.error_message),
    error_non_retryable = COALESCE(o.non_retryable, t.error_non_retryable),
    run_at = COALESCE(o.run_at, t.run_at),
    finished_at = CASE WHEN o.state = 'pending' THEN NULL ELSE now() END,
    schedule_to_start_deadline = CASE WHEN o.state = 'pending'
        THEN o.run_at + t.schedule_to_start_ms * interval '1 millisecond' END,
    worker_id = CASE WHEN o.state = 'pending' THEN NULL ELSE t.worker_id END,
    close_deadline = NULL,
    heartbeat_deadline = NULL
FROM unnest(
    %(ids)s::bigint[], %(attempts)s::int[], %(worker_ids)s::text[], %(states)s::text[],
    %(results)s::bytea[], %(error_types)s::text[], %(error_messages)s::text[],
    %(non_retryable)s::bool[], %(run_ats)s::timestamptz[]
) AS o(id, attempt, worker_id, state, result, error_type, error_message, non_retryable, run_at)
WHERE t.id = o.id AND t.attempt = o.attempt AND t.state IS NOT DISTINCT FROM 'running'
  AND (o.worker_id IS NULL OR t.worker_id = o.worker_id)

-- finish_attempts --
-- A batch's outcomes (see _finish_fenced), in the transaction that also settles the dependents of
-- the tasks that ended (store.tasks.settle).
{{_finish_fenced}}
RETURNING t.id, t.attempt, t.state, t.has_dependents, t.queue, t.activity_type, now() - t.started_at AS run_time

-- finish_independent_attempts --
-- The batch's outcomes for tasks nothing depends on, in one statement on its own (no BEGIN and
-- COMMIT round trips): there are no dependents to settle with it. A task that gains a dependent
-- meanwhile is left out (a submission locks it FOR SHARE until it commits, and the row is checked
-- again once that lock is gone), and so is every stale report: finish_attempts takes the rest.
{{_finish_fenced}}
  AND NOT t.has_dependents
RETURNING t.id, t.attempt, t.state, t.has_dependents, t.queue, t.activity_type, now() - t.started_at AS run_time

-- running_attempts_of_worker --
-- The attempts a worker runs, locked, to end them when the worker is gone; none when the worker
-- has connected to another replica meanwhile (that replica's stream holds them now).
SELECT id, attempt, max_attempts, initial_backoff_ms, backoff_coefficient, max_backoff_ms,
       non_retryable_error_types, start_at
FROM lowtide.tasks
WHERE state = 'running' AND worker_id = %(worker_id)s
  AND NOT EXISTS (
      SELECT 1 FROM lowtide.workers w WHERE w.id = %(worker_id)s AND w.scheduler_id <> %(scheduler_id)s
  )
FOR UPDATE SKIP LOCKED

-- adopt_attempts --
-- The attempts a reconnecting worker says it still runs and that are still its own.
SELECT id, attempt, max_attempts, initial_backoff_ms, backoff_coefficient, max_backoff_ms,
       non_retryable_error_types, start_at
FROM lowtide.tasks t
JOIN unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS u(id, attempt) USING (id, attempt)
WHERE t.state = 'running' AND t.worker_id = %(worker_id)s

-- _attempt_expired --
-- A running attempt past a deadline or whose worker's lease is gone (t: the task, w: its worker,
-- LEFT JOINed): what expired_attempts takes and maintenance_due looks for.
t.state = 'running'
  AND (t.close_deadline < now() OR t.heartbeat_deadline < now()
       OR w.id IS NULL OR w.lease_expires_at < now())

-- _expired_candidates --
-- The ids of running attempts that may have expired (_attempt_expired says which have), each kind
-- read on an index of its own, so that a tick costs what is due and what the workers number, never
-- what runs: past their start-to-close or heartbeat deadline; or of a worker whose lease has run
-- out, or whose row is gone (a release that passed over a locked attempt, then forgot the worker).
-- Those last are found among the distinct workers of running attempts, read from
-- tasks_running_worker one worker at a time (a skip scan: one index lookup per worker).
SELECT id FROM lowtide.tasks WHERE state = 'running' AND close_deadline < now()
UNION ALL
SELECT id FROM lowtide.tasks WHERE state = 'running' AND heartbeat_deadline < now()
UNION ALL
SELECT id FROM lowtide.tasks
WHERE state = 'running' AND worker_id IN (
    SELECT id FROM lowtide.workers WHERE lease_expires_at < now()
    UNION ALL
    SELECT r.worker_id FROM (
        WITH RECURSIVE r(worker_id) AS (
            (SELECT worker_id FROM lowtide.tasks WHERE state = 'running' ORDER BY worker_id LIMIT 1)
            UNION ALL
            SELECT (SELECT t.worker_id FROM lowtide.tasks t
                    WHERE t.state = 'running' AND t.worker_id > r.worker_id ORDER BY t.worker_id LIMIT 1)
            FROM r WHERE r.worker_id IS NOT NULL
        )
        SELECT worker_id FROM r
    ) r
    WHERE r.worker_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM lowtide.workers w WHERE w.id = r.worker_id)
)

-- expired_attempts --
-- Running attempts past a deadline or whose worker's lease is gone, locked, with the reason.
SELECT t.id, t.attempt, t.max_attempts, t.initial_backoff_ms, t.backoff_coefficient,
       t.max_backoff_ms, t.non_retryable_error_types, t.start_at, t.worker_id,
       CASE WHEN t.close_deadline < now() THEN 'StartToCloseTimeout'
            WHEN t.heartbeat_deadline < now() THEN 'HeartbeatTimeout'
            ELSE 'WorkerLost' END AS reason
FROM lowtide.tasks t
LEFT JOIN lowtide.workers w ON w.id = t.worker_id
WHERE t.id IN ({{_expired_candidates}}) AND {{_attempt_expired}}
LIMIT %(limit)s
FOR UPDATE OF t SKIP LOCKED

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

-- expire_schedule_to_start --
-- Ends pending tasks whose start deadline has passed.
UPDATE lowtide.tasks
SET state = 'timed_out', finished_at = now(), error_type = 'ScheduleToStartTimeout',
    error_message = 'not started within its schedule_to_start timeout', error_non_retryable = true,
    schedule_to_start_deadline = NULL
WHERE id IN (
    SELECT id FROM lowtide.tasks
    WHERE {{_start_deadline_passed}} AND deps_pending = 0
      AND queue NOT IN (SELECT name FROM lowtide.queues WHERE paused)
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING id, state, has_dependents

-- heartbeat_attempts --
-- Pushes back the heartbeat deadline of running attempts that heartbeats of any of this replica's
-- workers listed, in one statement for all of them: each from when its heartbeat arrived
-- (age_ms ago), and only while the attempt still runs on the worker that listed it. Worker ids come
-- joined by E'\x1f'. Each found by its id (see _finish_fenced).
UPDATE lowtide.tasks t
SET heartbeat_deadline = now() + (t.heartbeat_ms - u.age_ms) * interval '1 millisecond'
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], string_to_array(%(workers)s::text, E'\x1f'),
            %(ages)s::int[]) AS u(id, attempt, worker_id, age_ms)
WHERE t.id = u.id AND t.attempt = u.attempt AND t.state IS NOT DISTINCT FROM 'running'
  AND t.worker_id = u.worker_id AND t.heartbeat_ms IS NOT NULL

-- heartbeat_details --
-- Stores the heartbeat details a worker sent for its running attempts (the newest wins).
UPDATE lowtide.tasks t
SET heartbeat_details = u.details
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(details)s::bytea[]) AS u(id, attempt, details)
WHERE t.id = u.id AND t.attempt = u.attempt AND t.state = 'running' AND t.worker_id = %(worker_id)s

-- cancel_task --
-- Ends a pending or running task as cancelled; returns it with the state it had before.
WITH old AS (
    SELECT id, state, attempt, worker_id FROM lowtide.tasks WHERE id = %(id)s FOR UPDATE
)
UPDATE lowtide.tasks t
SET cancel_requested = true,
    state = CASE WHEN old.state IN ('pending', 'running') THEN 'cancelled' ELSE t.state END,
    finished_at = CASE WHEN old.state IN ('pending', 'running') THEN now() ELSE t.finished_at END,
    close_deadline = NULL,
    heartbeat_deadline = NULL,
    schedule_to_start_deadline = NULL
FROM old
WHERE t.id = old.id
RETURNING {{_task_row}}, t.payload, t.result, t.heartbeat_details, old.state AS previous_state

-- lock_task --
-- One task, whole, locked until the transaction ends (RetryTask reads it and its dependencies
-- before it changes it).
SELECT {{_task_row}}, t.payload, t.result, t.heartbeat_details
FROM lowtide.tasks t WHERE t.id = %(id)s
FOR UPDATE

-- dependency_states_of --
-- The state of each task this task depends on, locked against finishing until commit (as
-- lock_dependencies does for a submission).
SELECT d.id, d.state
FROM lowtide.task_dependencies e
JOIN lowtide.tasks d ON d.id = e.depends_on
WHERE e.task_id = %(id)s
FOR SHARE OF d

-- retry_task --
-- Makes a task that ended without completing pending again (domain.retry decided it may be): due
-- now, or, while %(deps_pending)s of its dependencies have not finished, not due until they have
-- (as a submission waiting for dependencies is, see _insert_tasks); one more attempt if it had
-- used all of its own; its schedule_to_start and max_defer counted from now, and a cost hold
-- holding it no longer than its latest start (one already past: not at all). Its last failure
-- stays on it until the next attempt ends.
UPDATE lowtide.tasks t
SET state = 'pending', finished_at = NULL, worker_id = NULL,
    run_at = CASE WHEN %(deps_pending)s::int > 0 THEN '9999-01-01 00:00:00+00'::timestamptz ELSE now() END,
    max_attempts = GREATEST(t.max_attempts, t.attempt + 1),
    deps_pending = %(deps_pending)s::int,
    cancel_requested = false, shed_reason = NULL, released_by = NULL,
    close_deadline = NULL, heartbeat_deadline = NULL,
    schedule_to_start_deadline = CASE WHEN %(deps_pending)s::int = 0
        THEN now() + t.schedule_to_start_ms * interval '1 millisecond' END,
    hold_deadline = CASE WHEN t.kind = 'activity'
        THEN LEAST(t.latest_start, now() + t.max_defer_ms * interval '1 millisecond') END,
    planned_release_at = NULL, planned_intensity = NULL, plan_reason = NULL
WHERE t.id = %(id)s
RETURNING {{_task_row}}, t.payload, t.result, t.heartbeat_details

-- notify_cancel --
-- Tells every replica to stop an attempt on its worker (payload: id:attempt:worker).
SELECT pg_notify('lowtide_cancel', %(payload)s)

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

-- register_queues --
-- Records the queues new tasks go to (once per queue), so an idle queue keeps its metrics.
INSERT INTO lowtide.queues (name)
SELECT DISTINCT q FROM unnest(%(queues)s::text[]) AS q
ON CONFLICT (name) DO NOTHING

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
      AND t.resources IS NULL
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

-- upcoming_fixed --
-- First attempts of fixed-start tasks in these pools starting before a horizon, for slot holds
-- (a late one that runs late keeps its hold while it waits for dependencies or resources).
SELECT id, pool, queue, activity_type, start_at, start_tolerance_ms, on_miss, estimated_duration_ms
FROM lowtide.tasks
WHERE state = 'pending' AND start_at IS NOT NULL AND attempt = 0
  AND pool = ANY(%(pools)s::text[]) AND start_at <= %(horizon)s
ORDER BY start_at
LIMIT 1000

-- _start_missed --
-- A fixed start's first attempt not started by start + tolerance and not yet marked (t: the
-- task): what missed_fixed takes and maintenance_due looks for. The first bound follows from the
-- second (a tolerance counts as 50 ms at least) and keeps the look on tasks_start_unmarked, among
-- the starts already past.
t.state = 'pending' AND t.start_at IS NOT NULL AND t.attempt = 0 AND NOT t.missed
  AND t.start_at < now() - interval '50 milliseconds'
  AND t.start_at + GREATEST(t.start_tolerance_ms, 50) * interval '1 millisecond' < now()

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

-- release_dependents --
-- Completed tasks count down their dependents; a dependent with none left becomes due.
WITH done AS (
    SELECT d.task_id, count(*)::int AS n
    FROM lowtide.task_dependencies d
    WHERE d.depends_on = ANY(%(ids)s::bigint[])
    GROUP BY d.task_id
)
UPDATE lowtide.tasks t
SET deps_pending = t.deps_pending - done.n,
    run_at = CASE WHEN t.deps_pending - done.n <= 0
                  THEN GREATEST(now(), COALESCE(t.start_at, now())) ELSE t.run_at END,
    schedule_to_start_deadline = CASE WHEN t.deps_pending - done.n <= 0
        THEN GREATEST(now(), COALESCE(t.start_at, now())) + t.schedule_to_start_ms * interval '1 millisecond' END
FROM done
WHERE t.id = done.task_id AND t.state = 'pending'
RETURNING t.id, t.queue, t.activity_type, t.pool, t.start_at, t.deps_pending

-- fail_dependents --
-- Tasks that ended without completing fail everything that depends on them, transitively.
WITH RECURSIVE doomed (task_id, cause) AS (
    SELECT d.task_id, d.depends_on FROM lowtide.task_dependencies d WHERE d.depends_on = ANY(%(ids)s::bigint[])
    UNION
    SELECT d.task_id, doomed.task_id FROM lowtide.task_dependencies d JOIN doomed ON d.depends_on = doomed.task_id
),
first_cause AS (
    SELECT DISTINCT ON (task_id) task_id, cause FROM doomed ORDER BY task_id, cause
)
UPDATE lowtide.tasks t
SET state = 'failed', finished_at = now(), error_type = 'DependencyFailed',
    error_message = 'dependency task ' || first_cause.cause || ' did not complete',
    error_non_retryable = true, schedule_to_start_deadline = NULL
FROM first_cause
WHERE t.id = first_cause.task_id AND t.state = 'pending'
RETURNING t.id

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
-- first, then by priority and FIFO; held (queue, type) pairs only for workflow tasks.
SELECT t.id, t.resources, t.start_at IS NOT NULL AS fixed
FROM lowtide.tasks t
WHERE t.state = 'pending' AND t.resources IS NOT NULL AND t.run_at <= now()
  AND t.queue = ANY(%(queues)s::text[]) AND t.activity_type = ANY(%(types)s::text[])
  AND t.queue NOT IN (SELECT name FROM lowtide.queues WHERE paused)
  AND (t.start_at IS NOT NULL AND t.pool = %(pool)s
       OR t.start_at IS NULL
          AND NOT (t.kind = 'activity' AND (t.queue || E'\x1f' || t.activity_type) = ANY(%(held)s::text[])))
ORDER BY (t.start_at IS NOT NULL) DESC, t.priority DESC, t.run_at, t.id
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

-- plannable_tasks --
-- Pending first attempts with a latest start: the tasks whose release the planner chooses.
SELECT id, queue, activity_type, kind, created_at, latest_start, estimated_duration_ms, planned_release_at
FROM lowtide.tasks
WHERE state = 'pending' AND attempt = 0 AND latest_start IS NOT NULL AND start_at IS NULL
  AND deps_pending = 0
ORDER BY latest_start
LIMIT 5000

-- recent_deferrable --
-- First attempts with a latest start submitted over the last `lookback`, of these types, counted
-- in 5-minute buckets by queue and type with their mean slack and duration: the work the planner
-- expects again (bounded: 288 buckets a day for each queue and type).
SELECT date_bin('5 minutes', created_at, TIMESTAMPTZ '2000-01-01 00:00:00+00') AS at,
       queue, activity_type, kind,
       (avg(EXTRACT(EPOCH FROM latest_start - created_at)) * 1000)::bigint AS slack_ms,
       avg(estimated_duration_ms)::bigint AS estimated_duration_ms,
       count(*)::int AS count
FROM lowtide.tasks
WHERE latest_start IS NOT NULL AND created_at > now() - %(lookback)s::interval
  AND activity_type = ANY(%(types)s::text[])
GROUP BY 1, 2, 3, 4
ORDER BY 1
LIMIT 20000

-- apply_plans --
-- Moves planned tasks' release (never past their latest start) and records why.
UPDATE lowtide.tasks t
SET run_at = CASE WHEN p.release_at IS NULL THEN t.run_at ELSE GREATEST(p.release_at, now()) END,
    hold_deadline = LEAST(t.latest_start - %(release_lead)s::interval, p.release_at),
    planned_release_at = p.release_at,
    planned_intensity = p.intensity,
    plan_reason = p.reason
FROM unnest(%(ids)s::bigint[], %(release_ats)s::timestamptz[], %(intensities)s::float8[], %(reasons)s::text[])
     AS p(id, release_at, intensity, reason)
WHERE t.id = p.id AND t.state = 'pending' AND t.attempt = 0

-- notify_plans --
-- Tells every replica that releases were planned, so each sets its own wake-up timers for them.
SELECT pg_notify('lowtide_plan', '')

-- upcoming_releases --
-- When planned tasks are due within a horizon (their release, or just before their latest start
-- if earlier): the times a replica wakes its dispatchers at, so work is claimed then, not a poll later.
SELECT DISTINCT hold_deadline AS due
FROM lowtide.tasks
WHERE state = 'pending' AND attempt = 0 AND latest_start IS NOT NULL
  AND hold_deadline > now() AND hold_deadline <= now() + %(horizon)s::interval
ORDER BY due
LIMIT 1000

-- live_reservations --
-- The windows of admitted fixed starts not finished yet (capacity a release plan must leave).
SELECT r.window_start, r.window_end
FROM lowtide.reservations r
JOIN lowtide.tasks t ON t.id = r.task_id AND t.state IN ('pending', 'running')
WHERE r.window_end > now()

-- finished_among --
-- Which of these tasks have finished (WaitTask's one check per replica for every waiter).
SELECT t.id FROM lowtide.tasks t
WHERE t.id = ANY(%(ids)s::bigint[]) AND {{_finished}}

-- notify_finished --
-- Tells every replica which tasks a batch of reports finished (payload: their ids, comma
-- separated), so each resolves its WaitTask waiters at once.
SELECT pg_notify('lowtide_done', %(payload)s)
