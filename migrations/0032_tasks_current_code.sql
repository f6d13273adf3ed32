-- depends: 0031_input_domains
-- sql/tasks/ holds current code only: what its files dropped for older databases on every
-- migrate is dropped here once. (The one-off count of a database from before the tallies stays
-- in sql/tasks/1_model.sql, as delay's and checks' do: it must count in the transaction that
-- loads the functions that keep the tallies, or what is written in between goes uncounted.)

-- the count estimates of before migration 0027 (replaced by the tallies)
DROP FUNCTION IF EXISTS pyscheduler._task_running(bigint, jsonb);
DROP FUNCTION IF EXISTS pyscheduler._task_live(text, pyscheduler.task_status, bigint, jsonb);
DROP FUNCTION IF EXISTS pyscheduler._task_counted(text, pyscheduler.task_status, bigint);
DROP FUNCTION IF EXISTS pyscheduler._task_estimated();
DROP FUNCTION IF EXISTS pyscheduler._task_estimates();
DROP FUNCTION IF EXISTS pyscheduler._task_count_cap();
