-- pyscheduler: leased tasks, the worker's API: register, lease (the plain and the limited claim), heartbeat, complete, fail, abort, yield.
-- The overview (states, SQLSTATEs, limits) is at the top of 1_model.sql; the files of
-- sql/tasks/ load in name order on every migrate.
--
-- The hot path's plans are pinned: the claims (_claim_tasks, _lease_task) and the lease
-- holder's writes (_complete_task(s), _complete_and_lease, _heartbeat_tasks, _fail_leases,
-- _yield_leases) run with seq scans, bitmap scans, hash and merge joins off (the function's SET
-- lines), so whatever the statistics of the moment, tasks are reached through tasks_ready_idx in
-- claim order or by primary key: the batch writes join tasks to one row only (_by_rn: the rns
-- sorted, read as t.rn = ANY), so no join order can put a scan of tasks first. Their writes test
-- `t.status::text = 'running'`: a condition tasks_running_deadline_idx's predicate cannot be
-- proved from, so the planner cannot read that whole index (dead entries too) instead of the
-- primary key, as it did when the statistics said no task was running. A Worker's session
-- caches its plans when it starts, often on an empty queue: planned on those statistics they
-- scanned the whole table on every lease and completion once it filled (issue 31;
-- tests/tasks/test_worker_plans.py).

-- ---------------------------------------------------------------- worker

CREATE OR REPLACE FUNCTION pyscheduler.register_worker()
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
    /* register_worker() -> text
       A new unique worker id ('worker-27') from a database sequence. Ids do
       not survive the process: a restarted worker registers again. The id
       names the owner of the worker's leases; the lease token proves them. */
BEGIN
    RETURN 'worker-' || nextval('pyscheduler.worker_id_seq');
END
$$;
COMMENT ON FUNCTION pyscheduler.register_worker() IS
    'A new unique worker id (worker-<n>) from a database sequence; register once per process.';

-- _lease_gate(queue, n, p_now): what every lease call does first, for the
-- queue's own state, in one statement of two index probes (~5 us when there
-- is nothing to do): the queue's row in task_queues by primary key, and the
-- first entry of the queue in tasks_scheduled_idx. Answers 0 when the queue
-- is paused (lease nothing), 2 when it has limits (the claim takes
-- _claim_limited's path), 1 otherwise: a queue without a row, or neither
-- paused nor limited, is leased as if the table did not exist, so a limit a
-- queue does not use costs it nothing but this probe it made anyway.
-- When the first scheduled entry is due, the due scheduled tasks become
-- ready, earliest run_at first, at most greatest(n, 1000) per call, so the
-- claim that follows sees them in its own order (priority, created, seq);
-- the claim never steps over tasks that are not due yet. (A scalar subquery
-- with ORDER BY, not EXISTS: its plan is the index's first entry whatever
-- the statistics say.)
CREATE OR REPLACE FUNCTION pyscheduler._lease_gate(p_queue text, p_n integer, p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    v_gate integer;
    v_due boolean;
    v_n bigint;
BEGIN
    SELECT CASE WHEN q.paused THEN 0
                WHEN q.running_per_key IS NOT NULL OR q.running_total IS NOT NULL OR q.rate_starts IS NOT NULL THEN 2
                ELSE 1 END,
           (SELECT r.run_at FROM pyscheduler.tasks r WHERE r.queue = p_queue AND r.status = 'scheduled'
             ORDER BY r.run_at LIMIT 1) <= p_now
      INTO v_gate, v_due
      FROM (SELECT) AS one LEFT JOIN pyscheduler.task_queues q ON q.queue = p_queue;
    IF v_gate = 0 THEN
        RETURN 0;
    END IF;
    IF v_due THEN
        UPDATE pyscheduler.tasks t SET status = 'ready', updated = p_now
         WHERE t.ctid = ANY (ARRAY(  -- the row versions locked below (a TID scan, as _claim_tasks)
               SELECT r.ctid FROM pyscheduler.tasks r
                WHERE r.queue = p_queue AND r.status = 'scheduled' AND r.run_at <= p_now
                ORDER BY r.run_at
                LIMIT greatest(p_n, 1000)
                  FOR UPDATE SKIP LOCKED));
        GET DIAGNOSTICS v_n = ROW_COUNT;
        PERFORM pyscheduler._task_tally(p_queue, 'scheduled', 'ready', v_n);
    END IF;
    RETURN v_gate;
END
$$;

-- _limit_lock(queue, key): the advisory lock that serialises the counting of
-- a queue's limits: per (queue, concurrency key), or the queue's own (key
-- NULL: running_total and a per-queue rate). A 64-bit hash: two names that
-- collide only wait for each other.
CREATE OR REPLACE FUNCTION pyscheduler._limit_lock(p_queue text, p_key text)
RETURNS bigint
LANGUAGE sql IMMUTABLE
AS $$
    SELECT hashtextextended(CASE WHEN p_key IS NULL THEN 'pyscheduler.task_queue:' || p_queue
                                 ELSE 'pyscheduler.task_key:' || octet_length(p_queue) || ':' || p_queue || p_key END, 0)
$$;

-- _bucket_tokens(queue, key, starts, rate, p_now): the token bucket of a
-- rate limit (key '' for the queue's own), refilled to now and written back:
-- it holds at most starts tokens (the burst: one window's worth) and gains
-- rate tokens a second; a new bucket is full. The caller holds the bucket's
-- _limit_lock.
CREATE OR REPLACE FUNCTION pyscheduler._bucket_tokens(
    p_queue text, p_key text, p_starts integer, p_rate double precision, p_now timestamptz)
RETURNS double precision
LANGUAGE sql
AS $$
    INSERT INTO pyscheduler.task_rate_buckets AS b (queue, key, tokens, at)
    VALUES (p_queue, p_key, p_starts, p_now)
    ON CONFLICT (queue, key) DO UPDATE
       SET tokens = least(p_starts::double precision,
                          b.tokens + p_rate * greatest(0, extract(epoch FROM p_now - b.at))),
           at = greatest(b.at, p_now)
    RETURNING b.tokens;
$$;

-- _bucket_tokens_many(queue, keys, starts, rate, p_now): _bucket_tokens for
-- many keys in one statement (rows written in key order).
CREATE OR REPLACE FUNCTION pyscheduler._bucket_tokens_many(
    p_queue text, p_keys text[], p_starts integer, p_rate double precision, p_now timestamptz)
RETURNS TABLE (key text, tokens double precision)
LANGUAGE plpgsql  -- keeps its plan (a volatile SQL function is planned on every call)
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
        INSERT INTO pyscheduler.task_rate_buckets AS b (queue, key, tokens, at)
        SELECT p_queue, k, p_starts, p_now FROM unnest(p_keys) AS k ORDER BY k
        ON CONFLICT (queue, key) DO UPDATE
           SET tokens = least(p_starts::double precision,
                              b.tokens + p_rate * greatest(0, extract(epoch FROM p_now - b.at))),
               at = greatest(b.at, p_now)
        RETURNING b.key, b.tokens;
END
$$;

-- _claim_limited: the claim of a queue with limits (_lease_gate answered 2):
-- up to n ready tasks, in claim order, such that no concurrency key has more
-- than running_per_key tasks running, the queue no more than running_total,
-- and no more leases start than its rate limit's token bucket allows.
-- Running tasks are counted, not kept in counters: status running, limited
-- (leased here, or running when the limits were set) and not yielded, through
-- tasks_limited_idx; a finished, failed, yielded or reset task stops
-- counting by its own write.
-- What serialises the counting: an advisory transaction lock per (queue,
-- key), held to the commit and taken with pg_try_advisory_xact_lock before
-- counting: a key another lease is counting is skipped by this one, so
-- leases never wait for each other's keys and never deadlock; the queue's
-- own lock (running_total, a per-queue rate) is the one lock a lease waits
-- for. Each count is a new statement, so under READ COMMITTED it sees every
-- lease committed before the lock was granted (PS218 in another isolation
-- level).
-- No head-of-line blocking: the first round reads the first n + 1000 ready
-- tasks (no locks) and takes those of keys not known to be full (a hashed
-- subplan); when those were all of full keys, the next round takes the best
-- ready task of each key that is not full, by a skip scan of
-- tasks_ready_key_idx (one probe per key with ready tasks, ~6 us each,
-- however many ready tasks the full keys have). A call that leased anything
-- stops (the worker asks again). Tasks without a key in a queue with
-- per-key limits are found in the first round only (give every task of such
-- a queue a key). Aging applies only to a queue without per-key limits.
-- Every step is one statement for all the keys of a round: lock them, count
-- them, choose, update.
CREATE OR REPLACE FUNCTION pyscheduler._claim_limited(
    p_queue text, p_worker text, p_n integer, p_timeout interval, p_aging_rate double precision,
    p_aging_cap bigint, p_now timestamptz, p_secret text)
RETURNS SETOF pyscheduler.tasks
LANGUAGE plpgsql
AS $$
DECLARE
    v_q pyscheduler.task_queues;
    v_cap integer := p_n;
    v_rate double precision;
    v_per_key boolean;
    v_rate_key boolean;
    v_keyed boolean;
    v_hint text[] := '{}';      -- keys full when the call began (read without the locks)
    v_skip text[] := '{}';      -- keys whose lock another lease holds (later rounds only try)
    v_full text[] := '{}';      -- keys not to look at: v_hint, v_skip, and the keys with nothing left
    v_rns uuid[];
    v_keys text[];
    v_new text[];
    v_got text[];
    v_left_keys text[] := '{}'; -- the keys counted under their lock, and what each has left
    v_left integer[] := '{}';
    v_new_left integer[];
    v_chosen uuid[];
    v_chosen_keys text[];
    v_taken integer := 0;
    v_want integer;
    v_n integer;
    v_leased bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'queue % has limits: lease its tasks in a READ COMMITTED transaction, not %', p_queue,
                        current_setting('transaction_isolation')
            USING ERRCODE = 'PS218',
                  HINT = 'Limits are counted under a lock; an older snapshot than the lock could count too few.';
    END IF;
    SELECT * INTO v_q FROM pyscheduler.task_queues q WHERE q.queue = p_queue;
    v_per_key := v_q.running_per_key IS NOT NULL;
    v_rate_key := v_q.rate_starts IS NOT NULL AND v_q.rate_by_key;
    v_keyed := v_per_key OR v_rate_key;
    v_rate := v_q.rate_starts / extract(epoch FROM v_q.rate_per)::double precision;
    -- the queue's own limits, under the queue's lock
    IF v_q.running_total IS NOT NULL OR (v_q.rate_starts IS NOT NULL AND NOT v_q.rate_by_key) THEN
        PERFORM pg_advisory_xact_lock(pyscheduler._limit_lock(p_queue, NULL));
        IF v_q.running_total IS NOT NULL THEN
            SELECT v_q.running_total - count(*) INTO v_n FROM pyscheduler.tasks r
             WHERE r.queue = p_queue AND r.status = 'running' AND r.limited AND r.lease_token IS NOT NULL;
            v_cap := least(v_cap, v_n);
        END IF;
        IF v_q.rate_starts IS NOT NULL AND NOT v_q.rate_by_key THEN
            v_cap := least(v_cap, floor(pyscheduler._bucket_tokens(p_queue, '', v_q.rate_starts, v_rate, p_now))::integer);
        END IF;
    END IF;
    IF v_cap <= 0 THEN
        RETURN;
    END IF;
    IF v_per_key THEN
        v_hint := ARRAY(SELECT r.concurrency_key FROM pyscheduler.tasks r
                         WHERE r.queue = p_queue AND r.status = 'running' AND r.limited AND r.lease_token IS NOT NULL
                           AND r.concurrency_key IS NOT NULL
                         GROUP BY r.concurrency_key HAVING count(*) >= v_q.running_per_key);
        v_full := v_hint;
    END IF;
    FOR v_round IN 1..3 LOOP
        v_want := v_cap - v_taken;
        -- candidates in claim order, past the keys known to be full (NOT IN a subquery: a hashed
        -- lookup). First round: among the first n + 1000 ready tasks, read without locks. When those
        -- were all of full keys: the best ready task of each key that is not full (a skip scan of
        -- tasks_ready_key_idx: one probe per key with ready tasks, whatever their number).
        IF p_aging_rate <> 0 AND NOT v_keyed THEN  -- aging sorts every ready task anyway
            SELECT array_agg(c.rn ORDER BY c.o DESC, c.created, c.seq) INTO v_rns
              FROM (SELECT r.rn, r.created, r.seq,
                           greatest(r.priority, least(
                               r.priority + p_aging_rate * greatest(0, extract(epoch FROM p_now - r.updated)),
                               p_aging_cap)) AS o
                      FROM pyscheduler.tasks r
                     WHERE r.queue = p_queue AND r.status = 'ready'
                     ORDER BY 4 DESC, r.created, r.seq
                     LIMIT v_want) AS c;
        ELSIF v_round = 1 THEN
            -- read only until v_want candidates are found (whether the n + 1000 were all read is
            -- asked below, only when nothing could be taken)
            v_rns := ARRAY(SELECT s.rn
                             FROM (SELECT r.rn, r.concurrency_key FROM pyscheduler.tasks r
                                    WHERE r.queue = p_queue AND r.status = 'ready'
                                    ORDER BY r.priority DESC, r.created, r.seq
                                    LIMIT v_want + 1000) AS s
                            WHERE s.concurrency_key IS NULL OR s.concurrency_key NOT IN (SELECT unnest(v_full))
                            LIMIT v_want);
        ELSE
            WITH RECURSIVE keys(key) AS (
                (SELECT r.concurrency_key FROM pyscheduler.tasks r
                  WHERE r.queue = p_queue AND r.status = 'ready' AND r.concurrency_key IS NOT NULL
                  ORDER BY r.concurrency_key LIMIT 1)
                UNION ALL
                SELECT (SELECT r.concurrency_key FROM pyscheduler.tasks r
                         WHERE r.queue = p_queue AND r.status = 'ready' AND r.concurrency_key > keys.key
                         ORDER BY r.concurrency_key LIMIT 1)
                  FROM keys WHERE keys.key IS NOT NULL)
            SELECT array_agg(h.rn ORDER BY h.priority DESC, h.created, h.seq) INTO v_rns
              FROM (SELECT h.rn, h.priority, h.created, h.seq
                      FROM keys k
                      CROSS JOIN LATERAL (
                          SELECT r.rn, r.priority, r.created, r.seq FROM pyscheduler.tasks r
                           WHERE r.queue = p_queue AND r.status = 'ready' AND r.concurrency_key = k.key
                           ORDER BY r.priority DESC, r.created, r.seq
                           LIMIT coalesce(v_q.running_per_key, v_want)) AS h
                     WHERE k.key IS NOT NULL AND k.key NOT IN (SELECT unnest(v_full))
                     ORDER BY h.priority DESC, h.created, h.seq
                     LIMIT v_want) AS h;
        END IF;
        -- lock them (by primary key; SKIP LOCKED: another lease is taking them)
        SELECT array_agg(c.rn ORDER BY c.priority DESC, c.created, c.seq),
               array_agg(c.concurrency_key ORDER BY c.priority DESC, c.created, c.seq)
          INTO v_rns, v_keys
          FROM (SELECT r.rn, r.concurrency_key, r.priority, r.created, r.seq
                  FROM unnest(v_rns) AS u(rn) JOIN pyscheduler.tasks r ON r.rn = u.rn
                 WHERE r.status = 'ready'
                   FOR UPDATE OF r SKIP LOCKED) AS c;
        IF v_rns IS NULL THEN
            EXIT WHEN v_round > 1 OR NOT v_keyed;
            -- the first n + 1000 were all of full keys (or being taken): look past them, when there are more
            EXIT WHEN (SELECT count(*) FROM (SELECT 1 FROM pyscheduler.tasks r
                                              WHERE r.queue = p_queue AND r.status = 'ready'
                                              LIMIT v_want + 1000) AS s) < v_want + 1000;  -- nothing past them
            CONTINUE;
        END IF;
        IF v_keyed THEN
            -- the keys not counted yet, locked without waiting: a key whose lock another lease
            -- holds is skipped (that lease is counting it, and most likely takes it), so leases
            -- never wait for each other's keys and never deadlock
            v_new := ARRAY(SELECT DISTINCT k FROM unnest(v_keys) AS k
                            WHERE k IS NOT NULL AND k NOT IN (SELECT unnest(v_left_keys)));
            v_got := ARRAY(SELECT k FROM unnest(v_new) AS k
                            WHERE pg_try_advisory_xact_lock(pyscheduler._limit_lock(p_queue, k)));
            IF cardinality(v_got) < cardinality(v_new) THEN
                v_skip := v_skip || ARRAY(SELECT unnest(v_new) EXCEPT SELECT unnest(v_got));
            END IF;
            -- count them (a new statement: it sees every lease committed before the locks were granted)
            SELECT coalesce(array_agg(g.k ORDER BY g.k), '{}'), coalesce(array_agg(g.n ORDER BY g.k), '{}')
              INTO v_got, v_new_left
              FROM (SELECT u.k, CASE WHEN v_per_key THEN v_q.running_per_key - coalesce(c.n, 0)
                                     ELSE 2147483647 END::integer AS n
                      FROM unnest(v_got) AS u(k)
                      LEFT JOIN LATERAL (  -- one probe of tasks_limited_idx per key
                          SELECT count(*) AS n FROM pyscheduler.tasks r
                           WHERE r.queue = p_queue AND r.concurrency_key = u.k AND r.status = 'running'
                             AND r.limited AND r.lease_token IS NOT NULL) AS c ON true) AS g;
            IF v_rate_key AND cardinality(v_got) > 0 THEN
                SELECT array_agg(least(n.n, floor(b.tokens)::integer) ORDER BY n.k) INTO v_new_left
                  FROM unnest(v_got, v_new_left) AS n(k, n)
                  JOIN pyscheduler._bucket_tokens_many(p_queue, v_got, v_q.rate_starts, v_rate, p_now) AS b
                    ON b.key = n.k;
            END IF;
            v_left_keys := v_left_keys || v_got;
            v_left := v_left || v_new_left;
            -- the candidates that fit, in claim order: the first v_left of each key
            SELECT array_agg(x.rn), array_agg(x.k) INTO v_chosen, v_chosen_keys
              FROM (SELECT c.rn, c.k, row_number() OVER (PARTITION BY c.k ORDER BY c.o) AS nth
                      FROM unnest(v_rns, v_keys) WITH ORDINALITY AS c(rn, k, o)) AS x
              LEFT JOIN unnest(v_left_keys, v_left) AS l(k, n) ON l.k = x.k
             WHERE x.k IS NULL OR x.nth <= l.n;
        ELSE
            v_chosen := v_rns;
        END IF;
        IF v_chosen IS NOT NULL THEN
            RETURN QUERY
            UPDATE pyscheduler.tasks t
               SET status = 'running', owner = p_worker, deadline = p_now + p_timeout, updated = p_now,
                   lease_token = pyscheduler._lease_token(p_secret, t.rn), attempts = t.attempts + 1,
                   leased_at = p_now, limited = true
             WHERE t.rn = ANY (v_chosen)
            RETURNING t.*;
            GET DIAGNOSTICS v_leased = ROW_COUNT;
            PERFORM pyscheduler._task_tally(p_queue, 'ready', 'running', v_leased);
            v_taken := v_taken + cardinality(v_chosen);
        END IF;
        IF v_keyed THEN
            -- what each key has left; a key with nothing left is full for the next rounds
            SELECT array_agg(l.n - coalesce(t.c, 0)::integer ORDER BY l.i) INTO v_left
              FROM unnest(v_left_keys, v_left) WITH ORDINALITY AS l(k, n, i)
              LEFT JOIN (SELECT k, count(*) AS c FROM unnest(v_chosen_keys) AS k GROUP BY k) AS t ON t.k = l.k;
            IF v_rate_key AND v_chosen_keys IS NOT NULL THEN
                UPDATE pyscheduler.task_rate_buckets b SET tokens = b.tokens - t.c
                  FROM (SELECT k, count(*) AS c FROM unnest(v_chosen_keys) AS k WHERE k IS NOT NULL
                         GROUP BY k ORDER BY k) AS t
                 WHERE b.queue = p_queue AND b.key = t.k;
            END IF;
            v_full := v_hint || v_skip || ARRAY(SELECT l.k FROM unnest(v_left_keys, v_left) AS l(k, n) WHERE l.n <= 0);
        END IF;
        -- enough for this call once it leased anything (the worker asks again); a round that
        -- found only keys that turned out full under their locks looks again past them
        EXIT WHEN v_taken > 0 OR NOT v_keyed;
    END LOOP;
    IF v_taken > 0 AND v_q.rate_starts IS NOT NULL AND NOT v_q.rate_by_key THEN
        UPDATE pyscheduler.task_rate_buckets b SET tokens = b.tokens - v_taken
         WHERE b.queue = p_queue AND b.key = '';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler._claim_tasks(
    queue text, worker text, n integer DEFAULT 1, timeout interval DEFAULT '10 seconds',
    aging_rate double precision DEFAULT 0, aging_cap bigint DEFAULT 4294967295, p_now timestamptz DEFAULT now())
RETURNS SETOF pyscheduler.tasks
LANGUAGE plpgsql
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_hashjoin = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_timeout interval := pyscheduler._timeout(_claim_tasks.timeout);
    -- one secret per claim, the tokens derived from it (_lease_token): one
    -- gen_random_uuid() per call instead of one per task (~5 us each)
    v_secret text := gen_random_uuid()::text;
    v_gate integer;
    v_n bigint;
BEGIN
    PERFORM pyscheduler._check_task_args(p_queue => _claim_tasks.queue, p_queue_given => true,
                                         p_worker => _claim_tasks.worker, p_worker_given => true,
                                         p_aging_rate => _claim_tasks.aging_rate,
                                         p_aging_cap => _claim_tasks.aging_cap);
    IF n IS NULL OR n < 1 THEN
        RAISE EXCEPTION 'n must be at least 1, got %', coalesce(n::text, 'NULL') USING ERRCODE = 'PS208';
    END IF;
    v_gate := pyscheduler._lease_gate(_claim_tasks.queue, n, p_now);
    IF v_gate = 0 THEN
        RETURN;  -- paused
    ELSIF v_gate = 2 THEN
        RETURN QUERY SELECT * FROM pyscheduler._claim_limited(_claim_tasks.queue, _claim_tasks.worker, n, v_timeout,
                                                             aging_rate, aging_cap, p_now, v_secret);
        RETURN;
    END IF;
    -- The claim is one statement per path, written out twice on purpose: each
    -- keeps its own cached plan, and one statement measured ~1.5x faster for
    -- single-task leases than locking the rows first and updating them after.
    IF aging_rate = 0 THEN
        -- The normal claim: an index scan of tasks_ready_idx in claim order,
        -- then the rows by their ctid (a TID scan: the row versions just
        -- locked, which no one else can change before this statement ends;
        -- by primary key each cost ~5,000 more instructions a task, issue 31).
        -- A row another transaction changed after this statement began (and
        -- still ready) is locked in its new version, which the statement's
        -- snapshot does not see: it is not leased, and is left for the next.
        -- Written so that its generic plan is the right one whatever n is
        -- (see the function's SET plan_cache_mode): re-planning it on every
        -- call cost ~200 us, two thirds of a lease.
        RETURN QUERY
        UPDATE pyscheduler.tasks t
           SET status = 'running', owner = _claim_tasks.worker, deadline = p_now + v_timeout,
               updated = p_now, lease_token = pyscheduler._lease_token(v_secret, t.rn),
               attempts = t.attempts + 1, leased_at = p_now
         WHERE t.ctid = ANY (ARRAY(
               SELECT r.ctid FROM pyscheduler.tasks r
                WHERE r.queue = _claim_tasks.queue AND r.status = 'ready'
                ORDER BY r.priority DESC, r.created, r.seq
                LIMIT n
                  FOR UPDATE SKIP LOCKED))
        RETURNING t.*;
        GET DIAGNOSTICS v_n = ROW_COUNT;
    ELSE
        RETURN QUERY
        WITH c AS (
            SELECT r.ctid FROM pyscheduler.tasks r
             WHERE r.queue = _claim_tasks.queue AND r.status = 'ready'
             ORDER BY greatest(r.priority, least(
                          r.priority + aging_rate * greatest(0, extract(epoch FROM p_now - r.updated)),
                          aging_cap)) DESC,
                      r.created, r.seq
             LIMIT n
               FOR UPDATE SKIP LOCKED)
        UPDATE pyscheduler.tasks t
           SET status = 'running', owner = _claim_tasks.worker, deadline = p_now + v_timeout,
               updated = p_now, lease_token = pyscheduler._lease_token(v_secret, t.rn),
               attempts = t.attempts + 1, leased_at = p_now
          FROM c
         WHERE t.ctid = c.ctid
        RETURNING t.*;
        GET DIAGNOSTICS v_n = ROW_COUNT;
    END IF;
    PERFORM pyscheduler._task_tally(_claim_tasks.queue, 'ready', 'running', v_n);
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler._lease_tasks(
    queue text, worker text, n integer DEFAULT 1, timeout interval DEFAULT '10 seconds',
    aging_rate double precision DEFAULT 0, aging_cap bigint DEFAULT 4294967295, p_now timestamptz DEFAULT now())
RETURNS TABLE (task jsonb)
LANGUAGE plpgsql  -- keeps its plan (a volatile SQL function is planned on every call)
AS $$
BEGIN
    RETURN QUERY
        SELECT pyscheduler._leased_json(u) FROM pyscheduler._claim_tasks($1, $2, $3, $4, $5, $6, $7) AS u
         ORDER BY u.priority DESC, u.created, u.seq;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.lease_tasks(
    queue pyscheduler.queue_name, worker pyscheduler.worker_id, n integer DEFAULT 1,
    timeout interval DEFAULT '10 seconds', aging_rate double precision DEFAULT 0,
    aging_cap bigint DEFAULT 4294967295)
RETURNS TABLE (task jsonb)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* lease_tasks(queue, worker, n => 1, timeout => '10 seconds',
               aging_rate => 0, aging_cap => 4294967295) -> setof (task jsonb)
   Lease up to n ready tasks of queue: highest priority first, then oldest,
   then in submission order, skipping rows other workers are leasing (FOR
   UPDATE SKIP LOCKED). Each becomes running, owner = worker, deadline = now
   + timeout, history += TaskAssignment, and gets a new secret lease token,
   returned as the task's "token": heartbeat, complete, fail, abort and yield
   need it. Returns nothing when no task is ready, or the queue is paused
   (pause_queue). The queue's scheduled tasks that are due (run_at passed:
   delayed tasks, retries) are made ready first, so they lease in this order
   too (_lease_gate).
   timeout: more than 0, at most 1 day, no months or years.
   Fairness (off by default): with aging_rate > 0 a ready task's effective
   priority is priority + aging_rate * seconds since it became ready, capped at
   greatest(priority, aging_cap); this path sorts every ready task of the queue.
   Commits asynchronously when the call is the whole transaction (a lease lost
   in a database crash is a lease that expired); never changes the
   durability of a larger transaction.
   Errors: PS208 queue, worker, n < 1, timeout, aging_rate, aging_cap. */
BEGIN
    PERFORM _async_commit_if_alone();
    RETURN QUERY SELECT l.task FROM _lease_tasks($1, $2, $3, $4, $5, $6, now()) AS l;
END
$$;
COMMENT ON FUNCTION pyscheduler.lease_tasks(pyscheduler.queue_name, pyscheduler.worker_id, integer, interval,
    double precision, bigint) IS
    'Lease up to n ready (or due) tasks of a queue (priority desc, oldest first, SKIP LOCKED) for timeout; each with its lease token; none when paused.';

CREATE OR REPLACE FUNCTION pyscheduler._lease_tasks_lean(
    queue text, worker text, n integer DEFAULT 1, timeout interval DEFAULT '10 seconds',
    aging_rate double precision DEFAULT 0, aging_cap bigint DEFAULT 4294967295, p_now timestamptz DEFAULT now())
RETURNS TABLE (rn uuid, token uuid, spec jsonb, priority bigint, seq bigint, attempt integer)
LANGUAGE plpgsql  -- keeps its plan: as a SQL function (volatile, so not inlined) it was planned on every lease
AS $$
BEGIN
    RETURN QUERY
        SELECT u.rn, u.lease_token, u.spec, u.priority, u.seq, u.attempts
          FROM pyscheduler._claim_tasks($1, $2, $3, $4, $5, $6, $7) AS u
         ORDER BY u.priority DESC, u.created, u.seq;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.lease_tasks_lean(
    queue pyscheduler.queue_name, worker pyscheduler.worker_id, n integer DEFAULT 1,
    timeout interval DEFAULT '10 seconds', aging_rate double precision DEFAULT 0,
    aging_cap bigint DEFAULT 4294967295)
RETURNS TABLE (rn uuid, token uuid, spec jsonb, priority bigint, seq bigint, attempt integer)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* lease_tasks_lean(queue, worker, n => 1, timeout => '10 seconds',
                    aging_rate => 0, aging_cap => 4294967295)
       -> setof (rn uuid, token uuid, spec jsonb, priority bigint, seq bigint, attempt integer)
   lease_tasks with a lean answer: the same claim (same order, same
   TaskAssignment history entry, same new lease token per task), but only
   what a worker needs to run the tasks, as columns instead of the whole task
   as JSON. seq is the submission order (a worker's local queue orders by
   priority desc, then seq); attempt is this lease's attempt (1 for the
   first; the task's attempts). Commits asynchronously when it is the whole
   transaction, as lease_tasks.
   Errors: PS208 queue, worker, n < 1, timeout, aging_rate, aging_cap. */
BEGIN
    PERFORM _async_commit_if_alone();
    RETURN QUERY SELECT * FROM _lease_tasks_lean($1, $2, $3, $4, $5, $6, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.lease_tasks_lean(pyscheduler.queue_name, pyscheduler.worker_id, integer, interval,
    double precision, bigint) IS
    'lease_tasks answering only (rn, token, spec, priority, seq, attempt) per leased task: what a worker needs.';

-- _lease_task: the single-task claim of lease_task and complete_and_lease
-- (aging off): the next ready task of queue becomes running for worker, or
-- NULL. One statement with LIMIT 1 and the row fetched by primary key: its
-- generic plan is the right one, so it is planned once per session. With
-- aging (or bad aging arguments) it takes _lease_tasks' path.
CREATE OR REPLACE FUNCTION pyscheduler._lease_task(
    queue text, worker text, timeout interval DEFAULT '10 seconds', aging_rate double precision DEFAULT 0,
    aging_cap bigint DEFAULT 4294967295, p_now timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_hashjoin = off SET enable_mergejoin = off
AS $$
DECLARE
    v_task jsonb;
    v_gate integer;
BEGIN
    IF aging_rate IS DISTINCT FROM 0 OR aging_cap IS DISTINCT FROM 4294967295 THEN
        RETURN (SELECT l.task FROM pyscheduler._lease_tasks($1, $2, 1, $3, $4, $5, p_now) AS l);
    END IF;
    IF NOT (octet_length(queue) BETWEEN 1 AND 40 AND octet_length(worker) BETWEEN 1 AND 40
            AND timeout > interval '0' AND timeout <= interval '1 day'
            AND extract(month FROM timeout) = 0 AND extract(year FROM timeout) = 0) IS TRUE THEN
        PERFORM pyscheduler._check_task_args(p_queue => queue, p_queue_given => true,
                                             p_worker => worker, p_worker_given => true);
        PERFORM pyscheduler._timeout(timeout);
    END IF;
    v_gate := pyscheduler._lease_gate(queue, 1, p_now);
    IF v_gate = 0 THEN
        RETURN NULL;  -- paused
    ELSIF v_gate = 2 THEN
        RETURN (SELECT pyscheduler._leased_json(u)
                  FROM pyscheduler._claim_limited(queue, worker, 1, pyscheduler._timeout(timeout), 0, 4294967295, p_now,
                                                  gen_random_uuid()::text) AS u);
    END IF;
    UPDATE pyscheduler.tasks t
       SET status = 'running', owner = worker, updated = p_now,
           deadline = p_now + make_interval(secs => extract(epoch FROM timeout)::double precision),
           lease_token = pyscheduler._lease_token(gen_random_uuid()::text, t.rn), attempts = t.attempts + 1,
           leased_at = p_now
     WHERE t.ctid = (SELECT r.ctid FROM pyscheduler.tasks r  -- the row version locked (as _claim_tasks)
                    WHERE r.queue = $1 AND r.status = 'ready'
                    ORDER BY r.priority DESC, r.created, r.seq
                    LIMIT 1
                      FOR UPDATE SKIP LOCKED)
    RETURNING pyscheduler._leased_json(t) INTO v_task;
    IF v_task IS NOT NULL THEN
        PERFORM pyscheduler._task_tally(queue, 'ready', 'running', 1);
    END IF;
    RETURN v_task;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.lease_task(
    queue pyscheduler.queue_name, worker pyscheduler.worker_id, timeout interval DEFAULT '10 seconds',
    aging_rate double precision DEFAULT 0, aging_cap bigint DEFAULT 4294967295)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* lease_task(queue, worker, timeout => '10 seconds', aging_rate => 0,
              aging_cap => 4294967295) -> task jsonb or NULL
   lease_tasks with n => 1: the task leased (with its "token"), or NULL when
   none is ready. Commits asynchronously when it is the whole transaction,
   like lease_tasks. (Its own LIMIT 1 claim, _lease_task, whose generic plan
   the plan cache keeps.) */
BEGIN
    PERFORM _async_commit_if_alone();
    RETURN _lease_task($1, $2, $3, $4, $5, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.lease_task(pyscheduler.queue_name, pyscheduler.worker_id, interval,
    double precision, bigint) IS
    'Lease the next ready task of a queue (NULL when none), with its lease token; see lease_tasks.';

CREATE OR REPLACE FUNCTION pyscheduler._heartbeat_task(
    rn uuid, token uuid, progress double precision DEFAULT NULL, timeout interval DEFAULT '10 seconds',
    p_now timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_answer jsonb;
BEGIN
    PERFORM pyscheduler._check_progress(_heartbeat_task.progress);
    UPDATE pyscheduler.tasks t
       SET deadline = p_now + pyscheduler._timeout(_heartbeat_task.timeout), updated = p_now,
           progress = coalesce(_heartbeat_task.progress, t.progress)
     WHERE t.rn = _heartbeat_task.rn AND t.lease_token = _heartbeat_task.token AND t.status = 'running'
    RETURNING jsonb_build_object('rn', t.rn, 'status', t.status, 'progress', t.progress,
                                 'deadline', pyscheduler._ts(t.deadline)) INTO v_answer;
    IF v_answer IS NULL THEN
        PERFORM pyscheduler._timeout(_heartbeat_task.timeout);
        PERFORM pyscheduler._task_refused(_heartbeat_task.rn, _heartbeat_task.token);
    END IF;
    RETURN v_answer;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.heartbeat_task(
    rn uuid, token uuid, progress double precision DEFAULT NULL, timeout interval DEFAULT '10 seconds')
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* heartbeat_task(rn, token, progress => NULL, timeout => '10 seconds')
       -> {"rn", "status", "progress", "deadline"}
   The holder of the lease (token from the lease) extends it: deadline = now +
   timeout, and sets progress (0..1; NULL keeps it), in one statement guarded
   by the token and status = running. The answer is small on purpose (not the
   task). Commits asynchronously when it is the whole transaction, like
   lease_tasks: a heartbeat lost in a crash only makes the lease shorter.
   Errors: PS200 unknown, PS201 another lease holds it, PS202 not running,
   PS203 cancelled (stop working), PS205 progress, PS208 timeout, PS210 yielded. */
BEGIN
    PERFORM _async_commit_if_alone();
    RETURN _heartbeat_task($1, $2, $3, $4, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.heartbeat_task(uuid, uuid, double precision, interval) IS
    'The lease holder (token) extends its lease to now + timeout and reports progress; PS203 means cancelled.';

-- _check_leases(rns, tokens): PS208 unless rns and tokens are arrays of the same length.
CREATE OR REPLACE FUNCTION pyscheduler._check_leases(p_rns uuid[], p_tokens uuid[])
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_rns IS NULL OR p_tokens IS NULL OR cardinality(p_rns) <> cardinality(p_tokens) THEN
        RAISE EXCEPTION 'rns and tokens must be arrays of the same length, got % and %',
                        cardinality(p_rns), cardinality(p_tokens)
            USING ERRCODE = 'PS208', HINT = 'tokens[i] is the lease token of rns[i].';
    END IF;
END
$$;

-- _by_rn(rns): a batch write's leases in rn order, one row: sorted (rns sorted) and pos (pos[k] the
-- position of sorted[k] in the caller's arrays). The batch writes (complete_tasks, heartbeat_tasks,
-- fail_tasks, yield_tasks) update tasks FROM this row WHERE t.rn = ANY (b.sorted) and find a row's
-- lease at b.pos[width_bucket(t.rn, b.sorted)] (a binary search). t.rn = ANY is no equality
-- between the two, so the planner has no order of rn to want and no full scan of an index to
-- choose: the primary key's scan of the array is the only way to the rows, whatever estimates a
-- plan was cached with (joined to the leases row by row, a plan made on a near-empty table read
-- the whole primary key: 20,432 entries a call at 20,000 tasks; tests/tasks/test_worker_plans.py).
-- That scan locks the rows in rn order, so two batch writes wait for each other and never
-- deadlock (no ORDER BY t.rn: wanting that order would make a full scan of the primary key a plan
-- again). The arrays are read from the row, not from PL/pgSQL variables, which hold arrays
-- expanded: each width_bucket call would flatten a copy of the whole array (+4,800 instructions a
-- completed task of a batch of 800; callgrind).
CREATE OR REPLACE FUNCTION pyscheduler._by_rn(p_rns uuid[])
RETURNS TABLE (sorted uuid[], pos integer[])
LANGUAGE sql IMMUTABLE  -- inlined into the caller's statement, planned with it (one sort for both)
AS $$ SELECT array_agg(u.rn ORDER BY u.rn, u.i), array_agg(u.i::integer ORDER BY u.rn, u.i)
        FROM unnest(p_rns) WITH ORDINALITY AS u(rn, i)
       WHERE u.rn IS NOT NULL $$;  -- width_bucket refuses a NULL in its array; a NULL rn is refused (PS200)

-- _refused(rns, tokens, done): (rn, sqlstate) of each lease (rns[i], tokens[i])
-- not in done, with _refusal's code: why a batch write did not touch it (a NULL rn: PS200).
-- Nothing is read when done has them all (the common case), and its callers do not run it then:
-- the plan cache kept choosing a custom plan for that statement (folded to nothing when all were
-- written, its cost far below the generic plan's), so it was planned on every call: ~200 us a
-- batch write, two fifths of a completion of 10 (issue 31).
CREATE OR REPLACE FUNCTION pyscheduler._refused(p_rns uuid[], p_tokens uuid[], p_done uuid[])
RETURNS TABLE (rn uuid, sqlstate text)
LANGUAGE sql STABLE
AS $$
    SELECT l.rn, pyscheduler._refusal(t.status, t.lease_token, l.token)
      FROM unnest(p_rns, p_tokens) AS l(rn, token)
      LEFT JOIN pyscheduler.tasks t ON t.rn = l.rn
     WHERE cardinality(p_done) < cardinality(p_rns) AND (l.rn IS NULL OR l.rn <> ALL (p_done));
$$;

CREATE OR REPLACE FUNCTION pyscheduler._heartbeat_tasks(
    rns uuid[], tokens uuid[], progress double precision[] DEFAULT NULL, timeout interval DEFAULT '10 seconds',
    p_now timestamptz DEFAULT now())
RETURNS TABLE (rn uuid, sqlstate text)
LANGUAGE plpgsql
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_hashjoin = off SET enable_mergejoin = off
AS $$
#variable_conflict use_column
DECLARE
    v_deadline timestamptz := p_now + pyscheduler._timeout(_heartbeat_tasks.timeout);
    v_done uuid[];
    v_bad double precision;
BEGIN
    PERFORM pyscheduler._check_leases(rns, tokens);
    IF _heartbeat_tasks.progress IS NOT NULL THEN
        IF cardinality(_heartbeat_tasks.progress) <> cardinality(rns) THEN
            RAISE EXCEPTION 'progress must be NULL or an array as long as rns, got % and %',
                            cardinality(_heartbeat_tasks.progress), cardinality(rns)
                USING ERRCODE = 'PS208', HINT = 'progress[i] is the progress of rns[i] (NULL keeps it).';
        END IF;
        SELECT p INTO v_bad FROM unnest(_heartbeat_tasks.progress) p WHERE NOT (p >= 0 AND p <= 1) LIMIT 1;
        PERFORM pyscheduler._check_progress(v_bad);
    END IF;
    WITH beat AS (
        UPDATE pyscheduler.tasks t
           SET deadline = v_deadline, updated = p_now,
               progress = coalesce(_heartbeat_tasks.progress[b.pos[width_bucket(t.rn, b.sorted)]], t.progress)
          FROM pyscheduler._by_rn(rns) AS b  -- see _by_rn
         WHERE t.rn = ANY (b.sorted) AND t.lease_token = tokens[b.pos[width_bucket(t.rn, b.sorted)]]
           AND t.status::text = 'running'
        RETURNING t.rn)
    SELECT coalesce(array_agg(b.rn), '{}') INTO v_done FROM beat b;
    -- the rest were not touched by the update above: the state machine says why
    IF cardinality(v_done) < cardinality(rns) THEN  -- some were refused: see _refused
        RETURN QUERY SELECT * FROM pyscheduler._refused(rns, tokens, v_done);
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.heartbeat_tasks(
    rns uuid[], tokens uuid[], progress double precision[] DEFAULT NULL, timeout interval DEFAULT '10 seconds')
RETURNS TABLE (rn uuid, sqlstate text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* heartbeat_tasks(rns, tokens, progress => NULL, timeout => '10 seconds')
       -> setof (rn uuid, sqlstate text)
   The batch form of heartbeat_task, in one statement: extends to now +
   timeout every lease (rns[i], tokens[i]) whose task is running under that
   token, and sets its progress to progress[i] (NULL, or a NULL progress
   array, keeps it). Returns one row per lease it did NOT extend, with the
   SQLSTATE heartbeat_task would have raised for it (PS200, PS201, PS202,
   PS203 cancelled: stop, PS210); no rows means every lease was extended.
   Commits asynchronously when it is the whole transaction, as heartbeat_task.
   Errors: PS205 a progress outside 0..1, PS208 arrays of different lengths,
   timeout. */
BEGIN
    PERFORM _async_commit_if_alone();
    RETURN QUERY SELECT * FROM _heartbeat_tasks($1, $2, $3, $4, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.heartbeat_tasks(uuid[], uuid[], double precision[], interval) IS
    'Extend many leases (rns[i] with token tokens[i]) in one statement; returns (rn, sqlstate) for each refused.';

-- Queues that keep no completed tasks (set_queue_keep_completed, 0053): a completion deletes the
-- task unless someone watches it or it has children (those are kept: _finished needs them).
-- _task_gone(queues, ks, rns, from, now): what follows the DELETE: a row per queue and latency
-- bucket in _task_done_log (what activity() would have read from the rows), the tallies (from
-- status `from` to none), and what the durable task functions recorded for them.
CREATE OR REPLACE FUNCTION pyscheduler._task_gone(
    p_queues text[], p_ks smallint[], p_rns uuid[], p_from pyscheduler.task_status, p_now timestamptz)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO pyscheduler._task_done_log (at, queue, k, n)
    SELECT p_now, g.queue, g.k, count(*) FROM unnest(p_queues, p_ks) AS g(queue, k) GROUP BY 2, 3;
    PERFORM pyscheduler._task_tally_many(p_queues, p_from, NULL);
    DELETE FROM pyscheduler.task_checkpoints c WHERE c.rn = ANY (p_rns);
    DELETE FROM pyscheduler.task_waits w WHERE w.rn = ANY (p_rns);
END
$$;

-- _complete_deleting(rns, tokens, now): a batch completion's first step: of the leases (rns[i],
-- tokens[i]) held on running tasks of such queues, the tasks deleted instead of completed
-- (nothing is read but the queues' partial index when every queue keeps them); returns their
-- rns. The UPDATE that follows completes the rest (it no longer sees these).
CREATE OR REPLACE FUNCTION pyscheduler._complete_deleting(p_rns uuid[], p_tokens uuid[], p_now timestamptz)
RETURNS uuid[]
LANGUAGE plpgsql
AS $$
DECLARE
    v_queues text[];
    v_gone record;
BEGIN
    SELECT array_agg(q.queue) INTO v_queues FROM pyscheduler.task_queues q WHERE NOT q.keep_completed;
    IF v_queues IS NULL THEN
        RETURN '{}';
    END IF;
    WITH gone AS (
        DELETE FROM pyscheduler.tasks t
         USING pyscheduler._by_rn(p_rns) AS b  -- see _by_rn
         WHERE t.rn = ANY (b.sorted) AND t.lease_token = p_tokens[b.pos[width_bucket(t.rn, b.sorted)]]
           AND t.status::text = 'running'
           AND t.queue = ANY (v_queues) AND NOT t.watched AND NOT t.has_children
        RETURNING t.rn, t.queue,
                  pyscheduler._latency_k(greatest(t.leased_at - coalesce(t.run_at, t.created), interval '0')) AS k)
    SELECT array_agg(g.rn) AS rns, array_agg(g.queue) AS queues, array_agg(g.k) AS ks INTO v_gone FROM gone g;
    IF v_gone.rns IS NULL THEN
        RETURN '{}';
    END IF;
    PERFORM pyscheduler._task_gone(v_gone.queues, v_gone.ks, v_gone.rns, 'running', p_now);
    RETURN v_gone.rns;
END
$$;

-- _completed_deleted(rn, queue, now): complete_task's last step (its answer is the completed
-- task, so it updates first): the task deleted if its queue keeps no completed tasks and it is
-- neither watched nor a parent. complete_tasks and complete_and_lease delete first instead.
CREATE OR REPLACE FUNCTION pyscheduler._completed_deleted(p_rn uuid, p_queue text, p_now timestamptz)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_k smallint;
BEGIN
    PERFORM 1 FROM pyscheduler.task_queues q WHERE q.queue = p_queue AND NOT q.keep_completed;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    DELETE FROM pyscheduler.tasks t
     WHERE t.rn = p_rn AND t.status::text = 'completed' AND NOT t.watched AND NOT t.has_children
    RETURNING pyscheduler._latency_k(greatest(t.leased_at - coalesce(t.run_at, t.created), interval '0')) INTO v_k;
    IF FOUND THEN
        PERFORM pyscheduler._task_gone(ARRAY[p_queue], ARRAY[v_k], ARRAY[p_rn], 'completed', p_now);
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler._complete_task(
    rn uuid, token uuid, result jsonb DEFAULT NULL, p_now timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_hashjoin = off SET enable_mergejoin = off
AS $$
#variable_conflict use_column
DECLARE
    v_task jsonb;
    v_more boolean;
    v_limited boolean;
BEGIN
    PERFORM pyscheduler._check_result(_complete_task.result);
    UPDATE pyscheduler.tasks t
       SET status = 'completed', progress = 1, deadline = NULL, updated = p_now, result = _complete_task.result
     WHERE t.rn = _complete_task.rn AND t.lease_token = _complete_task.token AND t.status::text = 'running'
    RETURNING pyscheduler._task_json(t), t.watched OR t.has_children, t.limited INTO v_task, v_more, v_limited;
    IF v_task IS NULL THEN
        PERFORM pyscheduler._task_refused(_complete_task.rn, _complete_task.token);
    END IF;
    PERFORM pyscheduler._task_tally(v_task ->> 'queue', 'running', 'completed', 1);
    IF v_more THEN
        PERFORM pyscheduler._finished(ARRAY[_complete_task.rn], p_now);
    ELSE
        PERFORM pyscheduler._completed_deleted(_complete_task.rn, v_task ->> 'queue', p_now);
    END IF;
    RETURN v_task;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.complete_task(rn uuid, token uuid, result pyscheduler.task_result DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql  -- keeps its plan: a SQL function is planned on every call (~40 us)
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* complete_task(rn, token, result => NULL) -> task jsonb
   The lease holder finishes a running task: completed, progress 1.0, result
   stored (any JSON value, at most task_max_result_bytes; get_task shows it).
   A task cancelled meanwhile stays cancelled (PS203). Called inside the
   application's own transaction, next to its writes, it makes them and the
   completion one atomic change: the task's row stays locked until that
   transaction ends, so a lease lost before (PS201, PS202, ...) fails the
   transaction and its writes roll back; after it, the lease cannot be lost
   before the commit. Wakes whoever watches the task (watch_task) and makes
   its dependents ready.
   Errors: PS200 unknown, PS201 another lease holds it, PS202 not running,
   PS203 cancelled, PS210 yielded, PS217 result too large. */
BEGIN
    RETURN pyscheduler._complete_task(rn, token, result, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.complete_task(uuid, uuid, pyscheduler.task_result) IS
    'The lease holder (token) marks a running task completed (progress 1.0) with an optional JSON result; PS203 if it was cancelled meanwhile.';

CREATE OR REPLACE FUNCTION pyscheduler._complete_tasks(
    rns uuid[], tokens uuid[], results jsonb DEFAULT NULL, p_now timestamptz DEFAULT now())
RETURNS TABLE (rn uuid, sqlstate text)
LANGUAGE plpgsql
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_hashjoin = off SET enable_mergejoin = off
AS $$
#variable_conflict use_column
DECLARE
    v_done uuid[];
    v_gone uuid[];
    v_more uuid[];
    v_bad record;
BEGIN
    PERFORM pyscheduler._check_leases(rns, tokens);
    IF results IS NOT NULL THEN
        IF jsonb_typeof(results) <> 'array' OR jsonb_array_length(results) <> cardinality(rns) THEN
            RAISE EXCEPTION 'results must be NULL or a JSON array of one result per rn, got % for % rns',
                            left(results::text, 200), cardinality(rns)
                USING ERRCODE = 'PS208', HINT = 'results -> (i - 1) is the result of rns[i] (null: none).';
        END IF;
        SELECT e, i INTO v_bad FROM jsonb_array_elements(results) WITH ORDINALITY AS a(e, i)
         WHERE pg_column_size(e) > pyscheduler._task_limit('task_max_result_bytes') LIMIT 1;
        IF FOUND THEN
            PERFORM pyscheduler._check_result(v_bad.e, format('results[%s]', v_bad.i - 1));
        END IF;
    END IF;
    v_gone := pyscheduler._complete_deleting(rns, tokens, p_now);
    IF cardinality(v_gone) = cardinality(rns) THEN  -- all deleted: nothing left to update
        v_done := '{}';
    ELSE
        WITH done AS (
            UPDATE pyscheduler.tasks t
               SET status = 'completed', progress = 1, deadline = NULL, updated = p_now,
                   result = CASE WHEN results IS NULL THEN t.result
                                 ELSE results -> (b.pos[width_bucket(t.rn, b.sorted)] - 1) END
              FROM pyscheduler._by_rn(rns) AS b  -- see _by_rn
             WHERE t.rn = ANY (b.sorted) AND t.lease_token = tokens[b.pos[width_bucket(t.rn, b.sorted)]]
               AND t.status::text = 'running'
            RETURNING t.rn, t.queue, t.watched OR t.has_children AS more),
        counted AS (  -- the tallies (1_model.sql, "Counts"), in this statement: the Worker's path
            INSERT INTO pyscheduler._task_tallies (queue, status, n)
            SELECT c.queue, v.status, v.n * c.c
              FROM (SELECT d.queue, count(*) AS c FROM done d GROUP BY d.queue) AS c,
                   LATERAL (VALUES ('running'::pyscheduler.task_status, -1), ('completed', 1)) AS v(status, n))
        SELECT coalesce(array_agg(d.rn), '{}'), array_agg(d.rn) FILTER (WHERE d.more) INTO v_done, v_more FROM done d;
    END IF;
    IF random() < pyscheduler._task_fold_chance() THEN
        PERFORM pyscheduler._task_fold_tallies();
    END IF;
    IF v_more IS NOT NULL THEN  -- the rare tasks someone waits for, or with children
        SELECT array_agg(t.rn) FILTER (WHERE t.watched OR t.has_children)
          INTO v_more FROM pyscheduler.tasks t WHERE t.rn = ANY (v_more);
        IF v_more IS NOT NULL THEN
            PERFORM pyscheduler._finished(v_more, p_now);
        END IF;
    END IF;
    v_done := v_gone || v_done;
    -- the rest were not touched by the update above: the state machine says why
    IF cardinality(v_done) < cardinality(rns) THEN  -- some were refused: see _refused
        RETURN QUERY SELECT * FROM pyscheduler._refused(rns, tokens, v_done);
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.complete_tasks(
    rns uuid[], tokens uuid[], results pyscheduler.task_results DEFAULT NULL)
RETURNS TABLE (rn uuid, sqlstate text)
LANGUAGE plpgsql  -- keeps its plan: a SQL function is planned on every call (~40 us)
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* complete_tasks(rns, tokens, results => NULL) -> setof (rn uuid, sqlstate text)
   The batch form of complete_task, in one statement: completes every task
   rns[i] whose current lease has token tokens[i] and that is running, with
   the result results -> (i - 1) (results NULL: none).
   Returns one row per task it did NOT complete, with the SQLSTATE
   complete_task would have raised for it (PS200, PS201, PS202, PS203, PS210);
   no rows means all were completed. Errors: PS208 arrays (or results) of
   different lengths, PS217 a result too large (named). */
BEGIN
    RETURN QUERY SELECT * FROM pyscheduler._complete_tasks(rns, tokens, results, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.complete_tasks(uuid[], uuid[], pyscheduler.task_results) IS
    'Complete many leased tasks (rns[i] with token tokens[i], result results[i-1]) in one statement; returns (rn, sqlstate) for each not completed.';

CREATE OR REPLACE FUNCTION pyscheduler._complete_and_lease(
    worker text, queue text, rn uuid DEFAULT NULL, token uuid DEFAULT NULL, timeout interval DEFAULT '10 seconds',
    aging_rate double precision DEFAULT 0, aging_cap bigint DEFAULT 4294967295, result jsonb DEFAULT NULL,
    p_now timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_hashjoin = off SET enable_mergejoin = off
AS $$
#variable_conflict use_column
DECLARE
    v_more boolean;
    v_queue text;
BEGIN
    IF _complete_and_lease.rn IS NOT NULL THEN
        PERFORM pyscheduler._check_result(_complete_and_lease.result);
        -- deleted, not updated, on a queue that keeps no completed tasks (as complete_tasks)
        IF cardinality(pyscheduler._complete_deleting(ARRAY[_complete_and_lease.rn],
                                                      ARRAY[_complete_and_lease.token], p_now)) = 0 THEN
            UPDATE pyscheduler.tasks t
               SET status = 'completed', progress = 1, deadline = NULL, updated = p_now,
                   result = _complete_and_lease.result
             WHERE t.rn = _complete_and_lease.rn AND t.lease_token = _complete_and_lease.token
               AND t.status::text = 'running'
            RETURNING t.watched OR t.has_children, t.queue INTO v_more, v_queue;
            IF NOT FOUND THEN
                PERFORM pyscheduler._task_refused(_complete_and_lease.rn, _complete_and_lease.token);
            END IF;
            PERFORM pyscheduler._task_tally(v_queue, 'running', 'completed', 1);
            IF v_more THEN
                PERFORM pyscheduler._finished(ARRAY[_complete_and_lease.rn], p_now);
            END IF;
        END IF;
    END IF;
    RETURN pyscheduler._lease_task(_complete_and_lease.queue, _complete_and_lease.worker,
                                   _complete_and_lease.timeout, _complete_and_lease.aging_rate,
                                   _complete_and_lease.aging_cap, p_now);
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.complete_and_lease(
    worker pyscheduler.worker_id, queue pyscheduler.queue_name, rn uuid DEFAULT NULL, token uuid DEFAULT NULL,
    timeout interval DEFAULT '10 seconds', aging_rate double precision DEFAULT 0,
    aging_cap bigint DEFAULT 4294967295, result pyscheduler.task_result DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* complete_and_lease(worker, queue, rn => NULL, token => NULL, timeout => '10 seconds',
                      aging_rate => 0, aging_cap => 4294967295, result => NULL)
       -> task jsonb or NULL
   A single-task worker's loop in one transaction per task: complete_task(rn,
   token, result), then lease_task(queue, worker, timeout, ...) — the next task
   leased (with its new token), or NULL when none is ready. rn NULL leases
   only (the first call). Each task still completed on its own with the
   seed's semantics. The transaction commits durably (the completion's);
   with rn NULL asynchronously when it is the whole transaction. If the
   completion is refused nothing is leased:
   Errors: PS200 unknown, PS201 another lease holds it, PS202 not running,
   PS203 cancelled (the task stays cancelled), PS210 yielded, PS217 result,
   and lease_task's PS208. */
BEGIN
    IF rn IS NULL THEN
        PERFORM _async_commit_if_alone();  -- a lease only, as lease_task
    END IF;
    RETURN _complete_and_lease(worker, queue, rn, token, timeout, aging_rate, aging_cap, result, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.complete_and_lease(pyscheduler.worker_id, pyscheduler.queue_name, uuid, uuid,
    interval, double precision, bigint, pyscheduler.task_result) IS
    'Complete the held task (rn, token; NULL: none) and lease the next ready task of a queue, in one transaction; NULL when none.';

CREATE OR REPLACE FUNCTION pyscheduler._abort_task(rn uuid, token uuid, errors jsonb, p_now timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_errors jsonb := pyscheduler._check_errors(_abort_task.errors);
    v_task jsonb;
    v_more boolean;
    v_limited boolean;
BEGIN
    UPDATE pyscheduler.tasks t
       SET status = 'aborted', deadline = NULL, updated = p_now,
           errors = pyscheduler._capped_errors(t.errors || v_errors, pyscheduler._task_limit('task_max_errors'),
                                               pyscheduler._task_limit('task_max_errors_bytes'))
     WHERE t.rn = _abort_task.rn AND t.lease_token = _abort_task.token AND t.status = 'running'
    RETURNING pyscheduler._task_json(t), t.watched OR t.has_children, t.limited INTO v_task, v_more, v_limited;
    IF v_task IS NULL THEN
        PERFORM pyscheduler._task_refused(_abort_task.rn, _abort_task.token);
    END IF;
    PERFORM pyscheduler._task_tally(v_task ->> 'queue', 'running', 'aborted', 1);
    IF v_more THEN
        PERFORM pyscheduler._finished(ARRAY[_abort_task.rn], p_now);
    END IF;
    RETURN v_task;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.abort_task(rn uuid, token uuid, errors pyscheduler.task_errors)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* abort_task(rn, token, errors) -> task jsonb
   The lease holder gives up on a running task for good: aborted, errors
   appended to those of earlier failed attempts (never retried; retry_task
   requeues it by hand).
   errors: a non-empty JSON array of {"code": text, "args": object,
   "description": text} (args and description optional; stored as {} and ""),
   at most task_max_errors entries and task_max_errors_bytes bytes.
   Errors: PS200 unknown, PS201 another lease holds it, PS202 not running,
   PS203 cancelled (the task stays cancelled), PS207 errors, PS210 yielded. */
BEGIN
    RETURN pyscheduler._abort_task(rn, token, errors, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.abort_task(uuid, uuid, pyscheduler.task_errors) IS
    'The lease holder (token) aborts a running task with errors [{code, args, description}]; terminal, never retried.';

-- _fail_tasks: THE failure of a lease (fail_task, fail_tasks): each lease
-- (rns[i], tokens[i]) whose task is running under that token gets errors[i]
-- appended and is retried after retry_in[i] (NULL: the default backoff), or
-- is aborted when it has used its max_attempts. Rows are locked in rn order
-- (see _by_rn). Returns the rns it failed.
CREATE OR REPLACE FUNCTION pyscheduler._fail_leases(
    rns uuid[], tokens uuid[], errors jsonb, retry_in interval[], p_now timestamptz)
RETURNS uuid[]
LANGUAGE plpgsql
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_hashjoin = off SET enable_mergejoin = off
AS $$
#variable_conflict use_column
DECLARE
    v_bad record;
    v_max_attempts integer := pyscheduler._task_limit('task_max_attempts');
    v_max_errors integer := pyscheduler._task_limit('task_max_errors');
    v_max_bytes integer := pyscheduler._task_limit('task_max_errors_bytes');
    v_history integer := pyscheduler._task_limit('task_max_history');
    v_base double precision := extract(epoch FROM pyscheduler._setting('task_backoff_base')::interval);
    v_cap double precision := extract(epoch FROM pyscheduler._setting('task_backoff_cap')::interval);
    v_done uuid[];
    v_queues text[];
    v_more uuid[];
    v_moved text[];
    v_to pyscheduler.task_status[];
    v_delays interval[];  -- per lease, as the caller's arrays: retry_in in seconds, and a jitter
    v_jitters double precision[];
BEGIN
    PERFORM pyscheduler._check_leases(rns, tokens);
    IF errors IS NULL OR jsonb_typeof(errors) <> 'array' OR jsonb_array_length(errors) <> cardinality(rns) THEN
        RAISE EXCEPTION 'errors must be a JSON array of one error object per rn, got % for % rns',
                        coalesce(left(errors::text, 200), 'NULL'), cardinality(rns)
            USING ERRCODE = 'PS207', HINT = 'errors -> (i - 1) is the error of rns[i], {"code", "args", "description"}.';
    END IF;
    IF retry_in IS NOT NULL AND cardinality(retry_in) <> cardinality(rns) THEN
        RAISE EXCEPTION 'retry_in must be NULL or as long as rns, got % and %', cardinality(retry_in), cardinality(rns)
            USING ERRCODE = 'PS208', HINT = 'retry_in[i] is the delay of rns[i] (NULL: the default backoff).';
    END IF;
    SELECT d, i INTO v_bad FROM unnest(retry_in) WITH ORDINALITY AS u(d, i)
     WHERE d IS NOT NULL AND NOT extract(epoch FROM d) BETWEEN 0 AND 31536000 LIMIT 1;  -- 365 days, as seconds
    IF FOUND THEN
        RAISE EXCEPTION 'retry_in must be between 0 and 365 days, got %', v_bad.d
            USING ERRCODE = 'PS212', HINT = 'NULL: the default backoff; 0: ready again at once.';
    END IF;
    -- every error checked (PS207 names the first bad one): a batch is failed whole or not at all
    SELECT e, i INTO v_bad FROM jsonb_array_elements(errors) WITH ORDINALITY AS a(e, i)
     WHERE pyscheduler._bad_error(e) OR pg_column_size(e) > v_max_bytes LIMIT 1;
    IF FOUND THEN
        PERFORM pyscheduler._check_errors(jsonb_build_array(v_bad.e), format('errors[%s]', v_bad.i - 1));
    END IF;
    SELECT array_agg(make_interval(secs => extract(epoch FROM retry_in[u.i])::double precision) ORDER BY u.i),
           array_agg(0.5 + random() ORDER BY u.i)
      INTO v_delays, v_jitters FROM unnest(rns) WITH ORDINALITY AS u(rn, i);
    WITH u AS (
        UPDATE pyscheduler.tasks t
           SET status = CASE WHEN t.attempts >= coalesce(t.max_attempts, v_max_attempts) THEN 'aborted'
                             WHEN pyscheduler._retry_at(t.attempts, v_delays[b.pos[width_bucket(t.rn, b.sorted)]],
                                                        v_jitters[b.pos[width_bucket(t.rn, b.sorted)]],
                                                        v_base, v_cap, p_now) > p_now
                                 THEN 'scheduled'
                             ELSE 'ready' END::pyscheduler.task_status,
               errors = pyscheduler._capped_errors(
                            t.errors
                            || pyscheduler._error_entry(_fail_leases.errors -> (b.pos[width_bucket(t.rn, b.sorted)] - 1))
                            || CASE WHEN t.attempts >= coalesce(t.max_attempts, v_max_attempts) THEN jsonb_build_object(
                                   'code', 'TaskMaxAttempts',
                                   'args', jsonb_build_object('attempts', t.attempts,
                                                              'max_attempts', coalesce(t.max_attempts, v_max_attempts)),
                                   'description', format('attempt %s of %s failed', t.attempts,
                                                         coalesce(t.max_attempts, v_max_attempts)))
                               ELSE '[]' END,
                            v_max_errors, v_max_bytes),
               deadline = NULL, updated = p_now,
               -- aborted: as abort_task. Retried: back in the queue without an owner
               -- or a lease; history += the lease's TaskAssignment, TaskRetry.
               run_at = CASE WHEN t.attempts >= coalesce(t.max_attempts, v_max_attempts) THEN t.run_at
                             ELSE pyscheduler._retry_at(t.attempts, v_delays[b.pos[width_bucket(t.rn, b.sorted)]],
                                                        v_jitters[b.pos[width_bucket(t.rn, b.sorted)]],
                                                        v_base, v_cap, p_now) END,
               owner = CASE WHEN t.attempts >= coalesce(t.max_attempts, v_max_attempts) THEN t.owner END,
               progress = CASE WHEN t.attempts >= coalesce(t.max_attempts, v_max_attempts) THEN t.progress ELSE 0 END,
               lease_token = CASE WHEN t.attempts >= coalesce(t.max_attempts, v_max_attempts) THEN t.lease_token END,
               leased_at = CASE WHEN t.attempts >= coalesce(t.max_attempts, v_max_attempts) THEN t.leased_at END,
               history = CASE WHEN t.attempts >= coalesce(t.max_attempts, v_max_attempts) THEN t.history
                         ELSE pyscheduler._trim_history(
                             pyscheduler._full_history(t.history, t.owner, t.leased_at)
                             || jsonb_build_array(jsonb_build_object(
                                    '_typ', 'TaskRetry', 'worker', t.owner, 'progress', t.progress,
                                    'attempt', t.attempts,
                                    'run_at', pyscheduler._ts(pyscheduler._retry_at(
                                        t.attempts, v_delays[b.pos[width_bucket(t.rn, b.sorted)]],
                                        v_jitters[b.pos[width_bucket(t.rn, b.sorted)]], v_base, v_cap, p_now)),
                                    'time', pyscheduler._ts(p_now))),
                             v_history) END
          FROM pyscheduler._by_rn(rns) AS b  -- see _by_rn
         WHERE t.rn = ANY (b.sorted) AND t.lease_token = tokens[b.pos[width_bucket(t.rn, b.sorted)]]
           AND t.status::text = 'running'
        RETURNING t.rn, t.queue, t.status, t.watched OR t.has_children AS more, t.limited)
    SELECT coalesce(array_agg(u.rn), '{}'),
           coalesce(array_agg(DISTINCT u.queue) FILTER (WHERE u.status <> 'aborted' OR u.limited), '{}'),
           array_agg(u.rn) FILTER (WHERE u.status = 'aborted' AND u.more),
           array_agg(u.queue), array_agg(u.status)
      INTO v_done, v_queues, v_more, v_moved, v_to FROM u;
    PERFORM pyscheduler._task_tally_many(v_moved, 'running', NULL, p_tos => v_to);
    IF v_more IS NOT NULL THEN
        PERFORM pyscheduler._finished(v_more, p_now);
    END IF;
    PERFORM pyscheduler._notify_throttled(pyscheduler._task_channel(q)) FROM unnest(v_queues) q;
    RETURN v_done;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler._fail_task(
    rn uuid, token uuid, error jsonb, retry_in interval DEFAULT NULL, p_now timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_task jsonb;
BEGIN
    IF cardinality(pyscheduler._fail_leases(ARRAY[_fail_task.rn], ARRAY[_fail_task.token],
                                            jsonb_build_array(_fail_task.error), ARRAY[_fail_task.retry_in],
                                            p_now)) = 0 THEN
        PERFORM pyscheduler._task_refused(_fail_task.rn, _fail_task.token);
    END IF;
    SELECT pyscheduler._task_json(t) INTO v_task FROM pyscheduler.tasks t WHERE t.rn = _fail_task.rn;
    RETURN v_task;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.fail_task(
    rn uuid, token uuid, error pyscheduler.task_error, retry_in interval DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* fail_task(rn, token, error, retry_in => NULL) -> task jsonb
   The lease holder reports that this attempt failed and the task should be
   tried again: error (one {"code", "args", "description"} object, as in
   abort_task) is appended to errors, history += the lease's TaskAssignment
   and TaskRetry {"worker", "progress", "attempt", "run_at", "time"}, and the
   task is back in its queue without owner or lease, 'scheduled' until
   run_at = now + retry_in (0: ready at once), or by default now + the
   backoff least(task_backoff_base * 2^attempt, task_backoff_cap) * a random
   factor in [0.5, 1.5) (settings; 1 s and 1 hour: 1-3 s after the first
   attempt, 2-6 s after the second, ...). A task that has used its attempts
   (max_attempts, or the setting task_max_attempts) is aborted instead, with
   its errors and a last one {"code": "TaskMaxAttempts"}. The lease's token
   is refused from then on. Wakes the queue's idle workers.
   Errors: PS200 unknown, PS201 another lease holds it, PS202 not running,
   PS203 cancelled (the task stays cancelled), PS207 error, PS210 yielded,
   PS212 retry_in outside 0..365 days. */
BEGIN
    RETURN pyscheduler._fail_task(rn, token, error, retry_in, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.fail_task(uuid, uuid, pyscheduler.task_error, interval) IS
    'The lease holder (token) fails this attempt: error appended, retried after retry_in or the backoff; aborted after max_attempts.';

CREATE OR REPLACE FUNCTION pyscheduler._fail_tasks(
    rns uuid[], tokens uuid[], errors jsonb, retry_in interval[] DEFAULT NULL, p_now timestamptz DEFAULT now())
RETURNS TABLE (rn uuid, sqlstate text)
LANGUAGE plpgsql  -- as a SQL function, _refused was not inlined (its argument _fail_leases is volatile): ~250 us a call
AS $$
DECLARE
    v_done uuid[] := pyscheduler._fail_leases(rns, tokens, errors, retry_in, p_now);
BEGIN
    IF cardinality(v_done) < cardinality(rns) THEN  -- some were refused: see _refused
        RETURN QUERY SELECT * FROM pyscheduler._refused(rns, tokens, v_done);
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.fail_tasks(
    rns uuid[], tokens uuid[], errors pyscheduler.task_errors, retry_in interval[] DEFAULT NULL)
RETURNS TABLE (rn uuid, sqlstate text)
LANGUAGE plpgsql  -- keeps its plan: a SQL function is planned on every call (~40 us)
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* fail_tasks(rns, tokens, errors, retry_in => NULL) -> setof (rn uuid, sqlstate text)
   The batch form of fail_task, in one statement: fails every lease (rns[i],
   tokens[i]) whose task is running under that token, with the error
   errors -> (i - 1) and the delay retry_in[i] (NULL, or no array: the
   default backoff). Returns one row per lease it did NOT fail, with the
   SQLSTATE fail_task would have raised for it (PS200, PS201, PS202, PS203,
   PS210); no rows means all were failed. Errors: PS207 errors not an array
   of as many error objects (the first bad one is named), PS208 arrays of
   different lengths, PS212 a retry_in outside 0..365 days. */
BEGIN
    RETURN QUERY SELECT * FROM pyscheduler._fail_tasks(rns, tokens, errors, retry_in, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.fail_tasks(uuid[], uuid[], pyscheduler.task_errors, interval[]) IS
    'Fail many leases (rns[i] with token tokens[i], error errors[i-1], delay retry_in[i]) in one statement; returns (rn, sqlstate) for each not failed.';

-- _yield_leases(rns, tokens, run_at, p_now): THE yield of leases (yield_task, yield_tasks):
-- each lease (rns[i], tokens[i]) whose task is running under that token ends without using an
-- attempt, history += its TaskAssignment and TaskYield. run_at NULL: deadline = now - 1 s and no
-- token, for the monitor to make it ready (NOTIFY pyscheduler_tasks_monitor); else (a snooze) the
-- task is back in its queue at once without owner, scheduled until run_at (ready when that is
-- not later than now). Returns the tasks yielded.
-- The tasks are locked FOR UPDATE first, in rn order (see _by_rn). That lock is what makes a
-- yield wait for an application's transaction that holds the lease with holds_lease (FOR KEY
-- SHARE) and see what it did once it ends (completed: refused): the UPDATE alone would take FOR
-- NO KEY UPDATE, which FOR KEY SHARE lets through, and the lease would end under that
-- transaction's guarded writes. Heartbeats and completions, which leave the lease held, keep
-- their UPDATE's lock and go on.
CREATE OR REPLACE FUNCTION pyscheduler._yield_leases(p_rns uuid[], p_tokens uuid[], p_run_at timestamptz,
                                                     p_now timestamptz)
RETURNS SETOF pyscheduler.tasks
LANGUAGE plpgsql
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_hashjoin = off SET enable_mergejoin = off
AS $$
DECLARE
    v_yielded pyscheduler.tasks[];
BEGIN
    PERFORM FROM pyscheduler.tasks t, pyscheduler._by_rn(p_rns) AS b  -- in rn order: see _by_rn
     WHERE t.rn = ANY (b.sorted) AND t.lease_token = p_tokens[b.pos[width_bucket(t.rn, b.sorted)]]
       AND t.status::text = 'running'
       FOR UPDATE OF t;
    WITH y AS (
        UPDATE pyscheduler.tasks t
           SET status = CASE WHEN p_run_at IS NULL THEN 'running' WHEN p_run_at > p_now THEN 'scheduled'
                             ELSE 'ready' END::pyscheduler.task_status,
               run_at = coalesce(p_run_at, t.run_at),
               deadline = CASE WHEN p_run_at IS NULL THEN p_now - interval '1 second' END,
               owner = CASE WHEN p_run_at IS NULL THEN t.owner END,
               progress = CASE WHEN p_run_at IS NULL THEN t.progress ELSE 0 END,
               updated = p_now, lease_token = NULL,
               attempts = t.attempts - 1,  -- a lease handed back is not an attempt used up
               leased_at = NULL,  -- the lease's TaskAssignment entry goes into history, then TaskYield
               history = CASE WHEN p_run_at IS NULL
                   THEN pyscheduler._full_history(t.history, t.owner, t.leased_at)
                        || pyscheduler._history('TaskYield', t.owner, p_now, t.progress)
                   ELSE pyscheduler._trim_history(
                        pyscheduler._full_history(t.history, t.owner, t.leased_at)
                        || jsonb_build_array(jsonb_build_object('_typ', 'TaskYield', 'worker', t.owner,
                                                                'progress', t.progress, 'run_at', pyscheduler._ts(p_run_at),
                                                                'time', pyscheduler._ts(p_now))),
                        pyscheduler._task_limit('task_max_history')) END
          FROM pyscheduler._by_rn(p_rns) AS b
         WHERE t.rn = ANY (b.sorted) AND t.lease_token = p_tokens[b.pos[width_bucket(t.rn, b.sorted)]]
           AND t.status::text = 'running'
        RETURNING t AS task)
    SELECT coalesce(array_agg(y.task), '{}') INTO v_yielded FROM y;
    IF cardinality(v_yielded) > 0 THEN
        IF p_run_at IS NULL THEN
            PERFORM pyscheduler._notify_throttled('pyscheduler_tasks_monitor');
        ELSE
            PERFORM pyscheduler._task_tally_many(ARRAY(SELECT y.queue FROM unnest(v_yielded) AS y), 'running',
                                                 CASE WHEN p_run_at > p_now THEN 'scheduled' ELSE 'ready' END::pyscheduler.task_status);
            PERFORM pyscheduler._notify_throttled(pyscheduler._task_channel(q))
               FROM (SELECT DISTINCT y.queue AS q FROM unnest(v_yielded) AS y) AS x;
        END IF;
    END IF;
    RETURN QUERY SELECT * FROM unnest(v_yielded);
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler._yield_task(
    rn uuid, token uuid, run_in interval DEFAULT NULL, p_now timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_task jsonb;
BEGIN
    SELECT pyscheduler._task_json(y) INTO v_task
      FROM pyscheduler._yield_leases(ARRAY[_yield_task.rn], ARRAY[_yield_task.token],
                                     pyscheduler._run_at(NULL, _yield_task.run_in, p_now), p_now) AS y;
    IF v_task IS NULL THEN
        PERFORM pyscheduler._task_refused(_yield_task.rn, _yield_task.token);
    END IF;
    RETURN v_task;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.yield_task(rn uuid, token uuid, run_in interval DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* yield_task(rn, token, run_in => NULL) -> task jsonb
   The lease holder hands a running task back (e.g. on SIGTERM): deadline =
   now - 1 s, history += TaskYield with its progress, and the lease ends (its
   token is refused from then on: PS210). The monitor resets the task to ready
   on its next pass (woken at once by NOTIFY pyscheduler_tasks_monitor),
   without a TaskTimeout entry.
   run_in (snooze, 0..365 days): the task is back in its queue at once,
   'scheduled' until now + run_in (0: ready), without owner or lease, its
   TaskYield entry with that run_at; as any yield, not an attempt used.
   Waits for a transaction that holds the lease with holds_lease, then acts
   on what it left (a task completed there: PS202).
   Errors: PS200 unknown, PS201 another lease holds it, PS202 not running,
   PS203 cancelled, PS210 already yielded, PS212 run_in. */
BEGIN
    RETURN pyscheduler._yield_task(rn, token, run_in, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.yield_task(uuid, uuid, interval) IS
    'The lease holder (token) yields a running task (the monitor makes it ready again), or snoozes it: scheduled again after run_in, no attempt used.';

CREATE OR REPLACE FUNCTION pyscheduler.holds_lease(rn uuid, token uuid)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* holds_lease(rn, token) -> boolean
   Whether token is the current lease of running task rn; when it is, the
   task's row is locked (FOR KEY SHARE) until the calling transaction ends,
   so the lease cannot be lost before that transaction commits: the monitor
   skips a locked task, a cancel and the holder's own yield wait for it
   (_yield_leases), then see what it did (heartbeats and the completion go
   on; the holder's fail and abort, its handler's verdict, too). For an application's own writes that must happen only under the
   lease, in the application's transaction:
     UPDATE accounts SET balance = balance - 10
      WHERE id = 7 AND pyscheduler.holds_lease(:rn, :token);
   false (and nothing locked) when the lease is gone (expired and reset,
   leased again, yielded, finished, cancelled, or no such task). */
#variable_conflict use_column
BEGIN
    PERFORM 1 FROM tasks t
     WHERE t.rn = holds_lease.rn AND t.lease_token = holds_lease.token AND t.status = 'running'
       FOR KEY SHARE;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION pyscheduler.holds_lease(uuid, uuid) IS
    'Whether token is the current lease of running task rn; if so the task stays locked (its lease cannot be lost) until the calling transaction ends.';

CREATE OR REPLACE FUNCTION pyscheduler.watch_task(rn uuid)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* watch_task(rn) -> task jsonb
   Ask to be told when task rn finishes: from now on its end (completed,
   aborted, cancelled) sends NOTIFY pyscheduler_task:<rn> with the status as
   payload. LISTEN on that channel first, then call watch_task: a task
   finished already is answered finished (read its result there), else the
   notification comes at its commit. A task nobody watches finishes without
   a NOTIFY (a NOTIFY at every finish would serialise every completion's
   commit on the notification queue).
   Errors: PS200 unknown task, 42501 a task of another role. */
#variable_conflict use_column
DECLARE
    v_task pyscheduler.tasks := _owned_task(watch_task.rn);
BEGIN
    IF NOT v_task.watched AND v_task.status IN ('waiting', 'scheduled', 'ready', 'running') THEN
        UPDATE tasks t SET watched = true WHERE t.rn = watch_task.rn RETURNING t.* INTO v_task;
    END IF;
    RETURN _task_json(v_task);
END
$$;
COMMENT ON FUNCTION pyscheduler.watch_task(uuid) IS
    'Have task rn NOTIFY pyscheduler_task:<rn> (payload: its status) when it finishes; returns it (already finished: its result).';

CREATE OR REPLACE FUNCTION pyscheduler.parent_results(rn uuid, token uuid)
RETURNS jsonb
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* parent_results(rn, token) -> jsonb
   For the holder of a lease (token) of task rn: its parents (after), in
   order, as [{"rn", "status", "result"}] (status NULL: cleaned up);
   lease_task and lease_tasks show the same as "parents".
   Errors: PS200, PS201, PS202, PS203, PS210 as complete_task. */
#variable_conflict use_column
DECLARE
    v_after uuid[];
BEGIN
    SELECT t.after INTO v_after FROM tasks t
     WHERE t.rn = parent_results.rn AND t.lease_token = parent_results.token AND t.status = 'running';
    IF NOT FOUND THEN
        PERFORM _task_refused(parent_results.rn, parent_results.token);
    END IF;
    RETURN _parent_results(coalesce(v_after, '{}'));
END
$$;
COMMENT ON FUNCTION pyscheduler.parent_results(uuid, uuid) IS
    'The lease holder (token) reads the status and result of each parent of task rn.';

CREATE OR REPLACE FUNCTION pyscheduler._yield_tasks(rns uuid[], tokens uuid[], p_now timestamptz DEFAULT now())
RETURNS TABLE (rn uuid, sqlstate text)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_done uuid[];
BEGIN
    PERFORM pyscheduler._check_leases(rns, tokens);
    v_done := ARRAY(SELECT y.rn FROM pyscheduler._yield_leases(rns, tokens, NULL, p_now) AS y);
    -- the rest were not yielded: the state machine says why, in a statement of its own (its
    -- snapshot after the yield, which may have waited for a transaction holding a lease)
    IF cardinality(v_done) < cardinality(rns) THEN  -- some were refused: see _refused
        RETURN QUERY SELECT * FROM pyscheduler._refused(rns, tokens, v_done);
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.yield_tasks(rns uuid[], tokens uuid[])
RETURNS TABLE (rn uuid, sqlstate text)
LANGUAGE plpgsql  -- keeps its plan: a SQL function is planned on every call (~40 us)
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* yield_tasks(rns, tokens) -> setof (rn uuid, sqlstate text)
   The batch form of yield_task, in one statement: hands back every lease
   (rns[i], tokens[i]) whose task is running under that token (deadline =
   now - 1 s, history += TaskYield, the token refused from then on); the
   monitor makes them ready at once. A worker stopping hands back the tasks
   it leased but never started this way. Waits, as yield_task, for a
   transaction that holds one of the leases with holds_lease. Returns one
   row per lease it did NOT yield, with the SQLSTATE yield_task would have raised for it (PS200,
   PS201, PS202, PS203, PS210); no rows means all were yielded.
   Errors: PS208 arrays of different lengths. */
BEGIN
    RETURN QUERY SELECT * FROM pyscheduler._yield_tasks(rns, tokens, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.yield_tasks(uuid[], uuid[]) IS
    'Yield many leases (rns[i] with token tokens[i]) in one statement; returns (rn, sqlstate) for each not yielded.';
