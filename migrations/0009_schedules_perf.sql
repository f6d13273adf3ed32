-- depends: 0007_schedules
-- Recurring schedules, cheaper firings (issue 8): a firing's UPDATE of its
-- schedule row can be HOT (no index on a column that changes per firing
-- except for critical schedules), the execution INSERT has no foreign-key
-- trigger and a BRIN index for the purge. Forward-only.

-- Only the Postgres-only claim (critical schedules) needs an index by due
-- time: it indexes a column that stays NULL for the others, so their
-- next-run updates change no indexed column (HOT).
ALTER TABLE pyscheduler.schedules ADD COLUMN critical_due_at timestamptz GENERATED ALWAYS AS (
    CASE WHEN critical THEN CASE WHEN paused THEN trigger_at ELSE least(next_run_at, trigger_at) END END) STORED;
DROP INDEX pyscheduler.schedules_due_idx;
DROP INDEX pyscheduler.schedules_critical_due_idx;
CREATE INDEX schedules_critical_due_idx ON pyscheduler.schedules (critical_due_at) WHERE critical_due_at IS NOT NULL;
-- resync_take reads both phases (critical, then the others) by id from one index
DROP INDEX pyscheduler.schedules_critical_id_idx;
CREATE INDEX schedules_critical_id_idx ON pyscheduler.schedules (critical, id);
-- room on each page for the new row versions of HOT updates
ALTER TABLE pyscheduler.schedules SET (fillfactor = 80);

-- delete_schedule deletes a schedule's executions itself (no per-row FK check)
ALTER TABLE pyscheduler.schedule_executions DROP CONSTRAINT schedule_executions_schedule_id_fkey;
DROP INDEX pyscheduler.schedule_executions_fired_at_idx;
CREATE INDEX schedule_executions_fired_at_idx ON pyscheduler.schedule_executions USING brin (fired_at);

-- fire_details returns the payload as text now (a new return type)
DROP FUNCTION IF EXISTS pyscheduler.fire_details(bigint[]);
