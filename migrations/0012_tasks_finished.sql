-- depends: 0010_tasks_lean
-- Leased tasks, finished tasks in their own table (issue 10). Forward-only.
--  * pyscheduler.tasks_finished INHERITS pyscheduler.tasks: the completed,
--    aborted and cancelled tasks. A task is moved there (DELETE + INSERT, in
--    one statement) when it finishes, so the live table keeps only ready and
--    running tasks and its indexes stay small; the finished table is
--    append-mostly, with its primary key (time-ordered rn) and an index on
--    updated for cleanup. Readers that select FROM pyscheduler.tasks see both
--    tables, as before (inheritance); writes to live tasks use ONLY.
--  * the old partial index of terminal tasks goes (tasks_finished has its own).
--  * existing finished tasks are moved, unchanged (every column as it was).
ALTER TABLE pyscheduler.tasks
    ADD CONSTRAINT tasks_live_status_check CHECK (status IN ('ready', 'running')) NO INHERIT NOT VALID;

CREATE TABLE pyscheduler.tasks_finished (
    CONSTRAINT tasks_finished_pkey PRIMARY KEY (rn),
    CONSTRAINT tasks_finished_status_check CHECK (status IN ('completed', 'aborted', 'cancelled'))
) INHERITS (pyscheduler.tasks)
WITH (autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 100000);
CREATE INDEX tasks_finished_updated_idx ON pyscheduler.tasks_finished (updated);

INSERT INTO pyscheduler.tasks_finished SELECT * FROM ONLY pyscheduler.tasks
 WHERE status IN ('completed', 'aborted', 'cancelled');
DELETE FROM ONLY pyscheduler.tasks WHERE status IN ('completed', 'aborted', 'cancelled');
ALTER TABLE pyscheduler.tasks VALIDATE CONSTRAINT tasks_live_status_check;
DROP INDEX pyscheduler.tasks_terminal_updated_idx;
DROP FUNCTION IF EXISTS pyscheduler._lease_token(text, uuid);  -- the secret is bytes now (sql/tasks.sql)
DROP FUNCTION IF EXISTS pyscheduler._claim_tasks(text, text, integer, interval, double precision, bigint, timestamptz);  -- answers columns now
