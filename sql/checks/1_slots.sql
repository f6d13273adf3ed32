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
