-- A task read, finished, expired, heartbeaten, cancelled or retried (store/tasks.py).
-- Fragments ({{_name}}) are shared by every file of this folder.

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
       t.headers, t.pools, t.planned_pool, (SELECT array_agg(d.depends_on ORDER BY d.depends_on) FROM lowtide.task_dependencies d
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

-- _finish_fenced --
-- Applies what follows a batch of attempts, fenced by (id, attempt, running, worker): a report
-- for an attempt that is no longer the worker's changes nothing and is left out of RETURNING,
-- which also gives the attempt's labels and run time for the task metrics. Each row is found by
-- its id: `IS NOT DISTINCT FROM 'running'` (state is never NULL, so it means `=`) keeps the
-- running-only indexes out of the plan, whose scan reads every running attempt and which the
-- planner picks when its statistics say few run (with 60,000 running after an ANALYZE that saw
-- 20: 84 ms a batch of 64, against 2.4 ms by id). Every statement of it is planned on each run
-- (lowtide.db.connector): a plan kept from when the table was all but empty scanned all of it for
-- each report.
{{_finish_set}}
FROM {{_finish_reports}}
{{_finish_where}}

-- _finish_set --
-- What a report sets (o: the report, t: its task).
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

-- _finish_reports --
-- The reports, one array per field.
unnest(
    %(ids)s::bigint[], %(attempts)s::int[], %(worker_ids)s::text[], %(states)s::text[],
    %(results)s::bytea[], %(error_types)s::text[], %(error_messages)s::text[],
    %(error_non_retryable)s::bool[], %(run_ats)s::timestamptz[]
) AS o(id, attempt, worker_id, state, result, error_type, error_message, non_retryable, run_at)

-- _finish_where --
-- The fence: the attempt is the report's, still running, on the worker that sent it.
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

-- _finish_lent --
-- finish_independent_attempts for the reports a group of single submits writes in its insert, as
-- two of its CTEs, `lent` and `finished` (insert_tasks_handed_finishing): a task whose row another
-- transaction holds (a submission locking it as a dependency, a release, a cancel) is left out for
-- the completer to write, so a submit never waits on a lock of another task's row, nor fails with
-- a deadlock or timeout it meets. It keeps the generic plan of the insert, made maybe on an all
-- but empty table, so each read is bound to the reports whatever the plan joins: each report's
-- task locked once (a CTE, materialized: not a filter run again for every pair the join tries),
-- and read by `t.id = ANY(ids)`.
lent AS MATERIALIZED (
    SELECT o.* FROM {{_finish_reports}}
    WHERE EXISTS (SELECT FROM lowtide.tasks l WHERE l.id = o.id FOR NO KEY UPDATE SKIP LOCKED)
),
finished AS (
    {{_finish_set}}
    FROM lent o
    {{_finish_where}}
      AND t.id = ANY(%(ids)s::bigint[])
      AND NOT t.has_dependents
    RETURNING t.id, t.attempt, t.state, t.has_dependents, t.queue, t.activity_type, now() - t.started_at AS run_time
)

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
-- tasks_running_worker one worker at a time (a skip scan: one index lookup per worker). The
-- attempts of each worker gone are then read by its id (a LATERAL probe, OFFSET 0: with
-- `worker_id IN (...)` PostgreSQL 18 walked every running attempt and semi-joined it with the
-- workers gone, none or few: 20,000 rows read a tick with 20,000 running).
SELECT id FROM lowtide.tasks WHERE state = 'running' AND close_deadline < now()
UNION ALL
SELECT id FROM lowtide.tasks WHERE state = 'running' AND heartbeat_deadline < now()
UNION ALL
SELECT t.id FROM (
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
) AS gone(worker_id)
CROSS JOIN LATERAL (
    SELECT id FROM lowtide.tasks WHERE state = 'running' AND worker_id = gone.worker_id OFFSET 0
) AS t

-- expired_attempts --
-- Running attempts past a deadline or whose worker's lease is gone, locked, with the reason. The
-- candidates are made an array first (computed once), so the attempts are read by their ids
-- whatever the planner thinks they number.
SELECT t.id, t.attempt, t.max_attempts, t.initial_backoff_ms, t.backoff_coefficient,
       t.max_backoff_ms, t.non_retryable_error_types, t.start_at, t.worker_id,
       CASE WHEN t.close_deadline < now() THEN 'StartToCloseTimeout'
            WHEN t.heartbeat_deadline < now() THEN 'HeartbeatTimeout'
            ELSE 'WorkerLost' END AS reason
FROM lowtide.tasks t
LEFT JOIN lowtide.workers w ON w.id = t.worker_id
WHERE t.id = ANY(ARRAY({{_expired_candidates}})) AND {{_attempt_expired}}
LIMIT %(limit)s
FOR UPDATE OF t SKIP LOCKED

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
    planned_release_at = NULL, planned_intensity = NULL, plan_reason = NULL, planned_pool = NULL
WHERE t.id = %(id)s
RETURNING {{_task_row}}, t.payload, t.result, t.heartbeat_details

-- notify_cancel --
-- Tells every replica to stop an attempt on its worker (payload: id:attempt:worker).
SELECT pg_notify('lowtide_cancel', %(payload)s)

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
-- Each found by its id (as apply_plans finds its tasks, queues.sql).
WHERE t.id = first_cause.task_id AND t.state IS NOT DISTINCT FROM 'pending'
RETURNING t.id
