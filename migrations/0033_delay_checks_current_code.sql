-- depends: 0031_input_domains
-- sql/delay.sql and sql/checks/ hold current code only (issue 28): the private helpers of
-- earlier versions they dropped on every migrate are dropped here, once (a database upgraded
-- from those versions would otherwise keep them). No table changes.
DROP FUNCTION IF EXISTS pyscheduler._delay_check_headers(jsonb);  -- now _delay_headers_ok
DROP FUNCTION IF EXISTS pyscheduler._due_checks(timestamptz, integer, integer, integer, timestamptz);
DROP FUNCTION IF EXISTS pyscheduler._catch_up_checks(integer, integer, integer, timestamptz);
DROP FUNCTION IF EXISTS pyscheduler._check_take(integer, integer, integer);
DROP FUNCTION IF EXISTS pyscheduler._sql_job(text);
DROP FUNCTION IF EXISTS pyscheduler._check_job(text, text);
