-- pyscheduler: future checks, the runner's functions (checker role): take a slot's checks, run their SQL jobs or hand them to Python or tasks, finish them.
-- The overview (slots, SQLSTATEs) is at the top of 1_slots.sql; the files of sql/checks/
-- load in name order on every migrate.

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
LANGUAGE plpgsql
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
BEGIN
    RETURN QUERY
        SELECT * FROM pyscheduler._take_undeleted(NULL, shard, shards, max, clock_timestamp());
END
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
LANGUAGE plpgsql
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
BEGIN
    RETURN QUERY
        SELECT * FROM pyscheduler._run_sql_jobs(pyscheduler._held_checks(ids, 'sql'));
END
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
LANGUAGE plpgsql
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
BEGIN
    RETURN QUERY
        SELECT * FROM pyscheduler._submit_check_tasks(pyscheduler._held_checks(ids, 'task'));
END
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
    ids bigint[], next_check_ats timestamptz[] DEFAULT NULL, errors pyscheduler.check_error[] DEFAULT NULL,
    timed_out boolean[] DEFAULT NULL, took interval[] DEFAULT NULL, claims uuid[] DEFAULT NULL)
RETURNS TABLE (id bigint, outcome text, next_check_at timestamptz)
LANGUAGE plpgsql
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
BEGIN
    RETURN QUERY
        SELECT * FROM pyscheduler._finish_checks(ids, next_check_ats, errors, timed_out, took, claims, clock_timestamp());
END
$$;
COMMENT ON FUNCTION pyscheduler.finish_checks(bigint[], timestamptz[], pyscheduler.check_error[], boolean[],
    interval[], uuid[]) IS
    'Record check results in one statement: reschedule (guarded by max_checks, past, horizon) or end into history.';

CREATE OR REPLACE FUNCTION pyscheduler.finish_check(
    id bigint, next_check_at timestamptz DEFAULT NULL, error pyscheduler.check_error DEFAULT NULL,
    timed_out boolean DEFAULT false, took interval DEFAULT NULL, claim uuid DEFAULT NULL, OUT outcome text,
    OUT slot timestamptz)
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
COMMENT ON FUNCTION pyscheduler.finish_check(bigint, timestamptz, pyscheduler.check_error, boolean, interval, uuid) IS
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
    OUT taken integer, OUT last_id bigint, OUT outcomes jsonb, OUT checks jsonb, OUT job_outcomes jsonb)
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_taken future_check[];
    v_all future_check[];
    v_sql future_check[];
    v_res record;
    v_ids bigint[] := '{}';  -- the checks ended or moved in here, and each one's outcome
    v_outs text[] := '{}';
    v_python bigint[];
BEGIN
    SELECT coalesce(array_agg(t ORDER BY t.next_check_at, t.id), '{}'), max(t.id)
      INTO v_taken, last_id
      FROM pyscheduler._take_checks(p_slot, p_shard, p_shards, p_max, p_after, p_now) t;
    taken := cardinality(v_taken);
    v_all := v_taken;
    IF pyscheduler._requests_pending() THEN
        v_all := pyscheduler._without_deleted(v_all, p_now);
    END IF;
    -- SQL jobs: run (one subtransaction per job, per check only if one raises) and record
    v_sql := ARRAY(SELECT r FROM unnest(v_all) r WHERE r.kind = 'sql');
    IF cardinality(v_sql) > 0 THEN
        SELECT array_agg(j.id) AS ids, array_agg(j.next_check_at) AS nxt, array_agg(j.error) AS err,
               array_agg(j.took) AS took
          INTO v_res FROM pyscheduler._run_sql_jobs(v_sql) j;
        SELECT coalesce(array_agg(f.id), '{}'), coalesce(array_agg(f.outcome), '{}') INTO v_ids, v_outs
          FROM pyscheduler._finish_checks(v_res.ids, v_res.nxt, v_res.err, NULL, v_res.took, NULL, p_now) f;
    END IF;
    -- task and Python jobs, but not those the SQL jobs (or a client meanwhile) deleted
    IF pyscheduler._requests_pending() THEN
        v_all := pyscheduler._without_deleted(v_all, p_now);
    END IF;
    SELECT v_ids || coalesce(array_agg(s.id), '{}'),
           v_outs || coalesce(array_agg(CASE WHEN s.task_rn IS NULL THEN 'error' ELSE 'task' END), '{}')
      INTO v_ids, v_outs
      FROM pyscheduler._submit_check_tasks(ARRAY(SELECT r FROM unnest(v_all) r WHERE r.kind = 'task')) s;
    -- arrays, not objects: a third of the bytes to build, send and parse
    checks := (SELECT jsonb_agg(jsonb_build_array(r.id, r.entity_name, r.entity_key, r.job, r.kind, r.payload,
                                                  r.first_check_at, r.next_check_at, r.check_count, r.max_checks,
                                                  r.created, r.owner))
                 FROM unnest(v_all) r WHERE r.kind = 'python');
    v_python := ARRAY(SELECT r.id FROM unnest(v_all) r WHERE r.kind = 'python');
    -- the outcomes, in all and per job: a taken check neither recorded here nor returned to run
    -- in Python was deleted meanwhile (ended as deleted by _without_deleted)
    WITH o AS (
        SELECT t.job, coalesce(d.outcome, 'deleted') AS outcome, count(*) AS n
          FROM unnest(v_taken) t LEFT JOIN unnest(v_ids, v_outs) AS d(id, outcome) ON d.id = t.id
         WHERE d.id IS NOT NULL OR t.kind <> 'python' OR NOT t.id = ANY(v_python)
         GROUP BY 1, 2)
    SELECT coalesce((SELECT jsonb_object_agg(a.outcome, a.n)
                       FROM (SELECT o.outcome, sum(o.n)::bigint AS n FROM o GROUP BY 1) a), '{}'),
           coalesce((SELECT jsonb_object_agg(j.job, j.by_outcome)
                       FROM (SELECT o.job, jsonb_object_agg(o.outcome, o.n) AS by_outcome FROM o GROUP BY 1) j), '{}')
      INTO outcomes, job_outcomes;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.run_due_checks(
    slot timestamptz DEFAULT NULL, shard integer DEFAULT 0, shards integer DEFAULT 1, max integer DEFAULT 1000,
    after bigint DEFAULT NULL, OUT taken integer, OUT last_id bigint, OUT outcomes jsonb, OUT checks jsonb,
    OUT job_outcomes jsonb)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* run_due_checks(slot => NULL, shard => 0, shards => 1, max => 1000, after => NULL)
     -> (taken, last_id, outcomes, checks, job_outcomes)
   A runner's batch in one statement: take up to max checks like due_checks
   (slot given: exactly that slot, only ids > after when after is given) or
   catch_up_checks (slot NULL), then run their SQL jobs and record the
   results (run_check_jobs + finish_checks) and hand their task jobs to
   task queues (submit_check_tasks). Returns how many checks were taken, the
   largest id taken (the next batch's after), the in-database outcomes as
   {"done": n, "error": n, "task": n, "deleted": n, ...}, the same per job as
   job_outcomes {"job": {"done": n, ...}, ...}, and the Python-job
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
BEGIN
    SELECT * INTO taken, last_id, outcomes, checks, job_outcomes
      FROM pyscheduler._run_due_checks(slot, shard, shards, max, after, clock_timestamp());
END
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
