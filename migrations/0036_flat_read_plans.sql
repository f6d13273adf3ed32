-- depends: 0035_schedule_task_options
-- Read plans the statistics cannot flip (issue 34).
-- list_tasks(queue, status => 'completed' | 'aborted' | 'cancelled'): a queue's finished tasks
-- per status, newest first. On (queue, rn) a page of one status stepped over the queue's tasks
-- of the other two (a queue whose tasks completed by the million, listed for its few aborted
-- ones, read them all); on (queue, status, rn) each status is a range of its own.
DROP INDEX pyscheduler.tasks_finished_queue_idx;
CREATE INDEX tasks_finished_queue_idx ON pyscheduler.tasks (queue, status, rn)
    WHERE status IN ('completed', 'aborted', 'cancelled');
-- list_schedules(critical => true): the critical ones by name, as the paused ones (the walk of
-- every name checking critical read all the names before the first critical one).
CREATE INDEX schedules_critical_name_idx ON pyscheduler.schedules (name) WHERE critical;
