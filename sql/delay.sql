-- pyscheduler: the delay queue (seeds/chronos.md). Reloaded on every migrate.
--
-- A message is `waiting` (readied_at IS NULL) until its deadline minus the
-- timing advance, then `ready` (claimed by one node: readied_at/readied_by),
-- then fired (published by the relay and deleted). A node that holds a ready
-- message longer than the hold time is suspected of failure and the message
-- goes back to waiting (reset_stuck), so another node fires it: at least once.
--
-- SQLSTATEs (PS100-PS199):
--   PS101  invalid message id (NULL, empty, longer than 128 characters, or not a label: the
--          domain message_id, sql/common.sql "The input rule")
--   PS102  missing deadline
--   PS103  array arguments of different lengths
--   PS104  headers are not a JSON array of single-pair objects (or nest over 64 levels)
--   PS105  invalid interval, count or flag argument (advance outside 0..1 minute, hold outside
--          (0, 100 years], max_count < 1, NULL node, NULL store_late)
--   PS106  deadline outside the supported range [1970-01-01T00:00:00Z, 9999-01-01T00:00:00Z)
--
-- Clock: no public function takes the time from its caller. Each public
-- function that needs "now" is a thin wrapper passing clock_timestamp() to a
-- private _function(..., p_now) that is granted to no role (tests call it).

-- _delay_plans: the functions that read delay_messages (enqueue, claim, delete, reset,
-- next_deadline, cancel) run with enable_seqscan and enable_bitmapscan off. The table is
-- a queue: autovacuum often analyzes it empty (every message fired), and with those
-- statistics the planner picks a sequential scan and a sort for "the earliest waiting
-- deadlines", whose cost then grows with the backlog it creates (seen in the relay bench:
-- 2,000-row claims taking over half a second, 10,000 msg/s collapsing to 1,000). With
-- them off, each lookup is an index scan whatever the statistics say; enable_indexscan is
-- set on too, so a session that turned it off does not change these plans either. The
-- views' functions (_delay_queue, _delay_ready_by_node) likewise.

-- _delay_check_interval(name, value, allow_zero, max): PS105 for a NULL or
-- negative (or zero, unless allowed) interval argument, or one above max.
CREATE OR REPLACE FUNCTION pyscheduler._delay_check_interval(p_name text, p_value interval, p_allow_zero boolean,
                                                             p_max interval DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    IF p_value IS NULL OR p_value < interval '0' OR (p_value = interval '0' AND NOT p_allow_zero)
       OR p_value > p_max THEN
        RAISE EXCEPTION '% must be % interval%, got %', p_name,
                        CASE WHEN p_allow_zero THEN 'a non-negative' ELSE 'a positive' END,
                        CASE WHEN p_max IS NULL THEN '' ELSE ' of at most ' || p_max END, p_value
            USING ERRCODE = 'PS105', HINT = format('Pass %s => ''50 milliseconds'' or similar.', p_name);
    END IF;
END
$$;

-- The timing advance compensates for the relay's own delay (milliseconds);
-- a larger one would let a caller fire messages early at will.
CREATE OR REPLACE FUNCTION pyscheduler._delay_max_advance()
RETURNS interval LANGUAGE sql IMMUTABLE SET search_path = pyscheduler, pg_temp
AS $$ SELECT interval '1 minute' $$;

-- _delay_check_deadlines(ids, deadlines): PS102 for a NULL deadline, PS106 for
-- one outside [1970-01-01T00:00:00Z, 9999-01-01T00:00:00Z), the range of the
-- table's CHECK (every client library can load it, in any time zone).
CREATE OR REPLACE FUNCTION pyscheduler._delay_check_deadlines(p_ids text[], p_deadlines timestamptz[])
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    v_id text;
    v_deadline timestamptz;
BEGIN
    IF array_position(p_deadlines, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'every message needs a deadline (message %)', p_ids[array_position(p_deadlines, NULL)]
            USING ERRCODE = 'PS102', HINT = 'The deadline is the chronosDeadline header.';
    END IF;
    SELECT u.id, u.deadline INTO v_id, v_deadline
      FROM unnest(p_ids, p_deadlines) AS u(id, deadline)
     WHERE NOT (u.deadline >= timestamptz '1970-01-01 00:00:00+00' AND u.deadline < timestamptz '9999-01-01 00:00:00+00')
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'deadline % of message % is outside the supported range', v_deadline, v_id
            USING ERRCODE = 'PS106',
                  HINT = 'A deadline must be in [1970-01-01T00:00:00Z, 9999-01-01T00:00:00Z).';
    END IF;
END
$$;

-- _enqueue_messages: enqueue_messages with the clock as a parameter (p_now);
-- granted to no role: tests call it, enqueue_messages passes clock_timestamp().
--
-- The rule per id, in input order, the same whether the occurrences come in
-- one batch or in several: an occurrence whose id is waiting or ready (stored
-- by an earlier batch or an earlier occurrence of this one) is a duplicate; a
-- late one whose id is not present is fired at once and, fired, forgotten, so
-- the next occurrence of the id is judged afresh; otherwise it is enqueued.
CREATE OR REPLACE FUNCTION pyscheduler._enqueue_messages(
    ids          text[],
    deadlines    timestamptz[],
    keys         bytea[]     DEFAULT NULL,
    vals         bytea[]     DEFAULT NULL,
    header_lists jsonb[]     DEFAULT NULL,
    advance      interval    DEFAULT '50 milliseconds',
    wake_within  interval    DEFAULT '100 milliseconds',
    store_late   boolean     DEFAULT false,
    p_now        timestamptz DEFAULT NULL)
RETURNS TABLE (ord integer, id text, outcome text)
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_indexscan = on  -- see _delay_plans below
SET plan_cache_mode = force_generic_plan  -- the batch's statement: its custom plans (the arrays' lengths known)
                                          -- kept the cache from its generic plan, so it was planned every call
AS $$
#variable_conflict use_column
DECLARE
    v_n    integer := coalesce(cardinality(_enqueue_messages.ids), 0);
    v_head timestamptz;
    v_new  timestamptz;
    v_h    jsonb;
BEGIN
    IF p_now IS NULL THEN
        RAISE EXCEPTION 'p_now must be set' USING ERRCODE = 'PS105', HINT = 'Pass p_now => clock_timestamp().';
    END IF;
    PERFORM pyscheduler._delay_check_interval('advance', _enqueue_messages.advance, true,
                                              pyscheduler._delay_max_advance());
    IF _enqueue_messages.store_late IS NULL THEN  -- NULL would make a late message neither late nor stored
        RAISE EXCEPTION 'store_late must be true or false, got NULL'
            USING ERRCODE = 'PS105', HINT = 'Pass store_late => false (the default) or true.';
    END IF;
    IF coalesce(cardinality(_enqueue_messages.deadlines), 0) <> v_n
       OR cardinality(_enqueue_messages.keys) <> v_n
       OR cardinality(_enqueue_messages.vals) <> v_n
       OR cardinality(_enqueue_messages.header_lists) <> v_n THEN
        RAISE EXCEPTION 'ids, deadlines, keys, vals and header_lists must have the same length'
            USING ERRCODE = 'PS103', HINT = 'Pass NULL for keys, vals or header_lists to leave them all empty.';
    END IF;
    -- an id's length and form are checked by the domain message_id (the public functions' ids); NULL here
    IF array_position(_enqueue_messages.ids, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'every message id must have 1 to 128 characters'
            USING ERRCODE = 'PS101',
                  HINT = 'The id is the chronosMessageId header: a label (one line, not padded), unique per message.';
    END IF;
    PERFORM pyscheduler._delay_check_deadlines(_enqueue_messages.ids, _enqueue_messages.deadlines);
    -- headers: NULL, or a JSON array of objects with exactly one key each (the seed's
    -- [{"k1": "v1"}, {"k2": "v2"}]), tested here in the statement: a SQL function with a
    -- sub-SELECT is never inlined, and called a message each it was planned on every call
    SELECT h INTO v_h FROM unnest(_enqueue_messages.header_lists) h
     WHERE h IS NOT NULL AND h <> '[]'::jsonb
       AND (jsonb_typeof(h) <> 'array'
            OR EXISTS (SELECT 1 FROM jsonb_array_elements(h) e
                        WHERE jsonb_typeof(e) <> 'object' OR (SELECT count(*) FROM jsonb_object_keys(e)) <> 1))
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'headers must be a JSON array of single-pair objects, got %', left(v_h::text, 200)
            USING ERRCODE = 'PS104',
                  HINT = 'Write headers as [{"name": "value"}, ...]; a name may repeat.';
    END IF;

    -- What sleepers expect next, read before this batch is inserted. Only deadlines from a
    -- second ago on (see _delay_dead_head): a relay with older ones waiting is busy, not
    -- asleep, so missing them costs at most a (throttled) NOTIFY nobody needed.
    SELECT m.deadline INTO v_head FROM pyscheduler.delay_messages m
     WHERE m.readied_at IS NULL AND m.deadline >= p_now - interval '1 second' ORDER BY m.deadline LIMIT 1;
    SELECT min(d) INTO v_new FROM unnest(_enqueue_messages.deadlines) d
     WHERE _enqueue_messages.store_late OR d > p_now + _enqueue_messages.advance;

    RETURN QUERY
    WITH input AS (
        SELECT u.id, u.deadline, u.key, u.value, u.headers, u.ord::integer AS ord,
               (NOT _enqueue_messages.store_late AND u.deadline <= p_now + _enqueue_messages.advance) AS late
          FROM unnest(_enqueue_messages.ids, _enqueue_messages.deadlines, _enqueue_messages.keys,
                      _enqueue_messages.vals, _enqueue_messages.header_lists)
               WITH ORDINALITY AS u(id, deadline, key, value, headers, ord)
    ), keeper AS (  -- per id, the first occurrence that is not late: the one to store
        SELECT DISTINCT ON (i.id) i.* FROM input i WHERE NOT i.late ORDER BY i.id, i.ord
    ), inserted AS (
        INSERT INTO pyscheduler.delay_messages AS m (id, deadline, headers, key, value)
        SELECT k.id, k.deadline, coalesce(k.headers, '[]'::jsonb), k.key, k.value FROM keeper k
        ON CONFLICT ON CONSTRAINT delay_messages_pkey DO NOTHING
        RETURNING m.id
    ), counted AS (  -- see _delay_counts below
        INSERT INTO pyscheduler._delay_counts (n) SELECT count(*) FROM inserted HAVING count(*) > 0
    )
    SELECT i.ord, i.id,
           CASE WHEN i.ord = k.ord AND s.id IS NOT NULL THEN 'enqueued'
                -- late, before any stored occurrence, and not stored by an earlier batch
                WHEN i.late AND (k.ord IS NULL OR i.ord < k.ord)
                     AND NOT EXISTS (SELECT 1 FROM pyscheduler.delay_messages m WHERE m.id = i.id) THEN 'late'
                ELSE 'duplicate' END
      FROM input i
      LEFT JOIN keeper k ON k.id = i.id
      LEFT JOIN inserted s ON s.id = k.id
     ORDER BY i.ord;

    IF v_new IS NOT NULL AND v_new - _enqueue_messages.advance <= p_now + _enqueue_messages.wake_within
       AND (v_head IS NULL OR v_new < v_head) THEN
        PERFORM pyscheduler._notify_throttled('pyscheduler_delay', v_new::text, interval '10 milliseconds');
    END IF;
    IF random() < 0.02 THEN
        PERFORM pyscheduler._delay_fold_counts();
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.enqueue_messages(
    ids          pyscheduler.message_id[],
    deadlines    timestamptz[],
    keys         bytea[]                       DEFAULT NULL,
    vals         bytea[]                       DEFAULT NULL,
    header_lists pyscheduler.message_headers[] DEFAULT NULL,
    advance      interval                      DEFAULT '50 milliseconds',
    wake_within  interval                      DEFAULT '100 milliseconds',
    store_late   boolean                       DEFAULT false)
RETURNS TABLE (ord integer, id text, outcome text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* enqueue_messages(ids, deadlines, keys, vals, header_lists, advance, wake_within, store_late)
     -> TABLE (ord, id, outcome)

   Store a batch of delayed messages in one round trip. Element i of every
   array describes message i; keys, vals and header_lists may be NULL (all
   NULL) or have one element per id (an element may be NULL: no key, a NULL
   value, no headers). The time is the database clock.

   outcome per message, in input order (ord is the 1-based position):
     enqueued   stored, waiting for its deadline
     duplicate  a message with this id is already waiting or ready (stored
                by an earlier call or an earlier element of this batch):
                ignored, nothing stored
     late       deadline <= now + advance and the id is not present: NOT
                stored; the caller must publish it at once. Published, the
                id is forgotten: a later element with the same id is judged
                afresh, exactly as if it came in the next batch.

   advance      the timing advance (default 50 ms, at most 1 minute)
   wake_within  a message due within this time that is earlier than every
                waiting message sends a (throttled) NOTIFY pyscheduler_delay
                so sleeping relays wake early
   store_late   store late messages too (outcome enqueued): the relay uses it
                for late messages the broker would not take at once, so they
                are fired (and retried) from the table instead

   Errors: PS101 bad id, PS102 NULL deadline, PS103 array lengths differ,
           PS104 bad headers, PS105 bad advance or NULL store_late,
           PS106 deadline out of range. */
BEGIN
    RETURN QUERY
        SELECT * FROM pyscheduler._enqueue_messages(ids, deadlines, keys, vals, header_lists, advance,
                                                     wake_within, store_late, clock_timestamp());
END
$$;
COMMENT ON FUNCTION pyscheduler.enqueue_messages(pyscheduler.message_id[], timestamptz[], bytea[], bytea[],
    pyscheduler.message_headers[], interval, interval, boolean) IS
    'Delay queue: store a batch of messages idempotently; per message enqueued, duplicate or late (publish it now).';

CREATE OR REPLACE FUNCTION pyscheduler.enqueue_message(
    id          pyscheduler.message_id,
    deadline    timestamptz,
    key         bytea                       DEFAULT NULL,
    value       bytea                       DEFAULT NULL,
    headers     pyscheduler.message_headers DEFAULT '[]',
    advance     interval                    DEFAULT '50 milliseconds',
    wake_within interval                    DEFAULT '100 milliseconds')
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* enqueue_message(id, deadline, key, value, headers, advance, wake_within) -> text

   Store one delayed message; idempotent on id. Returns
     'enqueued'   stored, waiting for its deadline
     'duplicate'  a message with this id is already waiting or ready: ignored
     'late'       deadline <= now + advance and the id is not present: NOT
                  stored; the caller publishes it at once
   headers: a JSON array of single-pair objects, [{"name": "value"}, ...].
   See enqueue_messages for the other parameters and the errors. */
BEGIN
    RETURN (
        SELECT e.outcome
          FROM pyscheduler._enqueue_messages(
                   ARRAY[enqueue_message.id], ARRAY[enqueue_message.deadline], ARRAY[enqueue_message.key],
                   ARRAY[enqueue_message.value], ARRAY[enqueue_message.headers], enqueue_message.advance,
                   enqueue_message.wake_within, false, clock_timestamp()) e);
END
$$;
COMMENT ON FUNCTION pyscheduler.enqueue_message(pyscheduler.message_id, timestamptz, bytea, bytea,
    pyscheduler.message_headers, interval, interval) IS
    'Delay queue: store one message idempotently; returns enqueued, duplicate or late (publish it now).';

-- _ready_and_claim: ready_and_claim with the clock as a parameter (p_now); granted to no role.
--
-- _delay_dead_head: claimed and deleted rows leave their entries in delay_messages_waiting_idx
-- until VACUUM removes them, all of them at the low end of the index (the earliest deadlines,
-- which nothing new is inserted next to, so btree never cleans those pages up itself). A scan
-- from the start steps over every one of them: between two autovacuum runs (a minute or more,
-- longer under a backlog) that is every message claimed since, and claims slowed from ~10 ms
-- to over 0.5 s per 2,000-row batch in the relay bench. `after` lets the relay start the scan
-- at the deadlines it reached (a watermark minus a slack; it rescans from the start every few
-- seconds and after resets), and the UPDATE finds each locked row by its ctid instead of a
-- second primary-key lookup.
CREATE OR REPLACE FUNCTION pyscheduler._ready_and_claim(node uuid, advance interval DEFAULT '50 milliseconds',
                                                         max_count integer DEFAULT 1000,
                                                         p_now timestamptz DEFAULT NULL,
                                                         after timestamptz DEFAULT NULL)
RETURNS TABLE (id text, deadline timestamptz, headers jsonb, key bytea, value bytea, readied_at timestamptz)
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_indexscan = on  -- see _delay_plans below
AS $$
#variable_conflict use_column
DECLARE
    v_n bigint;
BEGIN
    PERFORM pyscheduler._delay_check_interval('advance', _ready_and_claim.advance, true,
                                              pyscheduler._delay_max_advance());
    IF _ready_and_claim.node IS NULL OR _ready_and_claim.max_count IS NULL OR _ready_and_claim.max_count < 1
       OR p_now IS NULL THEN
        RAISE EXCEPTION 'node must be set and max_count >= 1 (got %, %)', _ready_and_claim.node,
                        _ready_and_claim.max_count
            USING ERRCODE = 'PS105', HINT = 'Pass node => gen_random_uuid(), max_count => 1000.';
    END IF;
    RETURN QUERY
    WITH due AS (
        SELECT m.ctid AS row_id FROM pyscheduler.delay_messages m
         WHERE m.readied_at IS NULL AND m.deadline <= p_now + _ready_and_claim.advance
           AND m.deadline >= coalesce(_ready_and_claim.after, '-infinity')
         ORDER BY m.deadline
         LIMIT _ready_and_claim.max_count
           FOR UPDATE SKIP LOCKED
    )
    UPDATE pyscheduler.delay_messages m
       SET readied_at = p_now, readied_by = _ready_and_claim.node
      FROM due
     WHERE m.ctid = due.row_id  -- the row version locked above (a Tid Scan, no second index lookup)
    RETURNING m.id, m.deadline, m.headers, m.key, m.value, m.readied_at;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    IF v_n > 0 THEN  -- see _delay_ready_counts below
        INSERT INTO pyscheduler._delay_ready_counts (node, readied_at, n) VALUES (_ready_and_claim.node, p_now, v_n);
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.ready_and_claim(
    node      uuid,
    advance   interval    DEFAULT '50 milliseconds',
    max_count integer     DEFAULT 1000,
    after     timestamptz DEFAULT NULL)
RETURNS TABLE (id text, deadline timestamptz, headers jsonb, key bytea, value bytea, readied_at timestamptz)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* ready_and_claim(node, advance, max_count, after) -> TABLE (id, deadline, headers, key, value, readied_at)

   Phase 1 of firing: in one statement, mark up to max_count waiting messages
   whose deadline <= now + advance as ready (readied_at = now, readied_by =
   node), earliest deadline first, skipping rows another node is claiming
   (FOR UPDATE SKIP LOCKED): two nodes never claim the same message. Returns
   the claimed messages; publish them, then call delete_fired. The time is
   the database clock.

   node       the caller's node id (a random UUID per process)
   advance    the timing advance (default 50 ms, at most 1 minute)
   max_count  batch size (default 1000)
   after      only messages with deadline >= after (default NULL: all). A relay
              passes a little less than the latest deadline it claimed, so the
              scan skips the index entries fired messages leave until VACUUM;
              it must claim without `after` now and then (and after resets), or
              a message stored with an earlier deadline waits for a peer.

   Errors: PS105 NULL node, advance outside 0..1 minute or max_count < 1. */
BEGIN
    RETURN QUERY
        SELECT * FROM pyscheduler._ready_and_claim(node, advance, max_count, clock_timestamp(), after);
END
$$;
COMMENT ON FUNCTION pyscheduler.ready_and_claim(uuid, interval, integer, timestamptz) IS
    'Delay queue: claim a batch of due messages for this node (SKIP LOCKED) and return them for firing.';

CREATE OR REPLACE FUNCTION pyscheduler.delete_fired(ids pyscheduler.message_ref[], node uuid DEFAULT NULL)
RETURNS TABLE (id text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_indexscan = on  -- see _delay_plans below
AS $$
/* delete_fired(ids, node) -> TABLE (id)

   Phase 2 of firing: delete messages whose publication the broker confirmed.
   With node, only rows this node readied are deleted (a message that was
   reset and re-claimed by a peer, or forgotten and enqueued again with the
   same id, is left alone). Returns the ids that were not deleted: normal after
   a falsely suspected failure (a peer fired the message too); log a warning. */
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH gone AS (
        DELETE FROM pyscheduler.delay_messages m
         WHERE m.id = ANY (delete_fired.ids)
           AND m.readied_at IS NOT NULL
           AND (delete_fired.node IS NULL OR m.readied_by = delete_fired.node)
        RETURNING m.id, m.readied_by, m.readied_at, greatest(extract(epoch FROM now() - m.deadline), 0) AS lag
    ), counted AS (  -- see _delay_counts below
        INSERT INTO pyscheduler._delay_counts (n) SELECT -count(*) FROM gone HAVING count(*) > 0
    ), fired AS (  -- see _delay_ready_counts below
        INSERT INTO pyscheduler._delay_ready_counts (node, readied_at, n)
        SELECT g.readied_by, g.readied_at, -count(*) FROM gone g GROUP BY g.readied_by, g.readied_at
    ), minutes AS (  -- see _delay_fired_minutes below
        INSERT INTO pyscheduler._delay_fired_minutes (minute, n, lag_sum_s, lag_max_s)
        SELECT date_trunc('minute', now()), count(*), sum(g.lag), max(g.lag) FROM gone g HAVING count(*) > 0
    ), lags AS (  -- and _delay_lag_minutes
        INSERT INTO pyscheduler._delay_lag_minutes (minute, k, n)
        SELECT date_trunc('minute', now()), pyscheduler._latency_k(make_interval(secs => g.lag)), count(*)
          FROM gone g GROUP BY 2
    )
    SELECT DISTINCT i::text FROM unnest(delete_fired.ids) i
     WHERE i IS NOT NULL AND NOT EXISTS (SELECT 1 FROM gone g WHERE g.id = i);
    IF random() < 0.02 THEN
        PERFORM pyscheduler._delay_fold_counts();
    END IF;
END
$$;
COMMENT ON FUNCTION pyscheduler.delete_fired(pyscheduler.message_ref[], uuid) IS
    'Delay queue: delete fired messages; returns the ids that were already gone (a peer fired them).';

-- _reset_stuck: reset_stuck with the clock as a parameter (p_now); granted to no role.
CREATE OR REPLACE FUNCTION pyscheduler._reset_stuck(hold interval DEFAULT '5 seconds',
                                                     max_count integer DEFAULT 10000,
                                                     p_now timestamptz DEFAULT NULL)
RETURNS TABLE (id text, suspected_node uuid, readied_at timestamptz)
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_indexscan = on  -- see _delay_plans below
AS $$
#variable_conflict use_column
BEGIN
    -- bounded: now - hold must stay a timestamp (no message is readied before 1970 anyway)
    PERFORM pyscheduler._delay_check_interval('hold', _reset_stuck.hold, false, interval '100 years');
    IF _reset_stuck.max_count IS NULL OR _reset_stuck.max_count < 1 OR p_now IS NULL THEN
        RAISE EXCEPTION 'max_count must be >= 1, got %', _reset_stuck.max_count
            USING ERRCODE = 'PS105', HINT = 'Pass max_count => 10000.';
    END IF;
    RETURN QUERY
    WITH stuck AS (   -- first query: what looks stuck, as read now
        SELECT m.id, m.readied_by, m.readied_at FROM pyscheduler.delay_messages m
         WHERE m.readied_at IS NOT NULL AND m.readied_at < p_now - _reset_stuck.hold
         ORDER BY m.readied_at
         LIMIT _reset_stuck.max_count
           FOR UPDATE SKIP LOCKED
    ), reset AS (     -- second: reset each only if unchanged since
        UPDATE pyscheduler.delay_messages m
           SET readied_at = NULL, readied_by = NULL
          FROM stuck s
         WHERE m.id = s.id AND m.readied_by = s.readied_by AND m.readied_at = s.readied_at
        RETURNING m.id, s.readied_by, s.readied_at
    ), uncounted AS ( -- see _delay_ready_counts below
        INSERT INTO pyscheduler._delay_ready_counts (node, readied_at, n)
        SELECT r.readied_by, r.readied_at, -count(*) FROM reset r GROUP BY r.readied_by, r.readied_at
    )
    SELECT r.id, r.readied_by, r.readied_at FROM reset r ORDER BY r.readied_at, r.id;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.reset_stuck(
    hold      interval    DEFAULT '5 seconds',
    max_count integer     DEFAULT 10000)
RETURNS TABLE (id text, suspected_node uuid, readied_at timestamptz)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* reset_stuck(hold, max_count) -> TABLE (id, suspected_node, readied_at)

   Failure detection and recovery: messages readied longer ago than the hold
   time (by the database clock) are stuck (their node is suspected of
   failure). Each is reset to waiting only if its readied_by and readied_at
   are still what was read, and rows being claimed or deleted right now are
   skipped. Returns one row per reset: log "suspected failure of
   {suspected_node} for message {id}".

   hold       the hold time (default 5 s)
   max_count  most rows reset per call (default 10000)

   Errors: PS105 hold not in (0, 100 years] or max_count < 1. */
BEGIN
    RETURN QUERY
        SELECT * FROM pyscheduler._reset_stuck(hold, max_count, clock_timestamp());
END
$$;
COMMENT ON FUNCTION pyscheduler.reset_stuck(interval, integer) IS
    'Delay queue: reset messages held ready longer than the hold time; returns (id, suspected node) per reset.';

CREATE OR REPLACE FUNCTION pyscheduler.next_deadline(after timestamptz DEFAULT NULL)
RETURNS timestamptz
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_indexscan = on  -- see _delay_plans below
AS $$
/* next_deadline(after) -> timestamptz

   The earliest deadline among waiting messages (NULL when none wait). Relays
   sleep until this minus the timing advance, or the poll interval, whichever
   comes first. One index probe.

   after  only deadlines >= after (default NULL: all); the relay passes the
          same bound as to ready_and_claim (see there). */
    SELECT m.deadline FROM pyscheduler.delay_messages m
     WHERE m.readied_at IS NULL AND m.deadline >= coalesce(next_deadline.after, '-infinity')
     ORDER BY m.deadline LIMIT 1;
$$;
COMMENT ON FUNCTION pyscheduler.next_deadline(timestamptz) IS
    'Delay queue: the earliest deadline among waiting messages (from an optional bound on), or NULL.';

CREATE OR REPLACE FUNCTION pyscheduler.cancel_message(id pyscheduler.message_id)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_indexscan = on  -- see _delay_plans below
AS $$
/* cancel_message(id) -> boolean

   Remove a waiting message so it never fires. True when it was waiting;
   false when there is no such message or it is already ready (being fired:
   too late to cancel). */
DECLARE
    v_gone boolean;
BEGIN
    WITH gone AS (
        DELETE FROM pyscheduler.delay_messages m
         WHERE m.id = cancel_message.id AND m.readied_at IS NULL
        RETURNING 1
    ), counted AS (  -- see _delay_counts below
        INSERT INTO pyscheduler._delay_counts (n) SELECT -count(*) FROM gone HAVING count(*) > 0
    )
    SELECT EXISTS (SELECT 1 FROM gone) INTO v_gone;
    RETURN v_gone;
END
$$;
COMMENT ON FUNCTION pyscheduler.cancel_message(pyscheduler.message_id) IS
    'Delay queue: cancel a waiting message; false when absent or already being fired.';

CREATE OR REPLACE FUNCTION pyscheduler.find_message(id pyscheduler.message_ref)
RETURNS TABLE (id text, deadline timestamptz, state text, readied_at timestamptz, readied_by uuid,
               headers integer, key_bytes integer, value_bytes integer)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* find_message(id) -> setof (id, deadline, state, readied_at, readied_by, headers, key_bytes, value_bytes)
   The stored message of that chronosMessageId (the primary key), if any:
   its deadline, state ('waiting', or 'ready': claimed by relay node
   readied_by at readied_at, being fired), how many headers it carries and
   the sizes of its key and value (never their bytes). A fired or cancelled
   message is no longer stored: no row. */
    SELECT m.id, m.deadline, CASE WHEN m.readied_at IS NULL THEN 'waiting' ELSE 'ready' END, m.readied_at,
           m.readied_by, jsonb_array_length(m.headers), octet_length(m.key), octet_length(m.value)
      FROM pyscheduler.delay_messages m
     WHERE m.id = find_message.id;
$$;
COMMENT ON FUNCTION pyscheduler.find_message(pyscheduler.message_ref) IS
    'Delay queue: a stored message''s deadline, state and sizes by its id (no bytes), or no row.';

CREATE OR REPLACE FUNCTION pyscheduler.waiting_messages(
    after_deadline timestamptz DEFAULT NULL, after_id pyscheduler.message_ref DEFAULT NULL,
    max_messages integer DEFAULT 50)
RETURNS TABLE (id text, deadline timestamptz, headers integer, key_bytes integer, value_bytes integer)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_indexscan = on  -- see _delay_plans above
AS $$
/* waiting_messages(after_deadline => NULL, after_id => NULL, max_messages => 50)
       -> setof (id, deadline, headers, key_bytes, value_bytes)
   The waiting messages (not yet claimed by a relay), soonest deadline first
   (then by id), up to max_messages: the dashboard's list of the delay queue.
   The next page: after_deadline and after_id of the last row (keyset). Read
   through delay_messages_waiting_idx in deadline order: a page reads its rows
   and the others of its first and its last deadline (ties sort by id). Sizes
   only (how many headers, the bytes of key and value), never the bytes.
   Errors: PS105 max_messages outside 1..1000, after_id without after_deadline. */
BEGIN
    IF max_messages IS NULL OR max_messages NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'max_messages must be in 1..1000, got %', coalesce(max_messages::text, 'NULL')
            USING ERRCODE = 'PS105';
    END IF;
    IF after_id IS NOT NULL AND after_deadline IS NULL THEN
        RAISE EXCEPTION 'after_id needs after_deadline (the last row''s deadline and id)' USING ERRCODE = 'PS105';
    END IF;
    RETURN QUERY
    SELECT m.id, m.deadline, jsonb_array_length(m.headers), octet_length(m.key), octet_length(m.value)
      FROM pyscheduler.delay_messages m
     WHERE m.readied_at IS NULL
       AND m.deadline >= coalesce(waiting_messages.after_deadline, '-infinity')
       AND (waiting_messages.after_deadline IS NULL
            OR (m.deadline, m.id) > (waiting_messages.after_deadline, coalesce(waiting_messages.after_id, '')))
     ORDER BY m.deadline, m.id
     LIMIT waiting_messages.max_messages;
END
$$;
COMMENT ON FUNCTION pyscheduler.waiting_messages(timestamptz, pyscheduler.message_ref, integer) IS
    'Delay queue: the waiting messages, soonest deadline first (keyset pages by deadline and id), sizes only.';

-- _delay_counts: what delay_queue counts with, instead of counting the table (design.md: a
-- read path never scans a table). Its rows sum to the number of stored messages (waiting +
-- ready). Every statement that stores or deletes messages appends one row, its delta, in its
-- own transaction (enqueue: +n, delete_fired and cancel_message: -n; a claim and a reset only
-- move messages between waiting and ready, which changes no count); appending never waits for
-- another writer, as one counter row updated by all would (a client's transaction that cancels
-- a message would hold it until it commits). One writing statement in 50 folds the deltas into
-- one row (_delay_fold_counts), so readers sum a few dozen rows. The ready messages are
-- counted in _delay_ready_counts (migration 0028), per claim: a claim appends (node, its
-- readied_at, +n), delete_fired and reset_stuck (node, readied_at, -n) for the messages of each
-- claim they end (cancel_message leaves ready messages alone); the fold keeps one row per claim
-- with messages still ready. So the readers sum the rows of the claims in flight (batch x
-- nodes, plus what a dead node held until reset_stuck), never the index entries that fired
-- messages leave in delay_messages_ready_idx until a vacuum of the whole table (200,000 at 10
-- million stored); waiting = stored - ready. delete_fired also appends (this minute, messages
-- deleted, the sum and the largest of their lags) to _delay_fired_minutes (migration 0041):
-- what activity() shows of the delay queue, which keeps nothing once a message is fired, and
-- (this minute, lag bucket, messages) to _delay_lag_minutes (migration 0046), the histogram
-- activity_latency() reads the lag's p50 and p95 from. The fold keeps one row per minute (and
-- bucket) of the last 10 minutes, where the appends go, so it reads and rewrites those minutes
-- only, not 8 days of them; a minute no fold reached within 10 minutes keeps its rows (the
-- readers sum them). It drops the minutes older than 8 days, through the minute index.

-- _delay_fold_counts(): replace the deltas no other transaction is folding by their sum.
-- Its own, not one fold for all delta tables: that needs dynamic SQL, +28 % a fold (docs/benchmarks.md).
CREATE OR REPLACE FUNCTION pyscheduler._delay_fold_counts()
RETURNS void
LANGUAGE sql
SET search_path = pyscheduler, pg_temp
AS $$
    WITH gone AS (
        DELETE FROM pyscheduler._delay_counts c
         WHERE c.ctid = ANY (ARRAY(SELECT x.ctid FROM pyscheduler._delay_counts x FOR UPDATE SKIP LOCKED))
        RETURNING c.n)
    INSERT INTO pyscheduler._delay_counts (n) SELECT sum(g.n) FROM gone g HAVING count(*) > 0;
    WITH gone AS (
        DELETE FROM pyscheduler._delay_ready_counts c
         WHERE c.ctid = ANY (ARRAY(SELECT x.ctid FROM pyscheduler._delay_ready_counts x FOR UPDATE SKIP LOCKED))
        RETURNING c.node, c.readied_at, c.n)
    INSERT INTO pyscheduler._delay_ready_counts (node, readied_at, n)
    SELECT g.node, g.readied_at, sum(g.n) FROM gone g GROUP BY g.node, g.readied_at HAVING sum(g.n) <> 0;
    -- the fired minutes and their lags: one row a minute (and bucket) of the last 10 minutes,
    -- none older than 8 days (activity() and activity_latency() read 7)
    WITH gone AS (
        DELETE FROM pyscheduler._delay_fired_minutes c
         WHERE c.ctid = ANY (ARRAY(SELECT x.ctid FROM pyscheduler._delay_fired_minutes x
                                    WHERE x.minute >= now() - interval '10 minutes' FOR UPDATE SKIP LOCKED))
        RETURNING c.minute, c.n, c.lag_sum_s, c.lag_max_s)
    INSERT INTO pyscheduler._delay_fired_minutes (minute, n, lag_sum_s, lag_max_s)
    SELECT g.minute, sum(g.n), sum(g.lag_sum_s), max(g.lag_max_s) FROM gone g GROUP BY g.minute;
    DELETE FROM pyscheduler._delay_fired_minutes c WHERE c.minute < now() - interval '8 days';
    WITH gone AS (
        DELETE FROM pyscheduler._delay_lag_minutes c
         WHERE c.ctid = ANY (ARRAY(SELECT x.ctid FROM pyscheduler._delay_lag_minutes x
                                    WHERE x.minute >= now() - interval '10 minutes' FOR UPDATE SKIP LOCKED))
        RETURNING c.minute, c.k, c.n)
    INSERT INTO pyscheduler._delay_lag_minutes (minute, k, n)
    SELECT g.minute, g.k, sum(g.n) FROM gone g GROUP BY g.minute, g.k;
    DELETE FROM pyscheduler._delay_lag_minutes c WHERE c.minute < now() - interval '8 days';
$$;

-- _delay_count_all(): the counts from the table itself, once (a database from before
-- migration 0018, or after rows were written by hand: delete the setting 'delay_counted' and
-- run pyscheduler migrate). Writers wait while it counts (SHARE lock), so none is missed.
CREATE OR REPLACE FUNCTION pyscheduler._delay_count_all()
RETURNS void
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    LOCK TABLE pyscheduler.delay_messages IN SHARE MODE;
    DELETE FROM pyscheduler._delay_counts;
    INSERT INTO pyscheduler._delay_counts (n) SELECT count(*) FROM pyscheduler.delay_messages;
    DELETE FROM pyscheduler._delay_ready_counts;
    INSERT INTO pyscheduler._delay_ready_counts (node, readied_at, n)
    SELECT m.readied_by, m.readied_at, count(*) FROM pyscheduler.delay_messages m
     WHERE m.readied_at IS NOT NULL GROUP BY m.readied_by, m.readied_at;
    INSERT INTO pyscheduler.settings (name, value) VALUES ('delay_counted', now()::text)
    ON CONFLICT (name) DO UPDATE SET value = excluded.value;
END
$$;
-- TRUNCATE (an operator emptying the queue): the counts go with the rows
CREATE OR REPLACE FUNCTION pyscheduler._delay_truncated()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    DELETE FROM pyscheduler._delay_counts;
    DELETE FROM pyscheduler._delay_ready_counts;
    RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER delay_messages_truncated AFTER TRUNCATE ON pyscheduler.delay_messages
    FOR EACH STATEMENT EXECUTE FUNCTION pyscheduler._delay_truncated();
-- in the transaction that loads the functions above (the post-apply step of migrate): not in a
-- migration, which commits before them (what the old code writes in between would go uncounted)
DO $count$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pyscheduler.settings WHERE name = 'delay_counted') THEN
        PERFORM pyscheduler._delay_count_all();
    END IF;
END
$count$;

-- The overdue count stops here: counting them all would read every overdue entry (a relay
-- down for an hour leaves millions).
CREATE OR REPLACE FUNCTION pyscheduler._delay_overdue_cap()
RETURNS bigint LANGUAGE sql IMMUTABLE SET search_path = pyscheduler, pg_temp
AS $$ SELECT 10000::bigint $$;

-- _delay_ready_claims(): the claims with messages still ready (node, readied_at, how many).
CREATE OR REPLACE FUNCTION pyscheduler._delay_ready_claims()
RETURNS TABLE (node uuid, readied_at timestamptz, n bigint)
LANGUAGE sql STABLE
AS $$
    SELECT c.node, c.readied_at, sum(c.n)::bigint FROM pyscheduler._delay_ready_counts c
     GROUP BY c.node, c.readied_at HAVING sum(c.n) <> 0;
$$;

-- _delay_queue(): the row of the delay_queue view (a function: its plans are pinned to the
-- indexes, see _delay_plans above). Read by the view's readers: granted as the view.
CREATE OR REPLACE FUNCTION pyscheduler._delay_queue(
    OUT waiting bigint, OUT ready bigint, OUT overdue bigint, OUT next_deadline timestamptz,
    OUT oldest_ready_age interval)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_indexscan = on  -- see _delay_plans above
AS $$
DECLARE
    v_oldest timestamptz;
BEGIN
    SELECT coalesce(sum(r.n), 0)::bigint, min(r.readied_at) INTO ready, v_oldest
      FROM pyscheduler._delay_ready_claims() r;
    SELECT coalesce(sum(c.n), 0)::bigint - ready INTO waiting FROM pyscheduler._delay_counts c;
    SELECT count(*) INTO overdue
      FROM (SELECT 1 FROM pyscheduler.delay_messages m WHERE m.readied_at IS NULL AND m.deadline <= now()
             LIMIT pyscheduler._delay_overdue_cap()) x;
    SELECT m.deadline INTO next_deadline FROM pyscheduler.delay_messages m
     WHERE m.readied_at IS NULL ORDER BY m.deadline LIMIT 1;
    oldest_ready_age := now() - v_oldest;
END
$$;

-- _delay_ready_by_node(): the rows of delay_ready_by_node, from delay_messages_ready_idx.
CREATE OR REPLACE FUNCTION pyscheduler._delay_ready_by_node()
RETURNS TABLE (node uuid, ready bigint, oldest_readied_at timestamptz, oldest_ready_age interval)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_indexscan = on  -- see _delay_plans above
AS $$
    SELECT r.node, sum(r.n)::bigint, min(r.readied_at), now() - min(r.readied_at)
      FROM pyscheduler._delay_ready_claims() r
     GROUP BY r.node;
$$;

-- Views for psql. now() is the transaction time of the query. Neither reads more than the
-- counts' rows (the claims in flight, the stored messages' deltas) and the head of the waiting
-- index.
CREATE OR REPLACE VIEW pyscheduler.delay_queue AS
SELECT q.waiting, q.ready, q.overdue, q.next_deadline, q.oldest_ready_age FROM pyscheduler._delay_queue() q;
COMMENT ON VIEW pyscheduler.delay_queue IS
    'Delay queue: waiting and ready counts (kept as the queue changes), overdue (counted up to 10,000), '
    'the next deadline and the age of the oldest ready message.';

CREATE OR REPLACE VIEW pyscheduler.delay_ready_by_node AS
SELECT r.node, r.ready, r.oldest_readied_at, r.oldest_ready_age FROM pyscheduler._delay_ready_by_node() r;
COMMENT ON VIEW pyscheduler.delay_ready_by_node IS
    'Delay queue: ready (claimed, not yet fired) messages per node; an old one points at a stuck node.';

-- Enqueueing, claiming and firing are the relay's job (applications publish to
-- the input topic); cancelling is the application's; monitoring reads.
SELECT pyscheduler._grant('client', 'cancel_message', 'next_deadline', 'delay_queue', 'delay_ready_by_node',
                          'find_message', 'waiting_messages');
-- the views call them for their readers
SELECT pyscheduler._grant(audience, '_delay_queue', '_delay_ready_by_node')
  FROM unnest(ARRAY['client', 'relay', 'monitor']) AS audience;
SELECT pyscheduler._grant('relay', 'enqueue_message', 'enqueue_messages', 'ready_and_claim', 'delete_fired',
                          'reset_stuck', 'next_deadline', 'delay_queue', 'delay_ready_by_node');
SELECT pyscheduler._grant('monitor', 'next_deadline', 'delay_queue', 'delay_ready_by_node', 'find_message',
                          'waiting_messages');
