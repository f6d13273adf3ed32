-- depends: 0046_delay_lag_minutes
-- _activity_args (the checks activity(), activity_latency() and queue_activity() share) became
-- _activity_windows, which also answers the windows they read (sql/activity.sql): the old one goes.
DROP FUNCTION IF EXISTS pyscheduler._activity_args(interval, interval, integer);
