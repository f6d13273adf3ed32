-- depends: 0047_activity_windows
-- The spec index (find_tasks' spec fragments, issue 30) leaves running tasks out (issue 31, end
-- to end): a lease changes the status, an indexed column, so it is never HOT and wrote the task's
-- spec entries into this index a second time (submit, lease, completion: three times a task).
-- Running tasks are as many as the workers hold; find_tasks reads them through
-- tasks_running_deadline_idx. Capacity with a Worker under a producer: +11 % (docs/benchmarks.md).
-- Rebuilt in this migration's transaction: writes to tasks wait for the build (2.7 s at 1 million
-- tasks on the 2-core bench machine; about 30 s at 10 million).
DROP INDEX pyscheduler.tasks_spec_idx;
CREATE INDEX tasks_spec_idx ON pyscheduler.tasks USING gin (spec jsonb_path_ops)
    WITH (gin_pending_list_limit = 256) WHERE status <> 'running';
