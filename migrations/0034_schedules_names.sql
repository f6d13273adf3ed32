-- depends: 0031_input_domains
-- The schedules daemons' functions name their parameters as every other public function does
-- (issue 28): ids, expected, outcomes, attempts, errors, tokens, after, max_schedules, sync_id,
-- owner, lease, shards, shard_count, hold, max_executions instead of p_ids, p_expected, ...
-- A renamed parameter is a new signature for CREATE OR REPLACE: the old functions are dropped
-- here and created again by sql/schedules/4_daemons.sql (the same types and domains; no view
-- depends on them, their grants come back with sql/; IF EXISTS: a step-by-step install from an
-- empty database loads the functions only after the last migration). A daemon of the previous
-- version calls them by the old names: restart the schedules daemons with this migration
-- (docs/operations.md). The domains stay as 0031 made them (sync_id and resync_owner still
-- name p_sync_id and p_owner in their refusal: ALTER DOMAIN ... ADD CONSTRAINT fails inside
-- yoyo's savepoint, "cannot start a subtransaction when there are unprocessed inval messages").

DROP FUNCTION IF EXISTS pyscheduler.index_entries(bigint[]);
DROP FUNCTION IF EXISTS pyscheduler.index_page(bigint, integer);
DROP FUNCTION IF EXISTS pyscheduler.resync_take(pyscheduler.sync_id, pyscheduler.resync_owner, integer, interval);
DROP FUNCTION IF EXISTS pyscheduler.resync_progress(pyscheduler.sync_id);
DROP FUNCTION IF EXISTS pyscheduler.fire_details(bigint[]);
DROP FUNCTION IF EXISTS pyscheduler.record_executions(bigint[], timestamptz[], pyscheduler.schedule_outcome[],
    integer[], pyscheduler.execution_error[], uuid[]);
DROP FUNCTION IF EXISTS pyscheduler.fire_task_schedules(bigint[], timestamptz[], uuid[]);
DROP FUNCTION IF EXISTS pyscheduler.stop_schedules(bigint[], timestamptz[], pyscheduler.schedule_outcome[],
    pyscheduler.execution_error[]);
DROP FUNCTION IF EXISTS pyscheduler.claim_due_critical(integer, interval);
DROP FUNCTION IF EXISTS pyscheduler.claim_due_critical_shards(integer[], integer, integer, interval);
DROP FUNCTION IF EXISTS pyscheduler.purge_executions(integer);
