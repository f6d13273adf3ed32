-- pyscheduler: future checks, the search the dashboard's box runs (issue 30): find_checks.

CREATE OR REPLACE FUNCTION pyscheduler.find_checks(entity_key pyscheduler.entity_ref, max integer DEFAULT 20)
RETURNS TABLE (entity_name text, job text, state text, at timestamptz, owner text)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
SET enable_seqscan = off
AS $$
/* find_checks(entity_key, max => 20)
       -> setof (entity_name, job, state, at, owner)
   The checks of an entity key whatever its entity name: pending ones (state
   'pending', at their next check) and ended ones (state their outcome, at
   their end), newest first, at most max of each. Both indexes lead with the
   entity name (checks_entity_job_key, check_history_entity_idx): the names
   are walked one index probe each (a loose index scan), the first 1,000 of
   them, and the key looked up under each. No payload or error: metadata,
   as list_checks shows every role.
   Errors: PS406 max < 1. */
#variable_conflict use_column
BEGIN
    PERFORM _check_positive('max', find_checks.max >= 1, find_checks.max::text);
    RETURN QUERY
    (WITH RECURSIVE names(n, i) AS (
         (SELECT c.entity_name, 1 FROM checks c ORDER BY c.entity_name LIMIT 1)
         UNION ALL
         SELECT (SELECT c.entity_name FROM checks c WHERE c.entity_name > names.n ORDER BY c.entity_name LIMIT 1),
                names.i + 1
           FROM names WHERE names.n IS NOT NULL AND names.i < 1000)
     SELECT c.entity_name, c.job, 'pending'::text, c.next_check_at, c.owner
       FROM names JOIN checks c ON c.entity_name = names.n AND c.entity_key = find_checks.entity_key
      ORDER BY c.next_check_at DESC LIMIT find_checks.max)
    UNION ALL
    (WITH RECURSIVE names(n, i) AS (
         (SELECT h.entity_name, 1 FROM check_history h ORDER BY h.entity_name LIMIT 1)
         UNION ALL
         SELECT (SELECT h.entity_name FROM check_history h WHERE h.entity_name > names.n
                  ORDER BY h.entity_name LIMIT 1), names.i + 1
           FROM names WHERE names.n IS NOT NULL AND names.i < 1000)
     SELECT h.entity_name, h.job, h.outcome, h.ended, h.owner
       FROM names JOIN check_history h ON h.entity_name = names.n AND h.entity_key = find_checks.entity_key
      ORDER BY h.ended DESC LIMIT find_checks.max);
END
$$;
COMMENT ON FUNCTION pyscheduler.find_checks(pyscheduler.entity_ref, integer) IS
    'Pending and ended checks of an entity key under any entity name, newest first (a loose index scan).';

SELECT pyscheduler._grant('client', 'find_checks');
SELECT pyscheduler._grant('monitor', 'find_checks');
