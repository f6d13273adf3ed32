-- pyscheduler: leased tasks, queues: pause and resume, limits and rate limits.
-- The overview (states, SQLSTATEs, limits) is at the top of 1_model.sql; the files of
-- sql/tasks/ load in name order on every migrate.

-- ---------------------------------------------------------------- queues
--
-- A queue belongs to a role (task_queues.owner, migration 0030): the first to submit to it
-- (_claim_queue), or to pause or limit it; set_queue_owner (admin) hands it over. Its
-- settings (pause, limits, rate limits) are changed only by that role, a member of it, or
-- admin (_owned_queue), whoever set them last: the owner can always undo another's change.
-- Any role may submit to any queue (its tasks stay its own: docs/sql-api.md, "Ownership").

-- _claim_queue(queue, by, p_now): the queue's row, made and owned by role by when there is
-- none (or claimed by it when its row has no owner). One probe by primary key when the
-- queue is known: what a submit pays (a single submit makes that probe in its own read,
-- _submit_one, and calls this only for a new queue). A queue's row made by a transaction
-- still open (an application's first submit to a new queue, or a pause) is not waited for:
-- the claim is left to that transaction (lock_timeout 0 for the insert; an open transaction
-- must never hold up other submitters), and a later submit claims the queue if it rolled back.
CREATE OR REPLACE FUNCTION pyscheduler._claim_queue(p_queue text, p_by name, p_now timestamptz)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_timeout text;
BEGIN
    PERFORM 1 FROM pyscheduler.task_queues q WHERE q.queue = p_queue AND q.owner IS NOT NULL;
    IF NOT FOUND THEN
        v_timeout := pg_catalog.current_setting('lock_timeout');
        BEGIN
            PERFORM pg_catalog.set_config('lock_timeout', '1ms', true);
            INSERT INTO pyscheduler.task_queues AS q (queue, updated, owner) VALUES (p_queue, p_now, p_by)
            ON CONFLICT (queue) DO UPDATE SET owner = excluded.owner WHERE q.owner IS NULL;
            PERFORM pg_catalog.set_config('lock_timeout', v_timeout, true);
        EXCEPTION WHEN lock_not_available THEN
            NULL;  -- another transaction is making or changing the row (the setting is rolled back)
        END;
    END IF;
END
$$;

-- _owned_queue(queue, p_now): the queue's row, locked (FOR UPDATE), for a change of its
-- settings by the caller: made and owned by the caller when the queue is new; 42501 unless
-- the caller may act on the queue's owner (_may_act).
CREATE OR REPLACE FUNCTION pyscheduler._owned_queue(p_queue text, p_now timestamptz)
RETURNS pyscheduler.task_queues
LANGUAGE plpgsql
AS $$
DECLARE
    v_queue pyscheduler.task_queues;
BEGIN
    PERFORM pyscheduler._check_task_args(p_queue => p_queue, p_queue_given => true);
    PERFORM pyscheduler._claim_queue(p_queue, pyscheduler._caller(), p_now);
    SELECT * INTO v_queue FROM pyscheduler.task_queues q WHERE q.queue = p_queue FOR UPDATE;
    PERFORM pyscheduler._require_owner(v_queue.owner, format('queue %s', p_queue));
    RETURN v_queue;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler._queue_json(q pyscheduler.task_queues)
RETURNS jsonb
LANGUAGE sql STABLE
AS $$
    SELECT jsonb_build_object('queue', q.queue, 'paused', q.paused, 'note', q.note, 'paused_by', q.paused_by,
                              'updated', pyscheduler._ts(q.updated), 'owner', q.owner,
                              'keep_completed', q.keep_completed);
$$;

CREATE OR REPLACE FUNCTION pyscheduler._pause_queue(queue text, note text DEFAULT NULL, p_now timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_queue pyscheduler.task_queues;
BEGIN
    PERFORM pyscheduler._owned_queue(_pause_queue.queue, p_now);
    UPDATE pyscheduler.task_queues q
       SET paused = true, note = _pause_queue.note, paused_by = pyscheduler._caller(), updated = p_now
     WHERE q.queue = _pause_queue.queue
    RETURNING q.* INTO v_queue;
    RETURN pyscheduler._queue_json(v_queue);
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.pause_queue(
    queue pyscheduler.queue_name, note pyscheduler.queue_note DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* pause_queue(queue, note => NULL) -> {"queue", "paused", "note", "paused_by", "updated", "owner"}
   Pause a queue: from the next lease call on, its workers lease nothing
   (tasks already leased run to their end; submits go on). note says why
   (a label of at most 1000 bytes); paused_by records the calling role.
   Pausing again changes the note. Only the queue's owner (the role that
   first submitted to it, or set_queue_owner's), a member of it, or admin
   may pause it; a new queue becomes the caller's.
   Errors: PS208 queue or note, 42501 another role's queue. */
BEGIN
    RETURN pyscheduler._pause_queue(queue, note, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.pause_queue(pyscheduler.queue_name, pyscheduler.queue_note) IS
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
    SELECT * INTO v_queue FROM pyscheduler.task_queues q WHERE q.queue = _resume_queue.queue;
    IF NOT coalesce(v_queue.paused, false) THEN
        RETURN jsonb_build_object('queue', _resume_queue.queue, 'paused', false, 'note', NULL, 'paused_by', NULL,
                                  'updated', pyscheduler._ts(v_queue.updated), 'owner', v_queue.owner);
    END IF;
    PERFORM pyscheduler._owned_queue(_resume_queue.queue, p_now);
    UPDATE pyscheduler.task_queues q SET paused = false, note = NULL, paused_by = NULL, updated = p_now
     WHERE q.queue = _resume_queue.queue
    RETURNING q.* INTO v_queue;
    PERFORM pyscheduler._notify_throttled(pyscheduler._task_channel(_resume_queue.queue));
    RETURN pyscheduler._queue_json(v_queue);
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.resume_queue(queue pyscheduler.queue_name)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* resume_queue(queue) -> {"queue", "paused", "note", "paused_by", "updated", "owner"}
   Resume a paused queue and wake its workers (NOTIFY); a queue that is not
   paused is answered unchanged. Only the queue's owner, a member of it, or
   admin may resume it, whoever paused it.
   Errors: PS208 queue, 42501 another role's queue. */
BEGIN
    RETURN pyscheduler._resume_queue(queue, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.resume_queue(pyscheduler.queue_name) IS
    'Resume a paused queue (its owner, or admin) and wake its workers.';

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
                              'limits_by', q.limits_by, 'limits_updated', pyscheduler._ts(q.limits_updated),
                              'owner', q.owner);
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
    PERFORM pyscheduler._owned_queue(_set_queue_limits.queue, p_now);
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
    queue pyscheduler.queue_name, running_per_key integer DEFAULT NULL, running_total integer DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* set_queue_limits(queue, running_per_key => NULL, running_total => NULL)
       -> {"queue", "running_per_key", "running_total", "rate_starts",
           "rate_per", "rate_by_key", "limits_by", "limits_updated", "owner"}
   Concurrency limits of a queue, across every worker and node: at most
   running_per_key tasks of one concurrency_key running at once (tasks
   without a key: no per-key limit), at most running_total tasks of the
   queue. NULL: no limit (both NULL and no rate limit: the queue leases as
   if it had none). Running = leased and not finished, failed, yielded or
   reset by the monitor: such a task frees its slot. Tasks running now count
   from this call on. From the next lease on; replaces both limits.
   limits_by records the calling role. Only the queue's owner (the role that
   first submitted to it, or set_queue_owner's), a member of it, or admin
   may change its limits; a new queue becomes the caller's.
   Errors: PS208 queue, PS216 a limit outside 1..1000000, 42501 another
   role's queue. */
BEGIN
    RETURN pyscheduler._set_queue_limits(queue, running_per_key, running_total, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.set_queue_limits(pyscheduler.queue_name, integer, integer) IS
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
    PERFORM pyscheduler._owned_queue(_set_rate_limit.queue, p_now);
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
    queue pyscheduler.queue_name, starts integer, per interval DEFAULT '1 second', by_key boolean DEFAULT false)
RETURNS jsonb
LANGUAGE plpgsql
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
   limit. starts: 1..1000000; per: 1 ms .. 1 day (applied as seconds). Only
   the queue's owner, a member of it, or admin may set it, as
   set_queue_limits.
   Errors: PS208 queue, PS216 starts or per, 42501 another role's queue. */
BEGIN
    RETURN pyscheduler._set_rate_limit(queue, starts, per, by_key, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.set_rate_limit(pyscheduler.queue_name, integer, interval, boolean) IS
    'Limit how many leases of a queue begin per interval (a token bucket), for the queue or per concurrency key; NULL starts: none.';

CREATE OR REPLACE FUNCTION pyscheduler.set_queue_owner(queue pyscheduler.queue_name, owner pyscheduler.role_name)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* set_queue_owner(queue, owner) -> {"queue", "paused", "note", "paused_by", "updated", "owner"}
   Hand queue over to role owner: from now on only owner, a member of it, or
   admin changes the queue's settings (pause, limits, rate limits). A queue
   becomes the role's that first submits to it (or pauses or limits it); an
   admin settles a queue another role took first with this. Tasks keep
   their own roles. Admin only.
   Errors: PS208 queue, or owner not an existing role. */
#variable_conflict use_column
DECLARE
    v_queue task_queues;
BEGIN
    IF set_queue_owner.owner IS NULL
       OR NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = set_queue_owner.owner) THEN
        RAISE EXCEPTION 'owner must be an existing role, got %', coalesce(quote_literal(set_queue_owner.owner), 'NULL')
            USING ERRCODE = 'PS208', HINT = 'A role that submits to the queue, e.g. the application''s login group.';
    END IF;
    INSERT INTO task_queues AS q (queue, updated, owner) VALUES (set_queue_owner.queue, now(), set_queue_owner.owner)
    ON CONFLICT (queue) DO UPDATE SET owner = excluded.owner, updated = excluded.updated
    RETURNING q.* INTO v_queue;
    RETURN _queue_json(v_queue);
END
$$;
COMMENT ON FUNCTION pyscheduler.set_queue_owner(pyscheduler.queue_name, pyscheduler.role_name) IS
    'Admin: hand a queue over to a role, which (with its members and admin) alone changes its pause, limits and rate limits.';

-- set_queue_keep_completed(queue, keep): whether a completion keeps the task (completed, read
-- by get_task, list_tasks, find_tasks until cleanup_tasks deletes it) or deletes it (issue 31:
-- a completion that deletes writes no index entry; capacity +19 %, docs/benchmarks.md).
CREATE OR REPLACE FUNCTION pyscheduler._set_queue_keep_completed(queue text, keep boolean, p_now timestamptz)
RETURNS jsonb
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_queue pyscheduler.task_queues;
BEGIN
    IF keep IS NULL THEN
        RAISE EXCEPTION 'keep must be true or false' USING ERRCODE = 'PS208';
    END IF;
    PERFORM pyscheduler._owned_queue(_set_queue_keep_completed.queue, p_now);
    UPDATE pyscheduler.task_queues q SET keep_completed = keep, updated = p_now
     WHERE q.queue = _set_queue_keep_completed.queue
    RETURNING q.* INTO v_queue;
    RETURN pyscheduler._queue_json(v_queue);
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.set_queue_keep_completed(queue pyscheduler.queue_name, keep boolean)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* set_queue_keep_completed(queue, keep) -> {"queue", "paused", ..., "owner", "keep_completed"}
   keep true (every queue's default): a completed task is kept, completed,
   until cleanup_tasks deletes it. keep false: from the next completion on,
   a task that completes is deleted with what it recorded (its result, steps
   and waits), unless someone watches it (watch_task) or it has children
   (dependencies): those are kept. get_task, list_tasks and find_tasks then
   know nothing of it, and task_counts counts no completed task of the
   queue; activity(), activity_latency() and queue_activity() still count it.
   Aborted and cancelled tasks are always kept. The completion then writes no
   index entry (capacity +19 %, docs/benchmarks.md). Only the queue's owner,
   a member of it, or admin may set it; a new queue becomes the caller's.
   Errors: PS208 queue or keep NULL, 42501 another role's queue. */
BEGIN
    RETURN pyscheduler._set_queue_keep_completed(queue, keep, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.set_queue_keep_completed(pyscheduler.queue_name, boolean) IS
    'Whether a queue keeps its completed tasks (the default) or a completion deletes the task.';

CREATE OR REPLACE VIEW pyscheduler.queue_limits AS
    SELECT q.queue, q.running_per_key, q.running_total, q.rate_starts, q.rate_per, q.rate_by_key,
           (SELECT count(*) FROM pyscheduler.tasks r
             WHERE r.queue = q.queue AND r.status = 'running' AND r.limited AND r.lease_token IS NOT NULL) AS running,
           q.limits_by, q.limits_updated, q.owner
      FROM pyscheduler.task_queues q
     WHERE q.running_per_key IS NOT NULL OR q.running_total IS NOT NULL OR q.rate_starts IS NOT NULL;
COMMENT ON VIEW pyscheduler.queue_limits IS
    'Per queue with limits: running_per_key, running_total, the rate limit (rate_starts per rate_per, by key or not), the tasks running under them, who set them, whose queue it is.';

CREATE OR REPLACE FUNCTION pyscheduler.next_task_due(queue pyscheduler.queue_name)
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
COMMENT ON FUNCTION pyscheduler.next_task_due(pyscheduler.queue_name) IS
    'Time until the queue''s earliest scheduled task is due, or its rate limit allows the next start (0: now; NULL: nothing waits, or paused).';
