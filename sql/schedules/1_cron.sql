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
