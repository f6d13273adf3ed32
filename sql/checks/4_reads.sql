-- pyscheduler: future checks, the read paths: list_checks, check_history (keyset cursors), the history purge.
-- The overview (slots, SQLSTATEs) is at the top of 1_slots.sql; the files of sql/checks/
-- load in name order on every migrate.

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
        PERFORM pyscheduler._check_entity_ref(p_name, p_key);
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
    entity_name pyscheduler.entity_ref DEFAULT NULL, entity_key pyscheduler.entity_ref DEFAULT NULL,
    job pyscheduler.job_name DEFAULT NULL, max integer DEFAULT 100, after_at timestamptz DEFAULT NULL,
    after_id bigint DEFAULT NULL)
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
COMMENT ON FUNCTION pyscheduler.list_checks(pyscheduler.entity_ref, pyscheduler.entity_ref, pyscheduler.job_name,
    integer, timestamptz, bigint) IS
    'Pending checks matching the filters given, soonest first (another role''s without their payload); a page '
    'from (after_at, after_id) on (keyset).';

CREATE OR REPLACE FUNCTION pyscheduler.check_history(
    entity_name pyscheduler.entity_ref DEFAULT NULL, entity_key pyscheduler.entity_ref DEFAULT NULL,
    job pyscheduler.job_name DEFAULT NULL, max integer DEFAULT 100, before_at timestamptz DEFAULT NULL,
    before_id bigint DEFAULT NULL)
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
COMMENT ON FUNCTION pyscheduler.check_history(pyscheduler.entity_ref, pyscheduler.entity_ref,
    pyscheduler.job_name, integer, timestamptz, bigint) IS
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
