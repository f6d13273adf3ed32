-- pyscheduler: leased tasks, the dashboard's reads (issue 30): find_tasks (its search box, each
-- term read through an index: the primary key, tasks_unique_idx and tasks_unique_key_idx,
-- tasks_spec_idx) and
-- task_family (a task page's workflow: parents by the primary key, children by tasks_after_idx).

-- _spec_index_state(): 'on', 'off' or 'invalid' (left by a build that failed or is under way,
-- which the planner does not read): the spec search index, tasks_spec_idx. An operator may turn it
-- off (`pyscheduler tasks spec-index off`, migrate.set_spec_index): it costs every task two sets of
-- entries, as submitted and as finished, and the monitor's merge of them (issue 31: 10-18 % of a
-- Worker's capacity on 2 cores). Not on, find_tasks(spec) reads the newest tasks instead and the
-- monitor merges nothing.
CREATE OR REPLACE FUNCTION pyscheduler._spec_index_state()
RETURNS text
LANGUAGE sql STABLE
RETURN (SELECT CASE WHEN i.indexrelid IS NULL THEN 'off' WHEN i.indisvalid THEN 'on' ELSE 'invalid' END
          FROM (SELECT pg_catalog.to_regclass('pyscheduler.tasks_spec_idx') AS oid) r
          LEFT JOIN pg_catalog.pg_index i ON i.indexrelid = r.oid);

CREATE OR REPLACE FUNCTION pyscheduler.find_tasks(
    rn_from uuid DEFAULT NULL, rn_to uuid DEFAULT NULL, unique_key pyscheduler.unique_key DEFAULT NULL,
    spec pyscheduler.task_spec DEFAULT NULL, max_tasks integer DEFAULT 20)
RETURNS TABLE (task jsonb)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
SET enable_seqscan = off  -- the running tasks' branch: by tasks_running_deadline_idx, however many the statistics say
AS $$
/* find_tasks(rn_from => NULL, rn_to => NULL, unique_key => NULL, spec => NULL, max_tasks => 20)
       -> setof (task jsonb)
   The tasks of one search term, newest first, at most max_tasks (give one of):
   rn_from and rn_to: the ids between them (an id prefix's range: '01a2' is
   01a20000-0000-... to 01a2ffff-ffff-...), read backwards on the primary key;
   unique_key: the tasks of that key in any queue and status (live ones from
   tasks_unique_idx, finished ones from tasks_unique_key_idx); spec: the tasks whose spec contains it (jsonb @>,
   '{"to": "a@example.com"}'), from tasks_spec_idx (running tasks, which it
   leaves out, from tasks_running_deadline_idx). A key or a spec fragment
   matches only the caller's own tasks (admin: every role's): it is their
   contents. A fragment that matches more than 10,000 tasks (of any role) is
   answered from 10,000 of them (not necessarily the newest), so the read is
   bounded whoever asks. With the spec index turned off (`pyscheduler tasks
   spec-index off`), a fragment is looked for in the newest 100,000 tasks
   only (of any role, by the primary key). Tasks of other roles show
   their metadata only, as get_task's.
   Errors: PS208 no term, two terms, or max_tasks < 1. */
#variable_conflict use_column
DECLARE
    v_seen name[] := _seen_owners();
BEGIN
    IF (rn_from IS NOT NULL OR rn_to IS NOT NULL)::int + (find_tasks.unique_key IS NOT NULL)::int
       + (find_tasks.spec IS NOT NULL)::int <> 1 OR (rn_from IS NULL) <> (rn_to IS NULL) THEN
        RAISE EXCEPTION 'give one search term: rn_from and rn_to, unique_key or spec'
            USING ERRCODE = 'PS208';
    END IF;
    IF max_tasks IS NULL OR max_tasks < 1 THEN
        RAISE EXCEPTION 'max_tasks must be at least 1, got %', coalesce(max_tasks::text, 'NULL')
            USING ERRCODE = 'PS208';
    END IF;
    IF rn_from IS NOT NULL THEN
        RETURN QUERY
        SELECT _task_seen_json(t, v_seen) FROM tasks t
         WHERE t.rn BETWEEN rn_from AND rn_to ORDER BY t.rn DESC LIMIT max_tasks;
    ELSIF find_tasks.unique_key IS NOT NULL THEN
        RETURN QUERY
        SELECT _task_seen_json(m, v_seen)
          FROM (SELECT t FROM tasks t  -- live: tasks_unique_idx
                 WHERE t.unique_key = find_tasks.unique_key AND t.status IN ('waiting', 'scheduled', 'ready', 'running')
                UNION ALL
                SELECT t FROM tasks t  -- finished (task_status' order): tasks_unique_key_idx
                 WHERE t.unique_key = find_tasks.unique_key AND t.status >= 'completed') x(m)
         WHERE v_seen IS NULL OR (x.m).submitted_by = ANY (v_seen)
         ORDER BY (x.m).rn DESC LIMIT max_tasks;
    ELSIF _spec_index_state() <> 'on' THEN  -- turned off: the newest 100,000 tasks, by the primary key
        RETURN QUERY
        SELECT _task_seen_json(t, v_seen) FROM tasks t
         WHERE t.rn = ANY (ARRAY(SELECT w.rn FROM (SELECT n.rn, n.spec, n.submitted_by FROM tasks n
                                                    ORDER BY n.rn DESC LIMIT 100000) w
                                  WHERE w.spec @> find_tasks.spec::jsonb
                                    AND (v_seen IS NULL OR w.submitted_by = ANY (v_seen))
                                  ORDER BY w.rn DESC LIMIT max_tasks))
         ORDER BY t.rn DESC;
    ELSE
        RETURN QUERY
        SELECT _task_seen_json(m, v_seen)
          FROM (SELECT t FROM tasks t WHERE t.status = 'running' AND t.spec @> find_tasks.spec::jsonb
                UNION ALL
                SELECT t FROM tasks t WHERE t.status <> 'running' AND t.spec @> find_tasks.spec::jsonb
                LIMIT 10000) x(m)
         WHERE v_seen IS NULL OR (x.m).submitted_by = ANY (v_seen)
         ORDER BY (x.m).rn DESC LIMIT max_tasks;
    END IF;
END
$$;
COMMENT ON FUNCTION pyscheduler.find_tasks(uuid, uuid, pyscheduler.unique_key, pyscheduler.task_spec, integer) IS
    'The tasks of one search term (an id range, a unique key, a spec fragment: jsonb @>), newest first, '
    'through an index; a key or fragment matches the caller''s own tasks only.';

CREATE OR REPLACE FUNCTION pyscheduler.task_family(rn uuid, max_tasks integer DEFAULT 100)
RETURNS TABLE (relation text, task_rn uuid, queue text, status text, updated timestamptz)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* task_family(rn, max_tasks => 100) -> setof (relation, task_rn, queue, status, updated)
   The workflow around a task: its parents (relation 'parent': the tasks it
   was submitted after, by the primary key) and its children (relation
   'child': the tasks submitted after it, from tasks_after_idx, a GIN index
   of the tasks that have parents), at most max_tasks of each, children
   newest first. Metadata only (ids, queues, states), as list_tasks shows
   every role; none for an unknown task.
   Errors: PS208 max_tasks < 1. */
#variable_conflict use_column
BEGIN
    IF max_tasks IS NULL OR max_tasks < 1 THEN
        RAISE EXCEPTION 'max_tasks must be at least 1, got %', coalesce(max_tasks::text, 'NULL')
            USING ERRCODE = 'PS208';
    END IF;
    RETURN QUERY
    (SELECT 'parent'::text, p.rn, p.queue, p.status::text, p.updated
       FROM tasks t CROSS JOIN LATERAL unnest(t.after) AS a(rn) JOIN tasks p ON p.rn = a.rn
      WHERE t.rn = task_family.rn
      LIMIT max_tasks)
    UNION ALL
    (SELECT 'child'::text, c.rn, c.queue, c.status::text, c.updated
       FROM tasks c
      WHERE c.after @> ARRAY[task_family.rn] AND c.after IS NOT NULL
      ORDER BY c.rn DESC
      LIMIT max_tasks);
END
$$;
COMMENT ON FUNCTION pyscheduler.task_family(uuid, integer) IS
    'A task''s parents and children (ids, queues, states), through indexes.';

SELECT pyscheduler._grant('client', 'find_tasks', 'task_family');
SELECT pyscheduler._grant('monitor', 'find_tasks', 'task_family');
