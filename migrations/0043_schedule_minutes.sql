-- depends: 0042_activity_minutes
-- The dashboard's short ranges from the rollups too (issue 30): _task_minutes_window() now
-- takes the read's bucket (the rollup serves any whole-minute bucket), not its range.
DROP FUNCTION IF EXISTS pyscheduler._task_minutes_window(timestamptz, interval);
