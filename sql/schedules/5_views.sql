-- pyscheduler: recurring schedules, the views for psql, and the grants of every role.
-- The overview (SQLSTATEs, notifications, hardening) is at the top of 1_cron.sql; the
-- files of sql/schedules/ load in name order on every migrate.

-- ---------------------------------------------------------------- views (psql)

-- schedules_due_soon and schedules_late read schedules_due_idx in due_at order: a LIMIT reads
-- that many entries, whatever is stored (issue 21; 0023_schedules_due_index).
CREATE OR REPLACE VIEW pyscheduler.schedules_due_soon AS
    SELECT name, due_at, due_at - now() AS due_in, trigger_at IS NOT NULL AND trigger_at = due_at AS triggered,
           critical, target_kind,
           CASE WHEN coalesce(owner = ANY ((SELECT pyscheduler._seen_owners())::name[]), true)
                THEN target END AS target, owner
      FROM pyscheduler.schedules
     WHERE due_at IS NOT NULL AND due_at <= now() + interval '5 minutes'
     ORDER BY due_at;
COMMENT ON VIEW pyscheduler.schedules_due_soon IS
    'Schedules due within the next 5 minutes (or overdue), soonest first; target only for its owner and admin.';

CREATE OR REPLACE VIEW pyscheduler.schedules_late AS
    SELECT name, due_at, now() - due_at AS late_by, catchup_window, critical, target_kind,
           CASE WHEN coalesce(owner = ANY ((SELECT pyscheduler._seen_owners())::name[]), true)
                THEN target END AS target, owner
      FROM pyscheduler.schedules
     WHERE due_at IS NOT NULL AND due_at < now() - interval '10 seconds'
     ORDER BY due_at;
COMMENT ON VIEW pyscheduler.schedules_late IS
    'Schedules due more than 10 seconds ago and not yet fired: the executors are down or behind.';

-- schedules_late_count(up_to): how many schedules_late has, counted up to up_to: the same
-- index entries, no more than up_to of them (a dashboard's "N late").
CREATE OR REPLACE FUNCTION pyscheduler.schedules_late_count(up_to integer DEFAULT 1000)
RETURNS bigint
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_indexscan = on
AS $$
/* schedules_late_count(up_to => 1000) -> bigint
   The number of rows of schedules_late (due more than 10 seconds ago, not yet
   fired), counted up to up_to: it reads schedules_due_idx from the earliest
   due time on and stops there (a value of up_to means "up_to or more"). */
    SELECT count(*) FROM (
        SELECT 1 FROM pyscheduler.schedules s
         WHERE s.due_at IS NOT NULL AND s.due_at < now() - interval '10 seconds'
         LIMIT greatest(coalesce(up_to, 0), 0)) x;
$$;
COMMENT ON FUNCTION pyscheduler.schedules_late_count(integer) IS
    'How many schedules are late (the rows of schedules_late), counted up to up_to.';

CREATE OR REPLACE VIEW pyscheduler.schedules_paused AS
    SELECT name, paused_note, updated AS paused_since, next_run_at, target_kind,
           CASE WHEN coalesce(owner = ANY ((SELECT pyscheduler._seen_owners())::name[]), true)
                THEN target END AS target, owner
      FROM pyscheduler.schedules
     WHERE paused
     ORDER BY name;
COMMENT ON VIEW pyscheduler.schedules_paused IS 'Paused schedules with their notes.';

CREATE OR REPLACE VIEW pyscheduler.schedules_failing AS
    SELECT name, consecutive_failures, last_expected_at,
           CASE WHEN coalesce(owner = ANY ((SELECT pyscheduler._seen_owners())::name[]), true)
                THEN last_error END AS last_error,
           failed_count, fired_count, target_kind,
           CASE WHEN coalesce(owner = ANY ((SELECT pyscheduler._seen_owners())::name[]), true)
                THEN target END AS target, owner
      FROM pyscheduler.schedules
     WHERE consecutive_failures > 0 AND NOT paused  -- a paused one is in schedules_paused: it does not fire
     ORDER BY consecutive_failures DESC, name;
COMMENT ON VIEW pyscheduler.schedules_failing IS
    'Schedules not paused whose last fired-or-failed occurrence failed after retries, most consecutive failures first.';

-- ---------------------------------------------------------------- grants

SELECT pyscheduler._grant('client', 'create_schedule', 'update_schedule', 'pause_schedule', 'resume_schedule',
                         'trigger_schedule', 'delete_schedule', 'get_schedule', 'list_schedules', 'schedule_runs',
                         'upcoming_runs', 'execution_count', 'retry_worst_case', 'next_cron_time',
                         'schedules_due_soon', 'schedules_late', 'schedules_late_count', 'schedules_paused',
                         'schedules_failing');
SELECT pyscheduler._grant('scheduler', 'index_entries', 'index_page', 'resync_take', 'resync_progress',
                         'fire_details', 'record_executions', 'fire_task_schedules', 'stop_schedules',
                         'claim_due_critical', 'claim_due_critical_shards', 'purge_executions', 'get_schedule',
                         'retry_worst_case', 'next_cron_time',
                         'schedules_late_count');  -- the executor's gauge of late schedules (/metrics)
SELECT pyscheduler._grant('monitor', 'get_schedule', 'list_schedules', 'schedule_runs', 'upcoming_runs',
                         'execution_count', 'retry_worst_case', 'next_cron_time', 'resync_progress',
                         'schedules_due_soon', 'schedules_late', 'schedules_late_count', 'schedules_paused',
                         'schedules_failing');
