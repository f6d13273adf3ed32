-- pyscheduler: leased tasks, what the views read (issue 21: a read path never scans the table).
-- The overview (states, SQLSTATEs, limits) is at the top of 1_model.sql; the files of
-- sql/tasks/ load in name order on every migrate.
--
-- Counts. The Worker's lease and completion are the product's hot path: no counter row is
-- written per task transition and no index is added for the reads (an index on (status,
-- created, seq) measured +14 % backend CPU per task with bench/tasks_cost.py worker: every
-- transition is a non-HOT update, so it adds an entry to every index whose predicate the new
-- version matches). So a count is exact while it is small and estimated, and labelled so,
-- when it is large:
--  * a status whose partial index starts with the queue (waiting: tasks_waiting_idx,
--    scheduled: tasks_scheduled_idx, ready: tasks_ready_idx, aborted and cancelled:
--    tasks_requeue_idx) is counted per queue through that index, up to _task_count_cap()
--    entries (1,000): at most that many, exact; more, the estimate below (never less than
--    the cap + 1) with estimated = true;
--  * running (tasks_running_deadline_idx, _task_running) and completed (tasks_terminal_updated_idx)
--    are counted as a whole status: when it holds at most the cap, its tasks are read and
--    counted per queue, exact; otherwise each queue's figure is the estimate, estimated (a
--    completed task's entry in tasks_finished_queue_idx does not say its status);
--  * the estimate: the statistics object tasks_queue_status_stats (the most common
--    (queue, status) pairs of ANALYZE's sample, with their frequency) times the table's
--    reltuples, as of the last (auto)ANALYZE: a pair too rare to be in the sample is left
--    out of task_counts' estimated rows.
-- Every read is pinned to the indexes (enable_seqscan and enable_bitmapscan off), whatever
-- the statistics say; the views call these SECURITY DEFINER functions (granted as the views).

-- ---------------------------------------------------------------- counts

-- The exact counts stop here (per queue and status).
CREATE OR REPLACE FUNCTION pyscheduler._task_count_cap()
RETURNS bigint LANGUAGE sql IMMUTABLE SET search_path = pyscheduler, pg_temp
AS $$ SELECT 1000::bigint $$;

-- _task_estimates(): the planner's estimate of each (queue, status) pair in its statistics
-- (pg_stats_ext decodes the statistics: a few milliseconds, so each reader calls it once,
-- through _task_estimated()).
CREATE OR REPLACE FUNCTION pyscheduler._task_estimates()
RETURNS TABLE (queue text, status pyscheduler.task_status, n bigint)
LANGUAGE sql STABLE
SET search_path = pyscheduler, pg_temp
AS $$
    SELECT s.most_common_vals[i][1], s.most_common_vals[i][2]::pyscheduler.task_status,
           greatest(1, round(s.most_common_freqs[i] * c.reltuples))::bigint
      FROM pg_catalog.pg_stats_ext s
      JOIN pg_catalog.pg_class c ON c.oid = 'pyscheduler.tasks'::regclass AND c.reltuples > 0,
           generate_subscripts(s.most_common_vals, 1) i
     WHERE s.statistics_schemaname = 'pyscheduler' AND s.statistics_name = 'tasks_queue_status_stats'
       AND s.most_common_vals[i][1] IS NOT NULL;
$$;

-- _task_estimated(): _task_estimates() as {status: {queue: n}}.
CREATE OR REPLACE FUNCTION pyscheduler._task_estimated()
RETURNS jsonb
LANGUAGE sql STABLE
SET search_path = pyscheduler, pg_temp
AS $$
    SELECT coalesce(jsonb_object_agg(x.status, x.queues), '{}')
      FROM (SELECT e.status, jsonb_object_agg(e.queue, e.n) AS queues FROM pyscheduler._task_estimates() e
             GROUP BY e.status) x;
$$;

-- _task_status_queues(status): the queues with tasks of a status whose partial index starts
-- with the queue (waiting, scheduled, ready, aborted, cancelled), one index probe per queue (a
-- skip scan: the next queue after the last one).
CREATE OR REPLACE FUNCTION pyscheduler._task_status_queues(p_status pyscheduler.task_status)
RETURNS SETOF text
LANGUAGE plpgsql STABLE
SET search_path = pyscheduler, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_indexscan = on
AS $$
BEGIN
    -- the status is written into the query: a partial index is used for a constant only
    RETURN QUERY EXECUTE format(
        'WITH RECURSIVE r(q) AS ('
        '  SELECT min(t.queue) FROM pyscheduler.tasks t WHERE t.status = %1$L'
        '  UNION ALL'
        '  SELECT (SELECT min(t.queue) FROM pyscheduler.tasks t WHERE t.status = %1$L AND t.queue > r.q)'
        '    FROM r WHERE r.q IS NOT NULL)'
        ' SELECT r.q FROM r WHERE r.q IS NOT NULL', p_status);
END
$$;

-- _task_counted(queue, status, cap): the tasks of a queue in a status (one with a partial
-- index by queue), counted up to cap + 1.
CREATE OR REPLACE FUNCTION pyscheduler._task_counted(p_queue text, p_status pyscheduler.task_status, p_cap bigint)
RETURNS bigint
LANGUAGE plpgsql STABLE
SET search_path = pyscheduler, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_indexscan = on
AS $$
DECLARE
    v_n bigint;
BEGIN
    EXECUTE format('SELECT count(*) FROM (SELECT 1 FROM pyscheduler.tasks t WHERE t.status = %L AND t.queue = $1 '
                   'LIMIT $2) x', p_status)
       INTO v_n USING p_queue, p_cap + 1;
    RETURN v_n;
END
$$;

-- _task_running(cap, estimates): the running tasks per queue, {queue: n}, for task_counts and
-- queue_status: counted (tasks_running_deadline_idx) when there are at most cap in all, else the
-- estimates' (estimated = true).
CREATE OR REPLACE FUNCTION pyscheduler._task_running(p_cap bigint, p_est jsonb, OUT per_queue jsonb,
                                                     OUT estimated boolean)
LANGUAGE plpgsql STABLE
SET search_path = pyscheduler, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_indexscan = on
AS $$
BEGIN
    estimated := (SELECT count(*) FROM (SELECT 1 FROM pyscheduler.tasks t WHERE t.status = 'running'
                                         LIMIT p_cap + 1) x) > p_cap;
    IF estimated THEN
        per_queue := coalesce(p_est -> 'running', '{}');
    ELSE
        SELECT coalesce(jsonb_object_agg(x.queue, x.n), '{}') INTO per_queue
          FROM (SELECT t.queue, count(*) AS n FROM pyscheduler.tasks t WHERE t.status = 'running'
                 GROUP BY t.queue) x;
    END IF;
END
$$;

-- _task_counts(): the rows of task_counts (see Counts above).
CREATE OR REPLACE FUNCTION pyscheduler._task_counts()
RETURNS TABLE (queue text, status pyscheduler.task_status, tasks bigint, estimated boolean)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_indexscan = on
AS $$
#variable_conflict use_column
DECLARE
    v_cap bigint := pyscheduler._task_count_cap();
    v_status pyscheduler.task_status;
    v_queue text;
    v_n bigint;
    v_est jsonb;
BEGIN
    v_est := pyscheduler._task_estimated();
    FOREACH v_status IN ARRAY ARRAY['waiting', 'scheduled', 'ready', 'aborted', 'cancelled']::pyscheduler.task_status[]
    LOOP
        FOR v_queue IN SELECT q FROM pyscheduler._task_status_queues(v_status) q LOOP
            queue := v_queue;
            status := v_status;
            SELECT l.n, l.estimated INTO tasks, estimated FROM pyscheduler._task_live(v_queue, v_status, v_cap, v_est) l;
            RETURN NEXT;
        END LOOP;
    END LOOP;
    RETURN QUERY SELECT e.key, 'running'::pyscheduler.task_status, e.value::bigint, r.estimated
                   FROM pyscheduler._task_running(v_cap, v_est) r, jsonb_each_text(r.per_queue) e;
    -- completed: tasks_terminal_updated_idx
    SELECT count(*) INTO v_n
      FROM (SELECT 1 FROM pyscheduler.tasks t WHERE t.status IN ('completed', 'aborted', 'cancelled')
             LIMIT v_cap + 1) x;
    IF v_n <= v_cap THEN
        RETURN QUERY SELECT t.queue, t.status, count(*), false FROM pyscheduler.tasks t
                      WHERE t.status = 'completed'
                      GROUP BY t.queue, t.status;
    ELSE
        RETURN QUERY SELECT e.key, 'completed'::pyscheduler.task_status, e.value::bigint, true
                       FROM jsonb_each_text(coalesce(v_est -> 'completed', '{}')) e;
    END IF;
END
$$;

-- _task_live(queue, status, cap, estimates): one figure of queue_status: (count, estimated).
CREATE OR REPLACE FUNCTION pyscheduler._task_live(p_queue text, p_status pyscheduler.task_status, p_cap bigint,
                                                  p_est jsonb, OUT n bigint, OUT estimated boolean)
LANGUAGE plpgsql STABLE
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    n := pyscheduler._task_counted(p_queue, p_status, p_cap);
    estimated := n > p_cap;
    IF estimated THEN
        n := greatest(p_cap + 1, (p_est -> p_status::text ->> p_queue)::bigint);
    END IF;
END
$$;

-- _queue_status(): the rows of queue_status: one per queue with live tasks or a task_queues
-- row. Reads the heads of the live statuses' indexes, counts them up to the cap, and the
-- running tasks (leases in flight) up to the cap.
CREATE OR REPLACE FUNCTION pyscheduler._queue_status()
RETURNS TABLE (queue text, ready bigint, delayed bigint, running bigint, paused boolean, note text,
               paused_by name, oldest_ready_age interval, next_due timestamptz, waiting bigint,
               estimated boolean)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_indexscan = on
AS $$
#variable_conflict use_column
DECLARE
    v_cap bigint := pyscheduler._task_count_cap();
    v_est jsonb;
    v_running jsonb;
    v_running_est boolean;
    v_queue text;
    v_q pyscheduler.task_queues;
    r record;
BEGIN
    v_est := pyscheduler._task_estimated();
    SELECT r.per_queue, r.estimated INTO v_running, v_running_est FROM pyscheduler._task_running(v_cap, v_est) r;
    FOR v_queue IN
        SELECT q FROM pyscheduler._task_status_queues('ready') q
        UNION SELECT q FROM pyscheduler._task_status_queues('scheduled') q
        UNION SELECT q FROM pyscheduler._task_status_queues('waiting') q
        UNION SELECT jsonb_object_keys(v_running)
        UNION SELECT k.queue FROM pyscheduler.task_queues k
        ORDER BY 1
    LOOP
        queue := v_queue;
        SELECT * INTO r FROM pyscheduler._task_live(v_queue, 'ready', v_cap, v_est);
        ready := r.n;
        estimated := r.estimated;
        SELECT * INTO r FROM pyscheduler._task_live(v_queue, 'scheduled', v_cap, v_est);
        delayed := r.n;
        estimated := estimated OR r.estimated;
        SELECT * INTO r FROM pyscheduler._task_live(v_queue, 'waiting', v_cap, v_est);
        waiting := r.n;
        estimated := estimated OR r.estimated OR (v_running_est AND v_running ? v_queue);
        running := coalesce((v_running ->> v_queue)::bigint, 0);
        SELECT * INTO v_q FROM pyscheduler.task_queues k WHERE k.queue = v_queue;
        paused := coalesce(v_q.paused, false);
        note := v_q.note;
        paused_by := v_q.paused_by;
        -- the head of each priority in tasks_ready_idx (the oldest of that priority)
        SELECT now() - min(h.updated) INTO oldest_ready_age FROM pyscheduler._ready_heads(v_queue) h;
        SELECT t.run_at INTO next_due FROM pyscheduler.tasks t
         WHERE t.status = 'scheduled' AND t.queue = v_queue ORDER BY t.run_at LIMIT 1;
        IF NOT FOUND THEN
            next_due := NULL;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;

-- _ready_heads(queue): the first ready task of each priority of a queue in tasks_ready_idx
-- (the oldest of that priority: created, then seq), one index probe per priority (a skip
-- scan down the priorities).
CREATE OR REPLACE FUNCTION pyscheduler._ready_heads(p_queue text)
RETURNS TABLE (queue text, priority bigint, created timestamptz, seq bigint, rn uuid, updated timestamptz)
LANGUAGE sql STABLE
SET search_path = pyscheduler, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_indexscan = on
AS $$
    WITH RECURSIVE h (queue, priority, created, seq, rn, updated) AS (
        (SELECT t.queue, t.priority, t.created, t.seq, t.rn, t.updated FROM pyscheduler.tasks t
          WHERE t.status = 'ready' AND t.queue = p_queue
          ORDER BY t.priority DESC, t.created, t.seq LIMIT 1)
        UNION ALL
        SELECT n.queue, n.priority, n.created, n.seq, n.rn, n.updated FROM h, LATERAL (
            SELECT t.queue, t.priority, t.created, t.seq, t.rn, t.updated FROM pyscheduler.tasks t
             WHERE t.status = 'ready' AND t.queue = p_queue AND t.priority < h.priority
             ORDER BY t.priority DESC, t.created, t.seq LIMIT 1) n)
    SELECT h.queue, h.priority, h.created, h.seq, h.rn, h.updated FROM h;
$$;

-- _oldest_ready_tasks(): the rows of oldest_ready_tasks: per queue (a skip scan of
-- tasks_ready_idx), the oldest of its priorities' heads.
CREATE OR REPLACE FUNCTION pyscheduler._oldest_ready_tasks()
RETURNS TABLE (queue text, rn uuid, priority bigint, created timestamptz, age interval)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_indexscan = on
AS $$
    SELECT o.queue, o.rn, o.priority, o.created, now() - o.created
      FROM pyscheduler._task_status_queues('ready') q,
           LATERAL (SELECT h.queue, h.rn, h.priority, h.created FROM pyscheduler._ready_heads(q) h
                     ORDER BY h.created, h.seq LIMIT 1) o
     ORDER BY o.queue;
$$;
