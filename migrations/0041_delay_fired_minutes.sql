-- depends: 0039_dashboard
-- The delay queue's history for the dashboard's charts (issue 30): how many messages were
-- fired per minute and how late, kept across restarts (a fired message is deleted, so the
-- queue itself keeps nothing). delete_fired appends one row per call (appends never wait for
-- each other), _delay_fold_counts folds a minute's rows into one now and then and deletes the
-- minutes older than 8 days; activity() reads it by minute.
CREATE TABLE pyscheduler._delay_fired_minutes (
    minute    timestamptz      NOT NULL,
    n         bigint           NOT NULL,
    lag_sum_s double precision NOT NULL,
    lag_max_s double precision NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 500);
CREATE INDEX _delay_fired_minutes_idx ON pyscheduler._delay_fired_minutes (minute);
