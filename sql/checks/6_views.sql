-- pyscheduler: future checks, the views for psql, and the grants of every role.
-- The overview (slots, SQLSTATEs) is at the top of 1_slots.sql; the files of sql/checks/
-- load in name order on every migrate.

-- Views (psql). None reads more than the rows it shows: the counts above, or a walk of an index
-- in the view's order (a LIMIT stops it).
CREATE OR REPLACE VIEW pyscheduler.checks_per_slot AS
    SELECT c.slot, sum(c.n)::bigint AS checks,
           coalesce(sum(c.n) FILTER (WHERE c.kind = 'sql'), 0)::bigint AS sql_jobs,
           coalesce(sum(c.n) FILTER (WHERE c.kind = 'python'), 0)::bigint AS python_jobs,
           coalesce(sum(c.n) FILTER (WHERE c.kind = 'task'), 0)::bigint AS task_jobs
      FROM pyscheduler._check_slot_counts c, pyscheduler._current_check_slot cur
     WHERE c.slot >= cur.slot
     GROUP BY c.slot
    HAVING sum(c.n) > 0
     ORDER BY c.slot;
COMMENT ON VIEW pyscheduler.checks_per_slot IS
    'Pending checks per upcoming slot (the current one included), by job kind, soonest first (kept counts).';

-- overdue_checks: one walk of checks_due_idx from its start, in the view's order (a LIMIT stops
-- it); the bound is a scalar subquery, so it is an index condition.
CREATE OR REPLACE VIEW pyscheduler.overdue_checks AS
    SELECT c.id, c.entity_name, c.entity_key, c.job, c.kind, c.next_check_at, now() - c.next_check_at AS overdue,
           CASE WHEN c.claim IS NULL THEN 'missed slot' ELSE 'task late' END AS why
      FROM pyscheduler.checks c
     WHERE c.next_check_at < (SELECT cur.slot FROM pyscheduler._current_check_slot cur)
       AND (c.claim IS NULL OR c.claim_until < now())
     ORDER BY c.next_check_at, c.id;
COMMENT ON VIEW pyscheduler.overdue_checks IS
    'Checks of slots already past (runners down or behind) and task jobs past their task_timeout, oldest first.';

CREATE OR REPLACE VIEW pyscheduler.check_outcomes AS
    SELECT c.job, c.outcome, sum(c.n)::bigint AS checks,
           sum(c.sum_took) / nullif(sum(c.n_took), 0)::float8 AS avg_last_took,
           max(c.max_took) AS max_last_took, (sum(c.sum_runs)::numeric / sum(c.n))::numeric(10, 2) AS avg_runs
      FROM pyscheduler._check_outcome_counts c
     WHERE c.hour >= date_trunc('hour', now() - interval '1 day')
     GROUP BY c.job, c.outcome
    HAVING sum(c.n) > 0;
COMMENT ON VIEW pyscheduler.check_outcomes IS
    'History outcomes per job over the last day, in whole hours (kept counts).';

SELECT pyscheduler._grant('client', 'add_check', 'delete_checks', 'list_checks', 'check_history', 'slot_round',
                          'check_slots', 'checks_per_slot', 'overdue_checks', 'check_outcomes');
SELECT pyscheduler._grant('checker', 'run_due_checks', 'due_checks', 'catch_up_checks', 'run_check_jobs', 'run_checks',
                          'submit_check_tasks', 'finish_check', 'finish_checks', 'end_deleted_checks',
                          'purge_check_history', 'slot_round', 'check_slots',
                          'overdue_checks');  -- the runner's gauge of overdue checks (/metrics)
SELECT pyscheduler._grant('worker', 'finish_check', 'finish_checks');
SELECT pyscheduler._grant('monitor', 'list_checks', 'check_history', 'slot_round', 'check_slots',
                          'checks_per_slot', 'overdue_checks', 'check_outcomes');
SELECT pyscheduler._grant('admin', 'set_check_settings');
