-- depends: 0017_tasks_queue_tables
-- Cost stays flat as stored work grows (issue 21), for the delay queue, recurring
-- schedules and future checks: the indexes the read paths page on, the tables their
-- counts come from, and vacuum settings. Forward-only; the same end state as
-- sql/schema/10_delay.sql, 30_schedules.sql and 40_checks.sql. The counters are
-- filled from the rows there are by the function files (sql/delay.sql,
-- sql/checks.sql), in the same transaction that loads the functions that keep them
-- (a running relay or runner never writes between the count and the new code).

-- ---------------------------------------------------------------- delay queue

-- delay_queue's counts: the rows sum to the number of stored messages (waiting + ready);
-- each statement that stores or deletes messages appends its delta (appends never wait
-- for each other), and the deltas are folded into one row now and then.
CREATE TABLE pyscheduler._delay_counts (
    n bigint NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 500);

-- ---------------------------------------------------------------- schedules

-- list_schedules(paused => true) and schedules_paused page by name through the paused ones
-- only; a firing never changes paused, so its UPDATE stays HOT.
CREATE INDEX schedules_paused_name_idx ON pyscheduler.schedules (name) WHERE paused;
-- schedules_failing, in its order; a healthy firing leaves consecutive_failures at 0 (HOT).
CREATE INDEX schedules_failing_idx ON pyscheduler.schedules (consecutive_failures DESC, name)
    WHERE consecutive_failures > 0;
-- schedule_runs(with_outcome => failed | skipped_overlap | missed): a schedule's
-- executions other than 'fired', newest first (a firing adds no entry here).
CREATE INDEX schedule_executions_unfired_idx ON pyscheduler.schedule_executions (schedule_id, expected_at)
    WHERE outcome <> 'fired';

-- list_schedules and schedule_runs take a keyset cursor (new signatures)
DROP FUNCTION IF EXISTS pyscheduler.list_schedules(text, text, boolean, boolean, integer);
DROP FUNCTION IF EXISTS pyscheduler.schedule_runs(text, text, timestamptz, integer);
-- the degraded claim takes the index shards to claim for (issue 18: claim_due_critical_shards)
DROP FUNCTION IF EXISTS pyscheduler._claim_due_critical(integer, interval, timestamptz);

-- ---------------------------------------------------------------- checks

-- checks_per_slot's counts: pending checks no task job holds (claim IS NULL), per slot and
-- kind, as deltas appended by triggers on pyscheduler.checks and folded now and then.
CREATE TABLE pyscheduler._check_slot_counts (
    slot timestamptz NOT NULL,
    kind text NOT NULL,
    n    bigint NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);
CREATE INDEX _check_slot_counts_slot_idx ON pyscheduler._check_slot_counts (slot);

-- check_outcomes' figures per hour (of ended), job and outcome, as deltas appended by
-- triggers on pyscheduler.check_history and folded now and then.
CREATE TABLE pyscheduler._check_outcome_counts (
    hour     timestamptz NOT NULL,
    job      text NOT NULL,
    outcome  text NOT NULL,
    n        bigint NOT NULL,
    n_took   bigint NOT NULL,
    sum_took interval,
    max_took interval,
    sum_runs bigint NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);

-- checks_due_idx holds every pending check, those handed to a task job too: list_checks and
-- overdue_checks walk it in their order; the passes skip the handed-out ones (a task job's
-- check keeps its slot while the task runs: no more of them than tasks in flight).
DROP INDEX pyscheduler.checks_due_idx;
CREATE INDEX checks_due_idx ON pyscheduler.checks (next_check_at, id);
-- check_history pages newest first by (ended, id); the purge reads it oldest first
DROP INDEX pyscheduler.check_history_ended_idx;
CREATE INDEX check_history_ended_idx ON pyscheduler.check_history (ended, id);

-- list_checks and check_history take a keyset cursor (new signatures)
DROP FUNCTION IF EXISTS pyscheduler.list_checks(text, text, text, integer);
DROP FUNCTION IF EXISTS pyscheduler.check_history(text, text, text, integer);
