-- insert_adaptive_samples --
-- One replica's figures per adaptive type for the window that just ended, in one statement.
INSERT INTO lowtide.adaptive_samples (
    scheduler_id, activity_type, window_start, window_end, succeeded, failed, timed_out, run_ms, ok_run_ms
)
SELECT %(scheduler_id)s, s.activity_type, %(window_start)s, %(window_end)s,
       s.succeeded, s.failed, s.timed_out, s.run_ms, s.ok_run_ms
FROM unnest(%(types)s::text[], %(succeeded)s::int[], %(failed)s::int[], %(timed_out)s::int[],
            %(run_ms)s::float8[], %(ok_run_ms)s::float8[])
     AS s(activity_type, succeeded, failed, timed_out, run_ms, ok_run_ms)

-- take_adaptive_samples --
-- The leader takes every replica's rows written since it last took them.
DELETE FROM lowtide.adaptive_samples
RETURNING scheduler_id, activity_type, window_start, window_end, succeeded, failed, timed_out, run_ms, ok_run_ms

-- adaptive_limits --
-- The limit of every adaptive type (every replica reads them each window).
SELECT activity_type, limit_value, baseline_ms, baseline_at, slow_start, latency_ms, failure_rate,
       samples, reason, updated_at
FROM lowtide.adaptive_limits

-- save_adaptive_limits --
-- The leader's new limits, one row per type, in one statement.
INSERT INTO lowtide.adaptive_limits AS a (
    activity_type, limit_value, baseline_ms, baseline_at, slow_start, latency_ms, failure_rate, samples,
    reason, updated_at
)
SELECT s.activity_type, s.limit_value, s.baseline_ms, s.baseline_at, s.slow_start, s.latency_ms,
       s.failure_rate, s.samples, s.reason, now()
FROM unnest(%(types)s::text[], %(limits)s::float8[], %(baselines)s::float8[], %(baseline_ats)s::timestamptz[],
            %(slow_starts)s::boolean[], %(latencies)s::float8[], %(failure_rates)s::float8[],
            %(samples)s::int[], %(reasons)s::text[])
     AS s(activity_type, limit_value, baseline_ms, baseline_at, slow_start, latency_ms, failure_rate, samples,
          reason)
ON CONFLICT (activity_type) DO UPDATE SET
    limit_value = EXCLUDED.limit_value, baseline_ms = EXCLUDED.baseline_ms,
    baseline_at = EXCLUDED.baseline_at, slow_start = EXCLUDED.slow_start,
    latency_ms = EXCLUDED.latency_ms, failure_rate = EXCLUDED.failure_rate,
    samples = EXCLUDED.samples, reason = EXCLUDED.reason, updated_at = EXCLUDED.updated_at
