-- The cost signals: the latest state of each, and a bounded history of recent values.

CREATE TABLE lowtide.signals (
    name            text PRIMARY KEY,
    unit            text NOT NULL,
    threshold       double precision NOT NULL,
    -- NULL until the first value arrives; the signal counts as high until then.
    value           double precision,
    observed_at     timestamptz,
    source          text NOT NULL DEFAULT '',
    -- Bumped by every change a subscriber should see (value, threshold, unit, stale), so
    -- replicas and subscribers can tell a newer state from an older one.
    version         bigint NOT NULL DEFAULT 1,
    stale           boolean NOT NULL DEFAULT false,
    -- When this service last stored a value: staleness counts from here, not from the feed's
    -- observed_at, because feeds report the start of a half-hour window or a replayed time.
    updated_at      timestamptz NOT NULL DEFAULT now(),
    forecast_at     timestamptz[] NOT NULL DEFAULT '{}',
    forecast_value  double precision[] NOT NULL DEFAULT '{}',
    forecast_source text NOT NULL DEFAULT ''
);

-- Trimmed on every insert (see record_history in signal_service/sql/queries.sql).
CREATE TABLE lowtide.signal_history (
    name        text NOT NULL REFERENCES lowtide.signals (name) ON DELETE CASCADE,
    version     bigint NOT NULL,
    value       double precision NOT NULL,
    observed_at timestamptz NOT NULL,
    source      text NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, version)
);
