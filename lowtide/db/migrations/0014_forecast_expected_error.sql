-- A forecast point may carry its expected relative error (one standard deviation; NULL when the
-- feed states none), so the planner can tell a cheaper window from noise. Empty for forecasts
-- stored before.

ALTER TABLE lowtide.signals
    ADD COLUMN forecast_expected_error double precision[] NOT NULL DEFAULT '{}';
