-- Recurring schedules on a sharded Redis index (issue 18): the degraded-mode claim of
-- some shards only. Its own file (loaded after schedules.sql) so schedules.sql and
-- claim_due_critical stay as they are.

CREATE OR REPLACE FUNCTION pyscheduler._claim_due_critical_shards(p_shards integer[], p_shard_count integer,
                                                                  p_limit integer, p_hold interval,
                                                                  p_now timestamptz)
RETURNS TABLE (id bigint, expected_at timestamptz, claim_token uuid)
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    IF p_shard_count IS NULL OR p_shard_count NOT BETWEEN 1 AND 16384 OR p_shards IS NULL
       OR cardinality(p_shards) = 0
       OR EXISTS (SELECT 1 FROM unnest(p_shards) k WHERE k IS NULL OR k NOT BETWEEN 0 AND p_shard_count - 1) THEN
        PERFORM _schedule_error('PS312', format(
            'p_shard_count must be in 1..16384 and p_shards a non-empty array of shards in 0..p_shard_count - 1, '
            'got %s and %s', coalesce(p_shard_count::text, 'NULL'), coalesce(p_shards::text, 'NULL')));
    END IF;
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 100000 OR p_hold IS NULL OR p_hold <= interval '0' THEN
        PERFORM _schedule_error('PS312', format('p_limit must be in 1..100000 and p_hold > 0, got %s and %s',
                                                coalesce(p_limit::text, 'NULL'), coalesce(p_hold::text, 'NULL')));
    END IF;
    -- the same walk as _claim_due_critical (schedules_critical_due_idx, oldest due first),
    -- keeping the rows of the given shards: at most p_shard_count / cardinality(p_shards)
    -- index entries read per row returned (the shard is id mod p_shard_count)
    RETURN QUERY
    WITH c AS (
        SELECT s.id FROM schedules s
         WHERE s.critical_due_at <= p_now AND (s.claimed_until IS NULL OR s.claimed_until < p_now)
           AND (s.id % p_shard_count)::integer = ANY (p_shards)
         ORDER BY s.critical_due_at
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED)
    UPDATE schedules s SET claim_token = gen_random_uuid(), claimed_until = p_now + p_hold
      FROM c
     WHERE s.id = c.id
    RETURNING s.id, s.due_at, s.claim_token;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.claim_due_critical_shards(p_shards integer[], p_shard_count integer,
                                                                 p_limit integer DEFAULT 100,
                                                                 p_hold interval DEFAULT '30 seconds')
RETURNS TABLE (id bigint, expected_at timestamptz, claim_token uuid)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* claim_due_critical_shards(p_shards, p_shard_count, p_limit => 100, p_hold => '30 seconds')
       -> setof (id, expected_at, claim_token)
   Degraded mode of some shards of a sharded index (Redis Cluster: a master
   down and no replica promoted yet): as claim_due_critical, only the due
   critical schedules whose shard (id mod p_shard_count) is in p_shards; the
   other shards go on firing from Redis. Record as claim_due_critical's claims
   (record_executions(..., p_tokens)).
   Errors: PS312 p_shard_count outside 1..16384, p_shards empty or a shard
   outside 0..p_shard_count - 1, p_limit outside 1..100000 or p_hold <= 0. */
BEGIN
    RETURN QUERY SELECT * FROM _claim_due_critical_shards(p_shards, p_shard_count, p_limit, p_hold, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.claim_due_critical_shards(integer[], integer, integer, interval) IS
    'Scheduler, degraded mode of some index shards: claim due critical schedules of those shards (id mod count).';

SELECT pyscheduler._grant('scheduler', 'claim_due_critical_shards');
