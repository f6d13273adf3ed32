-- depends: 0015_schedules_daemons
-- Leased tasks as a job queue (issue 16), part 1 of 2: the status 'scheduled'
-- (a task waiting for its run_at: delayed at submit, or a failure waiting to
-- be retried). Its own migration: a value added to an enum cannot be used in
-- the transaction that adds it, and 0017 (indexes) and the functions use it.
ALTER TYPE pyscheduler.task_status ADD VALUE IF NOT EXISTS 'scheduled' BEFORE 'ready';
