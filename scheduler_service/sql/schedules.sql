-- _schedule_columns --
-- What every query that returns a schedule returns: the fields of rows.schedules.ScheduleRow.
id, name, cron, time_zone, activity_type, queue, pool, payload, priority, start_tolerance_ms, on_miss,
estimated_duration_ms, paused, generation, next_fire_at, last_fire_at, last_task_id, last_conflict,
last_conflict_at, conflicts, created_at

-- insert_schedule --
-- Stores a new schedule; returns nothing when the name is taken.
INSERT INTO lowtide.schedules (
    name, cron, time_zone, activity_type, queue, pool, payload, priority,
    start_tolerance_ms, on_miss, estimated_duration_ms, next_fire_at
)
VALUES (
    %(name)s, %(cron)s, %(time_zone)s, %(activity_type)s, %(queue)s, %(pool)s, %(payload)s, %(priority)s,
    %(start_tolerance_ms)s, %(on_miss)s, %(estimated_duration_ms)s, %(next_fire_at)s
)
ON CONFLICT (name) DO NOTHING
RETURNING {{_schedule_columns}}

-- list_schedules --
-- Every schedule, by name.
SELECT {{_schedule_columns}} FROM lowtide.schedules ORDER BY name

-- get_schedule --
-- One schedule by id.
SELECT {{_schedule_columns}} FROM lowtide.schedules WHERE id = %(id)s

-- get_schedule_by_name --
-- One schedule by name.
SELECT {{_schedule_columns}} FROM lowtide.schedules WHERE name = %(name)s

-- pause_schedule --
-- Pauses a schedule (pausing a paused one changes nothing).
UPDATE lowtide.schedules SET paused = true WHERE name = %(name)s RETURNING {{_schedule_columns}}

-- resume_schedule --
-- Resumes a paused schedule from its next fire time after now, in a new generation.
UPDATE lowtide.schedules
SET paused = false, generation = generation + 1, next_fire_at = %(next_fire_at)s
WHERE id = %(id)s AND paused
RETURNING {{_schedule_columns}}

-- lock_schedule --
-- One schedule by name, locked until the transaction ends (the materializer waits).
SELECT {{_schedule_columns}} FROM lowtide.schedules WHERE name = %(name)s FOR UPDATE

-- delete_schedule --
-- Deletes a schedule (its task links go with it; its tasks stay).
DELETE FROM lowtide.schedules WHERE id = %(id)s

-- unstarted_schedule_tasks --
-- The pending tasks a schedule created whose start is still ahead.
SELECT t.id
FROM lowtide.schedule_tasks st
JOIN lowtide.tasks t ON t.id = st.task_id
WHERE st.schedule_id = %(id)s AND t.state = 'pending' AND t.start_at > now()
ORDER BY t.id

-- due_schedules --
-- Active schedules whose next fire time is at or before the horizon, soonest first.
SELECT {{_schedule_columns}} FROM lowtide.schedules
WHERE NOT paused AND next_fire_at <= %(horizon)s
ORDER BY next_fire_at, id
LIMIT %(limit)s

-- advance_schedule --
-- Records the task created for a fire time and moves to the next one. Compare-and-set on
-- (next_fire_at, generation, not paused): a replica that lost the race, or a schedule paused,
-- resumed or deleted meanwhile, changes nothing and gets no row. The row lock orders this
-- against pause and delete, so the link is in place before they look for tasks to cancel.
WITH s AS (
    SELECT id FROM lowtide.schedules
    WHERE id = %(id)s AND next_fire_at = %(fire_at)s AND generation = %(generation)s AND NOT paused
    FOR UPDATE
), link AS (
    INSERT INTO lowtide.schedule_tasks (schedule_id, task_id, fire_at)
    SELECT s.id, %(task_id)s, %(fire_at)s FROM s
    ON CONFLICT DO NOTHING
)
UPDATE lowtide.schedules sc
SET next_fire_at = %(next_fire_at)s, last_fire_at = %(fire_at)s, last_task_id = %(task_id)s
FROM s
WHERE sc.id = s.id
RETURNING sc.id

-- refuse_occurrence --
-- Records why a fire time got no task (a reservation conflict) and moves to the next one;
-- compare-and-set as advance_schedule, so two replicas count a refusal once.
UPDATE lowtide.schedules
SET next_fire_at = %(next_fire_at)s, last_conflict = %(message)s, last_conflict_at = %(fire_at)s,
    conflicts = conflicts + 1
WHERE id = %(id)s AND next_fire_at = %(fire_at)s AND generation = %(generation)s AND NOT paused
RETURNING id

-- skip_occurrence --
-- Moves past fire times whose start went by while no scheduler was leading.
UPDATE lowtide.schedules
SET next_fire_at = %(next_fire_at)s
WHERE id = %(id)s AND next_fire_at = %(fire_at)s AND generation = %(generation)s AND NOT paused
RETURNING id

-- break_schedule --
-- Pauses a schedule whose fire times cannot be computed any more, saying why.
UPDATE lowtide.schedules SET paused = true, last_conflict = %(message)s WHERE id = %(id)s
