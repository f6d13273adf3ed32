-- pyscheduler: leased tasks, the workers the dashboard lists (issue 30): worker_seen (a Worker's
-- report, about every 10 s, off the lease path) and the view workers.

CREATE OR REPLACE FUNCTION pyscheduler.worker_seen(worker pyscheduler.worker_id, queue pyscheduler.queue_name)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* worker_seen(worker, queue) -> void
   A worker (register_worker's id) that works queue says it is alive: the
   view workers lists it, and a queue with ready tasks and no worker seen
   for a while is flagged (the dashboard's overview). The Worker calls it
   about every 10 s from its lease loop, whether or not it leases anything.
   Workers not seen for a day are forgotten (deleted by a later report).
   Errors: PS208 worker or queue not a label. */
#variable_conflict use_column
BEGIN
    INSERT INTO _task_workers AS w (worker, queue, registered, seen_at)
    VALUES (worker_seen.worker, worker_seen.queue, now(), now())
    ON CONFLICT (worker, queue) DO UPDATE SET seen_at = excluded.seen_at;
    IF random() < 0.01 THEN
        DELETE FROM _task_workers w WHERE w.seen_at < now() - interval '1 day';
    END IF;
END
$$;
COMMENT ON FUNCTION pyscheduler.worker_seen(pyscheduler.worker_id, pyscheduler.queue_name) IS
    'A worker of a queue says it is alive (about every 10 s): the workers view lists it.';

CREATE OR REPLACE VIEW pyscheduler.workers AS
    WITH held AS (
        SELECT t.owner AS worker, t.queue, count(*) AS holds, min(t.leased_at) AS oldest_lease,
               max(t.updated) AS last_heartbeat
          FROM pyscheduler.tasks t
         WHERE t.status = 'running'
         GROUP BY t.owner, t.queue)
    SELECT coalesce(w.worker, h.worker) AS worker, coalesce(w.queue, h.queue) AS queue, w.registered, w.seen_at,
           coalesce(h.holds, 0) AS holds, now() - h.oldest_lease AS oldest_lease_age, h.last_heartbeat,
           greatest(w.seen_at, h.last_heartbeat) AS last_seen
      FROM pyscheduler._task_workers w
      FULL JOIN held h ON h.worker = w.worker AND h.queue = w.queue;
COMMENT ON VIEW pyscheduler.workers IS
    'Per worker and queue: when it last reported (worker_seen), the tasks it holds, its oldest lease''s '
    'age and its last lease or heartbeat; workers that do not report are listed while they hold tasks.';

SELECT pyscheduler._grant('worker', 'worker_seen');
SELECT pyscheduler._grant('client', 'workers');
SELECT pyscheduler._grant('monitor', 'workers');
