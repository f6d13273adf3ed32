-- pyscheduler: leased tasks, the views for psql, and the grants of every role.
-- The overview (states, SQLSTATEs, limits) is at the top of 1_model.sql; the files of
-- sql/tasks/ load in name order on every migrate.

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
