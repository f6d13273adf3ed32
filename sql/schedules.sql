-- pyscheduler: recurring schedules (seeds/schedulinator.md). Reloaded on every migrate.
--
-- Postgres holds the truth: schedules and their executions (one row per
-- schedule and expected time). The daemons (pyscheduler/schedules) mirror due
-- times into a Redis sorted set, fire due schedules, and record executions
-- here; in degraded mode (Redis down) critical schedules are claimed here.
-- Public functions take no clock: tests call the private _name(..., p_now).
--
-- SQLSTATE codes (docs/sql-api.md, pyscheduler/errors.py):
--   PS300 unknown schedule            PS307 invalid target
--   PS301 cron does not parse         PS308 invalid payload (size, shape)
--   PS302 not exactly one of every/cron  PS309 invalid retry policy
--   PS303 unknown time zone           PS310 invalid name
--   PS304 end_at not after start_at   PS311 name already taken
--   PS305 recurrence shorter than the retry worst case
--   PS306 invalid interval (every)    PS312 other invalid argument
--   PS313 cron never fires            PS314 instant outside the supported range
--
-- Notifications: pyscheduler_schedules, payload = schedule id, on create,
-- update, pause, resume, trigger, delete (not on record: the executor gets
-- the new next run back and writes it itself).
--
-- Hardening (issue 15, design.md "SQL conventions"): every value the daemons
-- load is refused here when it is created (instants in [1970-01-01Z,
-- 9999-01-01Z), intervals bounded); a schedule whose next occurrence would
-- fall after that range ends (next_run_at NULL, ended_note says why); a batch
-- function ends a poison item alone; a schedule belongs to the role that
-- created it (owner): only _may_act(owner) changes it or sees its target,
-- payload and errors.

-- ---------------------------------------------------------------- cron
--
-- A parsed expression is bigint[7]: bit masks of allowed seconds (0-59),
-- minutes (0-59), hours (0-23), days of month (1-31), months (1-12), days of
-- week (0-6, Sunday 0), and flags: 1 day-of-month field starts with '*',
-- 2 day-of-week field starts with '*', 4 hour field starts with '*'.
-- Day rule as Vixie cron: when both day fields are restricted (neither starts
-- with '*'), a day matches if EITHER matches; otherwise both must (so
-- '*/10 * MON' is the Mondays that are the 1st, 11th, 21st or 31st).

-- _cron_bit(mask, n): the smallest allowed value >= n, or NULL.
CREATE OR REPLACE FUNCTION pyscheduler._cron_bit(p_mask bigint, p_n integer)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_n > 62 OR (p_mask >> p_n) = 0 THEN NULL
                ELSE p_n + round(ln(((p_mask >> p_n) & -(p_mask >> p_n))::float8) / ln(2::float8))::integer END;
$$;

-- _cron_field(text, field, lo, hi): the bit mask of one field; PS301 naming the field.
CREATE OR REPLACE FUNCTION pyscheduler._cron_field(p_text text, p_field text, p_lo integer, p_hi integer)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v_mask bigint := 0;
    v_part text;
    v_m text[];
    v_a integer;
    v_b integer;
    v_step integer;
    v_names text[] := CASE p_field
        WHEN 'month' THEN ARRAY['jan','feb','mar','apr','may','jun','jul','aug','sep','oct','nov','dec']
        WHEN 'day-of-week' THEN ARRAY['sun','mon','tue','wed','thu','fri','sat'] END;
    v_base integer := CASE p_field WHEN 'month' THEN 1 ELSE 0 END;
BEGIN
    IF p_text = '' THEN
        RAISE EXCEPTION 'cron % field is empty', p_field USING ERRCODE = 'PS301';
    END IF;
    FOREACH v_part IN ARRAY string_to_array(p_text, ',') LOOP
        v_m := regexp_match(v_part, '^(\*|\?|[a-z0-9]+)(?:-([a-z0-9]+))?(?:/([0-9]+))?$');
        IF v_m IS NULL OR (v_m[1] IN ('*', '?') AND v_m[2] IS NOT NULL) THEN
            RAISE EXCEPTION 'cron % field ''%'' does not parse', p_field, v_part
                USING ERRCODE = 'PS301',
                      HINT = format('Use numbers %s-%s%s, lists (1,5), ranges (1-5) and steps (*/15, 1-30/5).',
                                    p_lo, p_hi, CASE WHEN v_names IS NULL THEN ''
                                                     ELSE ' or names ' || v_names[1] || '..' || v_names[array_length(v_names, 1)] END);
        END IF;
        IF v_m[1] IN ('*', '?') THEN
            v_a := p_lo;
            v_b := p_hi;
        ELSE
            v_a := CASE WHEN v_m[1] ~ '^[0-9]{1,4}$' THEN v_m[1]::integer
                        ELSE array_position(v_names, v_m[1]) - 1 + v_base END;
            v_b := CASE WHEN v_m[2] IS NULL THEN CASE WHEN v_m[3] IS NULL THEN v_a ELSE p_hi END
                        WHEN v_m[2] ~ '^[0-9]{1,4}$' THEN v_m[2]::integer
                        ELSE array_position(v_names, v_m[2]) - 1 + v_base END;
        END IF;
        v_step := CASE WHEN v_m[3] ~ '^[0-9]{1,4}$' THEN v_m[3]::integer WHEN v_m[3] IS NULL THEN 1 ELSE 0 END;
        IF v_a IS NULL OR v_b IS NULL OR v_a < p_lo OR v_b > p_hi OR v_a > v_b OR v_step < 1 THEN
            RAISE EXCEPTION 'cron % field ''%'' is out of range (% to %, ranges low-high, step >= 1)',
                            p_field, v_part, p_lo, p_hi
                USING ERRCODE = 'PS301', HINT = 'Wrap-around ranges such as 22-2 are not supported: write 22-23,0-2.';
        END IF;
        FOR i IN 0 .. (v_b - v_a) / v_step LOOP
            v_mask := v_mask | (1::bigint << (v_a + i * v_step));
        END LOOP;
    END LOOP;
    RETURN v_mask;
END
$$;

-- _cron_parse(expr): the parsed form of a 5-field (minute hour day-of-month
-- month day-of-week) or 6-field (second first) expression, or a macro
-- (@yearly @annually @monthly @weekly @daily @midnight @hourly). PS301.
CREATE OR REPLACE FUNCTION pyscheduler._cron_parse(p_expr text)
RETURNS bigint[]
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v_expr text;
    v_f text[];
    v_dow bigint;
BEGIN
    -- fields are separated by spaces or tabs (crontab(5)); anything else that is not
    -- printable ASCII (a newline, a NUL, a bidi mark) would be read as an empty field
    IF octet_length(p_expr) > 1000 OR p_expr !~ '^[ -~\t]*$' THEN
        RAISE EXCEPTION 'cron must be at most 1000 bytes of printable ASCII, its fields separated by spaces or tabs, got %',
                        quote_literal(left(p_expr, 100))
            USING ERRCODE = 'PS301', HINT = 'No newline or other control character: e.g. ''*/15 * * * *''.';
    END IF;
    v_expr := lower(btrim(coalesce(p_expr, ''), E' \t'));
    v_expr := CASE v_expr
        WHEN '@yearly' THEN '0 0 1 1 *' WHEN '@annually' THEN '0 0 1 1 *'
        WHEN '@monthly' THEN '0 0 1 * *' WHEN '@weekly' THEN '0 0 * * 0'
        WHEN '@daily' THEN '0 0 * * *' WHEN '@midnight' THEN '0 0 * * *'
        WHEN '@hourly' THEN '0 * * * *' ELSE v_expr END;
    v_f := regexp_split_to_array(v_expr, '[ \t]+');
    IF v_expr = '' OR array_length(v_f, 1) NOT IN (5, 6) THEN
        RAISE EXCEPTION 'cron must have 5 fields (minute hour day-of-month month day-of-week) or 6 (second first), got ''%''',
                        coalesce(p_expr, 'NULL')
            USING ERRCODE = 'PS301', HINT = 'e.g. ''*/15 * * * *'' or ''30 0 9 * * MON-FRI''.';
    END IF;
    IF array_length(v_f, 1) = 5 THEN
        v_f := '0'::text || v_f;
    END IF;
    v_dow := pyscheduler._cron_field(v_f[6], 'day-of-week', 0, 7);
    RETURN ARRAY[
        pyscheduler._cron_field(v_f[1], 'second', 0, 59),
        pyscheduler._cron_field(v_f[2], 'minute', 0, 59),
        pyscheduler._cron_field(v_f[3], 'hour', 0, 23),
        pyscheduler._cron_field(v_f[4], 'day-of-month', 1, 31),
        pyscheduler._cron_field(v_f[5], 'month', 1, 12),
        (v_dow | (v_dow >> 7)) & 127,  -- 7 is Sunday too
        (CASE WHEN v_f[4] LIKE '*%' OR v_f[4] LIKE '?%' THEN 1 ELSE 0 END)
          | (CASE WHEN v_f[6] LIKE '*%' OR v_f[6] LIKE '?%' THEN 2 ELSE 0 END)
          | (CASE WHEN v_f[3] LIKE '*%' THEN 4 ELSE 0 END)];
END
$$;

-- _cron_next_wall(spec, after): the first wall-clock time strictly after
-- `after` (a timestamp without time zone) that matches, or NULL when none
-- within 30 years (e.g. February 30). Field by field: a field that does not
-- match moves to its next allowed value and resets the smaller fields.
CREATE OR REPLACE FUNCTION pyscheduler._cron_next_wall(p_spec bigint[], p_after timestamp)
RETURNS timestamp
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v_t timestamp := date_trunc('second', p_after) + interval '1 second';
    y integer := extract(year FROM v_t);
    mo integer := extract(month FROM v_t);
    d integer := extract(day FROM v_t);
    h integer := extract(hour FROM v_t);
    mi integer := extract(minute FROM v_t);
    s integer := extract(second FROM v_t);
    v_last_year integer := y + 30;
    v_dim integer;
    v_dow integer;
    v_n integer;
    v_or boolean := (p_spec[7] & 3) = 0;
BEGIN
    LOOP
        IF y > v_last_year THEN
            RETURN NULL;
        END IF;
        -- month
        IF (p_spec[5] >> mo) & 1 = 0 THEN
            v_n := pyscheduler._cron_bit(p_spec[5], mo + 1);
            IF v_n IS NULL THEN
                y := y + 1;
                v_n := pyscheduler._cron_bit(p_spec[5], 1);
            END IF;
            mo := v_n; d := 1; h := 0; mi := 0; s := 0;
            CONTINUE;
        END IF;
        -- day
        v_dim := CASE WHEN mo = 2 THEN CASE WHEN (y % 4 = 0 AND y % 100 <> 0) OR y % 400 = 0 THEN 29 ELSE 28 END
                      WHEN mo IN (4, 6, 9, 11) THEN 30 ELSE 31 END;
        v_dow := extract(dow FROM make_date(y, mo, least(d, v_dim)))::integer;
        WHILE d <= v_dim LOOP
            EXIT WHEN CASE WHEN v_or THEN (p_spec[4] >> d) & 1 = 1 OR (p_spec[6] >> v_dow) & 1 = 1
                           ELSE (p_spec[4] >> d) & 1 = 1 AND (p_spec[6] >> v_dow) & 1 = 1 END;
            d := d + 1; v_dow := (v_dow + 1) % 7; h := 0; mi := 0; s := 0;
        END LOOP;
        IF d > v_dim THEN
            mo := mo + 1; d := 1; h := 0; mi := 0; s := 0;
            IF mo > 12 THEN
                y := y + 1; mo := 1;
            END IF;
            CONTINUE;
        END IF;
        -- hour
        v_n := pyscheduler._cron_bit(p_spec[3], h);
        IF v_n IS NULL THEN
            d := d + 1; h := 0; mi := 0; s := 0;
            CONTINUE;
        ELSIF v_n > h THEN
            h := v_n; mi := 0; s := 0;
        END IF;
        -- minute
        v_n := pyscheduler._cron_bit(p_spec[2], mi);
        IF v_n IS NULL THEN
            h := h + 1; mi := 0; s := 0;
            CONTINUE;
        ELSIF v_n > mi THEN
            mi := v_n; s := 0;
        END IF;
        -- second
        v_n := pyscheduler._cron_bit(p_spec[1], s);
        IF v_n IS NULL THEN
            mi := mi + 1; s := 0;
            CONTINUE;
        END IF;
        RETURN make_timestamp(y, mo, d, h, mi, v_n);
    END LOOP;
END
$$;

-- _utc_offset(instant, tz): the zone's UTC offset at that instant.
CREATE OR REPLACE FUNCTION pyscheduler._utc_offset(p_at timestamptz, p_tz text)
RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT (p_at AT TIME ZONE p_tz) - (p_at AT TIME ZONE 'UTC');
$$;

-- _cron_next(spec, after, tz): the first fire time strictly after `after`.
-- Matching is on the wall clock of tz. Daylight saving:
--  * fixed-time jobs (hour field not starting with '*'): a wall time that does
--    not exist (spring forward) fires once at the first instant after the gap;
--    a wall time that happens twice (fall back) fires once, at the first;
--  * jobs whose hour field is '*' or '*/n' fire by elapsed time: wall times in
--    the gap do not exist, repeated wall times fire in both passes.
-- Assumes a zone changes offset at most once within 6 hours (true of tzdata).
CREATE OR REPLACE FUNCTION pyscheduler._cron_next(p_spec bigint[], p_after timestamptz, p_tz text)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_elapsed boolean := (p_spec[7] & 4) <> 0;
    v_wall timestamp := p_after AT TIME ZONE p_tz;
    v_l timestamp;
    v_u timestamptz;
    v_o1 interval;
    v_o2 interval;
    v_c1 timestamptz;
    v_c2 timestamptz;
    v_ok1 boolean;
    v_ok2 boolean;
    v_best timestamptz;
    v_lo timestamptz;
    v_hi timestamptz;
    v_mid timestamptz;
BEGIN
    FOR i IN 1 .. 100000 LOOP
        v_l := pyscheduler._cron_next_wall(p_spec, v_wall);
        IF v_l IS NULL THEN
            RETURN NULL;
        END IF;
        v_u := v_l AT TIME ZONE p_tz;
        v_o1 := pyscheduler._utc_offset(v_u - interval '6 hours', p_tz);
        v_o2 := pyscheduler._utc_offset(v_u + interval '6 hours', p_tz);
        IF v_o1 = v_o2 THEN
            IF v_u > p_after THEN
                v_best := v_u;
                EXIT;
            END IF;
        ELSE
            v_c1 := (v_l AT TIME ZONE 'UTC') - v_o1;
            v_c2 := (v_l AT TIME ZONE 'UTC') - v_o2;
            v_ok1 := pyscheduler._utc_offset(v_c1, p_tz) = v_o1;
            v_ok2 := pyscheduler._utc_offset(v_c2, p_tz) = v_o2;
            IF NOT v_ok1 AND NOT v_ok2 THEN
                -- in the gap: fixed-time jobs fire at the transition (the first
                -- instant after the gap); elapsed-time jobs have no such time
                IF NOT v_elapsed THEN
                    v_lo := least(v_c1, v_c2);
                    v_hi := greatest(v_c1, v_c2);
                    WHILE v_hi - v_lo > interval '1 second' LOOP
                        v_mid := v_lo + (v_hi - v_lo) / 2;
                        IF pyscheduler._utc_offset(v_mid, p_tz) = v_o2 THEN v_hi := v_mid; ELSE v_lo := v_mid; END IF;
                    END LOOP;
                    v_hi := date_trunc('second', v_hi);
                    IF pyscheduler._utc_offset(v_hi, p_tz) <> v_o2 THEN
                        v_hi := v_hi + interval '1 second';
                    END IF;
                    IF v_hi > p_after THEN
                        v_best := v_hi;
                        EXIT;
                    END IF;
                END IF;
            ELSIF v_ok1 AND v_ok2 THEN
                -- twice: fixed-time jobs the first time only
                IF least(v_c1, v_c2) > p_after THEN
                    v_best := least(v_c1, v_c2);
                    EXIT;
                ELSIF v_elapsed AND greatest(v_c1, v_c2) > p_after THEN
                    v_best := greatest(v_c1, v_c2);
                    EXIT;
                END IF;
            ELSE
                v_u := CASE WHEN v_ok1 THEN v_c1 ELSE v_c2 END;
                IF v_u > p_after THEN
                    v_best := v_u;
                    EXIT;
                END IF;
            END IF;
        END IF;
        v_wall := v_l;
    END LOOP;
    -- elapsed-time jobs: when the clock fell back between `after` and the
    -- candidate, the repeated wall times come first
    IF v_elapsed AND v_best IS NOT NULL THEN
        v_o1 := pyscheduler._utc_offset(p_after, p_tz);
        v_o2 := pyscheduler._utc_offset(v_best, p_tz);
        IF v_o2 < v_o1 THEN
            v_lo := p_after;
            v_hi := v_best;
            WHILE v_hi - v_lo > interval '1 second' LOOP
                v_mid := v_lo + (v_hi - v_lo) / 2;
                IF pyscheduler._utc_offset(v_mid, p_tz) = v_o2 THEN v_hi := v_mid; ELSE v_lo := v_mid; END IF;
            END LOOP;
            -- v_hi: (within a second of) the transition; wall times from there on, new offset
            v_l := pyscheduler._cron_next_wall(p_spec, (greatest(v_hi, p_after) AT TIME ZONE p_tz) - interval '1 second');
            IF v_l IS NOT NULL THEN
                v_u := (v_l AT TIME ZONE 'UTC') - v_o2;
                IF v_u > p_after AND v_u < v_best AND pyscheduler._utc_offset(v_u, p_tz) = v_o2 THEN
                    v_best := v_u;
                END IF;
            END IF;
        END IF;
    END IF;
    RETURN v_best;
END
$$;

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
-- space, no control, zero-width or bidi characters) within both limits. Names (PS310,
-- checked at create: update cannot rename) and notes (PS312, NULL allowed).
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
-- without target, payload and last_error (design.md: only the owner sees a
-- schedule's target details and errors).
CREATE OR REPLACE FUNCTION pyscheduler._schedule_json(s pyscheduler.schedules)
RETURNS jsonb
LANGUAGE sql STABLE
AS $$
    SELECT jsonb_build_object(
        'id', s.id, 'name', s.name, 'owner', s.owner, 'every', s.every, 'cron', s.cron, 'tz', s.tz,
        'start_at', s.start_at, 'end_at', s.end_at, 'max_runs', s.max_runs,
        'target_kind', s.target_kind, 'target', s.target, 'priority', s.priority, 'payload', s.payload,
        'retry_attempts', s.retry_attempts, 'retry_base', s.retry_base, 'retry_jitter', s.retry_jitter,
        'critical', s.critical, 'catchup_window', s.catchup_window, 'overlap', s.overlap,
        'paused', s.paused, 'paused_note', s.paused_note, 'next_run_at', s.next_run_at,
        'trigger_at', s.trigger_at, 'due_at', s.due_at, 'ended_note', s.ended_note,
        'runs_count', s.runs_count, 'fired_count', s.fired_count, 'failed_count', s.failed_count,
        'skipped_count', s.skipped_count, 'missed_count', s.missed_count,
        'consecutive_failures', s.consecutive_failures, 'last_expected_at', s.last_expected_at,
        'last_outcome', s.last_outcome, 'last_error', s.last_error,
        'created', s.created, 'updated', s.updated)
        - CASE WHEN pyscheduler._may_act(s.owner) THEN '{}'::text[] ELSE ARRAY['target', 'payload', 'last_error'] END;
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
   Errors: PS309 attempts outside 0..30, base or jitter_limit negative or NULL. */
BEGIN
    IF attempts IS NULL OR attempts NOT BETWEEN 0 AND 30 OR base IS NULL OR base < interval '0'
       OR jitter_limit IS NULL OR jitter_limit < interval '0' THEN
        RAISE EXCEPTION 'retry policy must have attempts in 0..30, base >= 0, jitter_limit >= 0, got %, %, %',
                        attempts, base, jitter_limit
            USING ERRCODE = 'PS309', HINT = 'e.g. attempts => 3, base => ''200 milliseconds'', jitter_limit => ''500 milliseconds''.';
    END IF;
    RETURN base * ((1::bigint << attempts) - 1) + jitter_limit * attempts;
END
$$;
COMMENT ON FUNCTION pyscheduler.retry_worst_case(integer, interval, interval) IS
    'Worst-case duration of a retry policy: sum over n < attempts of base * 2^n + jitter_limit (3, 200 ms, 500 ms -> 2.9 s).';

CREATE OR REPLACE FUNCTION pyscheduler.next_cron_time(
    expr text, after timestamptz DEFAULT NULL, tz text DEFAULT 'UTC')
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
COMMENT ON FUNCTION pyscheduler.next_cron_time(text, timestamptz, text) IS
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
    PERFORM _check_label('PS310', 'name', s.name, 800, 200);
    IF s.paused_note IS NOT NULL THEN
        PERFORM _check_label('PS312', 'paused_note', s.paused_note, 1000, 1000);
    END IF;
    s := _validate_schedule(s);
    s.runs_count := 0;
    s := _set_first_run(s, p_now, true);
    INSERT INTO schedules (name, every, cron, cron_spec, tz, start_at, end_at, max_runs, target_kind, target, priority,
                           payload, retry_attempts, retry_base, retry_jitter, critical, catchup_window, overlap,
                           paused, paused_note, next_run_at, created, updated, owner, ended_note)
    VALUES (s.name, s.every, s.cron, s.cron_spec, s.tz, s.start_at, s.end_at, s.max_runs, s.target_kind, s.target,
            s.priority, s.payload, s.retry_attempts, s.retry_base, s.retry_jitter, s.critical, s.catchup_window,
            s.overlap, s.paused, CASE WHEN s.paused THEN s.paused_note END, s.next_run_at, p_now, p_now,
            _caller(), s.ended_note)
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
    name text, target text DEFAULT NULL, every interval DEFAULT NULL, cron text DEFAULT NULL, tz text DEFAULT 'UTC',
    target_kind text DEFAULT 'kafka', payload jsonb DEFAULT '{}', priority bigint DEFAULT 50,
    start_at timestamptz DEFAULT NULL, end_at timestamptz DEFAULT NULL, max_runs bigint DEFAULT NULL,
    retry_attempts integer DEFAULT 3, retry_base interval DEFAULT '200 milliseconds',
    retry_jitter interval DEFAULT '500 milliseconds', critical boolean DEFAULT false,
    catchup_window interval DEFAULT '1 minute', overlap text DEFAULT 'allow',
    paused boolean DEFAULT false, paused_note text DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* create_schedule(name, target, every | cron, tz => 'UTC', target_kind => 'kafka',
       payload => '{}', priority => 50, start_at, end_at, max_runs,
       retry_attempts => 3, retry_base => '200 ms', retry_jitter => '500 ms',
       critical => false, catchup_window => '1 minute', overlap => 'allow',
       paused => false, paused_note) -> schedule jsonb
   A new schedule; names are unique overall. Recurrence: exactly one of
   every (fixed interval, aligned to start_at or else to the Unix epoch) and
   cron (in tz). Target: kafka (topic; key = name), http (URL, POST) or task
   (queue; payload object = task spec, priority, overlap allow | skip |
   buffer_one). First run: the first occurrence at or after now (and start_at).
   The schedule belongs to the calling role (owner): only it, its members and
   the admin role may change it or see its target, payload and errors.
   Errors: PS301 cron, PS302 not one of every/cron, PS303 tz, PS304 end_at,
   PS305 recurrence shorter than retry_worst_case, PS306 every, PS307 target
   (the egress policy for http), PS308 payload, PS309 retry, PS310 name,
   PS311 name taken, PS312 other, PS313 cron never fires, PS314 start_at,
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
    RETURN _insert_schedule(s, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.create_schedule(text, text, interval, text, text, text, jsonb, bigint, timestamptz,
    timestamptz, bigint, integer, interval, interval, boolean, interval, text, boolean, text) IS
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
           overlap = p_new.overlap, next_run_at = p_new.next_run_at, ended_note = p_new.ended_note, updated = p_now
     WHERE t.id = s.id
    RETURNING * INTO v_row;
    RETURN _changed_json(v_row);
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.update_schedule(
    name text, target text DEFAULT NULL, every interval DEFAULT NULL, cron text DEFAULT NULL, tz text DEFAULT NULL,
    target_kind text DEFAULT NULL, payload jsonb DEFAULT NULL, priority bigint DEFAULT NULL,
    start_at timestamptz DEFAULT NULL, end_at timestamptz DEFAULT NULL, max_runs bigint DEFAULT NULL,
    retry_attempts integer DEFAULT NULL, retry_base interval DEFAULT NULL, retry_jitter interval DEFAULT NULL,
    critical boolean DEFAULT NULL, catchup_window interval DEFAULT NULL, overlap text DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* update_schedule(name, <any create_schedule parameter> ...) -> schedule jsonb
   Changes the parameters given (NULL = unchanged). every replaces cron and
   vice versa. end_at => 'infinity' and start_at => '-infinity' remove the
   bound; max_runs => 0 removes the limit. When a timing parameter is given
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
    RETURN _update_schedule(s, n, num_nonnulls(update_schedule.every, update_schedule.cron, update_schedule.tz,
                                               update_schedule.start_at, update_schedule.end_at, update_schedule.max_runs) > 0,
                            now());
END
$$;
COMMENT ON FUNCTION pyscheduler.update_schedule(text, text, interval, text, text, text, jsonb, bigint, timestamptz,
    timestamptz, bigint, integer, interval, interval, boolean, interval, text) IS
    'Change the given parameters of a schedule (NULL = unchanged); a timing change recomputes the next run from now.';

CREATE OR REPLACE FUNCTION pyscheduler.pause_schedule(name text, note text DEFAULT NULL)
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
    IF pause_schedule.note IS NOT NULL THEN
        PERFORM _check_label('PS312', 'note', pause_schedule.note, 1000, 1000);
    END IF;
    UPDATE schedules t SET paused = true, paused_note = pause_schedule.note, updated = now()
     WHERE t.id = s.id
    RETURNING * INTO s;
    RETURN _changed_json(s);
END
$$;
COMMENT ON FUNCTION pyscheduler.pause_schedule(text, text) IS
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

CREATE OR REPLACE FUNCTION pyscheduler.resume_schedule(name text)
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
COMMENT ON FUNCTION pyscheduler.resume_schedule(text) IS
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

CREATE OR REPLACE FUNCTION pyscheduler.trigger_schedule(name text)
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
COMMENT ON FUNCTION pyscheduler.trigger_schedule(text) IS
    'Fire a schedule now, once, out of band; the regular next run does not move.';

CREATE OR REPLACE FUNCTION pyscheduler.delete_schedule(name text)
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
COMMENT ON FUNCTION pyscheduler.delete_schedule(text) IS
    'Delete a schedule and its execution history; false when no such schedule.';

CREATE OR REPLACE FUNCTION pyscheduler.get_schedule(name text)
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
COMMENT ON FUNCTION pyscheduler.get_schedule(text) IS 'One schedule as JSON, with its counts; PS300 when unknown.';

CREATE OR REPLACE FUNCTION pyscheduler.list_schedules(
    name_like text DEFAULT NULL, target_kind text DEFAULT NULL, paused boolean DEFAULT NULL,
    critical boolean DEFAULT NULL, max_schedules integer DEFAULT 100, after_name text DEFAULT NULL)
RETURNS TABLE (schedule jsonb)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
-- a page walks schedules_name_key (schedules_paused_name_idx for paused => true) from the
-- cursor on and stops at max_schedules: never a scan and sort of the whole table
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
   the paused ones); the other filters are checked on the way, so a filter
   that matches few of many schedules reads the ones it skips.
   Errors: PS312 max_schedules < 1. */
#variable_conflict use_column
DECLARE
    v_after text := coalesce(list_schedules.after_name, '');  -- '' sorts before every name
BEGIN
    IF max_schedules IS NULL OR max_schedules < 1 THEN
        PERFORM _schedule_error('PS312', format('max_schedules must be at least 1, got %s', coalesce(max_schedules::text, 'NULL')));
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
COMMENT ON FUNCTION pyscheduler.list_schedules(text, text, boolean, boolean, integer, text) IS
    'Schedules filtered by name pattern, target kind, paused and critical (NULL = any), by name; a page '
    'from after_name on (keyset).';

CREATE OR REPLACE FUNCTION pyscheduler.schedule_runs(
    name text, with_outcome text DEFAULT NULL, since timestamptz DEFAULT NULL, max_runs integer DEFAULT 100,
    before timestamptz DEFAULT NULL)
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
COMMENT ON FUNCTION pyscheduler.schedule_runs(text, text, timestamptz, integer, timestamptz) IS
    'Recorded executions of a schedule, newest first (outcome, attempts, lateness, missed counts, errors); '
    'a page from before on (keyset).';

CREATE OR REPLACE FUNCTION pyscheduler.execution_count(name text, outcome text DEFAULT 'fired')
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
COMMENT ON FUNCTION pyscheduler.execution_count(text, text) IS
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
    name text DEFAULT NULL, n integer DEFAULT 10, cron text DEFAULT NULL, every interval DEFAULT NULL,
    tz text DEFAULT 'UTC', start_at timestamptz DEFAULT NULL)
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
COMMENT ON FUNCTION pyscheduler.upcoming_runs(text, integer, text, interval, text, timestamptz) IS
    'The next n fire times of a schedule, or of a cron/every recurrence before creating it.';

-- ---------------------------------------------------------------- daemons (scheduler role)

CREATE OR REPLACE FUNCTION pyscheduler.index_entries(p_ids bigint[])
RETURNS TABLE (id bigint, next_run_at timestamptz, critical boolean, active boolean, updated timestamptz)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
    /* index_entries(p_ids) -> setof (id, next_run_at, critical, active, updated)
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
      FROM unnest(p_ids) AS u(id)
      LEFT JOIN schedules s ON s.id = u.id;
$$;
COMMENT ON FUNCTION pyscheduler.index_entries(bigint[]) IS
    'Scheduler: index state (due time, critical, active) of the given schedule ids; inactive -> remove.';

CREATE OR REPLACE FUNCTION pyscheduler.index_page(p_after bigint DEFAULT 0, p_limit integer DEFAULT 1000)
RETURNS TABLE (id bigint, next_run_at timestamptz, critical boolean, updated timestamptz)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* index_page(p_after => 0, p_limit => 1000) -> setof (id, next_run_at, critical, updated)
   Active schedules (with a due time) with id > p_after, by id: the periodic
   reconcile walks them page by page. As index_entries, next_run_at is NULL
   for a due time outside [1970-01-01Z, 9999-01-01Z) (not indexable) and
   updated NULL outside it. Errors: PS312 p_limit outside 1..100000. */
BEGIN
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 100000 THEN
        PERFORM _schedule_error('PS312', format('p_limit must be in 1..100000, got %s', coalesce(p_limit::text, 'NULL')));
    END IF;
    RETURN QUERY
    SELECT s.id, CASE WHEN pyscheduler._instant_ok(s.due_at) THEN s.due_at END, s.critical,
           CASE WHEN pyscheduler._instant_ok(s.updated) THEN s.updated END
      FROM schedules s
     WHERE s.id > coalesce(p_after, 0) AND s.due_at IS NOT NULL
     ORDER BY s.id
     LIMIT p_limit;
END
$$;
COMMENT ON FUNCTION pyscheduler.index_page(bigint, integer) IS
    'Scheduler: a page of active schedules (id > p_after, by id) for reconciling the index.';

CREATE OR REPLACE FUNCTION pyscheduler.resync_take(p_sync_id text, p_owner text, p_limit integer DEFAULT 1000,
                                                   p_lease interval DEFAULT '30 seconds')
RETURNS TABLE (id bigint, next_run_at timestamptz, critical boolean, updated timestamptz)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* resync_take(p_sync_id, p_owner, p_limit => 1000, p_lease => '30 seconds')
       -> setof (id, next_run_at, critical, updated)
   The seed's optimistic resync after Redis lost its data: every taker (an
   executor, the resync command) that sees the new sync id calls this, writes
   the rows to Redis, and calls again, until it returns no rows and
   resync_progress says complete. Each call first acknowledges the caller's
   previous batch (p_owner names the caller: unique per taker; calling again
   means the batch is written), then hands out the next p_limit active
   schedules of this sync id, critical schedules first, then by id, leased to
   the caller for p_lease. A lease not acknowledged in time (its taker died
   between the take and the write) is handed out again to the next caller,
   re-read, so no batch is lost. The version key is kept per sync id and key
   range (a cursor row locked for the hand-out, one lease row per batch)
   rather than per schedule row, so a resync of a million schedules writes a
   row per batch, not a million. No rows while others' leases are still out:
   call again later (an expired one comes back). next_run_at and updated as
   index_page (NULL outside [1970-01-01Z, 9999-01-01Z)).
   Errors: PS312 empty sync id or owner, p_limit outside 1..100000, p_lease
   outside 1 ms..1 day. */
#variable_conflict use_column
DECLARE
    r _schedule_resyncs;
    l _schedule_resync_leases;
    v_ids bigint[];
    v_due timestamptz[];
    v_critical boolean[];
    v_updated timestamptz[];
BEGIN
    IF p_sync_id IS NULL OR p_sync_id = '' OR p_owner IS NULL OR p_owner = '' OR p_limit IS NULL
       OR p_limit NOT BETWEEN 1 AND 100000 OR p_lease IS NULL
       OR p_lease NOT BETWEEN interval '1 millisecond' AND interval '1 day' THEN
        PERFORM _schedule_error('PS312', format(
            'p_sync_id and p_owner must be non-empty, p_limit in 1..100000 and p_lease in 1 ms..1 day, got %s, %s, %s and %s',
            coalesce(quote_literal(p_sync_id), 'NULL'), coalesce(quote_literal(p_owner), 'NULL'),
            coalesce(p_limit::text, 'NULL'), coalesce(p_lease::text, 'NULL')));
    END IF;
    INSERT INTO _schedule_resyncs (sync_id, done_critical, after_id, done, total, started)
    SELECT p_sync_id, false, 0, 0, (SELECT count(*) FROM schedules s WHERE s.due_at IS NOT NULL), now()
     WHERE NOT EXISTS (SELECT 1 FROM _schedule_resyncs x WHERE x.sync_id = p_sync_id)
    ON CONFLICT (sync_id) DO NOTHING;
    -- forget resyncs of long ago
    DELETE FROM _schedule_resync_leases x
     WHERE x.sync_id IN (SELECT y.sync_id FROM _schedule_resyncs y WHERE y.started < now() - interval '7 days');
    DELETE FROM _schedule_resyncs x WHERE x.started < now() - interval '7 days';
    SELECT * INTO r FROM _schedule_resyncs x WHERE x.sync_id = p_sync_id FOR UPDATE;
    -- the caller's previous batch is in Redis: it calls again only after writing it
    WITH acked AS (DELETE FROM _schedule_resync_leases x WHERE x.sync_id = p_sync_id AND x.owner = p_owner
                   RETURNING x.n)
    UPDATE _schedule_resyncs x SET done = x.done + (SELECT coalesce(sum(a.n), 0) FROM acked a)
     WHERE x.sync_id = p_sync_id;
    -- a range whose taker did not acknowledge it in time: taken again, as it is now
    SELECT * INTO l FROM _schedule_resync_leases x WHERE x.sync_id = p_sync_id AND x.until < now()
     ORDER BY x.critical DESC, x.after_id LIMIT 1;
    IF FOUND THEN
        SELECT coalesce(array_agg(s.id ORDER BY s.id), '{}'), array_agg(s.due_at ORDER BY s.id),
               array_agg(s.critical ORDER BY s.id), array_agg(s.updated ORDER BY s.id)
          INTO v_ids, v_due, v_critical, v_updated
          FROM schedules s
         WHERE s.critical = l.critical AND s.id > l.after_id AND s.id <= l.last_id AND s.due_at IS NOT NULL;
        UPDATE _schedule_resync_leases x SET owner = p_owner, until = now() + p_lease, n = cardinality(v_ids)
         WHERE x.sync_id = p_sync_id AND x.critical = l.critical AND x.after_id = l.after_id;
        RETURN QUERY SELECT u.id, CASE WHEN pyscheduler._instant_ok(u.due) THEN u.due END, u.critical,
                            CASE WHEN pyscheduler._instant_ok(u.upd) THEN u.upd END
                       FROM unnest(v_ids, v_due, v_critical, v_updated) AS u(id, due, critical, upd);
        RETURN;
    END IF;
    WHILE NOT r.exhausted LOOP  -- the critical schedules, then the others (index (critical, id) serves both)
        SELECT coalesce(array_agg(x.id ORDER BY x.id), '{}'), array_agg(x.due_at ORDER BY x.id),
               array_agg(x.critical ORDER BY x.id), array_agg(x.updated ORDER BY x.id)
          INTO v_ids, v_due, v_critical, v_updated
          FROM (SELECT s.id, s.due_at, s.critical, s.updated FROM schedules s
                 WHERE s.critical = NOT r.done_critical AND s.id > r.after_id AND s.due_at IS NOT NULL
                 ORDER BY s.id LIMIT p_limit) x;
        IF cardinality(v_ids) > 0 THEN
            INSERT INTO _schedule_resync_leases (sync_id, critical, after_id, last_id, n, owner, until)
            VALUES (p_sync_id, NOT r.done_critical, r.after_id, v_ids[cardinality(v_ids)], cardinality(v_ids), p_owner,
                    now() + p_lease);
            UPDATE _schedule_resyncs x SET after_id = v_ids[cardinality(v_ids)] WHERE x.sync_id = p_sync_id;
            RETURN QUERY SELECT u.id, CASE WHEN pyscheduler._instant_ok(u.due) THEN u.due END, u.critical,
                                CASE WHEN pyscheduler._instant_ok(u.upd) THEN u.upd END
                           FROM unnest(v_ids, v_due, v_critical, v_updated) AS u(id, due, critical, upd);
            RETURN;
        END IF;
        IF r.done_critical THEN
            UPDATE _schedule_resyncs x SET exhausted = true WHERE x.sync_id = p_sync_id;
            r.exhausted := true;
        ELSE
            UPDATE _schedule_resyncs x SET done_critical = true, after_id = 0 WHERE x.sync_id = p_sync_id;
            r.done_critical := true;
            r.after_id := 0;
        END IF;
    END LOOP;
END
$$;
COMMENT ON FUNCTION pyscheduler.resync_take(text, text, integer, interval) IS
    'Scheduler: acknowledge the caller''s last batch, lease it the next batch of schedules to re-add to a lost Redis index (critical first).';

CREATE OR REPLACE FUNCTION pyscheduler.resync_progress(p_sync_id text)
RETURNS TABLE (done bigint, total bigint, complete boolean)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
    /* resync_progress(p_sync_id) -> (done, total, complete)
       Schedules written to Redis so far for this sync id (acknowledged
       batches), the active schedules there were when it began ((0, active
       now) before the first take), and whether every batch was handed out and
       acknowledged: only then may a taker mark the index complete. */
    SELECT coalesce(x.done, 0), coalesce(x.total, (SELECT count(*) FROM schedules s WHERE s.due_at IS NOT NULL)),
           coalesce(x.exhausted, false)
           AND NOT EXISTS (SELECT 1 FROM _schedule_resync_leases l WHERE l.sync_id = p_sync_id)
      FROM (SELECT 1) one LEFT JOIN _schedule_resyncs x ON x.sync_id = p_sync_id;
$$;
COMMENT ON FUNCTION pyscheduler.resync_progress(text) IS
    'Progress of a resync: schedules written so far, the total to do, and whether it is complete.';

-- _fire_ms(iv): an interval in whole milliseconds for the executors, in 0..10^15 (NULL stays NULL).
CREATE OR REPLACE FUNCTION pyscheduler._fire_ms(p_iv interval)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_iv IS NOT NULL THEN greatest(0, least(date_part('epoch', p_iv) * 1000, 1e15))::bigint END;
$$;

CREATE OR REPLACE FUNCTION pyscheduler.fire_details(p_ids bigint[])
RETURNS TABLE (id bigint, name text, target_kind text, target text, priority bigint, payload text,
               retry_attempts integer, retry_base_ms bigint, retry_jitter_ms bigint, critical boolean,
               paused boolean, active boolean, catchup_window_ms bigint, overlap text, version bigint)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
    /* fire_details(p_ids) -> setof (id, name, target_kind, target, priority,
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
      FROM unnest(p_ids) AS u(id)
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
    p_ids bigint[], p_expected timestamptz[], p_outcomes text[], p_attempts integer[],
    p_errors text[] DEFAULT NULL, p_tokens uuid[] DEFAULT NULL)
RETURNS TABLE (id bigint, expected_at timestamptz, next_run_at timestamptz, recorded boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* record_executions(p_ids, p_expected, p_outcomes, p_attempts, p_errors => NULL,
       p_tokens => NULL) -> setof (id, expected_at, next_run_at, recorded)
   Record a batch of executions (parallel arrays): outcome fired | failed |
   skipped_overlap | missed (too late to fire: joins the catch-up summary).
   Each (id, expected) is recorded once: a repeat returns recorded = false
   and counts nothing. fired_at = the database clock. When expected is the
   schedule's regular next run, the next one is computed from the expected
   time (never from now), with the catch-up rule (occurrences older than now
   - catchup_window become one 'missed' row with their count) and end_at /
   max_runs (NULL = ended); when it is the pending trigger, the trigger is
   cleared; otherwise (a stale occurrence) nothing moves. Returns the due
   time to write as the score (NULL -> remove the member). p_tokens: from
   claim_due_critical; a row whose token is not the schedule's current claim
   is not recorded (recorded = false). Deleted schedule -> recorded = false,
   next NULL. A pending trigger on the regular occurrence's millisecond is
   cleared with it (one firing). A next occurrence after 9999-01-01 ends the
   schedule (next NULL, ended_note). An item whose schedule holds a value the
   recording cannot compute with ends alone: recorded with its outcome and
   the error, the schedule paused with a note (last_error says why), next
   NULL; the other items are recorded as usual.
   Errors: PS312 arrays of different lengths or unknown outcome. */
BEGIN
    RETURN QUERY SELECT * FROM _record_executions(p_ids, p_expected, p_outcomes, p_attempts, p_errors, p_tokens, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.record_executions(bigint[], timestamptz[], text[], integer[], text[], uuid[]) IS
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
    RETURN QUERY SELECT * FROM _record_each(true, p_ids, p_expected, NULL, NULL, NULL, p_tokens, NULL, p_now);
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.fire_task_schedules(
    p_ids bigint[], p_expected timestamptz[], p_tokens uuid[] DEFAULT NULL)
RETURNS TABLE (id bigint, expected_at timestamptz, next_run_at timestamptz, recorded boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* fire_task_schedules(p_ids, p_expected, p_tokens => NULL)
       -> setof (id, expected_at, next_run_at, recorded)
   Fire task-target schedules in the database: for each (id, expected), in
   one transaction, submit the task (spec = payload + {"pyscheduler":
   {schedule, schedule_id, expected_at, idempotency_key}}, queue = target,
   priority) and record the execution, as record_executions. Overlap policy:
   allow; skip -> 'skipped_overlap' while an earlier task of the schedule is
   ready or running; buffer_one -> submitted while fewer than two are (one
   may wait behind the running one). An occurrence older than the catch-up
   window is recorded 'missed', not submitted. A repeat of (id, expected)
   submits nothing (recorded = false). A submit that fails is recorded as
   'failed' with the error. p_tokens as record_executions. Each item is
   answered on its own: one that is not a task target (any more) or is stale
   (neither the regular next run nor the pending trigger: the schedule changed
   since it was claimed) submits nothing and gets recorded = false with the
   schedule's current due time; one whose stored values cannot be computed
   with ends alone (recorded 'failed', the schedule paused with a note).
   Errors: PS312 array lengths. */
BEGIN
    RETURN QUERY SELECT * FROM _fire_task_schedules(p_ids, p_expected, p_tokens, now());
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
    p_ids bigint[], p_expected timestamptz[], p_outcomes text[], p_errors text[])
RETURNS TABLE (id bigint, expected_at timestamptz, next_run_at timestamptz, recorded boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* stop_schedules(p_ids, p_expected, p_outcomes, p_errors)
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
   error. */
BEGIN
    RETURN QUERY SELECT * FROM _stop_schedules(p_ids, p_expected, p_outcomes, p_errors, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.stop_schedules(bigint[], timestamptz[], text[], text[]) IS
    'Scheduler: record occurrences the daemons could not fire or record, with their error, and pause their schedules.';

-- _claim_due_critical(limit, hold, now): claim_due_critical with the clock as a parameter.
-- Its plan is pinned: an ordered scan of schedules_critical_due_idx that stops at p_limit
-- rows, whatever the statistics say. Without the settings, statistics taken while the due
-- schedules were a day away (2 % of the table: below the autoanalyze threshold) made the
-- custom plan a bitmap scan plus a sort of every due row (95 ms a call for 100,000 due), and
-- the generic plan a merge join over the whole primary key; the UPDATE finds each locked row
-- by its ctid (a Tid Scan), so no join over the table can be chosen.
CREATE OR REPLACE FUNCTION pyscheduler._claim_due_critical(p_limit integer, p_hold interval, p_now timestamptz)
RETURNS TABLE (id bigint, expected_at timestamptz, claim_token uuid)
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_sort = off
SET enable_hashjoin = off SET enable_mergejoin = off SET enable_indexscan = on SET enable_tidscan = on
AS $$
BEGIN
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 100000 OR p_hold IS NULL OR p_hold <= interval '0' THEN
        PERFORM _schedule_error('PS312', format('p_limit must be in 1..100000 and p_hold > 0, got %s and %s',
                                                coalesce(p_limit::text, 'NULL'), coalesce(p_hold::text, 'NULL')));
    END IF;
    RETURN QUERY
    WITH c AS (
        SELECT s.ctid AS row_id FROM schedules s
         WHERE s.critical_due_at <= p_now AND (s.claimed_until IS NULL OR s.claimed_until < p_now)
         ORDER BY s.critical_due_at
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED)
    UPDATE schedules s SET claim_token = gen_random_uuid(), claimed_until = p_now + p_hold
      FROM c
     WHERE s.ctid = c.row_id  -- the row version locked above
    RETURNING s.id, s.due_at, s.claim_token;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.claim_due_critical(p_limit integer DEFAULT 100, p_hold interval DEFAULT '30 seconds')
RETURNS TABLE (id bigint, expected_at timestamptz, claim_token uuid)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* claim_due_critical(p_limit => 100, p_hold => '30 seconds')
       -> setof (id, expected_at, claim_token)
   Degraded mode (Redis unreachable): claim up to p_limit due critical
   schedules (oldest due first, FOR UPDATE SKIP LOCKED, so concurrent
   executors never get the same one) for p_hold. Fire each, then record with
   record_executions(..., p_tokens) (task targets: fire_task_schedules with
   p_tokens); a claim not recorded within p_hold can be claimed again.
   Errors: PS312 p_limit outside 1..100000 or p_hold <= 0. */
BEGIN
    RETURN QUERY SELECT * FROM _claim_due_critical(p_limit, p_hold, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.claim_due_critical(integer, interval) IS
    'Scheduler, degraded mode: claim due critical schedules (SKIP LOCKED, batched) with a token for recording.';

CREATE OR REPLACE FUNCTION pyscheduler._purge_executions(p_batch integer, p_now timestamptz)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    v_n bigint;
BEGIN
    IF p_batch IS NULL OR p_batch NOT BETWEEN 1 AND 1000000 THEN
        PERFORM _schedule_error('PS312', format('p_batch must be in 1..1000000, got %s', coalesce(p_batch::text, 'NULL')));
    END IF;
    DELETE FROM schedule_executions e
     WHERE e.ctid = ANY (ARRAY(
        SELECT x.ctid FROM schedule_executions x
         WHERE x.fired_at < p_now - _setting('schedules_execution_retention')::interval
         LIMIT p_batch));
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.purge_executions(p_batch integer DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* purge_executions(p_batch => 10000) -> bigint
   Delete up to p_batch executions recorded before now minus the retention
   setting (schedules_execution_retention, default 30 days); returns how
   many. The cleanup daemon calls it while it returns p_batch. Counts in the
   schedule rows are kept. Errors: PS312 p_batch outside 1..1000000. */
BEGIN
    RETURN _purge_executions(p_batch, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.purge_executions(integer) IS
    'Scheduler: delete a batch of executions older than the retention setting; counts survive.';

-- ---------------------------------------------------------------- views (psql)

-- _may_see(owner): _may_act(owner) for the views (a view's reader needs EXECUTE
-- on what it calls, and _may_act reads the settings): whether the reader sees a
-- schedule's target and last error.
CREATE OR REPLACE FUNCTION pyscheduler._may_see(p_owner name)
RETURNS boolean
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
    SELECT pyscheduler._may_act(p_owner);
$$;

CREATE OR REPLACE VIEW pyscheduler.schedules_due_soon AS
    SELECT name, due_at, due_at - now() AS due_in, trigger_at IS NOT NULL AND trigger_at = due_at AS triggered,
           critical, target_kind, CASE WHEN pyscheduler._may_see(owner) THEN target END AS target, owner
      FROM pyscheduler.schedules
     WHERE due_at IS NOT NULL AND due_at <= now() + interval '5 minutes'
     ORDER BY due_at;
COMMENT ON VIEW pyscheduler.schedules_due_soon IS
    'Schedules due within the next 5 minutes (or overdue), soonest first; target only for its owner and admin.';

CREATE OR REPLACE VIEW pyscheduler.schedules_late AS
    SELECT name, due_at, now() - due_at AS late_by, catchup_window, critical, target_kind,
           CASE WHEN pyscheduler._may_see(owner) THEN target END AS target, owner
      FROM pyscheduler.schedules
     WHERE due_at < now() - interval '10 seconds'
     ORDER BY due_at;
COMMENT ON VIEW pyscheduler.schedules_late IS
    'Schedules due more than 10 seconds ago and not yet fired: the executors are down or behind.';

CREATE OR REPLACE VIEW pyscheduler.schedules_paused AS
    SELECT name, paused_note, updated AS paused_since, next_run_at, target_kind,
           CASE WHEN pyscheduler._may_see(owner) THEN target END AS target, owner
      FROM pyscheduler.schedules
     WHERE paused
     ORDER BY name;
COMMENT ON VIEW pyscheduler.schedules_paused IS 'Paused schedules with their notes.';

CREATE OR REPLACE VIEW pyscheduler.schedules_failing AS
    SELECT name, consecutive_failures, last_expected_at,
           CASE WHEN pyscheduler._may_see(owner) THEN last_error END AS last_error, failed_count, fired_count,
           target_kind, CASE WHEN pyscheduler._may_see(owner) THEN target END AS target, owner
      FROM pyscheduler.schedules
     WHERE consecutive_failures > 0
     ORDER BY consecutive_failures DESC, name;
COMMENT ON VIEW pyscheduler.schedules_failing IS
    'Schedules whose last fired-or-failed occurrence failed after retries, most consecutive failures first.';

-- ---------------------------------------------------------------- grants

SELECT pyscheduler._grant('client', 'create_schedule', 'update_schedule', 'pause_schedule', 'resume_schedule',
                         'trigger_schedule', 'delete_schedule', 'get_schedule', 'list_schedules', 'schedule_runs',
                         'upcoming_runs', 'execution_count', 'retry_worst_case', 'next_cron_time',
                         'schedules_due_soon', 'schedules_late', 'schedules_paused', 'schedules_failing');
SELECT pyscheduler._grant('scheduler', 'index_entries', 'index_page', 'resync_take', 'resync_progress',
                         'fire_details', 'record_executions', 'fire_task_schedules', 'stop_schedules',
                         'claim_due_critical', 'purge_executions', 'get_schedule', 'retry_worst_case',
                         'next_cron_time');
-- the views call it for their readers
SELECT pyscheduler._grant('client', '_may_see');
SELECT pyscheduler._grant('monitor', '_may_see');
SELECT pyscheduler._grant('monitor', 'get_schedule', 'list_schedules', 'schedule_runs', 'upcoming_runs',
                         'execution_count', 'retry_worst_case', 'next_cron_time', 'resync_progress',
                         'schedules_due_soon', 'schedules_late', 'schedules_paused', 'schedules_failing');
