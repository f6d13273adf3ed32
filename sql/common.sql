-- pyscheduler: shared helpers. Loaded first on every migrate (CREATE OR REPLACE).
-- Private helpers start with '_' and are not part of the API.

-- _setting(name): a value of pyscheduler.settings; PS002 when it is missing.
CREATE OR REPLACE FUNCTION pyscheduler._setting(p_name text)
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    v text;
BEGIN
    SELECT value INTO v FROM pyscheduler.settings WHERE name = p_name;
    IF v IS NULL THEN
        RAISE EXCEPTION 'setting % is missing', p_name
            USING ERRCODE = 'PS002', HINT = 'Run pyscheduler migrate.';
    END IF;
    RETURN v;
END
$$;

-- _notify_throttled(channel, payload, min_gap): NOTIFY at most once per
-- min_gap per channel, without ever blocking: a caller that finds the
-- channel's row locked by a concurrent notifier skips (that one will notify).
-- Returns whether this call sent the notification. Listeners treat a
-- notification as a hint to poll; polling remains the fallback.
CREATE OR REPLACE FUNCTION pyscheduler._notify_throttled(
    p_channel text, p_payload text DEFAULT '', p_min_gap interval DEFAULT '10 milliseconds')
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    v_last timestamptz;
BEGIN
    SELECT last_at INTO v_last FROM pyscheduler._notify_throttle
     WHERE channel = p_channel FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        IF EXISTS (SELECT 1 FROM pyscheduler._notify_throttle WHERE channel = p_channel) THEN
            RETURN false;  -- locked: a concurrent transaction is notifying
        END IF;
        INSERT INTO pyscheduler._notify_throttle (channel, last_at)
        VALUES (p_channel, clock_timestamp())
        ON CONFLICT (channel) DO NOTHING;
        IF NOT FOUND THEN
            RETURN false;
        END IF;
    ELSIF v_last > clock_timestamp() - p_min_gap THEN
        RETURN false;
    ELSE
        UPDATE pyscheduler._notify_throttle SET last_at = clock_timestamp() WHERE channel = p_channel;
    END IF;
    PERFORM pg_notify(p_channel, p_payload);
    RETURN true;
END
$$;

-- version(): the pyscheduler version whose sql/ was loaded last, and the
-- migrations applied to this database.
CREATE OR REPLACE FUNCTION pyscheduler.version(
    OUT code_version text, OUT migrations text[])
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
    /* version() -> (code_version, migrations)
       code_version: the pyscheduler release whose SQL functions are loaded.
       migrations:   ids of the schema migrations applied, oldest first. */
    SELECT (SELECT value FROM pyscheduler.settings WHERE name = 'code_version'),
           ARRAY(SELECT migration_id FROM pyscheduler._yoyo_migration ORDER BY applied_at_utc, migration_id);
$$;
COMMENT ON FUNCTION pyscheduler.version() IS
    'The loaded pyscheduler code version and the applied schema migrations.';
