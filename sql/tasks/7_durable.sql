-- pyscheduler: durable task functions (issue 33): checkpointed steps, sleeps and events, on the
-- leases of 4_worker.sql. docs/sql-api.md, "Durable steps, sleeps and events".
--
-- A task records what it did in task_checkpoints, once per task (not per attempt), guarded by
-- the token of its current lease: a re-run (a retry, a lease taken over after a crash, a wake-up)
-- reads the results back instead of doing the work again. A sleep and a wait for an event end
-- the lease (_yield_leases with a run_at: no attempt used, no worker held): the task is
-- 'scheduled' until then, so the lease gate's probe of tasks_scheduled_idx makes it ready on
-- time, and thousands of sleeping tasks cost the lease path nothing. A task waiting for an
-- event is 'scheduled' with a row in task_waits (suspended): emit_event makes it ready at once,
-- its timeout is its run_at. Events are stored (task_events: the last one of each name per
-- emitting role), so one emitted before the wait is seen by it; an event reaches the tasks of
-- the roles its emitter may act on (_may_act_as: the emitter itself, a role it is a member of,
-- or any for admin). await_event and emit_event serialise per event name with an advisory
-- transaction lock, so a wait and an emit never miss each other (under READ COMMITTED).
--
-- SQLSTATE codes (docs/sql-api.md): the lease's PS200, PS201, PS202, PS203, PS210;
--   PS212 until outside [1970, 9999), duration or timeout outside 0..365 days, both or neither
--   PS217 a step's result larger than task_max_result_bytes (or nested over 64 levels)
--   PS230 a step name, PS231 an event name (labels of 1..200 bytes)
--   PS232 an event payload larger than task_max_result_bytes (or nested over 64 levels)

-- _held_lease(rn, token, lock): the submitting role of task rn when token is its current
-- lease, the row locked FOR KEY SHARE (a step: the lease cannot be lost before the caller's
-- transaction ends, yet heartbeats go on) or FOR UPDATE (a sleep or a wait: _yield_leases'
-- lock); else the lease's refusal, raised.
CREATE OR REPLACE FUNCTION pyscheduler._held_lease(p_rn uuid, p_token uuid, p_for_update boolean)
RETURNS name
LANGUAGE plpgsql
AS $$
DECLARE
    v_owner name;
BEGIN
    IF p_for_update THEN
        SELECT t.submitted_by INTO v_owner FROM pyscheduler.tasks t
         WHERE t.rn = p_rn AND t.lease_token = p_token AND t.status = 'running' FOR UPDATE;
    ELSE
        SELECT t.submitted_by INTO v_owner FROM pyscheduler.tasks t
         WHERE t.rn = p_rn AND t.lease_token = p_token AND t.status = 'running' FOR KEY SHARE;
    END IF;
    IF NOT FOUND THEN
        PERFORM pyscheduler._task_refused(p_rn, p_token);
    END IF;
    RETURN v_owner;
END
$$;

-- _durable_until(what, until, delay, p_now): the instant of a sleep or a wait: until, or
-- p_now + delay (0..365 days, as seconds); PS212 otherwise.
CREATE OR REPLACE FUNCTION pyscheduler._durable_until(p_what text, p_until timestamptz, p_delay interval,
                                                      p_now timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF (p_until IS NULL) = (p_delay IS NULL) THEN
        RAISE EXCEPTION 'give until or %, exactly one', p_what
            USING ERRCODE = 'PS212', HINT = 'until is an instant, the other a delay from now.';
    END IF;
    IF p_until IS NOT NULL THEN
        PERFORM pyscheduler._require_instant('until', p_until, 'PS212');
        RETURN p_until;
    END IF;
    IF NOT extract(epoch FROM p_delay) BETWEEN 0 AND 31536000 THEN  -- 365 days, as seconds
        RAISE EXCEPTION '% must be between 0 and 365 days, got %', p_what, p_delay
            USING ERRCODE = 'PS212', HINT = 'For a later time, give until.';
    END IF;
    RETURN p_now + make_interval(secs => extract(epoch FROM p_delay)::double precision);
END
$$;

-- _event_lock(name): the advisory transaction lock await_event and emit_event take per name.
CREATE OR REPLACE FUNCTION pyscheduler._event_lock(p_name text)
RETURNS void
LANGUAGE sql
AS $$ SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended('pyscheduler_event:' || p_name, 0)) $$;

-- ---------------------------------------------------------------- steps

CREATE OR REPLACE FUNCTION pyscheduler._record_step(rn uuid, token uuid, step text, result jsonb,
                                                    p_now timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_stored jsonb;
BEGIN
    PERFORM pyscheduler._check_result(_record_step.result, 'step result');
    PERFORM pyscheduler._held_lease(_record_step.rn, _record_step.token, false);
    INSERT INTO pyscheduler.task_checkpoints AS s (rn, kind, step, result, recorded)
    VALUES (_record_step.rn, 'step', _record_step.step, _record_step.result, p_now)
    ON CONFLICT (rn, kind, step) DO NOTHING;
    IF FOUND THEN
        RETURN _record_step.result;
    END IF;
    SELECT s.result INTO v_stored FROM pyscheduler.task_checkpoints s
     WHERE s.rn = _record_step.rn AND s.kind = 'step' AND s.step = _record_step.step;
    RETURN v_stored;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.record_step(rn uuid, token uuid, step pyscheduler.step_name,
                                                   result pyscheduler.task_result DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* record_step(rn, token, step, result => NULL) -> jsonb
   The lease holder checkpoints step `step` of task rn with its result (any JSON value, at most
   task_max_result_bytes), once per task: a step recorded already (by an earlier attempt) keeps
   its first result, which is returned. Called inside the application's own transaction, next
   to the step's writes, the step and its checkpoint commit together: the task's row stays
   locked (FOR KEY SHARE, as holds_lease) until that transaction ends, so the lease cannot be
   lost before it commits; a rollback records nothing and the step runs again.
   Errors: PS200, PS201 (a stale lease: the task was leased again), PS202, PS203, PS210 as
   complete_task; PS217 result, PS230 step name. */
BEGIN
    RETURN pyscheduler._record_step(rn, token, step, result, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.record_step(uuid, uuid, pyscheduler.step_name, pyscheduler.task_result) IS
    'The lease holder (token) checkpoints a step''s result, once per task (a step recorded already keeps and returns its first result).';

CREATE OR REPLACE FUNCTION pyscheduler.step_results(rn uuid, token uuid)
RETURNS jsonb
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* step_results(rn, token) -> jsonb
   For the holder of a lease of task rn: the steps it recorded (record_step), by any attempt,
   as {"<step>": result, ...} ({} when none). A re-run reads them once and skips those steps.
   Errors: PS200, PS201, PS202, PS203, PS210 as complete_task. */
#variable_conflict use_column
BEGIN
    PERFORM 1 FROM tasks t
     WHERE t.rn = step_results.rn AND t.lease_token = step_results.token AND t.status = 'running';
    IF NOT FOUND THEN
        PERFORM _task_refused(step_results.rn, step_results.token);
    END IF;
    RETURN coalesce((SELECT jsonb_object_agg(s.step, s.result) FROM task_checkpoints s
                      WHERE s.rn = step_results.rn AND s.kind = 'step'), '{}');
END
$$;
COMMENT ON FUNCTION pyscheduler.step_results(uuid, uuid) IS
    'The lease holder (token) reads the results of the steps task rn recorded, as {"step": result}.';

CREATE OR REPLACE FUNCTION pyscheduler.task_steps(rn uuid)
RETURNS TABLE (kind text, step text, result jsonb, recorded timestamptz)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* task_steps(rn) -> setof (kind, step, result, recorded)
   What task rn recorded, in order: its steps (kind 'step', their results), its sleeps
   ('sleep', {"until"}), the events it received or timed out on ('event', {"status":
   "received", "payload"} or {"status": "timeout"}), and the event it waits for now
   ('await', {"until": its timeout}, recorded: since when). Only the role that submitted it,
   a member of it, or admin.
   Errors: PS200 unknown task, 42501 a task of another role. */
#variable_conflict use_column
DECLARE
    v_owner name;
BEGIN
    SELECT t.submitted_by INTO v_owner FROM tasks t WHERE t.rn = task_steps.rn;
    IF NOT FOUND THEN
        PERFORM _task_refused(task_steps.rn, NULL);
    END IF;
    PERFORM _require_owner(v_owner, format('task %s', task_steps.rn));
    RETURN QUERY
        SELECT x.kind, x.step, x.result, x.recorded FROM (
            SELECT s.kind, s.step, s.result, s.recorded FROM task_checkpoints s WHERE s.rn = task_steps.rn
            UNION ALL
            SELECT 'await', w.name, jsonb_build_object('until', _ts(w.until)), w.since
              FROM task_waits w WHERE w.rn = task_steps.rn) AS x
         ORDER BY x.recorded, x.kind, x.step;
END
$$;
COMMENT ON FUNCTION pyscheduler.task_steps(uuid) IS
    'The steps, sleeps and events task rn recorded, and the event it waits for; its owner and admin only.';

-- ---------------------------------------------------------------- sleeps

CREATE OR REPLACE FUNCTION pyscheduler._sleep_task(rn uuid, token uuid, until timestamptz DEFAULT NULL,
                                                   duration interval DEFAULT NULL, step text DEFAULT NULL,
                                                   p_now timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_until timestamptz := pyscheduler._durable_until('duration', _sleep_task.until, _sleep_task.duration, p_now);
    v_stored timestamptz;
BEGIN
    PERFORM pyscheduler._held_lease(_sleep_task.rn, _sleep_task.token, true);
    IF _sleep_task.step IS NOT NULL THEN
        SELECT (s.result ->> 'until')::timestamptz INTO v_stored FROM pyscheduler.task_checkpoints s
         WHERE s.rn = _sleep_task.rn AND s.kind = 'sleep' AND s.step = _sleep_task.step;
        IF FOUND THEN
            v_until := v_stored;  -- a re-run: the sleep recorded first, not a new one
        ELSE
            INSERT INTO pyscheduler.task_checkpoints (rn, kind, step, result, recorded)
            VALUES (_sleep_task.rn, 'sleep', _sleep_task.step, jsonb_build_object('until', pyscheduler._ts(v_until)),
                    p_now);
        END IF;
    END IF;
    IF v_until <= p_now THEN
        RETURN jsonb_build_object('asleep', false, 'until', pyscheduler._ts(v_until));
    END IF;
    PERFORM FROM pyscheduler._yield_leases(ARRAY[_sleep_task.rn], ARRAY[_sleep_task.token], v_until, p_now);
    RETURN jsonb_build_object('asleep', true, 'until', pyscheduler._ts(v_until));
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.sleep_task(rn uuid, token uuid, until timestamptz DEFAULT NULL,
                                                  duration interval DEFAULT NULL,
                                                  step pyscheduler.step_name DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* sleep_task(rn, token, until => NULL, duration => NULL, step => NULL) -> {"asleep", "until"}
   The lease holder puts task rn to sleep until `until` (or now + duration, 0..365 days;
   exactly one): the lease ends (its token is refused from then on, PS210), the task is
   'scheduled' until then without owner, its steps kept, no attempt used (as yield_task's
   snooze), and a lease makes it ready once due. step names the sleep: a re-run that sleeps
   under the same name sleeps until the instant recorded first, and not at all once it has
   passed ({"asleep": false}: go on, the lease is kept). Without step, nothing is recorded.
   Errors: PS200, PS201, PS202, PS203, PS210 as complete_task; PS212 until or duration,
   PS230 step name. */
BEGIN
    RETURN pyscheduler._sleep_task(rn, token, until, duration, step, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.sleep_task(uuid, uuid, timestamptz, interval, pyscheduler.step_name) IS
    'The lease holder (token) ends its lease and the task sleeps (scheduled) until an instant or for a duration; a named sleep is not repeated by a re-run.';

-- ---------------------------------------------------------------- events

CREATE OR REPLACE FUNCTION pyscheduler._await_event(rn uuid, token uuid, name text,
                                                    timeout interval DEFAULT '365 days',
                                                    p_now timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_owner name := pyscheduler._held_lease(_await_event.rn, _await_event.token, true);
    v_got jsonb;
    v_until timestamptz;
BEGIN
    SELECT s.result INTO v_got FROM pyscheduler.task_checkpoints s
     WHERE s.rn = _await_event.rn AND s.kind = 'event' AND s.step = _await_event.name;
    IF FOUND THEN
        RETURN v_got;  -- received (or timed out) already: the same answer again
    END IF;
    SELECT w.until INTO v_until FROM pyscheduler.task_waits w
     WHERE w.rn = _await_event.rn AND w.name = _await_event.name;
    v_until := coalesce(v_until, pyscheduler._durable_until('timeout', NULL, _await_event.timeout, p_now));
    PERFORM pyscheduler._event_lock(_await_event.name);
    SELECT jsonb_build_object('status', 'received', 'payload', e.payload) INTO v_got
      FROM pyscheduler.task_events e
     WHERE e.name = _await_event.name AND pyscheduler._may_act_as(e.emitted_by, v_owner)
     ORDER BY e.emitted DESC LIMIT 1;
    IF v_got IS NULL AND v_until <= p_now THEN
        v_got := jsonb_build_object('status', 'timeout');
    END IF;
    IF v_got IS NOT NULL THEN
        INSERT INTO pyscheduler.task_checkpoints (rn, kind, step, result, recorded)
        VALUES (_await_event.rn, 'event', _await_event.name, v_got, p_now);
        DELETE FROM pyscheduler.task_waits w WHERE w.rn = _await_event.rn AND w.name = _await_event.name;
        RETURN v_got;
    END IF;
    INSERT INTO pyscheduler.task_waits (rn, name, until, since)
    VALUES (_await_event.rn, _await_event.name, v_until, p_now)
    ON CONFLICT (rn, name) DO NOTHING;
    PERFORM FROM pyscheduler._yield_leases(ARRAY[_await_event.rn], ARRAY[_await_event.token], v_until, p_now);
    RETURN jsonb_build_object('status', 'suspended', 'until', pyscheduler._ts(v_until));
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.await_event(rn uuid, token uuid, name pyscheduler.event_name,
                                                   timeout interval DEFAULT '365 days')
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* await_event(rn, token, name, timeout => '365 days') -> {"status", ...}
   The lease holder of task rn waits for the event `name`:
     {"status": "received", "payload": ...}  an event of that name is stored (emitted before,
        by a role that may act on the task's) or was delivered to the task while it waited;
     {"status": "timeout"}  none came within timeout (0..365 days) of the first wait;
     {"status": "suspended", "until": ...}  none yet: the lease ends (PS210 from then on), the
        task is suspended ('scheduled', its wait in task_steps as 'await') until emit_event
        makes it ready, or until the timeout; its next run calls await_event again.
   Received and timeout are recorded once per task (as a step of kind 'event'): every later
   call answers the same, so a payload is delivered once per waiting task.
   Errors: PS200, PS201, PS202, PS203, PS210 as complete_task; PS212 timeout, PS231 name. */
BEGIN
    RETURN pyscheduler._await_event(rn, token, name, timeout, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.await_event(uuid, uuid, pyscheduler.event_name, interval) IS
    'The lease holder (token) waits for an event: received (payload), timeout, or suspended (lease ended) until emitted or timed out.';

CREATE OR REPLACE FUNCTION pyscheduler._emit_event(name text, payload jsonb DEFAULT NULL,
                                                   p_now timestamptz DEFAULT now())
RETURNS integer
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_seen name[] := pyscheduler._seen_owners();
    v_rns uuid[];
    v_queues text[];
BEGIN
    IF pg_column_size(_emit_event.payload) > pyscheduler._task_limit('task_max_result_bytes') THEN
        RAISE EXCEPTION 'payload is % bytes, more than task_max_result_bytes (%)', pg_column_size(_emit_event.payload),
                        pyscheduler._task_limit('task_max_result_bytes')
            USING ERRCODE = 'PS232', HINT = 'Keep large data elsewhere and pass a reference.';
    END IF;
    PERFORM pyscheduler._event_lock(_emit_event.name);
    INSERT INTO pyscheduler.task_events AS e (name, emitted_by, payload, emitted)
    VALUES (_emit_event.name, pyscheduler._caller(), _emit_event.payload, p_now)
    ON CONFLICT (name, emitted_by) DO UPDATE SET payload = excluded.payload, emitted = excluded.emitted;
    WITH waiting AS (
        SELECT t.rn FROM pyscheduler.task_waits w JOIN pyscheduler.tasks t ON t.rn = w.rn
         WHERE w.name = _emit_event.name AND t.status = 'scheduled' AND t.run_at = w.until
           AND coalesce(t.submitted_by = ANY (v_seen), true)
         ORDER BY t.rn
           FOR UPDATE OF t),
    woken AS (
        UPDATE pyscheduler.tasks t SET status = 'ready', run_at = p_now, updated = p_now
          FROM waiting WHERE t.rn = waiting.rn
        RETURNING t.rn, t.queue)
    SELECT array_agg(woken.rn), array_agg(woken.queue) INTO v_rns, v_queues FROM woken;
    IF v_rns IS NULL THEN
        RETURN 0;
    END IF;
    INSERT INTO pyscheduler.task_checkpoints (rn, kind, step, result, recorded)
    SELECT r, 'event', _emit_event.name,
           jsonb_build_object('status', 'received', 'payload', _emit_event.payload), p_now
      FROM unnest(v_rns) AS r
    ON CONFLICT (rn, kind, step) DO NOTHING;
    DELETE FROM pyscheduler.task_waits w WHERE w.name = _emit_event.name AND w.rn = ANY (v_rns);
    PERFORM pyscheduler._task_tally_many(v_queues, 'scheduled', 'ready');
    PERFORM pyscheduler._notify_throttled(pyscheduler._task_channel(q))
       FROM (SELECT DISTINCT u.q FROM unnest(v_queues) AS u(q)) AS x;
    RETURN cardinality(v_rns);
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.emit_event(name pyscheduler.event_name,
                                                  payload pyscheduler.event_payload DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* emit_event(name, payload => NULL) -> integer
   Emit the event `name` with payload (any JSON value, at most task_max_result_bytes): every
   task suspended waiting for it (await_event) whose submitting role the caller may act on
   (itself, a role it is a member of; any for admin) becomes ready now with the payload
   delivered (recorded for it); the event is stored (the last one of a name per emitting
   role), so a task that waits for it later receives it at once, until cleanup_tasks purges it
   after its retention. Returns how many waiting tasks it woke.
   Errors: PS231 name, PS232 payload. */
BEGIN
    RETURN pyscheduler._emit_event(name, payload, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.emit_event(pyscheduler.event_name, pyscheduler.event_payload) IS
    'Emit an event: the caller''s tasks waiting for it become ready with its payload; stored for tasks that wait for it later.';

SELECT pyscheduler._grant('client', 'emit_event', 'task_steps');
SELECT pyscheduler._grant('worker', 'record_step', 'step_results', 'sleep_task', 'await_event');
