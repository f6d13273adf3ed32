-- depends: 0031_input_domains
-- sql/tasks/ holds current code only: what its files did for older databases on every migrate
-- runs here once.

-- the count estimates of before migration 0027 (replaced by the tallies)
DROP FUNCTION IF EXISTS pyscheduler._task_running(bigint, jsonb);
DROP FUNCTION IF EXISTS pyscheduler._task_live(text, pyscheduler.task_status, bigint, jsonb);
DROP FUNCTION IF EXISTS pyscheduler._task_counted(text, pyscheduler.task_status, bigint);
DROP FUNCTION IF EXISTS pyscheduler._task_estimated();
DROP FUNCTION IF EXISTS pyscheduler._task_estimates();
DROP FUNCTION IF EXISTS pyscheduler._task_count_cap();

-- A database from before migration 0027 has tasks but no tallies: count them once, as
-- pyscheduler._task_count_all() does (writers wait while it counts: SHARE lock).
DO $count$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pyscheduler.settings WHERE name = 'tasks_counted') THEN
        LOCK TABLE pyscheduler.tasks IN SHARE MODE;
        LOCK TABLE pyscheduler._task_tallies IN EXCLUSIVE MODE;
        DELETE FROM pyscheduler._task_tallies;
        INSERT INTO pyscheduler._task_tallies (queue, status, n)
        SELECT t.queue, t.status, count(*) FROM pyscheduler.tasks t GROUP BY t.queue, t.status;
        INSERT INTO pyscheduler.settings (name, value) VALUES ('tasks_counted', now()::text)
        ON CONFLICT (name) DO UPDATE SET value = excluded.value;
    END IF;
END
$count$;
