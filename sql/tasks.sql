-- pyscheduler: leased tasks (seeds/scylla.md). Reloaded on every migrate.
--
-- A task is submitted ready, leased by a worker (running, owner, deadline, a
-- secret lease token), kept alive with heartbeats, and finished by the holder
-- of the lease (completed, aborted) or by a client (cancelled). The monitor
-- resets running tasks whose deadline has passed (TaskTimeout in history, not
-- after a TaskYield; aborted with TaskMaxAttempts after too many attempts) and
-- deletes terminal tasks past retention.
--
-- Job-queue extensions (issue 16; the seed's states, history and abort are
-- unchanged): a task submitted with a future run_at, or failed by its lease
-- holder (fail_task) and waiting for its retry, is 'scheduled' until its
-- run_at; the next lease of its queue makes it ready (_lease_gate). A
-- unique_key keeps at most one live (scheduled, ready, running) task per
-- queue and key. retry_task requeues an aborted or cancelled task. A paused
-- queue (task_queues) leases nothing.
--
-- Clock: every public function takes the time from the database clock
-- (now()). Each is a thin wrapper of a private `_name(..., p_now)` granted to
-- no role, which tests call to move time.
--
-- Ownership: lease_task, lease_tasks and complete_and_lease return the task
-- with a `token` (an unguessable uuid, new for every lease: the md5 of a
-- secret drawn by gen_random_uuid() once per lease call, never stored, and
-- the task's rn; see _claim_tasks). heartbeat, complete, fail,
-- abort and yield act only when given the token of the task's current lease;
-- the worker id is a label for people (owner, history), not a proof. A task
-- belongs to the role that submitted it (submitted_by): only that role, a
-- member of it, or admin cancels or requeues it (42501 otherwise).
--
-- The state machine, in one place: the writes of a lease holder all guard
-- with `status = 'running' AND lease_token = token` (yield clears the token),
-- cancel with `status IN ('scheduled', 'ready', 'running')`, retry with
-- `status IN ('aborted', 'cancelled')`; why a write matched no row is
-- _refusal() below. docs/sql-api.md has it as a table, checked by
-- tests/test_tasks_hardening.py against these functions.
--
-- SQLSTATE codes (docs/sql-api.md, pyscheduler/errors.py):
--   PS200 unknown task          PS207 invalid errors (shape, too many, too large)
--   PS201 lease lost (another   PS208 invalid argument (queue, worker, timeout,
--         lease holds the task)        n, aging, status, retention, max_tasks,
--   PS202 not running                  tokens, max_attempts, note)
--   PS203 task cancelled        PS209 task already finished (cancel of completed/aborted)
--   PS204 invalid priority      PS210 the lease was yielded
--   PS205 invalid progress      PS211 not requeueable (retry of a task not aborted/cancelled)
--   PS206 invalid spec (not an  PS212 run_at, run_in or retry_in outside its bounds
--         object, too large)    PS213 invalid unique_key
--                               PS214 unique_key held by another live task (requeue)
--   PS215 invalid concurrency_key                 PS218 a limited queue leased outside
--   PS216 invalid limit (0, negative, too large)        READ COMMITTED
--   PS217 result larger than task_max_result_bytes PS219 invalid after (missing, another
--                                                        role's, too many parents)
--   PS220 invalid workflow (shape, unknown name, cycle, too many nodes)
--
-- Limits (pyscheduler.settings): task_max_spec_bytes, task_max_errors,
-- task_max_errors_bytes, task_max_history (entries kept after each reset),
-- task_max_attempts (attempts, i.e. leases not yielded, after which a failed
-- or timed-out task is aborted; a task's max_attempts overrides it),
-- task_backoff_base and task_backoff_cap (a failure's default retry delay:
-- least(base * 2^attempt, cap) * random 0.5..1.5).
--
-- Notifications (hints; polling is the fallback), throttled per channel:
--   pyscheduler_tasks:<queue>    <queue> may have work: a task became ready
--                                or scheduled (submit, reset, fail, retry) or
--                                the queue was resumed
--   pyscheduler_cancel:<worker>  a task <worker> holds was cancelled
--   pyscheduler_tasks_monitor    a task was yielded: the monitor may reset it now

-- ---------------------------------------------------------------- helpers

-- _ts(t): a timestamp as the seed writes it, in UTC ending in Z
-- ('2021-10-09T12:13:21.000000Z'), whatever the session's TimeZone.
-- STABLE, not IMMUTABLE: to_char is STABLE, and the planner inlines a SQL
-- function only when its body is no more volatile than declared (not inlined,
-- it was parsed and planned on every lease, ~25 us).
CREATE OR REPLACE FUNCTION pyscheduler._ts(p_t timestamptz)
RETURNS text
LANGUAGE sql STABLE
AS $$ SELECT to_char(p_t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') $$;

-- _history(typ, worker, time, progress): one history entry in the seed's shape
-- (progress only where the seed shows it: TaskTimeout and TaskYield), as a
-- one-element array to append.
CREATE OR REPLACE FUNCTION pyscheduler._history(
    p_typ text, p_worker text, p_time timestamptz, p_progress double precision DEFAULT NULL)
RETURNS jsonb
LANGUAGE sql STABLE
AS $$
    SELECT jsonb_build_array(CASE WHEN p_progress IS NULL
        THEN jsonb_build_object('_typ', p_typ, 'worker', p_worker, 'time', pyscheduler._ts(p_time))
        ELSE jsonb_build_object('_typ', p_typ, 'worker', p_worker, 'progress', p_progress,
                                'time', pyscheduler._ts(p_time))
    END);
$$;

-- _full_history(history, owner, leased_at): a task's history as shown: the
-- stored entries, then the TaskAssignment entry of the current lease while it
-- is only recorded in leased_at (a lease writes no history: the lease is the
-- hot path, and rewriting the history jsonb on every lease cost ~20 % of it).
-- A yield or a reset writes the entry into history (leased_at NULL again), so
-- the entries and their order are those of appending it at lease time.
CREATE OR REPLACE FUNCTION pyscheduler._full_history(p_history jsonb, p_owner text, p_leased_at timestamptz)
RETURNS jsonb
LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN p_leased_at IS NULL THEN p_history
                ELSE p_history || pyscheduler._history('TaskAssignment', p_owner, p_leased_at) END;
$$;

-- _task_json(t): a task in the seed's JSON shape (never the lease token), and
-- the job-queue extensions: run_at, attempts, max_attempts (NULL: the
-- setting), unique_key, submitted_by; and issue 20's: concurrency_key, result, after
-- (the parents), on_parent_failure.
CREATE OR REPLACE FUNCTION pyscheduler._task_json(t pyscheduler.tasks)
RETURNS jsonb
LANGUAGE sql STABLE
AS $$
    SELECT jsonb_build_object(
        'rn', t.rn, 'spec', t.spec, 'queue', t.queue, 'priority', t.priority,
        'status', t.status, 'progress', t.progress, 'created', pyscheduler._ts(t.created),
        'updated', pyscheduler._ts(t.updated), 'errors', t.errors, 'owner', t.owner,
        'deadline', pyscheduler._ts(t.deadline),
        'history', pyscheduler._full_history(t.history, t.owner, t.leased_at),
        'run_at', pyscheduler._ts(t.run_at), 'attempts', t.attempts, 'max_attempts', t.max_attempts,
        'unique_key', t.unique_key, 'submitted_by', t.submitted_by, 'concurrency_key', t.concurrency_key,
        'result', t.result, 'after', to_jsonb(t.after), 'on_parent_failure', coalesce(t.on_parent_failure, 'cancel'));
$$;

-- _rn_prefix(time) and _task_rn(prefix, seq): a new task's id, time-ordered
-- in the layout of a UUIDv7: 48 bits of the submission's Unix milliseconds,
-- the version 7, then the variant and the task's seq (unique: the sequence).
-- Tasks submitted together sit together in the primary key, and so do the
-- index entries their lease and completion add (a random uuid put each one
-- on a random leaf page: ~15 % of a lease and a completion). Ids are not
-- secrets (the lease token is); gen_random_uuid() also cost ~5 us a call.
CREATE OR REPLACE FUNCTION pyscheduler._rn_prefix(p_time timestamptz)
RETURNS bigint
LANGUAGE sql STABLE
AS $$ SELECT (floor(extract(epoch FROM p_time) * 1000)::bigint << 16) | 28672 $$;  -- 28672 = 0x7000

CREATE OR REPLACE FUNCTION pyscheduler._task_rn(p_prefix bigint, p_seq bigint)
RETURNS uuid
LANGUAGE sql IMMUTABLE
AS $$
    SELECT encode(int8send(p_prefix) || int8send((p_seq & 4611686018427387903) | (-9223372036854775808)),
                  'hex')::uuid
$$;

-- _lease_token(secret, rn): the token of a lease, unguessable without the
-- secret (one gen_random_uuid() per lease call, kept only for the call).
CREATE OR REPLACE FUNCTION pyscheduler._lease_token(p_secret text, p_rn uuid)
RETURNS uuid
LANGUAGE sql IMMUTABLE
AS $$ SELECT md5(p_secret || p_rn::text)::uuid $$;

-- _parent_results(after): a task's parents as the lease answer shows them.
CREATE OR REPLACE FUNCTION pyscheduler._parent_results(p_after uuid[])
RETURNS jsonb
LANGUAGE sql STABLE
AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object('rn', a.rn, 'status', t.status, 'result', t.result) ORDER BY a.i), '[]')
      FROM unnest(p_after) WITH ORDINALITY AS a(rn, i) LEFT JOIN pyscheduler.tasks t ON t.rn = a.rn;
$$;

-- _leased_json(t): the task as a lease answer: _task_json plus the lease's
-- token, and the parents' status and result for a task with parents.
CREATE OR REPLACE FUNCTION pyscheduler._leased_json(t pyscheduler.tasks)
RETURNS jsonb
LANGUAGE sql STABLE
AS $$
    SELECT pyscheduler._task_json(t) || CASE WHEN t.after IS NULL THEN jsonb_build_object('token', t.lease_token)
        ELSE jsonb_build_object('token', t.lease_token, 'parents', pyscheduler._parent_results(t.after)) END
$$;

-- _trim_history(history, max): the last max entries.
CREATE OR REPLACE FUNCTION pyscheduler._trim_history(p_history jsonb, p_max integer)
RETURNS jsonb
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE WHEN jsonb_array_length(p_history) <= p_max THEN p_history
                ELSE coalesce((SELECT jsonb_agg(e ORDER BY i) FROM jsonb_array_elements(p_history)
                                 WITH ORDINALITY AS a(e, i)
                                WHERE i > jsonb_array_length(p_history) - p_max), '[]') END;
$$;

CREATE OR REPLACE FUNCTION pyscheduler._task_channel(p_queue text)
RETURNS text
LANGUAGE sql IMMUTABLE
AS $$ SELECT 'pyscheduler_tasks:' || p_queue $$;

-- _task_limit(name): an integer limit of pyscheduler.settings ('task_max_...').
CREATE OR REPLACE FUNCTION pyscheduler._task_limit(p_name text)
RETURNS integer
LANGUAGE sql STABLE
AS $$ SELECT pyscheduler._setting(p_name)::integer $$;

-- _async_commit_if_alone(): synchronous_commit = off for the calling
-- transaction, but only when the calling API function is provably the whole
-- transaction: a single-statement query message in its own implicit
-- transaction (statement and transaction began together), no write before it
-- (no xid), and called directly by that statement, not from other code. In
-- any other case (an explicit transaction, a multi-statement query, a call
-- from a function, the extended protocol) it changes nothing, so a caller's
-- own writes never lose durability. Called by the lease and heartbeat
-- functions; the worker library asks for asynchronous commits of its lease
-- session itself (SET synchronous_commit = off on that connection).
CREATE OR REPLACE FUNCTION pyscheduler._async_commit_if_alone()
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_stack text;
BEGIN
    IF statement_timestamp() = transaction_timestamp() AND txid_current_if_assigned() IS NULL
       AND strpos(rtrim(current_query(), E' \t\r\n;'), ';') = 0 THEN
        GET DIAGNOSTICS v_stack = PG_CONTEXT;
        -- three lines: this function, its PERFORM statement, and the API
        -- function the client's statement called; called from other code: more
        IF array_length(string_to_array(v_stack, E'\n'), 1) = 3 THEN
            PERFORM set_config('synchronous_commit', 'off', true);
        END IF;
    END IF;
END
$$;

-- _timeout(timeout, what): a lease timeout checked against its documented
-- bounds (no months or years part, more than 0 and at most 1 day) and made
-- calendar-free (pure seconds: a '1 day' lease is 86,400 s across a DST change).
CREATE OR REPLACE FUNCTION pyscheduler._timeout(p_timeout interval, p_what text DEFAULT 'timeout')
RETURNS interval
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_timeout IS NULL OR extract(month FROM p_timeout) <> 0 OR extract(year FROM p_timeout) <> 0
       OR NOT (p_timeout > interval '0' AND p_timeout <= interval '1 day') THEN
        RAISE EXCEPTION '% must be more than 0 and at most 1 day, without months or years, got %',
                        p_what, coalesce(p_timeout::text, 'NULL')
            USING ERRCODE = 'PS208', HINT = 'The lease lasts timeout from now, e.g. ''10 seconds''; heartbeats extend it.';
    END IF;
    RETURN make_interval(secs => extract(epoch FROM p_timeout)::double precision);
END
$$;

-- _check_task_args: PS204/PS208 for arguments shared by several functions.
-- NULL means "not given" for each argument (the *_given flags say a NULL was given).
CREATE OR REPLACE FUNCTION pyscheduler._check_task_args(
    p_queue text DEFAULT NULL, p_worker text DEFAULT NULL, p_priority bigint DEFAULT NULL,
    p_queue_given boolean DEFAULT false, p_worker_given boolean DEFAULT false,
    p_aging_rate double precision DEFAULT 0, p_aging_cap bigint DEFAULT 0)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_queue_given AND (p_queue IS NULL OR octet_length(p_queue) NOT BETWEEN 1 AND 40) THEN
        RAISE EXCEPTION 'queue must be 1 to 40 bytes long, got %', coalesce(quote_literal(p_queue), 'NULL')
            USING ERRCODE = 'PS208', HINT = 'Queue names become NOTIFY channel names, which are limited.';
    END IF;
    IF p_worker_given AND (p_worker IS NULL OR octet_length(p_worker) NOT BETWEEN 1 AND 40) THEN
        RAISE EXCEPTION 'worker must be 1 to 40 bytes long, got %', coalesce(quote_literal(p_worker), 'NULL')
            USING ERRCODE = 'PS208', HINT = 'Get a worker id from pyscheduler.register_worker().';
    END IF;
    IF p_priority IS NOT NULL AND p_priority NOT BETWEEN 0 AND 4294967295 THEN
        RAISE EXCEPTION 'priority must be an integer in 0..4294967295, got %', p_priority
            USING ERRCODE = 'PS204', HINT = 'Higher numbers are leased first; the default is 50.';
    END IF;
    -- NaN compares greater than every number in PostgreSQL: the upper bound rejects it too
    IF p_aging_rate IS NULL OR NOT (p_aging_rate >= 0 AND p_aging_rate <= 4294967295) THEN
        RAISE EXCEPTION 'aging_rate must be a finite number in 0..4294967295 (per second), got %',
                        coalesce(p_aging_rate::text, 'NULL')
            USING ERRCODE = 'PS208', HINT = 'aging_rate => 0 turns aging off.';
    END IF;
    IF p_aging_cap IS NULL OR p_aging_cap NOT BETWEEN 0 AND 4294967295 THEN
        RAISE EXCEPTION 'aging_cap must be an integer in 0..4294967295, got %', coalesce(p_aging_cap::text, 'NULL')
            USING ERRCODE = 'PS208', HINT = 'The effective priority an aging task reaches at most.';
    END IF;
END
$$;

-- _check_spec(spec, what, max_bytes): PS206 unless spec is a JSON object of at most max_bytes.
CREATE OR REPLACE FUNCTION pyscheduler._check_spec(p_spec jsonb, p_what text, p_max_bytes integer)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_spec IS NULL OR jsonb_typeof(p_spec) <> 'object' THEN
        RAISE EXCEPTION '% must be a JSON object, got %', p_what, coalesce(left(p_spec::text, 200), 'NULL')
            USING ERRCODE = 'PS206', HINT = 'spec is the application''s definition of the task, e.g. {"orderId": "233"}.';
    END IF;
    IF pg_column_size(p_spec) > p_max_bytes THEN
        RAISE EXCEPTION '% is % bytes, more than task_max_spec_bytes (%)', p_what, pg_column_size(p_spec), p_max_bytes
            USING ERRCODE = 'PS206', HINT = 'Keep large payloads elsewhere and put a reference in the spec.';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler._check_progress(p_progress double precision)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_progress IS NOT NULL AND NOT (p_progress >= 0 AND p_progress <= 1) THEN
        RAISE EXCEPTION 'progress must be a number in 0..1, got %', p_progress
            USING ERRCODE = 'PS205', HINT = 'Pass NULL to leave progress unchanged.';
    END IF;
END
$$;

-- _bad_error(e): whether e is not an error entry {"code": text, "args":
-- object, "description": text} (args and description optional).
CREATE OR REPLACE FUNCTION pyscheduler._bad_error(e jsonb)
RETURNS boolean
LANGUAGE sql IMMUTABLE
AS $$
    SELECT jsonb_typeof(e) IS DISTINCT FROM 'object'
        OR jsonb_typeof(e -> 'code') IS DISTINCT FROM 'string'
        OR (e ? 'args' AND jsonb_typeof(e -> 'args') <> 'object')
        OR (e ? 'description' AND jsonb_typeof(e -> 'description') <> 'string');
$$;

-- _error_entry(e): an error entry in its stored shape ({} and "" where left out).
CREATE OR REPLACE FUNCTION pyscheduler._error_entry(e jsonb)
RETURNS jsonb
LANGUAGE sql IMMUTABLE
AS $$
    SELECT jsonb_build_object('code', e -> 'code', 'args', coalesce(e -> 'args', '{}'),
                              'description', coalesce(e -> 'description', '""'));
$$;

-- _check_errors(errors, what): errors (a non-empty JSON array of error
-- entries) in their stored shape; PS207 naming what otherwise, or when it has
-- more than task_max_errors entries or task_max_errors_bytes bytes.
CREATE OR REPLACE FUNCTION pyscheduler._check_errors(p_errors jsonb, p_what text DEFAULT 'errors')
RETURNS jsonb
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_max integer := pyscheduler._task_limit('task_max_errors');
    v_max_bytes integer := pyscheduler._task_limit('task_max_errors_bytes');
BEGIN
    IF p_errors IS NULL OR jsonb_typeof(p_errors) <> 'array' OR jsonb_array_length(p_errors) = 0
       OR EXISTS (SELECT 1 FROM jsonb_array_elements(p_errors) e WHERE pyscheduler._bad_error(e)) THEN
        RAISE EXCEPTION '% must be a non-empty JSON array of {"code", "args", "description"}, got %',
                        p_what, coalesce(left(p_errors::text, 200), 'NULL')
            USING ERRCODE = 'PS207',
                  HINT = 'e.g. ''[{"code": "superseded", "args": {}, "description": "new task added"}]''';
    END IF;
    IF jsonb_array_length(p_errors) > v_max OR pg_column_size(p_errors) > v_max_bytes THEN
        RAISE EXCEPTION '% has % entries of % bytes, more than task_max_errors (%) or task_max_errors_bytes (%)',
                        p_what, jsonb_array_length(p_errors), pg_column_size(p_errors), v_max, v_max_bytes
            USING ERRCODE = 'PS207', HINT = 'Record the first errors and a short description.';
    END IF;
    RETURN (SELECT jsonb_agg(pyscheduler._error_entry(e) ORDER BY i)
              FROM jsonb_array_elements(p_errors) WITH ORDINALITY AS a(e, i));
END
$$;

-- _capped_errors(errors, max, max_bytes): the newest entries of errors that
-- fit in max entries and max_bytes bytes (a task that fails again and again
-- keeps its latest errors; the first ones go).
CREATE OR REPLACE FUNCTION pyscheduler._capped_errors(p_errors jsonb, p_max integer, p_max_bytes integer)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v jsonb := p_errors;
BEGIN
    WHILE jsonb_array_length(v) > 1 AND (jsonb_array_length(v) > p_max OR pg_column_size(v) > p_max_bytes) LOOP
        v := v - 0;
    END LOOP;
    RETURN v;
END
$$;

-- _retry_at(attempt, delay, jitter, base_s, cap_s, now): when a task whose
-- attempt-th attempt failed is tried again: now + delay when the lease holder
-- chose one, else now + the default backoff least(base * 2^attempt, cap)
-- seconds times jitter (a random factor in [0.5, 1.5) drawn by the caller, so
-- tasks that failed together do not come back together).
CREATE OR REPLACE FUNCTION pyscheduler._retry_at(
    p_attempt integer, p_delay interval, p_jitter double precision, p_base_s double precision,
    p_cap_s double precision, p_now timestamptz)
RETURNS timestamptz
LANGUAGE sql STABLE
AS $$
    SELECT p_now + coalesce(p_delay, make_interval(
        secs => least(p_base_s * power(2, least(greatest(p_attempt, 0), 60)), p_cap_s) * p_jitter))
$$;

-- _refusal(status, lease_token, token): THE state machine of a lease holder's
-- writes (heartbeat, complete, fail, abort, yield): NULL when the write is
-- allowed, else the SQLSTATE it is refused with. status NULL: the task does
-- not exist. (A scheduled task, waiting for a retry after its lease holder
-- failed it, is not running: PS202, as a ready one.)
CREATE OR REPLACE FUNCTION pyscheduler._refusal(
    p_status pyscheduler.task_status, p_lease_token uuid, p_token uuid)
RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE WHEN p_status IS NULL THEN 'PS200'          -- unknown (or cleaned up)
                WHEN p_status = 'cancelled' THEN 'PS203'    -- cancelled: stop
                WHEN p_status <> 'running' THEN 'PS202'     -- ready or scheduled again, or finished
                WHEN p_lease_token IS NULL THEN 'PS210'     -- the lease was yielded
                WHEN p_lease_token = p_token THEN NULL      -- the current lease: allowed
                ELSE 'PS201' END;                           -- another lease holds it
$$;

-- _requeue_refusal(status): the state machine of retry_task: NULL when the
-- task may be requeued (aborted or cancelled), else the SQLSTATE.
CREATE OR REPLACE FUNCTION pyscheduler._requeue_refusal(p_status pyscheduler.task_status)
RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE WHEN p_status IS NULL THEN 'PS200'
                WHEN p_status IN ('aborted', 'cancelled') THEN NULL
                ELSE 'PS211' END;                           -- live, or completed
$$;

-- _task_refused(rn, token): raise why a lease holder's write to task rn
-- matched no row (_refusal's code). Returns when the write would be allowed.
CREATE OR REPLACE FUNCTION pyscheduler._task_refused(p_rn uuid, p_token uuid)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_status pyscheduler.task_status;
    v_lease uuid;
    v_owner text;
    v_code text;
BEGIN
    SELECT status, lease_token, owner INTO v_status, v_lease, v_owner FROM pyscheduler.tasks WHERE rn = p_rn;
    v_code := pyscheduler._refusal(v_status, v_lease, p_token);
    CASE v_code
    WHEN 'PS200' THEN
        RAISE EXCEPTION 'unknown task %', p_rn
            USING ERRCODE = 'PS200', HINT = 'The task never existed or was cleaned up after its retention period.';
    WHEN 'PS203' THEN
        RAISE EXCEPTION 'task % was cancelled', p_rn
            USING ERRCODE = 'PS203', HINT = 'Stop working on it; the task stays cancelled.';
    WHEN 'PS202' THEN
        RAISE EXCEPTION 'task % is %, not running', p_rn, v_status
            USING ERRCODE = 'PS202', HINT = 'The lease expired or the task finished; lease a new task.';
    WHEN 'PS210' THEN
        RAISE EXCEPTION 'task % was yielded: its lease is over', p_rn
            USING ERRCODE = 'PS210', HINT = 'The monitor makes it ready for another lease; stop working on it.';
    WHEN 'PS201' THEN
        RAISE EXCEPTION 'task % is held by another lease (owner %): this token''s lease is over', p_rn, v_owner
            USING ERRCODE = 'PS201', HINT = 'The lease expired and the task was leased again; stop working on it.';
    ELSE
        NULL;
    END CASE;
END
$$;

-- _check_result(result): PS217 when a completion's result is larger than
-- task_max_result_bytes (stored size); any JSON value, or NULL (none).
CREATE OR REPLACE FUNCTION pyscheduler._check_result(p_result jsonb, p_what text DEFAULT 'result')
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF p_result IS NOT NULL AND pg_column_size(p_result) > pyscheduler._task_limit('task_max_result_bytes') THEN
        RAISE EXCEPTION '% is % bytes, more than task_max_result_bytes (%)', p_what, pg_column_size(p_result),
                        pyscheduler._task_limit('task_max_result_bytes')
            USING ERRCODE = 'PS217', HINT = 'Keep large results elsewhere and return a reference.';
    END IF;
END
$$;

-- _finished(rns, p_now): what follows the end (completed, aborted,
-- cancelled) of tasks rns that are watched or have children; the writes that
-- end a task call it only for those (RETURNING watched OR has_children), so
-- a task nobody waits for ends with nothing more. A watched task NOTIFYs
-- pyscheduler_task:<rn> with its status. Its children (task_edges, deleted
-- now) count it down: a child whose last parent finished becomes ready (or
-- scheduled until its run_at) and its queue is woken; a parent aborted or
-- cancelled cancels the child instead (history TaskParentFailed naming it),
-- unless the child runs anyway (on_parent_failure 'run'); the children it
-- cancels end in turn (the loop). Children are updated in rn order, so
-- parents finishing at once wait for each other on a common child, never
-- deadlock. A fan-in child after 10,000 parents is one row counted down once
-- per finishing transaction, never a scan of its parents.
CREATE OR REPLACE FUNCTION pyscheduler._finished(p_rns uuid[], p_now timestamptz)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_rns uuid[] := p_rns;
    v_queues text[];
BEGIN
    WHILE cardinality(v_rns) > 0 LOOP
        PERFORM pg_notify('pyscheduler_task:' || t.rn, t.status::text)
           FROM pyscheduler.tasks t WHERE t.rn = ANY (v_rns) AND t.watched;
        WITH e AS (
            DELETE FROM pyscheduler.task_edges e WHERE e.parent = ANY (v_rns)
            RETURNING e.parent, e.child),
        p AS (
            SELECT e.child, count(*)::integer AS n,
                   (array_agg(e.parent ORDER BY e.parent) FILTER (WHERE t.status <> 'completed'))[1] AS failed,
                   (array_agg(t.status ORDER BY e.parent) FILTER (WHERE t.status <> 'completed'))[1] AS failed_status
              FROM e JOIN pyscheduler.tasks t ON t.rn = e.parent
             GROUP BY e.child
             ORDER BY e.child),
        u AS (
            UPDATE pyscheduler.tasks c
               SET status = CASE WHEN p.failed IS NOT NULL AND c.on_parent_failure IS NULL THEN 'cancelled'
                                 WHEN c.waiting_on > p.n THEN 'waiting'
                                 WHEN c.run_at > p_now THEN 'scheduled'
                                 ELSE 'ready' END::pyscheduler.task_status,
                   waiting_on = CASE WHEN p.failed IS NOT NULL AND c.on_parent_failure IS NULL THEN 0
                                     ELSE greatest(c.waiting_on - p.n, 0) END,
                   updated = p_now,
                   history = CASE WHEN p.failed IS NOT NULL AND c.on_parent_failure IS NULL
                                  THEN c.history || jsonb_build_array(jsonb_build_object(
                                           '_typ', 'TaskParentFailed', 'parent', p.failed, 'status', p.failed_status,
                                           'time', pyscheduler._ts(p_now)))
                                  ELSE c.history END
              FROM p
             WHERE c.rn = p.child AND c.status = 'waiting'
            RETURNING c.rn, c.status, c.queue, c.watched OR c.has_children AS more)
        SELECT coalesce(array_agg(u.rn) FILTER (WHERE u.status = 'cancelled' AND u.more), '{}'),
               coalesce(array_agg(DISTINCT u.queue) FILTER (WHERE u.status IN ('ready', 'scheduled')), '{}')
          INTO v_rns, v_queues FROM u;
        PERFORM pyscheduler._notify_throttled(pyscheduler._task_channel(q)) FROM unnest(v_queues) q;
    END LOOP;
END
$$;

-- ---------------------------------------------------------------- client

-- _check_submit(queue, priority, run_at, max_attempts, p_now): PS204, PS208 and
-- PS212 for the arguments submit_task and submit_tasks share.
CREATE OR REPLACE FUNCTION pyscheduler._check_submit(
    p_queue text, p_priority bigint, p_run_at timestamptz, p_max_attempts integer)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    PERFORM pyscheduler._check_task_args(p_queue => p_queue, p_queue_given => true,
                                         p_priority => coalesce(p_priority, -1));
    IF p_run_at IS NOT NULL AND NOT pyscheduler._instant_ok(p_run_at) THEN
        PERFORM pyscheduler._require_instant('run_at', p_run_at, 'PS212');
    END IF;
    IF p_max_attempts IS NOT NULL AND p_max_attempts NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'max_attempts must be NULL (the setting task_max_attempts) or in 1..1000, got %', p_max_attempts
            USING ERRCODE = 'PS208', HINT = 'Attempts are leases that were not yielded; 1 means never retried.';
    END IF;
END
$$;

-- _check_unique_key(key, what): PS213 unless key is NULL or a clean label of
-- at most 200 bytes (_label_refusal: no control, zero-width or bidirectional
-- formatting characters, no leading or trailing white space).
CREATE OR REPLACE FUNCTION pyscheduler._check_unique_key(p_key text, p_what text DEFAULT 'unique_key')
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v_why text;
BEGIN
    IF p_key IS NOT NULL THEN
        v_why := pyscheduler._label_refusal(p_key, 200);
        IF v_why IS NOT NULL THEN
            RAISE EXCEPTION '% %, got %', p_what, v_why, quote_literal(left(p_key, 100))
                USING ERRCODE = 'PS213', HINT = 'A unique key names the work, e.g. ''invoice:233''; NULL for none.';
        END IF;
    END IF;
END
$$;

-- _live_task(queue, unique_key): the live (waiting, scheduled, ready or running) task
-- holding unique_key in queue, as a deduplicated answer, or NULL.
CREATE OR REPLACE FUNCTION pyscheduler._live_task(p_queue text, p_key text)
RETURNS jsonb
LANGUAGE sql STABLE
AS $$
    SELECT pyscheduler._task_json(t) || '{"deduplicated": true}'
      FROM pyscheduler.tasks t
     WHERE t.queue = p_queue AND t.unique_key = p_key AND t.unique_key IS NOT NULL
       AND t.status IN ('waiting', 'scheduled', 'ready', 'running');
$$;

-- _check_concurrency_key(key, what): PS215 unless key is NULL or a clean label
-- of at most 200 bytes (as a unique_key).
CREATE OR REPLACE FUNCTION pyscheduler._check_concurrency_key(p_key text, p_what text DEFAULT 'concurrency_key')
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v_why text;
BEGIN
    IF p_key IS NOT NULL THEN
        v_why := pyscheduler._label_refusal(p_key, 200);
        IF v_why IS NOT NULL THEN
            RAISE EXCEPTION '% %, got %', p_what, v_why, quote_literal(left(p_key, 100))
                USING ERRCODE = 'PS215', HINT = 'A concurrency key names what the limit protects, e.g. ''customer:42''.';
        END IF;
    END IF;
END
$$;

-- _parents(after, on_parent_failure): for a task submitted after the tasks
-- after: PS219 unless they are at most task_max_parents existing tasks the
-- caller may act on (its role's, or any for admin; duplicates count once).
-- The live ones (waiting, scheduled, ready, running) are locked and marked
-- has_children, in rn order (so concurrent submits after common parents
-- never deadlock, and a parent finishing meanwhile waits for this
-- transaction, then finds the new edges); returns them, and the first parent
-- that failed (aborted or cancelled) already, with its status.
CREATE OR REPLACE FUNCTION pyscheduler._parents(p_after uuid[], OUT live uuid[], OUT failed uuid,
                                                OUT failed_status pyscheduler.task_status)
LANGUAGE plpgsql
AS $$
DECLARE
    v_bad record;
    v_admin boolean := pg_catalog.pg_has_role(pyscheduler._caller(), pyscheduler._role('admin'), 'MEMBER');
BEGIN
    IF cardinality(p_after) > pyscheduler._task_limit('task_max_parents') OR array_position(p_after, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'after must be an array of at most task_max_parents (%) task ids without NULL, got % ids',
                        pyscheduler._task_limit('task_max_parents'), cardinality(p_after)
            USING ERRCODE = 'PS219', HINT = 'A task after many tasks: submit it after fewer join tasks.';
    END IF;
    WITH u AS (
        UPDATE pyscheduler.tasks t SET has_children = true
          FROM (SELECT DISTINCT a.rn FROM unnest(p_after) AS a(rn) ORDER BY a.rn) AS a
         WHERE t.rn = a.rn AND t.status IN ('waiting', 'scheduled', 'ready', 'running')
           AND (v_admin OR pyscheduler._may_act(t.submitted_by))
        RETURNING t.rn)
    SELECT coalesce(array_agg(u.rn), '{}') INTO live FROM u;
    SELECT a.rn, t.rn IS NULL AS missing INTO v_bad
      FROM unnest(p_after) AS a(rn) LEFT JOIN pyscheduler.tasks t ON t.rn = a.rn
     WHERE t.rn IS NULL OR NOT (v_admin OR pyscheduler._may_act(t.submitted_by))
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'after names %: %', v_bad.rn,
                        CASE WHEN v_bad.missing THEN 'no such task' ELSE 'a task of another role' END
            USING ERRCODE = 'PS219', HINT = 'A task may wait only for existing tasks of its own role.';
    END IF;
    SELECT t.rn, t.status INTO failed, failed_status FROM pyscheduler.tasks t
     WHERE t.rn = ANY (p_after) AND t.status IN ('aborted', 'cancelled')
     ORDER BY t.rn LIMIT 1;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler._submit_tasks(
    queue text, specs jsonb, priority bigint DEFAULT 50, run_at timestamptz DEFAULT NULL,
    unique_keys text[] DEFAULT NULL, max_attempts integer DEFAULT NULL, p_now timestamptz DEFAULT now(),
    p_submitted_by name DEFAULT NULL, concurrency_keys text[] DEFAULT NULL, after uuid[] DEFAULT NULL,
    on_parent_failure text DEFAULT 'cancel')
RETURNS TABLE (task jsonb)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_max integer := pyscheduler._task_limit('task_max_spec_bytes');
    v_prefix bigint := pyscheduler._rn_prefix(p_now);
    v_status pyscheduler.task_status := CASE WHEN _submit_tasks.run_at > p_now THEN 'scheduled' ELSE 'ready' END;
    v_by name := coalesce(p_submitted_by, pyscheduler._caller());
    v_bad record;
    v_answers jsonb[];
    v_todo integer[];
    v_seqs bigint[];
    v_ps integer[];
    v_js jsonb[];
    v_inserted boolean := false;
    v_parents record;
    v_waiting integer := 0;
    v_history jsonb := '[]';
    v_failure text := CASE WHEN _submit_tasks.on_parent_failure = 'cancel' THEN NULL
                           ELSE _submit_tasks.on_parent_failure END;
    v_children uuid[] := '{}';
BEGIN
    PERFORM pyscheduler._check_submit(_submit_tasks.queue, _submit_tasks.priority, _submit_tasks.run_at,
                                      _submit_tasks.max_attempts);
    IF specs IS NULL OR jsonb_typeof(specs) <> 'array' THEN
        RAISE EXCEPTION 'specs must be a JSON array of spec objects, got %', coalesce(left(specs::text, 200), 'NULL')
            USING ERRCODE = 'PS206', HINT = 'e.g. ''[{"orderId": "1"}, {"orderId": "2"}]''';
    END IF;
    SELECT e, i INTO v_bad FROM jsonb_array_elements(specs) WITH ORDINALITY AS a(e, i)
     WHERE jsonb_typeof(e) <> 'object' OR pg_column_size(e) > v_max LIMIT 1;
    IF FOUND THEN
        PERFORM pyscheduler._check_spec(v_bad.e, format('specs[%s]', v_bad.i - 1), v_max);
    END IF;
    IF concurrency_keys IS NOT NULL THEN
        IF cardinality(concurrency_keys) <> jsonb_array_length(specs) THEN
            RAISE EXCEPTION 'concurrency_keys must be NULL or as long as specs, got % and %',
                            cardinality(concurrency_keys), jsonb_array_length(specs)
                USING ERRCODE = 'PS215', HINT = 'concurrency_keys[i] is the key of specs[i - 1] (NULL: none).';
        END IF;
        SELECT k, i INTO v_bad FROM unnest(concurrency_keys) WITH ORDINALITY AS u(k, i)
         WHERE k IS NOT NULL AND pyscheduler._label_refusal(k, 200) IS NOT NULL LIMIT 1;
        IF FOUND THEN
            PERFORM pyscheduler._check_concurrency_key(v_bad.k, format('concurrency_keys[%s]', v_bad.i));
        END IF;
    END IF;
    IF _submit_tasks.on_parent_failure IS NULL OR _submit_tasks.on_parent_failure NOT IN ('cancel', 'run') THEN
        RAISE EXCEPTION 'on_parent_failure must be cancel or run, got %',
                        coalesce(quote_literal(_submit_tasks.on_parent_failure), 'NULL')
            USING ERRCODE = 'PS219', HINT = 'cancel (the default): a parent aborted or cancelled cancels the task; run: it runs anyway.';
    END IF;
    -- Dependencies: wait for the live parents (status waiting, waiting_on =
    -- how many); a parent that failed already cancels the task at once (or,
    -- with on_parent_failure => 'run', counts as finished).
    IF after IS NOT NULL AND cardinality(after) > 0 THEN
        v_parents := pyscheduler._parents(after);
        v_waiting := cardinality(v_parents.live);
        IF v_parents.failed IS NOT NULL AND v_failure IS NULL THEN
            v_status := 'cancelled';
            v_history := jsonb_build_array(jsonb_build_object('_typ', 'TaskParentFailed', 'parent', v_parents.failed,
                                                              'status', v_parents.failed_status,
                                                              'time', pyscheduler._ts(p_now)));
            v_waiting := 0;
        ELSIF v_waiting > 0 THEN
            v_status := 'waiting';
        END IF;
    END IF;
    IF unique_keys IS NULL THEN
        WITH ins AS (
            INSERT INTO pyscheduler.tasks AS t (rn, seq, queue, spec, priority, status, progress, created, updated,
                                                errors, history, run_at, max_attempts, submitted_by, concurrency_key,
                                                after, waiting_on, on_parent_failure)
            SELECT pyscheduler._task_rn(v_prefix, a.seq), a.seq, _submit_tasks.queue, a.e, _submit_tasks.priority,
                   v_status, 0, p_now, p_now, '[]', v_history, _submit_tasks.run_at, _submit_tasks.max_attempts, v_by,
                   concurrency_keys[a.i], after, v_waiting, v_failure
              FROM (SELECT nextval('pyscheduler.task_seq') AS seq, e, i  -- after the sort: seq follows the order of specs
                      FROM jsonb_array_elements(specs) WITH ORDINALITY AS a(e, i)
                     ORDER BY a.i) AS a
            RETURNING t.rn, pyscheduler._task_json(t) AS json)
        SELECT coalesce(array_agg(ins.json), '{}'), coalesce(array_agg(ins.rn), '{}') INTO v_js, v_children FROM ins;
        v_answers := v_js;
        v_inserted := cardinality(v_js) > 0;
    ELSE
    -- Unique keys, one per spec (NULL: none): each spec either becomes a task or
    -- is answered with the live task that holds its key (marked "deduplicated"),
    -- the first of equal keys in the array winning. One row per spec, in order.
    IF cardinality(unique_keys) <> jsonb_array_length(specs) THEN
        RAISE EXCEPTION 'unique_keys must be NULL or as long as specs, got % and %',
                        cardinality(unique_keys), jsonb_array_length(specs)
            USING ERRCODE = 'PS208', HINT = 'unique_keys[i] is the key of specs[i - 1] (NULL: none).';
    END IF;
    SELECT k, i INTO v_bad FROM unnest(unique_keys) WITH ORDINALITY AS u(k, i)
     WHERE k IS NOT NULL AND pyscheduler._label_refusal(k, 200) IS NOT NULL LIMIT 1;
    IF FOUND THEN
        PERFORM pyscheduler._check_unique_key(v_bad.k, format('unique_keys[%s]', v_bad.i));
    END IF;
    v_answers := array_fill(NULL::jsonb, ARRAY[cardinality(unique_keys)]);
    v_todo := ARRAY(SELECT generate_series(1, cardinality(unique_keys)));
    FOR v_round IN 1..10 LOOP
        -- insert the specs not answered yet; a key held by a live task (or by an
        -- earlier spec of this statement) is skipped by DO NOTHING. seq follows the
        -- order of specs (the lease order); the rows go in in key order, so
        -- concurrent batches with keys in common wait for each other, never deadlock.
        v_seqs := ARRAY(SELECT nextval('pyscheduler.task_seq') FROM unnest(v_todo));
        WITH ins AS (
            INSERT INTO pyscheduler.tasks AS t (rn, seq, queue, spec, priority, status, progress, created, updated,
                                                errors, history, run_at, max_attempts, submitted_by, unique_key,
                                                concurrency_key, after, waiting_on, on_parent_failure)
            SELECT pyscheduler._task_rn(v_prefix, x.seq), x.seq, _submit_tasks.queue, x.e, _submit_tasks.priority,
                   v_status, 0, p_now, p_now, '[]', v_history, _submit_tasks.run_at, _submit_tasks.max_attempts, v_by,
                   unique_keys[x.p], concurrency_keys[x.p], after, v_waiting, v_failure
              FROM (SELECT s.p, s.seq, a.e
                      FROM unnest(v_todo, v_seqs) AS s(p, seq)
                      JOIN jsonb_array_elements(specs) WITH ORDINALITY AS a(e, i) ON a.i = s.p
                     ORDER BY unique_keys[s.p] COLLATE "C" NULLS FIRST, s.p) AS x
            ON CONFLICT (queue, unique_key)
               WHERE unique_key IS NOT NULL AND status IN ('waiting', 'scheduled', 'ready', 'running')
            DO NOTHING
            RETURNING t.seq, t.rn, pyscheduler._task_json(t) AS json)
        SELECT coalesce(array_agg(s.p), '{}'), coalesce(array_agg(ins.json), '{}'),
               v_children || coalesce(array_agg(ins.rn), '{}')
          INTO v_ps, v_js, v_children
          FROM ins JOIN unnest(v_todo, v_seqs) AS s(p, seq) ON s.seq = ins.seq;
        FOR j IN 1..cardinality(v_ps) LOOP
            v_answers[v_ps[j]] := v_js[j];
        END LOOP;
        v_inserted := v_inserted OR cardinality(v_ps) > 0;
        -- the others: answered with the live task that holds their key
        v_todo := ARRAY(SELECT p FROM unnest(v_todo) AS p WHERE v_answers[p] IS NULL);
        FOR j IN 1..cardinality(v_todo) LOOP
            v_answers[v_todo[j]] := pyscheduler._live_task(_submit_tasks.queue, unique_keys[v_todo[j]]);
        END LOOP;
        -- a key whose task finished meanwhile is free again: insert once more
        v_todo := ARRAY(SELECT p FROM unnest(v_todo) AS p WHERE v_answers[p] IS NULL);
        EXIT WHEN cardinality(v_todo) = 0;
    END LOOP;
    IF cardinality(v_todo) > 0 THEN
        RAISE EXCEPTION 'unique keys kept changing hands while submitting; try again'
            USING ERRCODE = '40001';
    END IF;
    END IF;
    IF v_waiting > 0 AND cardinality(v_children) > 0 THEN
        INSERT INTO pyscheduler.task_edges (parent, child)
        SELECT p, c FROM unnest(v_parents.live) AS p, unnest(v_children) AS c;
    END IF;
    IF v_inserted AND v_status IN ('ready', 'scheduled') THEN
        PERFORM pyscheduler._notify_throttled(pyscheduler._task_channel(_submit_tasks.queue));
    END IF;
    RETURN QUERY SELECT a.answer FROM unnest(v_answers) WITH ORDINALITY AS a(answer, i) ORDER BY a.i;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler._submit_task(
    queue text, spec jsonb, priority bigint DEFAULT 50, run_at timestamptz DEFAULT NULL, unique_key text DEFAULT NULL,
    max_attempts integer DEFAULT NULL, p_now timestamptz DEFAULT now(), p_submitted_by name DEFAULT NULL,
    concurrency_key text DEFAULT NULL, after uuid[] DEFAULT NULL, on_parent_failure text DEFAULT 'cancel')
RETURNS jsonb
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_task jsonb;
    v_seq bigint;
    v_status pyscheduler.task_status := CASE WHEN _submit_task.run_at > p_now THEN 'scheduled' ELSE 'ready' END;
    v_by name := coalesce(p_submitted_by, pyscheduler._caller());
BEGIN
    PERFORM pyscheduler._check_submit(_submit_task.queue, _submit_task.priority, _submit_task.run_at,
                                      _submit_task.max_attempts);
    PERFORM pyscheduler._check_spec(_submit_task.spec, 'spec', pyscheduler._task_limit('task_max_spec_bytes'));
    PERFORM pyscheduler._check_unique_key(_submit_task.unique_key);
    PERFORM pyscheduler._check_concurrency_key(_submit_task.concurrency_key);
    IF after IS NOT NULL OR on_parent_failure IS DISTINCT FROM 'cancel' THEN
        -- dependencies: the batch path has them (one spec, one answer)
        RETURN (SELECT s.task FROM pyscheduler._submit_tasks(
                    _submit_task.queue, jsonb_build_array(_submit_task.spec), _submit_task.priority, _submit_task.run_at,
                    CASE WHEN _submit_task.unique_key IS NOT NULL THEN ARRAY[_submit_task.unique_key] END,
                    _submit_task.max_attempts, p_now, p_submitted_by,
                    CASE WHEN _submit_task.concurrency_key IS NOT NULL THEN ARRAY[_submit_task.concurrency_key] END,
                    _submit_task.after, _submit_task.on_parent_failure) AS s);
    END IF;
    -- One live task per (queue, unique_key): the unique index decides, so
    -- concurrent submits of one key make one task (a submit waits for a
    -- concurrent one's transaction, then finds its task). Without a key the
    -- insert always succeeds (ON CONFLICT costs nothing measurable then).
    FOR v_round IN 1..10 LOOP
        v_seq := nextval('pyscheduler.task_seq');
        INSERT INTO pyscheduler.tasks AS t (rn, seq, queue, spec, priority, status, progress, created, updated, errors,
                                            history, run_at, max_attempts, submitted_by, unique_key, concurrency_key)
        VALUES (pyscheduler._task_rn(pyscheduler._rn_prefix(p_now), v_seq), v_seq, _submit_task.queue,
                _submit_task.spec, _submit_task.priority, v_status, 0, p_now, p_now, '[]', '[]', _submit_task.run_at,
                _submit_task.max_attempts, v_by, _submit_task.unique_key, _submit_task.concurrency_key)
        ON CONFLICT (queue, unique_key)
           WHERE unique_key IS NOT NULL AND status IN ('waiting', 'scheduled', 'ready', 'running')
        DO NOTHING
        RETURNING pyscheduler._task_json(t) INTO v_task;
        IF v_task IS NOT NULL THEN
            PERFORM pyscheduler._notify_throttled(pyscheduler._task_channel(_submit_task.queue));
            RETURN v_task;
        END IF;
        v_task := pyscheduler._live_task(_submit_task.queue, _submit_task.unique_key);
        IF v_task IS NOT NULL THEN
            RETURN v_task;
        END IF;
        -- the task that held the key finished meanwhile: the key is free, insert again
    END LOOP;
    RAISE EXCEPTION 'unique key % kept changing hands while submitting; try again', _submit_task.unique_key
        USING ERRCODE = '40001';
END
$$;

-- _run_at(run_at, run_in, now): when a submitted task may first be leased:
-- run_at, or now + run_in (0..365 days, as seconds, like fail_task's
-- retry_in), or NULL (at once). PS212 when both are given or run_in is out of
-- bounds (run_at's own bounds are _check_submit's).
CREATE OR REPLACE FUNCTION pyscheduler._run_at(p_run_at timestamptz, p_run_in interval, p_now timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_run_in IS NULL THEN
        RETURN p_run_at;
    END IF;
    IF p_run_at IS NOT NULL THEN
        RAISE EXCEPTION 'give run_at or run_in, not both'
            USING ERRCODE = 'PS212', HINT = 'run_at is an instant, run_in a delay from now.';
    END IF;
    IF NOT extract(epoch FROM p_run_in) BETWEEN 0 AND 31536000 THEN  -- 365 days, as seconds
        RAISE EXCEPTION 'run_in must be between 0 and 365 days, got %', p_run_in
            USING ERRCODE = 'PS212', HINT = 'For a later time, give run_at.';
    END IF;
    RETURN p_now + make_interval(secs => extract(epoch FROM p_run_in)::double precision);
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.submit_task(
    queue text, spec jsonb, priority bigint DEFAULT 50, run_at timestamptz DEFAULT NULL, unique_key text DEFAULT NULL,
    max_attempts integer DEFAULT NULL, run_in interval DEFAULT NULL, concurrency_key text DEFAULT NULL,
    after uuid[] DEFAULT NULL, on_parent_failure text DEFAULT 'cancel')
RETURNS jsonb
LANGUAGE sql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* submit_task(queue, spec, priority => 50, run_at => NULL, unique_key => NULL,
               max_attempts => NULL, run_in => NULL, concurrency_key => NULL,
               after => NULL, on_parent_failure => 'cancel') -> task jsonb
   Add a task to queue and wake that queue's idle workers (NOTIFY). The task
   belongs to the calling role (submitted_by).
   queue:        1..40 bytes; tasks of a queue are leased by that queue's workers.
   spec:         a JSON object, opaque to pyscheduler, at most task_max_spec_bytes.
   priority:     0..4294967295, higher is leased first; equal priorities in
                 submission order.
   run_at:       not leased before this time (database clock): the task is
                 'scheduled' until then; 'ready' at once when NULL or past.
                 In [1970-01-01Z, 9999-01-01Z).
   run_in:       or: not leased before now() + run_in (0..365 days, applied
                 as that many seconds); give run_at or run_in, not both.
   unique_key:   while a task of queue with this key is waiting, scheduled,
                 ready or running, submitting another returns that task
                 instead, with "deduplicated": true (nothing is changed). A
                 label of at most 200 bytes; free again once the task finished.
   max_attempts: attempts (leases not yielded) before a failing or timing-out
                 task is aborted, 1..1000; NULL: the setting task_max_attempts.
   concurrency_key: tasks of one key share the queue's running_per_key limit
                 (set_queue_limits); a label of at most 200 bytes.
   after:        task ids (of the caller's role, any queue, at most
                 task_max_parents): the task is 'waiting' until every one of
                 them has finished, then ready (or scheduled until run_at).
                 Finished parents count as done at once.
   on_parent_failure: 'cancel' (default): a parent aborted or cancelled
                 cancels the task (history TaskParentFailed naming it), and its
                 own dependents in turn; 'run': it runs anyway.
   Errors: PS204 priority, PS206 spec, PS208 queue, max_attempts, PS212 run_at or
   run_in, PS213 unique_key, PS215 concurrency_key, PS219 after or
   on_parent_failure. */
    SELECT pyscheduler._submit_task(queue, spec, priority, pyscheduler._run_at(run_at, run_in, now()), unique_key,
                                    max_attempts, now(), NULL, concurrency_key, after, on_parent_failure);
$$;
COMMENT ON FUNCTION pyscheduler.submit_task(text, jsonb, bigint, timestamptz, text, integer, interval, text, uuid[], text) IS
    'Submit a task to a queue (priority; run_at or run_in; unique_key; max_attempts; concurrency_key; after: wait for other tasks); returns it as JSON.';

CREATE OR REPLACE FUNCTION pyscheduler.submit_tasks(
    queue text, specs jsonb, priority bigint DEFAULT 50, run_at timestamptz DEFAULT NULL,
    unique_keys text[] DEFAULT NULL, max_attempts integer DEFAULT NULL, run_in interval DEFAULT NULL,
    concurrency_keys text[] DEFAULT NULL, after uuid[] DEFAULT NULL, on_parent_failure text DEFAULT 'cancel')
RETURNS TABLE (task jsonb)
LANGUAGE sql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* submit_tasks(queue, specs, priority => 50, run_at => NULL, unique_keys => NULL,
                max_attempts => NULL, run_in => NULL, concurrency_keys => NULL,
                after => NULL, on_parent_failure => 'cancel') -> setof (task jsonb)
   The batch form of submit_task: specs is a JSON array of spec objects, all
   submitted to queue with one priority, run_at (or run_in), max_attempts and
   after in one statement, one NOTIFY; they lease in the order of specs.
   unique_keys: NULL, or one key per spec (unique_keys[i] for specs[i - 1],
   NULL for none): a spec whose key a live task holds (or an earlier spec of
   the array) is answered with that task, "deduplicated": true; the answer
   then has one row per spec, in the order of specs. concurrency_keys: NULL,
   or one key per spec (NULL for none).
   Errors: PS204 priority, PS206 specs (not an array of objects, or an element
   too large: the message names it), PS208 queue, max_attempts, unique_keys
   not as long as specs, PS212 run_at or run_in, PS213 a unique key (named),
   PS215 a concurrency key (named) or concurrency_keys not as long as specs,
   PS219 after or on_parent_failure. */
    SELECT t.task FROM pyscheduler._submit_tasks(queue, specs, priority, pyscheduler._run_at(run_at, run_in, now()),
                                                 unique_keys, max_attempts, now(), NULL, concurrency_keys, after,
                                                 on_parent_failure) AS t;
$$;
COMMENT ON FUNCTION pyscheduler.submit_tasks(text, jsonb, bigint, timestamptz, text[], integer, interval, text[], uuid[], text) IS
    'Submit a JSON array of specs as tasks of one queue (leased in array order), optionally delayed, after other tasks, one unique and one concurrency key each; returns the tasks.';

CREATE OR REPLACE FUNCTION pyscheduler._submit_workflow(workflow jsonb, p_now timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_max integer := pyscheduler._task_limit('task_max_workflow_nodes');
    v_n integer;
    v_index jsonb := '{}';      -- name -> position (0-based)
    v_node jsonb;
    v_name text;
    v_why text;
    v_indegree integer[];
    v_children jsonb[];         -- position -> [positions of its children]
    v_queue integer[];
    v_head integer := 1;
    v_order integer[] := '{}';
    v_rns uuid[];
    v_after uuid[];
    v_task jsonb;
    v_answer jsonb := '{}';
    v_p integer;
    v_c integer;
BEGIN
    IF workflow IS NULL OR jsonb_typeof(workflow) <> 'array' OR jsonb_array_length(workflow) = 0 THEN
        RAISE EXCEPTION 'workflow must be a non-empty JSON array of nodes, got %', coalesce(left(workflow::text, 200), 'NULL')
            USING ERRCODE = 'PS220',
                  HINT = 'e.g. ''[{"name": "a", "queue": "q", "spec": {}}, {"name": "b", "queue": "q", "spec": {}, "after": ["a"]}]''';
    END IF;
    v_n := jsonb_array_length(workflow);
    IF v_n > v_max THEN
        RAISE EXCEPTION 'workflow has % nodes, more than task_max_workflow_nodes (%)', v_n, v_max
            USING ERRCODE = 'PS220', HINT = 'Submit a large graph in parts: later parts may name earlier tasks by rn (after).';
    END IF;
    -- names: clean labels, unique; each node an object with a name and, if any, after: an array of names
    FOR i IN 0..v_n - 1 LOOP
        v_node := workflow -> i;
        IF jsonb_typeof(v_node) <> 'object' OR jsonb_typeof(v_node -> 'name') IS DISTINCT FROM 'string'
           OR (v_node ? 'after' AND (jsonb_typeof(v_node -> 'after') <> 'array'
               OR EXISTS (SELECT 1 FROM jsonb_array_elements(v_node -> 'after') a WHERE jsonb_typeof(a) <> 'string')))
           OR (v_node - ARRAY['name', 'queue', 'spec', 'after', 'priority', 'unique_key', 'max_attempts',
                              'concurrency_key', 'run_in', 'on_parent_failure']) <> '{}' THEN
            RAISE EXCEPTION 'workflow[%] must be an object with a "name", an "after" array of names and only the keys name, queue, spec, after, priority, unique_key, max_attempts, concurrency_key, run_in, on_parent_failure; got %',
                            i, left(v_node::text, 200)
                USING ERRCODE = 'PS220';
        END IF;
        v_name := v_node ->> 'name';
        v_why := pyscheduler._label_refusal(v_name, 200);
        IF v_why IS NOT NULL THEN
            RAISE EXCEPTION 'workflow[%].name %', i, v_why USING ERRCODE = 'PS220';
        END IF;
        IF v_index ? v_name THEN
            RAISE EXCEPTION 'workflow[%]: the name % is used twice', i, quote_literal(v_name) USING ERRCODE = 'PS220';
        END IF;
        v_index := v_index || jsonb_build_object(v_name, i);
    END LOOP;
    -- edges, then Kahn's order (a cycle leaves nodes out)
    v_indegree := array_fill(0, ARRAY[v_n]);
    v_children := array_fill('[]'::jsonb, ARRAY[v_n]);
    FOR i IN 0..v_n - 1 LOOP
        FOR v_name IN SELECT DISTINCT a FROM jsonb_array_elements_text(workflow -> i -> 'after') AS a LOOP
            IF NOT v_index ? v_name THEN
                RAISE EXCEPTION 'workflow[%] is after %, which no node of the workflow is named', i,
                                quote_literal(left(v_name, 100))
                    USING ERRCODE = 'PS220';
            END IF;
            v_p := (v_index ->> v_name)::integer;
            v_children[v_p + 1] := v_children[v_p + 1] || to_jsonb(i);
            v_indegree[i + 1] := v_indegree[i + 1] + 1;
        END LOOP;
    END LOOP;
    v_queue := ARRAY(SELECT i - 1 FROM generate_subscripts(v_indegree, 1) AS i WHERE v_indegree[i] = 0);
    WHILE v_head <= coalesce(cardinality(v_queue), 0) LOOP
        v_p := v_queue[v_head];
        v_head := v_head + 1;
        v_order := v_order || v_p;
        FOR v_c IN SELECT c::integer FROM jsonb_array_elements_text(v_children[v_p + 1]) AS c LOOP
            v_indegree[v_c + 1] := v_indegree[v_c + 1] - 1;
            IF v_indegree[v_c + 1] = 0 THEN
                v_queue := v_queue || v_c;
            END IF;
        END LOOP;
    END LOOP;
    IF cardinality(v_order) < v_n THEN
        RAISE EXCEPTION 'workflow has a cycle (through %)',
                        (SELECT string_agg(quote_literal(workflow -> (i - 1) ->> 'name'), ', ')
                           FROM (SELECT i FROM generate_subscripts(v_indegree, 1) AS i WHERE v_indegree[i] > 0
                                 LIMIT 5) AS x)
            USING ERRCODE = 'PS220', HINT = 'A task cannot wait for itself, directly or through others.';
    END IF;
    -- submit, parents first
    v_rns := array_fill(NULL::uuid, ARRAY[v_n]);
    FOREACH v_p IN ARRAY v_order LOOP
        v_node := workflow -> v_p;
        v_after := ARRAY(SELECT v_rns[(v_index ->> a)::integer + 1]
                           FROM jsonb_array_elements_text(v_node -> 'after') AS a);
        v_task := pyscheduler._submit_task(
            queue => v_node ->> 'queue', spec => v_node -> 'spec',
            priority => coalesce((v_node ->> 'priority')::bigint, 50),
            run_at => pyscheduler._run_at(NULL, (v_node ->> 'run_in')::interval, p_now),
            unique_key => v_node ->> 'unique_key', max_attempts => (v_node ->> 'max_attempts')::integer,
            p_now => p_now, concurrency_key => v_node ->> 'concurrency_key',
            after => CASE WHEN cardinality(v_after) > 0 THEN v_after END,
            on_parent_failure => coalesce(v_node ->> 'on_parent_failure', 'cancel'));
        v_rns[v_p + 1] := (v_task ->> 'rn')::uuid;
        v_answer := v_answer || jsonb_build_object(v_node ->> 'name', v_task);
    END LOOP;
    RETURN v_answer;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.submit_workflow(workflow jsonb)
RETURNS jsonb
LANGUAGE sql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* submit_workflow(workflow) -> {"<name>": task, ...}
   Submit a graph of tasks in one call (one transaction: all or nothing).
   workflow: a JSON array of nodes {"name", "queue", "spec", "after":
   [names], and optionally "priority", "unique_key", "max_attempts",
   "concurrency_key", "run_in", "on_parent_failure"} (submit_task's
   parameters); a node waits for the nodes it names in after. Nodes are
   submitted parents first; the answer maps each name to its task. At most
   task_max_workflow_nodes nodes.
   Errors: PS220 not an array of such nodes, a name used twice, after naming
   no node, a cycle (a node after itself included), too many nodes; and
   submit_task's errors for a node's values. */
    SELECT pyscheduler._submit_workflow(workflow, now());
$$;
COMMENT ON FUNCTION pyscheduler.submit_workflow(jsonb) IS
    'Submit a graph of tasks (nodes naming the nodes they run after) in one transaction; refuses cycles and unknown names.';

CREATE OR REPLACE FUNCTION pyscheduler.get_task(rn uuid)
RETURNS jsonb
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* get_task(rn) -> task jsonb
   The task in the seed's JSON shape (never its lease token).
   Errors: PS200 unknown task. */
#variable_conflict use_column
DECLARE
    v_task jsonb;
BEGIN
    SELECT _task_json(t) INTO v_task FROM tasks t WHERE t.rn = get_task.rn;
    IF v_task IS NULL THEN
        PERFORM _task_refused(get_task.rn, NULL);
    END IF;
    RETURN v_task;
END
$$;
COMMENT ON FUNCTION pyscheduler.get_task(uuid) IS 'One task as JSON; PS200 when it does not exist.';

CREATE OR REPLACE FUNCTION pyscheduler.list_tasks(
    queue text DEFAULT NULL, status text DEFAULT NULL, owner text DEFAULT NULL,
    max_tasks integer DEFAULT 100)
RETURNS TABLE (task jsonb)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* list_tasks(queue => NULL, status => NULL, owner => NULL, max_tasks => 100)
       -> setof (task jsonb)
   Tasks matching every filter given (NULL = any), newest first, at most max_tasks.
   status: scheduled | ready | running | completed | aborted | cancelled.
   Errors: PS208 unknown status or max_tasks < 1. */
#variable_conflict use_column
BEGIN
    IF list_tasks.status IS NOT NULL
       AND NOT list_tasks.status = ANY (enum_range(NULL::task_status)::text[]) THEN
        RAISE EXCEPTION 'status must be one of %, got %', enum_range(NULL::task_status), list_tasks.status
            USING ERRCODE = 'PS208', HINT = 'Pass NULL for any status.';
    END IF;
    IF max_tasks IS NULL OR max_tasks < 1 THEN
        RAISE EXCEPTION 'max_tasks must be at least 1, got %', coalesce(max_tasks::text, 'NULL')
            USING ERRCODE = 'PS208';
    END IF;
    RETURN QUERY
    SELECT _task_json(t) FROM tasks t
     WHERE (list_tasks.queue IS NULL OR t.queue = list_tasks.queue)
       AND (list_tasks.status IS NULL OR t.status = list_tasks.status::task_status)
       AND (list_tasks.owner IS NULL OR t.owner = list_tasks.owner)
     ORDER BY t.created DESC, t.seq DESC
     LIMIT max_tasks;
END
$$;
COMMENT ON FUNCTION pyscheduler.list_tasks(text, text, text, integer) IS
    'Tasks filtered by queue, status and owner (NULL = any), newest first, at most max_tasks.';

-- _owned_task(rn): task rn, locked (FOR UPDATE), when the caller may act on it
-- (convention C: the role that submitted it, a member of it, or admin);
-- PS200 when there is none, 42501 when it belongs to another role.
CREATE OR REPLACE FUNCTION pyscheduler._owned_task(p_rn uuid)
RETURNS pyscheduler.tasks
LANGUAGE plpgsql
AS $$
DECLARE
    v_task pyscheduler.tasks;
BEGIN
    SELECT * INTO v_task FROM pyscheduler.tasks t WHERE t.rn = p_rn FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM pyscheduler._task_refused(p_rn, NULL);
    END IF;
    PERFORM pyscheduler._require_owner(v_task.submitted_by, format('task %s', p_rn));
    RETURN v_task;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler._cancel_task(rn uuid, p_now timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_task pyscheduler.tasks := pyscheduler._owned_task(_cancel_task.rn);
BEGIN
    IF v_task.status = 'cancelled' THEN
        RETURN pyscheduler._task_json(v_task);
    ELSIF v_task.status NOT IN ('waiting', 'scheduled', 'ready', 'running') THEN
        RAISE EXCEPTION 'task % is already %', _cancel_task.rn, v_task.status
            USING ERRCODE = 'PS209', HINT = 'Only waiting, scheduled, ready or running tasks can be cancelled.';
    END IF;
    UPDATE pyscheduler.tasks t SET status = 'cancelled', deadline = NULL, updated = p_now, waiting_on = 0
     WHERE t.rn = _cancel_task.rn
    RETURNING t.* INTO v_task;
    IF v_task.owner IS NOT NULL AND v_task.lease_token IS NOT NULL THEN
        PERFORM pyscheduler._notify_throttled('pyscheduler_cancel:' || v_task.owner);
    END IF;
    IF v_task.watched OR v_task.has_children THEN
        PERFORM pyscheduler._finished(ARRAY[_cancel_task.rn], p_now);
        -- the parents' edges to a cancelled waiting task stay until they finish (_finished skips it)
    END IF;
    RETURN pyscheduler._task_json(v_task);
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.cancel_task(rn uuid)
RETURNS jsonb
LANGUAGE sql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* cancel_task(rn) -> task jsonb
   A waiting, scheduled, ready or running task becomes cancelled (terminal);
   its dependents are cancelled too (unless on_parent_failure 'run'). A running
   task keeps its owner, who is told at once (NOTIFY
   pyscheduler_cancel:<owner>) and in any case by PS203 on its next heartbeat
   or status write. Cancelling a cancelled task returns it unchanged. The
   task belongs to the role that submitted it: only that role, a member of
   it, or admin may cancel it (any client instance of that application, as in
   the seed; not another application's role).
   Errors: PS200 unknown task, PS209 already completed or aborted, 42501 the
   task belongs to another role. */
    SELECT pyscheduler._cancel_task(rn, now());
$$;
COMMENT ON FUNCTION pyscheduler.cancel_task(uuid) IS
    'Cancel a waiting, scheduled, ready or running task of the caller''s role (terminal); the owner of a running task learns at once via NOTIFY.';

-- _requeue(rn, by, max_history, p_now): task rn (aborted or cancelled, locked
-- by the caller) requeued by role by: ready again for a fresh round of
-- attempts (attempts 0, no owner, no lease, progress 0, run_at NULL), errors
-- kept, history += the last lease's TaskAssignment (when it is only in
-- leased_at) and TaskRequeued. Raises unique_violation when another live
-- task of its queue holds its unique_key.
CREATE OR REPLACE FUNCTION pyscheduler._requeue(p_rn uuid, p_by name, p_max_history integer, p_now timestamptz)
RETURNS pyscheduler.tasks
LANGUAGE sql
AS $$
    UPDATE pyscheduler.tasks t
       SET status = 'ready', attempts = 0, owner = NULL, lease_token = NULL, leased_at = NULL, deadline = NULL,
           progress = 0, run_at = NULL, updated = p_now,
           history = pyscheduler._trim_history(
               pyscheduler._full_history(t.history, t.owner, t.leased_at)
               || jsonb_build_array(jsonb_build_object('_typ', 'TaskRequeued', 'by', p_by, 'status', t.status,
                                                       'attempts', t.attempts, 'time', pyscheduler._ts(p_now))),
               p_max_history)
     WHERE t.rn = p_rn
    RETURNING t.*;
$$;

CREATE OR REPLACE FUNCTION pyscheduler._retry_task(rn uuid, p_now timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_task pyscheduler.tasks := pyscheduler._owned_task(_retry_task.rn);
    v_code text := pyscheduler._requeue_refusal(v_task.status);
BEGIN
    IF v_code IS NOT NULL THEN
        RAISE EXCEPTION 'task % is %: only aborted or cancelled tasks can be requeued', _retry_task.rn, v_task.status
            USING ERRCODE = v_code, HINT = 'A live task runs anyway; a completed one is done (submit a new task).';
    END IF;
    BEGIN
        v_task := pyscheduler._requeue(_retry_task.rn, pyscheduler._caller(),
                                       pyscheduler._task_limit('task_max_history'), p_now);
    EXCEPTION WHEN unique_violation THEN
        RAISE EXCEPTION 'task %: another live task of queue % holds its unique_key %', _retry_task.rn, v_task.queue,
                        quote_literal(v_task.unique_key)
            USING ERRCODE = 'PS214', HINT = 'That task runs the work already; requeue this one once it finished.';
    END;
    PERFORM pyscheduler._notify_throttled(pyscheduler._task_channel(v_task.queue));
    RETURN pyscheduler._task_json(v_task);
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.retry_task(rn uuid)
RETURNS jsonb
LANGUAGE sql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* retry_task(rn) -> task jsonb
   Requeue an aborted or cancelled task: ready again for a fresh round of
   attempts (attempts 0, progress 0, no owner), its errors kept, history +=
   TaskRequeued {"by": the calling role, "status", "attempts": the ones used,
   "time"}; wakes the queue's workers. An extension of the seed, whose aborted
   and cancelled tasks are terminal. Only the role that submitted the task, a
   member of it, or admin may requeue it.
   Errors: PS200 unknown task, PS211 not aborted or cancelled, PS214 another
   live task of its queue holds its unique_key, 42501 another role's task. */
    SELECT pyscheduler._retry_task(rn, now());
$$;
COMMENT ON FUNCTION pyscheduler.retry_task(uuid) IS
    'Requeue an aborted or cancelled task of the caller''s role: ready again with attempts reset, errors kept (TaskRequeued).';

CREATE OR REPLACE FUNCTION pyscheduler._retry_tasks(
    queue text, status text DEFAULT 'aborted', max_tasks integer DEFAULT 100, p_now timestamptz DEFAULT now())
RETURNS TABLE (task jsonb)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_caller name := pyscheduler._caller();
    v_admin boolean := pg_catalog.pg_has_role(pyscheduler._caller(), pyscheduler._role('admin'), 'MEMBER');
    v_history integer := pyscheduler._task_limit('task_max_history');
    v_task pyscheduler.tasks;
    v_any boolean := false;
BEGIN
    PERFORM pyscheduler._check_task_args(p_queue => _retry_tasks.queue, p_queue_given => true);
    IF _retry_tasks.status IS NULL OR _retry_tasks.status NOT IN ('aborted', 'cancelled') THEN
        RAISE EXCEPTION 'status must be aborted or cancelled, got %', coalesce(quote_literal(_retry_tasks.status), 'NULL')
            USING ERRCODE = 'PS208', HINT = 'Only aborted or cancelled tasks can be requeued.';
    END IF;
    IF max_tasks IS NULL OR max_tasks NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'max_tasks must be in 1..10000, got %', coalesce(max_tasks::text, 'NULL')
            USING ERRCODE = 'PS208', HINT = 'Call again while it returns max_tasks tasks.';
    END IF;
    FOR v_task IN
        SELECT * FROM pyscheduler.tasks t
         WHERE t.queue = _retry_tasks.queue AND t.status = _retry_tasks.status::pyscheduler.task_status
           AND (v_admin OR t.submitted_by = v_caller OR pyscheduler._may_act(t.submitted_by))
         ORDER BY t.updated
         LIMIT max_tasks
           FOR UPDATE SKIP LOCKED
    LOOP
        BEGIN
            v_task := pyscheduler._requeue(v_task.rn, v_caller, v_history, p_now);
        EXCEPTION WHEN unique_violation THEN
            CONTINUE;  -- another live task holds its unique_key: it stays as it is
        END;
        v_any := true;
        task := pyscheduler._task_json(v_task);
        RETURN NEXT;
    END LOOP;
    IF v_any THEN
        PERFORM pyscheduler._notify_throttled(pyscheduler._task_channel(_retry_tasks.queue));
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.retry_tasks(
    queue text, status text DEFAULT 'aborted', max_tasks integer DEFAULT 100)
RETURNS TABLE (task jsonb)
LANGUAGE sql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* retry_tasks(queue, status => 'aborted', max_tasks => 100) -> setof (task jsonb)
   The batch form of retry_task: requeues up to max_tasks tasks of queue in
   status (aborted or cancelled) that the caller may act on (its role's, all
   for admin), those finished longest ago first; returns them. A task whose
   unique_key another live task holds is left as it is. Call again while it
   returns max_tasks tasks.
   Errors: PS208 queue, status, max_tasks (1..10000). */
    SELECT t.task FROM pyscheduler._retry_tasks(queue, status, max_tasks, now()) AS t;
$$;
COMMENT ON FUNCTION pyscheduler.retry_tasks(text, text, integer) IS
    'Requeue up to max_tasks aborted (or cancelled) tasks of a queue that belong to the caller''s role, oldest first.';

-- ---------------------------------------------------------------- queues

CREATE OR REPLACE FUNCTION pyscheduler._queue_json(q pyscheduler.task_queues)
RETURNS jsonb
LANGUAGE sql STABLE
AS $$
    SELECT jsonb_build_object('queue', q.queue, 'paused', q.paused, 'note', q.note, 'paused_by', q.paused_by,
                              'updated', pyscheduler._ts(q.updated));
$$;

CREATE OR REPLACE FUNCTION pyscheduler._pause_queue(queue text, note text DEFAULT NULL, p_now timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_queue pyscheduler.task_queues;
    v_why text;
BEGIN
    PERFORM pyscheduler._check_task_args(p_queue => _pause_queue.queue, p_queue_given => true);
    IF _pause_queue.note IS NOT NULL THEN
        v_why := pyscheduler._label_refusal(_pause_queue.note, 1000);
        IF v_why IS NOT NULL THEN
            RAISE EXCEPTION 'note %', v_why USING ERRCODE = 'PS208', HINT = 'Say why, e.g. ''payment provider down''.';
        END IF;
    END IF;
    INSERT INTO pyscheduler.task_queues AS q (queue, paused, note, paused_by, updated)
    VALUES (_pause_queue.queue, true, _pause_queue.note, pyscheduler._caller(), p_now)
    ON CONFLICT (queue) DO UPDATE
       SET paused = true, note = excluded.note, paused_by = excluded.paused_by, updated = excluded.updated
     WHERE NOT q.paused OR pyscheduler._may_act(q.paused_by)
    RETURNING q.* INTO v_queue;
    IF NOT FOUND THEN
        SELECT * INTO v_queue FROM pyscheduler.task_queues q WHERE q.queue = _pause_queue.queue;
        PERFORM pyscheduler._require_owner(v_queue.paused_by, format('the pause of queue %s', _pause_queue.queue));
    END IF;
    RETURN pyscheduler._queue_json(v_queue);
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.pause_queue(queue text, note text DEFAULT NULL)
RETURNS jsonb
LANGUAGE sql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* pause_queue(queue, note => NULL) -> {"queue", "paused", "note", "paused_by", "updated"}
   Pause a queue: from the next lease call on, its workers lease nothing
   (tasks already leased run to their end; submits go on). note says why
   (a label of at most 1000 bytes). The pause belongs to the calling role
   (paused_by): pausing again changes the note; a queue another role paused
   can only be resumed or re-paused by that role, a member of it, or admin.
   Errors: PS208 queue or note, 42501 paused by another role. */
    SELECT pyscheduler._pause_queue(queue, note, now());
$$;
COMMENT ON FUNCTION pyscheduler.pause_queue(text, text) IS
    'Pause a queue: its workers lease nothing from the next lease call on, until resume_queue.';

CREATE OR REPLACE FUNCTION pyscheduler._resume_queue(queue text, p_now timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_queue pyscheduler.task_queues;
BEGIN
    PERFORM pyscheduler._check_task_args(p_queue => _resume_queue.queue, p_queue_given => true);
    SELECT * INTO v_queue FROM pyscheduler.task_queues q WHERE q.queue = _resume_queue.queue FOR UPDATE;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('queue', _resume_queue.queue, 'paused', false, 'note', NULL, 'paused_by', NULL,
                                  'updated', NULL);
    END IF;
    IF v_queue.paused THEN
        PERFORM pyscheduler._require_owner(v_queue.paused_by, format('the pause of queue %s', _resume_queue.queue));
        UPDATE pyscheduler.task_queues q SET paused = false, note = NULL, paused_by = NULL, updated = p_now
         WHERE q.queue = _resume_queue.queue
        RETURNING q.* INTO v_queue;
        PERFORM pyscheduler._notify_throttled(pyscheduler._task_channel(_resume_queue.queue));
    END IF;
    RETURN pyscheduler._queue_json(v_queue);
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.resume_queue(queue text)
RETURNS jsonb
LANGUAGE sql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* resume_queue(queue) -> {"queue", "paused", "note", "paused_by", "updated"}
   Resume a paused queue and wake its workers (NOTIFY); a queue that is not
   paused is answered unchanged. Only the role that paused it, a member of
   it, or admin may resume it.
   Errors: PS208 queue, 42501 paused by another role. */
    SELECT pyscheduler._resume_queue(queue, now());
$$;
COMMENT ON FUNCTION pyscheduler.resume_queue(text) IS
    'Resume a paused queue (the role that paused it, or admin) and wake its workers.';

-- _check_limit(name, value, max): PS216 unless value is NULL (no limit) or in 1..max.
CREATE OR REPLACE FUNCTION pyscheduler._check_limit(p_name text, p_value integer, p_max integer)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_value IS NOT NULL AND p_value NOT BETWEEN 1 AND p_max THEN
        RAISE EXCEPTION '% must be NULL (no limit) or in 1..%, got %', p_name, p_max, p_value
            USING ERRCODE = 'PS216', HINT = 'To lease nothing at all, pause the queue (pause_queue).';
    END IF;
END
$$;

-- _limits_json(q): a queue's limits as queue_limits shows them.
CREATE OR REPLACE FUNCTION pyscheduler._limits_json(q pyscheduler.task_queues)
RETURNS jsonb
LANGUAGE sql STABLE
AS $$
    SELECT jsonb_build_object('queue', q.queue, 'running_per_key', q.running_per_key,
                              'running_total', q.running_total, 'rate_starts', q.rate_starts,
                              'rate_per', extract(epoch FROM q.rate_per), 'rate_by_key', q.rate_by_key,
                              'limits_by', q.limits_by, 'limits_updated', pyscheduler._ts(q.limits_updated));
$$;

-- _set_limits(queue, p_now, how): insert or change a queue's row of limits
-- (how: the columns to set, applied by the caller's UPDATE) when the caller
-- may (the row's limits belong to the role that set them: _require_owner),
-- and counts the queue's running tasks from then on (limited = true).
CREATE OR REPLACE FUNCTION pyscheduler._limits_row(p_queue text, p_now timestamptz)
RETURNS pyscheduler.task_queues
LANGUAGE plpgsql
AS $$
DECLARE
    v_queue pyscheduler.task_queues;
BEGIN
    PERFORM pyscheduler._check_task_args(p_queue => p_queue, p_queue_given => true);
    INSERT INTO pyscheduler.task_queues AS q (queue, updated) VALUES (p_queue, p_now)
    ON CONFLICT (queue) DO NOTHING;
    SELECT * INTO v_queue FROM pyscheduler.task_queues q WHERE q.queue = p_queue FOR UPDATE;
    IF v_queue.limits_by IS NOT NULL THEN
        PERFORM pyscheduler._require_owner(v_queue.limits_by, format('the limits of queue %s', p_queue));
    END IF;
    RETURN v_queue;
END
$$;

-- _count_running(queue): the queue's running tasks count toward its limits
-- from now on (those leased before its limits were set were not counted).
-- A lease that raced with the call that set the limits may have started
-- tasks it did not count: they finish under the old rule.
CREATE OR REPLACE FUNCTION pyscheduler._count_running(p_queue text)
RETURNS void
LANGUAGE sql
AS $$
    UPDATE pyscheduler.tasks t SET limited = true
     WHERE t.rn IN (SELECT r.rn FROM pyscheduler.tasks r
                     WHERE r.status = 'running' AND r.queue = p_queue AND NOT r.limited
                     ORDER BY r.rn);
$$;

CREATE OR REPLACE FUNCTION pyscheduler._set_queue_limits(
    queue text, running_per_key integer DEFAULT NULL, running_total integer DEFAULT NULL,
    p_now timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_queue pyscheduler.task_queues;
BEGIN
    PERFORM pyscheduler._check_limit('running_per_key', _set_queue_limits.running_per_key, 1000000);
    PERFORM pyscheduler._check_limit('running_total', _set_queue_limits.running_total, 1000000);
    PERFORM pyscheduler._limits_row(_set_queue_limits.queue, p_now);
    UPDATE pyscheduler.task_queues q
       SET running_per_key = _set_queue_limits.running_per_key, running_total = _set_queue_limits.running_total,
           limits_by = CASE WHEN _set_queue_limits.running_per_key IS NULL AND _set_queue_limits.running_total IS NULL
                                 AND q.rate_starts IS NULL THEN NULL ELSE pyscheduler._caller() END,
           limits_updated = p_now
     WHERE q.queue = _set_queue_limits.queue
    RETURNING q.* INTO v_queue;
    PERFORM pyscheduler._count_running(_set_queue_limits.queue);
    PERFORM pyscheduler._notify_throttled(pyscheduler._task_channel(_set_queue_limits.queue));
    RETURN pyscheduler._limits_json(v_queue);
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.set_queue_limits(
    queue text, running_per_key integer DEFAULT NULL, running_total integer DEFAULT NULL)
RETURNS jsonb
LANGUAGE sql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* set_queue_limits(queue, running_per_key => NULL, running_total => NULL)
       -> {"queue", "running_per_key", "running_total", "rate_starts",
           "rate_per", "rate_by_key", "limits_by", "limits_updated"}
   Concurrency limits of a queue, across every worker and node: at most
   running_per_key tasks of one concurrency_key running at once (tasks
   without a key: no per-key limit), at most running_total tasks of the
   queue. NULL: no limit (both NULL and no rate limit: the queue leases as
   if it had none). Running = leased and not finished, failed, yielded or
   reset by the monitor: such a task frees its slot. Tasks running now count
   from this call on. From the next lease on; replaces both limits. The
   limits belong to the role that set them: only that role, a member of it,
   or admin changes them (42501).
   Errors: PS208 queue, PS216 a limit outside 1..1000000, 42501 limits of
   another role. */
    SELECT pyscheduler._set_queue_limits(queue, running_per_key, running_total, now());
$$;
COMMENT ON FUNCTION pyscheduler.set_queue_limits(text, integer, integer) IS
    'Limit how many tasks of a queue run at once, per concurrency key and in total (NULL: no limit), across every worker.';

CREATE OR REPLACE FUNCTION pyscheduler._set_rate_limit(
    queue text, starts integer DEFAULT NULL, per interval DEFAULT '1 second', by_key boolean DEFAULT false,
    p_now timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_queue pyscheduler.task_queues;
BEGIN
    PERFORM pyscheduler._check_limit('starts', _set_rate_limit.starts, 1000000);
    IF _set_rate_limit.starts IS NOT NULL AND (per IS NULL OR extract(month FROM per) <> 0
       OR extract(year FROM per) <> 0 OR NOT (per >= interval '1 millisecond' AND per <= interval '1 day')) THEN
        RAISE EXCEPTION 'per must be at least 1 millisecond and at most 1 day, without months or years, got %',
                        coalesce(per::text, 'NULL')
            USING ERRCODE = 'PS216', HINT = 'e.g. starts => 500, per => ''1 second''.';
    END IF;
    IF by_key IS NULL THEN
        RAISE EXCEPTION 'by_key must be true or false' USING ERRCODE = 'PS216';
    END IF;
    PERFORM pyscheduler._limits_row(_set_rate_limit.queue, p_now);
    UPDATE pyscheduler.task_queues q
       SET rate_starts = _set_rate_limit.starts,
           rate_per = CASE WHEN _set_rate_limit.starts IS NOT NULL
                           THEN make_interval(secs => extract(epoch FROM per)::double precision) END,
           rate_by_key = _set_rate_limit.starts IS NOT NULL AND by_key,
           limits_by = CASE WHEN _set_rate_limit.starts IS NULL AND q.running_per_key IS NULL
                                 AND q.running_total IS NULL THEN NULL ELSE pyscheduler._caller() END,
           limits_updated = p_now
     WHERE q.queue = _set_rate_limit.queue
    RETURNING q.* INTO v_queue;
    -- a new rate starts with full buckets
    DELETE FROM pyscheduler.task_rate_buckets b WHERE b.queue = _set_rate_limit.queue;
    PERFORM pyscheduler._count_running(_set_rate_limit.queue);
    PERFORM pyscheduler._notify_throttled(pyscheduler._task_channel(_set_rate_limit.queue));
    RETURN pyscheduler._limits_json(v_queue);
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.set_rate_limit(
    queue text, starts integer, per interval DEFAULT '1 second', by_key boolean DEFAULT false)
RETURNS jsonb
LANGUAGE sql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* set_rate_limit(queue, starts, per => '1 second', by_key => false) -> the queue's limits
   At most starts leases begin per per, for the queue (by_key false) or for
   each concurrency key (by_key true; tasks without a key are not rate
   limited then). A token bucket: it holds at most starts tokens (a burst of
   starts leases at once, after a quiet spell), refills at starts/per a
   second, and a lease takes one token per task; over any window of length T
   at most starts * (1 + T/per) leases begin, and in a long run starts/per a
   second. Over the limit, tasks wait in ready (never fail); an idle worker
   sleeps until the next token (next_task_due). starts NULL removes the rate
   limit. starts: 1..1000000; per: 1 ms .. 1 day (applied as seconds). The
   limits belong to the role that set them, as set_queue_limits'.
   Errors: PS208 queue, PS216 starts or per, 42501 limits of another role. */
    SELECT pyscheduler._set_rate_limit(queue, starts, per, by_key, now());
$$;
COMMENT ON FUNCTION pyscheduler.set_rate_limit(text, integer, interval, boolean) IS
    'Limit how many leases of a queue begin per interval (a token bucket), for the queue or per concurrency key; NULL starts: none.';

CREATE OR REPLACE VIEW pyscheduler.queue_limits AS
    SELECT q.queue, q.running_per_key, q.running_total, q.rate_starts, q.rate_per, q.rate_by_key,
           (SELECT count(*) FROM pyscheduler.tasks r
             WHERE r.queue = q.queue AND r.status = 'running' AND r.limited AND r.lease_token IS NOT NULL) AS running,
           q.limits_by, q.limits_updated
      FROM pyscheduler.task_queues q
     WHERE q.running_per_key IS NOT NULL OR q.running_total IS NOT NULL OR q.rate_starts IS NOT NULL;
COMMENT ON VIEW pyscheduler.queue_limits IS
    'Per queue with limits: running_per_key, running_total, the rate limit (rate_starts per rate_per, by key or not), the tasks running under them, who set them.';

CREATE OR REPLACE FUNCTION pyscheduler.next_task_due(queue text)
RETURNS interval
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* next_task_due(queue) -> interval or NULL
   How long until a lease of queue can get a task that is not ready now: the
   time until its earliest scheduled task is due ('00:00:00' when one is due
   already: the next lease makes it ready), NULL when none is scheduled or
   the queue is paused (resume_queue wakes the workers). On a queue with a
   rate limit (set_rate_limit, per queue) that has ready tasks but no token
   left: the time until the next token, if sooner. An idle worker sleeps at
   most this long (the worker library does), so a delayed task or a retry is
   leased when it comes due, and a rate-limited queue is leased when the
   next start is allowed, without polling in a loop. One probe of an index,
   and the queue's row by primary key. */
#variable_conflict use_column
DECLARE
    v_q task_queues;
    v_due interval;
    v_tokens double precision;
    v_rate double precision;
BEGIN
    SELECT * INTO v_q FROM task_queues q WHERE q.queue = next_task_due.queue;
    IF v_q.paused THEN
        RETURN NULL;
    END IF;
    SELECT greatest(r.run_at - now(), interval '0') INTO v_due
      FROM tasks r
     WHERE r.queue = next_task_due.queue AND r.status = 'scheduled'
     ORDER BY r.run_at
     LIMIT 1;
    IF v_q.rate_starts IS NOT NULL AND NOT v_q.rate_by_key
       AND EXISTS (SELECT 1 FROM tasks r WHERE r.queue = next_task_due.queue AND r.status = 'ready') THEN
        v_rate := v_q.rate_starts / extract(epoch FROM v_q.rate_per)::double precision;
        SELECT least(v_q.rate_starts, b.tokens + v_rate * greatest(0, extract(epoch FROM now() - b.at)))
          INTO v_tokens FROM task_rate_buckets b WHERE b.queue = next_task_due.queue AND b.key = '';
        IF v_tokens < 1 AND (v_due IS NULL OR make_interval(secs => (1 - v_tokens) / v_rate) < v_due) THEN
            v_due := make_interval(secs => (1 - v_tokens) / v_rate);
        END IF;
    END IF;
    RETURN v_due;
END
$$;
COMMENT ON FUNCTION pyscheduler.next_task_due(text) IS
    'Time until the queue''s earliest scheduled task is due, or its rate limit allows the next start (0: now; NULL: nothing waits, or paused).';

-- ---------------------------------------------------------------- worker

CREATE OR REPLACE FUNCTION pyscheduler.register_worker()
RETURNS text
LANGUAGE sql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
    /* register_worker() -> text
       A new unique worker id ('worker-27') from a database sequence. Ids do
       not survive the process: a restarted worker registers again. The id
       names the owner of the worker's leases; the lease token proves them. */
    SELECT 'worker-' || nextval('pyscheduler.worker_id_seq');
$$;
COMMENT ON FUNCTION pyscheduler.register_worker() IS
    'A new unique worker id (worker-<n>) from a database sequence; register once per process.';

-- _lease_gate(queue, n, p_now): what every lease call does first, for the
-- queue's own state, in one statement of two index probes (~5 us when there
-- is nothing to do): the queue's row in task_queues by primary key, and the
-- first entry of the queue in tasks_scheduled_idx. Answers 0 when the queue
-- is paused (lease nothing), 2 when it has limits (the claim takes
-- _claim_limited's path), 1 otherwise: a queue without a row, or neither
-- paused nor limited, is leased as if the table did not exist, so a limit a
-- queue does not use costs it nothing but this probe it made anyway.
-- When the first scheduled entry is due, the due scheduled tasks become
-- ready, earliest run_at first, at most greatest(n, 1000) per call, so the
-- claim that follows sees them in its own order (priority, created, seq);
-- the claim never steps over tasks that are not due yet. (A scalar subquery
-- with ORDER BY, not EXISTS: its plan is the index's first entry whatever
-- the statistics say.)
CREATE OR REPLACE FUNCTION pyscheduler._lease_gate(p_queue text, p_n integer, p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    v_gate integer;
    v_due boolean;
BEGIN
    SELECT CASE WHEN q.paused THEN 0
                WHEN q.running_per_key IS NOT NULL OR q.running_total IS NOT NULL OR q.rate_starts IS NOT NULL THEN 2
                ELSE 1 END,
           (SELECT r.run_at FROM pyscheduler.tasks r WHERE r.queue = p_queue AND r.status = 'scheduled'
             ORDER BY r.run_at LIMIT 1) <= p_now
      INTO v_gate, v_due
      FROM (SELECT) AS one LEFT JOIN pyscheduler.task_queues q ON q.queue = p_queue;
    IF v_gate = 0 THEN
        RETURN 0;
    END IF;
    IF v_due THEN
        UPDATE pyscheduler.tasks t SET status = 'ready', updated = p_now
         WHERE t.rn = ANY (ARRAY(
               SELECT r.rn FROM pyscheduler.tasks r
                WHERE r.queue = p_queue AND r.status = 'scheduled' AND r.run_at <= p_now
                ORDER BY r.run_at
                LIMIT greatest(p_n, 1000)
                  FOR UPDATE SKIP LOCKED));
    END IF;
    RETURN v_gate;
END
$$;

-- _limit_lock(queue, key): the advisory lock that serialises the counting of
-- a queue's limits: per (queue, concurrency key), or the queue's own (key
-- NULL: running_total and a per-queue rate). A 64-bit hash: two names that
-- collide only wait for each other.
CREATE OR REPLACE FUNCTION pyscheduler._limit_lock(p_queue text, p_key text)
RETURNS bigint
LANGUAGE sql IMMUTABLE
AS $$
    SELECT hashtextextended(CASE WHEN p_key IS NULL THEN 'pyscheduler.task_queue:' || p_queue
                                 ELSE 'pyscheduler.task_key:' || octet_length(p_queue) || ':' || p_queue || p_key END, 0)
$$;

-- _bucket_tokens(queue, key, starts, rate, p_now): the token bucket of a
-- rate limit (key '' for the queue's own), refilled to now and written back:
-- it holds at most starts tokens (the burst: one window's worth) and gains
-- rate tokens a second; a new bucket is full. The caller holds the bucket's
-- _limit_lock.
CREATE OR REPLACE FUNCTION pyscheduler._bucket_tokens(
    p_queue text, p_key text, p_starts integer, p_rate double precision, p_now timestamptz)
RETURNS double precision
LANGUAGE sql
AS $$
    INSERT INTO pyscheduler.task_rate_buckets AS b (queue, key, tokens, at)
    VALUES (p_queue, p_key, p_starts, p_now)
    ON CONFLICT (queue, key) DO UPDATE
       SET tokens = least(p_starts::double precision,
                          b.tokens + p_rate * greatest(0, extract(epoch FROM p_now - b.at))),
           at = greatest(b.at, p_now)
    RETURNING b.tokens;
$$;

-- _bucket_tokens_many(queue, keys, starts, rate, p_now): _bucket_tokens for
-- many keys in one statement (rows written in key order).
CREATE OR REPLACE FUNCTION pyscheduler._bucket_tokens_many(
    p_queue text, p_keys text[], p_starts integer, p_rate double precision, p_now timestamptz)
RETURNS TABLE (key text, tokens double precision)
LANGUAGE sql
AS $$
    INSERT INTO pyscheduler.task_rate_buckets AS b (queue, key, tokens, at)
    SELECT p_queue, k, p_starts, p_now FROM unnest(p_keys) AS k ORDER BY k
    ON CONFLICT (queue, key) DO UPDATE
       SET tokens = least(p_starts::double precision,
                          b.tokens + p_rate * greatest(0, extract(epoch FROM p_now - b.at))),
           at = greatest(b.at, p_now)
    RETURNING b.key, b.tokens;
$$;

-- _claim_limited: the claim of a queue with limits (_lease_gate answered 2):
-- up to n ready tasks, in claim order, such that no concurrency key has more
-- than running_per_key tasks running, the queue no more than running_total,
-- and no more leases start than its rate limit's token bucket allows.
-- Running tasks are counted, not kept in counters: status running, limited
-- (leased here, or running when the limits were set) and not yielded, through
-- tasks_limited_idx; a finished, failed, yielded or reset task stops
-- counting by its own write.
-- What serialises the counting: an advisory transaction lock per (queue,
-- key), held to the commit and taken with pg_try_advisory_xact_lock before
-- counting: a key another lease is counting is skipped by this one, so
-- leases never wait for each other's keys and never deadlock; the queue's
-- own lock (running_total, a per-queue rate) is the one lock a lease waits
-- for. Each count is a new statement, so under READ COMMITTED it sees every
-- lease committed before the lock was granted (PS218 in another isolation
-- level).
-- No head-of-line blocking: the first round reads the first n + 1000 ready
-- tasks (no locks) and takes those of keys not known to be full (a hashed
-- subplan); when those were all of full keys, the next round takes the best
-- ready task of each key that is not full, by a skip scan of
-- tasks_ready_key_idx (one probe per key with ready tasks, ~6 us each,
-- however many ready tasks the full keys have). A call that leased anything
-- stops (the worker asks again). Tasks without a key in a queue with
-- per-key limits are found in the first round only (give every task of such
-- a queue a key). Aging applies only to a queue without per-key limits.
-- Every step is one statement for all the keys of a round: lock them, count
-- them, choose, update.
CREATE OR REPLACE FUNCTION pyscheduler._claim_limited(
    p_queue text, p_worker text, p_n integer, p_timeout interval, p_aging_rate double precision,
    p_aging_cap bigint, p_now timestamptz, p_secret text)
RETURNS SETOF pyscheduler.tasks
LANGUAGE plpgsql
AS $$
DECLARE
    v_q pyscheduler.task_queues;
    v_cap integer := p_n;
    v_rate double precision;
    v_per_key boolean;
    v_rate_key boolean;
    v_keyed boolean;
    v_hint text[] := '{}';      -- keys full when the call began (read without the locks)
    v_skip text[] := '{}';      -- keys whose lock another lease holds (later rounds only try)
    v_full text[] := '{}';      -- keys not to look at: v_hint, v_skip, and the keys with nothing left
    v_rns uuid[];
    v_keys text[];
    v_new text[];
    v_got text[];
    v_left_keys text[] := '{}'; -- the keys counted under their lock, and what each has left
    v_left integer[] := '{}';
    v_new_left integer[];
    v_chosen uuid[];
    v_chosen_keys text[];
    v_taken integer := 0;
    v_want integer;
    v_n integer;
    v_hit boolean := false;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'queue % has limits: lease its tasks in a READ COMMITTED transaction, not %', p_queue,
                        current_setting('transaction_isolation')
            USING ERRCODE = 'PS218',
                  HINT = 'Limits are counted under a lock; an older snapshot than the lock could count too few.';
    END IF;
    SELECT * INTO v_q FROM pyscheduler.task_queues q WHERE q.queue = p_queue;
    v_per_key := v_q.running_per_key IS NOT NULL;
    v_rate_key := v_q.rate_starts IS NOT NULL AND v_q.rate_by_key;
    v_keyed := v_per_key OR v_rate_key;
    v_rate := v_q.rate_starts / extract(epoch FROM v_q.rate_per)::double precision;
    -- the queue's own limits, under the queue's lock
    IF v_q.running_total IS NOT NULL OR (v_q.rate_starts IS NOT NULL AND NOT v_q.rate_by_key) THEN
        PERFORM pg_advisory_xact_lock(pyscheduler._limit_lock(p_queue, NULL));
        IF v_q.running_total IS NOT NULL THEN
            SELECT v_q.running_total - count(*) INTO v_n FROM pyscheduler.tasks r
             WHERE r.queue = p_queue AND r.status = 'running' AND r.limited AND r.lease_token IS NOT NULL;
            v_cap := least(v_cap, v_n);
        END IF;
        IF v_q.rate_starts IS NOT NULL AND NOT v_q.rate_by_key THEN
            v_cap := least(v_cap, floor(pyscheduler._bucket_tokens(p_queue, '', v_q.rate_starts, v_rate, p_now))::integer);
        END IF;
    END IF;
    IF v_cap <= 0 THEN
        RETURN;
    END IF;
    IF v_per_key THEN
        v_hint := ARRAY(SELECT r.concurrency_key FROM pyscheduler.tasks r
                         WHERE r.queue = p_queue AND r.status = 'running' AND r.limited AND r.lease_token IS NOT NULL
                           AND r.concurrency_key IS NOT NULL
                         GROUP BY r.concurrency_key HAVING count(*) >= v_q.running_per_key);
        v_full := v_hint;
    END IF;
    FOR v_round IN 1..3 LOOP
        v_want := v_cap - v_taken;
        -- candidates in claim order, past the keys known to be full (NOT IN a subquery: a hashed
        -- lookup). First round: among the first n + 1000 ready tasks, read without locks. When those
        -- were all of full keys: the best ready task of each key that is not full (a skip scan of
        -- tasks_ready_key_idx: one probe per key with ready tasks, whatever their number).
        IF p_aging_rate <> 0 AND NOT v_keyed THEN  -- aging sorts every ready task anyway
            SELECT array_agg(c.rn ORDER BY c.o DESC, c.created, c.seq) INTO v_rns
              FROM (SELECT r.rn, r.created, r.seq,
                           greatest(r.priority, least(
                               r.priority + p_aging_rate * greatest(0, extract(epoch FROM p_now - r.updated)),
                               p_aging_cap)) AS o
                      FROM pyscheduler.tasks r
                     WHERE r.queue = p_queue AND r.status = 'ready'
                     ORDER BY 4 DESC, r.created, r.seq
                     LIMIT v_want) AS c;
        ELSIF v_round = 1 THEN
            WITH s AS MATERIALIZED (
                SELECT r.rn, r.concurrency_key FROM pyscheduler.tasks r
                 WHERE r.queue = p_queue AND r.status = 'ready'
                 ORDER BY r.priority DESC, r.created, r.seq
                 LIMIT v_want + 1000)
            SELECT (SELECT count(*) FROM s) >= v_want + 1000,
                   ARRAY(SELECT s.rn FROM s
                          WHERE s.concurrency_key IS NULL OR s.concurrency_key NOT IN (SELECT unnest(v_full))
                          LIMIT v_want)
              INTO v_hit, v_rns;
        ELSE
            WITH RECURSIVE keys(key) AS (
                (SELECT r.concurrency_key FROM pyscheduler.tasks r
                  WHERE r.queue = p_queue AND r.status = 'ready' AND r.concurrency_key IS NOT NULL
                  ORDER BY r.concurrency_key LIMIT 1)
                UNION ALL
                SELECT (SELECT r.concurrency_key FROM pyscheduler.tasks r
                         WHERE r.queue = p_queue AND r.status = 'ready' AND r.concurrency_key > keys.key
                         ORDER BY r.concurrency_key LIMIT 1)
                  FROM keys WHERE keys.key IS NOT NULL)
            SELECT array_agg(h.rn ORDER BY h.priority DESC, h.created, h.seq) INTO v_rns
              FROM (SELECT h.rn, h.priority, h.created, h.seq
                      FROM keys k
                      CROSS JOIN LATERAL (
                          SELECT r.rn, r.priority, r.created, r.seq FROM pyscheduler.tasks r
                           WHERE r.queue = p_queue AND r.status = 'ready' AND r.concurrency_key = k.key
                           ORDER BY r.priority DESC, r.created, r.seq
                           LIMIT coalesce(v_q.running_per_key, v_want)) AS h
                     WHERE k.key IS NOT NULL AND k.key NOT IN (SELECT unnest(v_full))
                     ORDER BY h.priority DESC, h.created, h.seq
                     LIMIT v_want) AS h;
        END IF;
        -- lock them (by primary key; SKIP LOCKED: another lease is taking them)
        SELECT array_agg(c.rn ORDER BY c.priority DESC, c.created, c.seq),
               array_agg(c.concurrency_key ORDER BY c.priority DESC, c.created, c.seq)
          INTO v_rns, v_keys
          FROM (SELECT r.rn, r.concurrency_key, r.priority, r.created, r.seq
                  FROM unnest(v_rns) AS u(rn) JOIN pyscheduler.tasks r ON r.rn = u.rn
                 WHERE r.status = 'ready'
                   FOR UPDATE OF r SKIP LOCKED) AS c;
        IF v_rns IS NULL THEN
            EXIT WHEN v_round > 1 OR NOT v_keyed OR NOT v_hit;  -- nothing ready past the full keys
            CONTINUE;  -- the first n + 1000 were all of full keys: look past them
        END IF;
        IF v_keyed THEN
            -- the keys not counted yet, locked without waiting: a key whose lock another lease
            -- holds is skipped (that lease is counting it, and most likely takes it), so leases
            -- never wait for each other's keys and never deadlock
            v_new := ARRAY(SELECT DISTINCT k FROM unnest(v_keys) AS k
                            WHERE k IS NOT NULL AND k NOT IN (SELECT unnest(v_left_keys)));
            v_got := ARRAY(SELECT k FROM unnest(v_new) AS k
                            WHERE pg_try_advisory_xact_lock(pyscheduler._limit_lock(p_queue, k)));
            IF cardinality(v_got) < cardinality(v_new) THEN
                v_skip := v_skip || ARRAY(SELECT unnest(v_new) EXCEPT SELECT unnest(v_got));
            END IF;
            -- count them (a new statement: it sees every lease committed before the locks were granted)
            SELECT coalesce(array_agg(g.k ORDER BY g.k), '{}'), coalesce(array_agg(g.n ORDER BY g.k), '{}')
              INTO v_got, v_new_left
              FROM (SELECT u.k, CASE WHEN v_per_key THEN v_q.running_per_key - coalesce(c.n, 0)
                                     ELSE 2147483647 END::integer AS n
                      FROM unnest(v_got) AS u(k)
                      LEFT JOIN LATERAL (  -- one probe of tasks_limited_idx per key
                          SELECT count(*) AS n FROM pyscheduler.tasks r
                           WHERE r.queue = p_queue AND r.concurrency_key = u.k AND r.status = 'running'
                             AND r.limited AND r.lease_token IS NOT NULL) AS c ON true) AS g;
            IF v_rate_key AND cardinality(v_got) > 0 THEN
                SELECT array_agg(least(n.n, floor(b.tokens)::integer) ORDER BY n.k) INTO v_new_left
                  FROM unnest(v_got, v_new_left) AS n(k, n)
                  JOIN pyscheduler._bucket_tokens_many(p_queue, v_got, v_q.rate_starts, v_rate, p_now) AS b
                    ON b.key = n.k;
            END IF;
            v_left_keys := v_left_keys || v_got;
            v_left := v_left || v_new_left;
            -- the candidates that fit, in claim order: the first v_left of each key
            SELECT array_agg(x.rn), array_agg(x.k) INTO v_chosen, v_chosen_keys
              FROM (SELECT c.rn, c.k, row_number() OVER (PARTITION BY c.k ORDER BY c.o) AS nth
                      FROM unnest(v_rns, v_keys) WITH ORDINALITY AS c(rn, k, o)) AS x
              LEFT JOIN unnest(v_left_keys, v_left) AS l(k, n) ON l.k = x.k
             WHERE x.k IS NULL OR x.nth <= l.n;
        ELSE
            v_chosen := v_rns;
        END IF;
        IF v_chosen IS NOT NULL THEN
            RETURN QUERY
            UPDATE pyscheduler.tasks t
               SET status = 'running', owner = p_worker, deadline = p_now + p_timeout, updated = p_now,
                   lease_token = pyscheduler._lease_token(p_secret, t.rn), attempts = t.attempts + 1,
                   leased_at = p_now, limited = true
             WHERE t.rn = ANY (v_chosen)
            RETURNING t.*;
            v_taken := v_taken + cardinality(v_chosen);
        END IF;
        IF v_keyed THEN
            -- what each key has left; a key with nothing left is full for the next rounds
            SELECT array_agg(l.n - coalesce(t.c, 0)::integer ORDER BY l.i) INTO v_left
              FROM unnest(v_left_keys, v_left) WITH ORDINALITY AS l(k, n, i)
              LEFT JOIN (SELECT k, count(*) AS c FROM unnest(v_chosen_keys) AS k GROUP BY k) AS t ON t.k = l.k;
            IF v_rate_key AND v_chosen_keys IS NOT NULL THEN
                UPDATE pyscheduler.task_rate_buckets b SET tokens = b.tokens - t.c
                  FROM (SELECT k, count(*) AS c FROM unnest(v_chosen_keys) AS k WHERE k IS NOT NULL
                         GROUP BY k ORDER BY k) AS t
                 WHERE b.queue = p_queue AND b.key = t.k;
            END IF;
            v_full := v_hint || v_skip || ARRAY(SELECT l.k FROM unnest(v_left_keys, v_left) AS l(k, n) WHERE l.n <= 0);
        END IF;
        -- enough for this call once it leased anything (the worker asks again); a round that
        -- found only keys that turned out full under their locks looks again past them
        EXIT WHEN v_taken > 0 OR NOT v_keyed;
    END LOOP;
    IF v_taken > 0 AND v_q.rate_starts IS NOT NULL AND NOT v_q.rate_by_key THEN
        UPDATE pyscheduler.task_rate_buckets b SET tokens = b.tokens - v_taken
         WHERE b.queue = p_queue AND b.key = '';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler._claim_tasks(
    queue text, worker text, n integer DEFAULT 1, timeout interval DEFAULT '10 seconds',
    aging_rate double precision DEFAULT 0, aging_cap bigint DEFAULT 4294967295, p_now timestamptz DEFAULT now())
RETURNS SETOF pyscheduler.tasks
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_timeout interval := pyscheduler._timeout(_claim_tasks.timeout);
    -- one secret per claim, the tokens derived from it (_lease_token): one
    -- gen_random_uuid() per call instead of one per task (~5 us each)
    v_secret text := gen_random_uuid()::text;
    v_gate integer;
BEGIN
    PERFORM pyscheduler._check_task_args(p_queue => _claim_tasks.queue, p_queue_given => true,
                                         p_worker => _claim_tasks.worker, p_worker_given => true,
                                         p_aging_rate => _claim_tasks.aging_rate,
                                         p_aging_cap => _claim_tasks.aging_cap);
    IF n IS NULL OR n < 1 THEN
        RAISE EXCEPTION 'n must be at least 1, got %', coalesce(n::text, 'NULL') USING ERRCODE = 'PS208';
    END IF;
    v_gate := pyscheduler._lease_gate(_claim_tasks.queue, n, p_now);
    IF v_gate = 0 THEN
        RETURN;  -- paused
    ELSIF v_gate = 2 THEN
        RETURN QUERY SELECT * FROM pyscheduler._claim_limited(_claim_tasks.queue, _claim_tasks.worker, n, v_timeout,
                                                             aging_rate, aging_cap, p_now, v_secret);
        RETURN;
    END IF;
    -- The claim is one statement per path, written out twice on purpose: each
    -- keeps its own cached plan, and one statement measured ~1.5x faster for
    -- single-task leases than locking the rows first and updating them after.
    IF aging_rate = 0 THEN
        -- The normal claim: an index scan of tasks_ready_idx in claim order,
        -- then the rows by primary key. Written so that its generic plan is
        -- the right one whatever n is (see the function's SET plan_cache_mode):
        -- re-planning it on every call cost ~200 us, two thirds of a lease.
        RETURN QUERY
        UPDATE pyscheduler.tasks t
           SET status = 'running', owner = _claim_tasks.worker, deadline = p_now + v_timeout,
               updated = p_now, lease_token = pyscheduler._lease_token(v_secret, t.rn),
               attempts = t.attempts + 1, leased_at = p_now
         WHERE t.rn = ANY (ARRAY(
               SELECT r.rn FROM pyscheduler.tasks r
                WHERE r.queue = _claim_tasks.queue AND r.status = 'ready'
                ORDER BY r.priority DESC, r.created, r.seq
                LIMIT n
                  FOR UPDATE SKIP LOCKED))
        RETURNING t.*;
    ELSE
        RETURN QUERY
        WITH c AS (
            SELECT r.rn FROM pyscheduler.tasks r
             WHERE r.queue = _claim_tasks.queue AND r.status = 'ready'
             ORDER BY greatest(r.priority, least(
                          r.priority + aging_rate * greatest(0, extract(epoch FROM p_now - r.updated)),
                          aging_cap)) DESC,
                      r.created, r.seq
             LIMIT n
               FOR UPDATE SKIP LOCKED)
        UPDATE pyscheduler.tasks t
           SET status = 'running', owner = _claim_tasks.worker, deadline = p_now + v_timeout,
               updated = p_now, lease_token = pyscheduler._lease_token(v_secret, t.rn),
               attempts = t.attempts + 1, leased_at = p_now
          FROM c
         WHERE t.rn = c.rn
        RETURNING t.*;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler._lease_tasks(
    queue text, worker text, n integer DEFAULT 1, timeout interval DEFAULT '10 seconds',
    aging_rate double precision DEFAULT 0, aging_cap bigint DEFAULT 4294967295, p_now timestamptz DEFAULT now())
RETURNS TABLE (task jsonb)
LANGUAGE sql
AS $$
    SELECT pyscheduler._leased_json(u) FROM pyscheduler._claim_tasks($1, $2, $3, $4, $5, $6, $7) AS u
     ORDER BY u.priority DESC, u.created, u.seq;
$$;

CREATE OR REPLACE FUNCTION pyscheduler.lease_tasks(
    queue text, worker text, n integer DEFAULT 1, timeout interval DEFAULT '10 seconds',
    aging_rate double precision DEFAULT 0, aging_cap bigint DEFAULT 4294967295)
RETURNS TABLE (task jsonb)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* lease_tasks(queue, worker, n => 1, timeout => '10 seconds',
               aging_rate => 0, aging_cap => 4294967295) -> setof (task jsonb)
   Lease up to n ready tasks of queue: highest priority first, then oldest,
   then in submission order, skipping rows other workers are leasing (FOR
   UPDATE SKIP LOCKED). Each becomes running, owner = worker, deadline = now
   + timeout, history += TaskAssignment, and gets a new secret lease token,
   returned as the task's "token": heartbeat, complete, fail, abort and yield
   need it. Returns nothing when no task is ready, or the queue is paused
   (pause_queue). The queue's scheduled tasks that are due (run_at passed:
   delayed tasks, retries) are made ready first, so they lease in this order
   too (_lease_gate).
   timeout: more than 0, at most 1 day, no months or years.
   Fairness (off by default): with aging_rate > 0 a ready task's effective
   priority is priority + aging_rate * seconds since it became ready, capped at
   greatest(priority, aging_cap); this path sorts every ready task of the queue.
   Commits asynchronously when the call is the whole transaction (a lease lost
   in a database crash is a lease that expired); never changes the
   durability of a larger transaction.
   Errors: PS208 queue, worker, n < 1, timeout, aging_rate, aging_cap. */
BEGIN
    PERFORM _async_commit_if_alone();
    RETURN QUERY SELECT l.task FROM _lease_tasks($1, $2, $3, $4, $5, $6, now()) AS l;
END
$$;
COMMENT ON FUNCTION pyscheduler.lease_tasks(text, text, integer, interval, double precision, bigint) IS
    'Lease up to n ready (or due) tasks of a queue (priority desc, oldest first, SKIP LOCKED) for timeout; each with its lease token; none when paused.';

CREATE OR REPLACE FUNCTION pyscheduler._lease_tasks_lean(
    queue text, worker text, n integer DEFAULT 1, timeout interval DEFAULT '10 seconds',
    aging_rate double precision DEFAULT 0, aging_cap bigint DEFAULT 4294967295, p_now timestamptz DEFAULT now())
RETURNS TABLE (rn uuid, token uuid, spec jsonb, priority bigint, seq bigint, attempt integer)
LANGUAGE sql
AS $$
    SELECT u.rn, u.lease_token, u.spec, u.priority, u.seq, u.attempts
      FROM pyscheduler._claim_tasks($1, $2, $3, $4, $5, $6, $7) AS u
     ORDER BY u.priority DESC, u.created, u.seq;
$$;

CREATE OR REPLACE FUNCTION pyscheduler.lease_tasks_lean(
    queue text, worker text, n integer DEFAULT 1, timeout interval DEFAULT '10 seconds',
    aging_rate double precision DEFAULT 0, aging_cap bigint DEFAULT 4294967295)
RETURNS TABLE (rn uuid, token uuid, spec jsonb, priority bigint, seq bigint, attempt integer)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* lease_tasks_lean(queue, worker, n => 1, timeout => '10 seconds',
                    aging_rate => 0, aging_cap => 4294967295)
       -> setof (rn uuid, token uuid, spec jsonb, priority bigint, seq bigint, attempt integer)
   lease_tasks with a lean answer: the same claim (same order, same
   TaskAssignment history entry, same new lease token per task), but only
   what a worker needs to run the tasks, as columns instead of the whole task
   as JSON. seq is the submission order (a worker's local queue orders by
   priority desc, then seq); attempt is this lease's attempt (1 for the
   first; the task's attempts). Commits asynchronously when it is the whole
   transaction, as lease_tasks.
   Errors: PS208 queue, worker, n < 1, timeout, aging_rate, aging_cap. */
BEGIN
    PERFORM _async_commit_if_alone();
    RETURN QUERY SELECT * FROM _lease_tasks_lean($1, $2, $3, $4, $5, $6, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.lease_tasks_lean(text, text, integer, interval, double precision, bigint) IS
    'lease_tasks answering only (rn, token, spec, priority, seq, attempt) per leased task: what a worker needs.';

-- _lease_task: the single-task claim of lease_task and complete_and_lease
-- (aging off): the next ready task of queue becomes running for worker, or
-- NULL. One statement with LIMIT 1 and the row fetched by primary key: its
-- generic plan is the right one, so it is planned once per session. With
-- aging (or bad aging arguments) it takes _lease_tasks' path.
CREATE OR REPLACE FUNCTION pyscheduler._lease_task(
    queue text, worker text, timeout interval DEFAULT '10 seconds', aging_rate double precision DEFAULT 0,
    aging_cap bigint DEFAULT 4294967295, p_now timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
    v_task jsonb;
    v_gate integer;
BEGIN
    IF aging_rate IS DISTINCT FROM 0 OR aging_cap IS DISTINCT FROM 4294967295 THEN
        RETURN (SELECT l.task FROM pyscheduler._lease_tasks($1, $2, 1, $3, $4, $5, p_now) AS l);
    END IF;
    IF NOT (octet_length(queue) BETWEEN 1 AND 40 AND octet_length(worker) BETWEEN 1 AND 40
            AND timeout > interval '0' AND timeout <= interval '1 day'
            AND extract(month FROM timeout) = 0 AND extract(year FROM timeout) = 0) IS TRUE THEN
        PERFORM pyscheduler._check_task_args(p_queue => queue, p_queue_given => true,
                                             p_worker => worker, p_worker_given => true);
        PERFORM pyscheduler._timeout(timeout);
    END IF;
    v_gate := pyscheduler._lease_gate(queue, 1, p_now);
    IF v_gate = 0 THEN
        RETURN NULL;  -- paused
    ELSIF v_gate = 2 THEN
        RETURN (SELECT pyscheduler._leased_json(u)
                  FROM pyscheduler._claim_limited(queue, worker, 1, pyscheduler._timeout(timeout), 0, 4294967295, p_now,
                                                  gen_random_uuid()::text) AS u);
    END IF;
    UPDATE pyscheduler.tasks t
       SET status = 'running', owner = worker, updated = p_now,
           deadline = p_now + make_interval(secs => extract(epoch FROM timeout)::double precision),
           lease_token = pyscheduler._lease_token(gen_random_uuid()::text, t.rn), attempts = t.attempts + 1,
           leased_at = p_now
     WHERE t.rn = (SELECT r.rn FROM pyscheduler.tasks r
                    WHERE r.queue = $1 AND r.status = 'ready'
                    ORDER BY r.priority DESC, r.created, r.seq
                    LIMIT 1
                      FOR UPDATE SKIP LOCKED)
    RETURNING pyscheduler._leased_json(t) INTO v_task;
    RETURN v_task;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.lease_task(
    queue text, worker text, timeout interval DEFAULT '10 seconds',
    aging_rate double precision DEFAULT 0, aging_cap bigint DEFAULT 4294967295)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* lease_task(queue, worker, timeout => '10 seconds', aging_rate => 0,
              aging_cap => 4294967295) -> task jsonb or NULL
   lease_tasks with n => 1: the task leased (with its "token"), or NULL when
   none is ready. Commits asynchronously when it is the whole transaction,
   like lease_tasks. (Its own LIMIT 1 claim, _lease_task, whose generic plan
   the plan cache keeps.) */
BEGIN
    PERFORM _async_commit_if_alone();
    RETURN _lease_task($1, $2, $3, $4, $5, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.lease_task(text, text, interval, double precision, bigint) IS
    'Lease the next ready task of a queue (NULL when none), with its lease token; see lease_tasks.';

CREATE OR REPLACE FUNCTION pyscheduler._heartbeat_task(
    rn uuid, token uuid, progress double precision DEFAULT NULL, timeout interval DEFAULT '10 seconds',
    p_now timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_answer jsonb;
BEGIN
    PERFORM pyscheduler._check_progress(_heartbeat_task.progress);
    UPDATE pyscheduler.tasks t
       SET deadline = p_now + pyscheduler._timeout(_heartbeat_task.timeout), updated = p_now,
           progress = coalesce(_heartbeat_task.progress, t.progress)
     WHERE t.rn = _heartbeat_task.rn AND t.lease_token = _heartbeat_task.token AND t.status = 'running'
    RETURNING jsonb_build_object('rn', t.rn, 'status', t.status, 'progress', t.progress,
                                 'deadline', pyscheduler._ts(t.deadline)) INTO v_answer;
    IF v_answer IS NULL THEN
        PERFORM pyscheduler._timeout(_heartbeat_task.timeout);
        PERFORM pyscheduler._task_refused(_heartbeat_task.rn, _heartbeat_task.token);
    END IF;
    RETURN v_answer;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.heartbeat_task(
    rn uuid, token uuid, progress double precision DEFAULT NULL, timeout interval DEFAULT '10 seconds')
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* heartbeat_task(rn, token, progress => NULL, timeout => '10 seconds')
       -> {"rn", "status", "progress", "deadline"}
   The holder of the lease (token from the lease) extends it: deadline = now +
   timeout, and sets progress (0..1; NULL keeps it), in one statement guarded
   by the token and status = running. The answer is small on purpose (not the
   task). Commits asynchronously when it is the whole transaction, like
   lease_tasks: a heartbeat lost in a crash only makes the lease shorter.
   Errors: PS200 unknown, PS201 another lease holds it, PS202 not running,
   PS203 cancelled (stop working), PS205 progress, PS208 timeout, PS210 yielded. */
BEGIN
    PERFORM _async_commit_if_alone();
    RETURN _heartbeat_task($1, $2, $3, $4, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.heartbeat_task(uuid, uuid, double precision, interval) IS
    'The lease holder (token) extends its lease to now + timeout and reports progress; PS203 means cancelled.';

-- _check_leases(rns, tokens): PS208 unless rns and tokens are arrays of the same length.
CREATE OR REPLACE FUNCTION pyscheduler._check_leases(p_rns uuid[], p_tokens uuid[])
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_rns IS NULL OR p_tokens IS NULL OR cardinality(p_rns) <> cardinality(p_tokens) THEN
        RAISE EXCEPTION 'rns and tokens must be arrays of the same length, got % and %',
                        cardinality(p_rns), cardinality(p_tokens)
            USING ERRCODE = 'PS208', HINT = 'tokens[i] is the lease token of rns[i].';
    END IF;
END
$$;

-- _leases(rns, tokens): the leases (rns[i], tokens[i]) in rn order. The
-- batch writes (complete_tasks, heartbeat_tasks, yield_tasks) join the tasks
-- to this (a nested loop driven by it), so they lock rows in rn order: two of
-- them running at once wait for each other, they never deadlock.
CREATE OR REPLACE FUNCTION pyscheduler._leases(p_rns uuid[], p_tokens uuid[])
RETURNS TABLE (rn uuid, token uuid)
LANGUAGE sql IMMUTABLE
AS $$ SELECT l.rn, l.token FROM unnest(p_rns, p_tokens) AS l(rn, token) ORDER BY l.rn $$;

-- _refused(rns, tokens, done): (rn, sqlstate) of each lease (rns[i], tokens[i])
-- not in done, with _refusal's code: why a batch write did not touch it.
-- Nothing is read when done has them all (the common case).
CREATE OR REPLACE FUNCTION pyscheduler._refused(p_rns uuid[], p_tokens uuid[], p_done uuid[])
RETURNS TABLE (rn uuid, sqlstate text)
LANGUAGE sql STABLE
AS $$
    SELECT l.rn, pyscheduler._refusal(t.status, t.lease_token, l.token)
      FROM unnest(p_rns, p_tokens) AS l(rn, token)
      LEFT JOIN pyscheduler.tasks t ON t.rn = l.rn
     WHERE cardinality(p_done) < cardinality(p_rns) AND l.rn <> ALL (p_done);
$$;

CREATE OR REPLACE FUNCTION pyscheduler._heartbeat_tasks(
    rns uuid[], tokens uuid[], progress double precision[] DEFAULT NULL, timeout interval DEFAULT '10 seconds',
    p_now timestamptz DEFAULT now())
RETURNS TABLE (rn uuid, sqlstate text)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_deadline timestamptz := p_now + pyscheduler._timeout(_heartbeat_tasks.timeout);
    v_done uuid[];
    v_bad double precision;
BEGIN
    PERFORM pyscheduler._check_leases(rns, tokens);
    IF _heartbeat_tasks.progress IS NOT NULL THEN
        IF cardinality(_heartbeat_tasks.progress) <> cardinality(rns) THEN
            RAISE EXCEPTION 'progress must be NULL or an array as long as rns, got % and %',
                            cardinality(_heartbeat_tasks.progress), cardinality(rns)
                USING ERRCODE = 'PS208', HINT = 'progress[i] is the progress of rns[i] (NULL keeps it).';
        END IF;
        SELECT p INTO v_bad FROM unnest(_heartbeat_tasks.progress) p WHERE NOT (p >= 0 AND p <= 1) LIMIT 1;
        PERFORM pyscheduler._check_progress(v_bad);
    END IF;
    WITH beat AS (
        UPDATE pyscheduler.tasks t
           SET deadline = v_deadline, updated = p_now, progress = coalesce(l.progress, t.progress)
          FROM (SELECT * FROM unnest(rns, tokens, coalesce(_heartbeat_tasks.progress,
                                 array_fill(NULL::double precision, ARRAY[cardinality(rns)])))
                                 AS u(rn, token, progress)
                 ORDER BY u.rn) AS l
         WHERE t.rn = l.rn AND t.lease_token = l.token AND t.status = 'running'
        RETURNING t.rn)
    SELECT coalesce(array_agg(b.rn), '{}') INTO v_done FROM beat b;
    -- the rest were not touched by the update above: the state machine says why
    RETURN QUERY SELECT * FROM pyscheduler._refused(rns, tokens, v_done);
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.heartbeat_tasks(
    rns uuid[], tokens uuid[], progress double precision[] DEFAULT NULL, timeout interval DEFAULT '10 seconds')
RETURNS TABLE (rn uuid, sqlstate text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* heartbeat_tasks(rns, tokens, progress => NULL, timeout => '10 seconds')
       -> setof (rn uuid, sqlstate text)
   The batch form of heartbeat_task, in one statement: extends to now +
   timeout every lease (rns[i], tokens[i]) whose task is running under that
   token, and sets its progress to progress[i] (NULL, or a NULL progress
   array, keeps it). Returns one row per lease it did NOT extend, with the
   SQLSTATE heartbeat_task would have raised for it (PS200, PS201, PS202,
   PS203 cancelled: stop, PS210); no rows means every lease was extended.
   Commits asynchronously when it is the whole transaction, as heartbeat_task.
   Errors: PS205 a progress outside 0..1, PS208 arrays of different lengths,
   timeout. */
BEGIN
    PERFORM _async_commit_if_alone();
    RETURN QUERY SELECT * FROM _heartbeat_tasks($1, $2, $3, $4, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.heartbeat_tasks(uuid[], uuid[], double precision[], interval) IS
    'Extend many leases (rns[i] with token tokens[i]) in one statement; returns (rn, sqlstate) for each refused.';

CREATE OR REPLACE FUNCTION pyscheduler._complete_task(
    rn uuid, token uuid, result jsonb DEFAULT NULL, p_now timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_task jsonb;
    v_more boolean;
    v_limited boolean;
BEGIN
    PERFORM pyscheduler._check_result(_complete_task.result);
    UPDATE pyscheduler.tasks t
       SET status = 'completed', progress = 1, deadline = NULL, updated = p_now, result = _complete_task.result
     WHERE t.rn = _complete_task.rn AND t.lease_token = _complete_task.token AND t.status = 'running'
    RETURNING pyscheduler._task_json(t), t.watched OR t.has_children, t.limited INTO v_task, v_more, v_limited;
    IF v_task IS NULL THEN
        PERFORM pyscheduler._task_refused(_complete_task.rn, _complete_task.token);
    END IF;
    IF v_more THEN
        PERFORM pyscheduler._finished(ARRAY[_complete_task.rn], p_now);
    END IF;
    RETURN v_task;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.complete_task(rn uuid, token uuid, result jsonb DEFAULT NULL)
RETURNS jsonb
LANGUAGE sql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* complete_task(rn, token, result => NULL) -> task jsonb
   The lease holder finishes a running task: completed, progress 1.0, result
   stored (any JSON value, at most task_max_result_bytes; get_task shows it).
   A task cancelled meanwhile stays cancelled (PS203). Called inside the
   application's own transaction, next to its writes, it makes them and the
   completion one atomic change: the task's row stays locked until that
   transaction ends, so a lease lost before (PS201, PS202, ...) fails the
   transaction and its writes roll back; after it, the lease cannot be lost
   before the commit. Wakes whoever watches the task (watch_task) and makes
   its dependents ready.
   Errors: PS200 unknown, PS201 another lease holds it, PS202 not running,
   PS203 cancelled, PS210 yielded, PS217 result too large. */
    SELECT pyscheduler._complete_task(rn, token, result, now());
$$;
COMMENT ON FUNCTION pyscheduler.complete_task(uuid, uuid, jsonb) IS
    'The lease holder (token) marks a running task completed (progress 1.0) with an optional JSON result; PS203 if it was cancelled meanwhile.';

CREATE OR REPLACE FUNCTION pyscheduler._complete_tasks(
    rns uuid[], tokens uuid[], results jsonb DEFAULT NULL, p_now timestamptz DEFAULT now())
RETURNS TABLE (rn uuid, sqlstate text)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_done uuid[];
    v_more uuid[];
    v_queues text[];
    v_bad record;
BEGIN
    PERFORM pyscheduler._check_leases(rns, tokens);
    IF results IS NOT NULL THEN
        IF jsonb_typeof(results) <> 'array' OR jsonb_array_length(results) <> cardinality(rns) THEN
            RAISE EXCEPTION 'results must be NULL or a JSON array of one result per rn, got % for % rns',
                            left(results::text, 200), cardinality(rns)
                USING ERRCODE = 'PS208', HINT = 'results -> (i - 1) is the result of rns[i] (null: none).';
        END IF;
        SELECT e, i INTO v_bad FROM jsonb_array_elements(results) WITH ORDINALITY AS a(e, i)
         WHERE pg_column_size(e) > pyscheduler._task_limit('task_max_result_bytes') LIMIT 1;
        IF FOUND THEN
            PERFORM pyscheduler._check_result(v_bad.e, format('results[%s]', v_bad.i - 1));
        END IF;
    END IF;
    IF results IS NULL THEN
        WITH done AS (
            UPDATE pyscheduler.tasks t SET status = 'completed', progress = 1, deadline = NULL, updated = p_now
              FROM pyscheduler._leases(rns, tokens) AS l
             WHERE t.rn = l.rn AND t.lease_token = l.token AND t.status = 'running'
            RETURNING t.rn, t.watched OR t.has_children AS more)
        SELECT coalesce(array_agg(d.rn), '{}'), array_agg(d.rn) FILTER (WHERE d.more) INTO v_done, v_more FROM done d;
    ELSE
        WITH done AS (
            UPDATE pyscheduler.tasks t
               SET status = 'completed', progress = 1, deadline = NULL, updated = p_now, result = results -> (l.i - 1)::integer
              FROM (SELECT u.rn, u.token, u.i FROM unnest(rns, tokens) WITH ORDINALITY AS u(rn, token, i)
                     ORDER BY u.rn) AS l  -- rows locked in rn order (as _leases)
             WHERE t.rn = l.rn AND t.lease_token = l.token AND t.status = 'running'
            RETURNING t.rn, t.watched OR t.has_children AS more)
        SELECT coalesce(array_agg(d.rn), '{}'), array_agg(d.rn) FILTER (WHERE d.more) INTO v_done, v_more FROM done d;
    END IF;
    IF v_more IS NOT NULL THEN  -- the rare tasks someone waits for, or with children
        SELECT array_agg(t.rn) FILTER (WHERE t.watched OR t.has_children)
          INTO v_more FROM pyscheduler.tasks t WHERE t.rn = ANY (v_more);
        IF v_more IS NOT NULL THEN
            PERFORM pyscheduler._finished(v_more, p_now);
        END IF;
    END IF;
    -- the rest were not touched by the update above: the state machine says why
    RETURN QUERY SELECT * FROM pyscheduler._refused(rns, tokens, v_done);
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.complete_tasks(rns uuid[], tokens uuid[], results jsonb DEFAULT NULL)
RETURNS TABLE (rn uuid, sqlstate text)
LANGUAGE sql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* complete_tasks(rns, tokens, results => NULL) -> setof (rn uuid, sqlstate text)
   The batch form of complete_task, in one statement: completes every task
   rns[i] whose current lease has token tokens[i] and that is running, with
   the result results -> (i - 1) (results NULL: none).
   Returns one row per task it did NOT complete, with the SQLSTATE
   complete_task would have raised for it (PS200, PS201, PS202, PS203, PS210);
   no rows means all were completed. Errors: PS208 arrays (or results) of
   different lengths, PS217 a result too large (named). */
    SELECT * FROM pyscheduler._complete_tasks(rns, tokens, results, now());
$$;
COMMENT ON FUNCTION pyscheduler.complete_tasks(uuid[], uuid[], jsonb) IS
    'Complete many leased tasks (rns[i] with token tokens[i], result results[i-1]) in one statement; returns (rn, sqlstate) for each not completed.';

CREATE OR REPLACE FUNCTION pyscheduler._complete_and_lease(
    worker text, queue text, rn uuid DEFAULT NULL, token uuid DEFAULT NULL, timeout interval DEFAULT '10 seconds',
    aging_rate double precision DEFAULT 0, aging_cap bigint DEFAULT 4294967295, result jsonb DEFAULT NULL,
    p_now timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_more boolean;
    v_limited boolean;
BEGIN
    IF _complete_and_lease.rn IS NOT NULL THEN
        PERFORM pyscheduler._check_result(_complete_and_lease.result);
        UPDATE pyscheduler.tasks t
           SET status = 'completed', progress = 1, deadline = NULL, updated = p_now, result = _complete_and_lease.result
         WHERE t.rn = _complete_and_lease.rn AND t.lease_token = _complete_and_lease.token
           AND t.status = 'running'
        RETURNING t.watched OR t.has_children, t.limited INTO v_more, v_limited;
        IF NOT FOUND THEN
            PERFORM pyscheduler._task_refused(_complete_and_lease.rn, _complete_and_lease.token);
        END IF;
        IF v_more THEN
            PERFORM pyscheduler._finished(ARRAY[_complete_and_lease.rn], p_now);
        END IF;
    END IF;
    RETURN pyscheduler._lease_task(_complete_and_lease.queue, _complete_and_lease.worker,
                                   _complete_and_lease.timeout, _complete_and_lease.aging_rate,
                                   _complete_and_lease.aging_cap, p_now);
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.complete_and_lease(
    worker text, queue text, rn uuid DEFAULT NULL, token uuid DEFAULT NULL,
    timeout interval DEFAULT '10 seconds', aging_rate double precision DEFAULT 0,
    aging_cap bigint DEFAULT 4294967295, result jsonb DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* complete_and_lease(worker, queue, rn => NULL, token => NULL, timeout => '10 seconds',
                      aging_rate => 0, aging_cap => 4294967295, result => NULL)
       -> task jsonb or NULL
   A single-task worker's loop in one transaction per task: complete_task(rn,
   token, result), then lease_task(queue, worker, timeout, ...) — the next task
   leased (with its new token), or NULL when none is ready. rn NULL leases
   only (the first call). Each task still completed on its own with the
   seed's semantics. The transaction commits durably (the completion's);
   with rn NULL asynchronously when it is the whole transaction. If the
   completion is refused nothing is leased:
   Errors: PS200 unknown, PS201 another lease holds it, PS202 not running,
   PS203 cancelled (the task stays cancelled), PS210 yielded, PS217 result,
   and lease_task's PS208. */
BEGIN
    IF rn IS NULL THEN
        PERFORM _async_commit_if_alone();  -- a lease only, as lease_task
    END IF;
    RETURN _complete_and_lease(worker, queue, rn, token, timeout, aging_rate, aging_cap, result, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.complete_and_lease(text, text, uuid, uuid, interval, double precision, bigint, jsonb) IS
    'Complete the held task (rn, token; NULL: none) and lease the next ready task of a queue, in one transaction; NULL when none.';

CREATE OR REPLACE FUNCTION pyscheduler._abort_task(rn uuid, token uuid, errors jsonb, p_now timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_errors jsonb := pyscheduler._check_errors(_abort_task.errors);
    v_task jsonb;
    v_more boolean;
    v_limited boolean;
BEGIN
    UPDATE pyscheduler.tasks t
       SET status = 'aborted', deadline = NULL, updated = p_now,
           errors = pyscheduler._capped_errors(t.errors || v_errors, pyscheduler._task_limit('task_max_errors'),
                                               pyscheduler._task_limit('task_max_errors_bytes'))
     WHERE t.rn = _abort_task.rn AND t.lease_token = _abort_task.token AND t.status = 'running'
    RETURNING pyscheduler._task_json(t), t.watched OR t.has_children, t.limited INTO v_task, v_more, v_limited;
    IF v_task IS NULL THEN
        PERFORM pyscheduler._task_refused(_abort_task.rn, _abort_task.token);
    END IF;
    IF v_more THEN
        PERFORM pyscheduler._finished(ARRAY[_abort_task.rn], p_now);
    END IF;
    RETURN v_task;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.abort_task(rn uuid, token uuid, errors jsonb)
RETURNS jsonb
LANGUAGE sql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* abort_task(rn, token, errors) -> task jsonb
   The lease holder gives up on a running task for good: aborted, errors
   appended to those of earlier failed attempts (never retried; retry_task
   requeues it by hand).
   errors: a non-empty JSON array of {"code": text, "args": object,
   "description": text} (args and description optional; stored as {} and ""),
   at most task_max_errors entries and task_max_errors_bytes bytes.
   Errors: PS200 unknown, PS201 another lease holds it, PS202 not running,
   PS203 cancelled (the task stays cancelled), PS207 errors, PS210 yielded. */
    SELECT pyscheduler._abort_task(rn, token, errors, now());
$$;
COMMENT ON FUNCTION pyscheduler.abort_task(uuid, uuid, jsonb) IS
    'The lease holder (token) aborts a running task with errors [{code, args, description}]; terminal, never retried.';

-- _fail_tasks: THE failure of a lease (fail_task, fail_tasks): each lease
-- (rns[i], tokens[i]) whose task is running under that token gets errors[i]
-- appended and is retried after retry_in[i] (NULL: the default backoff), or
-- is aborted when it has used its max_attempts. Rows are locked in rn order
-- (as _leases). Returns the rns it failed.
CREATE OR REPLACE FUNCTION pyscheduler._fail_leases(
    rns uuid[], tokens uuid[], errors jsonb, retry_in interval[], p_now timestamptz)
RETURNS uuid[]
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_bad record;
    v_max_attempts integer := pyscheduler._task_limit('task_max_attempts');
    v_max_errors integer := pyscheduler._task_limit('task_max_errors');
    v_max_bytes integer := pyscheduler._task_limit('task_max_errors_bytes');
    v_history integer := pyscheduler._task_limit('task_max_history');
    v_base double precision := extract(epoch FROM pyscheduler._setting('task_backoff_base')::interval);
    v_cap double precision := extract(epoch FROM pyscheduler._setting('task_backoff_cap')::interval);
    v_done uuid[];
    v_queues text[];
    v_more uuid[];
BEGIN
    PERFORM pyscheduler._check_leases(rns, tokens);
    IF errors IS NULL OR jsonb_typeof(errors) <> 'array' OR jsonb_array_length(errors) <> cardinality(rns) THEN
        RAISE EXCEPTION 'errors must be a JSON array of one error object per rn, got % for % rns',
                        coalesce(left(errors::text, 200), 'NULL'), cardinality(rns)
            USING ERRCODE = 'PS207', HINT = 'errors -> (i - 1) is the error of rns[i], {"code", "args", "description"}.';
    END IF;
    IF retry_in IS NOT NULL AND cardinality(retry_in) <> cardinality(rns) THEN
        RAISE EXCEPTION 'retry_in must be NULL or as long as rns, got % and %', cardinality(retry_in), cardinality(rns)
            USING ERRCODE = 'PS208', HINT = 'retry_in[i] is the delay of rns[i] (NULL: the default backoff).';
    END IF;
    SELECT d, i INTO v_bad FROM unnest(retry_in) WITH ORDINALITY AS u(d, i)
     WHERE d IS NOT NULL AND NOT extract(epoch FROM d) BETWEEN 0 AND 31536000 LIMIT 1;  -- 365 days, as seconds
    IF FOUND THEN
        RAISE EXCEPTION 'retry_in must be between 0 and 365 days, got %', v_bad.d
            USING ERRCODE = 'PS212', HINT = 'NULL: the default backoff; 0: ready again at once.';
    END IF;
    -- every error checked (PS207 names the first bad one): a batch is failed whole or not at all
    SELECT e, i INTO v_bad FROM jsonb_array_elements(errors) WITH ORDINALITY AS a(e, i)
     WHERE pyscheduler._bad_error(e) OR pg_column_size(e) > v_max_bytes LIMIT 1;
    IF FOUND THEN
        PERFORM pyscheduler._check_errors(jsonb_build_array(v_bad.e), format('errors[%s]', v_bad.i - 1));
    END IF;
    WITH u AS (
        UPDATE pyscheduler.tasks t
           SET status = CASE WHEN t.attempts >= coalesce(t.max_attempts, v_max_attempts) THEN 'aborted'
                             WHEN pyscheduler._retry_at(t.attempts, l.delay, l.jitter, v_base, v_cap, p_now) > p_now
                                 THEN 'scheduled'
                             ELSE 'ready' END::pyscheduler.task_status,
               errors = pyscheduler._capped_errors(
                            t.errors || pyscheduler._error_entry(l.error)
                            || CASE WHEN t.attempts >= coalesce(t.max_attempts, v_max_attempts) THEN jsonb_build_object(
                                   'code', 'TaskMaxAttempts',
                                   'args', jsonb_build_object('attempts', t.attempts,
                                                              'max_attempts', coalesce(t.max_attempts, v_max_attempts)),
                                   'description', format('attempt %s of %s failed', t.attempts,
                                                         coalesce(t.max_attempts, v_max_attempts)))
                               ELSE '[]' END,
                            v_max_errors, v_max_bytes),
               deadline = NULL, updated = p_now,
               -- aborted: as abort_task. Retried: back in the queue without an owner
               -- or a lease; history += the lease's TaskAssignment, TaskRetry.
               run_at = CASE WHEN t.attempts >= coalesce(t.max_attempts, v_max_attempts) THEN t.run_at
                             ELSE pyscheduler._retry_at(t.attempts, l.delay, l.jitter, v_base, v_cap, p_now) END,
               owner = CASE WHEN t.attempts >= coalesce(t.max_attempts, v_max_attempts) THEN t.owner END,
               progress = CASE WHEN t.attempts >= coalesce(t.max_attempts, v_max_attempts) THEN t.progress ELSE 0 END,
               lease_token = CASE WHEN t.attempts >= coalesce(t.max_attempts, v_max_attempts) THEN t.lease_token END,
               leased_at = CASE WHEN t.attempts >= coalesce(t.max_attempts, v_max_attempts) THEN t.leased_at END,
               history = CASE WHEN t.attempts >= coalesce(t.max_attempts, v_max_attempts) THEN t.history
                         ELSE pyscheduler._trim_history(
                             pyscheduler._full_history(t.history, t.owner, t.leased_at)
                             || jsonb_build_array(jsonb_build_object(
                                    '_typ', 'TaskRetry', 'worker', t.owner, 'progress', t.progress,
                                    'attempt', t.attempts,
                                    'run_at', pyscheduler._ts(pyscheduler._retry_at(t.attempts, l.delay, l.jitter,
                                                                                     v_base, v_cap, p_now)),
                                    'time', pyscheduler._ts(p_now))),
                             v_history) END
          FROM (SELECT u.rn, u.token, e.e AS error, 0.5 + random() AS jitter,
                       make_interval(secs => extract(epoch FROM u.delay)::double precision) AS delay
                  FROM unnest(rns, tokens, coalesce(retry_in, array_fill(NULL::interval, ARRAY[cardinality(rns)])))
                           WITH ORDINALITY AS u(rn, token, delay, i)
                  JOIN jsonb_array_elements(errors) WITH ORDINALITY AS e(e, i) ON e.i = u.i
                 ORDER BY u.rn) AS l
         WHERE t.rn = l.rn AND t.lease_token = l.token AND t.status = 'running'
        RETURNING t.rn, t.queue, t.status, t.watched OR t.has_children AS more, t.limited)
    SELECT coalesce(array_agg(u.rn), '{}'),
           coalesce(array_agg(DISTINCT u.queue) FILTER (WHERE u.status <> 'aborted' OR u.limited), '{}'),
           array_agg(u.rn) FILTER (WHERE u.status = 'aborted' AND u.more)
      INTO v_done, v_queues, v_more FROM u;
    IF v_more IS NOT NULL THEN
        PERFORM pyscheduler._finished(v_more, p_now);
    END IF;
    PERFORM pyscheduler._notify_throttled(pyscheduler._task_channel(q)) FROM unnest(v_queues) q;
    RETURN v_done;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler._fail_task(
    rn uuid, token uuid, error jsonb, retry_in interval DEFAULT NULL, p_now timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_task jsonb;
BEGIN
    IF cardinality(pyscheduler._fail_leases(ARRAY[_fail_task.rn], ARRAY[_fail_task.token],
                                            jsonb_build_array(_fail_task.error), ARRAY[_fail_task.retry_in],
                                            p_now)) = 0 THEN
        PERFORM pyscheduler._task_refused(_fail_task.rn, _fail_task.token);
    END IF;
    SELECT pyscheduler._task_json(t) INTO v_task FROM pyscheduler.tasks t WHERE t.rn = _fail_task.rn;
    RETURN v_task;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.fail_task(rn uuid, token uuid, error jsonb, retry_in interval DEFAULT NULL)
RETURNS jsonb
LANGUAGE sql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* fail_task(rn, token, error, retry_in => NULL) -> task jsonb
   The lease holder reports that this attempt failed and the task should be
   tried again: error (one {"code", "args", "description"} object, as in
   abort_task) is appended to errors, history += the lease's TaskAssignment
   and TaskRetry {"worker", "progress", "attempt", "run_at", "time"}, and the
   task is back in its queue without owner or lease, 'scheduled' until
   run_at = now + retry_in (0: ready at once), or by default now + the
   backoff least(task_backoff_base * 2^attempt, task_backoff_cap) * a random
   factor in [0.5, 1.5) (settings; 1 s and 1 hour: 1-3 s after the first
   attempt, 2-6 s after the second, ...). A task that has used its attempts
   (max_attempts, or the setting task_max_attempts) is aborted instead, with
   its errors and a last one {"code": "TaskMaxAttempts"}. The lease's token
   is refused from then on. Wakes the queue's idle workers.
   Errors: PS200 unknown, PS201 another lease holds it, PS202 not running,
   PS203 cancelled (the task stays cancelled), PS207 error, PS210 yielded,
   PS212 retry_in outside 0..365 days. */
    SELECT pyscheduler._fail_task(rn, token, error, retry_in, now());
$$;
COMMENT ON FUNCTION pyscheduler.fail_task(uuid, uuid, jsonb, interval) IS
    'The lease holder (token) fails this attempt: error appended, retried after retry_in or the backoff; aborted after max_attempts.';

CREATE OR REPLACE FUNCTION pyscheduler._fail_tasks(
    rns uuid[], tokens uuid[], errors jsonb, retry_in interval[] DEFAULT NULL, p_now timestamptz DEFAULT now())
RETURNS TABLE (rn uuid, sqlstate text)
LANGUAGE sql
AS $$
    SELECT * FROM pyscheduler._refused(rns, tokens, pyscheduler._fail_leases(rns, tokens, errors, retry_in, p_now));
$$;

CREATE OR REPLACE FUNCTION pyscheduler.fail_tasks(
    rns uuid[], tokens uuid[], errors jsonb, retry_in interval[] DEFAULT NULL)
RETURNS TABLE (rn uuid, sqlstate text)
LANGUAGE sql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* fail_tasks(rns, tokens, errors, retry_in => NULL) -> setof (rn uuid, sqlstate text)
   The batch form of fail_task, in one statement: fails every lease (rns[i],
   tokens[i]) whose task is running under that token, with the error
   errors -> (i - 1) and the delay retry_in[i] (NULL, or no array: the
   default backoff). Returns one row per lease it did NOT fail, with the
   SQLSTATE fail_task would have raised for it (PS200, PS201, PS202, PS203,
   PS210); no rows means all were failed. Errors: PS207 errors not an array
   of as many error objects (the first bad one is named), PS208 arrays of
   different lengths, PS212 a retry_in outside 0..365 days. */
    SELECT * FROM pyscheduler._fail_tasks(rns, tokens, errors, retry_in, now());
$$;
COMMENT ON FUNCTION pyscheduler.fail_tasks(uuid[], uuid[], jsonb, interval[]) IS
    'Fail many leases (rns[i] with token tokens[i], error errors[i-1], delay retry_in[i]) in one statement; returns (rn, sqlstate) for each not failed.';

CREATE OR REPLACE FUNCTION pyscheduler._yield_task(
    rn uuid, token uuid, run_in interval DEFAULT NULL, p_now timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_task jsonb;
    v_run_at timestamptz := pyscheduler._run_at(NULL, _yield_task.run_in, p_now);
BEGIN
    IF v_run_at IS NULL THEN
        UPDATE pyscheduler.tasks t
           SET deadline = p_now - interval '1 second', updated = p_now, lease_token = NULL,
               attempts = t.attempts - 1,  -- a lease handed back is not an attempt used up
               leased_at = NULL,  -- the lease's TaskAssignment entry goes into history, then TaskYield
               history = pyscheduler._full_history(t.history, t.owner, t.leased_at)
                         || pyscheduler._history('TaskYield', t.owner, p_now, t.progress)
         WHERE t.rn = _yield_task.rn AND t.lease_token = _yield_task.token AND t.status = 'running'
        RETURNING pyscheduler._task_json(t) INTO v_task;
        IF v_task IS NULL THEN
            PERFORM pyscheduler._task_refused(_yield_task.rn, _yield_task.token);
        END IF;
        PERFORM pyscheduler._notify_throttled('pyscheduler_tasks_monitor');
        RETURN v_task;
    END IF;
    -- snooze: back in the queue at once, not leased before run_at, no attempt used
    UPDATE pyscheduler.tasks t
       SET status = CASE WHEN v_run_at > p_now THEN 'scheduled' ELSE 'ready' END::pyscheduler.task_status,
           run_at = v_run_at, deadline = NULL, updated = p_now, lease_token = NULL, owner = NULL, progress = 0,
           attempts = t.attempts - 1, leased_at = NULL,
           history = pyscheduler._trim_history(
               pyscheduler._full_history(t.history, t.owner, t.leased_at)
               || jsonb_build_array(jsonb_build_object('_typ', 'TaskYield', 'worker', t.owner, 'progress', t.progress,
                                                       'run_at', pyscheduler._ts(v_run_at), 'time', pyscheduler._ts(p_now))),
               pyscheduler._task_limit('task_max_history'))
     WHERE t.rn = _yield_task.rn AND t.lease_token = _yield_task.token AND t.status = 'running'
    RETURNING pyscheduler._task_json(t) INTO v_task;
    IF v_task IS NULL THEN
        PERFORM pyscheduler._task_refused(_yield_task.rn, _yield_task.token);
    END IF;
    PERFORM pyscheduler._notify_throttled(pyscheduler._task_channel(v_task ->> 'queue'));
    RETURN v_task;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.yield_task(rn uuid, token uuid, run_in interval DEFAULT NULL)
RETURNS jsonb
LANGUAGE sql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* yield_task(rn, token, run_in => NULL) -> task jsonb
   The lease holder hands a running task back (e.g. on SIGTERM): deadline =
   now - 1 s, history += TaskYield with its progress, and the lease ends (its
   token is refused from then on: PS210). The monitor resets the task to ready
   on its next pass (woken at once by NOTIFY pyscheduler_tasks_monitor),
   without a TaskTimeout entry.
   run_in (snooze, 0..365 days): the task is back in its queue at once,
   'scheduled' until now + run_in (0: ready), without owner or lease, its
   TaskYield entry with that run_at; as any yield, not an attempt used.
   Errors: PS200 unknown, PS201 another lease holds it, PS202 not running,
   PS203 cancelled, PS210 already yielded, PS212 run_in. */
    SELECT pyscheduler._yield_task(rn, token, run_in, now());
$$;
COMMENT ON FUNCTION pyscheduler.yield_task(uuid, uuid, interval) IS
    'The lease holder (token) yields a running task (the monitor makes it ready again), or snoozes it: scheduled again after run_in, no attempt used.';

CREATE OR REPLACE FUNCTION pyscheduler.holds_lease(rn uuid, token uuid)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* holds_lease(rn, token) -> boolean
   Whether token is the current lease of running task rn; when it is, the
   task's row is locked (FOR KEY SHARE) until the calling transaction ends,
   so the lease cannot be lost before that transaction commits: the monitor
   skips a locked task, a cancel waits for it (heartbeats and the completion
   go on). For an application's own writes that must happen only under the
   lease, in the application's transaction:
     UPDATE accounts SET balance = balance - 10
      WHERE id = 7 AND pyscheduler.holds_lease(:rn, :token);
   false (and nothing locked) when the lease is gone (expired and reset,
   leased again, yielded, finished, cancelled, or no such task). */
#variable_conflict use_column
BEGIN
    PERFORM 1 FROM tasks t
     WHERE t.rn = holds_lease.rn AND t.lease_token = holds_lease.token AND t.status = 'running'
       FOR KEY SHARE;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION pyscheduler.holds_lease(uuid, uuid) IS
    'Whether token is the current lease of running task rn; if so the task stays locked (its lease cannot be lost) until the calling transaction ends.';

CREATE OR REPLACE FUNCTION pyscheduler.watch_task(rn uuid)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* watch_task(rn) -> task jsonb
   Ask to be told when task rn finishes: from now on its end (completed,
   aborted, cancelled) sends NOTIFY pyscheduler_task:<rn> with the status as
   payload. LISTEN on that channel first, then call watch_task: a task
   finished already is answered finished (read its result there), else the
   notification comes at its commit. A task nobody watches finishes without
   a NOTIFY (a NOTIFY at every finish would serialise every completion's
   commit on the notification queue).
   Errors: PS200 unknown task, 42501 a task of another role. */
#variable_conflict use_column
DECLARE
    v_task pyscheduler.tasks := _owned_task(watch_task.rn);
BEGIN
    IF NOT v_task.watched AND v_task.status IN ('waiting', 'scheduled', 'ready', 'running') THEN
        UPDATE tasks t SET watched = true WHERE t.rn = watch_task.rn RETURNING t.* INTO v_task;
    END IF;
    RETURN _task_json(v_task);
END
$$;
COMMENT ON FUNCTION pyscheduler.watch_task(uuid) IS
    'Have task rn NOTIFY pyscheduler_task:<rn> (payload: its status) when it finishes; returns it (already finished: its result).';

CREATE OR REPLACE FUNCTION pyscheduler.parent_results(rn uuid, token uuid)
RETURNS jsonb
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* parent_results(rn, token) -> jsonb
   For the holder of a lease (token) of task rn: its parents (after), in
   order, as [{"rn", "status", "result"}] (status NULL: cleaned up);
   lease_task and lease_tasks show the same as "parents".
   Errors: PS200, PS201, PS202, PS203, PS210 as complete_task. */
#variable_conflict use_column
DECLARE
    v_after uuid[];
BEGIN
    SELECT t.after INTO v_after FROM tasks t
     WHERE t.rn = parent_results.rn AND t.lease_token = parent_results.token AND t.status = 'running';
    IF NOT FOUND THEN
        PERFORM _task_refused(parent_results.rn, parent_results.token);
    END IF;
    RETURN _parent_results(coalesce(v_after, '{}'));
END
$$;
COMMENT ON FUNCTION pyscheduler.parent_results(uuid, uuid) IS
    'The lease holder (token) reads the status and result of each parent of task rn.';

CREATE OR REPLACE FUNCTION pyscheduler._yield_tasks(rns uuid[], tokens uuid[], p_now timestamptz DEFAULT now())
RETURNS TABLE (rn uuid, sqlstate text)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_done uuid[];
BEGIN
    PERFORM pyscheduler._check_leases(rns, tokens);
    WITH y AS (
        UPDATE pyscheduler.tasks t
           SET deadline = p_now - interval '1 second', updated = p_now, lease_token = NULL,
               attempts = t.attempts - 1,  -- a lease handed back is not an attempt used up
               leased_at = NULL,  -- the lease's TaskAssignment entry goes into history, then TaskYield
               history = pyscheduler._full_history(t.history, t.owner, t.leased_at)
                         || pyscheduler._history('TaskYield', t.owner, p_now, t.progress)
          FROM pyscheduler._leases(rns, tokens) AS l
         WHERE t.rn = l.rn AND t.lease_token = l.token AND t.status = 'running'
        RETURNING t.rn)
    SELECT coalesce(array_agg(y.rn), '{}') INTO v_done FROM y;
    IF cardinality(v_done) > 0 THEN
        PERFORM pyscheduler._notify_throttled('pyscheduler_tasks_monitor');
    END IF;
    -- the rest were not touched by the update above: the state machine says why
    RETURN QUERY SELECT * FROM pyscheduler._refused(rns, tokens, v_done);
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.yield_tasks(rns uuid[], tokens uuid[])
RETURNS TABLE (rn uuid, sqlstate text)
LANGUAGE sql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* yield_tasks(rns, tokens) -> setof (rn uuid, sqlstate text)
   The batch form of yield_task, in one statement: hands back every lease
   (rns[i], tokens[i]) whose task is running under that token (deadline =
   now - 1 s, history += TaskYield, the token refused from then on); the
   monitor makes them ready at once. A worker stopping hands back the tasks
   it leased but never started this way. Returns one row per lease it did
   NOT yield, with the SQLSTATE yield_task would have raised for it (PS200,
   PS201, PS202, PS203, PS210); no rows means all were yielded.
   Errors: PS208 arrays of different lengths. */
    SELECT * FROM pyscheduler._yield_tasks(rns, tokens, now());
$$;
COMMENT ON FUNCTION pyscheduler.yield_tasks(uuid[], uuid[]) IS
    'Yield many leases (rns[i] with token tokens[i]) in one statement; returns (rn, sqlstate) for each not yielded.';

-- ---------------------------------------------------------------- monitor

CREATE OR REPLACE FUNCTION pyscheduler._reset_expired_tasks(max_tasks integer DEFAULT 1000, p_now timestamptz DEFAULT now())
RETURNS TABLE (task jsonb)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_queues text[] := '{}';
    v_task jsonb;
    v_history integer := pyscheduler._task_limit('task_max_history');
    v_attempts integer := pyscheduler._task_limit('task_max_attempts');
    v_max_errors integer := pyscheduler._task_limit('task_max_errors');
    v_max_bytes integer := pyscheduler._task_limit('task_max_errors_bytes');
BEGIN
    IF max_tasks IS NULL OR max_tasks < 1 THEN
        RAISE EXCEPTION 'max_tasks must be at least 1, got %', coalesce(max_tasks::text, 'NULL')
            USING ERRCODE = 'PS208';
    END IF;
    FOR v_task IN
        WITH x AS (
            SELECT r.rn, r.lease_token IS NULL AS yielded FROM pyscheduler.tasks r
             WHERE r.status = 'running' AND r.deadline < p_now
             ORDER BY r.deadline
             LIMIT max_tasks
               FOR UPDATE SKIP LOCKED),
        v AS (
            SELECT x.rn, x.yielded, coalesce(t.max_attempts, v_attempts) AS max_attempts,
                   NOT x.yielded AND t.attempts >= coalesce(t.max_attempts, v_attempts) AS give_up
              FROM x JOIN pyscheduler.tasks t ON t.rn = x.rn)
        UPDATE pyscheduler.tasks t
           SET status = CASE WHEN v.give_up THEN 'aborted' ELSE 'ready' END::pyscheduler.task_status,
               owner = CASE WHEN v.give_up THEN t.owner END,
               progress = CASE WHEN v.give_up THEN t.progress ELSE 0 END,
               lease_token = CASE WHEN v.give_up THEN t.lease_token END,
               errors = CASE WHEN v.give_up THEN pyscheduler._capped_errors(t.errors || jsonb_build_object(
                            'code', 'TaskMaxAttempts',
                            'args', jsonb_build_object('attempts', t.attempts, 'max_attempts', v.max_attempts),
                            'description', format('attempt %s of %s: the lease timed out', t.attempts,
                                                  v.max_attempts)),
                            v_max_errors, v_max_bytes)
                        ELSE t.errors END,
               deadline = NULL, updated = p_now, leased_at = NULL,
               -- the lease's TaskAssignment entry (a yield wrote it already), then TaskTimeout
               history = pyscheduler._trim_history(CASE WHEN v.yielded THEN t.history
                              ELSE pyscheduler._full_history(t.history, t.owner, t.leased_at)
                                   || pyscheduler._history('TaskTimeout', t.owner, p_now, t.progress) END,
                              v_history)
          FROM v
         WHERE t.rn = v.rn
        RETURNING pyscheduler._task_json(t) || CASE WHEN t.status = 'aborted' AND (t.watched OR t.has_children)
                                                    THEN '{"_more": true}'::jsonb ELSE '{}'::jsonb END
    LOOP
        IF v_task ->> 'status' = 'ready' AND NOT (v_task ->> 'queue') = ANY (v_queues) THEN
            v_queues := v_queues || (v_task ->> 'queue');
        END IF;
        IF v_task ? '_more' THEN
            v_task := v_task - '_more';
            PERFORM pyscheduler._finished(ARRAY[(v_task ->> 'rn')::uuid], p_now);
        END IF;
        task := v_task;
        RETURN NEXT;
    END LOOP;
    PERFORM pyscheduler._notify_throttled(pyscheduler._task_channel(q)) FROM unnest(v_queues) q;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.reset_expired_tasks(max_tasks integer DEFAULT 1000)
RETURNS TABLE (task jsonb)
LANGUAGE sql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* reset_expired_tasks(max_tasks => 1000) -> setof (task jsonb)
   The failure detector: running tasks whose deadline < now become ready again
   (owner NULL, progress 0, deadline NULL, no lease); history += TaskTimeout
   (worker, progress at the timeout) unless the lease was yielded. A task
   whose timed-out lease was its last attempt (attempts = leases not
   yielded, failed ones included; max_attempts or the setting
   task_max_attempts) is aborted instead, with the error TaskMaxAttempts
   appended (the crash-loop guard). History keeps its last
   task_max_history entries. At most max_tasks per call (call again while it
   returns max_tasks); wakes the workers of each queue touched. Returns the
   tasks reset or aborted. Errors: PS208 max_tasks < 1. */
    SELECT t.task FROM pyscheduler._reset_expired_tasks(max_tasks, now()) AS t;
$$;
COMMENT ON FUNCTION pyscheduler.reset_expired_tasks(integer) IS
    'Monitor: running tasks past their deadline become ready (TaskTimeout unless yielded) or, after their last attempt, aborted.';

CREATE OR REPLACE FUNCTION pyscheduler._cleanup_tasks(
    retention interval DEFAULT '7 days', max_tasks integer DEFAULT 10000, p_now timestamptz DEFAULT now())
RETURNS integer
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_deleted integer;
BEGIN
    IF retention IS NULL OR retention < interval '0' OR max_tasks IS NULL OR max_tasks < 1 THEN
        RAISE EXCEPTION 'retention must be >= 0 and max_tasks >= 1, got % and %', retention, max_tasks
            USING ERRCODE = 'PS208';
    END IF;
    DELETE FROM pyscheduler.tasks t
     WHERE t.rn IN (SELECT r.rn FROM pyscheduler.tasks r
                     WHERE r.status IN ('completed', 'aborted', 'cancelled')
                       AND r.updated < p_now - retention
                     LIMIT max_tasks
                       FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    RETURN v_deleted;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.cleanup_tasks(
    retention interval DEFAULT '7 days', max_tasks integer DEFAULT 10000)
RETURNS integer
LANGUAGE sql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* cleanup_tasks(retention => '7 days', max_tasks => 10000) -> integer
   Monitor: delete up to max_tasks tasks that are completed, aborted or
   cancelled and were last updated before now - retention; returns how many.
   Call again while it returns max_tasks.
   Errors: PS208 retention < 0 or max_tasks < 1. */
    SELECT pyscheduler._cleanup_tasks(retention, max_tasks, now());
$$;
COMMENT ON FUNCTION pyscheduler.cleanup_tasks(interval, integer) IS
    'Monitor: delete terminal tasks not updated within retention; returns how many were deleted.';

-- ---------------------------------------------------------------- views (psql)

CREATE OR REPLACE VIEW pyscheduler.task_counts AS
    SELECT queue, status, count(*) AS tasks
      FROM pyscheduler.tasks
     GROUP BY queue, status;
COMMENT ON VIEW pyscheduler.task_counts IS 'Number of tasks per queue and status.';

CREATE OR REPLACE VIEW pyscheduler.expired_leases AS
    SELECT rn, queue, owner, deadline, now() - deadline AS overdue, progress
      FROM pyscheduler.tasks
     WHERE status = 'running' AND deadline < now();
COMMENT ON VIEW pyscheduler.expired_leases IS
    'Running tasks past their deadline: the monitor will reset them (or is not running).';

CREATE OR REPLACE VIEW pyscheduler.oldest_ready_tasks AS
    SELECT DISTINCT ON (queue) queue, rn, priority, created, now() - created AS age
      FROM pyscheduler.tasks
     WHERE status = 'ready'
     ORDER BY queue, created, seq;
COMMENT ON VIEW pyscheduler.oldest_ready_tasks IS 'The oldest ready task of each queue and how long it has waited.';

-- queue_status: one row per queue with live tasks or a task_queues row. It
-- reads the live tasks only (scheduled, ready and running, through their
-- partial indexes), never the finished ones kept for retention: its cost
-- grows with the work waiting and running, not with the tasks stored (less
-- than task_counts, which counts every task).
CREATE OR REPLACE VIEW pyscheduler.queue_status AS
    WITH ready AS (
        SELECT queue, count(*) AS n, now() - min(updated) AS oldest
          FROM pyscheduler.tasks WHERE status = 'ready' GROUP BY queue),
    delayed AS (
        SELECT queue, count(*) AS n, min(run_at) AS next_due
          FROM pyscheduler.tasks WHERE status = 'scheduled' GROUP BY queue),
    running AS (
        SELECT queue, count(*) AS n
          FROM pyscheduler.tasks WHERE status = 'running' GROUP BY queue),
    waiting AS (
        SELECT queue, count(*) AS n
          FROM pyscheduler.tasks WHERE status = 'waiting' GROUP BY queue),
    queues AS (
        SELECT queue FROM ready UNION SELECT queue FROM delayed UNION SELECT queue FROM running
        UNION SELECT queue FROM waiting UNION SELECT queue FROM pyscheduler.task_queues)
    SELECT n.queue, coalesce(r.n, 0) AS ready, coalesce(d.n, 0) AS delayed, coalesce(g.n, 0) AS running,
           coalesce(q.paused, false) AS paused, q.note, q.paused_by, r.oldest AS oldest_ready_age, d.next_due,
           coalesce(w.n, 0) AS waiting
      FROM queues n
      LEFT JOIN ready r ON r.queue = n.queue
      LEFT JOIN delayed d ON d.queue = n.queue
      LEFT JOIN running g ON g.queue = n.queue
      LEFT JOIN waiting w ON w.queue = n.queue
      LEFT JOIN pyscheduler.task_queues q ON q.queue = n.queue;
COMMENT ON VIEW pyscheduler.queue_status IS
    'Per queue: tasks ready, delayed (scheduled), running and waiting (for parents), whether it is paused, the oldest ready task''s wait, the next due time.';

-- ---------------------------------------------------------------- grants

SELECT pyscheduler._grant('client', 'submit_task', 'submit_tasks', 'submit_workflow', 'get_task', 'list_tasks',
                         'cancel_task', 'retry_task', 'retry_tasks', 'pause_queue', 'resume_queue', 'next_task_due',
                         'watch_task', 'set_queue_limits', 'set_rate_limit',
                         'task_counts', 'expired_leases', 'oldest_ready_tasks', 'queue_status', 'queue_limits');
SELECT pyscheduler._grant('worker', 'register_worker', 'lease_task', 'lease_tasks', 'lease_tasks_lean',
                         'heartbeat_task', 'heartbeat_tasks', 'complete_task', 'complete_tasks', 'complete_and_lease',
                         'fail_task', 'fail_tasks', 'abort_task', 'yield_task', 'yield_tasks', 'get_task',
                         'next_task_due', 'holds_lease', 'parent_results');
SELECT pyscheduler._grant('monitor', 'get_task', 'list_tasks', 'next_task_due', 'task_counts', 'expired_leases',
                         'oldest_ready_tasks', 'queue_status', 'queue_limits');
SELECT pyscheduler._grant('admin', 'reset_expired_tasks', 'cleanup_tasks');
