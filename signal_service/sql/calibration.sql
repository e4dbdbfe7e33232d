-- record_issued_forecast --
-- A forecast as its feed issued it (the values only; the first of the same time is kept).
INSERT INTO lowtide.forecast_issues (signal, issued_at, at, value)
VALUES (%(name)s, %(issued_at)s, %(at)s::timestamptz[], %(values)s::float8[])
ON CONFLICT (signal, issued_at) DO NOTHING

-- record_actual --
-- A value that came, at the time it was observed.
INSERT INTO lowtide.forecast_actuals (signal, at, value)
VALUES (%(name)s, %(at)s, %(value)s)
ON CONFLICT (signal, at) DO UPDATE SET value = EXCLUDED.value

-- trim_issued_forecasts --
-- The record is a rolling window: older forecasts, and any beyond the newest `keep`, go.
DELETE FROM lowtide.forecast_issues f
WHERE f.signal = %(name)s
  AND (f.issued_at < %(since)s
       OR f.issued_at < (SELECT issued_at FROM lowtide.forecast_issues
                         WHERE signal = %(name)s ORDER BY issued_at DESC OFFSET %(keep)s LIMIT 1))

-- trim_actuals --
DELETE FROM lowtide.forecast_actuals WHERE signal = %(name)s AND at < %(since)s

-- issued_forecasts --
-- The newest forecasts issued since `since`, at most `limit`.
SELECT issued_at, at, value FROM lowtide.forecast_issues
WHERE signal = %(name)s AND issued_at >= %(since)s
ORDER BY issued_at DESC
LIMIT %(limit)s

-- actuals --
SELECT at, value FROM lowtide.forecast_actuals
WHERE signal = %(name)s AND at >= %(since)s
ORDER BY at
LIMIT %(limit)s

-- save_calibration --
INSERT INTO lowtide.forecast_calibrations (signal, learned_at, body)
VALUES (%(name)s, %(learned_at)s, %(body)s::jsonb)
ON CONFLICT (signal) DO UPDATE SET learned_at = EXCLUDED.learned_at, body = EXCLUDED.body
WHERE forecast_calibrations.learned_at <= EXCLUDED.learned_at

-- calibrations --
SELECT signal, learned_at, body FROM lowtide.forecast_calibrations

-- record_past_forecasts --
-- A feed's past forecasts beside the values that came (read at start, signal_service/feeds/seed.py):
-- each stored as a forecast of one point issued `lead` before it (the lead attributed to it), and
-- its value; a value the service observed itself is kept.
WITH pairs AS (
    SELECT * FROM unnest(%(at)s::timestamptz[], %(forecast)s::float8[], %(actual)s::float8[]) AS p (at, forecast, actual)
), issued AS (
    INSERT INTO lowtide.forecast_issues (signal, issued_at, at, value)
    SELECT %(name)s, at - %(lead)s::interval, ARRAY[at], ARRAY[forecast] FROM pairs
    ON CONFLICT (signal, issued_at) DO NOTHING
)
INSERT INTO lowtide.forecast_actuals (signal, at, value)
SELECT %(name)s, at, actual FROM pairs
ON CONFLICT (signal, at) DO NOTHING

-- count_actuals --
-- How many values the record holds over [start, end).
SELECT count(*) AS count FROM lowtide.forecast_actuals
WHERE signal = %(name)s AND at >= %(start)s AND at < %(end)s
