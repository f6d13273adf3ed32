-- depends: 0020_tasks_flow
-- Cost stays flat as stored work grows (issue 21), part 2: leased tasks and the schedules'
-- views. Forward-only; the same end state as sql/schema/20_tasks.sql and 30_schedules.sql;
-- function code in sql/tasks/ (5_reads.sql, list_tasks in 2_client.sql) and
-- sql/schedules/5_views.sql.
--  * task_counts and queue_status count exactly up to 1,000 per queue and status, above
--    that they show an estimate from these statistics (the most common (queue, status)
--    pairs): no counter written per task transition, no index more on the hot path.
--  * list_tasks takes a keyset cursor (new signature) and pages by rn: the primary key, or
--    for the failed tasks (aborted, cancelled) tasks_failed_idx.
--  * schedules_due_soon and schedules_late read due_hour (due_at binned to the hour,
--    stored) through its index: a firing that keeps its schedule in the same hour changes
--    no indexed column and stays HOT (an index on due_at itself cost every firing its HOT
--    update: +24 % CPU on the Redis path). Adding the column rewrites the table.
--  * list_schedules(name_like => 'prefix%') reads the names with that prefix through
--    schedules_name_pattern_idx (text_pattern_ops: a LIKE prefix is a range of it in any
--    collation), instead of every name before them.
CREATE STATISTICS pyscheduler.tasks_queue_status_stats (mcv) ON queue, status FROM pyscheduler.tasks;
ALTER STATISTICS pyscheduler.tasks_queue_status_stats SET STATISTICS 250;

DROP FUNCTION IF EXISTS pyscheduler.list_tasks(text, text, text, integer);
-- list_tasks(status => 'aborted' | 'cancelled'), newest first: a task enters it when it fails
-- for good or is cancelled, never on the way submit -> lease -> complete.
CREATE INDEX tasks_failed_idx ON pyscheduler.tasks (status, rn) WHERE status IN ('aborted', 'cancelled');

ALTER TABLE pyscheduler.schedules
    ADD COLUMN due_hour timestamptz GENERATED ALWAYS AS (
        date_bin('1 hour', CASE WHEN paused THEN trigger_at ELSE least(next_run_at, trigger_at) END,
                 '2000-01-01 00:00:00+00')) STORED;
CREATE INDEX schedules_due_hour_idx ON pyscheduler.schedules (due_hour) WHERE due_hour IS NOT NULL;
-- list_schedules(name_like => 'prefix%'): the names with that prefix, in any collation (a name
-- never changes: a firing stays HOT).
CREATE INDEX schedules_name_pattern_idx ON pyscheduler.schedules (name text_pattern_ops);
