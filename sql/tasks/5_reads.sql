-- pyscheduler: leased tasks, what the views read (issue 21: a read path never scans the table).
-- The overview (states, SQLSTATEs, limits) is at the top of 1_model.sql; the files of
-- sql/tasks/ load in name order on every migrate.
--
-- Counts come from _task_tallies (1_model.sql, "Counts"): exact, kept by every statement that
-- submits, moves or deletes tasks, summed here from a few hundred rows however many tasks are
-- stored. Every other read is pinned to the indexes (enable_seqscan and enable_bitmapscan off),
-- whatever the statistics say; the views call these SECURITY DEFINER functions (granted as the
-- views).

-- ---------------------------------------------------------------- counts

-- _task_tallied(): the tasks per (queue, status), from the tallies (pairs with none left out).
CREATE OR REPLACE FUNCTION pyscheduler._task_tallied()
RETURNS TABLE (queue text, status pyscheduler.task_status, n bigint)
LANGUAGE sql STABLE
AS $$
    SELECT c.queue, c.status, sum(c.n)::bigint FROM pyscheduler._task_tallies c
     GROUP BY c.queue, c.status HAVING sum(c.n) <> 0;
$$;

-- _task_counts(): the rows of task_counts.
CREATE OR REPLACE FUNCTION pyscheduler._task_counts()
RETURNS TABLE (queue text, status pyscheduler.task_status, tasks bigint)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
    SELECT c.queue, c.status, c.n FROM pyscheduler._task_tallied() c ORDER BY c.queue, c.status;
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

-- _ready_page(queue, before_rn, n): list_tasks' page of a queue's ready tasks: newest first by
-- rn, at most n, older than before_rn (NULL: from the newest), without reading the queue's
-- whole backlog. tasks_ready_idx is in claim order (priority DESC, created, seq), not rn order,
-- but within one priority, read backwards, it is in (created, seq) order, and rn is (created's
-- millisecond, seq): per priority (a skip scan, _ready_heads), the first n entries backwards
-- and every other entry of the last one's millisecond (tasks of one millisecond from
-- concurrent transactions: an earlier created can have a later seq) hold that priority's part
-- of the page; the page is the newest n of them. Reads per priority at most n entries plus the
-- ready tasks of that priority submitted in one millisecond (a batch).
CREATE OR REPLACE FUNCTION pyscheduler._ready_page(p_queue text, p_before uuid, p_n integer)
RETURNS SETOF pyscheduler.tasks
LANGUAGE plpgsql STABLE
SET search_path = pyscheduler, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_indexscan = on
-- one plan for every priority (issue 34): a queue of 1,000 priorities with one ready task each
-- beside a million at one priority kept custom plans, planned once a priority (235 ms a page at
-- 10 million tasks); the generic plan reads the same index entries
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    -- the end of the cursor's millisecond: no entry at or after it is older than the cursor
    v_cut timestamptz := CASE WHEN p_before IS NULL THEN 'infinity'
                              ELSE 'epoch'::timestamptz + ((('x' || left(replace(p_before::text, '-', ''), 12))::bit(48)
                                                            )::bigint + 1) * interval '1 millisecond' END;
    v_priority bigint;
    v_rns uuid[] := '{}';
    v_got uuid[];
    v_edge timestamptz;
BEGIN
    FOR v_priority IN SELECT h.priority FROM pyscheduler._ready_heads(p_queue) h LOOP
        SELECT coalesce(array_agg(x.rn), '{}'), CASE WHEN count(*) = p_n THEN min(x.created) END
          INTO v_got, v_edge
          FROM (SELECT t.rn, t.created FROM pyscheduler.tasks t
                 WHERE t.status = 'ready' AND t.queue = p_queue AND t.priority = v_priority AND t.created < v_cut
                   AND (p_before IS NULL OR t.rn < p_before)
                 ORDER BY t.created DESC, t.seq DESC
                 LIMIT p_n) x;
        v_rns := v_rns || v_got;
        IF v_edge IS NOT NULL THEN
            v_rns := v_rns || ARRAY(
                SELECT t.rn FROM pyscheduler.tasks t
                 WHERE t.status = 'ready' AND t.queue = p_queue AND t.priority = v_priority
                   AND t.created >= date_trunc('milliseconds', v_edge)
                   AND t.created < date_trunc('milliseconds', v_edge) + interval '1 millisecond'
                   AND (p_before IS NULL OR t.rn < p_before));
        END IF;
    END LOOP;
    -- by primary key (a STABLE function: one snapshot, so they are the ready tasks read above)
    RETURN QUERY SELECT t.* FROM pyscheduler.tasks t WHERE t.rn = ANY (v_rns) ORDER BY t.rn DESC LIMIT p_n;
END
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

-- _queue_status(): the rows of queue_status: one per queue with live tasks (by the tallies),
-- paused or limited (every queue submitted to has a task_queues row, for its owner); per queue, the head of each priority in tasks_ready_idx (the oldest of that
-- priority) and the first entry of tasks_scheduled_idx.
CREATE OR REPLACE FUNCTION pyscheduler._queue_status()
RETURNS TABLE (queue text, ready bigint, delayed bigint, running bigint, paused boolean, note text,
               paused_by name, oldest_ready_age interval, next_due timestamptz, waiting bigint)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_indexscan = on
AS $$
    WITH live AS (
        SELECT c.queue,
               coalesce(sum(c.n) FILTER (WHERE c.status = 'ready'), 0)::bigint AS ready,
               coalesce(sum(c.n) FILTER (WHERE c.status = 'scheduled'), 0)::bigint AS delayed,
               coalesce(sum(c.n) FILTER (WHERE c.status = 'running'), 0)::bigint AS running,
               coalesce(sum(c.n) FILTER (WHERE c.status = 'waiting'), 0)::bigint AS waiting
          FROM pyscheduler._task_tallied() c
         WHERE c.status IN ('waiting', 'scheduled', 'ready', 'running')
         GROUP BY c.queue)
    SELECT q.queue, coalesce(l.ready, 0), coalesce(l.delayed, 0), coalesce(l.running, 0), coalesce(k.paused, false),
           k.note, k.paused_by,
           (SELECT now() - min(h.updated) FROM pyscheduler._ready_heads(q.queue) h),
           (SELECT t.run_at FROM pyscheduler.tasks t WHERE t.status = 'scheduled' AND t.queue = q.queue
             ORDER BY t.run_at LIMIT 1),
           coalesce(l.waiting, 0)
      FROM (SELECT l.queue FROM live l
             UNION SELECT k.queue FROM pyscheduler.task_queues k
                    WHERE k.paused OR k.running_per_key IS NOT NULL OR k.running_total IS NOT NULL
                       OR k.rate_starts IS NOT NULL) AS q
      LEFT JOIN live l ON l.queue = q.queue
      LEFT JOIN pyscheduler.task_queues k ON k.queue = q.queue
     ORDER BY q.queue;
$$;
