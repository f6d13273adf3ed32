-- depends: 0022_checks_job_outcomes
-- schedules_due_soon, schedules_late and schedules_late_count read an index on due_at
-- (issue 21). The due_hour column (due_at binned to the hour, 0021) kept a firing HOT but
-- did not bound the views: a schedule firing more often than hourly is always due within
-- the hour, so every healthy one sat in the current hour's entries and each view read all
-- of them to find the late or soonest ones (200,000 every-minute schedules, none late:
-- schedules_late 54 ms, schedules_due_soon 106 ms; 5M: seconds). An index on due_at reads
-- only the rows returned; its price is that a firing is no longer a HOT update (measured in
-- docs/benchmarks.md, "The due views' index"). The views depend on due_hour, so they go
-- first; sql/schedules/5_views.sql creates them again in the post-apply step. CREATE INDEX
-- holds off writes to schedules while it runs (about 2 s per million schedules).
DROP VIEW IF EXISTS pyscheduler.schedules_due_soon;
DROP VIEW IF EXISTS pyscheduler.schedules_late;
DROP INDEX IF EXISTS pyscheduler.schedules_due_hour_idx;
ALTER TABLE pyscheduler.schedules DROP COLUMN IF EXISTS due_hour;
CREATE INDEX schedules_due_idx ON pyscheduler.schedules (due_at) WHERE due_at IS NOT NULL;
-- Resync's index of critical schedules holds them only (it held every schedule as (critical,
-- id)): a firing of a non-critical schedule, no longer HOT, writes no entry to it. Resync
-- hands out the others in primary key order.
DROP INDEX IF EXISTS pyscheduler.schedules_critical_id_idx;
CREATE INDEX schedules_critical_id_idx ON pyscheduler.schedules (id) WHERE critical;
