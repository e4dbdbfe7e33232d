-- The carbon figures of GetStatus (per activity type: tasks dispatched with a known signal, and
-- the signal at their submission and at their dispatch), kept as running totals that each replica
-- adds its dispatches to about once a second (scheduler_service/carbon_totals.py). Reading them
-- costs the same whatever the history kept; averaging over every task kept read all of them (a
-- whole-table scan for every `lowtide status` and console refresh). Started from the tasks kept.

CREATE TABLE lowtide.carbon_totals (
    activity_type text PRIMARY KEY,
    tasks bigint NOT NULL,
    sum_at_submit double precision NOT NULL,
    sum_at_dispatch double precision NOT NULL
);

INSERT INTO lowtide.carbon_totals (activity_type, tasks, sum_at_submit, sum_at_dispatch)
SELECT activity_type, count(*), sum(signal_at_submit), sum(signal_at_dispatch)
FROM lowtide.tasks
WHERE signal_at_submit IS NOT NULL AND signal_at_dispatch IS NOT NULL
GROUP BY activity_type;
