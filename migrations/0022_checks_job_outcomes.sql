-- depends: 0020_tasks_flow
-- Check outcomes per job (issue 17): run_due_checks also returns job_outcomes,
-- {"job": {"outcome": n}}, so a runner counts its outcomes per job. A changed
-- result type needs the old signatures dropped; sql/checks/3_runner.sql
-- creates them again (and roles.sql's grants) in the post-apply step.
DROP FUNCTION IF EXISTS pyscheduler.run_due_checks(timestamptz, integer, integer, integer, bigint);
DROP FUNCTION IF EXISTS pyscheduler._run_due_checks(timestamptz, integer, integer, integer, bigint, timestamptz);
