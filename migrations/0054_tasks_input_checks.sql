-- depends: 0053_keep_completed
-- tasks keeps the CHECKs of its states (running, scheduled, waiting) and drops the five that
-- repeated an input rule (issue 31, single submit). Every row a caller gives reaches tasks through
-- a function whose signature or one check function refuses it first (docs/design: "Input"), and
-- the catalog's poison walk proves it for every public function. PostgreSQL re-reads and plans
-- a table's CHECKs at the start of every INSERT or UPDATE statement (ExecRelCheck: stringToNode
-- of each, then ExecPrepareExpr): the eight cost ~48 us of a one-row statement, the three kept
-- ~18 (pgbench, one connection, sync off), 14 % of a single submit's server CPU (perf).
ALTER TABLE pyscheduler.tasks
    DROP CONSTRAINT tasks_queue_check,
    DROP CONSTRAINT tasks_priority_check,
    DROP CONSTRAINT tasks_progress_check,
    DROP CONSTRAINT tasks_attempts_check,
    DROP CONSTRAINT tasks_max_attempts_check;
