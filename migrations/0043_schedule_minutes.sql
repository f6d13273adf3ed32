-- depends: 0042_activity_minutes
-- The dashboard's ranges from rollups (issue 30): per minute, the schedule executions recorded
-- per outcome (with the largest lateness) and a histogram of their lateness, folded by
-- _fold_schedule_minutes (called by purge_executions, the schedules cleanup daemon's
-- minutely job) from the executions' BRIN on fired_at, up to _schedule_minutes_folded.upto;
-- minutes older than 8 days are deleted by the fold. activity() and activity_latency() read
-- them (and _task_minutes) for any whole-minute bucket, through _minutes_window(), which
-- replaces _task_minutes_window().
DROP FUNCTION IF EXISTS pyscheduler._task_minutes_window(timestamptz, interval);
CREATE TABLE pyscheduler._schedule_minutes (
    minute  timestamptz NOT NULL,
    outcome text        NOT NULL,
    n       bigint      NOT NULL,
    worst   interval,
    PRIMARY KEY (minute, outcome)
);
CREATE TABLE pyscheduler._schedule_latency_minutes (
    minute timestamptz NOT NULL,
    k      smallint    NOT NULL,
    n      bigint      NOT NULL,
    PRIMARY KEY (minute, k)
);
CREATE TABLE pyscheduler._schedule_minutes_folded (
    one  boolean     PRIMARY KEY DEFAULT true CHECK (one),
    upto timestamptz
);
INSERT INTO pyscheduler._schedule_minutes_folded (upto) VALUES (NULL);
