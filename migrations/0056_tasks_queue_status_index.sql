-- depends: 0055_tasks_state_rules_index
-- list_tasks' per-queue pages of waiting, scheduled and finished tasks come from one index,
-- (queue, status, rn), not three (tasks_waiting_idx, tasks_scheduled_rn_idx and
-- tasks_finished_queue_idx, issue 31): every INSERT or UPDATE statement on tasks opens each
-- index and prepares its predicate (~7,500 instructions an index; callgrind), whether or not its
-- rows go in. The status, fixed by each page's read, keeps the order (queue, rn). Building it
-- reads the table once, holding off writes to tasks meanwhile (1.7 s at a million tasks).
CREATE INDEX tasks_queue_status_rn_idx ON pyscheduler.tasks (queue, status, rn)
    WHERE status IN ('waiting', 'scheduled', 'completed', 'aborted', 'cancelled');
DROP INDEX pyscheduler.tasks_waiting_idx;
DROP INDEX pyscheduler.tasks_scheduled_rn_idx;
DROP INDEX pyscheduler.tasks_finished_queue_idx;
