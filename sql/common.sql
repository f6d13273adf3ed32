-- pyscheduler: shared helpers. Loaded first on every migrate (CREATE OR REPLACE).
-- Private helpers start with '_' and are not part of the API.

-- _setting(name): a value of pyscheduler.settings; PS002 when it is missing.
-- It and _notify_throttled (on every submit, lease and completion) pin no search_path: their
-- tables are named with their schema, and they run inside the API function that called them,
-- whose path is pinned (design.md); the pin's save and restore was ~5 us a call (issue 31).
CREATE OR REPLACE FUNCTION pyscheduler._setting(p_name text)
RETURNS text
LANGUAGE plpgsql STABLE
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

-- _notify_throttled(channel, payload, min_gap): NOTIFY at most about once per
-- min_gap per channel, without ever blocking or staying silent when it matters.
-- min_gap 5 ms by default (the tasks' channels; 10 ms until issue 31: a submit a
-- throttled notification left unannounced waited up to a gap more for a worker's
-- next look, and at 15,500 tasks/s in calls every 10 ms the starts' p99 from the
-- submit to the lease was 11-13 ms at 10 ms and 6-10 ms at 5 ms).
-- Returns whether this call sent the notification. Listeners treat a
-- notification as a hint to poll; polling remains the fallback.
-- The throttle state is bounded: a channel is hashed to one of 1024 slots
-- (rows made by the schema: an insert makes a concurrent notifier wait for the
-- inserting transaction; only a crash recovery, which empties the unlogged
-- table, makes this function insert a slot's row again), and a slot
-- remembers the last channel notified through it. Two channels sharing a slot
-- only throttle each other less, never suppress a notification.
-- 0. This session notified this channel within min_gap (the setting
--    pyscheduler.notified: its microseconds since the epoch, 16 digits, and the
--    channel), in a transaction that committed or in this one -> nothing to do,
--    not even a read of the slot (a single submitter's every call, issue 31). A
--    rolled-back transaction takes its notification and the setting with it; a
--    setting of another shape matches nothing.
-- 1. The slot's committed state, read without a lock: this channel notified
--    within min_gap -> nothing to do (the common case under load).
-- 2. Else lock the slot (SKIP LOCKED), record now, notify.
-- 3. The slot is locked by another transaction -> notify anyway: that one may
--    be an application's transaction that enqueued and stays open (its own
--    notification is sent only at its commit, and never if it rolls back), so
--    counting on it could leave this call's work unannounced.
CREATE OR REPLACE FUNCTION pyscheduler._notify_throttled(
    p_channel text, p_payload text DEFAULT '', p_min_gap interval DEFAULT '5 milliseconds')
RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    v_mine text := current_setting('pyscheduler.notified', true);
    v_slot integer;
    v_channel text;
    v_last timestamptz;
BEGIN
    IF substr(v_mine, 18) = p_channel
       AND left(v_mine, 16) > lpad((date_part('epoch', clock_timestamp() - p_min_gap) * 1000000)::bigint::text, 16, '0') THEN
        RETURN false;
    END IF;
    v_slot := hashtext(p_channel) & 1023;
    SELECT channel, last_at INTO v_channel, v_last FROM pyscheduler._notify_throttle WHERE slot = v_slot;
    IF v_channel = p_channel AND v_last > clock_timestamp() - p_min_gap THEN
        RETURN false;
    END IF;
    IF v_last IS NULL THEN  -- no row: the unlogged table was emptied by a crash recovery
        INSERT INTO pyscheduler._notify_throttle (slot, channel, last_at)
        VALUES (v_slot, p_channel, clock_timestamp())
        ON CONFLICT (slot) DO NOTHING;
    ELSE
        PERFORM 1 FROM pyscheduler._notify_throttle WHERE slot = v_slot FOR UPDATE SKIP LOCKED;
        IF FOUND THEN
            UPDATE pyscheduler._notify_throttle SET channel = p_channel, last_at = clock_timestamp()
             WHERE slot = v_slot;
        END IF;
    END IF;
    PERFORM pg_notify(p_channel, p_payload);
    PERFORM set_config('pyscheduler.notified',
                       lpad((date_part('epoch', clock_timestamp()) * 1000000)::bigint::text, 16, '0') || ' ' || p_channel,
                       false);
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

-- The conventions of design.md that every capability shares: who is calling, who may
-- act on a piece of work, which instants and labels a daemon can load, and what user
-- code may not leave behind.

-- _caller(): the role calling pyscheduler. While code a client supplied runs (a check's
-- SQL job, between _begin_user_code and _end_user_code), the role that code acts as;
-- otherwise the session's current role (SET ROLE, else the login role). A SECURITY
-- DEFINER function changes current_user to its owner but neither of these, and a caller
-- cannot forge them (SET ROLE needs membership; user code cannot write _user_code).
-- _user_code is looked at only once the transaction has written (has an xid): its row is
-- written by _begin_user_code in the transaction that runs the code and never outlives it,
-- so a transaction that wrote nothing yet (every API call's first _caller()) has none to
-- find (~9 us of a single submit's ~290 us of server time, issue 31). On a standby (reads
-- with target_session_attrs=prefer-standby) no user code runs, and an unlogged table cannot
-- be read there: it is not looked at either (plpgsql, so the query is not even planned).
CREATE OR REPLACE FUNCTION pyscheduler._caller()
RETURNS name
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_role name;
BEGIN
    IF pg_catalog.pg_current_xact_id_if_assigned() IS NOT NULL AND NOT pg_catalog.pg_is_in_recovery() THEN
        SELECT u.role INTO v_role FROM pyscheduler._user_code u WHERE u.pid = pg_catalog.pg_backend_pid();
    END IF;
    RETURN coalesce(v_role, nullif(pg_catalog.current_setting('role'), 'none')::name, session_user);
END
$$;

-- _begin_user_code(role) / _end_user_code(): around code a client supplied, in the same
-- transaction: the pyscheduler functions that code calls act as role (_caller()), not as
-- the daemon that runs it (often an admin). The row never outlives the transaction: an
-- error that skips _end_user_code rolls _begin_user_code back too.
CREATE OR REPLACE FUNCTION pyscheduler._begin_user_code(p_role name)
RETURNS void
LANGUAGE sql
AS $$
    INSERT INTO pyscheduler._user_code (pid, role) VALUES (pg_catalog.pg_backend_pid(), p_role)
    ON CONFLICT (pid) DO UPDATE SET role = excluded.role;
$$;

CREATE OR REPLACE FUNCTION pyscheduler._end_user_code()
RETURNS void
LANGUAGE sql
AS $$
    DELETE FROM pyscheduler._user_code u WHERE u.pid = pg_catalog.pg_backend_pid();
$$;

-- _instant_ok(at): whether an instant is in [1970-01-01T00:00:00Z, 9999-01-01T00:00:00Z),
-- the range every client library loads in any time zone (no infinity, no year 10000).
CREATE OR REPLACE FUNCTION pyscheduler._instant_ok(p_at timestamptz)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT p_at >= timestamptz '1970-01-01 00:00:00+00' AND p_at < timestamptz '9999-01-01 00:00:00+00';
$$;

-- _require_instant(name, at, code): raise code unless at is NULL or _instant_ok.
CREATE OR REPLACE FUNCTION pyscheduler._require_instant(p_name text, p_at timestamptz, p_code text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    IF p_at IS NOT NULL AND NOT pyscheduler._instant_ok(p_at) THEN
        RAISE EXCEPTION '% % is outside the supported range', p_name, p_at
            USING ERRCODE = p_code, HINT = 'Instants must be in [1970-01-01T00:00:00Z, 9999-01-01T00:00:00Z).';
    END IF;
END
$$;

-- _require_interval(name, value, lo, hi, code): raise code unless value is NULL or in
-- [lo, hi] (an interval in months counts 30 days a month, as PostgreSQL compares them).
CREATE OR REPLACE FUNCTION pyscheduler._require_interval(p_name text, p_value interval, p_lo interval,
                                                         p_hi interval, p_code text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    IF p_value IS NOT NULL AND NOT (p_value >= p_lo AND p_value <= p_hi) THEN
        RAISE EXCEPTION '% must be between % and %, got %', p_name, p_lo, p_hi, p_value
            USING ERRCODE = p_code;
    END IF;
END
$$;

-- _label_refusal(text, max_bytes): why a name or label a client gives is not acceptable
-- (NULL: it is): empty or blank, longer than max_bytes, leading or trailing white space
-- (the Unicode spaces named, whatever the database's locale says \s is), or a control,
-- format or separator character that makes it print as something else (C0/C1 controls,
-- zero-width characters, bidirectional overrides and isolates, line and paragraph
-- separators, the byte order mark). _label_ok is the same rule as one boolean expression.
-- Its body is immutable as declared (no format(), which is STABLE), so a query that calls
-- it inlines it: called through the SQL-function executor it costs ~70 us a call
-- (submit_workflow checks three labels a node).
CREATE OR REPLACE FUNCTION pyscheduler._label_refusal(p_text text, p_max_bytes integer)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN p_text IS NULL OR p_text = '' THEN 'must not be empty'
        WHEN pg_catalog.octet_length(p_text) > p_max_bytes THEN 'must be at most ' || p_max_bytes::text || ' bytes'
        WHEN p_text ~ '^[\s\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]|[\s\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]$'
            THEN 'must not start or end with white space'
        WHEN p_text ~ '[\u0001-\u001f\u007f-\u009f\u00ad\u061c\u115f\u1160\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\u3164\ufeff\ufff9-\ufffb]'
            THEN 'must not contain control, zero-width or bidirectional formatting characters'
    END;
$$;

-- _require_label(name, text, max_bytes, code, hint): raise code, naming name, unless
-- text is NULL or an acceptable label (_label_refusal).
CREATE OR REPLACE FUNCTION pyscheduler._require_label(p_name text, p_text text, p_max_bytes integer, p_code text,
                                                      p_hint text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    v_why text := CASE WHEN p_text IS NOT NULL THEN pyscheduler._label_refusal(p_text, p_max_bytes) END;
BEGIN
    IF v_why IS NOT NULL THEN
        RAISE EXCEPTION '% %, got %', p_name, v_why, quote_literal(left(p_text, 100))
            USING ERRCODE = p_code, HINT = p_hint;
    END IF;
END
$$;

-- The input rule (issue 27 B; docs/sql-api.md, "Input"): every name, label, free text and
-- JSON payload a public function takes is of a domain of migrations/0031_input_domains.sql
-- (sql/schema/05_input.sql), so a new function inherits its checks by declaring its
-- parameters with them (tests/shared/test_input_rule.py walks the catalog for any that does not).
-- Each domain's CHECK is
--     VALUE IS NULL OR <ok(VALUE)> OR <refuse(VALUE, field, limits, SQLSTATE)>
-- <ok> is a SQL function the planner inlines into the check (_label_ok, _payload_ok, or
-- octet_length for free text): an acceptable value costs no function call. <refuse> runs
-- only when <ok> is false and raises the field's own SQLSTATE (the one the capability
-- documents for that argument) with a message naming it. (A CHECK that yields NULL passes,
-- and NULL OR f() still calls f: hence VALUE IS NULL first.) A caller's role runs these
-- while its arguments are coerced: roles.sql grants them to every audience. Same bodies
-- as in the migration: these are the current code.

-- _label_ok(text, max_bytes): _label_refusal(text, max_bytes) IS NULL, as one expression
-- (SQL-standard body: parsed here, so the caller's search_path cannot change what it calls).
CREATE OR REPLACE FUNCTION pyscheduler._label_ok(p_text text, p_max_bytes integer)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN pg_catalog.octet_length(p_text) BETWEEN 1 AND p_max_bytes
   AND p_text !~ ('^[\s\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]|[\s\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]$'
                  '|[\u0001-\u001f\u007f-\u009f\u00ad\u061c\u115f\u1160\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\u3164\ufeff\ufff9-\ufffb]');

-- _refuse_label(text, field, max_bytes, code, max_chars): raise code naming field with why
-- text is not a label of at most max_bytes bytes (and max_chars characters); false when it
-- is one (the domain's check then fails as a plain check_violation).
CREATE OR REPLACE FUNCTION pyscheduler._refuse_label(p_text text, p_field text, p_max_bytes integer, p_code text,
                                                     p_max_chars integer DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    v_why text := coalesce(pyscheduler._label_refusal(p_text, p_max_bytes),
                           CASE WHEN char_length(p_text) > p_max_chars
                                THEN format('must be at most %s characters', p_max_chars) END);
BEGIN
    IF v_why IS NOT NULL THEN
        RAISE EXCEPTION '% %, got %', p_field, v_why, quote_literal(left(p_text, 100))
            USING ERRCODE = p_code,
                  HINT = 'Names and labels are one line of printable characters without leading or trailing white space.';
    END IF;
    RETURN false;
END
$$;

-- _refuse_text(text, field, max_bytes, code): raise code naming field when free text (one
-- that may hold any character PostgreSQL stores, newlines included) is longer than max_bytes.
CREATE OR REPLACE FUNCTION pyscheduler._refuse_text(p_text text, p_field text, p_max_bytes integer, p_code text)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    IF octet_length(p_text) > p_max_bytes THEN
        RAISE EXCEPTION '% is % bytes, more than %', p_field, octet_length(p_text), p_max_bytes
            USING ERRCODE = p_code;
    END IF;
    RETURN false;
END
$$;

-- _payload_ok(value, levels, max_bytes): whether a JSON payload nests at most `levels`
-- levels (the top value is level 1: {"a": [1]} nests 3) and is at most max_bytes stored.
-- strict $.**{n} finds a value only when the payload nests more than n levels, through n
-- containers of at least 8 bytes each (a header, and its entry in its parent): so an
-- uncompressed payload of less than 8 * levels bytes is accepted without a walk (the usual
-- small spec or result: two reads of its header). A larger one is walked once, ~8 us a KB.
CREATE OR REPLACE FUNCTION pyscheduler._payload_ok(p_value jsonb, p_levels integer, p_max_bytes integer)
RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
RETURN (pg_catalog.pg_column_size(p_value) < 8 * p_levels AND pg_catalog.pg_column_compression(p_value) IS NULL)
    OR (pg_catalog.pg_column_size(p_value) <= p_max_bytes
        AND NOT pg_catalog.jsonb_path_exists(p_value, ('strict $.**{' || p_levels::text || '}')::jsonpath));

-- _refuse_payload(value, field, levels, max_bytes, code): raise code naming field when the
-- payload is larger than max_bytes or nests more than `levels` levels; false otherwise.
CREATE OR REPLACE FUNCTION pyscheduler._refuse_payload(p_value jsonb, p_field text, p_levels integer,
                                                       p_max_bytes integer, p_code text)
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    IF pg_column_size(p_value) > p_max_bytes THEN
        RAISE EXCEPTION '% is % bytes, more than %', p_field, pg_column_size(p_value), p_max_bytes
            USING ERRCODE = p_code, HINT = 'Keep large data elsewhere and pass a reference.';
    END IF;
    IF jsonb_path_exists(p_value, ('strict $.**{' || p_levels::text || '}')::jsonpath) THEN
        RAISE EXCEPTION '% nests more than % levels', p_field, p_levels
            USING ERRCODE = p_code,
                  HINT = format('At most %s levels (the top value is level 1), which every reader of pyscheduler '
                                '(Python''s json and orjson, the dashboard) loads.', p_levels);
    END IF;
    RETURN false;
END
$$;

-- _after_user_code(): what a pyscheduler function calls right after code a client supplied
-- (a check's SQL job) returns, before anything else: the job may have changed the
-- session with set_config(..., false), which outlives it. Re-pins search_path (so
-- nothing after it resolves a name in the client's schema), TimeZone, DateStyle and
-- IntervalStyle (the daemons load values in these) for the rest of the session, and
-- refuses (PS003) a transaction the job made read-only (nothing could be recorded).
CREATE OR REPLACE FUNCTION pyscheduler._after_user_code()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pg_catalog.set_config('search_path', 'pyscheduler, pg_temp', false),
            pg_catalog.set_config('TimeZone', 'UTC', false),
            pg_catalog.set_config('DateStyle', 'ISO, MDY', false),
            pg_catalog.set_config('IntervalStyle', 'postgres', false);
    IF pg_catalog.current_setting('transaction_read_only') = 'on' THEN
        RAISE EXCEPTION 'user code made the transaction read-only'
            USING ERRCODE = 'PS003', HINT = 'A job must not SET TRANSACTION READ ONLY.';
    END IF;
END
$$;
