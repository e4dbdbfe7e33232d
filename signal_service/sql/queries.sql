-- ensure_signal --
-- Creates a configured signal, or takes the configured unit and threshold; a new unit drops the old value.
INSERT INTO lowtide.signals AS s (name, unit, threshold)
VALUES (%(name)s, %(unit)s, %(threshold)s)
ON CONFLICT (name) DO UPDATE SET
    unit = EXCLUDED.unit,
    threshold = EXCLUDED.threshold,
    value = CASE WHEN s.unit = EXCLUDED.unit THEN s.value END,
    observed_at = CASE WHEN s.unit = EXCLUDED.unit THEN s.observed_at END,
    version = s.version + 1
WHERE s.unit IS DISTINCT FROM EXCLUDED.unit OR s.threshold IS DISTINCT FROM EXCLUDED.threshold
RETURNING name

-- get_signal --
-- One signal's latest state.
SELECT name, unit, threshold, value, observed_at, source, version, stale, updated_at
FROM lowtide.signals WHERE name = %(name)s

-- list_signals --
-- Every signal's latest state, by name, with the version of its forecast (read apart, only when new).
SELECT name, unit, threshold, value, observed_at, source, version, stale, updated_at, forecast_version
FROM lowtide.signals ORDER BY name

-- record_value --
-- Stores a new value as the signal's latest state; fresh again.
UPDATE lowtide.signals
SET value = %(value)s, observed_at = %(observed_at)s, source = %(source)s, version = version + 1,
    stale = false, updated_at = now()
WHERE name = %(name)s
RETURNING name, unit, threshold, value, observed_at, source, version, stale, updated_at

-- record_history --
-- Appends a value to the signal's history.
INSERT INTO lowtide.signal_history (name, version, value, observed_at, source)
VALUES (%(name)s, %(version)s, %(value)s, %(observed_at)s, %(source)s)

-- trim_history --
-- Keeps the history bounded: at most the last keep_versions versions, none older than keep_age.
DELETE FROM lowtide.signal_history
WHERE name = %(name)s
  AND (version <= %(version)s::bigint - %(keep_versions)s::bigint OR recorded_at < now() - %(keep_age)s::interval)

-- touch_signal --
-- A feed answered again with the value stored (a price for the hour, polled every few minutes):
-- fresh, since staleness counts from here, and a new version, so subscribers hear the value still
-- holds; not added to the history. Nothing if it changed meanwhile.
UPDATE lowtide.signals SET updated_at = now(), version = version + 1
WHERE name = %(name)s AND version = %(version)s AND NOT stale
RETURNING name, unit, threshold, value, observed_at, source, version, stale, updated_at

-- fresh_signals --
-- Signals with a value and no stale mark, with the database's clock (the one clock all replicas share).
SELECT name, version, updated_at, now() AS now
FROM lowtide.signals WHERE NOT stale AND value IS NOT NULL

-- mark_stale --
-- Marks a signal stale, unless it changed since it was read (then it is fresh); returns it if marked.
UPDATE lowtide.signals SET stale = true, version = version + 1
WHERE name = %(name)s AND version = %(version)s AND NOT stale
RETURNING name

-- notify_signal --
-- Tells every signal-service replica that a signal changed (delivered at commit).
SELECT pg_notify('lowtide_signal', %(name)s)

-- history --
-- The most recent values of a signal observed since a time, oldest first.
SELECT value, observed_at FROM (
    SELECT value, observed_at, version FROM lowtide.signal_history
    WHERE name = %(name)s AND (%(since)s::timestamptz IS NULL OR observed_at >= %(since)s::timestamptz)
    ORDER BY version DESC
    LIMIT %(limit)s
) recent
ORDER BY version

-- set_forecast --
-- Replaces a signal's forecast when it differs from the stored one (a feed polled more often than
-- it publishes answers the same again); returns the new forecast, nothing when unchanged.
UPDATE lowtide.signals
SET forecast_at = %(at)s::timestamptz[], forecast_value = %(values)s::float8[], forecast_source = %(source)s,
    forecast_expected_error = %(errors)s::float8[],
    forecast_version = forecast_version + 1, forecast_issued_at = now()
WHERE name = %(name)s
  AND (forecast_at IS DISTINCT FROM %(at)s::timestamptz[]
       OR forecast_value IS DISTINCT FROM %(values)s::float8[]
       OR forecast_expected_error IS DISTINCT FROM %(errors)s::float8[]
       OR forecast_source IS DISTINCT FROM %(source)s)
RETURNING name, forecast_at, forecast_value, forecast_expected_error, forecast_source, forecast_version,
    forecast_issued_at

-- get_forecast --
-- A signal's forecast, as arrays of the same length (the expected errors' may be empty), with its
-- version and when it was issued.
SELECT name, forecast_at, forecast_value, forecast_expected_error, forecast_source, forecast_version,
    forecast_issued_at
FROM lowtide.signals WHERE name = %(name)s

-- notify_forecast --
-- Tells every signal-service replica that a signal has a new forecast (delivered at commit).
SELECT pg_notify('lowtide_forecast', %(name)s)

-- hold_feed_lease --
-- Takes or keeps the feed's lease (lowtide.leader, as the scheduler's); a row only when this holder has it.
INSERT INTO lowtide.leader (name, holder, expires_at)
VALUES (%(name)s, %(holder)s, now() + %(ttl)s::interval)
ON CONFLICT (name) DO UPDATE
SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
WHERE lowtide.leader.holder = EXCLUDED.holder OR lowtide.leader.expires_at < now()
RETURNING holder

-- release_feed_lease --
-- Gives up the feed's lease, so another replica takes the feed over at once.
DELETE FROM lowtide.leader WHERE name = %(name)s AND holder = %(holder)s
