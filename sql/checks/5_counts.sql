-- pyscheduler: future checks, the kept counts that checks_per_slot and check_outcomes read (statement triggers).
-- The overview (slots, SQLSTATEs) is at the top of 1_slots.sql; the files of sql/checks/
-- load in name order on every migrate.

-- ---------------------------------------------------------------- counts
--
-- checks_per_slot and check_outcomes count from tables kept by triggers, not from the checks
-- and their history (design.md: a read path never scans a table). Statement triggers with
-- transition tables: every writer is counted, whatever the path (a runner's batch, a client,
-- an operator's UPDATE), for one INSERT of a few aggregated rows per statement (measured
-- within noise of the runner's cycle and of add_check). The rows are deltas, appended
-- (appends never wait for each other: a counter row per slot would make every client adding
-- a check to the coming slot wait for the others to commit); one writing statement in 50 folds
-- them (_fold_check_counts), dropping what no reader needs any more: slots before the current
-- one (checks_per_slot shows the current one on) and hours before yesterday's
-- (check_outcomes covers the last day).

-- _check_slot_counts: pending checks no task job holds (claim IS NULL), per slot and kind.
CREATE OR REPLACE FUNCTION pyscheduler._checks_inserted()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    INSERT INTO _check_slot_counts (slot, kind, n)
    SELECT c.next_check_at, c.kind, count(*) FROM new_checks c WHERE c.claim IS NULL GROUP BY 1, 2;
    IF random() < 0.02 THEN
        PERFORM _fold_check_counts();
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler._checks_deleted()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    INSERT INTO _check_slot_counts (slot, kind, n)
    SELECT c.next_check_at, c.kind, -count(*) FROM old_checks c WHERE c.claim IS NULL GROUP BY 1, 2;
    IF random() < 0.02 THEN
        PERFORM _fold_check_counts();
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler._checks_updated()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    INSERT INTO _check_slot_counts (slot, kind, n)
    SELECT x.slot, x.kind, sum(x.n)
      FROM (SELECT c.next_check_at AS slot, c.kind, -1 AS n FROM old_checks c WHERE c.claim IS NULL
            UNION ALL
            SELECT c.next_check_at, c.kind, 1 FROM new_checks c WHERE c.claim IS NULL) x
     GROUP BY 1, 2
    HAVING sum(x.n) <> 0;
    IF random() < 0.02 THEN
        PERFORM _fold_check_counts();
    END IF;
    RETURN NULL;
END
$$;

-- _check_outcome_counts: per hour of ended, job and outcome: how many, the sum and number of
-- last_took (for the average), the largest last_took, the sum of check_count. A purge
-- subtracts what it deletes (the largest stays: only a history_retention under a day purges
-- rows check_outcomes still covers).
CREATE OR REPLACE FUNCTION pyscheduler._history_inserted()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    INSERT INTO _check_outcome_counts (hour, job, outcome, n, n_took, sum_took, max_took, sum_runs)
    SELECT date_trunc('hour', h.ended), h.job, h.outcome, count(*), count(h.last_took), sum(h.last_took),
           max(h.last_took), sum(h.check_count)
      FROM new_history h GROUP BY 1, 2, 3;
    IF random() < 0.02 THEN
        PERFORM _fold_check_counts();
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler._history_deleted()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    INSERT INTO _check_outcome_counts (hour, job, outcome, n, n_took, sum_took, max_took, sum_runs)
    SELECT date_trunc('hour', h.ended), h.job, h.outcome, -count(*), -count(h.last_took), -sum(h.last_took),
           NULL, -sum(h.check_count)
      FROM old_history h
     WHERE h.ended >= date_trunc('hour', now() - interval '1 day')  -- older hours are not kept
     GROUP BY 1, 2, 3;
    RETURN NULL;
END
$$;

-- (pyscheduler never updates the history; an operator may)
CREATE OR REPLACE FUNCTION pyscheduler._history_updated()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    INSERT INTO _check_outcome_counts (hour, job, outcome, n, n_took, sum_took, max_took, sum_runs)
    SELECT x.hour, x.job, x.outcome, sum(x.n), sum(x.n_took), sum(x.sum_took), max(x.max_took), sum(x.sum_runs)
      FROM (SELECT date_trunc('hour', h.ended) AS hour, h.job, h.outcome, -1 AS n, -(h.last_took IS NOT NULL)::int AS n_took,
                   -h.last_took AS sum_took, NULL::interval AS max_took, -h.check_count AS sum_runs
              FROM old_history h WHERE h.ended >= date_trunc('hour', now() - interval '1 day')
            UNION ALL
            SELECT date_trunc('hour', h.ended), h.job, h.outcome, 1, (h.last_took IS NOT NULL)::int, h.last_took,
                   h.last_took, h.check_count
              FROM new_history h WHERE h.ended >= date_trunc('hour', now() - interval '1 day')) x
     GROUP BY 1, 2, 3;
    RETURN NULL;
END
$$;

-- _fold_check_counts(): replace the deltas no other transaction is folding by their sums,
-- without the slots and hours no reader needs any more.
-- Its own, not one fold for all delta tables: that needs dynamic SQL, +28 % a fold (docs/benchmarks.md).
CREATE OR REPLACE FUNCTION pyscheduler._fold_check_counts()
RETURNS void
LANGUAGE sql
SET search_path = pyscheduler, pg_temp
AS $$
    WITH gone AS (
        DELETE FROM pyscheduler._check_slot_counts c
         WHERE c.ctid = ANY (ARRAY(SELECT x.ctid FROM pyscheduler._check_slot_counts x FOR UPDATE SKIP LOCKED))
        RETURNING c.*)
    INSERT INTO pyscheduler._check_slot_counts (slot, kind, n)
    SELECT g.slot, g.kind, sum(g.n) FROM gone g, pyscheduler._current_check_slot cur
     WHERE g.slot >= cur.slot
     GROUP BY 1, 2 HAVING sum(g.n) <> 0;
    WITH gone AS (
        DELETE FROM pyscheduler._check_outcome_counts c
         WHERE c.ctid = ANY (ARRAY(SELECT x.ctid FROM pyscheduler._check_outcome_counts x FOR UPDATE SKIP LOCKED))
        RETURNING c.*)
    INSERT INTO pyscheduler._check_outcome_counts (hour, job, outcome, n, n_took, sum_took, max_took, sum_runs)
    SELECT g.hour, g.job, g.outcome, sum(g.n), sum(g.n_took), sum(g.sum_took), max(g.max_took), sum(g.sum_runs)
      FROM gone g
     WHERE g.hour >= date_trunc('hour', now() - interval '1 day')
     GROUP BY 1, 2, 3 HAVING sum(g.n) <> 0;
$$;

-- _check_count_all(): the counts from the tables themselves, once (a database from before
-- migration 0018, or after rows were written with the triggers disabled: delete the setting
-- 'checks_counted' and run pyscheduler migrate). Writers wait while it counts (SHARE locks).
CREATE OR REPLACE FUNCTION pyscheduler._check_count_all()
RETURNS void
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    LOCK TABLE pyscheduler.checks, pyscheduler.check_history IN SHARE MODE;
    DELETE FROM _check_slot_counts;
    INSERT INTO _check_slot_counts (slot, kind, n)
    SELECT c.next_check_at, c.kind, count(*) FROM checks c, _current_check_slot cur
     WHERE c.claim IS NULL AND c.next_check_at >= cur.slot GROUP BY 1, 2;
    DELETE FROM _check_outcome_counts;
    INSERT INTO _check_outcome_counts (hour, job, outcome, n, n_took, sum_took, max_took, sum_runs)
    SELECT date_trunc('hour', h.ended), h.job, h.outcome, count(*), count(h.last_took), sum(h.last_took),
           max(h.last_took), sum(h.check_count)
      FROM check_history h WHERE h.ended >= date_trunc('hour', now() - interval '1 day') GROUP BY 1, 2, 3;
    INSERT INTO settings (name, value) VALUES ('checks_counted', now()::text)
    ON CONFLICT (name) DO UPDATE SET value = excluded.value;
END
$$;

CREATE OR REPLACE TRIGGER checks_inserted AFTER INSERT ON pyscheduler.checks
    REFERENCING NEW TABLE AS new_checks FOR EACH STATEMENT EXECUTE FUNCTION pyscheduler._checks_inserted();
CREATE OR REPLACE TRIGGER checks_updated AFTER UPDATE ON pyscheduler.checks
    REFERENCING OLD TABLE AS old_checks NEW TABLE AS new_checks
    FOR EACH STATEMENT EXECUTE FUNCTION pyscheduler._checks_updated();
CREATE OR REPLACE TRIGGER checks_deleted AFTER DELETE ON pyscheduler.checks
    REFERENCING OLD TABLE AS old_checks FOR EACH STATEMENT EXECUTE FUNCTION pyscheduler._checks_deleted();
CREATE OR REPLACE TRIGGER history_inserted AFTER INSERT ON pyscheduler.check_history
    REFERENCING NEW TABLE AS new_history FOR EACH STATEMENT EXECUTE FUNCTION pyscheduler._history_inserted();
CREATE OR REPLACE TRIGGER history_updated AFTER UPDATE ON pyscheduler.check_history
    REFERENCING OLD TABLE AS old_history NEW TABLE AS new_history
    FOR EACH STATEMENT EXECUTE FUNCTION pyscheduler._history_updated();
CREATE OR REPLACE TRIGGER history_deleted AFTER DELETE ON pyscheduler.check_history
    REFERENCING OLD TABLE AS old_history FOR EACH STATEMENT EXECUTE FUNCTION pyscheduler._history_deleted();
-- TRUNCATE (an operator emptying a table): the counts go with the rows
CREATE OR REPLACE FUNCTION pyscheduler._checks_truncated()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    IF TG_TABLE_NAME = 'checks' THEN
        DELETE FROM _check_slot_counts;
    ELSE
        DELETE FROM _check_outcome_counts;
    END IF;
    RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER checks_truncated AFTER TRUNCATE ON pyscheduler.checks
    FOR EACH STATEMENT EXECUTE FUNCTION pyscheduler._checks_truncated();
CREATE OR REPLACE TRIGGER history_truncated AFTER TRUNCATE ON pyscheduler.check_history
    FOR EACH STATEMENT EXECUTE FUNCTION pyscheduler._checks_truncated();
-- in the transaction that creates the triggers (the post-apply step of migrate): not in a
-- migration, which commits before them (what is written in between would go uncounted)
DO $count$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pyscheduler.settings WHERE name = 'checks_counted') THEN
        PERFORM pyscheduler._check_count_all();
    END IF;
END
$count$;
