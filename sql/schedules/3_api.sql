-- pyscheduler: recurring schedules, the public API for users (create, update, pause, resume, trigger, delete, lists, runs).
-- The overview (SQLSTATEs, notifications, hardening) is at the top of 1_cron.sql; the
-- files of sql/schedules/ load in name order on every migrate.

-- ---------------------------------------------------------------- public: users

CREATE OR REPLACE FUNCTION pyscheduler.retry_worst_case(
    attempts integer DEFAULT 3, base interval DEFAULT '200 milliseconds', jitter_limit interval DEFAULT '500 milliseconds')
RETURNS interval
LANGUAGE plpgsql IMMUTABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* retry_worst_case(attempts => 3, base => '200 ms', jitter_limit => '500 ms') -> interval
   The longest a retried firing can take (the seed's formula): the sum over
   n = 0..attempts-1 of base * 2^n + jitter_limit. A recurrence must be at
   least this long. (3, 200 ms, 500 ms) -> 2.9 s.
   Errors: PS309 attempts outside 0..30, base or jitter_limit outside 0..1 hour
   (a schedule's retry policy) or NULL. */
BEGIN
    IF attempts IS NULL OR attempts NOT BETWEEN 0 AND 30
       OR base IS NULL OR base NOT BETWEEN interval '0' AND interval '1 hour'
       OR jitter_limit IS NULL OR jitter_limit NOT BETWEEN interval '0' AND interval '1 hour' THEN
        RAISE EXCEPTION 'retry policy must have attempts in 0..30, base and jitter_limit in 0..1 hour, got %, %, %',
                        attempts, base, jitter_limit
            USING ERRCODE = 'PS309', HINT = 'e.g. attempts => 3, base => ''200 milliseconds'', jitter_limit => ''500 milliseconds''.';
    END IF;
    RETURN base * ((1::bigint << attempts) - 1) + jitter_limit * attempts;
END
$$;
COMMENT ON FUNCTION pyscheduler.retry_worst_case(integer, interval, interval) IS
    'Worst-case duration of a retry policy: sum over n < attempts of base * 2^n + jitter_limit (3, 200 ms, 500 ms -> 2.9 s).';

CREATE OR REPLACE FUNCTION pyscheduler.next_cron_time(
    expr pyscheduler.cron_expr, after timestamptz DEFAULT NULL, tz pyscheduler.time_zone DEFAULT 'UTC')
RETURNS timestamptz
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* next_cron_time(expr, after => now(), tz => 'UTC') -> timestamptz
   The first time strictly after `after` at which the cron expression fires in
   time zone tz; NULL if it never fires within 30 years. 5 fields (minute hour
   day-of-month month day-of-week) or 6 (second first); lists, ranges, steps,
   names (JAN-DEC, SUN-SAT), 0 or 7 for Sunday, '?' as '*', macros @hourly
   @daily @midnight @weekly @monthly @yearly @annually. Day rule as Vixie cron:
   both day fields restricted -> either matches. Daylight saving: see
   docs/sql-api.md (fixed-time jobs fire once; '*' hour fields by elapsed time).
   `after` is a point in time to compute from, not a clock: this function
   changes nothing. NULL also when the next fire time would be after
   9999-01-01 (the supported range).
   Errors: PS301 expression, PS303 time zone, PS314 `after` outside
   [1970-01-01Z, 9999-01-01Z). */
DECLARE
    v_t timestamptz;
BEGIN
    PERFORM _require_instant('after', after, 'PS314');
    v_t := _cron_next(_cron_parse(expr), coalesce(after, now()), _tz_name(tz));
    RETURN CASE WHEN _instant_ok(v_t) THEN v_t END;
END
$$;
COMMENT ON FUNCTION pyscheduler.next_cron_time(pyscheduler.cron_expr, timestamptz, pyscheduler.time_zone) IS
    'First fire time of a cron expression (5 or 6 fields, Vixie day rule) strictly after `after`, in time zone tz.';

-- _insert_schedule(s, now): validate, compute the first run, insert, notify.
CREATE OR REPLACE FUNCTION pyscheduler._insert_schedule(s pyscheduler.schedules, p_now timestamptz)
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    v_row pyscheduler.schedules;
BEGIN
    PERFORM _check_label('PS310', 'name', s.name, 800, 200);  -- a NULL name: the domain schedule_name passes it
    s := _validate_schedule(s);
    s.runs_count := 0;
    s := _set_first_run(s, p_now, true);
    INSERT INTO schedules (name, every, cron, cron_spec, tz, start_at, end_at, max_runs, target_kind, target, priority,
                           payload, retry_attempts, retry_base, retry_jitter, critical, catchup_window, overlap,
                           paused, paused_note, next_run_at, created, updated, owner, ended_note, task_options)
    VALUES (s.name, s.every, s.cron, s.cron_spec, s.tz, s.start_at, s.end_at, s.max_runs, s.target_kind, s.target,
            s.priority, s.payload, s.retry_attempts, s.retry_base, s.retry_jitter, s.critical, s.catchup_window,
            s.overlap, s.paused, CASE WHEN s.paused THEN s.paused_note END, s.next_run_at, p_now, p_now,
            _caller(), s.ended_note, s.task_options)
    ON CONFLICT (name) DO NOTHING
    RETURNING * INTO v_row;
    IF v_row.id IS NULL THEN
        PERFORM _schedule_error('PS311', format('a schedule named %s already exists', quote_literal(s.name)),
                                'Use update_schedule() to change it, or delete_schedule() first.');
    END IF;
    RETURN _changed_json(v_row);
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.create_schedule(
    name pyscheduler.schedule_name, target pyscheduler.schedule_target DEFAULT NULL, every interval DEFAULT NULL,
    cron pyscheduler.cron_expr DEFAULT NULL, tz pyscheduler.time_zone DEFAULT 'UTC',
    target_kind pyscheduler.target_kind DEFAULT 'kafka', payload pyscheduler.schedule_payload DEFAULT '{}',
    priority bigint DEFAULT 50, start_at timestamptz DEFAULT NULL, end_at timestamptz DEFAULT NULL,
    max_runs bigint DEFAULT NULL, retry_attempts integer DEFAULT 3, retry_base interval DEFAULT '200 milliseconds',
    retry_jitter interval DEFAULT '500 milliseconds', critical boolean DEFAULT false,
    catchup_window interval DEFAULT '1 minute', overlap pyscheduler.schedule_overlap DEFAULT 'allow',
    paused boolean DEFAULT false, paused_note pyscheduler.schedule_note DEFAULT NULL,
    task_options pyscheduler.schedule_task_options DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* create_schedule(name, target, every | cron, tz => 'UTC', target_kind => 'kafka',
       payload => '{}', priority => 50, start_at, end_at, max_runs,
       retry_attempts => 3, retry_base => '200 ms', retry_jitter => '500 ms',
       critical => false, catchup_window => '1 minute', overlap => 'allow',
       paused => false, paused_note, task_options) -> schedule jsonb
   A new schedule; names are unique overall. Recurrence: exactly one of
   every (fixed interval, aligned to start_at or else to the Unix epoch) and
   cron (in tz). Target: kafka (topic; key = name), http (URL, POST) or task
   (queue; payload object = task spec, priority, overlap allow | skip |
   buffer_one; task_options {"max_attempts": 1..1000, "concurrency_key":
   text} = submit_task's of each task, NULL: none). First run: the first occurrence at or after now (and start_at).
   The schedule belongs to the calling role (owner): only it, its members and
   the admin role may change it or see its target, payload and errors.
   Errors: PS301 cron, PS302 not one of every/cron, PS303 tz, PS304 end_at,
   PS305 recurrence shorter than retry_worst_case, PS306 every, PS307 target
   (the egress policy for http), PS308 payload, PS309 retry, PS310 name,
   PS311 name taken, PS312 other (task_options: naming the key), PS313 cron never fires, PS314 start_at,
   end_at or the first run outside [1970-01-01Z, 9999-01-01Z). */
DECLARE
    s schedules;
BEGIN
    s.name := create_schedule.name; s.target := create_schedule.target; s.every := create_schedule.every;
    s.cron := create_schedule.cron; s.tz := create_schedule.tz; s.target_kind := create_schedule.target_kind;
    s.payload := create_schedule.payload; s.priority := create_schedule.priority;
    s.start_at := create_schedule.start_at; s.end_at := create_schedule.end_at; s.max_runs := create_schedule.max_runs;
    s.retry_attempts := create_schedule.retry_attempts; s.retry_base := create_schedule.retry_base;
    s.retry_jitter := create_schedule.retry_jitter; s.critical := create_schedule.critical;
    s.catchup_window := create_schedule.catchup_window; s.overlap := create_schedule.overlap;
    s.paused := create_schedule.paused; s.paused_note := create_schedule.paused_note;
    s.task_options := create_schedule.task_options;
    RETURN _insert_schedule(s, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.create_schedule(pyscheduler.schedule_name, pyscheduler.schedule_target, interval,
    pyscheduler.cron_expr, pyscheduler.time_zone, pyscheduler.target_kind, pyscheduler.schedule_payload, bigint,
    timestamptz, timestamptz, bigint, integer, interval, interval, boolean, interval, pyscheduler.schedule_overlap,
    boolean, pyscheduler.schedule_note, pyscheduler.schedule_task_options) IS
    'Create a schedule (every or cron in tz; kafka, http or task target; retry, catch-up, overlap, limits); returns it as JSON.';

CREATE OR REPLACE FUNCTION pyscheduler._update_schedule(s pyscheduler.schedules, p_new pyscheduler.schedules,
                                                       p_timing boolean, p_now timestamptz)
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    v_row pyscheduler.schedules;
BEGIN
    p_new := _validate_schedule(p_new);
    IF p_timing THEN
        p_new := _set_first_run(p_new, p_now, true);
    END IF;
    UPDATE schedules t
       SET every = p_new.every, cron = p_new.cron, cron_spec = p_new.cron_spec, tz = p_new.tz,
           start_at = p_new.start_at, end_at = p_new.end_at, max_runs = p_new.max_runs,
           target_kind = p_new.target_kind, target = p_new.target, priority = p_new.priority,
           payload = p_new.payload, retry_attempts = p_new.retry_attempts, retry_base = p_new.retry_base,
           retry_jitter = p_new.retry_jitter, critical = p_new.critical, catchup_window = p_new.catchup_window,
           overlap = p_new.overlap, task_options = p_new.task_options, next_run_at = p_new.next_run_at, ended_note = p_new.ended_note, updated = p_now
     WHERE t.id = s.id
    RETURNING * INTO v_row;
    RETURN _changed_json(v_row);
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.update_schedule(
    name pyscheduler.schedule_ref, target pyscheduler.schedule_target DEFAULT NULL, every interval DEFAULT NULL,
    cron pyscheduler.cron_expr DEFAULT NULL, tz pyscheduler.time_zone DEFAULT NULL,
    target_kind pyscheduler.target_kind DEFAULT NULL, payload pyscheduler.schedule_payload DEFAULT NULL,
    priority bigint DEFAULT NULL, start_at timestamptz DEFAULT NULL, end_at timestamptz DEFAULT NULL,
    max_runs bigint DEFAULT NULL, retry_attempts integer DEFAULT NULL, retry_base interval DEFAULT NULL,
    retry_jitter interval DEFAULT NULL, critical boolean DEFAULT NULL, catchup_window interval DEFAULT NULL,
    overlap pyscheduler.schedule_overlap DEFAULT NULL, task_options pyscheduler.schedule_task_options DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* update_schedule(name, <any create_schedule parameter> ...) -> schedule jsonb
   Changes the parameters given (NULL = unchanged). every replaces cron and
   vice versa. end_at => 'infinity' and start_at => '-infinity' remove the
   bound; max_runs => 0 removes the limit; task_options => '{}' removes
   the task options (a target_kind other than task needs that). When a timing parameter is given
   (every, cron, tz, start_at, end_at, max_runs) the next run is recomputed
   from now; otherwise it stays. Pausing: pause_schedule / resume_schedule.
   Only the owner, its members and admin may update a schedule.
   Errors: as create_schedule, PS300 unknown schedule, 42501 another role's. */
DECLARE
    s schedules := _owned_row(update_schedule.name);
    n schedules;
BEGIN
    n := s;
    IF update_schedule.every IS NOT NULL AND update_schedule.cron IS NOT NULL THEN
        PERFORM _schedule_error('PS302', 'give at most one of every and cron');
    ELSIF update_schedule.every IS NOT NULL THEN
        n.every := update_schedule.every; n.cron := NULL;
    ELSIF update_schedule.cron IS NOT NULL THEN
        n.cron := update_schedule.cron; n.every := NULL;
    END IF;
    n.tz := coalesce(update_schedule.tz, s.tz);
    n.target := coalesce(update_schedule.target, s.target);
    n.target_kind := coalesce(update_schedule.target_kind, s.target_kind);
    n.payload := coalesce(update_schedule.payload, s.payload);
    n.priority := coalesce(update_schedule.priority, s.priority);
    n.start_at := CASE WHEN update_schedule.start_at = '-infinity' THEN NULL ELSE coalesce(update_schedule.start_at, s.start_at) END;
    n.end_at := CASE WHEN update_schedule.end_at = 'infinity' THEN NULL ELSE coalesce(update_schedule.end_at, s.end_at) END;
    n.max_runs := CASE WHEN update_schedule.max_runs = 0 THEN NULL ELSE coalesce(update_schedule.max_runs, s.max_runs) END;
    n.retry_attempts := coalesce(update_schedule.retry_attempts, s.retry_attempts);
    n.retry_base := coalesce(update_schedule.retry_base, s.retry_base);
    n.retry_jitter := coalesce(update_schedule.retry_jitter, s.retry_jitter);
    n.critical := coalesce(update_schedule.critical, s.critical);
    n.catchup_window := coalesce(update_schedule.catchup_window, s.catchup_window);
    n.overlap := coalesce(update_schedule.overlap, s.overlap);
    n.task_options := coalesce(update_schedule.task_options, s.task_options);
    RETURN _update_schedule(s, n, num_nonnulls(update_schedule.every, update_schedule.cron, update_schedule.tz,
                                               update_schedule.start_at, update_schedule.end_at, update_schedule.max_runs) > 0,
                            now());
END
$$;
COMMENT ON FUNCTION pyscheduler.update_schedule(pyscheduler.schedule_ref, pyscheduler.schedule_target, interval,
    pyscheduler.cron_expr, pyscheduler.time_zone, pyscheduler.target_kind, pyscheduler.schedule_payload, bigint,
    timestamptz, timestamptz, bigint, integer, interval, interval, boolean, interval,
    pyscheduler.schedule_overlap, pyscheduler.schedule_task_options) IS
    'Change the given parameters of a schedule (NULL = unchanged); a timing change recomputes the next run from now.';

CREATE OR REPLACE FUNCTION pyscheduler.pause_schedule(
    name pyscheduler.schedule_ref, note pyscheduler.schedule_note DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* pause_schedule(name, note => NULL) -> schedule jsonb
   Stops regular firing (the index drops the schedule) until resume_schedule;
   the note says why (shown by schedules_paused). A pending trigger still
   fires. Pausing a paused schedule updates the note.
   Errors: PS300 unknown schedule, PS312 note (one line of at most 1000
   bytes), 42501 another role's schedule. */
DECLARE
    s schedules := _owned_row(pause_schedule.name);
BEGIN
    UPDATE schedules t SET paused = true, paused_note = pause_schedule.note, updated = now()
     WHERE t.id = s.id
    RETURNING * INTO s;
    RETURN _changed_json(s);
END
$$;
COMMENT ON FUNCTION pyscheduler.pause_schedule(pyscheduler.schedule_ref, pyscheduler.schedule_note) IS
    'Pause a schedule with an optional note; it stops firing until resume_schedule.';

CREATE OR REPLACE FUNCTION pyscheduler._resume_schedule(p_name text, p_now timestamptz)
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    s pyscheduler.schedules := _owned_row(p_name);
    v pyscheduler.schedules;
BEGIN
    IF s.paused THEN
        -- occurrences during the pause are skipped on purpose, not missed; an ended
        -- schedule stays ended
        v := CASE WHEN s.next_run_at IS NULL THEN s ELSE _set_first_run(s, p_now, false) END;
        UPDATE schedules t SET paused = false, paused_note = NULL, updated = p_now,
                               next_run_at = v.next_run_at, ended_note = v.ended_note
         WHERE t.id = s.id
        RETURNING * INTO s;
        PERFORM _schedule_changed(s.id);
    END IF;
    RETURN _schedule_json(s);
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.resume_schedule(name pyscheduler.schedule_ref)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* resume_schedule(name) -> schedule jsonb
   Fires again from the first occurrence at or after now: occurrences during
   the pause are skipped on purpose (neither fired nor counted as missed).
   Resuming a running schedule changes nothing.
   Errors: PS300, 42501 another role's schedule. */
BEGIN
    RETURN _resume_schedule(resume_schedule.name, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.resume_schedule(pyscheduler.schedule_ref) IS
    'Resume a paused schedule from the first occurrence at or after now.';

CREATE OR REPLACE FUNCTION pyscheduler._trigger_schedule(p_name text, p_now timestamptz)
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    s pyscheduler.schedules := _owned_row(p_name);
    v_at timestamptz := date_trunc('milliseconds', p_now);
BEGIN
    IF v_at = s.next_run_at THEN
        -- the regular occurrence's own millisecond (and idempotency key): a trigger
        -- there would be the same firing; one millisecond later it fires on its own
        v_at := v_at + interval '1 millisecond';
    END IF;
    UPDATE schedules t SET trigger_at = least(t.trigger_at, v_at)
     WHERE t.id = s.id
    RETURNING * INTO s;
    RETURN _changed_json(s);
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.trigger_schedule(name pyscheduler.schedule_ref)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* trigger_schedule(name) -> schedule jsonb
   Fire now, once, out of band: trigger_at = now; the index makes the
   schedule due at once; the regular next run does not move. Works on paused
   and ended schedules. The execution is recorded with triggered = true and
   does not count toward max_runs. Triggering again before it fired changes
   nothing. A trigger never shares the regular next run's millisecond (it
   moves 1 ms later), so it always fires on its own; a pending trigger that a
   regular occurrence later meets on the same millisecond fires with it, once.
   Errors: PS300, 42501 another role's schedule. */
BEGIN
    RETURN _trigger_schedule(trigger_schedule.name, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.trigger_schedule(pyscheduler.schedule_ref) IS
    'Fire a schedule now, once, out of band; the regular next run does not move.';

CREATE OR REPLACE FUNCTION pyscheduler.delete_schedule(name pyscheduler.schedule_ref)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* delete_schedule(name) -> boolean
   Deletes the schedule and its executions; false when there was none.
   Errors: 42501 another role's schedule. */
#variable_conflict use_column
DECLARE
    v_id bigint;
    v_owner name;
BEGIN
    SELECT t.id, t.owner INTO v_id, v_owner FROM schedules t WHERE t.name = delete_schedule.name FOR UPDATE;
    IF v_id IS NULL THEN
        RETURN false;
    END IF;
    PERFORM _require_owner(v_owner, format('schedule %s', quote_literal(delete_schedule.name)));
    DELETE FROM schedules t WHERE t.id = v_id;
    DELETE FROM schedule_executions e WHERE e.schedule_id = v_id;  -- no foreign key: their own delete
    PERFORM _schedule_changed(v_id);
    RETURN true;
END
$$;
COMMENT ON FUNCTION pyscheduler.delete_schedule(pyscheduler.schedule_ref) IS
    'Delete a schedule and its execution history; false when no such schedule.';

CREATE OR REPLACE FUNCTION pyscheduler.get_schedule(name pyscheduler.schedule_ref)
RETURNS jsonb
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* get_schedule(name) -> schedule jsonb
   The schedule: its parameters, next_run_at (NULL: ended), trigger_at,
   due_at (what the index holds), counts (runs, fired, failed, skipped,
   missed: kept across the purge of old executions), last outcome and error,
   owner, ended_note (why next_run_at is NULL). A caller that is not the
   owner, a member of it or admin gets it without target, payload and
   last_error. Errors: PS300. */
BEGIN
    RETURN _schedule_json(_schedule_row(get_schedule.name, false));
END
$$;
COMMENT ON FUNCTION pyscheduler.get_schedule(
    pyscheduler.schedule_ref) IS 'One schedule as JSON, with its counts; PS300 when unknown.';

CREATE OR REPLACE FUNCTION pyscheduler.list_schedules(
    name_like pyscheduler.name_pattern DEFAULT NULL, target_kind pyscheduler.target_kind DEFAULT NULL,
    paused boolean DEFAULT NULL, critical boolean DEFAULT NULL, max_schedules integer DEFAULT 100,
    after_name pyscheduler.schedule_ref DEFAULT NULL)
RETURNS TABLE (schedule jsonb)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
-- a page walks schedules_name_key (schedules_paused_name_idx for paused => true,
-- schedules_critical_name_idx for critical => true) from the cursor on and stops at
-- max_schedules: never a scan and sort of the whole table
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_indexscan = on
AS $$
/* list_schedules(name_like => NULL, target_kind => NULL, paused => NULL,
       critical => NULL, max_schedules => 100, after_name => NULL) -> setof (schedule jsonb)
   Schedules matching every filter given (name_like: a LIKE pattern), by name,
   at most max_schedules; those of other roles without target, payload and
   last_error (as get_schedule). Keyset pagination: pass the last name of a
   page as after_name to get the next one (names are unique and never change,
   so a walk returns every schedule once, even while others are created).
   A page reads the names from the cursor on in order (paused => true: only
   the paused ones; critical => true: only the critical ones); the other filters are checked on the way, so a filter
   that matches few of many schedules reads the ones it skips. A name_like
   that starts with a literal prefix ('daily-%') reads only the names with
   that prefix (schedules_name_pattern_idx), all of them for every page, and
   sorts them.
   Errors: PS312 max_schedules < 1. */
#variable_conflict use_column
DECLARE
    v_after text := coalesce(list_schedules.after_name, '');  -- '' sorts before every name
BEGIN
    IF max_schedules IS NULL OR max_schedules < 1 THEN
        PERFORM _schedule_error('PS312', format('max_schedules must be at least 1, got %s', coalesce(max_schedules::text, 'NULL')));
    END IF;
    IF list_schedules.name_like IS NOT NULL AND left(list_schedules.name_like, 1) NOT IN ('%', '_') THEN
        -- the pattern written into the query: the planner turns its literal prefix into a range of
        -- the pattern index (a parameter would leave it a filter, as in a cached generic plan). The
        -- names with the prefix are read whole, then sorted: read apart (MATERIALIZED, the cursor
        -- applied after), no order and no bound is left that schedules_name_key could serve, which
        -- the planner would otherwise walk from the cursor past every name before the prefix
        -- (issue 34)
        RETURN QUERY EXECUTE format(
            'WITH m AS MATERIALIZED (SELECT s FROM pyscheduler.schedules s WHERE s.name LIKE %L'
            '   AND ($2::text IS NULL OR s.target_kind = $2) AND ($3::boolean IS NULL OR s.paused = $3)'
            '   AND ($4::boolean IS NULL OR s.critical = $4))'
            ' SELECT pyscheduler._schedule_json(m.s) FROM m WHERE (m.s).name > $1 ORDER BY (m.s).name LIMIT $5',
            list_schedules.name_like)
        USING v_after, list_schedules.target_kind, list_schedules.paused, list_schedules.critical,
              list_schedules.max_schedules;
        RETURN;
    END IF;
    IF list_schedules.critical AND NOT coalesce(list_schedules.paused, false) THEN
        RETURN QUERY
        SELECT _schedule_json(s) FROM schedules s
         WHERE s.critical AND s.name > v_after
           AND (list_schedules.name_like IS NULL OR s.name LIKE list_schedules.name_like)
           AND (list_schedules.target_kind IS NULL OR s.target_kind = list_schedules.target_kind)
           AND (list_schedules.paused IS NULL OR s.paused = list_schedules.paused)
         ORDER BY s.name
         LIMIT max_schedules;
        RETURN;
    END IF;
    IF list_schedules.paused THEN
        RETURN QUERY
        SELECT _schedule_json(s) FROM schedules s
         WHERE s.paused AND s.name > v_after
           AND (list_schedules.name_like IS NULL OR s.name LIKE list_schedules.name_like)
           AND (list_schedules.target_kind IS NULL OR s.target_kind = list_schedules.target_kind)
           AND (list_schedules.critical IS NULL OR s.critical = list_schedules.critical)
         ORDER BY s.name
         LIMIT max_schedules;
        RETURN;
    END IF;
    RETURN QUERY
    SELECT _schedule_json(s) FROM schedules s
     WHERE s.name > v_after
       AND (list_schedules.name_like IS NULL OR s.name LIKE list_schedules.name_like)
       AND (list_schedules.target_kind IS NULL OR s.target_kind = list_schedules.target_kind)
       AND (list_schedules.paused IS NULL OR s.paused = list_schedules.paused)
       AND (list_schedules.critical IS NULL OR s.critical = list_schedules.critical)
     ORDER BY s.name
     LIMIT max_schedules;
END
$$;
COMMENT ON FUNCTION pyscheduler.list_schedules(pyscheduler.name_pattern, pyscheduler.target_kind, boolean, boolean,
    integer, pyscheduler.schedule_ref) IS
    'Schedules filtered by name pattern, target kind, paused and critical (NULL = any), by name; a page '
    'from after_name on (keyset).';

CREATE OR REPLACE FUNCTION pyscheduler.schedule_runs(
    name pyscheduler.schedule_ref, with_outcome pyscheduler.schedule_outcome DEFAULT NULL,
    since timestamptz DEFAULT NULL, max_runs integer DEFAULT 100, before timestamptz DEFAULT NULL)
RETURNS TABLE (expected_at timestamptz, outcome text, triggered boolean, attempts integer, fired_at timestamptz,
               lateness interval, missed_count bigint, error text, task_rn uuid)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
-- a page walks the primary key (schedule_id, expected_at) backwards from the cursor, or
-- schedule_executions_unfired_idx for an outcome other than fired
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_indexscan = on
AS $$
/* schedule_runs(name, with_outcome => NULL, since => NULL, max_runs => 100, before => NULL)
       -> setof record
   The schedule's recorded executions, newest expected time first: outcome
   (fired | failed | skipped_overlap | missed), triggered (out of band),
   attempts, fired_at (when recorded, database clock), lateness, missed_count
   (on 'missed' summary rows: how many occurrences), error, task_rn (task
   targets). Keyset pagination: pass the last expected_at of a page as before
   to get the next one. Executions older than the retention setting are
   purged; the counts in get_schedule survive. A caller that is not the owner,
   a member of it or admin gets error and task_rn as NULL.
   Errors: PS300 unknown schedule, PS312 max_runs < 1 or unknown outcome. */
#variable_conflict use_column
DECLARE
    s schedules := _schedule_row(schedule_runs.name, false);
    v_details boolean := _may_act(s.owner);
    v_lo timestamptz := coalesce(schedule_runs.since, '-infinity');
    v_hi timestamptz := coalesce(schedule_runs.before, 'infinity');
BEGIN
    IF schedule_runs.max_runs IS NULL OR schedule_runs.max_runs < 1 THEN
        PERFORM _schedule_error('PS312', format('max_runs must be at least 1, got %s', coalesce(schedule_runs.max_runs::text, 'NULL')));
    END IF;
    IF schedule_runs.with_outcome IS NOT NULL THEN
        PERFORM _check_outcome(schedule_runs.with_outcome);
    END IF;
    IF schedule_runs.with_outcome IS DISTINCT FROM 'fired' AND schedule_runs.with_outcome IS NOT NULL THEN
        RETURN QUERY
        SELECT e.expected_at, e.outcome, e.triggered, e.attempts, e.fired_at, e.lateness, e.missed_count,
               CASE WHEN v_details THEN e.error END, CASE WHEN v_details THEN e.task_rn END
          FROM schedule_executions e
         WHERE e.schedule_id = s.id AND e.outcome <> 'fired' AND e.outcome = schedule_runs.with_outcome
           AND e.expected_at >= v_lo AND e.expected_at < v_hi
         ORDER BY e.expected_at DESC
         LIMIT schedule_runs.max_runs;
        RETURN;
    END IF;
    RETURN QUERY
    SELECT e.expected_at, e.outcome, e.triggered, e.attempts, e.fired_at, e.lateness, e.missed_count,
           CASE WHEN v_details THEN e.error END, CASE WHEN v_details THEN e.task_rn END
      FROM schedule_executions e
     WHERE e.schedule_id = s.id
       AND (schedule_runs.with_outcome IS NULL OR e.outcome = schedule_runs.with_outcome)
       AND e.expected_at >= v_lo AND e.expected_at < v_hi
     ORDER BY e.expected_at DESC
     LIMIT schedule_runs.max_runs;
END
$$;
COMMENT ON FUNCTION pyscheduler.schedule_runs(pyscheduler.schedule_ref, pyscheduler.schedule_outcome, timestamptz,
    integer, timestamptz) IS
    'Recorded executions of a schedule, newest first (outcome, attempts, lateness, missed counts, errors); '
    'a page from before on (keyset).';

CREATE OR REPLACE FUNCTION pyscheduler.execution_count(
    name pyscheduler.schedule_ref, outcome pyscheduler.schedule_outcome DEFAULT 'fired')
RETURNS bigint
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* execution_count(name, outcome => 'fired') -> bigint
   How many occurrences of the schedule ended with this outcome: fired (the
   seed's "executed at least once"; each (schedule, expected time) counts
   once however often it was recorded), failed, skipped_overlap, missed, or
   'runs' (regular occurrences fired or failed: what max_runs limits). Kept
   in the schedule row, so purging old executions does not change it.
   Errors: PS300 unknown schedule, PS312 unknown outcome. */
DECLARE
    s schedules := _schedule_row(execution_count.name, false);
BEGIN
    PERFORM _check_outcome(execution_count.outcome, ARRAY['runs']);
    RETURN CASE execution_count.outcome
        WHEN 'fired' THEN s.fired_count WHEN 'failed' THEN s.failed_count
        WHEN 'skipped_overlap' THEN s.skipped_count WHEN 'missed' THEN s.missed_count
        ELSE s.runs_count END;
END
$$;
COMMENT ON FUNCTION pyscheduler.execution_count(pyscheduler.schedule_ref, pyscheduler.schedule_outcome) IS
    'How many occurrences of a schedule were fired (or failed, skipped_overlap, missed, runs); survives purging.';

CREATE OR REPLACE FUNCTION pyscheduler._upcoming_runs(
    p_name text, p_n integer, p_cron text, p_every interval, p_tz text, p_start_at timestamptz, p_now timestamptz)
RETURNS TABLE (run_at timestamptz)
LANGUAGE plpgsql STABLE
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    s pyscheduler.schedules;
    v_t timestamptz;
    v_runs bigint;
BEGIN
    IF p_n IS NULL OR p_n NOT BETWEEN 1 AND 10000 THEN
        PERFORM _schedule_error('PS312', format('n must be in 1..10000, got %s', coalesce(p_n::text, 'NULL')));
    END IF;
    IF p_name IS NOT NULL THEN
        s := _schedule_row(p_name, false);
        IF s.paused THEN
            RETURN;
        END IF;
        v_t := s.next_run_at;
    ELSE
        IF (p_every IS NULL) = (p_cron IS NULL) THEN
            PERFORM _schedule_error('PS302', 'give a schedule name, or exactly one of every and cron');
        END IF;
        s.every := p_every; s.cron := p_cron; s.tz := _tz_name(coalesce(p_tz, 'UTC'));
        s.start_at := nullif(p_start_at, '-infinity');
        PERFORM _require_instant('start_at', s.start_at, 'PS314');
        IF p_every IS NOT NULL THEN
            PERFORM _check_every(p_every);
        END IF;
        s.cron_spec := CASE WHEN p_cron IS NOT NULL THEN _cron_parse(p_cron) END;
        s.runs_count := 0;
        v_t := (_set_first_run(s, p_now, false)).next_run_at;
    END IF;
    v_runs := s.runs_count;
    FOR i IN 1 .. p_n LOOP
        EXIT WHEN v_t IS NULL OR NOT _instant_ok(v_t) OR (s.end_at IS NOT NULL AND v_t > s.end_at)
                  OR (s.max_runs IS NOT NULL AND v_runs >= s.max_runs);
        run_at := v_t;
        RETURN NEXT;
        v_runs := v_runs + 1;
        v_t := _next_occurrence(s, v_t);
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.upcoming_runs(
    name pyscheduler.schedule_ref DEFAULT NULL, n integer DEFAULT 10, cron pyscheduler.cron_expr DEFAULT NULL,
    every interval DEFAULT NULL, tz pyscheduler.time_zone DEFAULT 'UTC', start_at timestamptz DEFAULT NULL)
RETURNS TABLE (run_at timestamptz)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* upcoming_runs(name => NULL, n => 10, cron => NULL, every => NULL, tz => 'UTC',
       start_at => NULL) -> setof (run_at timestamptz)
   The next n regular fire times of a schedule (from its next run, honouring
   end_at and max_runs; none while paused), or of a recurrence not yet
   created (cron or every, tz, start_at: from now), so a user can check an
   expression before trusting it; none after 9999-01-01.
   Errors: PS300 unknown schedule, PS301 cron, PS302 neither or both of
   cron/every, PS303 tz, PS306 every, PS312 n outside 1..10000, PS314
   start_at outside [1970-01-01Z, 9999-01-01Z). */
BEGIN
    RETURN QUERY SELECT u.run_at FROM _upcoming_runs(upcoming_runs.name, upcoming_runs.n, upcoming_runs.cron,
                                                     upcoming_runs.every, upcoming_runs.tz, upcoming_runs.start_at, now()) u;
END
$$;
COMMENT ON FUNCTION pyscheduler.upcoming_runs(pyscheduler.schedule_ref, integer, pyscheduler.cron_expr, interval,
    pyscheduler.time_zone, timestamptz) IS
    'The next n fire times of a schedule, or of a cron/every recurrence before creating it.';
