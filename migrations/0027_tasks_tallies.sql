-- depends: 0026_schedules_views_owners
-- task_counts and queue_status read maintained counts (issue 21): every statement that
-- submits, deletes or moves tasks between statuses appends its deltas here, in its own
-- transaction (sql/tasks/1_model.sql, "Counts"); the readers sum a few hundred rows however
-- many tasks are stored. They replace the counts capped at 1,000 and estimated above (the
-- statistics object tasks_queue_status_stats stays: the planner's estimate of a (queue, status)
-- pair chooses list_tasks' plans). The post-apply step counts the table once (_task_count_all, a
-- sequential scan under a SHARE lock: writers wait while it runs).
CREATE TABLE pyscheduler._task_tallies (
    queue  text                     NOT NULL,
    status pyscheduler.task_status  NOT NULL,
    n      bigint                   NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);
-- their columns change (estimated goes: every count is exact); sql/tasks/ creates them again
DROP VIEW IF EXISTS pyscheduler.task_counts;
DROP VIEW IF EXISTS pyscheduler.queue_status;
DROP FUNCTION IF EXISTS pyscheduler._task_counts();
DROP FUNCTION IF EXISTS pyscheduler._queue_status();
