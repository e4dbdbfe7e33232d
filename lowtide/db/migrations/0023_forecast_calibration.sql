-- A signal's forecast calibration (signal_service/calibration.py): the forecasts its feed issued
-- and the values that came, over a rolling window, and what was learned from them, so that a
-- restart keeps it and every replica states the same error for a point.

CREATE TABLE lowtide.forecast_issues (
    signal text NOT NULL,
    issued_at timestamp with time zone NOT NULL,
    at timestamp with time zone[] NOT NULL,
    value double precision[] NOT NULL,
    PRIMARY KEY (signal, issued_at)
);

CREATE TABLE lowtide.forecast_actuals (
    signal text NOT NULL,
    at timestamp with time zone NOT NULL,
    value double precision NOT NULL,
    PRIMARY KEY (signal, at)
);

CREATE TABLE lowtide.forecast_calibrations (
    signal text PRIMARY KEY,
    learned_at timestamp with time zone NOT NULL,
    body jsonb NOT NULL
);
