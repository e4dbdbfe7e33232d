-- Forecasts are streamed to subscribers beside the current value: each new forecast gets a
-- version (growing, like a state's) and the time it was issued, so replicas and subscribers
-- tell a new forecast from one they have.

ALTER TABLE lowtide.signals
    ADD COLUMN forecast_version bigint NOT NULL DEFAULT 0,
    ADD COLUMN forecast_issued_at timestamptz;
