-- pyscheduler: future checks (seeds/are-we-there-yet.md, stages I, II and III).
-- "Do this when that hasn't happened for X": a check is due at a slot (a
-- UTC-aligned multiple of the resolution, default 15 minutes); a runner takes
-- exactly one slot's checks (=, not <), runs each check's job under a timeout
-- and records the next check or moves the check into check_history.
-- A catch-up pass (<) takes the checks of slots missed while runners were down.
--
-- Proof of taking: due_checks, catch_up_checks and run_due_checks lock the rows
-- they take (FOR UPDATE SKIP LOCKED). run_check_jobs, run_checks, submit_check_tasks
-- and finish_checks act only on rows whose lock this very transaction holds
-- (the row's xmax is the current transaction id: nobody can forge it), or, for
-- a check handed to a task job, on the claim token that only the task's spec
-- carries. Loaded on every migrate (CREATE OR REPLACE).
--
-- A check belongs to the role that added it (owner; design.md, convention C): only
-- that role, a member of it or the admin role deletes it or sees its payload and
-- errors. A client never waits for a runner: delete_checks and add_check of a check
-- a runner holds leave a request (check_requests) that the runner applies when it
-- gets to the check (a deleted check that has not started does not run).
--
-- User code (convention B). A SQL job is a client's function: it runs only if the
-- role that added the check may EXECUTE it (at add and before every run), only if it
-- is SECURITY DEFINER with its own search_path ending in pg_temp (jobs run many to a
-- statement, and a job before it may have changed the session's search_path), and
-- right after jobs return _after_check_jobs() re-pins what they may have changed with
-- set_config(..., false): search_path, TimeZone, DateStyle, IntervalStyle (shared
-- _after_user_code), the timeouts and transaction defaults the runner relies on. So
-- no statement of pyscheduler after user code resolves a name in a client's schema;
-- on top, every pyscheduler function is called schema-qualified. While a job runs,
-- the pyscheduler functions it calls act as its function's owner (_begin_user_code:
-- _caller() is that role), not as the runner's login.
--
-- SQLSTATEs: PS400 resolution, PS401 entity, PS402 job or kind, PS403 check
-- time, PS404 slot not yet started, PS405 slot not on a boundary, PS406 shard,
-- shards or max, PS407 check not taken by the caller, PS408 other argument,
-- PS409 payload too large, PS410 a pending check of another kind; 42501 a job
-- the adder may not execute, a check of another role.

-- Private helpers of earlier versions (a database upgraded from them would otherwise keep them).
DROP FUNCTION IF EXISTS pyscheduler._due_checks(timestamptz, integer, integer, integer, timestamptz);
DROP FUNCTION IF EXISTS pyscheduler._catch_up_checks(integer, integer, integer, timestamptz);
DROP FUNCTION IF EXISTS pyscheduler._check_take(integer, integer, integer);
DROP FUNCTION IF EXISTS pyscheduler._sql_job(text);
DROP FUNCTION IF EXISTS pyscheduler._check_job(text, text);

-- _resolution_us(resolution): the resolution in microseconds (NULL: the
-- checks_resolution setting). PS400 unless it divides a day into whole slots.
CREATE OR REPLACE FUNCTION pyscheduler._resolution_us(p_resolution interval)
RETURNS bigint
LANGUAGE plpgsql STABLE
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    v interval := coalesce(p_resolution, pyscheduler._setting('checks_resolution')::interval);
    v_us numeric := extract(epoch FROM v) * 1000000;
BEGIN
    IF date_part('month', v) <> 0 OR date_part('year', v) <> 0 OR v_us <= 0 OR v_us > 86400000000
       OR v_us <> trunc(v_us) OR 86400000000 % v_us <> 0 THEN
        RAISE EXCEPTION 'resolution % does not divide a day into whole slots', v
            USING ERRCODE = 'PS400',
                  HINT = 'Use a positive interval of at most 1 day that divides 24 hours evenly, '
                         'e.g. ''1 minute'', ''15 minutes'', ''1 hour''.';
    END IF;
    RETURN v_us::bigint;
END
$$;

-- _slot_ceil(ts, us) / _slot_floor(ts, us): the slot boundary at or after /
-- at or before ts. Boundaries are multiples of us since the Unix epoch (UTC),
-- so they do not depend on the session time zone nor move at a DST change.
-- ts must be a supported instant (_instant_ok): callers check.
CREATE OR REPLACE FUNCTION pyscheduler._slot_ceil(p_ts timestamptz, p_us bigint)
RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT timestamptz 'epoch'
           + (ceil(extract(epoch FROM p_ts) * 1000000 / p_us)::bigint * p_us) * interval '1 microsecond';
$$;

CREATE OR REPLACE FUNCTION pyscheduler._slot_floor(p_ts timestamptz, p_us bigint)
RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT timestamptz 'epoch'
           + (floor(extract(epoch FROM p_ts) * 1000000 / p_us)::bigint * p_us) * interval '1 microsecond';
$$;

CREATE OR REPLACE FUNCTION pyscheduler.slot_round(ts timestamptz, resolution interval DEFAULT NULL)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* slot_round(ts, resolution => NULL) -> timestamptz
   Rounds ts UP to the next slot boundary; a time on a boundary stays.
   Slots are multiples of resolution counted from 1970-01-01 00:00 UTC, so they
   are aligned in UTC whatever the session time zone, and a DST change never
   moves or merges them. resolution: NULL = the configured one (default
   15 minutes); it must divide a day evenly. Example: 10:05 + 3 hours with
   15-minute slots -> 13:15. Errors: PS400 resolution, PS403 ts outside
   [1970-01-01, 9999-01-01) UTC. */
BEGIN
    PERFORM pyscheduler._require_instant('ts', ts, 'PS403');
    RETURN pyscheduler._slot_ceil(ts, pyscheduler._resolution_us(resolution));
END
$$;
COMMENT ON FUNCTION pyscheduler.slot_round(timestamptz, interval) IS
    'Round a time up to the next UTC-aligned slot boundary (a boundary stays); resolution must divide a day (PS400).';

CREATE OR REPLACE FUNCTION pyscheduler.check_slots(
    OUT slot timestamptz, OUT next_slot timestamptz, OUT resolution interval, OUT clock timestamptz)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* check_slots() -> (slot, next_slot, resolution, clock)
   The database clock, the slot it is in (the latest boundary at or before
   it: due_checks may take it), the next boundary and the resolution. Runners
   sleep until next_slot. */
DECLARE
    v_us bigint := pyscheduler._resolution_us(NULL);
BEGIN
    clock := clock_timestamp();
    slot := pyscheduler._slot_floor(clock, v_us);
    next_slot := slot + v_us * interval '1 microsecond';
    resolution := pyscheduler._setting('checks_resolution')::interval;
END
$$;
COMMENT ON FUNCTION pyscheduler.check_slots() IS
    'The database clock, its current slot boundary, the next one and the slot resolution.';

CREATE OR REPLACE FUNCTION pyscheduler.set_check_settings(
    INOUT resolution interval DEFAULT NULL, INOUT max_checks integer DEFAULT NULL,
    INOUT horizon interval DEFAULT NULL, INOUT task_timeout interval DEFAULT NULL,
    INOUT history_retention interval DEFAULT NULL, INOUT max_payload_bytes integer DEFAULT NULL)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* set_check_settings(resolution, max_checks, horizon, task_timeout, history_retention,
                      max_payload_bytes) -> the settings
   Change the defaults of future checks (NULL keeps a value); returns them all.
   resolution:        slot length, must divide a day (PS400). Pending checks are
                      moved up to the next boundary of the new resolution.
   max_checks:        default most runs of one check (>= 1), for checks added later.
   horizon:           default furthest a next check may be from now, for checks
                      added later: more than 0, at most 100 years.
   task_timeout:      how long a task job may take before its check ends as
                      timeout: more than 0, at most 100 years.
   history_retention: how long check_history keeps an ended check
                      (purge_check_history): 1 second to 100 years.
   max_payload_bytes: the largest payload add_check accepts: 1 byte to 16 MiB.
   Errors: PS400, PS408. */
DECLARE
    v_old bigint := pyscheduler._resolution_us(NULL);
    v_new bigint;
BEGIN
    IF resolution IS NOT NULL THEN
        v_new := pyscheduler._resolution_us(resolution);
        UPDATE settings SET value = resolution::text WHERE name = 'checks_resolution';
        IF v_new <> v_old THEN
            UPDATE checks c SET next_check_at = pyscheduler._slot_ceil(c.next_check_at, v_new)
             WHERE c.claim IS NULL AND c.next_check_at <> pyscheduler._slot_ceil(c.next_check_at, v_new);
        END IF;
    END IF;
    IF max_checks IS NOT NULL THEN
        PERFORM pyscheduler._check_positive('max_checks', max_checks >= 1, max_checks::text);
        UPDATE settings SET value = max_checks::text WHERE name = 'checks_max_checks';
    END IF;
    IF horizon IS NOT NULL THEN
        PERFORM pyscheduler._require_interval('horizon', horizon, interval '1 microsecond', interval '100 years', 'PS408');
        UPDATE settings SET value = horizon::text WHERE name = 'checks_horizon';
    END IF;
    IF task_timeout IS NOT NULL THEN
        PERFORM pyscheduler._require_interval('task_timeout', task_timeout, interval '1 microsecond',
                                              interval '100 years', 'PS408');
        UPDATE settings SET value = task_timeout::text WHERE name = 'checks_task_timeout';
    END IF;
    IF history_retention IS NOT NULL THEN
        PERFORM pyscheduler._require_interval('history_retention', history_retention, interval '1 second',
                                              interval '100 years', 'PS408');
        UPDATE settings SET value = history_retention::text WHERE name = 'checks_history_retention';
    END IF;
    IF max_payload_bytes IS NOT NULL THEN
        IF max_payload_bytes NOT BETWEEN 1 AND 16777216 THEN
            RAISE EXCEPTION 'max_payload_bytes must be between 1 and 16777216 (16 MiB), got %', max_payload_bytes
                USING ERRCODE = 'PS408';
        END IF;
        UPDATE settings SET value = max_payload_bytes::text WHERE name = 'checks_max_payload_bytes';
    END IF;
    resolution := pyscheduler._setting('checks_resolution')::interval;
    max_checks := pyscheduler._setting('checks_max_checks')::integer;
    horizon := pyscheduler._setting('checks_horizon')::interval;
    task_timeout := pyscheduler._setting('checks_task_timeout')::interval;
    history_retention := pyscheduler._setting('checks_history_retention')::interval;
    max_payload_bytes := pyscheduler._setting('checks_max_payload_bytes')::integer;
END
$$;
COMMENT ON FUNCTION pyscheduler.set_check_settings(interval, integer, interval, interval, interval, integer) IS
    'Set the future-check defaults (resolution, max_checks, horizon, task_timeout, history_retention, '
    'max_payload_bytes); NULL keeps a value.';

-- _check_positive(name, positive, value): PS406 (shards, max) or PS408 unless positive.
CREATE OR REPLACE FUNCTION pyscheduler._check_positive(p_name text, p_positive boolean, p_value text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    IF p_positive IS NOT TRUE THEN
        RAISE EXCEPTION '% must be positive, got %', p_name, coalesce(p_value, 'NULL')
            USING ERRCODE = CASE WHEN p_name IN ('shards', 'max') THEN 'PS406' ELSE 'PS408' END;
    END IF;
END
$$;

-- _check_entity(name, key): PS401 unless the name is a label (_label_refusal: 1..100
-- bytes, no control, zero-width or bidirectional formatting characters, no white space
-- at either end) and the key is given and 1..1000 bytes.
CREATE OR REPLACE FUNCTION pyscheduler._check_entity(p_name text, p_key text, p_key_needed boolean DEFAULT true)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    v_why text := pyscheduler._label_refusal(p_name, 100);
BEGIN
    IF v_why IS NOT NULL THEN
        RAISE EXCEPTION 'entity_name %', v_why
            USING ERRCODE = 'PS401', HINT = 'The entity''s table or type, e.g. ''order''.';
    END IF;
    IF (p_key_needed OR p_key IS NOT NULL) AND (p_key IS NULL OR octet_length(p_key) NOT BETWEEN 1 AND 1000) THEN
        RAISE EXCEPTION 'entity_key must be 1..1000 bytes, got %', coalesce(octet_length(p_key)::text || ' bytes', 'NULL')
            USING ERRCODE = 'PS401', HINT = 'The entity''s key as text, e.g. ''42''.';
    END IF;
END
$$;

-- _sql_job(job, role): the SQL job function job(pyscheduler.future_check) RETURNS
-- timestamptz, what to call it by (schema-qualified), its owner; or why not (why, with the
-- SQLSTATE in code): it does not exist, returns another type, is not SECURITY DEFINER (it
-- would run as pyscheduler), does not pin its own search_path ending in pg_temp (a job run
-- before it in the same statement may have changed the session's), lives in a temporary
-- schema; or role (the check's owner; NULL: not checked) may not EXECUTE it.
CREATE OR REPLACE FUNCTION pyscheduler._sql_job(
    p_job text, p_role name, OUT fn regprocedure, OUT call text, OUT fn_owner name, OUT why text, OUT code text)
LANGUAGE plpgsql STABLE
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    v record;
BEGIN
    code := 'PS402';
    BEGIN
        fn := pg_catalog.to_regprocedure(p_job || '(pyscheduler.future_check)');
    EXCEPTION WHEN OTHERS THEN
        fn := NULL;
    END;
    IF fn IS NULL THEN
        why := format('job function %s(pyscheduler.future_check) does not exist', p_job);
        RETURN;
    END IF;
    SELECT p.prorettype::regtype AS ret, p.prosecdef AS definer, n.oid AS nsp, n.nspname, p.proname,
           pg_catalog.pg_get_userbyid(p.proowner) AS owner,
           (SELECT substr(s, 13) FROM unnest(p.proconfig) s WHERE s LIKE 'search\_path=%') AS path
      INTO v
      FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
     WHERE p.oid = fn;
    IF v.ret IS DISTINCT FROM 'timestamptz'::regtype THEN
        why := format('job function %s returns %s, not timestamptz', fn, v.ret);
    ELSIF NOT v.definer THEN
        why := format('job function %s is not SECURITY DEFINER (a job runs with its owner''s privileges)', fn);
    ELSIF v.path IS NULL OR v.path !~ '(^|,)\s*"?pg_temp"?\s*$' THEN
        why := format('job function %s does not pin its search_path ending in pg_temp '
                      '(SET search_path = myschema, pg_temp)', fn);
    ELSIF v.nspname ~ '^pg_(toast_)?temp_' THEN
        why := format('job function %s is in a temporary schema', fn);
    ELSIF p_role IS NOT NULL AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = p_role) THEN
        why := format('role %s, which added the check, no longer exists', p_role);
        code := '42501';
    ELSIF p_role IS NOT NULL AND NOT (pg_catalog.has_function_privilege(p_role, fn, 'EXECUTE')
                                      AND pg_catalog.has_schema_privilege(p_role, v.nsp, 'USAGE')) THEN
        why := format('role %s, which added the check, may not execute job function %s', p_role, fn);
        code := '42501';
    END IF;
    IF why IS NOT NULL THEN
        fn := NULL;
        RETURN;
    END IF;
    call := format('%I.%I', v.nspname, v.proname);
    fn_owner := v.owner;
    code := NULL;
END
$$;

-- _check_job(job, kind, role): the job as stored (a SQL job's function name as the catalog
-- spells it); PS402 when the kind or the job is invalid, 42501 when role may not execute
-- the SQL job's function.
CREATE OR REPLACE FUNCTION pyscheduler._check_job(p_job text, p_kind text, p_role name)
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    v record;
    v_why text;
BEGIN
    IF p_kind IS NULL OR p_kind NOT IN ('sql', 'python', 'task') THEN
        RAISE EXCEPTION 'kind must be sql, python or task, got %', coalesce(quote_literal(left(p_kind, 40)), 'NULL')
            USING ERRCODE = 'PS402',
                  HINT = 'sql: a function job(pyscheduler.future_check) RETURNS timestamptz; python: a handler '
                         'registered with the runner; task: a task queue.';
    END IF;
    v_why := pyscheduler._label_refusal(p_job, CASE p_kind WHEN 'task' THEN 40 ELSE 200 END);
    IF v_why IS NOT NULL THEN
        RAISE EXCEPTION 'job %', v_why USING ERRCODE = 'PS402';
    END IF;
    IF p_kind <> 'sql' THEN
        RETURN p_job;
    END IF;
    v := pyscheduler._sql_job(p_job, p_role);
    IF v.why IS NOT NULL THEN
        RAISE EXCEPTION '%', v.why
            USING ERRCODE = v.code,
                  HINT = 'CREATE FUNCTION myschema.job(c pyscheduler.future_check) RETURNS timestamptz '
                         'SECURITY DEFINER SET search_path = myschema, pg_temp ...; name it with its schema; '
                         'the role adding the check needs EXECUTE on it.';
    END IF;
    RETURN v.fn::regproc::text;
END
$$;

-- _check_held(id, claim, xmax): whether a check is being run right now: handed to a task
-- job (claim), taken by this transaction (a job of this runner's batch calls add_check),
-- or locked by another transaction (a runner's take). The probe takes the lock the way a
-- runner does (SKIP LOCKED) and rolls it back at once, so it never holds the check up.
CREATE OR REPLACE FUNCTION pyscheduler._check_held(p_id bigint, p_claim uuid, p_xmax xid)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    v_free boolean;
BEGIN
    IF p_claim IS NOT NULL OR p_xmax = pg_catalog.pg_current_xact_id_if_assigned()::xid THEN
        RETURN true;
    END IF;
    BEGIN
        PERFORM 1 FROM pyscheduler.checks c WHERE c.id = p_id FOR UPDATE SKIP LOCKED;
        v_free := FOUND;
        RAISE EXCEPTION USING ERRCODE = 'P0001';  -- roll the probe's lock back
    EXCEPTION WHEN raise_exception THEN
        NULL;
    END;
    RETURN NOT v_free;
END
$$;

-- _add_check(...): add_check with the clock as a parameter (tests).
CREATE OR REPLACE FUNCTION pyscheduler._add_check(
    p_entity_name text, p_entity_key text, p_job text, p_kind text, p_check_at timestamptz,
    p_check_after interval, p_payload jsonb, p_max_checks integer, p_horizon interval, p_now timestamptz)
RETURNS TABLE (id bigint, next_check_at timestamptz, added boolean)
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_owner name := pyscheduler._caller();
    v_job text;
    v_at timestamptz;
    v_slot timestamptz;
    v_max integer := coalesce(p_max_checks, pyscheduler._setting('checks_max_checks')::integer);
    v_horizon interval := coalesce(p_horizon, pyscheduler._setting('checks_horizon')::interval);
    v_limit integer;
    v_row record;
BEGIN
    PERFORM pyscheduler._check_entity(p_entity_name, p_entity_key);
    v_job := pyscheduler._check_job(p_job, p_kind, v_owner);
    IF (p_check_at IS NULL) = (p_check_after IS NULL) THEN
        RAISE EXCEPTION 'give exactly one of check_at and check_after'
            USING ERRCODE = 'PS403', HINT = 'e.g. check_after => ''3 hours''';
    END IF;
    PERFORM pyscheduler._require_instant('check_at', p_check_at, 'PS403');
    PERFORM pyscheduler._require_interval('check_after', p_check_after, interval '0', interval '100 years', 'PS403');
    PERFORM pyscheduler._check_positive('max_checks', v_max >= 1, v_max::text);
    PERFORM pyscheduler._require_interval('horizon', v_horizon, interval '1 microsecond', interval '100 years', 'PS408');
    v_at := coalesce(p_check_at, p_now + p_check_after);
    -- a time already past is checked at the next slot
    v_slot := pyscheduler._slot_ceil(greatest(v_at, p_now), pyscheduler._resolution_us(NULL));
    IF v_slot > p_now + v_horizon THEN
        RAISE EXCEPTION 'check_at % is beyond the horizon of %', v_at, v_horizon
            USING ERRCODE = 'PS403', HINT = 'Pass a larger horizon or check earlier.';
    END IF;
    v_limit := pyscheduler._setting('checks_max_payload_bytes')::integer;
    IF pg_column_size(p_payload) > v_limit THEN
        RAISE EXCEPTION 'payload is % bytes, more than checks_max_payload_bytes (%)', pg_column_size(p_payload), v_limit
            USING ERRCODE = 'PS409', HINT = 'Keep large data elsewhere and put a reference in the payload.';
    END IF;
    IF p_kind = 'task' THEN
        -- the task's spec carries the check (a larger id later: 64 bytes to spare)
        v_limit := pyscheduler._setting('task_max_spec_bytes')::integer;
        IF pg_column_size(jsonb_build_object(
               'check', to_jsonb(ROW(0, p_entity_name, p_entity_key, v_job, p_kind, p_payload, v_slot, v_slot, 0,
                                     v_max, p_now, v_owner)::pyscheduler.future_check),
               'claim', gen_random_uuid())) + 64 > v_limit THEN
            RAISE EXCEPTION 'the task of this check would exceed task_max_spec_bytes (%)', v_limit
                USING ERRCODE = 'PS409', HINT = 'Keep large data elsewhere and put a reference in the payload.';
        END IF;
    END IF;
    FOR i IN 1..3 LOOP
        RETURN QUERY
        INSERT INTO checks AS c (entity_name, entity_key, job, kind, payload, first_check_at, next_check_at,
                                 max_checks, horizon, created, owner)
        VALUES (p_entity_name, p_entity_key, v_job, p_kind, p_payload, v_slot, v_slot, v_max, v_horizon, p_now, v_owner)
        ON CONFLICT ON CONSTRAINT checks_entity_job_key DO NOTHING
        RETURNING c.id, c.next_check_at, true;
        IF FOUND THEN
            RETURN;
        END IF;
        SELECT c.id, c.next_check_at, c.kind, c.owner, c.claim, c.xmax INTO v_row FROM checks c
         WHERE c.entity_name = p_entity_name AND c.entity_key = p_entity_key AND c.job = v_job;
        EXIT WHEN FOUND;  -- else it ended meanwhile: insert again
    END LOOP;
    IF NOT pyscheduler._may_act(v_row.owner) THEN
        RAISE EXCEPTION 'a check of (%, %, %) is pending and belongs to another role', p_entity_name,
                        left(p_entity_key, 40), v_job
            USING ERRCODE = '42501',
                  HINT = 'Only the role that added it, a member of that role, or the admin role may act on it.';
    END IF;
    IF v_row.kind <> p_kind THEN
        RAISE EXCEPTION 'a check of (%, %, %) is pending with kind %, not %', p_entity_name, left(p_entity_key, 40),
                        v_job, v_row.kind, p_kind
            USING ERRCODE = 'PS410', HINT = 'delete_checks first to change its kind.';
    END IF;
    IF pyscheduler._check_held(v_row.id, v_row.claim, v_row.xmax)
       OR EXISTS (SELECT 1 FROM check_requests r WHERE r.check_id = v_row.id AND r.delete_by IS NOT NULL) THEN
        -- being run (or being deleted): added again once that run ends it, nothing if it reschedules it
        INSERT INTO check_requests AS r (check_id, entity_name, entity_key, job, readd_kind, readd_payload, readd_at,
                                         readd_max_checks, readd_horizon, readd_by, requested)
        VALUES (v_row.id, p_entity_name, p_entity_key, v_job, p_kind, p_payload, v_slot, v_max, v_horizon, v_owner,
                p_now)
        ON CONFLICT ON CONSTRAINT check_requests_pkey DO UPDATE
           SET readd_kind = EXCLUDED.readd_kind, readd_payload = EXCLUDED.readd_payload,
               readd_at = EXCLUDED.readd_at, readd_max_checks = EXCLUDED.readd_max_checks,
               readd_horizon = EXCLUDED.readd_horizon, readd_by = EXCLUDED.readd_by, requested = EXCLUDED.requested;
        RETURN QUERY SELECT v_row.id, v_slot, NULL::boolean;
        RETURN;
    END IF;
    RETURN QUERY SELECT v_row.id, v_row.next_check_at, false;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.add_check(
    entity_name text, entity_key text, job text, check_at timestamptz DEFAULT NULL,
    check_after interval DEFAULT NULL, payload jsonb DEFAULT NULL, kind text DEFAULT 'sql',
    max_checks integer DEFAULT NULL, horizon interval DEFAULT NULL)
RETURNS TABLE (id bigint, next_check_at timestamptz, added boolean)
LANGUAGE sql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* add_check(entity_name, entity_key, job, check_at | check_after, payload => NULL,
             kind => 'sql', max_checks => NULL, horizon => NULL) -> (id, next_check_at, added)
   Schedule a check of an entity: its first check is check_at (or now +
   check_after) rounded UP to a slot (slot_round); a time already past is
   checked at the next slot. The check belongs to the caller's role.
   job:  kind 'sql': a function job(pyscheduler.future_check) RETURNS
         timestamptz, SECURITY DEFINER (it runs with its owner's privileges),
         with SET search_path = ..., pg_temp, named with its schema, that the
         caller may EXECUTE; kind 'python': a handler name registered with
         the runner; kind 'task': a task queue (pyscheduler.submit_task).
   payload:    jsonb, at most max_payload_bytes (setting, 64 KiB).
   max_checks: most runs of this check (default setting, 5).
   horizon:    furthest a check may be from now (default setting, 30 days).
   Idempotent: while a check of (entity_name, entity_key, job) is pending,
   adding it again changes nothing and returns it with added = false (the
   first check time is immutable); delete_checks first to replace it. While
   a runner runs that check, added is NULL: this add is kept and becomes a
   new check if the run ends the pending one, nothing if it reschedules it.
   Errors: PS400, PS401 entity, PS402 job or kind, PS403 check time, PS408,
   PS409 payload, PS410 pending with another kind, 42501 a job the caller may
   not execute or a pending check of another role. */
    SELECT * FROM pyscheduler._add_check(entity_name, entity_key, job, kind, check_at, check_after, payload,
                                         max_checks, horizon, clock_timestamp());
$$;
COMMENT ON FUNCTION pyscheduler.add_check(text, text, text, timestamptz, interval, jsonb, text, integer, interval) IS
    'Schedule a check of an entity at a slot (rounded up); idempotent per (entity_name, entity_key, job).';

-- _apply_requests(ids): the checks ids have just ended (into check_history): what clients
-- asked of them while they were held is done now. A re-add becomes a new check (at the slot
-- it asked for; a slot already past is taken by the next catch-up pass); every request of
-- ids is dropped.
CREATE OR REPLACE FUNCTION pyscheduler._apply_requests(p_ids bigint[])
RETURNS void
LANGUAGE sql
SET search_path = pyscheduler, pg_temp
AS $$
    WITH r AS (DELETE FROM pyscheduler.check_requests r WHERE r.check_id = ANY(p_ids) RETURNING r.*)
    INSERT INTO pyscheduler.checks AS c (entity_name, entity_key, job, kind, payload, first_check_at, next_check_at,
                                         max_checks, horizon, created, owner)
    SELECT r.entity_name, r.entity_key, r.job, r.readd_kind, r.readd_payload, r.readd_at, r.readd_at,
           r.readd_max_checks, r.readd_horizon, r.requested, r.readd_by
      FROM r WHERE r.readd_by IS NOT NULL
    ON CONFLICT ON CONSTRAINT checks_entity_job_key DO NOTHING;
$$;

-- _end_checks(ids, outcomes, errors, took, ran, now): move checks into check_history, one
-- statement for all (every path that ends checks: finish, delete, lost task jobs). ran: the
-- check ran once more now (its slot becomes last_check_at, check_count + 1, took added);
-- otherwise it leaves as it stands (deleted). Errors are kept to 2,000 characters. Then
-- applies the clients' requests of the checks that ended. Returns how many left.
CREATE OR REPLACE FUNCTION pyscheduler._end_checks(
    p_ids bigint[], p_outcomes text[], p_errors text[], p_took interval[], p_ran boolean, p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    v_n integer;
BEGIN
    IF coalesce(cardinality(p_ids), 0) = 0 THEN
        RETURN 0;
    END IF;
    WITH gone AS (
        DELETE FROM checks c USING unnest(p_ids, p_outcomes, p_errors, p_took) AS u(id, outcome, err, took)
         WHERE c.id = ANY(p_ids) AND c.id = u.id  -- ANY: index scans of checks, never a hash of all of it
        RETURNING c.*, u.outcome, u.err, u.took)
    INSERT INTO check_history (id, entity_name, entity_key, job, kind, payload, first_check_at, last_check_at,
                               check_count, outcome, error, last_took, total_took, created, ended, owner)
    SELECT g.id, g.entity_name, g.entity_key, g.job, g.kind, g.payload, g.first_check_at,
           CASE WHEN p_ran THEN g.next_check_at ELSE g.last_check_at END,
           g.check_count + CASE WHEN p_ran THEN 1 ELSE 0 END, g.outcome, left(g.err, 2000),
           CASE WHEN p_ran THEN g.took ELSE g.last_took END, g.total_took + coalesce(g.took, interval '0'),
           g.created, p_now, g.owner
      FROM gone g;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    IF pyscheduler._requests_pending() THEN
        PERFORM pyscheduler._apply_requests(p_ids);
    END IF;
    RETURN v_n;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.delete_checks(entity_name text, entity_key text, job text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* delete_checks(entity_name, entity_key, job => NULL) -> integer
   Remove the entity's pending checks (of one job, or all) that the caller
   may act on (its own role's, a role it is a member of, or any for the admin
   role; other roles' checks are left alone and not counted), each into
   check_history with outcome 'deleted'; returns how many. It never waits
   for a runner: a check a runner holds right now is ended as 'deleted' by
   that runner, and does not run if it has not started (one already running
   finishes its run first). A job deleting its own entity's checks (the
   seed's pattern) stops the other checks of its batch the same way. A check
   handed to a task job is deleted at once; the task's finish_check then gets
   PS407. Errors: PS401 entity. */
#variable_conflict use_column
DECLARE
    v_sql_job text;
    v_xid xid := pg_current_xact_id_if_assigned()::xid;
    v_mine bigint[];
    v_now bigint[];
    v_held bigint[];
BEGIN
    PERFORM pyscheduler._check_entity(delete_checks.entity_name, delete_checks.entity_key);
    IF delete_checks.job IS NOT NULL THEN
        v_sql_job := (pyscheduler._sql_job(delete_checks.job, NULL)).fn::regproc::text;
    END IF;
    v_mine := ARRAY(SELECT c.id FROM checks c
                     WHERE c.entity_name = delete_checks.entity_name AND c.entity_key = delete_checks.entity_key
                       AND (delete_checks.job IS NULL OR c.job = delete_checks.job OR c.job = v_sql_job)
                       AND pyscheduler._may_act(c.owner)
                       AND NOT EXISTS (SELECT 1 FROM check_requests r
                                        WHERE r.check_id = c.id AND r.delete_by IS NOT NULL));
    -- free ones and ones handed to a task job: now; not those this transaction took (a job of
    -- the runner's batch) nor those another transaction holds (a runner): they are its to end
    v_now := ARRAY(SELECT c.id FROM checks c
                    WHERE c.id = ANY(v_mine) AND (c.claim IS NOT NULL OR v_xid IS NULL OR NOT c.xmax = v_xid)
                      FOR UPDATE SKIP LOCKED);
    v_held := ARRAY(SELECT u FROM unnest(v_mine) u WHERE u <> ALL(v_now));
    INSERT INTO check_requests AS r (check_id, entity_name, entity_key, job, delete_by, requested)
    SELECT c.id, c.entity_name, c.entity_key, c.job, pyscheduler._caller(), clock_timestamp()
      FROM checks c WHERE c.id = ANY(v_held)
    ON CONFLICT ON CONSTRAINT check_requests_pkey DO UPDATE  -- a delete drops an earlier re-add
       SET delete_by = EXCLUDED.delete_by, readd_kind = NULL, readd_payload = NULL, readd_at = NULL,
           readd_max_checks = NULL, readd_horizon = NULL, readd_by = NULL, requested = EXCLUDED.requested;
    DELETE FROM check_requests r WHERE r.check_id = ANY(v_now);  -- likewise
    RETURN pyscheduler._end_checks(v_now, array_fill('deleted'::text, ARRAY[cardinality(v_now)]), NULL, NULL, false,
                                   clock_timestamp())
           + cardinality(v_held);
END
$$;
COMMENT ON FUNCTION pyscheduler.delete_checks(text, text, text) IS
    'Delete the caller''s pending checks of an entity (outcome deleted in check_history); never waits for a runner.';

-- _without_deleted(checks, now): the checks (taken by this transaction) without those a
-- client or a job asked to delete since, which are ended here as 'deleted' without running.
-- Batch paths call it only when check_requests has rows (_requests_pending): passing a batch
-- to a function copies it.
CREATE OR REPLACE FUNCTION pyscheduler._requests_pending()
RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT EXISTS (SELECT 1 FROM pyscheduler.check_requests);
$$;

CREATE OR REPLACE FUNCTION pyscheduler._without_deleted(p_checks pyscheduler.future_check[], p_now timestamptz)
RETURNS pyscheduler.future_check[]
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    v_del bigint[];
BEGIN
    IF cardinality(p_checks) = 0 OR NOT EXISTS (SELECT 1 FROM check_requests r WHERE r.delete_by IS NOT NULL) THEN
        RETURN p_checks;
    END IF;
    v_del := ARRAY(SELECT r.check_id FROM check_requests r
                    WHERE r.check_id = ANY(ARRAY(SELECT c.id FROM unnest(p_checks) c)) AND r.delete_by IS NOT NULL);
    IF cardinality(v_del) = 0 THEN
        RETURN p_checks;
    END IF;
    PERFORM pyscheduler._end_checks(v_del, array_fill('deleted'::text, ARRAY[cardinality(v_del)]), NULL, NULL, false,
                                    p_now);
    RETURN ARRAY(SELECT c FROM unnest(p_checks) c WHERE c.id <> ALL(v_del));
END
$$;

-- _reconcile_requests(shard, shards, max, now): requests a runner did not apply because they
-- came after it looked (the catch-up pass calls this): for a check that has ended, its re-add
-- becomes a new check; a pending check no runner holds that a client asked to delete is
-- deleted. (A re-add of a check that is still pending waits for its next run: applied if that
-- run ends it, dropped if it reschedules it.) Requests of held checks wait.
CREATE OR REPLACE FUNCTION pyscheduler._reconcile_requests(p_shard integer, p_shards integer, p_max integer,
                                                           p_now timestamptz)
RETURNS void
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    v_id bigint;
BEGIN
    FOR v_id IN SELECT r.check_id FROM check_requests r
                 WHERE (p_shards = 1 OR r.check_id % p_shards = p_shard)
                   AND (r.delete_by IS NOT NULL OR NOT EXISTS (SELECT 1 FROM checks c WHERE c.id = r.check_id))
                 ORDER BY r.requested LIMIT p_max
    LOOP
        IF NOT EXISTS (SELECT 1 FROM checks c WHERE c.id = v_id) THEN
            PERFORM pyscheduler._apply_requests(ARRAY[v_id]);
            CONTINUE;
        END IF;
        PERFORM 1 FROM checks c WHERE c.id = v_id AND c.claim IS NULL FOR UPDATE SKIP LOCKED;
        IF FOUND THEN
            PERFORM pyscheduler._end_checks(ARRAY[v_id], ARRAY['deleted'], NULL, NULL, false, p_now);
        END IF;
    END LOOP;
END
$$;

-- _take_checks(slot, shard, shards, max, after, now): validate a take and take. slot: a
-- started slot boundary (the '=' pass: exactly its checks, with id > after when after is
-- given), or NULL (the catch-up pass: checks of slots before the current one, oldest first,
-- after ending lost task jobs as 'timeout' and applying clients' requests no runner applied).
-- Locks what it returns (FOR UPDATE SKIP LOCKED).
-- Both passes are one range scan of checks_due_idx in take order:
-- (next_check_at, id) > (lo, after) AND next_check_at <= hi, skipping the checks handed to a
-- task job (they keep their slot while the task runs: no more than tasks in flight).
CREATE OR REPLACE FUNCTION pyscheduler._take_checks(
    p_slot timestamptz, p_shard integer, p_shards integer, p_max integer, p_after bigint, p_now timestamptz)
RETURNS SETOF pyscheduler.future_check
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
-- always the partial index in take order, stopping at max: for a slot that is a large share of
-- a small table the planner would sort a seq or bitmap scan of the whole slot instead
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_indexscan = on  -- whatever the session set
AS $$
#variable_conflict use_column
DECLARE
    v_us bigint := pyscheduler._resolution_us(NULL);
    v_lo timestamptz := p_slot;
    v_hi timestamptz := p_slot;
    v_stale record;
BEGIN
    PERFORM pyscheduler._check_positive('shards', p_shards >= 1, p_shards::text);
    PERFORM pyscheduler._check_positive('max', p_max >= 1, p_max::text);
    IF p_shard IS NULL OR p_shard < 0 OR p_shard >= p_shards THEN
        RAISE EXCEPTION 'shard must be in 0..% (shards - 1), got %', p_shards - 1, coalesce(p_shard::text, 'NULL')
            USING ERRCODE = 'PS406', HINT = 'Runner k of n runs shard => k, shards => n (k = 0..n-1).';
    END IF;
    IF p_slot IS NULL THEN
        v_lo := '-infinity';
        v_hi := pyscheduler._slot_floor(p_now, v_us) - interval '1 microsecond';
        -- checks handed to a task job that never reported back end as timeout
        SELECT array_agg(c.id) AS ids, array_agg('timeout'::text) AS outcomes,
               array_agg(format('task %s did not report by %s', c.task_rn, c.claim_until)) AS errors,
               array_agg(p_now - c.next_check_at) AS took
          INTO v_stale
          FROM (SELECT c.* FROM checks c
                 WHERE c.claim IS NOT NULL AND c.claim_until < p_now AND (p_shards = 1 OR c.id % p_shards = p_shard)
                 ORDER BY c.claim_until LIMIT p_max
                   FOR UPDATE SKIP LOCKED) c;
        PERFORM pyscheduler._end_checks(v_stale.ids, v_stale.outcomes, v_stale.errors, v_stale.took, true, p_now);
        IF pyscheduler._requests_pending() THEN
            PERFORM pyscheduler._reconcile_requests(p_shard, p_shards, p_max, p_now);
        END IF;
    ELSIF NOT pyscheduler._instant_ok(p_slot) OR p_slot <> pyscheduler._slot_ceil(p_slot, v_us) THEN
        RAISE EXCEPTION 'slot % is not a slot boundary', p_slot
            USING ERRCODE = 'PS405', HINT = 'Take slots from check_slots() or slot_round().';
    ELSIF p_slot > p_now THEN
        RAISE EXCEPTION 'slot % has not started yet (database clock %)', p_slot, p_now
            USING ERRCODE = 'PS404', HINT = 'Checks never run early: wait until the slot begins.';
    END IF;
    RETURN QUERY
    SELECT c.id, c.entity_name, c.entity_key, c.job, c.kind, c.payload, c.first_check_at, c.next_check_at,
           c.check_count, c.max_checks, c.created, c.owner
      FROM checks c
     WHERE (c.next_check_at, c.id) > (v_lo, coalesce(p_after, 0)) AND c.next_check_at <= v_hi AND c.claim IS NULL
       AND (p_shards = 1 OR c.id % p_shards = p_shard)
     ORDER BY c.next_check_at, c.id
     LIMIT p_max
       FOR UPDATE SKIP LOCKED;
END
$$;

-- _take_undeleted(slot, shard, shards, max, now): _take_checks without the checks a client
-- asked to delete while a runner held them (ended here as 'deleted'): what due_checks and
-- catch_up_checks give their callers.
CREATE OR REPLACE FUNCTION pyscheduler._take_undeleted(
    p_slot timestamptz, p_shard integer, p_shards integer, p_max integer, p_now timestamptz)
RETURNS SETOF pyscheduler.future_check
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    IF NOT pyscheduler._requests_pending() THEN
        RETURN QUERY SELECT * FROM pyscheduler._take_checks(p_slot, p_shard, p_shards, p_max, NULL, p_now);
        RETURN;
    END IF;
    RETURN QUERY
    SELECT (x).* FROM unnest(pyscheduler._without_deleted(
        ARRAY(SELECT t FROM pyscheduler._take_checks(p_slot, p_shard, p_shards, p_max, NULL, p_now) t), p_now)) x;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.due_checks(
    slot timestamptz, shard integer DEFAULT 0, shards integer DEFAULT 1, max integer DEFAULT 1000)
RETURNS SETOF pyscheduler.future_check
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* due_checks(slot, shard => 0, shards => 1, max => 1000) -> setof check
   Take up to max checks whose next check is exactly slot (=, not <) and
   whose id % shards = shard, lowest id first, and lock them (FOR UPDATE SKIP
   LOCKED) for the rest of the calling transaction. Runners k = 0..n-1 with
   shards => n take disjoint sets that together cover the slot; a check locked
   by a runner still busy with it is skipped by every other caller, so no
   check runs twice even with two runners on one shard. A check a client
   asked to delete while a runner held it is ended as deleted instead of
   being returned. In the same
   transaction: run_check_jobs / submit_check_tasks run the in-database jobs,
   finish_checks records every result; COMMIT releases the locks. Call it at
   the top level of the transaction (not inside a savepoint).
   slot: a slot boundary (PS405) that has started by the database clock
   (PS404: a check never runs early). Errors: PS404, PS405, PS406. */
BEGIN
    IF slot IS NULL THEN
        RAISE EXCEPTION 'slot % is not a slot boundary', 'NULL'
            USING ERRCODE = 'PS405', HINT = 'Take slots from check_slots() or slot_round().';
    END IF;
    RETURN QUERY SELECT * FROM pyscheduler._take_undeleted(slot, shard, shards, max, clock_timestamp());
END
$$;
COMMENT ON FUNCTION pyscheduler.due_checks(timestamptz, integer, integer, integer) IS
    'Take and lock (SKIP LOCKED) up to max checks of exactly this started slot and shard (id % shards).';

CREATE OR REPLACE FUNCTION pyscheduler.catch_up_checks(
    shard integer DEFAULT 0, shards integer DEFAULT 1, max integer DEFAULT 1000)
RETURNS SETOF pyscheduler.future_check
LANGUAGE sql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* catch_up_checks(shard => 0, shards => 1, max => 1000) -> setof check
   The seed's "<" pass for slots missed while runners were down: takes and
   locks (FOR UPDATE SKIP LOCKED) up to max checks of this shard whose slot
   is before the current slot (check_slots().slot), oldest first. Used like
   due_checks. It never takes a check of the current slot, which belongs to
   the "=" pass, and never one another transaction holds, so it cannot run a
   check twice. It also ends, as 'timeout', checks handed to a task job
   whose task did not report back within task_timeout, and applies what
   clients asked (delete_checks, add_check) of checks while runners held
   them, if no runner did. Errors: PS406. */
    SELECT * FROM pyscheduler._take_undeleted(NULL, shard, shards, max, clock_timestamp());
$$;
COMMENT ON FUNCTION pyscheduler.catch_up_checks(integer, integer, integer) IS
    'Take and lock (SKIP LOCKED) checks of slots before the current one (the catch-up pass); expire lost task jobs.';

-- _held_checks(ids, kind): the checks of one kind (NULL: any) among ids that this transaction
-- took (locked through a take: the row's xmax is this transaction; handed-to-task ones excluded).
CREATE OR REPLACE FUNCTION pyscheduler._held_checks(p_ids bigint[], p_kind text)
RETURNS pyscheduler.future_check[]
LANGUAGE sql STABLE
SET search_path = pyscheduler, pg_temp
AS $$
    SELECT coalesce(array_agg(ROW(c.id, c.entity_name, c.entity_key, c.job, c.kind, c.payload, c.first_check_at,
                                  c.next_check_at, c.check_count, c.max_checks, c.created,
                                  c.owner)::pyscheduler.future_check
                              ORDER BY c.id), '{}')
      FROM pyscheduler.checks c
     WHERE c.id = ANY(p_ids) AND (p_kind IS NULL OR c.kind = p_kind) AND c.claim IS NULL
       AND c.xmax = pg_catalog.pg_current_xact_id()::xid;
$$;

-- The session settings a job may change for good with set_config(..., false) and that the
-- runner relies on after it (search_path, TimeZone, DateStyle and IntervalStyle are
-- _after_user_code's): its timeouts (a job could make every later statement of the runner
-- time out, or have its idle transaction killed), its transaction defaults (every later
-- transaction read-only) and how values travel to it.
CREATE OR REPLACE FUNCTION pyscheduler._guarded_settings()
RETURNS text[]
LANGUAGE sql IMMUTABLE
AS $$
    SELECT ARRAY['statement_timeout', 'lock_timeout', 'idle_in_transaction_session_timeout', 'idle_session_timeout',
                 'default_transaction_read_only', 'default_transaction_isolation', 'default_transaction_deferrable',
                 'client_encoding', 'standard_conforming_strings', 'bytea_output'];
$$;

-- _session_settings(): the values of _guarded_settings(), before user code runs.
CREATE OR REPLACE FUNCTION pyscheduler._session_settings()
RETURNS text[]
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT array_agg(pg_catalog.current_setting(s.name) ORDER BY s.i)
      FROM unnest(pyscheduler._guarded_settings()) WITH ORDINALITY AS s(name, i);
$$;

-- _after_check_jobs(saved): call right after check jobs return (schema-qualified, before
-- anything else): _after_user_code() (search_path, TimeZone, DateStyle, IntervalStyle;
-- PS003 for a transaction the job made read-only), then the guarded settings back to saved
-- (_session_settings() before the jobs), for the rest of the session.
CREATE OR REPLACE FUNCTION pyscheduler._after_check_jobs(p_saved text[])
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pyscheduler._after_user_code();
    PERFORM pg_catalog.set_config(s.name, p_saved[s.i], false)
       FROM unnest(pyscheduler._guarded_settings()) WITH ORDINALITY AS s(name, i)
      WHERE pg_catalog.current_setting(s.name) IS DISTINCT FROM p_saved[s.i];
END
$$;

-- _run_sql_jobs(checks): run the SQL jobs of checks the caller holds, as their owners
-- (SECURITY DEFINER), if the role that added each check may still execute them. The checks
-- of one job (and owner) run as one set in ONE subtransaction (one statement); only if one
-- of them raises (or leaves the transaction read-only) are they re-run one subtransaction
-- each, so a failing job still affects only itself. Sets run in id order; before each, checks
-- a client or an earlier job asked to delete are ended without running. A next_check_at
-- outside the supported instants comes back as an error.
CREATE OR REPLACE FUNCTION pyscheduler._run_sql_jobs(p_checks pyscheduler.future_check[])
RETURNS TABLE (id bigint, next_check_at timestamptz, error text, took interval)
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_saved text[] := pyscheduler._session_settings();
    v_job text;
    v_owner name;
    v_recs future_check[];
    v_rec future_check;
    v_fn record;
    v_ids bigint[];
    v_next timestamptz[];
    v_took interval[];
    v_one timestamptz;
    v_t0 timestamptz;
    v_err text;
BEGIN
    FOR v_job, v_owner, v_recs IN
        SELECT r.job, r.owner, array_agg(r ORDER BY r.id) FROM unnest(p_checks) r
         GROUP BY r.job, r.owner ORDER BY min(r.id)
    LOOP
        IF pyscheduler._requests_pending() THEN
            v_recs := pyscheduler._without_deleted(v_recs, clock_timestamp());
            CONTINUE WHEN cardinality(v_recs) = 0;
        END IF;
        v_fn := pyscheduler._sql_job(v_job, v_owner);
        IF v_fn.why IS NOT NULL THEN
            RETURN QUERY SELECT r.id, NULL::timestamptz, v_fn.why, interval '0' FROM unnest(v_recs) r;
            CONTINUE;
        END IF;
        -- while the jobs run, the pyscheduler functions they call act as their function's owner (the
        -- row never outlives this loop: an error that skips its DELETE rolls its INSERT back too)
        PERFORM pyscheduler._begin_user_code(v_fn.fn_owner);
        BEGIN
            EXECUTE format(
                'SELECT array_agg(x.id), array_agg(x.nxt), array_agg(x.t1 - x.t0) '
                '  FROM (SELECT c.id, clock_timestamp() AS t0, %s(c) AS nxt, clock_timestamp() AS t1 '
                '          FROM unnest($1) c OFFSET 0) x', v_fn.call)
               INTO v_ids, v_next, v_took USING v_recs;
            PERFORM pyscheduler._after_check_jobs(v_saved);
            RETURN QUERY
            SELECT u.id, CASE WHEN pyscheduler._instant_ok(u.nxt) THEN u.nxt END,
                   CASE WHEN u.nxt IS NOT NULL AND NOT pyscheduler._instant_ok(u.nxt)
                        THEN format('the job returned next_check_at %s, outside [1970-01-01, 9999-01-01) UTC', u.nxt)
                   END, u.took
              FROM unnest(v_ids, v_next, v_took) u(id, nxt, took);
        EXCEPTION WHEN OTHERS THEN
            -- one of them raised: each in its own subtransaction
            FOREACH v_rec IN ARRAY v_recs LOOP
                v_t0 := clock_timestamp();
                v_err := NULL;
                BEGIN
                    EXECUTE format('SELECT %s($1)', v_fn.call) INTO v_one USING v_rec;
                    PERFORM pyscheduler._after_check_jobs(v_saved);
                EXCEPTION WHEN OTHERS THEN
                    v_one := NULL;
                    v_err := format('%s (SQLSTATE %s)', SQLERRM, SQLSTATE);
                END;
                IF NOT pyscheduler._instant_ok(v_one) THEN
                    v_err := format('the job returned next_check_at %s, outside [1970-01-01, 9999-01-01) UTC', v_one);
                    v_one := NULL;
                END IF;
                id := v_rec.id;
                next_check_at := v_one;
                error := v_err;
                took := clock_timestamp() - v_t0;
                RETURN NEXT;
            END LOOP;
        END;
        PERFORM pyscheduler._end_user_code();
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.run_check_jobs(ids bigint[])
RETURNS TABLE (id bigint, next_check_at timestamptz, error text, took interval)
LANGUAGE sql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* run_check_jobs(ids) -> setof (id, next_check_at, error, took)
   Run the SQL jobs of the checks among ids that this transaction took
   (due_checks / catch_up_checks, same transaction); other ids are ignored.
   Each job runs as its function's owner (SECURITY DEFINER), only if the role
   that added the check may still EXECUTE it (else an error row), and in its
   own subtransaction: a job that raises, or leaves the transaction
   read-only, is rolled back alone and reported with its error text; its
   neighbours are unaffected. (The checks of one job run first as one set in
   one subtransaction; only if one of them raises are they re-run one
   subtransaction each.) A check a client asked to delete meanwhile is ended
   as deleted without running and returns no row. Nothing else is recorded:
   pass the results to finish_checks. Timeouts: run it under SET LOCAL
   statement_timeout inside a savepoint; on a timeout roll back to the
   savepoint and run the ids one per statement to find the slow one (what
   pyscheduler checks run does). */
    SELECT * FROM pyscheduler._run_sql_jobs(pyscheduler._held_checks(ids, 'sql'));
$$;
COMMENT ON FUNCTION pyscheduler.run_check_jobs(bigint[]) IS
    'Run the SQL jobs of checks this transaction took, each in its own subtransaction; returns next times and errors.';

-- _submit_check_tasks(checks): hand task-job checks the caller holds to leased tasks. A check
-- whose task cannot be submitted (e.g. its spec exceeds task_max_spec_bytes) ends alone as
-- 'error' and comes back with task_rn NULL.
CREATE OR REPLACE FUNCTION pyscheduler._submit_check_tasks(p_checks pyscheduler.future_check[])
RETURNS TABLE (id bigint, task_rn uuid)
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_until timestamptz := clock_timestamp() + pyscheduler._setting('checks_task_timeout')::interval;
    v future_check;
    v_claim uuid;
    v_failed bigint[] := '{}';
    v_errors text[] := '{}';
BEGIN
    FOREACH v IN ARRAY p_checks LOOP
        v_claim := gen_random_uuid();
        BEGIN
            -- the task belongs to the check's owner (who may cancel or requeue it)
            task_rn := (pyscheduler._submit_task(queue => v.job, spec => jsonb_build_object('check', to_jsonb(v),
                                                                                           'claim', v_claim),
                                                 priority => 50, p_now => now(), p_submitted_by => v.owner::name)
                        ->> 'rn')::uuid;
            UPDATE checks c SET claim = v_claim, claim_until = v_until, task_rn = _submit_check_tasks.task_rn
             WHERE c.id = v.id;
            id := v.id;
            RETURN NEXT;
        EXCEPTION WHEN OTHERS THEN
            v_failed := v_failed || v.id;
            v_errors := v_errors || format('its task could not be submitted: %s (SQLSTATE %s)', SQLERRM, SQLSTATE);
        END;
    END LOOP;
    IF cardinality(v_failed) > 0 THEN
        PERFORM pyscheduler._end_checks(v_failed, array_fill('error'::text, ARRAY[cardinality(v_failed)]), v_errors,
                                        NULL, false, clock_timestamp());
        RETURN QUERY SELECT f, NULL::uuid FROM unnest(v_failed) f;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.submit_check_tasks(ids bigint[])
RETURNS TABLE (id bigint, task_rn uuid)
LANGUAGE sql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* submit_check_tasks(ids) -> setof (id, task_rn)
   For the task-job checks among ids that this transaction took: submit a
   leased task to the job's queue (priority 50) whose spec is {"check": {the
   future_check's fields}, "claim": uuid}, and hand the check to it: no pass
   takes it while the task runs; the task worker reports with
   finish_check(id, claim => spec.claim, next_check_at => ...). A task that
   does not report within task_timeout ends the check as 'timeout'
   (catch_up_checks). A check whose task cannot be submitted (its spec larger
   than task_max_spec_bytes, say) ends as 'error' and comes back with task_rn
   NULL; the others are unaffected. Other ids are ignored. */
    SELECT * FROM pyscheduler._submit_check_tasks(pyscheduler._held_checks(ids, 'task'));
$$;
COMMENT ON FUNCTION pyscheduler.submit_check_tasks(bigint[]) IS
    'Hand the task-job checks this transaction took to leased tasks in their queues (claim token in the spec).';

CREATE OR REPLACE FUNCTION pyscheduler._finish_checks(
    p_ids bigint[], p_next timestamptz[], p_errors text[], p_timed_out boolean[], p_took interval[],
    p_claims uuid[], p_now timestamptz)
RETURNS TABLE (id bigint, outcome text, next_check_at timestamptz)
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_xid xid := pg_current_xact_id()::xid;
    v_us bigint := pyscheduler._resolution_us(NULL);
    v_n integer := cardinality(p_ids);
    v_del bigint[] := '{}';
    v record;
BEGIN
    IF p_ids IS NULL THEN
        RETURN;
    END IF;
    IF coalesce(cardinality(p_next), v_n) <> v_n OR coalesce(cardinality(p_errors), v_n) <> v_n
       OR coalesce(cardinality(p_timed_out), v_n) <> v_n OR coalesce(cardinality(p_took), v_n) <> v_n
       OR coalesce(cardinality(p_claims), v_n) <> v_n THEN
        RAISE EXCEPTION 'ids, next_check_ats, errors, timed_out, took and claims must have one element per id'
            USING ERRCODE = 'PS408', HINT = 'Pass NULL for an array that is all NULL.';
    END IF;
    IF p_claims IS NOT NULL THEN
        -- checks reported by task workers: lock them first (rows taken through due_checks are
        -- locked by this transaction already; that lock is their proof)
        PERFORM 1 FROM checks c JOIN unnest(p_ids, p_claims) AS u(id, claim) ON c.id = u.id AND c.claim = u.claim
         ORDER BY c.id
           FOR UPDATE OF c;
    END IF;
    IF pyscheduler._requests_pending() THEN
        -- deleted while they ran: they end as deleted (unless their run ended them anyway)
        v_del := ARRAY(SELECT r.check_id FROM check_requests r WHERE r.check_id = ANY(p_ids) AND r.delete_by IS NOT NULL);
    END IF;
    -- decide, in one pass: an element counts only if it is the first one of its id and the
    -- caller holds the check (locked by this transaction, or the claim of its task)
    WITH u AS (
        SELECT u.*, min(u.ord) OVER (PARTITION BY u.id) = u.ord AS first,
               u.nxt IS NULL OR pyscheduler._instant_ok(u.nxt) AS nxt_ok
          FROM unnest(p_ids, p_next, p_errors, p_timed_out, p_took, p_claims)
               WITH ORDINALITY AS u(id, nxt, err, tmo, took, claim, ord)),
    d AS (
        SELECT u.ord, u.id, u.took,
               CASE WHEN u.err IS NULL AND NOT u.nxt_ok
                    THEN format('next_check_at %s is outside [1970-01-01, 9999-01-01) UTC', u.nxt) ELSE u.err END AS err,
               CASE WHEN u.nxt_ok THEN pyscheduler._slot_ceil(u.nxt, v_us) END AS slot,
               CASE WHEN c.id IS NULL THEN 'not_taken'
                    WHEN u.tmo THEN 'timeout'
                    WHEN u.err IS NOT NULL OR NOT u.nxt_ok THEN 'error'
                    WHEN u.nxt IS NULL THEN 'done'
                    WHEN u.id = ANY(v_del) THEN 'deleted'
                    WHEN c.check_count + 1 >= c.max_checks THEN 'max_checks'
                    WHEN u.nxt <= p_now THEN 'past'
                    WHEN pyscheduler._slot_ceil(u.nxt, v_us) > p_now + c.horizon THEN 'horizon'
                    ELSE 'rescheduled' END AS outcome
          FROM u LEFT JOIN checks c
            ON u.first AND c.id = u.id AND c.id = ANY(p_ids)  -- ANY: index scans, never a hash of all checks
           AND ((u.claim IS NULL AND c.claim IS NULL AND c.xmax = v_xid) OR (u.claim IS NOT NULL AND c.claim = u.claim)))
    SELECT array_agg(d.outcome ORDER BY d.ord) AS outcomes,
           array_agg(CASE WHEN d.outcome = 'rescheduled' THEN d.slot END ORDER BY d.ord) AS slots,
           array_agg(d.id) FILTER (WHERE d.outcome = 'rescheduled') AS move_ids,
           array_agg(d.slot) FILTER (WHERE d.outcome = 'rescheduled') AS move_slots,
           array_agg(d.took) FILTER (WHERE d.outcome = 'rescheduled') AS move_took,
           array_agg(d.id) FILTER (WHERE d.outcome NOT IN ('rescheduled', 'not_taken')) AS end_ids,
           array_agg(d.outcome) FILTER (WHERE d.outcome NOT IN ('rescheduled', 'not_taken')) AS end_outcomes,
           array_agg(CASE WHEN d.outcome = 'timeout' THEN coalesce(d.err, 'the job exceeded its timeout') ELSE d.err END)
               FILTER (WHERE d.outcome NOT IN ('rescheduled', 'not_taken')) AS end_errors,
           array_agg(d.took) FILTER (WHERE d.outcome NOT IN ('rescheduled', 'not_taken')) AS end_took
      INTO v
      FROM d;
    IF v.move_ids IS NOT NULL THEN
        UPDATE checks c
           SET next_check_at = m.slot, last_check_at = c.next_check_at, check_count = c.check_count + 1,
               last_took = m.took, total_took = c.total_took + coalesce(m.took, interval '0'),
               claim = NULL, claim_until = NULL, task_rn = NULL
          FROM unnest(v.move_ids, v.move_slots, v.move_took) AS m(id, slot, took)
         WHERE c.id = ANY(v.move_ids) AND c.id = m.id;
        IF pyscheduler._requests_pending() THEN
            -- added again while they ran: they are pending, so that changes nothing
            DELETE FROM check_requests r WHERE r.check_id = ANY(v.move_ids) AND r.delete_by IS NULL;
        END IF;
    END IF;
    IF v.end_ids IS NOT NULL THEN
        PERFORM pyscheduler._end_checks(v.end_ids, v.end_outcomes, v.end_errors, v.end_took, true, p_now);
    END IF;
    RETURN QUERY SELECT * FROM unnest(p_ids, v.outcomes, v.slots);
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.finish_checks(
    ids bigint[], next_check_ats timestamptz[] DEFAULT NULL, errors text[] DEFAULT NULL,
    timed_out boolean[] DEFAULT NULL, took interval[] DEFAULT NULL, claims uuid[] DEFAULT NULL)
RETURNS TABLE (id bigint, outcome text, next_check_at timestamptz)
LANGUAGE sql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* finish_checks(ids, next_check_ats => NULL, errors => NULL, timed_out => NULL,
                 took => NULL, claims => NULL) -> setof (id, outcome, next_check_at)
   Record the results of checks, in one statement. Element i of every array
   is about check ids[i]; an array left NULL is all NULL. Per check, in order:
   timed_out -> 'timeout'; an error text, or a next_check_at outside
   [1970-01-01, 9999-01-01) UTC -> 'error'; next_check_at NULL -> 'done';
   delete_checks asked for it while it ran -> 'deleted'; otherwise the check
   ran check_count + 1 times, and asking for more than max_checks runs ->
   'max_checks', a next_check_at not after now -> 'past', its slot
   (slot_round) beyond now + horizon -> 'horizon', else 'rescheduled':
   next_check_at = slot_round(next_check_at). Every outcome but
   'rescheduled' moves the check into check_history.
   Only checks the caller took count: locked by this transaction through
   due_checks / catch_up_checks (claims[i] NULL), or handed to a task whose
   spec carried claims[i]. Any other id (never taken, finished already,
   deleted, taken by another runner) changes nothing and comes back as
   'not_taken'. One row per element of ids, in order. Errors: PS408 arrays of
   different lengths. */
    SELECT * FROM pyscheduler._finish_checks(ids, next_check_ats, errors, timed_out, took, claims, clock_timestamp());
$$;
COMMENT ON FUNCTION pyscheduler.finish_checks(bigint[], timestamptz[], text[], boolean[], interval[], uuid[]) IS
    'Record check results in one statement: reschedule (guarded by max_checks, past, horizon) or end into history.';

CREATE OR REPLACE FUNCTION pyscheduler.finish_check(
    id bigint, next_check_at timestamptz DEFAULT NULL, error text DEFAULT NULL, timed_out boolean DEFAULT false,
    took interval DEFAULT NULL, claim uuid DEFAULT NULL, OUT outcome text, OUT slot timestamptz)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* finish_check(id, next_check_at => NULL, error => NULL, timed_out => false,
                took => NULL, claim => NULL) -> (outcome, slot)
   finish_checks for one check: the outcome and, when rescheduled, the slot
   of its next check. Errors: PS407 when the caller did not take the check
   (not locked by this transaction, wrong claim, or gone: finished, deleted). */
#variable_conflict use_column
BEGIN
    SELECT f.outcome, f.next_check_at INTO outcome, slot
      FROM pyscheduler._finish_checks(ARRAY[finish_check.id], ARRAY[finish_check.next_check_at], ARRAY[finish_check.error],
                          ARRAY[finish_check.timed_out], ARRAY[finish_check.took], ARRAY[finish_check.claim],
                          clock_timestamp()) f;
    IF outcome = 'not_taken' THEN
        RAISE EXCEPTION 'check % is not taken by the caller', coalesce(finish_check.id::text, 'NULL')
            USING ERRCODE = 'PS407',
                  HINT = 'Take it with due_checks or catch_up_checks in this transaction, or pass the claim of '
                         'its task; it may also have been finished or deleted already.';
    END IF;
END
$$;
COMMENT ON FUNCTION pyscheduler.finish_check(bigint, timestamptz, text, boolean, interval, uuid) IS
    'Record one check''s result (see finish_checks); PS407 when the caller did not take it.';

CREATE OR REPLACE FUNCTION pyscheduler.run_checks(ids bigint[])
RETURNS TABLE (id bigint, outcome text, next_check_at timestamptz)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* run_checks(ids) -> setof (id, outcome, next_check_at)
   run_check_jobs(ids) and finish_checks with its results, in one statement:
   the SQL-job checks among ids that this transaction took are run and
   recorded (rescheduled, or ended into check_history). One row per check
   run. Under a statement timeout a slow job cancels the whole statement:
   roll back and use run_check_jobs one check per statement to single it out
   (pyscheduler checks run does). */
#variable_conflict use_column
DECLARE
    v_ids bigint[];
    v_next timestamptz[];
    v_errors text[];
    v_took interval[];
BEGIN
    SELECT array_agg(j.id ORDER BY j.id), array_agg(j.next_check_at ORDER BY j.id),
           array_agg(j.error ORDER BY j.id), array_agg(j.took ORDER BY j.id)
      INTO v_ids, v_next, v_errors, v_took
      FROM pyscheduler.run_check_jobs(run_checks.ids) j;
    RETURN QUERY SELECT * FROM pyscheduler._finish_checks(v_ids, v_next, v_errors, NULL, v_took, NULL, clock_timestamp());
END
$$;
COMMENT ON FUNCTION pyscheduler.run_checks(bigint[]) IS
    'Run the SQL jobs of checks this transaction took and record their results (run_check_jobs + finish_checks).';


CREATE OR REPLACE FUNCTION pyscheduler._run_due_checks(
    p_slot timestamptz, p_shard integer, p_shards integer, p_max integer, p_after bigint, p_now timestamptz,
    OUT taken integer, OUT last_id bigint, OUT outcomes jsonb, OUT checks jsonb)
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_all future_check[];
    v_sql future_check[];
    v_res record;
    v_tasks record;
    v_rest integer;
BEGIN
    SELECT coalesce(array_agg(t ORDER BY t.next_check_at, t.id), '{}'), max(t.id)
      INTO v_all, last_id
      FROM pyscheduler._take_checks(p_slot, p_shard, p_shards, p_max, p_after, p_now) t;
    taken := cardinality(v_all);
    outcomes := '{}';
    v_rest := taken;
    IF pyscheduler._requests_pending() THEN
        v_all := pyscheduler._without_deleted(v_all, p_now);
    END IF;
    -- SQL jobs: run (one subtransaction per job, per check only if one raises) and record
    v_sql := ARRAY(SELECT r FROM unnest(v_all) r WHERE r.kind = 'sql');
    IF cardinality(v_sql) > 0 THEN
        SELECT array_agg(j.id) AS ids, array_agg(j.next_check_at) AS nxt, array_agg(j.error) AS err,
               array_agg(j.took) AS took
          INTO v_res FROM pyscheduler._run_sql_jobs(v_sql) j;
        SELECT coalesce(jsonb_object_agg(f.outcome, f.n), '{}') INTO outcomes
          FROM (SELECT f.outcome, count(*) AS n
                  FROM pyscheduler._finish_checks(v_res.ids, v_res.nxt, v_res.err, NULL, v_res.took, NULL, p_now) f
                 GROUP BY f.outcome) f;
        v_rest := v_rest - coalesce(cardinality(v_res.ids), 0);
    END IF;
    -- task and Python jobs, but not those the SQL jobs (or a client meanwhile) deleted
    IF pyscheduler._requests_pending() THEN
        v_all := pyscheduler._without_deleted(v_all, p_now);
    END IF;
    SELECT count(*) FILTER (WHERE s.task_rn IS NOT NULL) AS handed, count(*) FILTER (WHERE s.task_rn IS NULL) AS failed
      INTO v_tasks
      FROM pyscheduler._submit_check_tasks(ARRAY(SELECT r FROM unnest(v_all) r WHERE r.kind = 'task')) s;
    IF v_tasks.handed > 0 THEN
        outcomes := outcomes || jsonb_build_object('task', v_tasks.handed);
    END IF;
    IF v_tasks.failed > 0 THEN
        outcomes := outcomes || jsonb_build_object('error', coalesce((outcomes ->> 'error')::integer, 0) + v_tasks.failed);
    END IF;
    -- arrays, not objects: a third of the bytes to build, send and parse
    checks := (SELECT jsonb_agg(jsonb_build_array(r.id, r.entity_name, r.entity_key, r.job, r.kind, r.payload,
                                                  r.first_check_at, r.next_check_at, r.check_count, r.max_checks,
                                                  r.created, r.owner))
                 FROM unnest(v_all) r WHERE r.kind = 'python');
    v_rest := v_rest - v_tasks.handed - v_tasks.failed - coalesce(jsonb_array_length(checks), 0);
    IF v_rest > 0 THEN
        outcomes := outcomes || jsonb_build_object('deleted', v_rest);
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.run_due_checks(
    slot timestamptz DEFAULT NULL, shard integer DEFAULT 0, shards integer DEFAULT 1, max integer DEFAULT 1000,
    after bigint DEFAULT NULL, OUT taken integer, OUT last_id bigint, OUT outcomes jsonb, OUT checks jsonb)
LANGUAGE sql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* run_due_checks(slot => NULL, shard => 0, shards => 1, max => 1000, after => NULL)
     -> (taken, last_id, outcomes, checks)
   A runner's batch in one statement: take up to max checks like due_checks
   (slot given: exactly that slot, only ids > after when after is given) or
   catch_up_checks (slot NULL), then run their SQL jobs and record the
   results (run_check_jobs + finish_checks) and hand their task jobs to
   task queues (submit_check_tasks). Returns how many checks were taken, the
   largest id taken (the next batch's after), the in-database outcomes as
   {"done": n, "error": n, "task": n, "deleted": n, ...} and the Python-job
   checks as a jsonb array with one array per check, of the future_check
   fields in their order (id, entity_name, ..., created, owner; NULL when
   none): locked by
   this transaction, for the caller to run and record with finish_checks
   before COMMIT. Under a statement timeout a slow SQL job cancels the whole
   statement: roll back and take the batch again with due_checks and
   run_check_jobs one check per statement (pyscheduler checks run does).
   A check deleted meanwhile (delete_checks, also by a job of this batch) is
   ended as deleted without running and counted as "deleted".
   after: a runner skips the part of the slot it already ran (dead index
   entries until VACUUM); a check another runner held meanwhile can sit
   below after, so end a slot with a call without after.
   Errors: PS404, PS405, PS406. */
    SELECT * FROM pyscheduler._run_due_checks(slot, shard, shards, max, after, clock_timestamp());
$$;
COMMENT ON FUNCTION pyscheduler.run_due_checks(timestamptz, integer, integer, integer, bigint) IS
    'A runner''s batch in one statement: take (slot or catch-up), run SQL jobs, hand task jobs, return Python ones.';


CREATE OR REPLACE FUNCTION pyscheduler.end_deleted_checks(ids bigint[])
RETURNS SETOF bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* end_deleted_checks(ids) -> setof bigint
   For a runner between its Python handlers: of the checks among ids that
   this transaction took, those delete_checks asked to delete since are
   ended here as 'deleted' (check_count unchanged); returns their ids, which
   the runner then does not run. Other ids are ignored. */
DECLARE
    v_held future_check[] := pyscheduler._held_checks(ids, NULL);
    v_kept bigint[];
BEGIN
    v_kept := ARRAY(SELECT r.id FROM unnest(pyscheduler._without_deleted(v_held, clock_timestamp())) r);
    RETURN QUERY SELECT h.id FROM unnest(v_held) h WHERE h.id <> ALL(v_kept);
END
$$;
COMMENT ON FUNCTION pyscheduler.end_deleted_checks(bigint[]) IS
    'End, as deleted, the checks this transaction took that delete_checks asked to delete since; returns their ids.';

-- _check_filters(entity_name, entity_key, max): the filters of list_checks and check_history
-- (PS406 max; PS401 an entity_key without a valid entity_name).
CREATE OR REPLACE FUNCTION pyscheduler._check_filters(p_name text, p_key text, p_max integer)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    PERFORM pyscheduler._check_positive('max', p_max >= 1, p_max::text);
    IF p_key IS NOT NULL THEN
        PERFORM pyscheduler._check_entity(p_name, p_key);
    END IF;
END
$$;

-- _check_cursor(name, at, id): PS408 unless a keyset cursor is both halves or none.
CREATE OR REPLACE FUNCTION pyscheduler._check_cursor(p_name text, p_at timestamptz, p_id bigint)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    IF (p_at IS NULL) <> (p_id IS NULL) THEN
        RAISE EXCEPTION 'give both %_at and %_id (the last row''s), or neither', p_name, p_name
            USING ERRCODE = 'PS408', HINT = 'The next page starts after the last row of this one.';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.list_checks(
    entity_name text DEFAULT NULL, entity_key text DEFAULT NULL, job text DEFAULT NULL, max integer DEFAULT 100,
    after_at timestamptz DEFAULT NULL, after_id bigint DEFAULT NULL)
RETURNS SETOF pyscheduler.future_check
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
-- a page walks checks_due_idx from the cursor on and stops at max, or reads one entity's
-- checks (checks_entity_job_key): never the whole table
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_indexscan = on
AS $$
/* list_checks(entity_name => NULL, entity_key => NULL, job => NULL, max => 100,
               after_at => NULL, after_id => NULL) -> setof check
   Pending checks matching every filter given (NULL = any), soonest first
   (next_check_at, then id), at most max (a check handed to a task job is
   listed with the slot it ran in; one a client asked to delete while a
   runner held it is left out). The payload of a check the caller may not act
   on (another role's) is NULL. Keyset pagination: pass the last row's
   next_check_at and id as after_at and after_id to get the next page. A walk
   returns every check that stays pending once, even while others are added (a
   check that runs and is rescheduled meanwhile moves to its new slot). With
   entity_key, a page reads that entity's checks; otherwise the checks from
   the cursor on in order, the other filters checked on the way (a filter that
   matches few of many checks reads the ones it skips). Errors: PS401 (an
   entity_key without entity_name), PS406 max, PS408 half a cursor. */
#variable_conflict use_column
DECLARE
    v_at timestamptz := coalesce(list_checks.after_at, '-infinity');
    v_id bigint := coalesce(list_checks.after_id, 0);
BEGIN
    PERFORM pyscheduler._check_filters(list_checks.entity_name, list_checks.entity_key, list_checks.max);
    PERFORM pyscheduler._check_cursor('after', list_checks.after_at, list_checks.after_id);
    IF list_checks.entity_key IS NOT NULL THEN
        RETURN QUERY
        SELECT c.id, c.entity_name, c.entity_key, c.job, c.kind,
               CASE WHEN pyscheduler._may_act(c.owner) THEN c.payload END, c.first_check_at, c.next_check_at,
               c.check_count, c.max_checks, c.created, c.owner
          FROM checks c
         WHERE c.entity_name = list_checks.entity_name AND c.entity_key = list_checks.entity_key
           AND (list_checks.job IS NULL OR c.job = list_checks.job)
           AND (c.next_check_at, c.id) > (v_at, v_id)
           AND NOT EXISTS (SELECT 1 FROM check_requests r WHERE r.check_id = c.id AND r.delete_by IS NOT NULL)
         ORDER BY c.next_check_at, c.id
         LIMIT list_checks.max;
        RETURN;
    END IF;
    RETURN QUERY
    SELECT c.id, c.entity_name, c.entity_key, c.job, c.kind,
           CASE WHEN pyscheduler._may_act(c.owner) THEN c.payload END, c.first_check_at, c.next_check_at,
           c.check_count, c.max_checks, c.created, c.owner
      FROM checks c
     WHERE (c.next_check_at, c.id) > (v_at, v_id)
       AND (list_checks.entity_name IS NULL OR c.entity_name = list_checks.entity_name)
       AND (list_checks.job IS NULL OR c.job = list_checks.job)
       AND NOT EXISTS (SELECT 1 FROM check_requests r WHERE r.check_id = c.id AND r.delete_by IS NOT NULL)
     ORDER BY c.next_check_at, c.id
     LIMIT list_checks.max;
END
$$;
COMMENT ON FUNCTION pyscheduler.list_checks(text, text, text, integer, timestamptz, bigint) IS
    'Pending checks matching the filters given, soonest first (another role''s without their payload); a page '
    'from (after_at, after_id) on (keyset).';

CREATE OR REPLACE FUNCTION pyscheduler.check_history(
    entity_name text DEFAULT NULL, entity_key text DEFAULT NULL, job text DEFAULT NULL, max integer DEFAULT 100,
    before_at timestamptz DEFAULT NULL, before_id bigint DEFAULT NULL)
RETURNS SETOF pyscheduler.ended_check
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
-- a page walks check_history_ended_idx backwards from the cursor and stops at max, or reads
-- one entity's history (check_history_entity_idx): never the whole table
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_indexscan = on
AS $$
/* check_history(entity_name => NULL, entity_key => NULL, job => NULL, max => 100,
                 before_at => NULL, before_id => NULL) -> setof ended check
   Checks that left: outcome done, max_checks, horizon, past, timeout, error
   (with the error text) or deleted; time taken by the last run and in
   total; the role that added it. The payload and error of a check the
   caller may not act on (another role's) are NULL. Newest first (ended, then
   id), at most max; kept for history_retention (purge_check_history).
   Keyset pagination: pass the last row's ended and id as before_at and
   before_id to get the next (older) page. With entity_key, a page reads that
   entity's history; otherwise the history from the cursor back, the other
   filters checked on the way. Errors: PS401, PS406 max, PS408 half a cursor. */
#variable_conflict use_column
DECLARE
    v_at timestamptz := coalesce(check_history.before_at, 'infinity');
    v_id bigint := coalesce(check_history.before_id, 9223372036854775807);
BEGIN
    PERFORM pyscheduler._check_filters(check_history.entity_name, check_history.entity_key, check_history.max);
    PERFORM pyscheduler._check_cursor('before', check_history.before_at, check_history.before_id);
    IF check_history.entity_key IS NOT NULL THEN
        RETURN QUERY
        SELECT h.id, h.entity_name, h.entity_key, h.job, h.kind, CASE WHEN v.may THEN h.payload END, h.first_check_at,
               h.last_check_at, h.check_count, h.outcome, CASE WHEN v.may THEN h.error END, h.last_took, h.total_took,
               h.created, h.ended, h.owner
          FROM pyscheduler.check_history h, LATERAL (SELECT pyscheduler._may_act(h.owner) AS may) v
         WHERE h.entity_name = check_history.entity_name AND h.entity_key = check_history.entity_key
           AND (check_history.job IS NULL OR h.job = check_history.job)
           AND (h.ended, h.id) < (v_at, v_id)
         ORDER BY h.ended DESC, h.id DESC
         LIMIT check_history.max;
        RETURN;
    END IF;
    RETURN QUERY
    SELECT h.id, h.entity_name, h.entity_key, h.job, h.kind, CASE WHEN v.may THEN h.payload END, h.first_check_at,
           h.last_check_at, h.check_count, h.outcome, CASE WHEN v.may THEN h.error END, h.last_took, h.total_took,
           h.created, h.ended, h.owner
      FROM (SELECT h.* FROM pyscheduler.check_history h
             WHERE (h.ended, h.id) < (v_at, v_id)
               AND (check_history.entity_name IS NULL OR h.entity_name = check_history.entity_name)
               AND (check_history.job IS NULL OR h.job = check_history.job)
             ORDER BY h.ended DESC, h.id DESC
             LIMIT check_history.max) h,
           LATERAL (SELECT pyscheduler._may_act(h.owner) AS may) v
     ORDER BY h.ended DESC, h.id DESC;
END
$$;
COMMENT ON FUNCTION pyscheduler.check_history(text, text, text, integer, timestamptz, bigint) IS
    'Ended checks (outcome, error, times taken) matching the filters given, newest first (another role''s without '
    'payload and error); a page from (before_at, before_id) back (keyset).';

-- _purge_check_history(batch, now): purge_check_history with the clock as a parameter (tests).
CREATE OR REPLACE FUNCTION pyscheduler._purge_check_history(p_batch integer, p_now timestamptz)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    v_n bigint;
BEGIN
    IF p_batch IS NULL OR p_batch NOT BETWEEN 1 AND 1000000 THEN
        RAISE EXCEPTION 'batch must be in 1..1000000, got %', coalesce(p_batch::text, 'NULL') USING ERRCODE = 'PS408';
    END IF;
    -- oldest first on check_history_ended_idx; SKIP LOCKED: runners purging at once never wait
    DELETE FROM check_history h
     WHERE h.ctid = ANY(ARRAY(
        SELECT x.ctid FROM check_history x
         WHERE x.ended < p_now - pyscheduler._setting('checks_history_retention')::interval
         ORDER BY x.ended LIMIT p_batch
           FOR UPDATE SKIP LOCKED));
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.purge_check_history(batch integer DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* purge_check_history(batch => 10000) -> bigint
   Delete up to batch checks that ended longer than history_retention ago
   (set_check_settings, default 30 days) from check_history, oldest first;
   returns how many. The runners call it while it returns batch (pyscheduler
   checks run --purge-interval). Errors: PS408 batch outside 1..1000000. */
BEGIN
    RETURN pyscheduler._purge_check_history(batch, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.purge_check_history(integer) IS
    'Delete a batch of ended checks older than history_retention from check_history; returns how many.';

-- Views (psql). The current slot is computed from the setting in a private view: a view
-- calls functions with the reader's privileges, and the roles have none on the private
-- helpers, while a view used by a view is read with its owner's.
CREATE OR REPLACE VIEW pyscheduler._current_check_slot AS
    SELECT timestamptz 'epoch' + (floor(extract(epoch FROM now()) * 1000000 / r.us)::bigint * r.us)
                                 * interval '1 microsecond' AS slot
      FROM (SELECT (extract(epoch FROM s.value::interval) * 1000000)::bigint AS us
              FROM pyscheduler.settings s WHERE s.name = 'checks_resolution') r;

-- ---------------------------------------------------------------- counts
--
-- checks_per_slot and check_outcomes count from tables kept by triggers, not from the checks
-- and their history (design.md: a read path never scans a table). Statement triggers with
-- transition tables: every writer is counted, whatever the path (a runner's batch, a client,
-- an operator's UPDATE), for one INSERT of a few aggregated rows per statement (measured
-- within noise of the runner's cycle and of add_check). The rows are deltas, appended
-- (appends never wait for each other: a counter row per slot would make every client adding
-- a check to the coming slot wait for the others to commit); one writing statement in 50 folds
-- them (_fold_check_counts), dropping what no reader needs any more: slots before the current
-- one (checks_per_slot shows the current one on) and hours before yesterday's
-- (check_outcomes covers the last day).

-- _check_slot_counts: pending checks no task job holds (claim IS NULL), per slot and kind.
CREATE OR REPLACE FUNCTION pyscheduler._checks_inserted()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    INSERT INTO _check_slot_counts (slot, kind, n)
    SELECT c.next_check_at, c.kind, count(*) FROM new_checks c WHERE c.claim IS NULL GROUP BY 1, 2;
    IF random() < 0.02 THEN
        PERFORM _fold_check_counts();
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler._checks_deleted()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    INSERT INTO _check_slot_counts (slot, kind, n)
    SELECT c.next_check_at, c.kind, -count(*) FROM old_checks c WHERE c.claim IS NULL GROUP BY 1, 2;
    IF random() < 0.02 THEN
        PERFORM _fold_check_counts();
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler._checks_updated()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    INSERT INTO _check_slot_counts (slot, kind, n)
    SELECT x.slot, x.kind, sum(x.n)
      FROM (SELECT c.next_check_at AS slot, c.kind, -1 AS n FROM old_checks c WHERE c.claim IS NULL
            UNION ALL
            SELECT c.next_check_at, c.kind, 1 FROM new_checks c WHERE c.claim IS NULL) x
     GROUP BY 1, 2
    HAVING sum(x.n) <> 0;
    IF random() < 0.02 THEN
        PERFORM _fold_check_counts();
    END IF;
    RETURN NULL;
END
$$;

-- _check_outcome_counts: per hour of ended, job and outcome: how many, the sum and number of
-- last_took (for the average), the largest last_took, the sum of check_count. A purge
-- subtracts what it deletes (the largest stays: only a history_retention under a day purges
-- rows check_outcomes still covers).
CREATE OR REPLACE FUNCTION pyscheduler._history_inserted()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    INSERT INTO _check_outcome_counts (hour, job, outcome, n, n_took, sum_took, max_took, sum_runs)
    SELECT date_trunc('hour', h.ended), h.job, h.outcome, count(*), count(h.last_took), sum(h.last_took),
           max(h.last_took), sum(h.check_count)
      FROM new_history h GROUP BY 1, 2, 3;
    IF random() < 0.02 THEN
        PERFORM _fold_check_counts();
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler._history_deleted()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    INSERT INTO _check_outcome_counts (hour, job, outcome, n, n_took, sum_took, max_took, sum_runs)
    SELECT date_trunc('hour', h.ended), h.job, h.outcome, -count(*), -count(h.last_took), -sum(h.last_took),
           NULL, -sum(h.check_count)
      FROM old_history h
     WHERE h.ended >= date_trunc('hour', now() - interval '1 day')  -- older hours are not kept
     GROUP BY 1, 2, 3;
    RETURN NULL;
END
$$;

-- (pyscheduler never updates the history; an operator may)
CREATE OR REPLACE FUNCTION pyscheduler._history_updated()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    INSERT INTO _check_outcome_counts (hour, job, outcome, n, n_took, sum_took, max_took, sum_runs)
    SELECT x.hour, x.job, x.outcome, sum(x.n), sum(x.n_took), sum(x.sum_took), max(x.max_took), sum(x.sum_runs)
      FROM (SELECT date_trunc('hour', h.ended) AS hour, h.job, h.outcome, -1 AS n, -(h.last_took IS NOT NULL)::int AS n_took,
                   -h.last_took AS sum_took, NULL::interval AS max_took, -h.check_count AS sum_runs
              FROM old_history h WHERE h.ended >= date_trunc('hour', now() - interval '1 day')
            UNION ALL
            SELECT date_trunc('hour', h.ended), h.job, h.outcome, 1, (h.last_took IS NOT NULL)::int, h.last_took,
                   h.last_took, h.check_count
              FROM new_history h WHERE h.ended >= date_trunc('hour', now() - interval '1 day')) x
     GROUP BY 1, 2, 3;
    RETURN NULL;
END
$$;

-- _fold_check_counts(): replace the deltas no other transaction is folding by their sums,
-- without the slots and hours no reader needs any more.
CREATE OR REPLACE FUNCTION pyscheduler._fold_check_counts()
RETURNS void
LANGUAGE sql
SET search_path = pyscheduler, pg_temp
AS $$
    WITH gone AS (
        DELETE FROM pyscheduler._check_slot_counts c
         WHERE c.ctid = ANY (ARRAY(SELECT x.ctid FROM pyscheduler._check_slot_counts x FOR UPDATE SKIP LOCKED))
        RETURNING c.*)
    INSERT INTO pyscheduler._check_slot_counts (slot, kind, n)
    SELECT g.slot, g.kind, sum(g.n) FROM gone g, pyscheduler._current_check_slot cur
     WHERE g.slot >= cur.slot
     GROUP BY 1, 2 HAVING sum(g.n) <> 0;
    WITH gone AS (
        DELETE FROM pyscheduler._check_outcome_counts c
         WHERE c.ctid = ANY (ARRAY(SELECT x.ctid FROM pyscheduler._check_outcome_counts x FOR UPDATE SKIP LOCKED))
        RETURNING c.*)
    INSERT INTO pyscheduler._check_outcome_counts (hour, job, outcome, n, n_took, sum_took, max_took, sum_runs)
    SELECT g.hour, g.job, g.outcome, sum(g.n), sum(g.n_took), sum(g.sum_took), max(g.max_took), sum(g.sum_runs)
      FROM gone g
     WHERE g.hour >= date_trunc('hour', now() - interval '1 day')
     GROUP BY 1, 2, 3 HAVING sum(g.n) <> 0;
$$;

-- _check_count_all(): the counts from the tables themselves, once (a database from before
-- migration 0018, or after rows were written with the triggers disabled: delete the setting
-- 'checks_counted' and run pyscheduler migrate). Writers wait while it counts (SHARE locks).
CREATE OR REPLACE FUNCTION pyscheduler._check_count_all()
RETURNS void
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    LOCK TABLE pyscheduler.checks, pyscheduler.check_history IN SHARE MODE;
    DELETE FROM _check_slot_counts;
    INSERT INTO _check_slot_counts (slot, kind, n)
    SELECT c.next_check_at, c.kind, count(*) FROM checks c, _current_check_slot cur
     WHERE c.claim IS NULL AND c.next_check_at >= cur.slot GROUP BY 1, 2;
    DELETE FROM _check_outcome_counts;
    INSERT INTO _check_outcome_counts (hour, job, outcome, n, n_took, sum_took, max_took, sum_runs)
    SELECT date_trunc('hour', h.ended), h.job, h.outcome, count(*), count(h.last_took), sum(h.last_took),
           max(h.last_took), sum(h.check_count)
      FROM check_history h WHERE h.ended >= date_trunc('hour', now() - interval '1 day') GROUP BY 1, 2, 3;
    INSERT INTO settings (name, value) VALUES ('checks_counted', now()::text)
    ON CONFLICT (name) DO UPDATE SET value = excluded.value;
END
$$;

CREATE OR REPLACE TRIGGER checks_inserted AFTER INSERT ON pyscheduler.checks
    REFERENCING NEW TABLE AS new_checks FOR EACH STATEMENT EXECUTE FUNCTION pyscheduler._checks_inserted();
CREATE OR REPLACE TRIGGER checks_updated AFTER UPDATE ON pyscheduler.checks
    REFERENCING OLD TABLE AS old_checks NEW TABLE AS new_checks
    FOR EACH STATEMENT EXECUTE FUNCTION pyscheduler._checks_updated();
CREATE OR REPLACE TRIGGER checks_deleted AFTER DELETE ON pyscheduler.checks
    REFERENCING OLD TABLE AS old_checks FOR EACH STATEMENT EXECUTE FUNCTION pyscheduler._checks_deleted();
CREATE OR REPLACE TRIGGER history_inserted AFTER INSERT ON pyscheduler.check_history
    REFERENCING NEW TABLE AS new_history FOR EACH STATEMENT EXECUTE FUNCTION pyscheduler._history_inserted();
CREATE OR REPLACE TRIGGER history_updated AFTER UPDATE ON pyscheduler.check_history
    REFERENCING OLD TABLE AS old_history NEW TABLE AS new_history
    FOR EACH STATEMENT EXECUTE FUNCTION pyscheduler._history_updated();
CREATE OR REPLACE TRIGGER history_deleted AFTER DELETE ON pyscheduler.check_history
    REFERENCING OLD TABLE AS old_history FOR EACH STATEMENT EXECUTE FUNCTION pyscheduler._history_deleted();
-- TRUNCATE (an operator emptying a table): the counts go with the rows
CREATE OR REPLACE FUNCTION pyscheduler._checks_truncated()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    IF TG_TABLE_NAME = 'checks' THEN
        DELETE FROM _check_slot_counts;
    ELSE
        DELETE FROM _check_outcome_counts;
    END IF;
    RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER checks_truncated AFTER TRUNCATE ON pyscheduler.checks
    FOR EACH STATEMENT EXECUTE FUNCTION pyscheduler._checks_truncated();
CREATE OR REPLACE TRIGGER history_truncated AFTER TRUNCATE ON pyscheduler.check_history
    FOR EACH STATEMENT EXECUTE FUNCTION pyscheduler._checks_truncated();
-- in the transaction that creates the triggers (the post-apply step of migrate)
DO $count$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pyscheduler.settings WHERE name = 'checks_counted') THEN
        PERFORM pyscheduler._check_count_all();
    END IF;
END
$count$;

-- Views (psql). None reads more than the rows it shows: the counts above, or a walk of an index
-- in the view's order (a LIMIT stops it).
CREATE OR REPLACE VIEW pyscheduler.checks_per_slot AS
    SELECT c.slot, sum(c.n)::bigint AS checks,
           coalesce(sum(c.n) FILTER (WHERE c.kind = 'sql'), 0)::bigint AS sql_jobs,
           coalesce(sum(c.n) FILTER (WHERE c.kind = 'python'), 0)::bigint AS python_jobs,
           coalesce(sum(c.n) FILTER (WHERE c.kind = 'task'), 0)::bigint AS task_jobs
      FROM pyscheduler._check_slot_counts c, pyscheduler._current_check_slot cur
     WHERE c.slot >= cur.slot
     GROUP BY c.slot
    HAVING sum(c.n) > 0
     ORDER BY c.slot;
COMMENT ON VIEW pyscheduler.checks_per_slot IS
    'Pending checks per upcoming slot (the current one included), by job kind, soonest first (kept counts).';

-- overdue_checks: one walk of checks_due_idx from its start, in the view's order (a LIMIT stops
-- it); the bound is a scalar subquery, so it is an index condition.
CREATE OR REPLACE VIEW pyscheduler.overdue_checks AS
    SELECT c.id, c.entity_name, c.entity_key, c.job, c.kind, c.next_check_at, now() - c.next_check_at AS overdue,
           CASE WHEN c.claim IS NULL THEN 'missed slot' ELSE 'task late' END AS why
      FROM pyscheduler.checks c
     WHERE c.next_check_at < (SELECT cur.slot FROM pyscheduler._current_check_slot cur)
       AND (c.claim IS NULL OR c.claim_until < now())
     ORDER BY c.next_check_at, c.id;
COMMENT ON VIEW pyscheduler.overdue_checks IS
    'Checks of slots already past (runners down or behind) and task jobs past their task_timeout, oldest first.';

CREATE OR REPLACE VIEW pyscheduler.check_outcomes AS
    SELECT c.job, c.outcome, sum(c.n)::bigint AS checks,
           sum(c.sum_took) / nullif(sum(c.n_took), 0)::float8 AS avg_last_took,
           max(c.max_took) AS max_last_took, (sum(c.sum_runs)::numeric / sum(c.n))::numeric(10, 2) AS avg_runs
      FROM pyscheduler._check_outcome_counts c
     WHERE c.hour >= date_trunc('hour', now() - interval '1 day')
     GROUP BY c.job, c.outcome
    HAVING sum(c.n) > 0;
COMMENT ON VIEW pyscheduler.check_outcomes IS
    'History outcomes per job over the last day, in whole hours (kept counts).';

SELECT pyscheduler._grant('client', 'add_check', 'delete_checks', 'list_checks', 'check_history', 'slot_round',
                          'check_slots', 'checks_per_slot', 'overdue_checks', 'check_outcomes');
SELECT pyscheduler._grant('checker', 'run_due_checks', 'due_checks', 'catch_up_checks', 'run_check_jobs', 'run_checks',
                          'submit_check_tasks', 'finish_check', 'finish_checks', 'end_deleted_checks',
                          'purge_check_history', 'slot_round', 'check_slots');
SELECT pyscheduler._grant('worker', 'finish_check', 'finish_checks');
SELECT pyscheduler._grant('monitor', 'list_checks', 'check_history', 'slot_round', 'check_slots',
                          'checks_per_slot', 'overdue_checks', 'check_outcomes');
SELECT pyscheduler._grant('admin', 'set_check_settings');
