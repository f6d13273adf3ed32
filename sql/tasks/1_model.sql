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
-- member of it, or admin cancels or requeues it (42501 otherwise) or reads
-- its contents (_task_seen_json); a queue belongs to the role that first
-- submitted to it (task_queues.owner): only that role, a member of it, or
-- admin changes its settings (3_queues.sql).
--
-- The state machine, in one place: the writes of a lease holder all guard
-- with `status = 'running' AND lease_token = token` (yield clears the token),
-- cancel with `status IN ('scheduled', 'ready', 'running')`, retry with
-- `status IN ('aborted', 'cancelled')`; why a write matched no row is
-- _refusal() below. docs/sql-api.md has it as a table, checked by
-- tests/tasks/test_state_machine_and_bounds.py against these functions.
--
-- SQLSTATE codes (docs/sql-api.md, pyscheduler/errors.py):
--   PS200 unknown task          PS207 invalid errors (shape, too many, too large)
--   PS201 lease lost (another   PS208 invalid argument (queue, worker, timeout,
--         lease holds the task)        n, aging, status, retention, max_tasks,
--   PS202 not running                  tokens, max_attempts, note)
--   PS203 task cancelled        PS209 task already finished (cancel of completed/aborted)
--   PS204 invalid priority      PS210 the lease was yielded
--   PS205 invalid progress      PS211 not requeueable (not aborted/cancelled, or a parent failed)
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

-- Counts (issue 21: a read path never scans the table). _task_tallies holds the number of
-- tasks per (queue, status) as rows to sum: every statement that inserts, deletes or changes
-- the status of tasks appends its deltas in its own transaction, through _task_tally or
-- _task_tally_many (a submit: +n; a lease: ready -n, running +n; a cleanup: completed -n), so
-- task_counts and queue_status are exact and read a few hundred rows whatever is stored. A
-- delta is appended, never a shared counter row updated: a writer never waits for another
-- (a client's transaction that cancels a task would hold the row until it commits). The tasks
-- monitor folds the rows no other transaction is folding into one per pair every merge_interval
-- (fold_task_tallies), and a writing call too, one in _task_fold_chance(): the fallback without a
-- monitor. The Worker's lease and completion add one small INSERT per batch.
-- Rows written by hand (INSERT/UPDATE/DELETE outside these functions) are not counted: call
-- pyscheduler._task_count_all() to count the table again.

-- _task_fold_chance(): the share of writing calls that fold the tallies (_task_fold_tallies),
-- one in 1,000 (one in 50 before the tasks monitor folded them: issue 31). A fold reads the whole
-- tally table, the rows deleted since its last vacuum too (up to a minute of them at autovacuum's
-- pace): a single-task call (a submit, lease_task, complete_task) that folded one call in 50 paid
-- ~33 us a call for it. Without a monitor, the views then sum up to a few thousand rows. SQL and
-- IMMUTABLE: inlined, a constant, in the callers' cached plans.
CREATE OR REPLACE FUNCTION pyscheduler._task_fold_chance()
RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 0.001;

-- _task_fold_tallies(): replace the tally rows no other transaction is folding by their sums.
-- Its own, not one fold for all delta tables: that needs dynamic SQL, +28 % a fold (docs/benchmarks.md).
CREATE OR REPLACE FUNCTION pyscheduler._task_fold_tallies()
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    WITH gone AS (
        DELETE FROM pyscheduler._task_tallies c
         WHERE c.ctid = ANY (ARRAY(SELECT x.ctid FROM pyscheduler._task_tallies x FOR UPDATE SKIP LOCKED))
        RETURNING c.queue, c.status, c.n)
    INSERT INTO pyscheduler._task_tallies (queue, status, n)
    SELECT g.queue, g.status, sum(g.n) FROM gone g GROUP BY g.queue, g.status HAVING sum(g.n) <> 0;
END
$$;

-- _task_tally(queue, from, to, n): n tasks of queue went from status from to status to (from
-- NULL: submitted; to NULL: deleted); nothing when n = 0 or from = to. PL/pgSQL, as the two
-- below: it keeps its statements' plans for the session (a SQL function that is not inlined is
-- planned on every call: ~100 us, more than a single-task call's own work).
CREATE OR REPLACE FUNCTION pyscheduler._task_tally(p_queue text, p_from pyscheduler.task_status,
                                                   p_to pyscheduler.task_status, p_n bigint)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    IF p_n = 0 OR p_from IS NOT DISTINCT FROM p_to THEN
        RETURN;
    END IF;
    INSERT INTO pyscheduler._task_tallies (queue, status, n)
    SELECT p_queue, s.status, s.n FROM (VALUES (p_from, -p_n), (p_to, p_n)) AS s(status, n)
     WHERE s.status IS NOT NULL;
    IF random() < pyscheduler._task_fold_chance() THEN
        PERFORM pyscheduler._task_fold_tallies();
    END IF;
END
$$;

-- _task_tally_many(queues, from, to, froms, tos): task i of queues went from froms[i] (NULL:
-- from) to tos[i] (NULL: to), NULL as in _task_tally; grouped first (a batch is mostly one
-- queue and one move), then one row per (queue, status) that changed.
CREATE OR REPLACE FUNCTION pyscheduler._task_tally_many(
    p_queues text[], p_from pyscheduler.task_status, p_to pyscheduler.task_status,
    p_froms pyscheduler.task_status[] DEFAULT NULL, p_tos pyscheduler.task_status[] DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    IF coalesce(cardinality(p_queues), 0) = 0 THEN
        RETURN;
    END IF;
    INSERT INTO pyscheduler._task_tallies (queue, status, n)
    SELECT g.queue, v.status, sum(v.n * g.c)
      FROM (SELECT u.queue, coalesce(u.f, p_from) AS f, coalesce(u.t, p_to) AS t, count(*) AS c
              FROM unnest(p_queues, p_froms, p_tos) AS u(queue, f, t)
             WHERE u.queue IS NOT NULL
             GROUP BY 1, 2, 3) AS g,
           LATERAL (VALUES (g.f, -1), (g.t, 1)) AS v(status, n)
     WHERE v.status IS NOT NULL AND g.f IS DISTINCT FROM g.t
     GROUP BY g.queue, v.status HAVING sum(v.n * g.c) <> 0;
    IF random() < pyscheduler._task_fold_chance() THEN
        PERFORM pyscheduler._task_fold_tallies();
    END IF;
END
$$;

-- _task_count_all(): the tallies from the table itself (after rows were written by hand).
-- Writers wait while it counts (SHARE lock), so none is missed.
CREATE OR REPLACE FUNCTION pyscheduler._task_count_all()
RETURNS void
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    LOCK TABLE pyscheduler.tasks IN SHARE MODE;
    LOCK TABLE pyscheduler._task_tallies IN EXCLUSIVE MODE;
    DELETE FROM pyscheduler._task_tallies;
    INSERT INTO pyscheduler._task_tallies (queue, status, n)
    SELECT t.queue, t.status, count(*) FROM pyscheduler.tasks t GROUP BY t.queue, t.status;
    INSERT INTO pyscheduler.settings (name, value) VALUES ('tasks_counted', now()::text)
    ON CONFLICT (name) DO UPDATE SET value = excluded.value;
END
$$;
-- TRUNCATE (an operator emptying the table): the tallies go with the rows
CREATE OR REPLACE FUNCTION pyscheduler._tasks_truncated()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    DELETE FROM pyscheduler._task_tallies;
    RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER tasks_truncated AFTER TRUNCATE ON pyscheduler.tasks
    FOR EACH STATEMENT EXECUTE FUNCTION pyscheduler._tasks_truncated();
-- in the transaction that loads these functions (the post-apply step of migrate): not in a
-- migration, which commits before them (what is written in between would go uncounted)
DO $count$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pyscheduler.settings WHERE name = 'tasks_counted') THEN
        PERFORM pyscheduler._task_count_all();
    END IF;
END
$count$;

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

-- _task_seen_json(t, seen): a task as a reader sees it (get_task, list_tasks): whole when its
-- role is one of seen (_seen_owners(): the reader's roles; NULL: admin, every role), else its
-- metadata only (docs/sql-api.md, "Ownership"): the contents (spec, result, errors, history,
-- unique_key, concurrency_key) are null and "redacted" is true.
CREATE OR REPLACE FUNCTION pyscheduler._task_seen_json(t pyscheduler.tasks, p_seen name[])
RETURNS jsonb
LANGUAGE plpgsql STABLE  -- as a SQL function it was not inlined, but planned on every call
AS $$
BEGIN
    IF p_seen IS NULL OR t.submitted_by = ANY (p_seen) THEN
        RETURN pyscheduler._task_json(t);
    END IF;
    RETURN pyscheduler._task_json(t) || '{"spec": null, "result": null, "errors": null, "history": null,
                                          "unique_key": null, "concurrency_key": null, "redacted": true}';
END
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
-- PL/pgSQL: as a SQL function with a sub-SELECT it was not inlined, and the UPDATEs calling it a
-- row each planned it on every call (issue 31).
CREATE OR REPLACE FUNCTION pyscheduler._trim_history(p_history jsonb, p_max integer)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF jsonb_array_length(p_history) <= p_max THEN
        RETURN p_history;
    END IF;
    RETURN coalesce((SELECT jsonb_agg(e ORDER BY i) FROM jsonb_array_elements(p_history) WITH ORDINALITY AS a(e, i)
                      WHERE i > jsonb_array_length(p_history) - p_max), '[]');
END
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
LANGUAGE sql STABLE  -- as jsonb_build_object: declared IMMUTABLE it was not inlined, but planned on every call
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
    v_moved text[];
    v_to pyscheduler.task_status[];
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
               coalesce(array_agg(DISTINCT u.queue) FILTER (WHERE u.status IN ('ready', 'scheduled')), '{}'),
               coalesce(array_agg(u.queue), '{}'), array_agg(u.status)
          INTO v_rns, v_queues, v_moved, v_to FROM u;
        PERFORM pyscheduler._task_tally_many(v_moved, 'waiting', NULL, p_tos => v_to);
        PERFORM pyscheduler._notify_throttled(pyscheduler._task_channel(q)) FROM unnest(v_queues) q;
    END LOOP;
END
$$;
