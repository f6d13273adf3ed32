-- depends: 0048_spec_index_live
-- A unique task's key was written into two B-trees at submit (issue 31: the unique-key variant of
-- bulk submit took 1.41-1.48x the plain one's time, target 1.3x): tasks_unique_idx, the arbiter
-- of submit's ON CONFLICT, and tasks_unique_key_idx, find_tasks' key search (0039), which was
-- written again by every lease and completion (neither is HOT). The arbiter now leads with the
-- key, so it serves the search of live tasks too (across queues and roles), and the search's own
-- index keeps finished tasks only: a key goes into one B-tree at submit, and into the second
-- once, when its task finishes. ON CONFLICT names the columns, not their order: unchanged.
-- status >= 'completed': the finished ones, in task_status' order; written so, not as an IN list,
-- so that no other index of finished tasks (tasks_finished_queue_idx) matches find_tasks' read.
-- Rebuilt in this migration's transaction: writes to tasks wait for the builds (1.0 s at 1 million
-- tasks with a key each on the 2-core bench machine).
DROP INDEX pyscheduler.tasks_unique_idx;
CREATE UNIQUE INDEX tasks_unique_idx ON pyscheduler.tasks (unique_key, queue, submitted_by)
    WHERE unique_key IS NOT NULL AND status IN ('waiting', 'scheduled', 'ready', 'running');
DROP INDEX pyscheduler.tasks_unique_key_idx;
CREATE INDEX tasks_unique_key_idx ON pyscheduler.tasks (unique_key)
    WHERE unique_key IS NOT NULL AND status >= 'completed';
