-- Adaptive concurrency limits (issue 21). Each replica writes what the attempts of adaptive types
-- showed, one row per type per window; the leader takes them, moves each type's limit and keeps
-- it here, where every replica reads it.

CREATE TABLE lowtide.adaptive_samples (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    scheduler_id   text NOT NULL,
    activity_type  text NOT NULL,
    window_start   timestamptz NOT NULL,
    window_end     timestamptz NOT NULL,
    succeeded      integer NOT NULL,
    failed         integer NOT NULL,
    timed_out      integer NOT NULL,
    -- Run time summed over every attempt of the row, and over those that succeeded.
    run_ms         double precision NOT NULL,
    ok_run_ms      double precision NOT NULL
);

CREATE TABLE lowtide.adaptive_limits (
    activity_type  text PRIMARY KEY,
    -- The limit as the algorithm keeps it (fractional); claims apply its floor.
    limit_value    double precision NOT NULL,
    baseline_ms    double precision,
    baseline_at    timestamptz,
    slow_start     boolean NOT NULL DEFAULT true,
    -- The last window's figures: mean run time of its successes, failure rate, attempts.
    latency_ms     double precision,
    failure_rate   double precision NOT NULL DEFAULT 0,
    samples        integer NOT NULL DEFAULT 0,
    reason         text NOT NULL DEFAULT '',
    updated_at     timestamptz NOT NULL DEFAULT now()
);
