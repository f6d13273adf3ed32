-- pyscheduler: leased tasks, the views for psql, and the grants of every role.
-- The overview (states, SQLSTATEs, limits) is at the top of 1_model.sql; the files of
-- sql/tasks/ load in name order on every migrate.

-- ---------------------------------------------------------------- views (psql)

-- Each view reads through a function of 5_reads.sql (plans pinned to the indexes): none
-- counts or scans the table (issue 21); the counts are the tallies every write keeps (see
-- Counts in 1_model.sql).
CREATE OR REPLACE VIEW pyscheduler.task_counts AS
    SELECT c.queue, c.status, c.tasks FROM pyscheduler._task_counts() c;
COMMENT ON VIEW pyscheduler.task_counts IS
    'Number of tasks per queue and status (exact: kept by every submit, lease, finish and cleanup).';

CREATE OR REPLACE VIEW pyscheduler.expired_leases AS
    SELECT rn, queue, owner, deadline, now() - deadline AS overdue, progress
      FROM pyscheduler.tasks
     WHERE status = 'running' AND deadline < now();
COMMENT ON VIEW pyscheduler.expired_leases IS
    'Running tasks past their deadline: the monitor will reset them (or is not running).';

CREATE OR REPLACE VIEW pyscheduler.oldest_ready_tasks AS
    SELECT o.queue, o.rn, o.priority, o.created, o.age FROM pyscheduler._oldest_ready_tasks() o;
COMMENT ON VIEW pyscheduler.oldest_ready_tasks IS
    'The oldest ready task of each queue and how long it has waited (one index probe per queue and priority).';

-- queue_status: one row per queue with live tasks, paused or limited; its counts as
-- task_counts'. oldest_ready_age: the longest wait among the first ready task of each priority.
CREATE OR REPLACE VIEW pyscheduler.queue_status AS
    SELECT s.queue, s.ready, s.delayed, s.running, s.paused, s.note, s.paused_by, s.oldest_ready_age, s.next_due,
           s.waiting
      FROM pyscheduler._queue_status() s;
COMMENT ON VIEW pyscheduler.queue_status IS
    'Per queue: tasks ready, delayed (scheduled), running and waiting (for parents), whether it is paused, '
    'the oldest ready task''s wait, the next due time.';

-- ---------------------------------------------------------------- grants

SELECT pyscheduler._grant('client', 'submit_task', 'submit_task_lean', 'submit_tasks', 'submit_tasks_lean',
                         'submit_workflow', 'get_task', 'list_tasks', 'cancel_task', 'retry_task', 'retry_tasks', 'pause_queue', 'resume_queue', 'next_task_due',
                         'watch_task', 'set_queue_limits', 'set_rate_limit', 'set_queue_keep_completed',
                         'task_counts', 'expired_leases', 'oldest_ready_tasks', 'queue_status', 'queue_limits');
SELECT pyscheduler._grant('worker', 'register_worker', 'lease_task', 'lease_tasks', 'lease_tasks_lean',
                         'heartbeat_task', 'heartbeat_tasks', 'complete_task', 'complete_tasks', 'complete_and_lease',
                         'fail_task', 'fail_tasks', 'abort_task', 'yield_task', 'yield_tasks', 'get_task',
                         'next_task_due', 'holds_lease', 'parent_results');
SELECT pyscheduler._grant('monitor', 'get_task', 'list_tasks', 'next_task_due', 'task_counts', 'expired_leases',
                         'oldest_ready_tasks', 'queue_status', 'queue_limits');
SELECT pyscheduler._grant('admin', 'reset_expired_tasks', 'cleanup_tasks', 'merge_task_search_index',
                         'fold_task_tallies', 'set_queue_owner');
-- the views call them for their readers
SELECT pyscheduler._grant(audience, '_task_counts', '_queue_status', '_oldest_ready_tasks')
  FROM unnest(ARRAY['client', 'monitor']) AS audience;
