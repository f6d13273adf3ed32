-- pyscheduler: leased tasks (seeds/scylla.md). Reloaded on every migrate.
--
-- A task is submitted ready, leased by a worker (running, owner, deadline),
-- kept alive with heartbeats, and finished by its owner (completed, aborted)
-- or by a client (cancelled). The monitor resets running tasks whose deadline
-- has passed (TaskTimeout in history, not after a TaskYield) and deletes
-- terminal tasks past retention. Every time comes from the database clock;
-- functions that read it take `now` (NULL = the clock) for tests.
--
-- SQLSTATE codes (docs/sql-api.md, pyscheduler/errors.py):
--   PS200 unknown task          PS205 invalid progress
--   PS201 not the owner         PS206 invalid spec
--   PS202 not running           PS207 invalid errors
--   PS203 task cancelled        PS208 invalid argument (queue, worker, timeout, n, ...)
--   PS204 invalid priority      PS209 task already finished (cancel of completed/aborted)
--
-- Notifications (hints; polling is the fallback), throttled per channel:
--   pyscheduler_tasks:<queue>    a task became ready in <queue> (submit, reset)
--   pyscheduler_cancel:<worker>  a task <worker> holds was cancelled
--   pyscheduler_tasks_monitor    a task was yielded: the monitor may reset it now

-- ---------------------------------------------------------------- helpers

-- _task_json(t): a task in the seed's JSON shape.
CREATE OR REPLACE FUNCTION pyscheduler._task_json(t pyscheduler.tasks)
RETURNS jsonb
LANGUAGE sql STABLE
AS $$
    SELECT jsonb_build_object(
        'rn', t.rn, 'spec', t.spec, 'queue', t.queue, 'priority', t.priority,
        'status', t.status, 'progress', t.progress, 'created', t.created,
        'updated', t.updated, 'errors', t.errors, 'owner', t.owner,
        'deadline', t.deadline, 'history', t.history);
$$;

-- _history(typ, worker, time, progress): one history entry in the seed's shape
-- (progress only where the seed shows it: TaskTimeout and TaskYield).
-- STABLE, not IMMUTABLE: a timestamptz in JSON depends on TimeZone, and the
-- planner inlines a SQL function only when its body is no more volatile than
-- declared; not inlined, it was parsed and planned on every lease (~25 us).
CREATE OR REPLACE FUNCTION pyscheduler._history(
    p_typ text, p_worker text, p_time timestamptz, p_progress double precision DEFAULT NULL)
RETURNS jsonb
LANGUAGE sql STABLE
AS $$
    SELECT jsonb_build_array(CASE WHEN p_progress IS NULL
        THEN jsonb_build_object('_typ', p_typ, 'worker', p_worker, 'time', p_time)
        ELSE jsonb_build_object('_typ', p_typ, 'worker', p_worker, 'progress', p_progress, 'time', p_time)
    END);
$$;

CREATE OR REPLACE FUNCTION pyscheduler._task_channel(p_queue text)
RETURNS text
LANGUAGE sql IMMUTABLE
AS $$ SELECT 'pyscheduler_tasks:' || p_queue $$;

-- _check_task_args: PS204/PS208 for arguments shared by several functions.
-- NULL means "not given" for each argument.
CREATE OR REPLACE FUNCTION pyscheduler._check_task_args(
    p_queue text DEFAULT NULL, p_worker text DEFAULT NULL, p_timeout interval DEFAULT NULL,
    p_priority bigint DEFAULT NULL, p_queue_given boolean DEFAULT false,
    p_worker_given boolean DEFAULT false)
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
    IF p_timeout IS NOT NULL AND p_timeout <= interval '0' THEN
        RAISE EXCEPTION 'timeout must be positive, got %', p_timeout
            USING ERRCODE = 'PS208', HINT = 'The lease lasts timeout from now, e.g. ''10 seconds''.';
    END IF;
    IF p_priority IS NOT NULL AND p_priority NOT BETWEEN 0 AND 4294967295 THEN
        RAISE EXCEPTION 'priority must be an integer in 0..4294967295, got %', p_priority
            USING ERRCODE = 'PS204', HINT = 'Higher numbers are leased first; the default is 50.';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler._check_spec(p_spec jsonb, p_what text DEFAULT 'spec')
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_spec IS NULL OR jsonb_typeof(p_spec) <> 'object' THEN
        RAISE EXCEPTION '% must be a JSON object, got %', p_what, coalesce(p_spec::text, 'NULL')
            USING ERRCODE = 'PS206', HINT = 'spec is the application''s definition of the task, e.g. {"orderId": "233"}.';
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

-- _task_refused(rn, worker): raise why a worker's write to task rn matched no
-- row: PS200 unknown, PS203 cancelled, PS202 not running, PS201 not the owner.
CREATE OR REPLACE FUNCTION pyscheduler._task_refused(p_rn uuid, p_worker text)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_status pyscheduler.task_status;
    v_owner text;
BEGIN
    SELECT status, owner INTO v_status, v_owner FROM pyscheduler.tasks WHERE rn = p_rn;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown task %', p_rn
            USING ERRCODE = 'PS200', HINT = 'The task never existed or was cleaned up after its retention period.';
    ELSIF v_status = 'cancelled' THEN
        RAISE EXCEPTION 'task % was cancelled', p_rn
            USING ERRCODE = 'PS203', HINT = 'Stop working on it; the task stays cancelled.';
    ELSIF v_status <> 'running' THEN
        RAISE EXCEPTION 'task % is %, not running', p_rn, v_status
            USING ERRCODE = 'PS202', HINT = 'The lease expired or the task finished; lease a new task.';
    ELSE
        RAISE EXCEPTION 'task % is leased by %, not by %', p_rn, v_owner, p_worker
            USING ERRCODE = 'PS201', HINT = 'The lease expired and another worker took the task over.';
    END IF;
END
$$;

-- _lease_one(queue, worker, timeout, now): the single-task claim of lease_task
-- and complete_and_lease (aging off): the next ready task of queue becomes
-- running for worker, or NULL. Checks queue, worker and timeout (PS208) but
-- leaves synchronous_commit to its caller. One statement with LIMIT 1 and the
-- row fetched by primary key: its generic plan is the right one, so it is
-- planned once per session. Not SECURITY DEFINER: runs inside its callers.
CREATE OR REPLACE FUNCTION pyscheduler._lease_one(
    p_queue text, p_worker text, p_timeout interval, p_now timestamptz)
RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
    v_task jsonb;
BEGIN
    IF NOT (octet_length(p_queue) BETWEEN 1 AND 40 AND octet_length(p_worker) BETWEEN 1 AND 40
            AND p_timeout > interval '0') IS TRUE THEN
        PERFORM pyscheduler._check_task_args(p_queue => p_queue, p_queue_given => true,
                                             p_worker => p_worker, p_worker_given => true,
                                             p_timeout => coalesce(p_timeout, interval '0'));
    END IF;
    UPDATE pyscheduler.tasks t
       SET status = 'running', owner = p_worker, deadline = p_now + p_timeout, updated = p_now,
           history = t.history || pyscheduler._history('TaskAssignment', p_worker, p_now)
     WHERE t.rn = (SELECT r.rn FROM pyscheduler.tasks r
                    WHERE r.queue = p_queue AND r.status = 'ready'
                    ORDER BY r.priority DESC, r.created, r.rn
                    LIMIT 1
                      FOR UPDATE SKIP LOCKED)
    RETURNING pyscheduler._task_json(t) INTO v_task;
    RETURN v_task;
END
$$;

-- ---------------------------------------------------------------- client

CREATE OR REPLACE FUNCTION pyscheduler.submit_task(
    queue text, spec jsonb, priority bigint DEFAULT 50, now timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* submit_task(queue, spec, priority => 50, now => NULL) -> task jsonb
   Add a ready task to queue and wake that queue's idle workers (NOTIFY).
   queue:    1..40 bytes; tasks of a queue are leased by that queue's workers.
   spec:     a JSON object, opaque to pyscheduler.
   priority: 0..4294967295, higher is leased first.
   Errors: PS204 priority, PS206 spec, PS208 queue. */
#variable_conflict use_column
DECLARE
    v_now timestamptz := coalesce(submit_task.now, now());
    v_task jsonb;
BEGIN
    PERFORM _check_task_args(p_queue => submit_task.queue, p_queue_given => true,
                             p_priority => coalesce(submit_task.priority, -1));
    PERFORM _check_spec(submit_task.spec);
    INSERT INTO tasks AS t (rn, queue, spec, priority, status, progress, created, updated, errors, history)
    VALUES (gen_random_uuid(), submit_task.queue, submit_task.spec, submit_task.priority, 'ready', 0,
            v_now, v_now, '[]', '[]')
    RETURNING _task_json(t) INTO v_task;
    PERFORM _notify_throttled(_task_channel(submit_task.queue));
    RETURN v_task;
END
$$;
COMMENT ON FUNCTION pyscheduler.submit_task(text, jsonb, bigint, timestamptz) IS
    'Submit a ready task to a queue (priority 0..4294967295, higher first); returns the task as JSON.';

CREATE OR REPLACE FUNCTION pyscheduler.submit_tasks(
    queue text, specs jsonb, priority bigint DEFAULT 50, now timestamptz DEFAULT NULL)
RETURNS TABLE (task jsonb)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* submit_tasks(queue, specs, priority => 50, now => NULL) -> setof (task jsonb)
   The batch form of submit_task: specs is a JSON array of spec objects, all
   submitted to queue with one priority in one statement, one NOTIFY.
   Errors: PS204 priority, PS206 specs (not an array of objects), PS208 queue. */
#variable_conflict use_column
DECLARE
    v_now timestamptz := coalesce(submit_tasks.now, now());
    v_bad jsonb;
BEGIN
    PERFORM _check_task_args(p_queue => submit_tasks.queue, p_queue_given => true,
                             p_priority => coalesce(submit_tasks.priority, -1));
    IF specs IS NULL OR jsonb_typeof(specs) <> 'array' THEN
        RAISE EXCEPTION 'specs must be a JSON array of spec objects, got %', coalesce(specs::text, 'NULL')
            USING ERRCODE = 'PS206', HINT = 'e.g. ''[{"orderId": "1"}, {"orderId": "2"}]''';
    END IF;
    SELECT e INTO v_bad FROM jsonb_array_elements(specs) e WHERE jsonb_typeof(e) <> 'object' LIMIT 1;
    IF FOUND THEN
        PERFORM _check_spec(v_bad, 'every element of specs');
    END IF;
    RETURN QUERY
    INSERT INTO tasks AS t (rn, queue, spec, priority, status, progress, created, updated, errors, history)
    SELECT gen_random_uuid(), submit_tasks.queue, e, submit_tasks.priority, 'ready', 0, v_now, v_now, '[]', '[]'
      FROM jsonb_array_elements(specs) e
    RETURNING _task_json(t);
    PERFORM _notify_throttled(_task_channel(submit_tasks.queue));
END
$$;
COMMENT ON FUNCTION pyscheduler.submit_tasks(text, jsonb, bigint, timestamptz) IS
    'Submit a JSON array of specs as ready tasks of one queue and priority; returns the tasks as JSON.';

CREATE OR REPLACE FUNCTION pyscheduler.get_task(rn uuid)
RETURNS jsonb
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* get_task(rn) -> task jsonb
   The task in the seed's JSON shape. Errors: PS200 unknown task. */
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
   status: ready | running | completed | aborted | cancelled.
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
     ORDER BY t.created DESC, t.rn
     LIMIT max_tasks;
END
$$;
COMMENT ON FUNCTION pyscheduler.list_tasks(text, text, text, integer) IS
    'Tasks filtered by queue, status and owner (NULL = any), newest first, at most max_tasks.';

CREATE OR REPLACE FUNCTION pyscheduler.cancel_task(rn uuid, now timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* cancel_task(rn, now => NULL) -> task jsonb
   A ready or running task becomes cancelled (terminal). A running task keeps
   its owner, who is told at once (NOTIFY pyscheduler_cancel:<owner>) and in
   any case by PS203 on its next heartbeat or status write. Cancelling a
   cancelled task returns it unchanged.
   Errors: PS200 unknown task, PS209 already completed or aborted. */
#variable_conflict use_column
DECLARE
    v_now timestamptz := coalesce(cancel_task.now, now());
    v_task tasks;
BEGIN
    UPDATE tasks t SET status = 'cancelled', deadline = NULL, updated = v_now
     WHERE t.rn = cancel_task.rn AND t.status IN ('ready', 'running')
    RETURNING t.* INTO v_task;
    IF FOUND THEN
        IF v_task.owner IS NOT NULL THEN
            PERFORM _notify_throttled('pyscheduler_cancel:' || v_task.owner);
        END IF;
        RETURN _task_json(v_task);
    END IF;
    SELECT * INTO v_task FROM tasks t WHERE t.rn = cancel_task.rn;
    IF NOT FOUND THEN
        PERFORM _task_refused(cancel_task.rn, NULL);
    ELSIF v_task.status <> 'cancelled' THEN
        RAISE EXCEPTION 'task % is already %', cancel_task.rn, v_task.status
            USING ERRCODE = 'PS209', HINT = 'Only ready or running tasks can be cancelled.';
    END IF;
    RETURN _task_json(v_task);
END
$$;
COMMENT ON FUNCTION pyscheduler.cancel_task(uuid, timestamptz) IS
    'Cancel a ready or running task (terminal); the owner of a running task learns at once via NOTIFY.';

-- ---------------------------------------------------------------- worker

CREATE OR REPLACE FUNCTION pyscheduler.register_worker()
RETURNS text
LANGUAGE sql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
    /* register_worker() -> text
       A new unique worker id ('worker-27') from a database sequence. Ids do
       not survive the process: a restarted worker registers again. */
    SELECT 'worker-' || nextval('pyscheduler.worker_id_seq');
$$;
COMMENT ON FUNCTION pyscheduler.register_worker() IS
    'A new unique worker id (worker-<n>) from a database sequence; register once per process.';

CREATE OR REPLACE FUNCTION pyscheduler.lease_tasks(
    queue text, worker text, n integer DEFAULT 1, timeout interval DEFAULT '10 seconds',
    aging_rate double precision DEFAULT 0, aging_cap bigint DEFAULT 4294967295,
    now timestamptz DEFAULT NULL)
RETURNS TABLE (task jsonb)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
/* lease_tasks(queue, worker, n => 1, timeout => '10 seconds',
               aging_rate => 0, aging_cap => 4294967295, now => NULL) -> setof (task jsonb)
   Lease up to n ready tasks of queue: highest priority first, then oldest,
   skipping rows other workers are leasing (FOR UPDATE SKIP LOCKED). Each
   becomes running, owner = worker, deadline = now + timeout, history +=
   TaskAssignment. Returns nothing when no task is ready.
   Fairness (off by default): with aging_rate > 0 a ready task's effective
   priority is priority + aging_rate * seconds since it became ready, capped at
   greatest(priority, aging_cap); this path sorts every ready task of the queue.
   Commits asynchronously (synchronous_commit = off for the calling
   transaction): a lease lost in a database crash is a lease that expired.
   Errors: PS208 queue, worker, n < 1, timeout <= 0, aging_rate < 0. */
#variable_conflict use_column
DECLARE
    v_now timestamptz := coalesce(lease_tasks.now, now());
BEGIN
    PERFORM _check_task_args(p_queue => lease_tasks.queue, p_queue_given => true,
                             p_worker => lease_tasks.worker, p_worker_given => true,
                             p_timeout => coalesce(lease_tasks.timeout, interval '0'));
    IF n IS NULL OR n < 1 THEN
        RAISE EXCEPTION 'n must be at least 1, got %', coalesce(n::text, 'NULL') USING ERRCODE = 'PS208';
    END IF;
    IF aging_rate IS NULL OR NOT aging_rate >= 0 OR aging_cap IS NULL THEN
        RAISE EXCEPTION 'aging_rate must be >= 0 and aging_cap given, got % and %', aging_rate, aging_cap
            USING ERRCODE = 'PS208', HINT = 'aging_rate => 0 turns aging off.';
    END IF;
    -- A lease lost in a database crash equals a lease that expired: the task
    -- is ready again (at-least-once, as the seed requires), so the lease
    -- need not wait for its WAL flush (this transaction commits asynchronously).
    PERFORM set_config('synchronous_commit', 'off', true);
    -- The claim is one statement per path, written out twice on purpose: each
    -- keeps its own cached plan, and one statement measured ~1.5x faster for
    -- single-task leases than locking the rows first and updating them after.
    IF aging_rate = 0 THEN
        -- The normal claim: an index scan of tasks_ready_idx in claim order,
        -- then the rows by primary key. Written so that its generic plan is
        -- the right one whatever n is (see the function's SET plan_cache_mode):
        -- re-planning it on every call cost ~200 us, two thirds of a lease.
        RETURN QUERY
        WITH u AS (
            UPDATE tasks t
               SET status = 'running', owner = lease_tasks.worker, deadline = v_now + lease_tasks.timeout,
                   updated = v_now, history = t.history || _history('TaskAssignment', lease_tasks.worker, v_now)
             WHERE t.rn = ANY (ARRAY(
                   SELECT r.rn FROM tasks r
                    WHERE r.queue = lease_tasks.queue AND r.status = 'ready'
                    ORDER BY r.priority DESC, r.created, r.rn
                    LIMIT n
                      FOR UPDATE SKIP LOCKED))
            RETURNING t.*)
        SELECT _task_json(u::tasks) FROM u ORDER BY u.priority DESC, u.created, u.rn;
    ELSE
        RETURN QUERY
        WITH c AS (
            SELECT r.rn FROM tasks r
             WHERE r.queue = lease_tasks.queue AND r.status = 'ready'
             ORDER BY greatest(r.priority, least(
                          r.priority + aging_rate * greatest(0, extract(epoch FROM v_now - r.updated)),
                          aging_cap)) DESC,
                      r.created, r.rn
             LIMIT n
               FOR UPDATE SKIP LOCKED)
        UPDATE tasks t
           SET status = 'running', owner = lease_tasks.worker, deadline = v_now + lease_tasks.timeout,
               updated = v_now, history = t.history || _history('TaskAssignment', lease_tasks.worker, v_now)
          FROM c
         WHERE t.rn = c.rn
        RETURNING _task_json(t);
    END IF;
END
$$;
COMMENT ON FUNCTION pyscheduler.lease_tasks(text, text, integer, interval, double precision, bigint, timestamptz) IS
    'Lease up to n ready tasks of a queue (priority desc, oldest first, SKIP LOCKED) for timeout; optional aging.';

CREATE OR REPLACE FUNCTION pyscheduler.lease_task(
    queue text, worker text, timeout interval DEFAULT '10 seconds',
    aging_rate double precision DEFAULT 0, aging_cap bigint DEFAULT 4294967295,
    now timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* lease_task(queue, worker, timeout => '10 seconds', aging_rate => 0,
              aging_cap => 4294967295, now => NULL) -> task jsonb or NULL
   lease_tasks with n => 1: the task leased, or NULL when none is ready.
   Commits asynchronously, like lease_tasks. (PL/pgSQL with its own LIMIT 1
   claim, _lease_one, whose generic plan the plan cache keeps: a SQL body, or
   a call of lease_tasks, was re-planned or paid a nested call on every lease;
   no SET plan_cache_mode here: it measured ~10 % slower in short runs.) */
BEGIN
    IF aging_rate IS DISTINCT FROM 0 OR aging_cap IS NULL THEN  -- aging (or bad aging arguments): lease_tasks' path
        RETURN (SELECT l.task FROM lease_tasks(queue => $1, worker => $2, n => 1, timeout => $3,
                                               aging_rate => $4, aging_cap => $5, now => $6) l);
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);  -- as lease_tasks: a lost lease expired
    RETURN _lease_one($1, $2, $3, coalesce($6, now()));
END
$$;
COMMENT ON FUNCTION pyscheduler.lease_task(text, text, interval, double precision, bigint, timestamptz) IS
    'Lease the next ready task of a queue (NULL when none); see lease_tasks.';

CREATE OR REPLACE FUNCTION pyscheduler.heartbeat_task(
    rn uuid, worker text, progress double precision DEFAULT NULL,
    timeout interval DEFAULT '10 seconds', now timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* heartbeat_task(rn, worker, progress => NULL, timeout => '10 seconds', now => NULL)
       -> task jsonb
   Extend the lease: deadline = now + timeout, and set progress (0..1; NULL
   keeps it), in one statement guarded by owner = worker and status = running.
   Commits asynchronously, like lease_tasks: a heartbeat lost in a crash only
   makes the lease shorter.
   Errors: PS200 unknown, PS201 not the owner, PS202 not running,
   PS203 cancelled (stop working), PS205 progress, PS208 timeout. */
#variable_conflict use_column
DECLARE
    v_now timestamptz := coalesce(heartbeat_task.now, now());
    v_task jsonb;
BEGIN
    PERFORM _check_task_args(p_timeout => coalesce(heartbeat_task.timeout, interval '0'));
    PERFORM _check_progress(heartbeat_task.progress);
    PERFORM set_config('synchronous_commit', 'off', true);  -- a lost heartbeat is a shorter lease
    UPDATE tasks t
       SET deadline = v_now + heartbeat_task.timeout, updated = v_now,
           progress = coalesce(heartbeat_task.progress, t.progress)
     WHERE t.rn = heartbeat_task.rn AND t.owner = heartbeat_task.worker AND t.status = 'running'
    RETURNING _task_json(t) INTO v_task;
    IF v_task IS NULL THEN
        PERFORM _task_refused(heartbeat_task.rn, heartbeat_task.worker);
    END IF;
    RETURN v_task;
END
$$;
COMMENT ON FUNCTION pyscheduler.heartbeat_task(uuid, text, double precision, interval, timestamptz) IS
    'Extend a lease to now + timeout and report progress; PS203 tells the worker the task was cancelled.';

CREATE OR REPLACE FUNCTION pyscheduler.complete_task(rn uuid, worker text, now timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* complete_task(rn, worker, now => NULL) -> task jsonb
   The owner finishes a running task: completed, progress 1.0. A task
   cancelled meanwhile stays cancelled (PS203).
   Errors: PS200 unknown, PS201 not the owner, PS202 not running, PS203 cancelled. */
#variable_conflict use_column
DECLARE
    v_now timestamptz := coalesce(complete_task.now, now());
    v_task jsonb;
BEGIN
    UPDATE tasks t SET status = 'completed', progress = 1, deadline = NULL, updated = v_now
     WHERE t.rn = complete_task.rn AND t.owner = complete_task.worker AND t.status = 'running'
    RETURNING _task_json(t) INTO v_task;
    IF v_task IS NULL THEN
        PERFORM _task_refused(complete_task.rn, complete_task.worker);
    END IF;
    RETURN v_task;
END
$$;
COMMENT ON FUNCTION pyscheduler.complete_task(uuid, text, timestamptz) IS
    'The owner marks a running task completed (progress 1.0); PS203 if it was cancelled meanwhile.';

CREATE OR REPLACE FUNCTION pyscheduler.complete_tasks(rns uuid[], worker text, now timestamptz DEFAULT NULL)
RETURNS TABLE (rn uuid, sqlstate text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* complete_tasks(rns, worker, now => NULL) -> setof (rn uuid, sqlstate text)
   The batch form of complete_task, in one statement: completes every task of
   rns that worker holds and that is running. Returns one row per task it did
   NOT complete, with the SQLSTATE complete_task would have raised for it
   (PS200 unknown, PS201 not the owner, PS202 not running, PS203 cancelled);
   no rows means all were completed. */
#variable_conflict use_column
DECLARE
    v_now timestamptz := coalesce(complete_tasks.now, now());
    v_done uuid[];
BEGIN
    WITH done AS (
        UPDATE tasks t SET status = 'completed', progress = 1, deadline = NULL, updated = v_now
         WHERE t.rn = ANY (complete_tasks.rns) AND t.owner = complete_tasks.worker AND t.status = 'running'
        RETURNING t.rn)
    SELECT coalesce(array_agg(d.rn), '{}') INTO v_done FROM done d;
    IF cardinality(v_done) = cardinality(complete_tasks.rns) THEN
        RETURN;  -- the common case: all completed
    END IF;
    -- the rest were not touched by the update above: their current state says why
    RETURN QUERY
    SELECT r.rn, CASE WHEN t.rn IS NULL THEN 'PS200'
                      WHEN t.status = 'cancelled' THEN 'PS203'
                      WHEN t.status <> 'running' THEN 'PS202'
                      ELSE 'PS201' END
      FROM unnest(complete_tasks.rns) AS r(rn)
      LEFT JOIN tasks t ON t.rn = r.rn
     WHERE r.rn <> ALL (v_done);
END
$$;
COMMENT ON FUNCTION pyscheduler.complete_tasks(uuid[], text, timestamptz) IS
    'Complete many held tasks in one statement; returns (rn, sqlstate) for each task not completed.';

CREATE OR REPLACE FUNCTION pyscheduler.complete_and_lease(
    rn uuid, worker text, queue text, timeout interval DEFAULT '10 seconds',
    aging_rate double precision DEFAULT 0, aging_cap bigint DEFAULT 4294967295,
    now timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* complete_and_lease(rn, worker, queue, timeout => '10 seconds', aging_rate => 0,
                      aging_cap => 4294967295, now => NULL) -> task jsonb or NULL
   A single-task worker's loop in one transaction per task: complete_task(rn,
   worker), then lease_task(queue, worker, timeout, ...) — the next task
   leased, or NULL when none is ready. rn NULL leases only (the first call).
   Still one task per lease, each completed on its own with the seed's
   semantics (completed, progress 1.0, deadline NULL; the lease adds
   TaskAssignment). The transaction commits durably (the completion's)
   unless rn is NULL. If the completion is refused nothing is leased:
   Errors: PS200 unknown, PS201 not the owner, PS202 not running,
   PS203 cancelled (the task stays cancelled), and lease_task's PS208. */
#variable_conflict use_column
DECLARE
    v_now timestamptz := coalesce(complete_and_lease.now, now());
    v_sync text;
    v_task jsonb;
BEGIN
    IF complete_and_lease.rn IS NOT NULL THEN
        UPDATE tasks t SET status = 'completed', progress = 1, deadline = NULL, updated = v_now
         WHERE t.rn = complete_and_lease.rn AND t.owner = complete_and_lease.worker AND t.status = 'running';
        IF NOT FOUND THEN
            PERFORM _task_refused(complete_and_lease.rn, complete_and_lease.worker);
        END IF;
    ELSE
        PERFORM set_config('synchronous_commit', 'off', true);  -- a lease only, as lease_task
    END IF;
    IF aging_rate IS DISTINCT FROM 0 OR aging_cap IS NULL THEN  -- aging (or bad aging arguments): lease_tasks' path
        v_sync := current_setting('synchronous_commit');
        v_task := (SELECT l.task FROM lease_tasks(queue => complete_and_lease.queue,
                                                  worker => complete_and_lease.worker, n => 1,
                                                  timeout => complete_and_lease.timeout,
                                                  aging_rate => complete_and_lease.aging_rate,
                                                  aging_cap => complete_and_lease.aging_cap, now => v_now) l);
        PERFORM set_config('synchronous_commit', v_sync, true);  -- lease_tasks turned it off
        RETURN v_task;
    END IF;
    RETURN _lease_one(complete_and_lease.queue, complete_and_lease.worker, complete_and_lease.timeout, v_now);
END
$$;
COMMENT ON FUNCTION pyscheduler.complete_and_lease(uuid, text, text, interval, double precision, bigint, timestamptz) IS
    'Complete the held task (rn NULL: none) and lease the next ready task of a queue, in one transaction; NULL when none.';

CREATE OR REPLACE FUNCTION pyscheduler.abort_task(
    rn uuid, worker text, errors jsonb, now timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* abort_task(rn, worker, errors, now => NULL) -> task jsonb
   The owner gives up on a running task for good: aborted, errors recorded.
   errors: a non-empty JSON array of {"code": text, "args": object,
   "description": text} (args and description optional; stored as {} and "").
   Errors: PS200 unknown, PS201 not the owner, PS202 not running,
   PS203 cancelled (the task stays cancelled), PS207 errors. */
#variable_conflict use_column
DECLARE
    v_now timestamptz := coalesce(abort_task.now, now());
    v_errors jsonb;
    v_task jsonb;
BEGIN
    IF abort_task.errors IS NULL OR jsonb_typeof(abort_task.errors) <> 'array'
       OR jsonb_array_length(abort_task.errors) = 0
       OR EXISTS (SELECT 1 FROM jsonb_array_elements(abort_task.errors) e
                   WHERE jsonb_typeof(e) <> 'object'
                      OR jsonb_typeof(e -> 'code') IS DISTINCT FROM 'string'
                      OR (e ? 'args' AND jsonb_typeof(e -> 'args') <> 'object')
                      OR (e ? 'description' AND jsonb_typeof(e -> 'description') <> 'string')) THEN
        RAISE EXCEPTION 'errors must be a non-empty JSON array of {"code", "args", "description"}, got %',
                        coalesce(abort_task.errors::text, 'NULL')
            USING ERRCODE = 'PS207',
                  HINT = 'e.g. ''[{"code": "superseded", "args": {}, "description": "new task added"}]''';
    END IF;
    SELECT jsonb_agg(jsonb_build_object('code', e -> 'code', 'args', coalesce(e -> 'args', '{}'),
                                        'description', coalesce(e -> 'description', '""')))
      INTO v_errors FROM jsonb_array_elements(abort_task.errors) e;
    UPDATE tasks t SET status = 'aborted', errors = v_errors, deadline = NULL, updated = v_now
     WHERE t.rn = abort_task.rn AND t.owner = abort_task.worker AND t.status = 'running'
    RETURNING _task_json(t) INTO v_task;
    IF v_task IS NULL THEN
        PERFORM _task_refused(abort_task.rn, abort_task.worker);
    END IF;
    RETURN v_task;
END
$$;
COMMENT ON FUNCTION pyscheduler.abort_task(uuid, text, jsonb, timestamptz) IS
    'The owner aborts a running task with errors [{code, args, description}]; terminal, never retried.';

CREATE OR REPLACE FUNCTION pyscheduler.yield_task(rn uuid, worker text, now timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* yield_task(rn, worker, now => NULL) -> task jsonb
   The owner hands a running task back (e.g. on SIGTERM): deadline = now - 1 s,
   history += TaskYield with its progress. The monitor resets it to ready on
   its next pass (woken at once by NOTIFY pyscheduler_tasks_monitor), without
   a TaskTimeout entry.
   Errors: PS200 unknown, PS201 not the owner, PS202 not running, PS203 cancelled. */
#variable_conflict use_column
DECLARE
    v_now timestamptz := coalesce(yield_task.now, now());
    v_task jsonb;
BEGIN
    UPDATE tasks t
       SET deadline = v_now - interval '1 second', updated = v_now,
           history = t.history || _history('TaskYield', yield_task.worker, v_now, t.progress)
     WHERE t.rn = yield_task.rn AND t.owner = yield_task.worker AND t.status = 'running'
    RETURNING _task_json(t) INTO v_task;
    IF v_task IS NULL THEN
        PERFORM _task_refused(yield_task.rn, yield_task.worker);
    END IF;
    PERFORM _notify_throttled('pyscheduler_tasks_monitor');
    RETURN v_task;
END
$$;
COMMENT ON FUNCTION pyscheduler.yield_task(uuid, text, timestamptz) IS
    'The owner yields a running task (deadline = now - 1 s, TaskYield); the monitor makes it ready again.';

-- ---------------------------------------------------------------- monitor

CREATE OR REPLACE FUNCTION pyscheduler.reset_expired_tasks(
    max_tasks integer DEFAULT 1000, now timestamptz DEFAULT NULL)
RETURNS TABLE (task jsonb)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* reset_expired_tasks(max_tasks => 1000, now => NULL) -> setof (task jsonb)
   The failure detector: running tasks whose deadline < now become ready again
   (owner NULL, progress 0, deadline NULL); history += TaskTimeout (worker,
   progress at the timeout) unless the last entry is a TaskYield. At most
   max_tasks per call (call again while it returns max_tasks); wakes the
   workers of each queue touched. Returns the tasks reset.
   Errors: PS208 max_tasks < 1. */
#variable_conflict use_column
DECLARE
    v_now timestamptz := coalesce(reset_expired_tasks.now, now());
    v_queues text[] := '{}';
BEGIN
    IF max_tasks IS NULL OR max_tasks < 1 THEN
        RAISE EXCEPTION 'max_tasks must be at least 1, got %', coalesce(max_tasks::text, 'NULL')
            USING ERRCODE = 'PS208';
    END IF;
    FOR task IN
        WITH x AS (
            SELECT r.rn FROM tasks r
             WHERE r.status = 'running' AND r.deadline < v_now
             ORDER BY r.deadline
             LIMIT max_tasks
               FOR UPDATE SKIP LOCKED)
        UPDATE tasks t
           SET status = 'ready', owner = NULL, progress = 0, deadline = NULL, updated = v_now,
               history = CASE WHEN t.history -> -1 ->> '_typ' = 'TaskYield' THEN t.history
                              ELSE t.history || _history('TaskTimeout', t.owner, v_now, t.progress) END
          FROM x
         WHERE t.rn = x.rn
        RETURNING _task_json(t)
    LOOP
        IF NOT (task ->> 'queue') = ANY (v_queues) THEN
            v_queues := v_queues || (task ->> 'queue');
        END IF;
        RETURN NEXT;
    END LOOP;
    PERFORM _notify_throttled(_task_channel(q)) FROM unnest(v_queues) q;
END
$$;
COMMENT ON FUNCTION pyscheduler.reset_expired_tasks(integer, timestamptz) IS
    'Monitor: running tasks past their deadline become ready (TaskTimeout unless yielded); returns them.';

CREATE OR REPLACE FUNCTION pyscheduler.cleanup_tasks(
    retention interval DEFAULT '7 days', max_tasks integer DEFAULT 10000, now timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* cleanup_tasks(retention => '7 days', max_tasks => 10000, now => NULL) -> integer
   Monitor: delete up to max_tasks tasks that are completed, aborted or
   cancelled and were last updated before now - retention; returns how many.
   Call again while it returns max_tasks.
   Errors: PS208 retention < 0 or max_tasks < 1. */
#variable_conflict use_column
DECLARE
    v_now timestamptz := coalesce(cleanup_tasks.now, now());
    v_deleted integer;
BEGIN
    IF retention IS NULL OR retention < interval '0' OR max_tasks IS NULL OR max_tasks < 1 THEN
        RAISE EXCEPTION 'retention must be >= 0 and max_tasks >= 1, got % and %', retention, max_tasks
            USING ERRCODE = 'PS208';
    END IF;
    DELETE FROM tasks t
     WHERE t.rn IN (SELECT r.rn FROM tasks r
                     WHERE r.status IN ('completed', 'aborted', 'cancelled')
                       AND r.updated < v_now - retention
                     LIMIT max_tasks
                       FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    -- throttle rows of cancel channels of workers long gone
    DELETE FROM _notify_throttle
     WHERE channel LIKE 'pyscheduler\_cancel:%' AND last_at < v_now - interval '1 day';
    RETURN v_deleted;
END
$$;
COMMENT ON FUNCTION pyscheduler.cleanup_tasks(interval, integer, timestamptz) IS
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
     ORDER BY queue, created, rn;
COMMENT ON VIEW pyscheduler.oldest_ready_tasks IS 'The oldest ready task of each queue and how long it has waited.';

-- ---------------------------------------------------------------- grants

SELECT pyscheduler._grant('client', 'submit_task', 'submit_tasks', 'get_task', 'list_tasks', 'cancel_task',
                         'task_counts', 'expired_leases', 'oldest_ready_tasks');
SELECT pyscheduler._grant('worker', 'register_worker', 'lease_task', 'lease_tasks', 'heartbeat_task',
                         'complete_task', 'complete_tasks', 'complete_and_lease', 'abort_task', 'yield_task', 'get_task');
SELECT pyscheduler._grant('monitor', 'get_task', 'list_tasks', 'task_counts', 'expired_leases', 'oldest_ready_tasks');
SELECT pyscheduler._grant('admin', 'reset_expired_tasks', 'cleanup_tasks');
