-- depends: 0045_e2e
-- The delay queue's lag for the dashboard's latency lines (issue 30): per minute, a histogram
-- of the fired messages' lag (fired minus deadline, in _latency_k's buckets), appended by
-- delete_fired and folded by _delay_fold_counts as _delay_fired_minutes is; activity_latency()
-- reads its p50 and p95 from it for the capability 'delay'. Minutes fired before this
-- migration keep their average and largest lag only (_delay_fired_minutes).
CREATE TABLE pyscheduler._delay_lag_minutes (
    minute timestamptz NOT NULL,
    k      smallint    NOT NULL,
    n      bigint      NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 500);
CREATE INDEX _delay_lag_minutes_idx ON pyscheduler._delay_lag_minutes (minute);
