-- depends: 0054_tasks_input_checks
-- The states' three rules move from CHECKs to one partial index that holds no row (issue 31):
-- a row breaking a rule would be indexed, and its entry's expression refuses it (23514, the
-- rule named). PostgreSQL re-reads and plans each CHECK at the start of every INSERT or UPDATE
-- statement (ExecRelCheck: stringToNode, then ExecPrepareExpr); an index's predicate is kept
-- parsed in the relation cache. A single submit: 707,000 instructions with the CHECKs, 649,000
-- with the index, 618,000 with neither (callgrind, docs/benchmarks.md). Building the index reads
-- the table once, holding off writes to tasks meanwhile (0.3 s at a million tasks).
CREATE FUNCTION pyscheduler._task_state_refused(p_rn uuid, p_status pyscheduler.task_status)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'task % breaks the rule of its state: %', p_rn,
                    CASE p_status WHEN 'running' THEN 'a running task has an owner and a deadline'
                                  WHEN 'scheduled' THEN 'a scheduled task has a run_at'
                                  ELSE 'a waiting task waits for at least one parent (waiting_on > 0)' END
        USING ERRCODE = '23514', HINT = 'A bug in the pyscheduler function that wrote it: please report it.';
END
$$;

ALTER TABLE pyscheduler.tasks
    DROP CONSTRAINT tasks_running_check,
    DROP CONSTRAINT tasks_scheduled_check,
    DROP CONSTRAINT tasks_waiting_check;

CREATE INDEX tasks_state_rules_idx ON pyscheduler.tasks ((pyscheduler._task_state_refused(rn, status)))
    WHERE CASE status WHEN 'running' THEN owner IS NULL OR deadline IS NULL
                      WHEN 'scheduled' THEN run_at IS NULL
                      WHEN 'waiting' THEN waiting_on <= 0
                      ELSE false END;
