-- pyscheduler: recurring schedules, the search the dashboard's box runs (issue 30): find_schedules
-- (a name prefix is list_schedules(name_like => 'prefix%')).

CREATE OR REPLACE FUNCTION pyscheduler.find_schedules(
    target_prefix pyscheduler.schedule_target, max_schedules integer DEFAULT 20)
RETURNS TABLE (schedule jsonb)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* find_schedules(target_prefix, max_schedules => 20) -> setof (schedule jsonb)
   The schedules whose target starts with target_prefix (a topic, a queue, a
   URL's start: 'https://hooks.example.com/'), by target (byte order) then name, at most
   max_schedules, read from schedules_target_pattern_idx. A target is its
   owner's: only the caller's own schedules match (admin: every role's).
   Errors: PS312 max_schedules < 1. */
#variable_conflict use_column
BEGIN
    IF max_schedules IS NULL OR max_schedules < 1 THEN
        PERFORM _schedule_error('PS312', format('max_schedules must be at least 1, got %s',
                                                coalesce(max_schedules::text, 'NULL')));
    END IF;
    -- the pattern written into the query: the planner turns its literal prefix into a range of
    -- the pattern index (a parameter would leave it a filter, as in a cached generic plan), and
    -- the order is the index's (~<~, then name): a prefix many targets share stops at the page
    RETURN QUERY EXECUTE format(
        'SELECT pyscheduler._schedule_json(s) FROM pyscheduler.schedules s'
        ' WHERE s.target LIKE %L AND ($1::name[] IS NULL OR s.owner = ANY ($1))'
        ' ORDER BY s.target USING ~<~, s.name LIMIT $2',
        replace(replace(replace(target_prefix, '\', '\\'), '%', '\%'), '_', '\_') || '%')
    USING _seen_owners(), max_schedules;
END
$$;
COMMENT ON FUNCTION pyscheduler.find_schedules(pyscheduler.schedule_target, integer) IS
    'The caller''s schedules (admin: all) whose target starts with target_prefix, by target, from an index.';

SELECT pyscheduler._grant('client', 'find_schedules');
SELECT pyscheduler._grant('monitor', 'find_schedules');
