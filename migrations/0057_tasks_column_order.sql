-- depends: 0056_tasks_queue_status_index
-- tasks' columns in a new order (issue 31): the fixed-width NOT NULL ones first, then queue, spec
-- and the indexed nullable ones, then what no index reads (sql/schema/20_tasks.sql says why). An
-- UPDATE compares the 17 indexed columns of the old and new row; with this order most are found
-- at a fixed offset instead of by walking the row: a leased task 81,200 -> 74,300 instructions
-- (callgrind), the capacity +3-7 % (docs/benchmarks.md). PostgreSQL cannot move a column, so the
-- table is rewritten: a new table, the rows copied, the primary key, 14 indexes and the
-- statistics built again, under an exclusive lock on tasks (writers and readers of tasks wait:
-- docs/operations.md gives the time a million tasks take). The functions and views that depend on
-- the table's row type go with the old table and are created again from their own definitions in
-- this transaction (with their privileges and comments), before the reload of sql/ replaces them.
-- An object outside schema pyscheduler that depends on tasks (a view of your own) stops the
-- migration (2BP01, naming it) before anything changed: drop it, migrate, create it again.
LOCK TABLE pyscheduler.tasks IN ACCESS EXCLUSIVE MODE;
ALTER SEQUENCE pyscheduler.task_seq OWNED BY NONE;

CREATE TEMP TABLE _tasks_dependents (ord integer NOT NULL, sub bigint NOT NULL DEFAULT 0, ddl text NOT NULL) ON COMMIT DROP;

DO $$
DECLARE
    v_outside text;
BEGIN
    -- Everything DROP TABLE ... CASCADE would take: what depends on the table or its row type,
    -- and the owner of anything that is part of something (a view's rule -> the view).
    CREATE TEMP TABLE _tasks_closure ON COMMIT DROP AS
    WITH RECURSIVE objs(classid, objid) AS (
        SELECT 'pg_class'::regclass::oid, 'pyscheduler.tasks'::regclass::oid
        UNION
        SELECT CASE WHEN d.refclassid = o.classid AND d.refobjid = o.objid THEN d.classid ELSE d.refclassid END,
               CASE WHEN d.refclassid = o.classid AND d.refobjid = o.objid THEN d.objid ELSE d.refobjid END
          FROM objs o
          JOIN pg_depend d ON (d.refclassid = o.classid AND d.refobjid = o.objid AND d.deptype IN ('n', 'a', 'i'))
                           OR (d.classid = o.classid AND d.objid = o.objid AND d.deptype = 'i')
    )
    SELECT o.classid, o.objid, i.type, i.schema, i.identity
      FROM objs o, pg_identify_object(o.classid, o.objid, 0) i;

    SELECT string_agg(format('%s %s', type, identity), ', ' ORDER BY identity) INTO v_outside
      FROM _tasks_closure
     WHERE schema IS NOT NULL AND schema NOT IN ('pyscheduler', 'pg_toast')
       AND NOT (classid = 'pg_type'::regclass  -- a view's row type and its array: the view is named
                AND EXISTS (SELECT 1 FROM pg_type t WHERE t.oid = objid AND (t.typrelid <> 0 OR t.typelem <> 0)));
    IF v_outside IS NOT NULL THEN
        RAISE EXCEPTION 'migration 0057 rewrites pyscheduler.tasks, and objects outside schema pyscheduler depend on it: %',
                        v_outside
            USING ERRCODE = '2BP01',
                  HINT = 'Drop them, run pyscheduler migrate, then create them again.';
    END IF;

    -- Their definitions, to create again once the new table is in place: functions first, then
    -- views in creation order, then triggers; each with its privileges and comment.
    INSERT INTO _tasks_dependents
    SELECT 0, 0, pg_get_functiondef(p.oid) FROM _tasks_closure c JOIN pg_proc p ON p.oid = c.objid
     WHERE c.classid = 'pg_proc'::regclass
    UNION ALL
    SELECT 1, 0, format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', p.oid::regprocedure)
      FROM _tasks_closure c JOIN pg_proc p ON p.oid = c.objid
     WHERE c.classid = 'pg_proc'::regclass AND p.proacl IS NOT NULL
    UNION ALL
    SELECT 2, a.n, format('GRANT %s ON FUNCTION %s TO %s', a.privilege_type, p.oid::regprocedure,
                          CASE a.grantee WHEN 0 THEN 'PUBLIC' ELSE quote_ident(a.grantee::regrole::text) END)
      FROM _tasks_closure c JOIN pg_proc p ON p.oid = c.objid,
           aclexplode(p.proacl) WITH ORDINALITY a(grantor, grantee, privilege_type, is_grantable, n)
     WHERE c.classid = 'pg_proc'::regclass AND a.grantee <> p.proowner
    UNION ALL
    SELECT 2, 0, format('COMMENT ON FUNCTION %s IS %L', p.oid::regprocedure, obj_description(p.oid, 'pg_proc'))
      FROM _tasks_closure c JOIN pg_proc p ON p.oid = c.objid
     WHERE c.classid = 'pg_proc'::regclass AND obj_description(p.oid, 'pg_proc') IS NOT NULL;

    INSERT INTO _tasks_dependents
    SELECT 2 + row_number() OVER (ORDER BY v.oid), 0,
           format('CREATE VIEW %s%s AS %s', v.oid::regclass,
                  CASE WHEN v.reloptions IS NOT NULL THEN format(' WITH (%s)', array_to_string(v.reloptions, ', ')) ELSE '' END,
                  pg_get_viewdef(v.oid))
      FROM _tasks_closure c JOIN pg_class v ON v.oid = c.objid
     WHERE c.classid = 'pg_class'::regclass AND v.relkind = 'v';
    INSERT INTO _tasks_dependents
    SELECT 1000000, 0, format('REVOKE ALL ON %s FROM PUBLIC', v.oid::regclass)
      FROM _tasks_closure c JOIN pg_class v ON v.oid = c.objid
     WHERE c.classid = 'pg_class'::regclass AND v.relkind = 'v' AND v.relacl IS NOT NULL
    UNION ALL
    SELECT 1000001, a.n, format('GRANT %s ON %s TO %s', a.privilege_type, v.oid::regclass,
                                CASE a.grantee WHEN 0 THEN 'PUBLIC' ELSE quote_ident(a.grantee::regrole::text) END)
      FROM _tasks_closure c JOIN pg_class v ON v.oid = c.objid,
           aclexplode(v.relacl) WITH ORDINALITY a(grantor, grantee, privilege_type, is_grantable, n)
     WHERE c.classid = 'pg_class'::regclass AND v.relkind = 'v' AND a.grantee <> v.relowner
    UNION ALL
    SELECT 1000001, 0, format('COMMENT ON VIEW %s IS %L', v.oid::regclass, obj_description(v.oid, 'pg_class'))
      FROM _tasks_closure c JOIN pg_class v ON v.oid = c.objid
     WHERE c.classid = 'pg_class'::regclass AND v.relkind = 'v' AND obj_description(v.oid, 'pg_class') IS NOT NULL
    UNION ALL
    SELECT 1000002, 0, pg_get_triggerdef(t.oid)
      FROM pg_trigger t WHERE t.tgrelid = 'pyscheduler.tasks'::regclass AND NOT t.tgisinternal;
END
$$;

CREATE TABLE pyscheduler.tasks_0057 (
    rn       uuid NOT NULL,
    priority bigint NOT NULL,
    created  timestamptz NOT NULL,
    updated  timestamptz NOT NULL,
    seq      bigint NOT NULL DEFAULT nextval('pyscheduler.task_seq'),
    progress double precision NOT NULL,
    status   pyscheduler.task_status NOT NULL,
    waiting_on integer NOT NULL DEFAULT 0,
    attempts integer NOT NULL DEFAULT 0,
    limited boolean NOT NULL DEFAULT false,
    watched boolean NOT NULL DEFAULT false,
    has_children boolean NOT NULL DEFAULT false,
    submitted_by name NOT NULL,
    queue    text NOT NULL,
    spec     jsonb NOT NULL,
    deadline timestamptz,
    run_at   timestamptz,
    owner    text,
    unique_key text,
    concurrency_key text,
    after uuid[],
    errors   jsonb NOT NULL,
    history  jsonb NOT NULL,
    result jsonb,
    leased_at timestamptz,
    lease_token uuid,
    max_attempts integer,
    on_parent_failure text
)
WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 2000,
      autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 20000,
      autovacuum_vacuum_cost_delay = 0, autovacuum_analyze_scale_factor = 0.05);
INSERT INTO pyscheduler.tasks_0057 (
    rn, priority, created, updated, seq, progress, status, waiting_on, attempts, limited,
    watched, has_children, submitted_by, queue, spec, deadline, run_at, owner, unique_key,
    concurrency_key, after, errors, history, result, leased_at, lease_token, max_attempts,
    on_parent_failure)
SELECT
    rn, priority, created, updated, seq, progress, status, waiting_on, attempts, limited,
    watched, has_children, submitted_by, queue, spec, deadline, run_at, owner, unique_key,
    concurrency_key, after, errors, history, result, leased_at, lease_token, max_attempts,
    on_parent_failure
  FROM pyscheduler.tasks;
DROP TABLE pyscheduler.tasks CASCADE;
ALTER TABLE pyscheduler.tasks_0057 RENAME TO tasks;
ALTER TABLE pyscheduler.tasks ADD CONSTRAINT tasks_pkey PRIMARY KEY (rn);
ALTER SEQUENCE pyscheduler.task_seq OWNED BY pyscheduler.tasks.seq;
CREATE INDEX tasks_state_rules_idx ON pyscheduler.tasks ((pyscheduler._task_state_refused(rn, status)))
    WHERE CASE status WHEN 'running' THEN owner IS NULL OR deadline IS NULL
                      WHEN 'scheduled' THEN run_at IS NULL
                      WHEN 'waiting' THEN waiting_on <= 0
                      ELSE false END;
CREATE INDEX tasks_ready_idx ON pyscheduler.tasks (queue, priority DESC, created, seq)
    WHERE status = 'ready';
CREATE INDEX tasks_running_deadline_idx ON pyscheduler.tasks (deadline)
    WHERE status = 'running';
CREATE INDEX tasks_terminal_updated_idx ON pyscheduler.tasks (updated)
    WHERE status IN ('completed', 'aborted', 'cancelled');
CREATE INDEX tasks_scheduled_idx ON pyscheduler.tasks (queue, run_at)
    WHERE status = 'scheduled';
CREATE UNIQUE INDEX tasks_unique_idx ON pyscheduler.tasks (unique_key, queue, submitted_by)
    WHERE unique_key IS NOT NULL AND status IN ('waiting', 'scheduled', 'ready', 'running');
CREATE INDEX tasks_ready_key_idx ON pyscheduler.tasks (queue, concurrency_key, priority DESC, created, seq)
    WHERE status = 'ready' AND concurrency_key IS NOT NULL;
CREATE INDEX tasks_limited_idx ON pyscheduler.tasks (queue, concurrency_key)
    WHERE status = 'running' AND limited;
CREATE INDEX tasks_requeue_idx ON pyscheduler.tasks (queue, status, updated)
    WHERE status IN ('aborted', 'cancelled');
CREATE INDEX tasks_failed_idx ON pyscheduler.tasks (status, rn) WHERE status IN ('aborted', 'cancelled');
CREATE INDEX tasks_queue_status_rn_idx ON pyscheduler.tasks (queue, status, rn)
    WHERE status IN ('waiting', 'scheduled', 'completed', 'aborted', 'cancelled');
CREATE INDEX tasks_spec_idx ON pyscheduler.tasks USING gin (spec jsonb_path_ops) WITH (gin_pending_list_limit = 4096)
    WHERE status <> 'running';
CREATE INDEX tasks_unique_key_idx ON pyscheduler.tasks (unique_key)
    WHERE unique_key IS NOT NULL AND status >= 'completed';
CREATE INDEX tasks_after_idx ON pyscheduler.tasks USING gin (after) WHERE after IS NOT NULL;
CREATE STATISTICS pyscheduler.tasks_queue_status_stats (mcv) ON queue, status FROM pyscheduler.tasks;
ALTER STATISTICS pyscheduler.tasks_queue_status_stats SET STATISTICS 250;

DO $$
DECLARE
    v_pending text[];
    v_left text[];
    v_ddl text;
    v_error text;
BEGIN
    -- In the order captured; a definition that needs one created later waits for the next pass.
    SELECT array_agg(ddl ORDER BY ord, sub) INTO v_pending FROM _tasks_dependents;
    WHILE cardinality(v_pending) > 0 LOOP
        v_left := ARRAY[]::text[];
        FOREACH v_ddl IN ARRAY v_pending LOOP
            BEGIN
                EXECUTE v_ddl;
            EXCEPTION WHEN undefined_table OR undefined_object OR undefined_function THEN
                v_left := v_left || v_ddl;
                v_error := SQLERRM;
            END;
        END LOOP;
        IF cardinality(v_left) = cardinality(v_pending) THEN
            RAISE EXCEPTION 'migration 0057 could not create again: % (%)', v_left[1], v_error;
        END IF;
        v_pending := v_left;
    END LOOP;
END
$$;
ANALYZE pyscheduler.tasks;
