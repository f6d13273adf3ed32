-- pyscheduler: recent activity across capabilities, for dashboards (issue 17).
-- Reloaded on every migrate.
--
-- activity(): what ended recently, per capability, outcome and time bucket:
-- tasks finished (completed, aborted, cancelled), schedule executions
-- recorded (fired, failed, skipped_overlap, missed), checks ended (done,
-- error, ...) and delay messages fired (from _delay_fired_minutes: the queue
-- keeps nothing once a message is fired). Counts only: it shows no task,
-- schedule or check, so the monitor role may read it (convention C: monitor
-- sees aggregates).
--
-- Cost: each capability reads its own time index from now back to `since`
-- (tasks_terminal_updated_idx, the executions' BRIN on fired_at,
-- check_history_ended_idx, _delay_fired_minutes_idx), newest first, and stops after `max_rows` rows:
-- proportional to what ended in the window, bounded by max_rows, never to
-- what is stored. Where it stopped, `complete` is false (older buckets of
-- that capability are undercounted). Tasks and schedule executions binned by whole
-- minutes (any bucket of 1, 2, 5 ... minutes: the dashboard's 1 h range with its 5 minute
-- buckets too): the minutes _fold_task_minutes and _fold_schedule_minutes have folded are
-- read from _task_minutes, _task_latency_minutes, _schedule_minutes and
-- _schedule_latency_minutes (rows: minutes x outcomes or buckets, never the rows they
-- count; complete), only what ended since (and in the range's first partial minute) from
-- the index (_minutes_window); the latency percentiles are then read from the histogram
-- (within a factor 2^(1/4): _latency_mid). A row the rollup has counted stays counted when
-- it is deleted. The tasks of a queue that keeps no completed tasks (0053) are deleted as they
-- complete: the reads of rows above read _task_done instead (their latency then from the
-- histogram).

-- _minutes_window(): for a read from v_from binned by `bucket`, of a rollup folded up to
-- `folded` (_task_minutes_folded, _schedule_minutes_folded): the minutes the rollup answers,
-- [rfrom, upto); the rows read live are [v_from, rfrom) (the first partial minute) and
-- [upto, now). A bucket that is not whole minutes (a minute would straddle two buckets), or
-- nothing folded yet, reads only live: rfrom = upto = v_from.
CREATE OR REPLACE FUNCTION pyscheduler._minutes_window(v_from timestamptz, bucket interval, folded timestamptz,
                                                       OUT rfrom timestamptz, OUT upto timestamptz)
LANGUAGE plpgsql IMMUTABLE
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    rfrom := date_bin('1 minute', v_from - interval '1 microsecond', timestamptz 'epoch') + interval '1 minute';
    upto := folded;
    IF extract(epoch FROM bucket) % 60 <> 0 OR upto IS NULL OR upto <= rfrom THEN
        rfrom := v_from;
        upto := v_from;
    END IF;
END
$$;

-- _task_done(v_from, rfrom, upto, max_rows): the tasks deleted as they completed (queues that
-- keep no completed tasks, 0053) in the windows read live, [v_from, rfrom) and [upto, now):
-- (at, queue, k, n), n tasks of latency bucket k (_latency_k) completed at `at`, newest first,
-- at most max_rows rows. Read from _task_done_log (a row per completing call, queue and bucket)
-- and, once folded, from _task_done_minutes (by the minute: at = the minute's start, so a
-- range's first partial minute does not count them, and a bucket shorter than a minute counts
-- a folded minute in its first bucket).
CREATE OR REPLACE FUNCTION pyscheduler._task_done(v_from timestamptz, v_rfrom timestamptz, v_upto timestamptz,
                                                  max_rows integer)
RETURNS TABLE (at timestamptz, queue text, k smallint, n bigint)
LANGUAGE sql STABLE
AS $$
    SELECT * FROM (
        SELECT l.at, l.queue, l.k, l.n FROM pyscheduler._task_done_log l
         WHERE l.at >= v_upto OR (l.at >= v_from AND l.at < v_rfrom)
        UNION ALL
        SELECT m.minute, m.queue, m.k, m.n FROM pyscheduler._task_done_minutes m
         WHERE m.minute >= v_upto OR (m.minute >= v_from AND m.minute < v_rfrom)) d
     ORDER BY d.at DESC
     LIMIT max_rows;
$$;

-- _activity_windows(): the arguments activity(), activity_latency() and queue_activity() share,
-- checked once, and what they read: from v_from = now() - since, binned by `bucket`, the
-- minutes the tasks' rollup answers [rfrom, upto) and the schedules' [srfrom, supto)
-- (_minutes_window).
CREATE OR REPLACE FUNCTION pyscheduler._activity_windows(
    since interval, bucket interval, max_rows integer, OUT v_from timestamptz, OUT rfrom timestamptz,
    OUT upto timestamptz, OUT srfrom timestamptz, OUT supto timestamptz)
LANGUAGE plpgsql STABLE
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    IF since IS NULL OR since < interval '1 second' OR since > interval '7 days' THEN
        RAISE EXCEPTION 'since must be 1 second..7 days, got %', coalesce(since::text, 'NULL')
            USING ERRCODE = 'PS001';
    END IF;
    IF bucket IS NULL OR bucket < interval '1 second' OR bucket > since THEN
        RAISE EXCEPTION 'bucket must be 1 second..since, got %', coalesce(bucket::text, 'NULL')
            USING ERRCODE = 'PS001';
    END IF;
    IF max_rows IS NULL OR max_rows < 1 OR max_rows > 10000000 THEN
        RAISE EXCEPTION 'max_rows must be 1..10000000, got %', coalesce(max_rows::text, 'NULL')
            USING ERRCODE = 'PS001';
    END IF;
    v_from := now() - since;
    SELECT w.rfrom, w.upto INTO rfrom, upto
      FROM pyscheduler._minutes_window(v_from, bucket, (SELECT f.upto FROM _task_minutes_folded f)) w;
    SELECT w.rfrom, w.upto INTO srfrom, supto
      FROM pyscheduler._minutes_window(v_from, bucket, (SELECT f.upto FROM _schedule_minutes_folded f)) w;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.activity(
    since interval DEFAULT '1 hour', bucket interval DEFAULT '5 minutes', max_rows integer DEFAULT 100000)
RETURNS TABLE (capability text, outcome text, bucket_start timestamptz, n bigint, worst interval,
               complete boolean)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* activity(since => '1 hour', bucket => '5 minutes', max_rows => 100000)
       -> setof (capability, outcome, bucket_start, n, worst, complete)
   What ended in the last `since` per capability ('tasks', 'schedules',
   'checks', 'delay'), outcome and bucket (bucket_start aligned to the Unix
   epoch): n rows; worst = the largest lateness (schedules), last_took
   (checks) or fire lag (delay, by the minute), NULL for tasks. Each capability
   reads at most max_rows rows, newest first (the delay queue: rows of a
   minute); complete = false where it stopped there.
   Errors: PS001 since outside 1 second..7 days, bucket outside 1 second..since,
   max_rows outside 1..10000000. */
#variable_conflict use_column
DECLARE
    v_from timestamptz;
    v_rfrom timestamptz;
    v_upto timestamptz;
    v_srfrom timestamptz;
    v_supto timestamptz;
BEGIN
    SELECT * INTO v_from, v_rfrom, v_upto, v_srfrom, v_supto FROM pyscheduler._activity_windows(since, bucket, max_rows);
    RETURN QUERY
    WITH t AS (
        SELECT * FROM (
            (SELECT x.status::text AS outcome, x.updated AS at, NULL::interval AS took
               FROM pyscheduler.tasks x
              WHERE x.status IN ('completed', 'aborted', 'cancelled') AND x.updated >= v_upto
              ORDER BY x.updated DESC
              LIMIT max_rows)
            UNION ALL
            (SELECT x.status::text, x.updated, NULL::interval
               FROM pyscheduler.tasks x
              WHERE x.status IN ('completed', 'aborted', 'cancelled') AND x.updated >= v_from
                AND x.updated < v_rfrom
              ORDER BY x.updated DESC
              LIMIT max_rows)) l
         LIMIT max_rows),
    tl AS (  -- the tasks deleted as they completed (queues that keep none)
        SELECT 'completed'::text AS outcome, d.at, NULL::interval AS took, d.n
          FROM pyscheduler._task_done(v_from, v_rfrom, v_upto, max_rows) d),
    tm AS (
        SELECT m.status AS outcome, m.minute AS at, NULL::interval AS took, sum(m.n)::bigint AS n
          FROM pyscheduler._task_minutes m
         WHERE m.minute >= v_rfrom AND m.minute < v_upto
         GROUP BY 1, 2),
    s AS (
        SELECT e.outcome, e.fired_at AS at, e.lateness AS took
          FROM pyscheduler.schedule_executions e
         WHERE e.fired_at >= v_supto OR (e.fired_at >= v_from AND e.fired_at < v_srfrom)
         LIMIT max_rows),
    sm AS (
        SELECT m.outcome, m.minute AS at, m.worst AS took, m.n
          FROM pyscheduler._schedule_minutes m
         WHERE m.minute >= v_srfrom AND m.minute < v_supto),
    c AS (
        SELECT h.outcome, h.ended AS at, h.last_took AS took
          FROM pyscheduler.check_history h
         WHERE h.ended >= v_from
         ORDER BY h.ended DESC
         LIMIT max_rows),
    d AS (
        SELECT 'fired'::text AS outcome, f.minute AS at, f.n, make_interval(secs => f.lag_max_s) AS took
          FROM pyscheduler._delay_fired_minutes f
         WHERE f.minute >= date_trunc('minute', v_from)
         ORDER BY f.minute DESC
         LIMIT max_rows),
    every AS (
        SELECT 'tasks' AS capability, t.*, 1::bigint AS n, (SELECT count(*) FROM t) < max_rows AS complete FROM t
        UNION ALL
        SELECT 'tasks', tm.*, true FROM tm
        UNION ALL
        SELECT 'tasks', tl.*, (SELECT count(*) FROM tl) < max_rows FROM tl
        UNION ALL
        SELECT 'schedules', s.*, 1, (SELECT count(*) FROM s) < max_rows FROM s
        UNION ALL
        SELECT 'schedules', sm.*, true FROM sm
        UNION ALL
        SELECT 'checks', c.*, 1, (SELECT count(*) FROM c) < max_rows FROM c
        UNION ALL
        SELECT 'delay', d.outcome, d.at, d.took, d.n, (SELECT count(*) FROM d) < max_rows FROM d)
    SELECT a.capability, a.outcome, date_bin(activity.bucket, a.at, timestamptz 'epoch'), sum(a.n)::bigint,
           max(a.took), bool_and(a.complete)
      FROM every a
     GROUP BY 1, 2, 3
     ORDER BY 1, 2, 3;
END
$$;
COMMENT ON FUNCTION pyscheduler.activity(interval, interval, integer) IS
    'Dashboards: tasks finished, schedule executions and checks ended in the last `since`, per outcome and bucket (counts only).';

SELECT pyscheduler._grant('client', 'activity');
SELECT pyscheduler._grant('monitor', 'activity');

-- activity_latency(): how long work waited, per capability and time bucket, from
-- the same history and the same bounded reads as activity(): tasks (due to
-- started: the last lease minus run_at, else created, of tasks finished in
-- the bucket; a retried task's run_at is its retry's), schedules (lateness of
-- each execution recorded), checks (lag: ended minus the last check's slot) and
-- the delay queue (lag: fired minus deadline, from _delay_lag_minutes).
CREATE OR REPLACE FUNCTION pyscheduler.activity_latency(
    since interval DEFAULT '1 hour', bucket interval DEFAULT '5 minutes', max_rows integer DEFAULT 100000)
RETURNS TABLE (capability text, bucket_start timestamptz, n bigint, p50 interval, p95 interval,
               complete boolean)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* activity_latency(since => '1 hour', bucket => '5 minutes', max_rows => 100000)
       -> setof (capability, bucket_start, n, p50, p95, complete)
   Per capability ('tasks': due to started of tasks finished; 'schedules':
   lateness; 'checks': ended minus last check; 'delay': a message's fire lag,
   deleted by delete_fired minus its deadline) and bucket of when it ended:
   n rows with a latency, its median and 95th percentile. Reads as activity()
   does (at most max_rows per capability, newest first; complete = false
   where it stopped); tasks and schedules in whole-minute buckets from the minutes folded, the
   delay queue always from its minutes (the bucket of a minute holds all of it), their
   percentiles then from a histogram (within a factor 2^(1/4)).
   Errors: PS001 as activity(). */
#variable_conflict use_column
DECLARE
    v_from timestamptz;
    v_rfrom timestamptz;
    v_upto timestamptz;
    v_srfrom timestamptz;
    v_supto timestamptz;
BEGIN
    SELECT * INTO v_from, v_rfrom, v_upto, v_srfrom, v_supto FROM pyscheduler._activity_windows(since, bucket, max_rows);
    RETURN QUERY
    WITH t AS (
        SELECT * FROM (
            (SELECT x.updated AS at, greatest(x.leased_at - coalesce(x.run_at, x.created), interval '0') AS took
               FROM pyscheduler.tasks x
              WHERE x.status IN ('completed', 'aborted', 'cancelled') AND x.updated >= v_upto
              ORDER BY x.updated DESC
              LIMIT max_rows)
            UNION ALL
            (SELECT x.updated, greatest(x.leased_at - coalesce(x.run_at, x.created), interval '0')
               FROM pyscheduler.tasks x
              WHERE x.status IN ('completed', 'aborted', 'cancelled') AND x.updated >= v_from
                AND x.updated < v_rfrom
              ORDER BY x.updated DESC
              LIMIT max_rows)) l
         LIMIT max_rows),
    tl AS (  -- the tasks deleted as they completed: their latency's bucket only
        SELECT d.at, d.k, d.n FROM pyscheduler._task_done(v_from, v_rfrom, v_upto, max_rows) d),
    s AS (
        SELECT e.fired_at AS at, e.lateness AS took
          FROM pyscheduler.schedule_executions e
         WHERE e.fired_at >= v_supto OR (e.fired_at >= v_from AND e.fired_at < v_srfrom)
         LIMIT max_rows),
    c AS (
        SELECT h.ended AS at, greatest(h.ended - h.last_check_at, interval '0') AS took
          FROM pyscheduler.check_history h
         WHERE h.ended >= v_from
         ORDER BY h.ended DESC
         LIMIT max_rows),
    every AS (
        SELECT 'tasks' AS capability, t.*, (SELECT count(*) FROM t) < max_rows AS complete FROM t
        UNION ALL
        SELECT 'schedules', s.*, (SELECT count(*) FROM s) < max_rows FROM s
        UNION ALL
        SELECT 'checks', c.*, (SELECT count(*) FROM c) < max_rows FROM c),
    -- tasks and schedules over their rollup's minutes: a histogram of its buckets and of the live rows'
    rolled AS (
        SELECT * FROM (VALUES ('tasks', v_upto > v_from OR EXISTS (SELECT FROM tl)), ('schedules', v_supto > v_from),
                              ('delay', true))
                      r (capability, yes)
         WHERE r.yes),
    hist AS (
        SELECT h.capability, date_bin(activity_latency.bucket, h.at, timestamptz 'epoch') AS b, h.k,
               sum(h.n) AS n, bool_and(h.complete) AS complete
          FROM (SELECT 'tasks' AS capability, m.minute AS at, m.k, m.n, true AS complete
                  FROM pyscheduler._task_latency_minutes m
                 WHERE m.minute >= v_rfrom AND m.minute < v_upto
                UNION ALL
                SELECT 'schedules', m.minute, m.k, m.n, true
                  FROM pyscheduler._schedule_latency_minutes m
                 WHERE m.minute >= v_srfrom AND m.minute < v_supto
                UNION ALL
                SELECT 'delay', m.minute, m.k, m.n, true
                  FROM pyscheduler._delay_lag_minutes m
                 WHERE m.minute >= date_trunc('minute', v_from)
                UNION ALL
                SELECT 'tasks', tl.at, tl.k, tl.n, (SELECT count(*) FROM tl) < max_rows
                  FROM tl
                UNION ALL
                SELECT a.capability, a.at, pyscheduler._latency_k(a.took), 1, a.complete
                  FROM every a
                 WHERE a.capability IN (SELECT r.capability FROM rolled r) AND a.took IS NOT NULL) h
         GROUP BY 1, 2, 3),
    cum AS (
        SELECT h.capability, h.b, h.k, h.complete,
               sum(h.n) OVER (PARTITION BY h.capability, h.b ORDER BY h.k) AS below,
               sum(h.n) OVER (PARTITION BY h.capability, h.b) AS total
          FROM hist h)
    SELECT a.capability, date_bin(activity_latency.bucket, a.at, timestamptz 'epoch'), count(*),
           make_interval(secs => percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM a.took))),
           make_interval(secs => percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM a.took))),
           bool_and(a.complete)
      FROM every a
     WHERE a.took IS NOT NULL AND a.capability NOT IN (SELECT r.capability FROM rolled r)
     GROUP BY 1, 2
    UNION ALL
    SELECT c.capability, c.b, max(c.total)::bigint,
           pyscheduler._latency_mid(min(c.k) FILTER (WHERE c.below >= 0.5 * c.total)),
           pyscheduler._latency_mid(min(c.k) FILTER (WHERE c.below >= 0.95 * c.total)),
           bool_and(c.complete)
      FROM cum c
     GROUP BY 1, 2
     ORDER BY 1, 2;
END
$$;
COMMENT ON FUNCTION pyscheduler.activity_latency(interval, interval, integer) IS
    'Dashboards: per capability and bucket, how long work waited (tasks due to started, schedule lateness, check lag, '
    'delay fire lag): n, p50, p95.';

SELECT pyscheduler._grant('client', 'activity_latency');
SELECT pyscheduler._grant('monitor', 'activity_latency');

-- queue_activity(): the tasks finished in the window per queue and status, for the
-- tasks page's counts over a chosen range; read as activity() reads its tasks.
CREATE OR REPLACE FUNCTION pyscheduler.queue_activity(
    since interval DEFAULT '1 hour', max_rows integer DEFAULT 100000)
RETURNS TABLE (queue text, status text, n bigint, complete boolean)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* queue_activity(since => '1 hour', max_rows => 100000) -> setof (queue, status, n, complete)
   Tasks finished (completed, aborted, cancelled) in the last `since`, per
   queue and status: counts only (the monitor may read them). Reads
   tasks_terminal_updated_idx newest first, at most max_rows rows; complete =
   false where it stopped there. Over a day or more (not less: whole hours
   would over-count a short range): the hours folded
   (_task_queue_hours, from the start of the hour `since` falls in) and the
   index only since. Errors: PS001 as activity(). */
#variable_conflict use_column
DECLARE
    v_from timestamptz;
    v_rfrom timestamptz;
    v_upto timestamptz;
BEGIN
    SELECT w.v_from, w.rfrom, w.upto INTO v_from, v_rfrom, v_upto FROM pyscheduler._activity_windows(since, since, max_rows) w;
    IF since < interval '1 day' THEN  -- the hours folded from the one v_from is in would over-count
        v_rfrom := v_from;
        v_upto := v_from;
    ELSIF v_upto > v_from THEN  -- the hours folded from the one v_from is in: no first partial minute
        v_rfrom := v_from;
    END IF;
    RETURN QUERY
    WITH t AS (
        SELECT * FROM (
            (SELECT x.queue, x.status::text AS status
               FROM pyscheduler.tasks x
              WHERE x.status IN ('completed', 'aborted', 'cancelled') AND x.updated >= v_upto
              ORDER BY x.updated DESC
              LIMIT max_rows)
            UNION ALL
            (SELECT x.queue, x.status::text
               FROM pyscheduler.tasks x
              WHERE x.status IN ('completed', 'aborted', 'cancelled') AND x.updated >= v_from
                AND x.updated < v_rfrom
              ORDER BY x.updated DESC
              LIMIT max_rows)) l
         LIMIT max_rows),
    tl AS (  -- the tasks deleted as they completed (queues that keep none)
        SELECT d.queue, d.n FROM pyscheduler._task_done(v_from, v_rfrom, v_upto, max_rows) d)
    SELECT q.queue, q.status, sum(q.n)::bigint, bool_and(q.complete)
      FROM (SELECT t.queue, t.status, count(*) AS n, (SELECT count(*) FROM t) < max_rows AS complete
              FROM t
             GROUP BY 1, 2
            UNION ALL
            SELECT tl.queue, 'completed', sum(tl.n), (SELECT count(*) FROM tl) < max_rows
              FROM tl
             GROUP BY 1
            UNION ALL
            SELECT h.queue, h.status, sum(h.n), true
              FROM pyscheduler._task_queue_hours h
             WHERE v_upto > v_from  -- else the hour v_from is in would be counted whole
               AND h.hour >= date_bin('1 hour', v_from, timestamptz 'epoch') AND h.hour < v_upto
             GROUP BY 1, 2) q
     GROUP BY 1, 2
     ORDER BY 1, 2;
END
$$;
COMMENT ON FUNCTION pyscheduler.queue_activity(interval, integer) IS
    'Dashboards: tasks finished in the last `since` per queue and status (counts only).';

SELECT pyscheduler._grant('client', 'queue_activity');
SELECT pyscheduler._grant('monitor', 'queue_activity');
