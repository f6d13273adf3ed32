-- pyscheduler: recurring schedules, the daemons' functions (scheduler role): the index relay, firing, recording, degraded mode, resync, cleanup.
-- The overview (SQLSTATEs, notifications, hardening) is at the top of 1_cron.sql; the
-- files of sql/schedules/ load in name order on every migrate.

-- ---------------------------------------------------------------- daemons (scheduler role)

CREATE OR REPLACE FUNCTION pyscheduler.index_entries(ids bigint[])
RETURNS TABLE (id bigint, next_run_at timestamptz, critical boolean, active boolean, updated timestamptz)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
    /* index_entries(ids) -> setof (id, next_run_at, critical, active, updated)
       What the Redis index should hold for these schedules: next_run_at is the
       due time (the earlier of the regular next run and a pending trigger;
       a paused schedule only its trigger); active = false (unknown, deleted,
       paused, ended) -> remove the member. updated: the definition's version
       (create, update, pause, resume; not firing). One row per id given.
       Only instants every client loads come back: an active schedule whose
       due time is outside [1970-01-01Z, 9999-01-01Z) (a row stored before
       create_schedule refused such values) has next_run_at NULL (it cannot
       be indexed), an updated outside it is NULL. */
    SELECT u.id, CASE WHEN pyscheduler._instant_ok(s.due_at) THEN s.due_at END, coalesce(s.critical, false),
           s.due_at IS NOT NULL, CASE WHEN pyscheduler._instant_ok(s.updated) THEN s.updated END
      FROM unnest(index_entries.ids) AS u(id)
      LEFT JOIN schedules s ON s.id = u.id;
$$;
COMMENT ON FUNCTION pyscheduler.index_entries(bigint[]) IS
    'Scheduler: index state (due time, critical, active) of the given schedule ids; inactive -> remove.';

CREATE OR REPLACE FUNCTION pyscheduler.index_page(after bigint DEFAULT 0, max_schedules integer DEFAULT 1000)
RETURNS TABLE (id bigint, next_run_at timestamptz, critical boolean, updated timestamptz)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* index_page(after => 0, max_schedules => 1000) -> setof (id, next_run_at, critical, updated)
   Active schedules (with a due time) with id > after, by id: the periodic
   reconcile walks them page by page. As index_entries, next_run_at is NULL
   for a due time outside [1970-01-01Z, 9999-01-01Z) (not indexable) and
   updated NULL outside it. Errors: PS312 max_schedules outside 1..100000. */
BEGIN
    IF index_page.max_schedules IS NULL OR index_page.max_schedules NOT BETWEEN 1 AND 100000 THEN
        PERFORM _schedule_error('PS312', format('max_schedules must be in 1..100000, got %s',
                                                coalesce(index_page.max_schedules::text, 'NULL')));
    END IF;
    RETURN QUERY
    SELECT s.id, CASE WHEN pyscheduler._instant_ok(s.due_at) THEN s.due_at END, s.critical,
           CASE WHEN pyscheduler._instant_ok(s.updated) THEN s.updated END
      FROM schedules s
     WHERE s.id > coalesce(index_page.after, 0) AND s.due_at IS NOT NULL
     ORDER BY s.id
     LIMIT index_page.max_schedules;
END
$$;
COMMENT ON FUNCTION pyscheduler.index_page(bigint, integer) IS
    'Scheduler: a page of active schedules (id > after, by id) for reconciling the index.';

-- resync_take's body names its parameters qualified (resync_take.owner): its tables have
-- columns of the same names (sync_id, owner), which #variable_conflict use_column prefers.
CREATE OR REPLACE FUNCTION pyscheduler.resync_take(
    sync_id pyscheduler.sync_id, owner pyscheduler.resync_owner, max_schedules integer DEFAULT 1000,
    lease interval DEFAULT '30 seconds')
RETURNS TABLE (id bigint, next_run_at timestamptz, critical boolean, updated timestamptz)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* resync_take(sync_id, owner, max_schedules => 1000, lease => '30 seconds')
       -> setof (id, next_run_at, critical, updated)
   The seed's optimistic resync after Redis lost its data: every taker (an
   executor, the resync command) that sees the new sync id calls this, writes
   the rows to Redis, and calls again, until it returns no rows and
   resync_progress says complete. Each call first acknowledges the caller's
   previous batch (owner names the caller: unique per taker; calling again
   means the batch is written), then hands out the next max_schedules active
   schedules of this sync id, critical schedules first, then by id, leased to
   the caller for lease. A lease not acknowledged in time (its taker died
   between the take and the write) is handed out again to the next caller,
   re-read, so no batch is lost. The version key is kept per sync id and key
   range (a cursor row locked for the hand-out, one lease row per batch)
   rather than per schedule row, so a resync of a million schedules writes a
   row per batch, not a million. No rows while others' leases are still out:
   call again later (an expired one comes back). next_run_at and updated as
   index_page (NULL outside [1970-01-01Z, 9999-01-01Z)).
   Errors: PS312 empty sync id or owner, max_schedules outside 1..100000,
   lease outside 1 ms..1 day. */
#variable_conflict use_column
DECLARE
    r _schedule_resyncs;
    l _schedule_resync_leases;
    v_ids bigint[];
    v_due timestamptz[];
    v_critical boolean[];
    v_updated timestamptz[];
BEGIN
    IF resync_take.sync_id IS NULL OR resync_take.sync_id = '' OR resync_take.owner IS NULL
       OR resync_take.owner = '' OR resync_take.max_schedules IS NULL
       OR resync_take.max_schedules NOT BETWEEN 1 AND 100000 OR resync_take.lease IS NULL
       OR resync_take.lease NOT BETWEEN interval '1 millisecond' AND interval '1 day' THEN
        PERFORM _schedule_error('PS312', format(
            'sync_id and owner must be non-empty, max_schedules in 1..100000 and lease in 1 ms..1 day, '
            'got %s, %s, %s and %s',
            coalesce(quote_literal(resync_take.sync_id), 'NULL'), coalesce(quote_literal(resync_take.owner), 'NULL'),
            coalesce(resync_take.max_schedules::text, 'NULL'), coalesce(resync_take.lease::text, 'NULL')));
    END IF;
    INSERT INTO _schedule_resyncs (sync_id, done_critical, after_id, done, total, started)
    SELECT resync_take.sync_id, false, 0, 0, (SELECT count(*) FROM schedules s WHERE s.due_at IS NOT NULL), now()
     WHERE NOT EXISTS (SELECT 1 FROM _schedule_resyncs x WHERE x.sync_id = resync_take.sync_id)
    ON CONFLICT (sync_id) DO NOTHING;
    -- forget resyncs of long ago
    DELETE FROM _schedule_resync_leases x
     WHERE x.sync_id IN (SELECT y.sync_id FROM _schedule_resyncs y WHERE y.started < now() - interval '7 days');
    DELETE FROM _schedule_resyncs x WHERE x.started < now() - interval '7 days';
    SELECT * INTO r FROM _schedule_resyncs x WHERE x.sync_id = resync_take.sync_id FOR UPDATE;
    -- the caller's previous batch is in Redis: it calls again only after writing it
    WITH acked AS (DELETE FROM _schedule_resync_leases x
                    WHERE x.sync_id = resync_take.sync_id AND x.owner = resync_take.owner
                   RETURNING x.n)
    UPDATE _schedule_resyncs x SET done = x.done + (SELECT coalesce(sum(a.n), 0) FROM acked a)
     WHERE x.sync_id = resync_take.sync_id;
    -- a range whose taker did not acknowledge it in time: taken again, as it is now
    SELECT * INTO l FROM _schedule_resync_leases x WHERE x.sync_id = resync_take.sync_id AND x.until < now()
     ORDER BY x.critical DESC, x.after_id LIMIT 1;
    IF FOUND THEN
        SELECT coalesce(array_agg(s.id ORDER BY s.id), '{}'), array_agg(s.due_at ORDER BY s.id),
               array_agg(s.critical ORDER BY s.id), array_agg(s.updated ORDER BY s.id)
          INTO v_ids, v_due, v_critical, v_updated
          FROM schedules s
         WHERE s.critical = l.critical AND s.id > l.after_id AND s.id <= l.last_id AND s.due_at IS NOT NULL;
        UPDATE _schedule_resync_leases x
           SET owner = resync_take.owner, until = now() + resync_take.lease, n = cardinality(v_ids)
         WHERE x.sync_id = resync_take.sync_id AND x.critical = l.critical AND x.after_id = l.after_id;
        RETURN QUERY SELECT u.id, CASE WHEN pyscheduler._instant_ok(u.due) THEN u.due END, u.critical,
                            CASE WHEN pyscheduler._instant_ok(u.upd) THEN u.upd END
                       FROM unnest(v_ids, v_due, v_critical, v_updated) AS u(id, due, critical, upd);
        RETURN;
    END IF;
    -- the critical schedules (schedules_critical_id_idx), then the others (the primary key: a
    -- firing of a non-critical schedule writes no entry to an index of critical ones)
    WHILE NOT r.exhausted LOOP
        IF NOT r.done_critical THEN
            SELECT coalesce(array_agg(x.id ORDER BY x.id), '{}'), array_agg(x.due_at ORDER BY x.id),
                   array_agg(x.critical ORDER BY x.id), array_agg(x.updated ORDER BY x.id)
              INTO v_ids, v_due, v_critical, v_updated
              FROM (SELECT s.id, s.due_at, s.critical, s.updated FROM schedules s
                     WHERE s.critical AND s.id > r.after_id AND s.due_at IS NOT NULL
                     ORDER BY s.id LIMIT resync_take.max_schedules) x;
        ELSE
            SELECT coalesce(array_agg(x.id ORDER BY x.id), '{}'), array_agg(x.due_at ORDER BY x.id),
                   array_agg(x.critical ORDER BY x.id), array_agg(x.updated ORDER BY x.id)
              INTO v_ids, v_due, v_critical, v_updated
              FROM (SELECT s.id, s.due_at, s.critical, s.updated FROM schedules s
                     WHERE NOT s.critical AND s.id > r.after_id AND s.due_at IS NOT NULL
                     ORDER BY s.id LIMIT resync_take.max_schedules) x;
        END IF;
        IF cardinality(v_ids) > 0 THEN
            INSERT INTO _schedule_resync_leases (sync_id, critical, after_id, last_id, n, owner, until)
            VALUES (resync_take.sync_id, NOT r.done_critical, r.after_id, v_ids[cardinality(v_ids)],
                    cardinality(v_ids), resync_take.owner, now() + resync_take.lease);
            UPDATE _schedule_resyncs x SET after_id = v_ids[cardinality(v_ids)] WHERE x.sync_id = resync_take.sync_id;
            RETURN QUERY SELECT u.id, CASE WHEN pyscheduler._instant_ok(u.due) THEN u.due END, u.critical,
                                CASE WHEN pyscheduler._instant_ok(u.upd) THEN u.upd END
                           FROM unnest(v_ids, v_due, v_critical, v_updated) AS u(id, due, critical, upd);
            RETURN;
        END IF;
        IF r.done_critical THEN
            UPDATE _schedule_resyncs x SET exhausted = true WHERE x.sync_id = resync_take.sync_id;
            r.exhausted := true;
        ELSE
            UPDATE _schedule_resyncs x SET done_critical = true, after_id = 0
             WHERE x.sync_id = resync_take.sync_id;
            r.done_critical := true;
            r.after_id := 0;
        END IF;
    END LOOP;
END
$$;
COMMENT ON FUNCTION pyscheduler.resync_take(pyscheduler.sync_id, pyscheduler.resync_owner, integer, interval) IS
    'Scheduler: acknowledge the caller''s last batch, lease it the next batch of schedules to re-add to a lost Redis index (critical first).';

CREATE OR REPLACE FUNCTION pyscheduler.resync_progress(sync_id pyscheduler.sync_id)
RETURNS TABLE (done bigint, total bigint, complete boolean)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
    /* resync_progress(sync_id) -> (done, total, complete)
       Schedules written to Redis so far for this sync id (acknowledged
       batches), the active schedules there were when it began ((0, active
       now) before the first take), and whether every batch was handed out and
       acknowledged: only then may a taker mark the index complete. */
    SELECT coalesce(x.done, 0), coalesce(x.total, (SELECT count(*) FROM schedules s WHERE s.due_at IS NOT NULL)),
           coalesce(x.exhausted, false)
           AND NOT EXISTS (SELECT 1 FROM _schedule_resync_leases l WHERE l.sync_id = resync_progress.sync_id)
      FROM (SELECT 1) one LEFT JOIN _schedule_resyncs x ON x.sync_id = resync_progress.sync_id;
$$;
COMMENT ON FUNCTION pyscheduler.resync_progress(pyscheduler.sync_id) IS
    'Progress of a resync: schedules written so far, the total to do, and whether it is complete.';

-- _fire_ms(iv): an interval in whole milliseconds for the executors, in 0..10^15 (NULL stays NULL).
CREATE OR REPLACE FUNCTION pyscheduler._fire_ms(p_iv interval)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_iv IS NOT NULL THEN greatest(0, least(date_part('epoch', p_iv) * 1000, 1e15))::bigint END;
$$;

CREATE OR REPLACE FUNCTION pyscheduler.fire_details(ids bigint[])
RETURNS TABLE (id bigint, name text, target_kind text, target text, priority bigint, payload text,
               retry_attempts integer, retry_base_ms bigint, retry_jitter_ms bigint, critical boolean,
               paused boolean, active boolean, catchup_window_ms bigint, overlap text, version bigint)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
    /* fire_details(ids) -> setof (id, name, target_kind, target, priority,
           payload, retry_attempts, retry_base_ms, retry_jitter_ms, critical,
           paused, active, catchup_window_ms, overlap, version)
       What an executor needs to fire these schedules, in the forms it uses
       (durations in milliseconds; payload the JSON text as stored, sent as
       the message body without decoding it; version = `updated` in epoch ms,
       what the index's version hash holds: cache by it). Unknown ids come
       back with active = false and the rest NULL. An occurrence older than
       now - catchup_window_ms should not be fired but recorded with outcome
       'missed'. Every value loads, whatever a row stored before the
       create-time checks holds: retry_attempts within 0..30, durations
       within 0..10^15 ms, version NULL for an `updated` outside
       [1970-01-01Z, 9999-01-01Z). */
BEGIN
    RETURN QUERY
    SELECT u.id, s.name, s.target_kind, s.target, s.priority, s.payload::text,
           CASE WHEN s.retry_attempts IS NOT NULL THEN greatest(0, least(s.retry_attempts, 30)) END,
           _fire_ms(s.retry_base), _fire_ms(s.retry_jitter),
           s.critical, s.paused, coalesce(s.due_at IS NOT NULL, false), _fire_ms(s.catchup_window), s.overlap,
           CASE WHEN _instant_ok(s.updated)  -- float8: numeric extract() costs 3 times as much
                THEN round(date_part('epoch', s.updated) * 1000)::bigint END
      FROM unnest(fire_details.ids) AS u(id)
      LEFT JOIN schedules s ON s.id = u.id;
END
$$;
COMMENT ON FUNCTION pyscheduler.fire_details(bigint[]) IS
    'Scheduler: target, payload and retry policy of the given schedules, for firing them.';

-- _record_item(task, id, expected, outcome, attempts, error, token, now): one item of
-- _record_each: _fire_task_one (task) or _record_one.
CREATE OR REPLACE FUNCTION pyscheduler._record_item(
    p_task boolean, p_id bigint, p_expected timestamptz, p_outcome text, p_attempts integer, p_error text,
    p_token uuid, p_now timestamptz, OUT due_at timestamptz, OUT recorded boolean)
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    v record;
BEGIN
    IF p_task THEN
        v := _fire_task_one(p_id, p_expected, p_token, p_now);
    ELSE
        v := _record_one(p_id, p_expected, p_outcome, p_attempts, p_error, p_token, NULL, p_now);
    END IF;
    due_at := v.due_at;
    recorded := v.recorded;
END
$$;

-- _record_each(task, ids, expected, outcomes, attempts, errors, tokens, skip, now):
-- record (task = false: _record_one) or fire and record (task = true:
-- _fire_task_one) each item not marked in skip, in schedule order; one row per
-- item. All at once first; when a data error stops that, again with each item
-- alone, so _stop_poisoned ends the one it belongs to and the others are
-- recorded (what the first pass wrote, tasks included, is rolled back). An
-- unknown outcome is the caller's error: the whole call fails (PS312).
CREATE OR REPLACE FUNCTION pyscheduler._record_each(
    p_task boolean, p_ids bigint[], p_expected timestamptz[], p_outcomes text[], p_attempts integer[],
    p_errors text[], p_tokens uuid[], p_skip boolean[], p_now timestamptz)
RETURNS TABLE (id bigint, expected_at timestamptz, next_run_at timestamptz, recorded boolean)
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    r record;
    v record;
    k integer;
    v_ids bigint[];
    v_exp timestamptz[];
    v_due timestamptz[];
    v_rec boolean[];
BEGIN
    FOR v_pass IN 1 .. 2 LOOP
        k := 0; v_ids := '{}'; v_exp := '{}'; v_due := '{}'; v_rec := '{}';
        BEGIN
            FOR r IN SELECT * FROM unnest(p_ids, p_expected, p_outcomes, p_attempts, p_errors, p_tokens)
                             WITH ORDINALITY AS u(id, expected, outcome, attempts, error, token, o)
                      WHERE p_skip IS NULL OR NOT p_skip[u.o]
                      ORDER BY u.id, u.expected
            LOOP
                IF NOT p_task THEN
                    PERFORM _check_outcome(r.outcome);
                END IF;
                IF v_pass = 1 THEN  -- no subtransaction per item on the common path
                    v := _record_item(p_task, r.id, r.expected, r.outcome, r.attempts, r.error, r.token, p_now);
                ELSE
                    BEGIN
                        v := _record_item(p_task, r.id, r.expected, r.outcome, r.attempts, r.error, r.token, p_now);
                    EXCEPTION WHEN OTHERS THEN
                        IF NOT _poison(SQLSTATE) THEN
                            RAISE;
                        END IF;
                        v := _stop_poisoned(r.id, r.expected, coalesce(r.outcome, 'failed'),
                                            SQLSTATE || ': ' || SQLERRM, p_now);
                    END;
                END IF;
                k := k + 1;
                v_ids[k] := r.id; v_exp[k] := r.expected; v_due[k] := v.due_at; v_rec[k] := v.recorded;
            END LOOP;
            EXIT;
        EXCEPTION WHEN OTHERS THEN
            IF v_pass = 2 OR NOT _poison(SQLSTATE) THEN
                RAISE;
            END IF;
        END;
    END LOOP;
    RETURN QUERY SELECT * FROM unnest(v_ids, v_exp, v_due, v_rec);
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler._record_executions(
    p_ids bigint[], p_expected timestamptz[], p_outcomes text[], p_attempts integer[],
    p_errors text[], p_tokens uuid[], p_now timestamptz)
RETURNS TABLE (id bigint, expected_at timestamptz, next_run_at timestamptz, recorded boolean)
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    v_n integer := coalesce(cardinality(p_ids), 0);
    v_fast record;
    v_done boolean[];
    v_o bigint;
BEGIN
    PERFORM _check_batch(cardinality(p_ids), cardinality(p_expected), cardinality(p_outcomes),
                         cardinality(p_attempts), cardinality(p_errors), cardinality(p_tokens));
    PERFORM _check_expected(p_expected);
    IF v_n = 0 THEN
        RETURN;
    END IF;
    -- Set-based path for the common case: an interval schedule's regular
    -- occurrence, once in the batch, not recorded yet, next occurrence within
    -- the catch-up window, not ending the schedule, no trigger on the same
    -- millisecond. One UPDATE (rows in id order; under concurrent writers its
    -- conditions are rechecked on the newest row version, so a schedule another
    -- writer moved on is left alone) whose RETURNING feeds the INSERT of the
    -- executions: each row is written once, and no join of two result sets (a
    -- nested loop of batch x batch comparisons) is needed. Everything else goes
    -- through _record_one below. A data error here (a stored value it cannot
    -- compute with) leaves the whole batch to the row-by-row path, where the
    -- item it belongs to ends alone.
    BEGIN
        WITH inp AS (
            SELECT u.*, count(*) OVER (PARTITION BY u.id) AS n
              FROM unnest(p_ids, p_expected, p_outcomes, p_attempts, p_errors, p_tokens)
                   WITH ORDINALITY AS u(id, expected, outcome, attempts, error, token, o)
             ORDER BY u.id),
        upd AS (
            UPDATE schedules t
               SET fired_count = t.fired_count + (i.outcome = 'fired')::integer,
                   failed_count = t.failed_count + (i.outcome = 'failed')::integer,
                   skipped_count = t.skipped_count + (i.outcome = 'skipped_overlap')::integer,
                   runs_count = t.runs_count + (i.outcome <> 'skipped_overlap')::integer,
                   consecutive_failures = CASE i.outcome WHEN 'failed' THEN t.consecutive_failures + 1
                                                         WHEN 'fired' THEN 0 ELSE t.consecutive_failures END,
                   last_outcome = CASE WHEN i.outcome = 'skipped_overlap' THEN t.last_outcome ELSE i.outcome END,
                   last_error = CASE i.outcome WHEN 'failed' THEN left(i.error, 2000) WHEN 'fired' THEN NULL
                                               ELSE t.last_error END,
                   last_expected_at = greatest(t.last_expected_at, i.expected),
                   next_run_at = i.expected + _every_us(t.every) * interval '1 microsecond',
                   claim_token = CASE WHEN i.token IS NULL THEN t.claim_token END,
                   claimed_until = CASE WHEN i.token IS NULL THEN t.claimed_until END
              FROM inp i
             WHERE t.id = i.id AND i.n = 1 AND t.every IS NOT NULL AND t.next_run_at = i.expected
               AND i.outcome IN ('fired', 'failed', 'skipped_overlap')
               AND (i.token IS NULL OR t.claim_token = i.token)
               AND t.trigger_at IS DISTINCT FROM i.expected
               AND i.expected + _every_us(t.every) * interval '1 microsecond' >= p_now - t.catchup_window
               AND i.expected + _every_us(t.every) * interval '1 microsecond'
                   < least(t.end_at + interval '1 microsecond', timestamptz '9999-01-01 00:00:00+00')
               AND (t.max_runs IS NULL OR t.runs_count + (i.outcome <> 'skipped_overlap')::integer < t.max_runs)
               AND NOT EXISTS (SELECT 1 FROM schedule_executions e WHERE e.schedule_id = i.id AND e.expected_at = i.expected)
            RETURNING t.id, i.expected, i.outcome, i.attempts, i.error, t.due_at, i.o),
        ins AS (
            INSERT INTO schedule_executions (schedule_id, expected_at, outcome, triggered, attempts, fired_at, lateness, error)
            SELECT u.id, u.expected, u.outcome, false, coalesce(u.attempts, 0), p_now, p_now - u.expected, left(u.error, 2000)
              FROM upd u
            ON CONFLICT ON CONSTRAINT schedule_executions_pkey DO NOTHING)
        SELECT array_agg(u.id) AS ids, array_agg(u.expected) AS expected, array_agg(u.due_at) AS due,
               array_agg(u.o) AS ords
          INTO v_fast FROM upd u;
    EXCEPTION WHEN OTHERS THEN
        IF NOT _poison(SQLSTATE) THEN
            RAISE;
        END IF;
        SELECT NULL::bigint[] AS ids INTO v_fast;
    END;
    IF v_fast.ids IS NOT NULL THEN
        RETURN QUERY SELECT f.id, f.expected, f.due, true
                       FROM unnest(v_fast.ids, v_fast.expected, v_fast.due) AS f(id, expected, due);
        IF cardinality(v_fast.ids) = v_n THEN
            RETURN;
        END IF;
        v_done := array_fill(false, ARRAY[v_n]);
        FOREACH v_o IN ARRAY v_fast.ords LOOP
            v_done[v_o] := true;
        END LOOP;
    END IF;
    -- the rest one by one, in schedule order, each poison item alone
    RETURN QUERY SELECT * FROM _record_each(false, p_ids, p_expected, p_outcomes, p_attempts, p_errors, p_tokens,
                                            v_done, p_now);
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.record_executions(
    ids bigint[], expected timestamptz[], outcomes pyscheduler.schedule_outcome[], attempts integer[],
    errors pyscheduler.execution_error[] DEFAULT NULL, tokens uuid[] DEFAULT NULL)
RETURNS TABLE (id bigint, expected_at timestamptz, next_run_at timestamptz, recorded boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* record_executions(ids, expected, outcomes, attempts, errors => NULL,
       tokens => NULL) -> setof (id, expected_at, next_run_at, recorded)
   Record a batch of executions (parallel arrays): outcome fired | failed |
   skipped_overlap | missed (too late to fire: joins the catch-up summary).
   Each (id, expected) is recorded once: a repeat returns recorded = false
   and counts nothing. fired_at = the database clock. When expected is the
   schedule's regular next run, the next one is computed from the expected
   time (never from now), with the catch-up rule (occurrences older than now
   - catchup_window become one 'missed' row with their count) and end_at /
   max_runs (NULL = ended); when it is the pending trigger, the trigger is
   cleared; otherwise (a stale occurrence) nothing moves. Returns the due
   time to write as the score (NULL -> remove the member). tokens: from
   claim_due_critical; a row whose token is not the schedule's current claim
   is not recorded (recorded = false). Deleted schedule -> recorded = false,
   next NULL. A pending trigger on the regular occurrence's millisecond is
   cleared with it (one firing). A next occurrence after 9999-01-01 ends the
   schedule (next NULL, ended_note). An item whose schedule holds a value the
   recording cannot compute with ends alone: recorded with its outcome and
   the error, the schedule paused with a note (last_error says why), next
   NULL; the other items are recorded as usual.
   Errors: PS312 arrays of different lengths or unknown outcome, PS314 an
   expected time outside [1970-01-01Z, 9999-01-01Z). */
BEGIN
    RETURN QUERY SELECT * FROM _record_executions(record_executions.ids, record_executions.expected,
                                                  record_executions.outcomes, record_executions.attempts,
                                                  record_executions.errors, record_executions.tokens, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.record_executions(bigint[], timestamptz[], pyscheduler.schedule_outcome[],
    integer[], pyscheduler.execution_error[], uuid[]) IS
    'Scheduler: record a batch of executions once per (schedule, expected time) and move each schedule to its next run.';

-- _task_rn(result): the task id in whatever submit_task returned (jsonb, or a row).
CREATE OR REPLACE FUNCTION pyscheduler._task_rn(p_result jsonb)
RETURNS uuid
LANGUAGE sql IMMUTABLE
AS $$
    SELECT coalesce(p_result ->> 'rn', p_result -> 'task' ->> 'rn', p_result -> 'submit_task' ->> 'rn')::uuid;
$$;

-- _fire_task_one(id, expected, token, now): fire_task_schedules for one
-- occurrence. Submits nothing, and answers the schedule's current due time
-- with recorded = false, for a deleted schedule (due NULL), one that is no
-- longer a task target (the executor fires it by its new kind once the index
-- holds its due time again), a claim that is not the caller's, and a stale
-- occurrence (neither the regular next run nor the pending trigger: the
-- schedule changed since it was claimed). An occurrence recorded already
-- submits nothing either (the schedule moves on as record_executions).
CREATE OR REPLACE FUNCTION pyscheduler._fire_task_one(
    p_id bigint, p_expected timestamptz, p_token uuid, p_now timestamptz,
    OUT due_at timestamptz, OUT recorded boolean)
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    s pyscheduler.schedules;
    v record;
    v_unfinished uuid[];
    v_outcome text;
    v_rn uuid;
    v_error text;
    v_result jsonb;
BEGIN
    recorded := false;
    SELECT * INTO s FROM schedules t WHERE t.id = p_id FOR UPDATE;
    IF NOT FOUND OR p_expected IS NULL THEN
        RETURN;
    END IF;
    IF s.target_kind <> 'task' OR (p_expected IS DISTINCT FROM s.next_run_at AND p_expected IS DISTINCT FROM s.trigger_at) THEN
        due_at := s.due_at;
        RETURN;
    END IF;
    IF (p_token IS NULL OR s.claim_token = p_token)
       AND NOT EXISTS (SELECT 1 FROM schedule_executions e WHERE e.schedule_id = p_id AND e.expected_at = p_expected) THEN
        -- the overlap policy looks at the schedule's earlier tasks still ready or running
        SELECT coalesce(array_agg(t.rn), '{}') INTO v_unfinished
          FROM tasks t WHERE t.rn = ANY (s.task_rns) AND t.status IN ('scheduled', 'ready', 'running');
        IF p_expected < p_now - s.catchup_window AND p_expected = s.next_run_at THEN
            v_outcome := 'missed';
        ELSIF (s.overlap = 'skip' AND cardinality(v_unfinished) >= 1)
              OR (s.overlap = 'buffer_one' AND cardinality(v_unfinished) >= 2) THEN
            v_outcome := 'skipped_overlap';
        ELSE
            BEGIN
                -- the task belongs to the schedule's owner (who may cancel or requeue it)
                SELECT to_jsonb(x) INTO v_result FROM pyscheduler._submit_task(
                    p_submitted_by => s.owner, p_now => now(), queue => s.target, priority => s.priority,
                    max_attempts => (s.task_options ->> 'max_attempts')::integer,
                    concurrency_key => s.task_options ->> 'concurrency_key',
                    spec => s.payload || jsonb_build_object('pyscheduler', jsonb_build_object(
                        'schedule', s.name, 'schedule_id', s.id, 'expected_at', p_expected,
                        'idempotency_key', s.id || ':' || (_epoch_us(p_expected) / 1000)))) AS x(submit_task);
                v_rn := _task_rn(v_result);
                v_outcome := 'fired';
            EXCEPTION WHEN OTHERS THEN
                v_outcome := 'failed';
                v_error := SQLSTATE || ': ' || SQLERRM;
            END;
        END IF;
        IF s.overlap <> 'allow' AND (v_rn IS NOT NULL OR v_unfinished IS DISTINCT FROM s.task_rns) THEN
            UPDATE schedules t SET task_rns = v_unfinished || coalesce(ARRAY[v_rn], '{}')
             WHERE t.id = p_id;
        END IF;
    END IF;
    v := _record_one(p_id, p_expected, coalesce(v_outcome, 'fired'), 1, v_error, p_token, v_rn, p_now);
    due_at := v.due_at;
    recorded := v.recorded AND v_outcome IS NOT NULL;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler._fire_task_schedules(
    p_ids bigint[], p_expected timestamptz[], p_tokens uuid[], p_now timestamptz)
RETURNS TABLE (id bigint, expected_at timestamptz, next_run_at timestamptz, recorded boolean)
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    PERFORM _check_batch(cardinality(p_ids), cardinality(p_expected), cardinality(p_tokens));
    PERFORM _check_expected(p_expected);
    RETURN QUERY SELECT * FROM _record_each(true, p_ids, p_expected, NULL, NULL, NULL, p_tokens, NULL, p_now);
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.fire_task_schedules(
    ids bigint[], expected timestamptz[], tokens uuid[] DEFAULT NULL)
RETURNS TABLE (id bigint, expected_at timestamptz, next_run_at timestamptz, recorded boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* fire_task_schedules(ids, expected, tokens => NULL)
       -> setof (id, expected_at, next_run_at, recorded)
   Fire task-target schedules in the database: for each (id, expected), in
   one transaction, submit the task (spec = payload + {"pyscheduler":
   {schedule, schedule_id, expected_at, idempotency_key}}, queue = target,
   priority, task_options' max_attempts and concurrency_key) and record the execution, as record_executions. Overlap policy:
   allow; skip -> 'skipped_overlap' while an earlier task of the schedule is
   ready or running; buffer_one -> submitted while fewer than two are (one
   may wait behind the running one). An occurrence older than the catch-up
   window is recorded 'missed', not submitted. A repeat of (id, expected)
   submits nothing (recorded = false). A submit that fails is recorded as
   'failed' with the error. tokens as record_executions. Each item is
   answered on its own: one that is not a task target (any more) or is stale
   (neither the regular next run nor the pending trigger: the schedule changed
   since it was claimed) submits nothing and gets recorded = false with the
   schedule's current due time; one whose stored values cannot be computed
   with ends alone (recorded 'failed', the schedule paused with a note).
   Errors: PS312 array lengths, PS314 an expected time outside
   [1970-01-01Z, 9999-01-01Z). */
BEGIN
    RETURN QUERY SELECT * FROM _fire_task_schedules(fire_task_schedules.ids, fire_task_schedules.expected,
                                                    fire_task_schedules.tokens, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.fire_task_schedules(bigint[], timestamptz[], uuid[]) IS
    'Scheduler: submit the tasks of due task-target schedules (overlap policy) and record them, in one transaction.';

CREATE OR REPLACE FUNCTION pyscheduler._stop_schedules(
    p_ids bigint[], p_expected timestamptz[], p_outcomes text[], p_errors text[], p_now timestamptz)
RETURNS TABLE (id bigint, expected_at timestamptz, next_run_at timestamptz, recorded boolean)
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    r record;
    v record;
BEGIN
    PERFORM _check_batch(cardinality(p_ids), cardinality(p_expected), cardinality(p_outcomes),
                         cardinality(p_errors));
    PERFORM _check_expected(p_expected);
    FOR r IN SELECT * FROM unnest(p_ids, p_expected, p_outcomes, p_errors) AS u(id, expected, outcome, error)
              ORDER BY u.id, u.expected
    LOOP
        PERFORM _check_outcome(r.outcome);
        IF r.expected IS NULL OR r.error IS NULL THEN
            PERFORM _schedule_error('PS312', 'each item needs an expected time and an error');
        END IF;
        v := _stop_poisoned(r.id, r.expected, r.outcome, r.error, p_now);
        id := r.id; expected_at := r.expected; next_run_at := v.due_at; recorded := coalesce(v.recorded, false);
        RETURN NEXT;
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.stop_schedules(
    ids bigint[], expected timestamptz[], outcomes pyscheduler.schedule_outcome[],
    errors pyscheduler.execution_error[])
RETURNS TABLE (id bigint, expected_at timestamptz, next_run_at timestamptz, recorded boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* stop_schedules(ids, expected, outcomes, errors)
       -> setof (id, expected_at, next_run_at, recorded)
   The daemons' end for an occurrence they could not fire or record although
   PostgreSQL answered (record_executions or fire_details failed for it alone
   with a data error, or answered a value they cannot load): as a poison item
   of record_executions, it is recorded with its outcome (fired, failed, ...)
   and the error, and its schedule paused with a note (last_error says why;
   fix it with update_schedule, then resume it). next_run_at is the due time
   left (a pending trigger of a paused schedule is dropped too: NULL); an
   occurrence recorded before keeps its row (recorded = false); a deleted
   schedule: recorded = false, next NULL.
   Errors: PS312 array lengths, an unknown outcome, a NULL expected time or
   error, PS314 an expected time outside [1970-01-01Z, 9999-01-01Z). */
BEGIN
    RETURN QUERY SELECT * FROM _stop_schedules(stop_schedules.ids, stop_schedules.expected, stop_schedules.outcomes,
                                               stop_schedules.errors, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.stop_schedules(bigint[], timestamptz[], pyscheduler.schedule_outcome[],
    pyscheduler.execution_error[]) IS
    'Scheduler: record occurrences the daemons could not fire or record, with their error, and pause their schedules.';

-- _claim_due_critical(limit, hold, now, shards, shard_count): claim_due_critical with the
-- clock as a parameter; with shards, only the schedules whose index shard (id mod
-- shard_count, issue 18) is one of them (claim_due_critical_shards), reading at most
-- shard_count / cardinality(shards) index entries per row it returns.
-- Its plan is pinned: an ordered scan of schedules_critical_due_idx that stops at p_limit
-- rows, whatever the statistics say. Without the settings, statistics taken while the due
-- schedules were a day away (2 % of the table: below the autoanalyze threshold) made the
-- custom plan a bitmap scan plus a sort of every due row (95 ms a call for 100,000 due), and
-- the generic plan a merge join over the whole primary key; the UPDATE finds each locked row
-- by its ctid (a Tid Scan), so no join over the table can be chosen.
CREATE OR REPLACE FUNCTION pyscheduler._claim_due_critical(p_limit integer, p_hold interval, p_now timestamptz,
                                                           p_shards integer[] DEFAULT '{0}',
                                                           p_shard_count integer DEFAULT 1)
RETURNS TABLE (id bigint, expected_at timestamptz, claim_token uuid)
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_sort = off
SET enable_hashjoin = off SET enable_mergejoin = off SET enable_indexscan = on SET enable_tidscan = on
AS $$
BEGIN
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 100000 OR p_hold IS NULL OR p_hold <= interval '0' THEN
        PERFORM _schedule_error('PS312', format('max_schedules must be in 1..100000 and hold > 0, got %s and %s',
                                                coalesce(p_limit::text, 'NULL'), coalesce(p_hold::text, 'NULL')));
    END IF;
    IF p_shard_count IS NULL OR p_shard_count NOT BETWEEN 1 AND 16384 OR p_shards IS NULL
       OR cardinality(p_shards) = 0
       OR EXISTS (SELECT 1 FROM unnest(p_shards) k WHERE k IS NULL OR k NOT BETWEEN 0 AND p_shard_count - 1) THEN
        PERFORM _schedule_error('PS312', format(
            'shard_count must be in 1..16384 and shards a non-empty array of shards in 0..shard_count - 1, '
            'got %s and %s', coalesce(p_shard_count::text, 'NULL'), coalesce(p_shards::text, 'NULL')));
    END IF;
    RETURN QUERY
    WITH c AS (
        SELECT s.ctid AS row_id FROM schedules s
         WHERE s.critical_due_at <= p_now AND (s.claimed_until IS NULL OR s.claimed_until < p_now)
           AND (p_shard_count = 1 OR (s.id % p_shard_count)::integer = ANY (p_shards))
         ORDER BY s.critical_due_at
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED)
    UPDATE schedules s SET claim_token = gen_random_uuid(), claimed_until = p_now + p_hold
      FROM c
     WHERE s.ctid = c.row_id  -- the row version locked above
    RETURNING s.id, s.due_at, s.claim_token;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.claim_due_critical(max_schedules integer DEFAULT 100,
                                                          hold interval DEFAULT '30 seconds')
RETURNS TABLE (id bigint, expected_at timestamptz, claim_token uuid)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* claim_due_critical(max_schedules => 100, hold => '30 seconds')
       -> setof (id, expected_at, claim_token)
   Degraded mode (Redis unreachable): claim up to max_schedules due critical
   schedules (oldest due first, FOR UPDATE SKIP LOCKED, so concurrent
   executors never get the same one) for hold. Fire each, then record with
   record_executions(..., tokens) (task targets: fire_task_schedules with
   tokens); a claim not recorded within hold can be claimed again.
   Errors: PS312 max_schedules outside 1..100000 or hold <= 0. */
BEGIN
    RETURN QUERY SELECT * FROM _claim_due_critical(claim_due_critical.max_schedules, claim_due_critical.hold, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.claim_due_critical(integer, interval) IS
    'Scheduler, degraded mode: claim due critical schedules (SKIP LOCKED, batched) with a token for recording.';

CREATE OR REPLACE FUNCTION pyscheduler.claim_due_critical_shards(shards integer[], shard_count integer,
                                                                 max_schedules integer DEFAULT 100,
                                                                 hold interval DEFAULT '30 seconds')
RETURNS TABLE (id bigint, expected_at timestamptz, claim_token uuid)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* claim_due_critical_shards(shards, shard_count, max_schedules => 100, hold => '30 seconds')
       -> setof (id, expected_at, claim_token)
   Degraded mode of some shards of a sharded index (Redis Cluster: a master
   down and no replica promoted yet): as claim_due_critical, only the due
   critical schedules whose shard (id mod shard_count) is in shards; the
   other shards go on firing from Redis. Record as claim_due_critical's claims
   (record_executions(..., tokens)).
   Errors: PS312 shard_count outside 1..16384, shards empty or a shard
   outside 0..shard_count - 1, max_schedules outside 1..100000 or hold <= 0. */
BEGIN
    RETURN QUERY SELECT * FROM _claim_due_critical(claim_due_critical_shards.max_schedules,
                                                   claim_due_critical_shards.hold, now(),
                                                   claim_due_critical_shards.shards,
                                                   claim_due_critical_shards.shard_count);
END
$$;
COMMENT ON FUNCTION pyscheduler.claim_due_critical_shards(integer[], integer, integer, interval) IS
    'Scheduler, degraded mode of some index shards: claim due critical schedules of those shards (id mod count).';

-- _fold_schedule_minutes(): add the executions recorded since _schedule_minutes_folded.upto, up
-- to the minute before the last (a recording transaction has a minute to commit), to
-- _schedule_minutes (per outcome, with the largest lateness) and _schedule_latency_minutes (a
-- histogram of lateness: _latency_k); delete their rows older than 8 days. Reads the executions'
-- BRIN on fired_at from upto on only (the first fold: the last 8 days). Called by
-- _purge_executions (the schedules cleanup daemon, every minute) before it deletes; a
-- concurrent fold skips (returns 0). Returns the minutes folded. As _fold_task_minutes.
CREATE OR REPLACE FUNCTION pyscheduler._fold_schedule_minutes(p_now timestamptz DEFAULT now())
RETURNS integer
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    v_from timestamptz;
    v_to timestamptz := date_bin('1 minute', p_now - interval '1 minute', timestamptz 'epoch');
BEGIN
    SELECT f.upto INTO v_from FROM pyscheduler._schedule_minutes_folded f FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    v_from := coalesce(v_from, date_bin('1 minute', p_now - interval '8 days', timestamptz 'epoch'));
    IF v_from >= v_to THEN
        RETURN 0;
    END IF;
    INSERT INTO pyscheduler._schedule_minutes (minute, outcome, n, worst)
    SELECT date_bin('1 minute', e.fired_at, timestamptz 'epoch'), e.outcome, count(*), max(e.lateness)
      FROM pyscheduler.schedule_executions e
     WHERE e.fired_at >= v_from AND e.fired_at < v_to
     GROUP BY 1, 2;
    INSERT INTO pyscheduler._schedule_latency_minutes (minute, k, n)
    SELECT date_bin('1 minute', e.fired_at, timestamptz 'epoch'), pyscheduler._latency_k(e.lateness), count(*)
      FROM pyscheduler.schedule_executions e
     WHERE e.fired_at >= v_from AND e.fired_at < v_to AND e.lateness IS NOT NULL
     GROUP BY 1, 2;
    DELETE FROM pyscheduler._schedule_minutes m WHERE m.minute < p_now - interval '8 days';
    DELETE FROM pyscheduler._schedule_latency_minutes m WHERE m.minute < p_now - interval '8 days';
    UPDATE pyscheduler._schedule_minutes_folded SET upto = v_to;
    RETURN extract(epoch FROM v_to - v_from)::integer / 60;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler._purge_executions(p_batch integer, p_now timestamptz)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    v_n bigint;
BEGIN
    IF p_batch IS NULL OR p_batch NOT BETWEEN 1 AND 1000000 THEN
        PERFORM _schedule_error('PS312', format('max_executions must be in 1..1000000, got %s',
                                                coalesce(p_batch::text, 'NULL')));
    END IF;
    PERFORM _fold_schedule_minutes(p_now);  -- before the executions it counts are deleted
    DELETE FROM schedule_executions e
     WHERE e.ctid = ANY (ARRAY(
        SELECT x.ctid FROM schedule_executions x
         WHERE x.fired_at < p_now - _setting('schedules_execution_retention')::interval
         LIMIT p_batch));
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.purge_executions(max_executions integer DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* purge_executions(max_executions => 10000) -> bigint
   Delete up to max_executions executions recorded before now minus the
   retention setting (schedules_execution_retention, default 30 days);
   returns how many. The cleanup daemon calls it while it returns
   max_executions. Counts in the schedule rows are kept. First it folds
   the executions recorded since into the dashboard's per-minute counts
   (_fold_schedule_minutes).
   Errors: PS312 max_executions outside 1..1000000. */
BEGIN
    RETURN _purge_executions(purge_executions.max_executions, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.purge_executions(integer) IS
    'Scheduler: delete a batch of executions older than the retention setting; counts survive.';
