-- depends: 0035_schedule_task_options
-- list_tasks(queue, status => 'completed' | 'aborted' | 'cancelled') (issue 34): a queue's
-- finished tasks per status, newest first. On (queue, rn) a page of one status stepped over the
-- queue's tasks of the other two (a queue whose tasks completed by the million, listed for its
-- few aborted ones, read them all); on (queue, status, rn) each status is a range of its own.
DROP INDEX pyscheduler.tasks_finished_queue_idx;
CREATE INDEX tasks_finished_queue_idx ON pyscheduler.tasks (queue, status, rn)
    WHERE status IN ('completed', 'aborted', 'cancelled');
