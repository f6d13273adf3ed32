-- pyscheduler: recurring schedules, the model: helpers every function shares (checks of values, the JSON shape, due times, the next run).
-- The overview (SQLSTATEs, notifications, hardening) is at the top of 1_cron.sql; the
-- files of sql/schedules/ load in name order on every migrate.

-- ---------------------------------------------------------------- helpers

CREATE OR REPLACE FUNCTION pyscheduler._schedule_error(p_code text, p_message text, p_hint text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    RAISE EXCEPTION '%', p_message USING ERRCODE = p_code, HINT = coalesce(p_hint, '');
END
$$;

-- _tz_name(tz): the zone's name as the tz database spells it ('utc' -> 'UTC',
-- 'europe/berlin' -> 'Europe/Berlin'); PS303 unless tz is exactly an IANA zone name
-- PostgreSQL has (pg_timezone_names: no abbreviations such as PST, no POSIX rules such
-- as 'ABC-3' or 'ABC-3/x', which AT TIME ZONE would also accept).
CREATE OR REPLACE FUNCTION pyscheduler._tz_name(p_tz text)
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    v_name text;
BEGIN
    IF p_tz = 'UTC' THEN
        RETURN p_tz;  -- the default: no catalog scan (pg_timezone_names reads the tz files)
    END IF;
    IF octet_length(p_tz) <= 100 THEN
        SELECT z.name INTO v_name FROM pg_catalog.pg_timezone_names z WHERE lower(z.name) = lower(p_tz);
    END IF;
    IF v_name IS NULL THEN
        PERFORM _schedule_error('PS303', format('tz must be an IANA time zone name, got %s',
                                                coalesce(quote_literal(left(p_tz, 100)), 'NULL')),
                                'e.g. ''Europe/Berlin'', ''America/New_York'' or ''UTC'' (any case); SELECT name FROM pg_timezone_names lists them.');
    END IF;
    RETURN v_name;
END
$$;

-- _check_every(every): PS306 unless a whole number of milliseconds from 1 ms to
-- 36525 days (100 years) without months or years.
CREATE OR REPLACE FUNCTION pyscheduler._check_every(p_every interval)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    PERFORM _require_interval('every', p_every, interval '1 millisecond', interval '36525 days', 'PS306');
    IF extract(month FROM p_every) <> 0 OR extract(year FROM p_every) <> 0 OR _every_us(p_every) % 1000 <> 0 THEN
        PERFORM _schedule_error('PS306', format('every must be a positive whole number of milliseconds without months or years, got %s', p_every),
                                'Use a cron expression for calendar recurrences such as monthly.');
    END IF;
END
$$;

-- _check_outcome(outcome, also): PS312 unless an execution outcome (or one of `also`).
CREATE OR REPLACE FUNCTION pyscheduler._check_outcome(p_outcome text, p_also text[] DEFAULT '{}')
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    v_ok text[] := ARRAY['fired', 'failed', 'skipped_overlap', 'missed'] || p_also;
BEGIN
    IF p_outcome IS NULL OR NOT p_outcome = ANY (v_ok) THEN
        PERFORM _schedule_error('PS312', format('outcome must be %s or %s, got %s', array_to_string(v_ok[:cardinality(v_ok) - 1], ', '),
                                                v_ok[cardinality(v_ok)], coalesce(quote_literal(p_outcome), 'NULL')));
    END IF;
END
$$;

-- _every_us(every): the interval in microseconds (days count as 24 hours).
CREATE OR REPLACE FUNCTION pyscheduler._every_us(p_every interval)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT (extract(epoch FROM p_every) * 1000000)::bigint;
$$;

CREATE OR REPLACE FUNCTION pyscheduler._epoch_us(p_at timestamptz)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT (extract(epoch FROM p_at) * 1000000)::bigint;
$$;

-- _next_occurrence(s, after): the schedule's first regular occurrence strictly
-- after `after`, from start_at on (end_at and max_runs not applied). Interval
-- schedules: start_at + k * every (k >= 0), or the Unix epoch + k * every
-- without start_at (so 'every 1 hour' fires on the hour, UTC), by arithmetic.
CREATE OR REPLACE FUNCTION pyscheduler._next_occurrence(s pyscheduler.schedules, p_after timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_anchor bigint;
    v_every bigint;
    v_t bigint;
BEGIN
    IF s.start_at IS NOT NULL AND p_after < s.start_at THEN
        p_after := s.start_at - interval '1 microsecond';
    END IF;
    IF s.every IS NOT NULL THEN
        v_anchor := coalesce(_epoch_us(s.start_at), 0);
        v_every := _every_us(s.every);
        v_t := _epoch_us(p_after) - v_anchor;
        RETURN to_timestamp(0) + ((v_anchor + (div(v_t, v_every) + CASE WHEN v_t < 0 AND v_t % v_every <> 0 THEN 0 ELSE 1 END) * v_every)
                                  * interval '1 microsecond');
    END IF;
    RETURN _cron_next(s.cron_spec, p_after, s.tz);
END
$$;

-- _ended_note(s, next): why the schedule ends when `next` is its next regular
-- occurrence (NULL: it does not end): max_runs reached, end_at passed, or no
-- occurrence before 9999-01-01 (the range every client loads: a time after it
-- would stop whatever daemon loads it, so the schedule ends instead).
CREATE OR REPLACE FUNCTION pyscheduler._ended_note(s pyscheduler.schedules, p_next timestamptz)
RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT CASE
        WHEN s.max_runs IS NOT NULL AND s.runs_count >= s.max_runs THEN 'ended: max_runs reached'
        WHEN s.end_at IS NOT NULL AND p_next > s.end_at THEN 'ended: end_at passed'
        WHEN p_next IS NULL OR NOT pyscheduler._instant_ok(p_next)
            THEN 'ended: no occurrence before 9999-01-01T00:00:00Z (the supported range)'
    END;
$$;

-- _set_first_run(s, now, strict): s with next_run_at = the first occurrence at or
-- after now and ended_note (NULL, or why it ended at once). strict (create, a
-- timing update): a first occurrence after the supported range is refused (PS314)
-- rather than ending the schedule before it ever ran.
CREATE OR REPLACE FUNCTION pyscheduler._set_first_run(s pyscheduler.schedules, p_now timestamptz, p_strict boolean)
RETURNS pyscheduler.schedules
LANGUAGE plpgsql STABLE
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    v_next timestamptz := _next_occurrence(s, p_now - interval '1 microsecond');
BEGIN
    IF p_strict AND v_next IS NOT NULL AND NOT _instant_ok(v_next) THEN
        PERFORM _schedule_error('PS314', format('the first run (%s) would be after 9999-01-01T00:00:00Z', v_next),
                                'Instants must be in [1970-01-01T00:00:00Z, 9999-01-01T00:00:00Z): check start_at and the recurrence.');
    END IF;
    s.ended_note := _ended_note(s, v_next);
    s.next_run_at := CASE WHEN s.ended_note IS NULL THEN v_next END;
    RETURN s;
END
$$;

-- _check_label(code, field, text, max bytes, max characters): raise code unless text
-- is a label (pyscheduler._label_refusal: not blank, no leading or trailing white
-- space, no control, zero-width or bidi characters) within both limits: a schedule's name
-- at create (PS310; update cannot rename), NULL included, which the domain schedule_name of
-- the public functions' parameters lets through.
CREATE OR REPLACE FUNCTION pyscheduler._check_label(p_code text, p_field text, p_text text, p_max_bytes integer,
                                                    p_max_chars integer)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    v_why text := coalesce(_label_refusal(p_text, p_max_bytes),
                           CASE WHEN char_length(p_text) > p_max_chars THEN format('must be at most %s characters', p_max_chars) END);
BEGIN
    IF v_why IS NOT NULL THEN
        PERFORM _schedule_error(p_code, format('%s %s, got %s', p_field, v_why, coalesce(quote_literal(left(p_text, 220)), 'NULL')),
                                format('A %s is one line of printable characters without leading or trailing white space.', p_field));
    END IF;
END
$$;

-- _target_refusal(kind, target): why target may not be a target of that kind (NULL: it may).
CREATE OR REPLACE FUNCTION pyscheduler._target_refusal(p_kind text, p_target text)
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    IF p_target IS NULL THEN
        RETURN 'is missing';
    ELSIF p_kind = 'kafka' THEN
        -- Kafka's own rule for topic names
        IF p_target !~ '^[A-Za-z0-9._-]{1,249}$' OR p_target IN ('.', '..') THEN
            RETURN 'must be a Kafka topic name (1 to 249 of A-Z a-z 0-9 . _ -, not . or ..)';
        END IF;
    ELSIF p_kind = 'http' THEN
        RETURN _http_target_refusal(p_target);  -- the egress policy (sql/egress.sql)
    ELSE
        RETURN 'must be a task queue name: ' || _label_refusal(p_target, 40);  -- NULL when it is one
    END IF;
    RETURN NULL;
END
$$;

-- _check_task_options(kind, options): the options of the tasks a task target submits as
-- stored (JSON nulls left out, max_attempts a JSON integer; none -> NULL); PS312 naming the key
-- unless a JSON object of max_attempts (an integer in 1..1000) and concurrency_key (a label of
-- at most 200 bytes), submit_task's bounds, on a task target.
CREATE OR REPLACE FUNCTION pyscheduler._check_task_options(p_kind text, p_options jsonb)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    v_key text;
    v_value jsonb;
    v_why text;
BEGIN
    IF p_options IS NOT NULL AND jsonb_typeof(p_options) <> 'object' THEN
        PERFORM _schedule_error('PS312', format('task_options must be a JSON object, got %s', left(p_options::text, 100)),
                                'e.g. {"max_attempts": 3, "concurrency_key": "customer:42"}.');
    END IF;
    p_options := nullif(jsonb_strip_nulls(p_options), '{}');
    IF p_options IS NULL THEN
        RETURN NULL;
    ELSIF p_kind IS DISTINCT FROM 'task' THEN
        PERFORM _schedule_error('PS312', format('task_options (%s) are for a task target, not %s',
                                                (SELECT string_agg(left(k, 100), ', ' ORDER BY k)
                                                   FROM jsonb_object_keys(p_options) k),
                                                coalesce(p_kind, 'NULL')),
                                'Give no task_options, or ''{}'' to clear them on update.');
    END IF;
    FOR v_key, v_value IN SELECT * FROM jsonb_each(p_options) ORDER BY 1 LOOP
        v_why := CASE v_key
            WHEN 'max_attempts' THEN
                CASE WHEN NOT _json_integer_in(v_value, 1, 1000) THEN 'must be an integer in 1..1000 (as submit_task''s)' END
            WHEN 'concurrency_key' THEN
                CASE WHEN jsonb_typeof(v_value) <> 'string' THEN 'must be a JSON string'
                     ELSE _label_refusal(v_value #>> '{}', 200) END
            ELSE 'is not a task option (max_attempts, concurrency_key)' END;
        IF v_why IS NOT NULL THEN
            PERFORM _schedule_error('PS312', format('task_options.%s %s, got %s', left(v_key, 100), v_why,
                                                    left(v_value::text, 220)));
        END IF;
    END LOOP;
    RETURN jsonb_strip_nulls(jsonb_build_object('max_attempts', (p_options ->> 'max_attempts')::numeric::integer,
                                                'concurrency_key', p_options -> 'concurrency_key'));
END
$$;

-- _validate_schedule(s): check every field but the name (PS301-PS314), fill
-- cron_spec and normalise (tz spelling and default, payload default, the
-- infinite bounds that mean none). Returns the checked row.
CREATE OR REPLACE FUNCTION pyscheduler._validate_schedule(s pyscheduler.schedules)
RETURNS pyscheduler.schedules
LANGUAGE plpgsql STABLE
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    v_worst interval;
    v_gap interval;
    v_t timestamptz;
    v_prev timestamptz;
    v_why text;
BEGIN
    IF (s.every IS NULL) = (s.cron IS NULL) THEN
        PERFORM _schedule_error('PS302', 'give exactly one of every (an interval) and cron (an expression)',
                                'e.g. every => ''5 minutes'' or cron => ''*/5 * * * *''.');
    END IF;
    s.tz := _tz_name(coalesce(s.tz, 'UTC'));
    IF s.every IS NOT NULL THEN
        PERFORM _check_every(s.every);
        s.cron_spec := NULL;
    ELSE
        s.cron_spec := _cron_parse(s.cron);
        s.cron := btrim(s.cron, E' \t');
    END IF;
    s.start_at := nullif(s.start_at, '-infinity');
    s.end_at := nullif(s.end_at, 'infinity');
    PERFORM _require_instant('start_at', s.start_at, 'PS314'), _require_instant('end_at', s.end_at, 'PS314');
    s.start_at := date_trunc('milliseconds', s.start_at);  -- scores and idempotency keys are epoch ms
    IF s.start_at IS NOT NULL AND s.end_at IS NOT NULL AND s.end_at <= s.start_at THEN
        PERFORM _schedule_error('PS304', format('end_at (%s) must be after start_at (%s)', s.end_at, s.start_at));
    END IF;
    IF s.max_runs IS NOT NULL AND s.max_runs < 1 THEN
        PERFORM _schedule_error('PS312', format('max_runs must be at least 1 (NULL: no limit), got %s', s.max_runs));
    END IF;
    IF s.target_kind IS NULL OR s.target_kind NOT IN ('kafka', 'http', 'task') THEN
        PERFORM _schedule_error('PS307', format('target_kind must be kafka, http or task, got %s',
                                                coalesce(quote_literal(left(s.target_kind, 100)), 'NULL')));
    END IF;
    v_why := _target_refusal(s.target_kind, s.target);
    IF v_why IS NOT NULL THEN
        PERFORM _schedule_error('PS307', format('%s target %s: %s', s.target_kind,
                                                coalesce(quote_literal(left(s.target, 200)), 'NULL'), v_why),
                                CASE s.target_kind WHEN 'http' THEN 'The executor POSTs the payload to it with an Idempotency-Key header; '
                                                                    'an admin may allow internal networks with set_http_allow.' END);
    END IF;
    s.priority := coalesce(s.priority, 50);
    IF s.priority NOT BETWEEN 0 AND 4294967295 THEN
        PERFORM _schedule_error('PS312', format('priority must be in 0..4294967295, got %s', s.priority));
    END IF;
    s.overlap := coalesce(s.overlap, 'allow');
    IF s.overlap NOT IN ('allow', 'skip', 'buffer_one') THEN
        PERFORM _schedule_error('PS312', format('overlap must be allow, skip or buffer_one, got %s', quote_literal(left(s.overlap, 100))));
    END IF;
    s.payload := coalesce(s.payload, '{}');
    IF octet_length(s.payload::text) > _setting('schedules_max_payload_bytes')::integer THEN
        PERFORM _schedule_error('PS308', format('payload is %s bytes, more than the limit of %s bytes',
                                                octet_length(s.payload::text), _setting('schedules_max_payload_bytes')),
                                'Store large data elsewhere and pass a reference; the limit is the setting schedules_max_payload_bytes.');
    END IF;
    IF s.target_kind = 'task' AND jsonb_typeof(s.payload) <> 'object' THEN
        PERFORM _schedule_error('PS308', format('payload of a task target must be a JSON object (it becomes the task spec), got %s',
                                                left(s.payload::text, 100)));
    END IF;
    s.task_options := _check_task_options(s.target_kind, s.task_options);
    IF s.retry_attempts IS NULL OR s.retry_attempts NOT BETWEEN 0 AND 30 OR s.retry_base IS NULL OR s.retry_jitter IS NULL THEN
        PERFORM _schedule_error('PS309', format('retry policy must have retry_attempts in 0..30, retry_base and retry_jitter in 0..1 hour, got %s, %s, %s',
                                                s.retry_attempts, s.retry_base, s.retry_jitter));
    END IF;
    PERFORM _require_interval('retry_base', s.retry_base, interval '0', interval '1 hour', 'PS309'),
            _require_interval('retry_jitter', s.retry_jitter, interval '0', interval '1 hour', 'PS309');
    s.critical := coalesce(s.critical, false);
    -- at least the time an executor takes to claim a due occurrence: with less,
    -- almost every occurrence would be judged too late and recorded as missed
    IF s.catchup_window IS NULL THEN
        PERFORM _schedule_error('PS312', 'catchup_window must be given (from 1 second to 366 days)');
    END IF;
    PERFORM _require_interval('catchup_window', s.catchup_window, interval '1 second', interval '366 days', 'PS312');
    s.paused := coalesce(s.paused, false);
    -- the recurrence must outlast the retry policy's worst case (the seed's rule)
    v_worst := retry_worst_case(s.retry_attempts, s.retry_base, s.retry_jitter);
    IF s.every IS NOT NULL THEN
        v_gap := s.every;
    ELSE
        v_prev := _cron_next(s.cron_spec, coalesce(s.start_at, now()), s.tz);
        IF v_prev IS NULL THEN
            PERFORM _schedule_error('PS313', format('cron %s never fires', quote_literal(s.cron)),
                                    'A day that does not exist (e.g. 30 2 = February 30) never matches.');
        END IF;
        FOR i IN 1 .. 8 LOOP
            v_t := _cron_next(s.cron_spec, v_prev, s.tz);
            EXIT WHEN v_t IS NULL;
            v_gap := least(v_gap, v_t - v_prev);
            v_prev := v_t;
        END LOOP;
    END IF;
    IF v_gap < v_worst THEN
        PERFORM _schedule_error('PS305', format('recurrence (%s between runs) is shorter than the retry policy''s worst case (%s)',
                                                v_gap, v_worst),
                                'Lengthen the recurrence or shrink retry_attempts / retry_base / retry_jitter; see retry_worst_case().');
    END IF;
    RETURN s;
END
$$;

-- _schedule_json(s): a schedule as the API returns it. A caller that may not act
-- on it (_may_act(owner): not its owner, a member of the owner or admin) gets it
-- without target, payload, task_options and last_error (design.md: only the owner sees a
-- schedule's target details and errors).
CREATE OR REPLACE FUNCTION pyscheduler._schedule_json(s pyscheduler.schedules)
RETURNS jsonb
LANGUAGE sql STABLE
AS $$
    SELECT jsonb_build_object(
        'id', s.id, 'name', s.name, 'owner', s.owner, 'every', s.every, 'cron', s.cron, 'tz', s.tz,
        'start_at', s.start_at, 'end_at', s.end_at, 'max_runs', s.max_runs,
        'target_kind', s.target_kind, 'target', s.target, 'priority', s.priority, 'payload', s.payload,
        'task_options', s.task_options,
        'retry_attempts', s.retry_attempts, 'retry_base', s.retry_base, 'retry_jitter', s.retry_jitter,
        'critical', s.critical, 'catchup_window', s.catchup_window, 'overlap', s.overlap,
        'paused', s.paused, 'paused_note', s.paused_note, 'next_run_at', s.next_run_at,
        'trigger_at', s.trigger_at, 'due_at', s.due_at, 'ended_note', s.ended_note,
        'runs_count', s.runs_count, 'fired_count', s.fired_count, 'failed_count', s.failed_count,
        'skipped_count', s.skipped_count, 'missed_count', s.missed_count,
        'consecutive_failures', s.consecutive_failures, 'last_expected_at', s.last_expected_at,
        'last_outcome', s.last_outcome, 'last_error', s.last_error,
        'created', s.created, 'updated', s.updated)
        - CASE WHEN pyscheduler._may_act(s.owner) THEN '{}'::text[] ELSE ARRAY['target', 'payload', 'task_options', 'last_error'] END;
$$;

-- _schedule_row(name): the schedule FOR UPDATE, PS300 when unknown.
CREATE OR REPLACE FUNCTION pyscheduler._schedule_row(p_name text, p_lock boolean DEFAULT true)
RETURNS pyscheduler.schedules
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    s pyscheduler.schedules;
BEGIN
    IF p_lock THEN
        SELECT * INTO s FROM pyscheduler.schedules WHERE name = p_name FOR UPDATE;
    ELSE
        SELECT * INTO s FROM pyscheduler.schedules WHERE name = p_name;
    END IF;
    IF NOT FOUND THEN
        PERFORM pyscheduler._schedule_error('PS300', format('unknown schedule %s', coalesce(quote_literal(p_name), 'NULL')),
                                            'list_schedules() shows the schedules there are.');
    END IF;
    RETURN s;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler._schedule_changed(p_id bigint)
RETURNS void
LANGUAGE sql
AS $$
    SELECT pg_notify('pyscheduler_schedules', p_id::text);
$$;

-- _owned_row(name): the schedule FOR UPDATE, PS300 when unknown, 42501 unless the
-- caller may act on it (its owner, a member of the owner, or admin).
CREATE OR REPLACE FUNCTION pyscheduler._owned_row(p_name text)
RETURNS pyscheduler.schedules
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    s pyscheduler.schedules := _schedule_row(p_name);
BEGIN
    PERFORM _require_owner(s.owner, format('schedule %s', quote_literal(p_name)));
    RETURN s;
END
$$;

-- _changed_json(s): notify the change of s and return it as the API does.
CREATE OR REPLACE FUNCTION pyscheduler._changed_json(s pyscheduler.schedules)
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    PERFORM _schedule_changed(s.id);
    RETURN _schedule_json(s);
END
$$;

-- _advance(s, expected, now): after occurrence `expected` (the regular one)
-- was handled: the next occurrence, with the catch-up rule: occurrences before
-- now - catchup_window are not fired but counted as missed (missed, first_missed);
-- end_at, max_runs and the supported range end the schedule (next NULL,
-- ended_note why). s.runs_count must already count this occurrence. Cron
-- schedules count missed occurrences one by one, at most 10,000 (beyond that,
-- missed is a lower bound).
CREATE OR REPLACE FUNCTION pyscheduler._advance(
    s pyscheduler.schedules, p_expected timestamptz, p_now timestamptz,
    OUT next_run_at timestamptz, OUT missed bigint, OUT first_missed timestamptz, OUT ended_note text)
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_cutoff timestamptz := p_now - s.catchup_window;
    v_limit timestamptz;
    v_t timestamptz;
BEGIN
    missed := 0;
    next_run_at := _next_occurrence(s, p_expected);
    IF next_run_at IS NOT NULL AND next_run_at < v_cutoff THEN
        first_missed := next_run_at;
        -- missed: occurrences in [first_missed, least(cutoff, end_at + 1 us))
        v_limit := least(v_cutoff, s.end_at + interval '1 microsecond');
        IF s.every IS NOT NULL THEN
            v_t := _next_occurrence(s, v_cutoff - interval '1 microsecond');
            missed := greatest(0, (_epoch_us(least(v_t, v_limit)) - _epoch_us(first_missed) + _every_us(s.every) - 1) / _every_us(s.every));
            next_run_at := v_t;
        ELSE
            v_t := next_run_at;
            WHILE v_t IS NOT NULL AND v_t < v_cutoff AND missed < 10000 LOOP
                IF v_t < v_limit THEN
                    missed := missed + 1;
                END IF;
                v_t := _cron_next(s.cron_spec, v_t, s.tz);
            END LOOP;
            IF v_t IS NOT NULL AND v_t < v_cutoff THEN
                v_t := _cron_next(s.cron_spec, v_cutoff - interval '1 microsecond', s.tz);
            END IF;
            next_run_at := v_t;
        END IF;
        IF missed = 0 THEN
            first_missed := NULL;
        END IF;
    END IF;
    ended_note := _ended_note(s, next_run_at);
    IF ended_note IS NOT NULL THEN
        next_run_at := NULL;
    END IF;
END
$$;

-- _record_one(id, expected, outcome, attempts, error, token, task_rn, now):
-- record one execution and move the schedule on; the schedule row must be
-- locked by the caller (or is locked here). Returns (next due, recorded).
-- Outcome 'missed' (the executor judged the occurrence too late to fire)
-- joins the catch-up summary row. A token (Postgres-only claim) must match
-- the schedule's claim, else nothing is recorded.
CREATE OR REPLACE FUNCTION pyscheduler._record_one(
    p_id bigint, p_expected timestamptz, p_outcome text, p_attempts integer, p_error text,
    p_token uuid, p_task_rn uuid, p_now timestamptz,
    OUT due_at timestamptz, OUT recorded boolean)
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    s pyscheduler.schedules;
    v_regular boolean;
    v_triggered boolean;
    v_adv record;
BEGIN
    recorded := false;
    SELECT * INTO s FROM pyscheduler.schedules WHERE id = p_id FOR UPDATE;
    IF NOT FOUND OR p_expected IS NULL THEN
        RETURN;  -- deleted: nothing to record, the index drops it (due NULL)
    END IF;
    IF p_token IS NOT NULL AND s.claim_token IS DISTINCT FROM p_token THEN
        due_at := s.due_at;  -- not this caller's claim (expired and taken over)
        RETURN;
    END IF;
    PERFORM _check_outcome(p_outcome);
    v_regular := coalesce(p_expected = s.next_run_at, false);
    v_triggered := coalesce(p_expected = s.trigger_at, false) AND NOT v_regular;
    INSERT INTO pyscheduler.schedule_executions AS e
           (schedule_id, expected_at, outcome, triggered, attempts, fired_at, lateness, missed_count, error, task_rn)
    VALUES (p_id, p_expected, p_outcome, v_triggered, coalesce(p_attempts, 0), p_now, p_now - p_expected,
            CASE WHEN p_outcome = 'missed' THEN 1 END, left(p_error, 2000), p_task_rn)
    ON CONFLICT (schedule_id, expected_at) DO NOTHING;
    recorded := FOUND;
    IF recorded THEN
        s.fired_count := s.fired_count + (p_outcome = 'fired')::integer;
        s.failed_count := s.failed_count + (p_outcome = 'failed')::integer;
        s.skipped_count := s.skipped_count + (p_outcome = 'skipped_overlap')::integer;
        s.missed_count := s.missed_count + (p_outcome = 'missed')::integer;
        s.runs_count := s.runs_count + (v_regular AND p_outcome IN ('fired', 'failed'))::integer;
        s.consecutive_failures := CASE p_outcome WHEN 'failed' THEN s.consecutive_failures + 1
                                                 WHEN 'fired' THEN 0 ELSE s.consecutive_failures END;
        IF p_outcome IN ('fired', 'failed') THEN
            s.last_outcome := p_outcome;
            s.last_error := CASE WHEN p_outcome = 'failed' THEN left(p_error, 2000) END;
        END IF;
        s.last_expected_at := greatest(s.last_expected_at, p_expected);
    END IF;
    IF v_regular THEN
        v_adv := _advance(s, p_expected, p_now);
        s.next_run_at := v_adv.next_run_at;
        s.ended_note := v_adv.ended_note;
        IF v_adv.missed > 0 THEN
            s.missed_count := s.missed_count + v_adv.missed;
            IF p_outcome = 'missed' AND recorded THEN
                UPDATE pyscheduler.schedule_executions
                   SET missed_count = missed_count + v_adv.missed
                 WHERE schedule_id = p_id AND expected_at = p_expected;
            ELSE
                INSERT INTO pyscheduler.schedule_executions
                       (schedule_id, expected_at, outcome, triggered, attempts, fired_at, lateness, missed_count, error)
                VALUES (p_id, v_adv.first_missed, 'missed', false, 0, p_now, p_now - v_adv.first_missed, v_adv.missed,
                        format('%s occurrence(s) from %s missed: older than the catch-up window (%s)',
                               v_adv.missed, v_adv.first_missed, s.catchup_window))
                ON CONFLICT (schedule_id, expected_at) DO NOTHING;
            END IF;
        END IF;
    END IF;
    IF coalesce(p_expected = s.trigger_at, false) THEN
        s.trigger_at := NULL;
    END IF;
    IF p_token IS NOT NULL THEN
        s.claim_token := NULL;
        s.claimed_until := NULL;
    END IF;
    UPDATE pyscheduler.schedules t
       SET next_run_at = s.next_run_at, trigger_at = s.trigger_at, runs_count = s.runs_count,
           fired_count = s.fired_count, failed_count = s.failed_count, skipped_count = s.skipped_count,
           missed_count = s.missed_count, consecutive_failures = s.consecutive_failures,
           last_outcome = s.last_outcome, last_error = s.last_error, last_expected_at = s.last_expected_at,
           claim_token = s.claim_token, claimed_until = s.claimed_until, task_rns = s.task_rns,
           ended_note = s.ended_note
     WHERE t.id = p_id
    RETURNING t.due_at INTO due_at;
END
$$;

-- _poison(sqlstate): whether an error raised while recording one item is that
-- item's own (a data error: class 22, 23, 54 or 0A, or a PS code), so the item
-- ends alone; anything else (a timeout, a deadlock, a lost connection, a bug) is
-- not the item's and fails the whole call.
CREATE OR REPLACE FUNCTION pyscheduler._poison(p_sqlstate text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT p_sqlstate ~ '^(22|23|54|0A|PS)';
$$;

-- _stop_poisoned(id, expected, outcome, error, now): a schedule whose occurrence
-- could not be recorded (a stored value the recording cannot compute with) ends
-- alone: the occurrence is recorded with its outcome and the error, the schedule
-- is paused with a note and the error in last_error, its trigger and claim
-- dropped; its neighbours in the batch go on. Returns (due NULL, recorded).
CREATE OR REPLACE FUNCTION pyscheduler._stop_poisoned(
    p_id bigint, p_expected timestamptz, p_outcome text, p_error text, p_now timestamptz,
    OUT due_at timestamptz, OUT recorded boolean)
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    v_error text := left('schedule stopped: ' || p_error, 2000);
BEGIN
    INSERT INTO schedule_executions (schedule_id, expected_at, outcome, triggered, attempts, fired_at, lateness, error)
    SELECT p_id, p_expected, p_outcome, false, 0, p_now, p_now - p_expected, v_error
     WHERE EXISTS (SELECT 1 FROM schedules t WHERE t.id = p_id)
    ON CONFLICT (schedule_id, expected_at) DO NOTHING;
    recorded := FOUND;
    UPDATE schedules t
       SET paused = true, trigger_at = NULL, claim_token = NULL, claimed_until = NULL, updated = p_now,
           paused_note = 'stopped by pyscheduler: an occurrence could not be recorded (last_error says why); '
                         'fix the schedule with update_schedule, then resume it',
           last_error = v_error,
           fired_count = t.fired_count + (recorded AND p_outcome = 'fired')::integer,
           failed_count = t.failed_count + (recorded AND p_outcome = 'failed')::integer,
           skipped_count = t.skipped_count + (recorded AND p_outcome = 'skipped_overlap')::integer,
           missed_count = t.missed_count + (recorded AND p_outcome = 'missed')::integer
     WHERE t.id = p_id
    RETURNING t.due_at INTO due_at;
    IF FOUND THEN
        PERFORM _schedule_changed(p_id);
    END IF;
END
$$;

-- _check_batch(cardinalities...): PS312 when the array arguments given (not NULL) differ in length.
CREATE OR REPLACE FUNCTION pyscheduler._check_batch(VARIADIC p_lengths integer[])
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF (SELECT count(DISTINCT l) FROM unnest(p_lengths) l WHERE l IS NOT NULL) > 1 THEN
        PERFORM _schedule_error('PS312', format('the array arguments must have the same length, got %s', p_lengths));
    END IF;
END
$$;

-- _check_expected(expected): PS314 when an occurrence's expected time is outside the range the
-- daemons load ([1970-01-01Z, 9999-01-01Z)): it would be stored in schedule_executions and
-- answered back (a NULL one is skipped by the recording).
CREATE OR REPLACE FUNCTION pyscheduler._check_expected(p_expected timestamptz[])
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    v_bad timestamptz := (SELECT e FROM unnest(p_expected) e WHERE NOT _instant_ok(e) LIMIT 1);
BEGIN
    PERFORM _require_instant('expected', v_bad, 'PS314');
END
$$;
