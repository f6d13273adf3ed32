-- depends: 0017_tasks_queue_tables
-- Flow control for tasks (issue 20), part 1 of 2: the status 'waiting' (a
-- task submitted after other tasks, waiting for them to finish). Its own
-- migration: a value added to an enum cannot be used in the transaction that
-- adds it, and 0020 (indexes) and the functions use it.
ALTER TYPE pyscheduler.task_status ADD VALUE IF NOT EXISTS 'waiting' BEFORE 'scheduled';
