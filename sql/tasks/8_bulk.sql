-- pyscheduler: leased tasks, what the dashboard's bulk actions call besides retry_task and
-- cancel_task (issue 30): delete_tasks, run_tasks_now. Each takes a bounded batch of ids and
-- acts on those the caller may act on (its role's, every role's for admin), leaving the rest.

-- _bulk_ids(rns, hint): PS208 unless rns is an array of at most 1000 task ids (a bulk call's batch).
CREATE OR REPLACE FUNCTION pyscheduler._bulk_ids(p_rns uuid[], p_hint text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_rns IS NULL OR cardinality(p_rns) > 1000 THEN
        RAISE EXCEPTION 'rns must be an array of at most 1000 task ids, got %', coalesce(cardinality(p_rns)::text, 'NULL')
            USING ERRCODE = 'PS208', HINT = p_hint;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.delete_tasks(rns uuid[])
RETURNS TABLE (rn uuid)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* delete_tasks(rns) -> setof (rn uuid)
   Deletes the finished tasks (completed, aborted, cancelled) among rns (at
   most 1000) that the caller may act on, as cleanup_tasks does after the
   retention; returns the ids deleted. A live task, another role's task or an
   unknown id is left alone (not returned). A child waiting for no one is
   not affected: a parent that finished is done for it.
   Errors: PS208 rns NULL or more than 1000 ids. */
#variable_conflict use_column
DECLARE
    v_gone text[];
    v_was task_status[];
    v_rns uuid[];
BEGIN
    PERFORM _bulk_ids(rns, 'Delete in batches.');
    WITH gone AS (
        DELETE FROM tasks t
         WHERE t.rn IN (SELECT r.rn FROM tasks r
                         WHERE r.rn = ANY (rns) AND r.status IN ('completed', 'aborted', 'cancelled')
                           AND _may_act(r.submitted_by)
                           FOR UPDATE)
           AND t.status IN ('completed', 'aborted', 'cancelled')
        RETURNING t.rn, t.queue, t.status)
    SELECT array_agg(g.rn), array_agg(g.queue), array_agg(g.status) INTO v_rns, v_gone, v_was FROM gone g;
    PERFORM _task_tally_many(v_gone, NULL, NULL, p_froms => v_was);
    RETURN QUERY SELECT u.rn FROM unnest(v_rns) AS u(rn);
END
$$;
COMMENT ON FUNCTION pyscheduler.delete_tasks(uuid[]) IS
    'Delete the finished tasks among up to 1000 ids that belong to the caller''s role (admin: all); returns them.';

CREATE OR REPLACE FUNCTION pyscheduler.run_tasks_now(rns uuid[])
RETURNS TABLE (rn uuid)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* run_tasks_now(rns) -> setof (rn uuid)
   The scheduled tasks among rns (at most 1000: delayed, or failed and
   waiting for their retry) that the caller may act on become due now: their
   run_at is now, so the next lease of their queue takes them in priority
   order (its workers are woken), and their history records TaskRunNow by
   the caller. Returns their ids; any other id is left alone.
   Errors: PS208 rns NULL or more than 1000 ids. */
#variable_conflict use_column
DECLARE
    v_caller name := _caller();
    v_now timestamptz := now();
    v_rns uuid[];
    v_queues text[];
BEGIN
    PERFORM _bulk_ids(rns, 'Run them in batches.');
    WITH due AS (
        UPDATE tasks t
           SET run_at = v_now, updated = v_now,
               history = _trim_history(t.history || jsonb_build_array(jsonb_build_object(
                             '_typ', 'TaskRunNow', 'by', v_caller, 'time', _ts(v_now))),
                                       _task_limit('task_max_history'))
          FROM (SELECT r.rn FROM tasks r
                 WHERE r.rn = ANY (rns) AND r.status = 'scheduled' AND _may_act(r.submitted_by)
                 ORDER BY r.rn FOR UPDATE) AS s
         WHERE t.rn = s.rn AND t.status = 'scheduled'
        RETURNING t.rn, t.queue)
    SELECT array_agg(d.rn), array_agg(DISTINCT d.queue) INTO v_rns, v_queues FROM due d;
    PERFORM _notify_throttled(_task_channel(q)) FROM unnest(v_queues) AS q;
    RETURN QUERY SELECT u.rn FROM unnest(v_rns) AS u(rn);
END
$$;
COMMENT ON FUNCTION pyscheduler.run_tasks_now(uuid[]) IS
    'Make the scheduled tasks among up to 1000 ids that belong to the caller''s role (admin: all) due now.';

SELECT pyscheduler._grant('client', 'delete_tasks', 'run_tasks_now');
