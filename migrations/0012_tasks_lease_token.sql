-- depends: 0010_tasks_lean
-- Leased tasks, a cheaper lease (issue 10, second pass). Forward-only; no data change.
-- The functions whose signature changed are dropped here; sql/tasks.sql creates the
-- new ones right after this migration:
--  * _lease_token takes the lease call's secret as bytes (md5 of the rn's 16 bytes and
--    the secret), not as text: tokens already handed out stay valid (they are stored).
--  * _claim_tasks answers the columns the lease functions return, not whole rows.
DROP FUNCTION IF EXISTS pyscheduler._lease_token(text, uuid);
DROP FUNCTION IF EXISTS pyscheduler._claim_tasks(text, text, integer, interval, double precision, bigint, timestamptz);
