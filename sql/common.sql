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
-- channel's row locked by a concurrent notifier of the same channel skips
-- (that one will notify). Returns whether this call sent the notification.
-- Listeners treat a notification as a hint to poll; polling remains the fallback.
-- The throttle state is bounded: a channel is hashed to one of 1024 slots,
-- and a slot remembers the last channel notified through it. Two channels
-- sharing a slot only throttle each other less (a slot held by another
-- channel counts as "not notified lately"), never suppress a notification.
CREATE OR REPLACE FUNCTION pyscheduler._notify_throttled(
    p_channel text, p_payload text DEFAULT '', p_min_gap interval DEFAULT '10 milliseconds')
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    v_slot integer := hashtext(p_channel) & 1023;
    v_channel text;
    v_last timestamptz;
BEGIN
    SELECT channel, last_at INTO v_channel, v_last FROM pyscheduler._notify_throttle
     WHERE slot = v_slot FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        SELECT channel INTO v_channel FROM pyscheduler._notify_throttle WHERE slot = v_slot;
        IF FOUND THEN
            IF v_channel = p_channel THEN
                RETURN false;  -- locked: a concurrent transaction is notifying this channel
            END IF;
            -- locked by a notifier of another channel: notify without the throttle
        ELSE
            INSERT INTO pyscheduler._notify_throttle (slot, channel, last_at)
            VALUES (v_slot, p_channel, clock_timestamp())
            ON CONFLICT (slot) DO NOTHING;
        END IF;
    ELSIF v_channel = p_channel AND v_last > clock_timestamp() - p_min_gap THEN
        RETURN false;
    ELSE
        UPDATE pyscheduler._notify_throttle SET channel = p_channel, last_at = clock_timestamp()
         WHERE slot = v_slot;
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
