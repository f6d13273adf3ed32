-- pyscheduler: future checks, the client API: checks of values, add_check, delete_checks and the requests made while a check is held.
-- The overview (slots, SQLSTATEs) is at the top of 1_slots.sql; the files of sql/checks/
-- load in name order on every migrate.

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

-- _check_entity_ref(name, key): PS401 unless an entity looked up (delete_checks, list_checks,
-- check_history) is named: a name and, where given, a key that are not empty (their size is
-- the domain entity_ref's; an entity named before the input rule stays reachable).
CREATE OR REPLACE FUNCTION pyscheduler._check_entity_ref(p_name text, p_key text, p_key_needed boolean DEFAULT true)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    IF p_name IS NULL OR p_name = '' THEN
        RAISE EXCEPTION 'entity_name must not be empty'
            USING ERRCODE = 'PS401', HINT = 'The entity''s table or type, e.g. ''order''.';
    END IF;
    IF (p_key_needed OR p_key IS NOT NULL) AND (p_key IS NULL OR p_key = '') THEN
        RAISE EXCEPTION 'entity_key must not be empty'
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
    entity_name pyscheduler.entity_name, entity_key pyscheduler.entity_key, job pyscheduler.job_name,
    check_at timestamptz DEFAULT NULL, check_after interval DEFAULT NULL,
    payload pyscheduler.check_payload DEFAULT NULL, kind pyscheduler.check_kind DEFAULT 'sql',
    max_checks integer DEFAULT NULL, horizon interval DEFAULT NULL)
RETURNS TABLE (id bigint, next_check_at timestamptz, added boolean)
LANGUAGE plpgsql
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
BEGIN
    RETURN QUERY
        SELECT * FROM pyscheduler._add_check(entity_name, entity_key, job, kind, check_at, check_after, payload,
                                             max_checks, horizon, clock_timestamp());
END
$$;
COMMENT ON FUNCTION pyscheduler.add_check(pyscheduler.entity_name, pyscheduler.entity_key, pyscheduler.job_name,
    timestamptz, interval, pyscheduler.check_payload, pyscheduler.check_kind, integer, interval) IS
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

CREATE OR REPLACE FUNCTION pyscheduler.delete_checks(
    entity_name pyscheduler.entity_ref, entity_key pyscheduler.entity_ref, job pyscheduler.job_name DEFAULT NULL)
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
    PERFORM pyscheduler._check_entity_ref(delete_checks.entity_name, delete_checks.entity_key);
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
COMMENT ON FUNCTION pyscheduler.delete_checks(pyscheduler.entity_ref, pyscheduler.entity_ref, pyscheduler.job_name) IS
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
