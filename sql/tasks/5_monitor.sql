-- pyscheduler: leased tasks, the monitor's functions: reset expired leases, clean up finished tasks.
-- The overview (states, SQLSTATEs, limits) is at the top of 1_model.sql; the files of
-- sql/tasks/ load in name order on every migrate.

-- ---------------------------------------------------------------- monitor

CREATE OR REPLACE FUNCTION pyscheduler._reset_expired_tasks(max_tasks integer DEFAULT 1000, p_now timestamptz DEFAULT now())
RETURNS TABLE (task jsonb)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_queues text[] := '{}';
    v_task jsonb;
    v_moved text[] := '{}';
    v_to pyscheduler.task_status[] := '{}';
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
        v_moved := v_moved || (v_task ->> 'queue');
        v_to := v_to || (v_task ->> 'status')::pyscheduler.task_status;
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
    PERFORM pyscheduler._task_tally_many(v_moved, 'running', NULL, p_tos => v_to);
    PERFORM pyscheduler._notify_throttled(pyscheduler._task_channel(q)) FROM unnest(v_queues) q;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.reset_expired_tasks(max_tasks integer DEFAULT 1000)
RETURNS TABLE (task jsonb)
LANGUAGE plpgsql
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
BEGIN
    RETURN QUERY
        SELECT t.task FROM pyscheduler._reset_expired_tasks(max_tasks, now()) AS t;
END
$$;
COMMENT ON FUNCTION pyscheduler.reset_expired_tasks(integer) IS
    'Monitor: running tasks past their deadline become ready (TaskTimeout unless yielded) or, after their last attempt, aborted.';

-- The dashboard's long ranges (issue 30, migrations/0042_activity_minutes.sql): per minute, the
-- tasks finished per status (per queue and status: by the hour) and a histogram of their due-to-started latency, so a
-- range binned by whole minutes reads minutes, not tasks (activity.sql).
--
-- _latency_k(): a latency's histogram bucket: 0 below 1 ms, else k (1..63) for
-- [1 ms * 2^((k-1)/2), 1 ms * 2^(k/2)): log-spaced, a factor sqrt(2) wide. No SET clause, so
-- the planner inlines it (it names built-in functions only): delete_fired buckets each
-- message it deletes, and a call per row cost 2.5 us a message there (docs/benchmarks.md).
CREATE OR REPLACE FUNCTION pyscheduler._latency_k(took interval)
RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN extract(epoch FROM took) < 0.001 THEN 0
                ELSE least(63, 1 + floor(2 * ln(extract(epoch FROM took)::double precision / 0.001) / ln(2)))
           END::smallint;
$$;

-- _latency_mid(): the value a bucket stands for: its geometric middle (0 for bucket 0), so a
-- percentile read from the histogram is within a factor 2^(1/4) of any latency in its bucket.
CREATE OR REPLACE FUNCTION pyscheduler._latency_mid(k integer)
RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pyscheduler, pg_temp
AS $$
    SELECT CASE WHEN k = 0 THEN interval '0' ELSE make_interval(secs => 0.001 * 2 ^ ((k - 0.5) / 2)) END;
$$;

-- _fold_task_minutes(): add the tasks that finished since _task_minutes_folded.upto, up to the
-- minute before the last (a finishing transaction has a minute to commit), to _task_minutes,
-- _task_latency_minutes and _task_queue_hours; delete their rows older than 8 days. Reads tasks_terminal_updated_idx
-- from upto on only (the first fold: the last 8 days). Called by _cleanup_tasks (the tasks
-- monitor, every minute); a concurrent fold skips (returns 0). Returns the minutes folded. The
-- tasks deleted as they completed (queues that keep none, 0053) are read from _task_done_log,
-- whose rows it then moves to _task_done_minutes (by the minute, for activity's live reads).
CREATE OR REPLACE FUNCTION pyscheduler._fold_task_minutes(p_now timestamptz DEFAULT now())
RETURNS integer
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    v_from timestamptz;
    v_to timestamptz := date_bin('1 minute', p_now - interval '1 minute', timestamptz 'epoch');
BEGIN
    SELECT f.upto INTO v_from FROM pyscheduler._task_minutes_folded f FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    v_from := coalesce(v_from, date_bin('1 minute', p_now - interval '8 days', timestamptz 'epoch'));
    IF v_from >= v_to THEN
        RETURN 0;
    END IF;
    -- the tasks kept, and those deleted as they completed (_task_done_log, 0053), folded from it
    INSERT INTO pyscheduler._task_minutes (minute, status, n)
    SELECT date_bin('1 minute', f.at, timestamptz 'epoch'), f.status, sum(f.n)
      FROM (SELECT t.updated AS at, t.status::text AS status, 1 AS n
              FROM pyscheduler.tasks t
             WHERE t.status IN ('completed', 'aborted', 'cancelled') AND t.updated >= v_from AND t.updated < v_to
            UNION ALL
            SELECT l.at, 'completed', l.n FROM pyscheduler._task_done_log l WHERE l.at >= v_from AND l.at < v_to) f
     GROUP BY 1, 2;
    INSERT INTO pyscheduler._task_queue_hours AS h (hour, queue, status, n)
    SELECT date_bin('1 hour', f.at, timestamptz 'epoch'), f.queue, f.status, sum(f.n)
      FROM (SELECT t.updated AS at, t.queue, t.status::text AS status, 1 AS n
              FROM pyscheduler.tasks t
             WHERE t.status IN ('completed', 'aborted', 'cancelled') AND t.updated >= v_from AND t.updated < v_to
            UNION ALL
            SELECT l.at, l.queue, 'completed', l.n
              FROM pyscheduler._task_done_log l WHERE l.at >= v_from AND l.at < v_to) f
     GROUP BY 1, 2, 3
    ON CONFLICT (hour, queue, status) DO UPDATE SET n = h.n + EXCLUDED.n;  -- an hour is folded minute by minute
    INSERT INTO pyscheduler._task_latency_minutes (minute, k, n)
    SELECT date_bin('1 minute', f.at, timestamptz 'epoch'), f.k, sum(f.n)
      FROM (SELECT t.updated AS at, 1 AS n,
                   pyscheduler._latency_k(greatest(t.leased_at - coalesce(t.run_at, t.created), interval '0')) AS k
              FROM pyscheduler.tasks t
             WHERE t.status IN ('completed', 'aborted', 'cancelled') AND t.updated >= v_from AND t.updated < v_to
               AND t.leased_at IS NOT NULL
            UNION ALL
            SELECT l.at, l.n, l.k FROM pyscheduler._task_done_log l WHERE l.at >= v_from AND l.at < v_to) f
     GROUP BY 1, 2;
    WITH moved AS (DELETE FROM pyscheduler._task_done_log l WHERE l.at < v_to RETURNING l.*)
    INSERT INTO pyscheduler._task_done_minutes AS m (minute, queue, k, n)
    SELECT date_bin('1 minute', d.at, timestamptz 'epoch'), d.queue, d.k, sum(d.n) FROM moved d GROUP BY 1, 2, 3
    ON CONFLICT (minute, queue, k) DO UPDATE SET n = m.n + EXCLUDED.n;
    DELETE FROM pyscheduler._task_done_minutes m WHERE m.minute < p_now - interval '8 days';
    DELETE FROM pyscheduler._task_minutes m WHERE m.minute < p_now - interval '8 days';
    DELETE FROM pyscheduler._task_latency_minutes m WHERE m.minute < p_now - interval '8 days';
    DELETE FROM pyscheduler._task_queue_hours h WHERE h.hour < p_now - interval '8 days';
    UPDATE pyscheduler._task_minutes_folded SET upto = v_to;
    RETURN extract(epoch FROM v_to - v_from)::integer / 60;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler._cleanup_tasks(
    retention interval DEFAULT '7 days', max_tasks integer DEFAULT 10000, p_now timestamptz DEFAULT now())
RETURNS integer
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_deleted integer;
    v_gone text[];
    v_was pyscheduler.task_status[];
    v_rns uuid[];
BEGIN
    IF retention IS NULL OR retention < interval '0' OR max_tasks IS NULL OR max_tasks < 1 THEN
        RAISE EXCEPTION 'retention must be >= 0 and max_tasks >= 1, got % and %', retention, max_tasks
            USING ERRCODE = 'PS208';
    END IF;
    PERFORM pyscheduler._fold_task_minutes();  -- before the tasks it counts are deleted
    WITH gone AS (
        DELETE FROM pyscheduler.tasks t
         WHERE t.rn IN (SELECT r.rn FROM pyscheduler.tasks r
                         WHERE r.status IN ('completed', 'aborted', 'cancelled')
                           AND r.updated < p_now - retention
                         LIMIT max_tasks
                           FOR UPDATE SKIP LOCKED)
        RETURNING t.rn, t.queue, t.status)
    SELECT count(*), array_agg(g.queue), array_agg(g.status), array_agg(g.rn)
      INTO v_deleted, v_gone, v_was, v_rns FROM gone g;
    PERFORM pyscheduler._task_tally_many(v_gone, NULL, NULL, p_froms => v_was);
    IF v_deleted > 0 THEN  -- what the durable task functions recorded for them (7_durable.sql)
        DELETE FROM pyscheduler.task_checkpoints s WHERE s.rn = ANY (v_rns);
        DELETE FROM pyscheduler.task_waits w WHERE w.rn = ANY (v_rns);
    END IF;
    -- stored events past the same retention, at most max_tasks of them
    DELETE FROM pyscheduler.task_events e
     WHERE (e.name, e.emitted_by) IN (SELECT o.name, o.emitted_by FROM pyscheduler.task_events o
                                       WHERE o.emitted < p_now - retention LIMIT max_tasks);
    RETURN v_deleted;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.cleanup_tasks(
    retention interval DEFAULT '7 days', max_tasks integer DEFAULT 10000)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* cleanup_tasks(retention => '7 days', max_tasks => 10000) -> integer
   Monitor: delete up to max_tasks tasks that are completed, aborted or
   cancelled and were last updated before now - retention (with the steps they
   recorded), and up to max_tasks stored events (emit_event) emitted before
   now - retention; returns how many tasks it deleted. First it folds the
   tasks finished since into the dashboard's per-minute counts
   (_fold_task_minutes). Call again while it returns max_tasks.
   Errors: PS208 retention < 0 or max_tasks < 1. */
BEGIN
    RETURN pyscheduler._cleanup_tasks(retention, max_tasks, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.cleanup_tasks(interval, integer) IS
    'Monitor: delete terminal tasks not updated within retention; returns how many were deleted.';

-- merge_task_search_index(): the spec search index (tasks_spec_idx, GIN) takes a task's entries
-- into its pending list, and whoever merges the list into the index pays for all of it: the
-- write that fills the list (gin_pending_list_limit, 4 MB since 0051), autovacuum, or this
-- call, which the tasks monitor makes every reset_interval (issue 31: merged by the submits
-- themselves it was ~1.4 us of a bulk submit's ~11 us a task; the merge is moved, not removed).
-- A merge already under way makes a second one wait for it. SECURITY DEFINER: only the index's
-- owner may merge it.
CREATE OR REPLACE FUNCTION pyscheduler.merge_task_search_index()
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* merge_task_search_index() -> bigint
   Monitor: merge the spec search index's pending list (the entries of the
   tasks written since the last merge) into the index, so that no submit,
   lease or completion pays for it; returns the pending pages merged (0:
   none waited, or the index is turned off: `pyscheduler tasks spec-index`). */
BEGIN
    IF _spec_index_state() <> 'on' THEN
        RETURN 0;
    END IF;
    RETURN gin_clean_pending_list('pyscheduler.tasks_spec_idx'::regclass);
END
$$;
COMMENT ON FUNCTION pyscheduler.merge_task_search_index() IS
    'Monitor: merge the spec search index''s pending list into the index; returns the pages merged.';

-- fold_task_tallies(): the count tallies (_task_tallies, 1_model.sql "Counts") folded into one
-- row per (queue, status), which the tasks monitor does every merge_interval, so that a writing
-- call folds only one in _task_fold_chance() (issue 31).
CREATE OR REPLACE FUNCTION pyscheduler.fold_task_tallies()
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* fold_task_tallies() -> void
   Monitor: fold the tallies task_counts and queue_status sum (rows appended
   by every write to tasks) into one row per (queue, status), skipping the
   rows another fold is folding; what the views answer is unchanged. */
BEGIN
    PERFORM pyscheduler._task_fold_tallies();
END
$$;
COMMENT ON FUNCTION pyscheduler.fold_task_tallies() IS
    'Monitor: fold the task count tallies into one row per (queue, status); the counts are unchanged.';
