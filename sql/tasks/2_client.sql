-- pyscheduler: leased tasks, the client API: submit (delays, unique keys, keys, dependencies, workflows), view, cancel, requeue.
-- The overview (states, SQLSTATEs, limits) is at the top of 1_model.sql; the files of
-- sql/tasks/ load in name order on every migrate.

-- ---------------------------------------------------------------- client

-- _submit_args_ok(queue, priority, run_at, max_attempts): whether _check_submit has nothing to
-- say, in one test. SQL, inlined into the caller's expression: a single submit tests it and
-- calls _check_submit only when it fails (a PL/pgSQL call less, ~5 us of ~260, issue 31).
CREATE OR REPLACE FUNCTION pyscheduler._submit_args_ok(
    p_queue text, p_priority bigint, p_run_at timestamptz, p_max_attempts integer)
RETURNS boolean
LANGUAGE sql IMMUTABLE
AS $$
    SELECT coalesce(octet_length(p_queue) BETWEEN 1 AND 40 AND p_priority BETWEEN 0 AND 4294967295
                    AND (p_run_at IS NULL OR pyscheduler._instant_ok(p_run_at))
                    AND (p_max_attempts IS NULL OR p_max_attempts BETWEEN 1 AND 1000), false)
$$;

-- _check_submit(queue, priority, run_at, max_attempts, p_now): PS204, PS208 and
-- PS212 for the arguments submit_task and submit_tasks share.
CREATE OR REPLACE FUNCTION pyscheduler._check_submit(
    p_queue text, p_priority bigint, p_run_at timestamptz, p_max_attempts integer)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF pyscheduler._submit_args_ok(p_queue, p_priority, p_run_at, p_max_attempts) THEN
        RETURN;  -- the usual arguments, in one test; the checks below name what is wrong
    END IF;
    IF p_priority IS NULL THEN  -- _check_task_args takes a NULL priority as not given
        RAISE EXCEPTION 'priority must be an integer in 0..4294967295, got NULL'
            USING ERRCODE = 'PS204', HINT = 'Higher numbers are leased first; the default is 50.';
    END IF;
    PERFORM pyscheduler._check_task_args(p_queue => p_queue, p_queue_given => true, p_priority => p_priority);
    IF p_run_at IS NOT NULL AND NOT pyscheduler._instant_ok(p_run_at) THEN
        PERFORM pyscheduler._require_instant('run_at', p_run_at, 'PS212');
    END IF;
    IF p_max_attempts IS NOT NULL AND p_max_attempts NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'max_attempts must be NULL (the setting task_max_attempts) or in 1..1000, got %', p_max_attempts
            USING ERRCODE = 'PS208', HINT = 'Attempts are leases that were not yielded; 1 means never retried.';
    END IF;
END
$$;

-- _check_unique_key(key, what): PS213 unless key is NULL or a clean label of
-- at most 200 bytes (_label_refusal: no control, zero-width or bidirectional
-- formatting characters, no leading or trailing white space).
CREATE OR REPLACE FUNCTION pyscheduler._check_unique_key(p_key text, p_what text DEFAULT 'unique_key')
RETURNS void
LANGUAGE sql IMMUTABLE
AS $$
    SELECT pyscheduler._require_label(p_what, p_key, 200, 'PS213',
                                      'A unique key names the work, e.g. ''invoice:233''; NULL for none.');
$$;

-- _live_task(queue, by, unique_key): the live (waiting, scheduled, ready or running) task
-- of role by holding unique_key in queue, as a deduplicated answer, or NULL. A unique key is
-- its submitting role's: another role's task with the same key is not this one's answer
-- (tasks_unique_idx is (unique_key, queue, submitted_by), 0030, 0049).
CREATE OR REPLACE FUNCTION pyscheduler._live_task(p_queue text, p_by name, p_key text)
RETURNS jsonb
LANGUAGE sql STABLE
AS $$
    SELECT pyscheduler._task_json(t) || '{"deduplicated": true}'
      FROM pyscheduler.tasks t
     WHERE t.queue = p_queue AND t.submitted_by = p_by AND t.unique_key = p_key AND t.unique_key IS NOT NULL
       AND t.status IN ('waiting', 'scheduled', 'ready', 'running');
$$;

-- _live_rn(queue, by, unique_key): _live_task's id, or NULL.
CREATE OR REPLACE FUNCTION pyscheduler._live_rn(p_queue text, p_by name, p_key text)
RETURNS uuid
LANGUAGE sql STABLE
AS $$
    SELECT t.rn FROM pyscheduler.tasks t
     WHERE t.queue = p_queue AND t.submitted_by = p_by AND t.unique_key = p_key AND t.unique_key IS NOT NULL
       AND t.status IN ('waiting', 'scheduled', 'ready', 'running');
$$;

-- _check_concurrency_key(key, what): PS215 unless key is NULL or a clean label
-- of at most 200 bytes (as a unique_key).
CREATE OR REPLACE FUNCTION pyscheduler._check_concurrency_key(p_key text, p_what text DEFAULT 'concurrency_key')
RETURNS void
LANGUAGE sql IMMUTABLE
AS $$
    SELECT pyscheduler._require_label(p_what, p_key, 200, 'PS215',
                                      'A concurrency key names what the limit protects, e.g. ''customer:42''.');
$$;

-- _parents(after, on_parent_failure): for a task submitted after the tasks
-- after: PS219 unless they are at most task_max_parents existing tasks the
-- caller may act on (its role's, or any for admin; duplicates count once).
-- The live ones (waiting, scheduled, ready, running) are locked and marked
-- has_children, in rn order (so concurrent submits after common parents
-- never deadlock, and a parent finishing meanwhile waits for this
-- transaction, then finds the new edges); returns them, and the first parent
-- that failed (aborted or cancelled) already, with its status.
CREATE OR REPLACE FUNCTION pyscheduler._parents(p_after uuid[], OUT live uuid[], OUT failed uuid,
                                                OUT failed_status pyscheduler.task_status)
LANGUAGE plpgsql
AS $$
DECLARE
    v_bad record;
    v_admin boolean := pg_catalog.pg_has_role(pyscheduler._caller(), pyscheduler._role('admin'), 'MEMBER');
BEGIN
    IF cardinality(p_after) > pyscheduler._task_limit('task_max_parents') OR array_position(p_after, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'after must be an array of at most task_max_parents (%) task ids without NULL, got % ids',
                        pyscheduler._task_limit('task_max_parents'), cardinality(p_after)
            USING ERRCODE = 'PS219', HINT = 'A task after many tasks: submit it after fewer join tasks.';
    END IF;
    WITH u AS (
        UPDATE pyscheduler.tasks t SET has_children = true
          FROM (SELECT DISTINCT a.rn FROM unnest(p_after) AS a(rn) ORDER BY a.rn) AS a
         WHERE t.rn = a.rn AND t.status IN ('waiting', 'scheduled', 'ready', 'running')
           AND (v_admin OR pyscheduler._may_act(t.submitted_by))
        RETURNING t.rn)
    SELECT coalesce(array_agg(u.rn), '{}') INTO live FROM u;
    SELECT a.rn, t.rn IS NULL AS missing INTO v_bad
      FROM unnest(p_after) AS a(rn) LEFT JOIN pyscheduler.tasks t ON t.rn = a.rn
     WHERE t.rn IS NULL OR NOT (v_admin OR pyscheduler._may_act(t.submitted_by))
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'after names %: %', v_bad.rn,
                        CASE WHEN v_bad.missing THEN 'no such task' ELSE 'a task of another role' END
            USING ERRCODE = 'PS219', HINT = 'A task may wait only for existing tasks of its own role.';
    END IF;
    SELECT t.rn, t.status INTO failed, failed_status FROM pyscheduler.tasks t
     WHERE t.rn = ANY (p_after) AND t.status IN ('aborted', 'cancelled')
     ORDER BY t.rn LIMIT 1;
END
$$;

-- _submit_lean(queue, specs, ...): the submit of submit_tasks (its arguments, checked as it
-- documents), answering one row per spec, in the order of specs: the task's id, and whether
-- it is the live task that already held the spec's unique key (deduplicated). No JSON is
-- built: _task_json was ~75 % of a submit's server time (issue 31); _submit_tasks builds it.
-- Without unique keys, concurrency keys or after, each of those branches is one test. The keys
-- are its callers' to check: the domains of the public functions' parameters (migration 0031),
-- _submit_task's own checks.
CREATE OR REPLACE FUNCTION pyscheduler._submit_lean(
    queue text, specs jsonb, priority bigint DEFAULT 50, run_at timestamptz DEFAULT NULL,
    unique_keys text[] DEFAULT NULL, max_attempts integer DEFAULT NULL, p_now timestamptz DEFAULT now(),
    p_submitted_by name DEFAULT NULL, concurrency_keys text[] DEFAULT NULL, after uuid[] DEFAULT NULL,
    on_parent_failure text DEFAULT 'cancel')
RETURNS TABLE (rn uuid, deduplicated boolean)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_max integer := pyscheduler._task_limit('task_max_spec_bytes');
    v_prefix bigint := pyscheduler._rn_prefix(p_now);
    v_status pyscheduler.task_status := CASE WHEN _submit_lean.run_at > p_now THEN 'scheduled' ELSE 'ready' END;
    v_by name := coalesce(p_submitted_by, pyscheduler._caller());
    v_bad record;
    v_answers uuid[];
    v_dedup boolean[];
    v_todo integer[];
    v_seqs bigint[];
    v_ps integer[];
    v_rns uuid[];
    v_inserted boolean := false;
    v_parents record;
    v_waiting integer := 0;
    v_history jsonb := '[]';
    v_failure text := CASE WHEN _submit_lean.on_parent_failure = 'cancel' THEN NULL
                           ELSE _submit_lean.on_parent_failure END;
    v_children uuid[] := '{}';
BEGIN
    PERFORM pyscheduler._check_submit(_submit_lean.queue, _submit_lean.priority, _submit_lean.run_at,
                                      _submit_lean.max_attempts);
    PERFORM pyscheduler._claim_queue(_submit_lean.queue, v_by, p_now);
    IF specs IS NULL OR jsonb_typeof(specs) <> 'array' THEN
        RAISE EXCEPTION 'specs must be a JSON array of spec objects, got %', coalesce(left(specs::text, 200), 'NULL')
            USING ERRCODE = 'PS206', HINT = 'e.g. ''[{"orderId": "1"}, {"orderId": "2"}]''';
    END IF;
    SELECT e, i INTO v_bad FROM jsonb_array_elements(specs) WITH ORDINALITY AS a(e, i)
     WHERE jsonb_typeof(e) <> 'object' OR pg_column_size(e) > v_max LIMIT 1;
    IF FOUND THEN
        PERFORM pyscheduler._check_spec(v_bad.e, format('specs[%s]', v_bad.i - 1), v_max);
    END IF;
    -- the keys are zipped with the specs in array order (ROWS FROM ... unnest: subscripting a
    -- text array walks it from its start, so a key a spec cost O(n)); the conflict path below
    -- subscripts from 1: an array of other bounds or dimensions is read as its elements in order
    IF array_ndims(unique_keys) > 1 OR array_lower(unique_keys, 1) <> 1 THEN
        unique_keys := ARRAY(SELECT unnest(unique_keys));
    END IF;
    IF array_ndims(concurrency_keys) > 1 OR array_lower(concurrency_keys, 1) <> 1 THEN
        concurrency_keys := ARRAY(SELECT unnest(concurrency_keys));
    END IF;
    IF concurrency_keys IS NOT NULL THEN
        IF cardinality(concurrency_keys) <> jsonb_array_length(specs) THEN
            RAISE EXCEPTION 'concurrency_keys must be NULL or as long as specs, got % and %',
                            cardinality(concurrency_keys), jsonb_array_length(specs)
                USING ERRCODE = 'PS215', HINT = 'concurrency_keys[i] is the key of specs[i - 1] (NULL: none).';
        END IF;
    END IF;
    IF _submit_lean.on_parent_failure IS NULL OR _submit_lean.on_parent_failure NOT IN ('cancel', 'run') THEN
        RAISE EXCEPTION 'on_parent_failure must be cancel or run, got %',
                        coalesce(quote_literal(_submit_lean.on_parent_failure), 'NULL')
            USING ERRCODE = 'PS219', HINT = 'cancel (the default): a parent aborted or cancelled cancels the task; run: it runs anyway.';
    END IF;
    -- Dependencies: wait for the live parents (status waiting, waiting_on =
    -- how many); a parent that failed already cancels the task at once (or,
    -- with on_parent_failure => 'run', counts as finished).
    IF after IS NOT NULL AND cardinality(after) > 0 THEN
        v_parents := pyscheduler._parents(after);
        v_waiting := cardinality(v_parents.live);
        IF v_parents.failed IS NOT NULL AND v_failure IS NULL THEN
            v_status := 'cancelled';
            v_history := jsonb_build_array(jsonb_build_object('_typ', 'TaskParentFailed', 'parent', v_parents.failed,
                                                              'status', v_parents.failed_status,
                                                              'time', pyscheduler._ts(p_now)));
            v_waiting := 0;
        ELSIF v_waiting > 0 THEN
            v_status := 'waiting';
        END IF;
    END IF;
    IF unique_keys IS NULL THEN
        WITH ins AS (
            INSERT INTO pyscheduler.tasks AS t (rn, seq, queue, spec, priority, status, progress, created, updated,
                                                errors, history, run_at, max_attempts, submitted_by, concurrency_key,
                                                after, waiting_on, on_parent_failure)
            SELECT pyscheduler._task_rn(v_prefix, a.seq), a.seq, _submit_lean.queue, a.e, _submit_lean.priority,
                   v_status, 0, p_now, p_now, '[]', v_history, _submit_lean.run_at, _submit_lean.max_attempts, v_by,
                   a.ck, after, v_waiting, v_failure
              FROM (SELECT nextval('pyscheduler.task_seq') AS seq, e, ck, i  -- after the sort: seq follows the order of specs
                      FROM ROWS FROM (jsonb_array_elements(specs), unnest(concurrency_keys)) WITH ORDINALITY AS a(e, ck, i)
                     ORDER BY a.i) AS a
            RETURNING t.seq, t.rn)
        SELECT coalesce(array_agg(ins.rn ORDER BY ins.seq), '{}') INTO v_children FROM ins;
        v_answers := v_children;
        v_inserted := cardinality(v_children) > 0;
    ELSE
    -- Unique keys, one per spec (NULL: none): each spec either becomes a task or
    -- is answered with the live task that holds its key (deduplicated), the
    -- first of equal keys in the array winning. One row per spec, in order.
    IF cardinality(unique_keys) <> jsonb_array_length(specs) THEN
        RAISE EXCEPTION 'unique_keys must be NULL or as long as specs, got % and %',
                        cardinality(unique_keys), jsonb_array_length(specs)
            USING ERRCODE = 'PS208', HINT = 'unique_keys[i] is the key of specs[i - 1] (NULL: none).';
    END IF;
    -- Fresh keys (the usual case: none held by a live task) go in with a plain insert, in key
    -- order as below: the unique index refuses a key a live task holds (after waiting for a
    -- concurrent submitter's transaction) or an earlier spec of the batch, and the batch then
    -- takes the ON CONFLICT path. Its speculative insertion cost ~5 us a task, 1.8x a plain
    -- batch's server time; a count of the distinct keys first, ~2,900 instructions a task (3 %
    -- of a keyed one), for a batch repeating a key, which is rare (issue 31).
    BEGIN
        WITH ins AS (
            INSERT INTO pyscheduler.tasks AS t (rn, seq, queue, spec, priority, status, progress, created, updated,
                                                errors, history, run_at, max_attempts, submitted_by, unique_key,
                                                concurrency_key, after, waiting_on, on_parent_failure)
            SELECT pyscheduler._task_rn(v_prefix, a.seq), a.seq, _submit_lean.queue, a.e, _submit_lean.priority,
                   v_status, 0, p_now, p_now, '[]', v_history, _submit_lean.run_at, _submit_lean.max_attempts,
                   v_by, a.k, a.ck, after, v_waiting, v_failure
              -- sorted by key in a subquery of its own: the sort then holds these five columns, not
              -- the task's row (~2,600 instructions a keyed task less, issue 31)
              FROM (SELECT *
                      FROM (SELECT nextval('pyscheduler.task_seq') AS seq, e, k, ck, i  -- in the order of specs
                              FROM ROWS FROM (jsonb_array_elements(specs), unnest(unique_keys),
                                              unnest(concurrency_keys)) WITH ORDINALITY AS a(e, k, ck, i)
                             ORDER BY a.i) AS a
                     ORDER BY a.k COLLATE "C" NULLS FIRST, a.i) AS a
            RETURNING t.seq, t.rn)
        SELECT coalesce(array_agg(ins.rn ORDER BY ins.seq), '{}') INTO v_children FROM ins;
        v_answers := v_children;
        v_inserted := cardinality(v_children) > 0;
    EXCEPTION WHEN unique_violation THEN
        v_children := '{}';  -- rolled back
    END;
    IF v_answers IS NULL THEN
        v_answers := array_fill(NULL::uuid, ARRAY[cardinality(unique_keys)]);
        v_dedup := array_fill(false, ARRAY[cardinality(unique_keys)]);
        v_todo := ARRAY(SELECT generate_series(1, cardinality(unique_keys)));
        FOR v_round IN 1..10 LOOP
            -- insert the specs not answered yet; a key held by a live task (or by an
            -- earlier spec of this statement) is skipped by DO NOTHING. seq follows the
            -- order of specs (the lease order); the rows go in in key order, so
            -- concurrent batches with keys in common wait for each other, never deadlock.
            v_seqs := ARRAY(SELECT nextval('pyscheduler.task_seq') FROM unnest(v_todo));
            WITH ins AS (
                INSERT INTO pyscheduler.tasks AS t (rn, seq, queue, spec, priority, status, progress, created, updated,
                                                    errors, history, run_at, max_attempts, submitted_by, unique_key,
                                                    concurrency_key, after, waiting_on, on_parent_failure)
                SELECT pyscheduler._task_rn(v_prefix, x.seq), x.seq, _submit_lean.queue, x.e, _submit_lean.priority,
                       v_status, 0, p_now, p_now, '[]', v_history, _submit_lean.run_at, _submit_lean.max_attempts, v_by,
                       unique_keys[x.p], concurrency_keys[x.p], after, v_waiting, v_failure
                  FROM (SELECT s.p, s.seq, a.e
                          FROM unnest(v_todo, v_seqs) AS s(p, seq)
                          JOIN jsonb_array_elements(specs) WITH ORDINALITY AS a(e, i) ON a.i = s.p
                         ORDER BY unique_keys[s.p] COLLATE "C" NULLS FIRST, s.p) AS x
                ON CONFLICT (queue, submitted_by, unique_key)
                   WHERE unique_key IS NOT NULL AND status IN ('waiting', 'scheduled', 'ready', 'running')
                DO NOTHING
                RETURNING t.seq, t.rn)
            SELECT coalesce(array_agg(s.p), '{}'), coalesce(array_agg(ins.rn), '{}'),
                   v_children || coalesce(array_agg(ins.rn), '{}')
              INTO v_ps, v_rns, v_children
              FROM ins JOIN unnest(v_todo, v_seqs) AS s(p, seq) ON s.seq = ins.seq;
            v_answers := ARRAY(SELECT coalesce(m.rn, a.rn)  -- one statement: a loop of assignments cost ~1 us a spec
                                 FROM unnest(v_answers) WITH ORDINALITY AS a(rn, i)
                                 LEFT JOIN unnest(v_ps, v_rns) AS m(p, rn) ON m.p = a.i
                                ORDER BY a.i);
            v_inserted := v_inserted OR cardinality(v_ps) > 0;
            -- the others: answered with the live task that holds their key
            v_todo := ARRAY(SELECT p FROM unnest(v_todo) AS p WHERE v_answers[p] IS NULL);
            FOR j IN 1..cardinality(v_todo) LOOP
                v_answers[v_todo[j]] := pyscheduler._live_rn(_submit_lean.queue, v_by, unique_keys[v_todo[j]]);
                v_dedup[v_todo[j]] := true;
            END LOOP;
            -- a key whose task finished meanwhile is free again: insert once more
            v_todo := ARRAY(SELECT p FROM unnest(v_todo) AS p WHERE v_answers[p] IS NULL);
            EXIT WHEN cardinality(v_todo) = 0;
        END LOOP;
        IF cardinality(v_todo) > 0 THEN
            RAISE EXCEPTION 'unique keys kept changing hands while submitting; try again'
                USING ERRCODE = '40001';
        END IF;
    END IF;
    END IF;
    PERFORM pyscheduler._task_tally(_submit_lean.queue, NULL, v_status, cardinality(v_children));
    IF v_waiting > 0 AND cardinality(v_children) > 0 THEN
        INSERT INTO pyscheduler.task_edges (parent, child)
        SELECT p, c FROM unnest(v_parents.live) AS p, unnest(v_children) AS c;
    END IF;
    IF v_inserted AND v_status IN ('ready', 'scheduled') THEN
        PERFORM pyscheduler._notify_throttled(pyscheduler._task_channel(_submit_lean.queue));
    END IF;
    RETURN QUERY SELECT a.rn, coalesce(v_dedup[a.i], false)
                   FROM unnest(v_answers) WITH ORDINALITY AS a(rn, i) ORDER BY a.i;
END
$$;

-- _submit_tasks(queue, specs, ...): _submit_lean's answers as tasks (_task_json; a deduplicated
-- one marked "deduplicated": true), one row per spec, in the order of specs. Two statements:
-- one reading the tasks in the statement that calls _submit_lean would not see them.
CREATE OR REPLACE FUNCTION pyscheduler._submit_tasks(
    queue text, specs jsonb, priority bigint DEFAULT 50, run_at timestamptz DEFAULT NULL,
    unique_keys text[] DEFAULT NULL, max_attempts integer DEFAULT NULL, p_now timestamptz DEFAULT now(),
    p_submitted_by name DEFAULT NULL, concurrency_keys text[] DEFAULT NULL, after uuid[] DEFAULT NULL,
    on_parent_failure text DEFAULT 'cancel')
RETURNS TABLE (task jsonb)
LANGUAGE plpgsql
AS $$
DECLARE
    v_rns uuid[];
    v_dedup boolean[];
BEGIN
    SELECT array_agg(s.rn ORDER BY s.i), array_agg(s.deduplicated ORDER BY s.i) INTO v_rns, v_dedup
      FROM pyscheduler._submit_lean(_submit_tasks.queue, specs, _submit_tasks.priority, _submit_tasks.run_at,
                                    unique_keys, _submit_tasks.max_attempts, p_now, p_submitted_by, concurrency_keys,
                                    _submit_tasks.after, _submit_tasks.on_parent_failure)
           WITH ORDINALITY AS s(rn, deduplicated, i);
    RETURN QUERY
        SELECT CASE WHEN s.dedup THEN pyscheduler._task_json(t) || '{"deduplicated": true}'
                    ELSE pyscheduler._task_json(t) END
          FROM unnest(v_rns, v_dedup) WITH ORDINALITY AS s(rn, dedup, i)
          JOIN pyscheduler.tasks t ON t.rn = s.rn
         ORDER BY s.i;
END
$$;

-- _submit_one(queue, spec, ..., field): _submit_lean of one spec without unique key or parents
-- (the arguments checked as it checks them, the same errors, a refused spec named field,
-- ownership, tally and NOTIFY), answering the new task's id: a single submit's path
-- (submit_task_lean, and submit_tasks_lean of one spec), one INSERT ... VALUES and no set to
-- expand, sort or aggregate: ~50 us of server CPU less than _submit_lean's for one spec, 216
-- against 267 us a call (issue 31; docs/benchmarks.md, "A single submit"). One read for what it
-- needs to know (the spec limit, whether the queue has its owner) and no PERFORM (a statement
-- each, ~22,000 and ~6,000 instructions of ~707,000 a call: callgrind).
CREATE OR REPLACE FUNCTION pyscheduler._submit_one(
    p_queue text, p_spec jsonb, p_priority bigint, p_run_at timestamptz, p_max_attempts integer, p_now timestamptz,
    p_concurrency_key text, p_on_parent_failure text, p_field text)
RETURNS uuid
LANGUAGE plpgsql
AS $$
DECLARE
    v_by name := pyscheduler._caller();
    v_max integer;
    v_claimed boolean;
    v_status pyscheduler.task_status := CASE WHEN p_run_at > p_now THEN 'scheduled' ELSE 'ready' END;
    v_seq bigint;
    v_rn uuid;
    v_notified boolean;
BEGIN
    IF NOT pyscheduler._submit_args_ok(p_queue, p_priority, p_run_at, p_max_attempts) THEN
        PERFORM pyscheduler._check_submit(p_queue, p_priority, p_run_at, p_max_attempts);
    END IF;
    SELECT (SELECT s.value::integer FROM pyscheduler.settings s WHERE s.name = 'task_max_spec_bytes'),
           EXISTS (SELECT FROM pyscheduler.task_queues q WHERE q.queue = p_queue AND q.owner IS NOT NULL)
      INTO v_max, v_claimed;
    IF jsonb_typeof(p_spec) IS DISTINCT FROM 'object' OR pg_column_size(p_spec) > v_max OR v_max IS NULL THEN
        -- NULL: refused; no setting: PS002
        PERFORM pyscheduler._check_spec(p_spec, p_field, pyscheduler._task_limit('task_max_spec_bytes'));
    END IF;
    IF NOT v_claimed THEN  -- _claim_queue's probe, made above
        PERFORM pyscheduler._claim_queue(p_queue, v_by, p_now);
    END IF;
    v_seq := nextval('pyscheduler.task_seq');
    INSERT INTO pyscheduler.tasks AS t (rn, seq, queue, spec, priority, status, progress, created, updated, errors,
                                        history, run_at, max_attempts, submitted_by, concurrency_key, on_parent_failure)
    VALUES (pyscheduler._task_rn(pyscheduler._rn_prefix(p_now), v_seq), v_seq, p_queue, p_spec, p_priority, v_status, 0,
            p_now, p_now, '[]', '[]', p_run_at, p_max_attempts, v_by, p_concurrency_key,
            nullif(p_on_parent_failure, 'cancel'))
    RETURNING t.rn INTO v_rn;
    -- _task_tally(p_queue, NULL, v_status, 1) written out: its row and its fold, without its call
    INSERT INTO pyscheduler._task_tallies (queue, status, n) VALUES (p_queue, v_status, 1);
    IF random() < pyscheduler._task_fold_chance() THEN
        PERFORM pyscheduler._task_fold_tallies();
    END IF;
    v_notified := pyscheduler._notify_throttled(pyscheduler._task_channel(p_queue));
    RETURN v_rn;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler._submit_task(
    queue text, spec jsonb, priority bigint DEFAULT 50, run_at timestamptz DEFAULT NULL, unique_key text DEFAULT NULL,
    max_attempts integer DEFAULT NULL, p_now timestamptz DEFAULT now(), p_submitted_by name DEFAULT NULL,
    concurrency_key text DEFAULT NULL, after uuid[] DEFAULT NULL, on_parent_failure text DEFAULT 'cancel')
RETURNS jsonb
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_task jsonb;
    v_seq bigint;
    v_status pyscheduler.task_status := CASE WHEN _submit_task.run_at > p_now THEN 'scheduled' ELSE 'ready' END;
    v_by name := coalesce(p_submitted_by, pyscheduler._caller());
BEGIN
    PERFORM pyscheduler._check_submit(_submit_task.queue, _submit_task.priority, _submit_task.run_at,
                                      _submit_task.max_attempts);
    PERFORM pyscheduler._check_spec(_submit_task.spec, 'spec', pyscheduler._task_limit('task_max_spec_bytes'));
    PERFORM pyscheduler._check_unique_key(_submit_task.unique_key);
    PERFORM pyscheduler._check_concurrency_key(_submit_task.concurrency_key);
    IF after IS NOT NULL OR on_parent_failure IS DISTINCT FROM 'cancel' THEN
        -- dependencies: the batch path has them (one spec, one answer)
        RETURN (SELECT s.task FROM pyscheduler._submit_tasks(
                    _submit_task.queue, jsonb_build_array(_submit_task.spec), _submit_task.priority, _submit_task.run_at,
                    CASE WHEN _submit_task.unique_key IS NOT NULL THEN ARRAY[_submit_task.unique_key] END,
                    _submit_task.max_attempts, p_now, p_submitted_by,
                    CASE WHEN _submit_task.concurrency_key IS NOT NULL THEN ARRAY[_submit_task.concurrency_key] END,
                    _submit_task.after, _submit_task.on_parent_failure) AS s);
    END IF;
    PERFORM pyscheduler._claim_queue(_submit_task.queue, v_by, p_now);
    -- One live task per (queue, role, unique_key): the unique index decides, so
    -- concurrent submits of one key make one task (a submit waits for a
    -- concurrent one's transaction, then finds its task). Without a key the
    -- insert always succeeds (ON CONFLICT costs nothing measurable then).
    FOR v_round IN 1..10 LOOP
        v_seq := nextval('pyscheduler.task_seq');
        INSERT INTO pyscheduler.tasks AS t (rn, seq, queue, spec, priority, status, progress, created, updated, errors,
                                            history, run_at, max_attempts, submitted_by, unique_key, concurrency_key)
        VALUES (pyscheduler._task_rn(pyscheduler._rn_prefix(p_now), v_seq), v_seq, _submit_task.queue,
                _submit_task.spec, _submit_task.priority, v_status, 0, p_now, p_now, '[]', '[]', _submit_task.run_at,
                _submit_task.max_attempts, v_by, _submit_task.unique_key, _submit_task.concurrency_key)
        ON CONFLICT (queue, submitted_by, unique_key)
           WHERE unique_key IS NOT NULL AND status IN ('waiting', 'scheduled', 'ready', 'running')
        DO NOTHING
        RETURNING pyscheduler._task_json(t) INTO v_task;
        IF v_task IS NOT NULL THEN
            PERFORM pyscheduler._task_tally(_submit_task.queue, NULL, v_status, 1);
            PERFORM pyscheduler._notify_throttled(pyscheduler._task_channel(_submit_task.queue));
            RETURN v_task;
        END IF;
        v_task := pyscheduler._live_task(_submit_task.queue, v_by, _submit_task.unique_key);
        IF v_task IS NOT NULL THEN
            RETURN v_task;
        END IF;
        -- the task that held the key finished meanwhile: the key is free, insert again
    END LOOP;
    RAISE EXCEPTION 'unique key % kept changing hands while submitting; try again', _submit_task.unique_key
        USING ERRCODE = '40001';
END
$$;

-- _run_at(run_at, run_in, now): when a submitted task may first be leased:
-- run_at, or now + run_in (0..365 days, as seconds, like fail_task's
-- retry_in), or NULL (at once). PS212 when both are given or run_in is out of
-- bounds (run_at's own bounds are _check_submit's).
CREATE OR REPLACE FUNCTION pyscheduler._run_at(p_run_at timestamptz, p_run_in interval, p_now timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_run_in IS NULL THEN
        RETURN p_run_at;
    END IF;
    IF p_run_at IS NOT NULL THEN
        RAISE EXCEPTION 'give run_at or run_in, not both'
            USING ERRCODE = 'PS212', HINT = 'run_at is an instant, run_in a delay from now.';
    END IF;
    IF NOT extract(epoch FROM p_run_in) BETWEEN 0 AND 31536000 THEN  -- 365 days, as seconds
        RAISE EXCEPTION 'run_in must be between 0 and 365 days, got %', p_run_in
            USING ERRCODE = 'PS212', HINT = 'For a later time, give run_at.';
    END IF;
    RETURN p_now + make_interval(secs => extract(epoch FROM p_run_in)::double precision);
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.submit_task(
    queue pyscheduler.queue_name, spec pyscheduler.task_spec, priority bigint DEFAULT 50,
    run_at timestamptz DEFAULT NULL, unique_key pyscheduler.unique_key DEFAULT NULL,
    max_attempts integer DEFAULT NULL, run_in interval DEFAULT NULL,
    concurrency_key pyscheduler.concurrency_key DEFAULT NULL, after uuid[] DEFAULT NULL,
    on_parent_failure pyscheduler.parent_failure DEFAULT 'cancel')
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* submit_task(queue, spec, priority => 50, run_at => NULL, unique_key => NULL,
               max_attempts => NULL, run_in => NULL, concurrency_key => NULL,
               after => NULL, on_parent_failure => 'cancel') -> task jsonb
   Add a task to queue and wake that queue's idle workers (NOTIFY). The task
   belongs to the calling role (submitted_by).
   queue:        1..40 bytes; tasks of a queue are leased by that queue's workers.
   spec:         a JSON object, opaque to pyscheduler, at most task_max_spec_bytes.
   priority:     0..4294967295, higher is leased first; equal priorities in
                 submission order.
   run_at:       not leased before this time (database clock): the task is
                 'scheduled' until then; 'ready' at once when NULL or past.
                 In [1970-01-01Z, 9999-01-01Z).
   run_in:       or: not leased before now() + run_in (0..365 days, applied
                 as that many seconds); give run_at or run_in, not both.
   unique_key:   while a task of queue with this key is waiting, scheduled,
                 ready or running, submitting another returns that task
                 instead, with "deduplicated": true (nothing is changed). A
                 label of at most 200 bytes; free again once the task finished.
   max_attempts: attempts (leases not yielded) before a failing or timing-out
                 task is aborted, 1..1000; NULL: the setting task_max_attempts.
   concurrency_key: tasks of one key share the queue's running_per_key limit
                 (set_queue_limits); a label of at most 200 bytes.
   after:        task ids (of the caller's role, any queue, at most
                 task_max_parents): the task is 'waiting' until every one of
                 them has finished, then ready (or scheduled until run_at).
                 Finished parents count as done at once.
   on_parent_failure: 'cancel' (default): a parent aborted or cancelled
                 cancels the task (history TaskParentFailed naming it), and its
                 own dependents in turn; 'run': it runs anyway.
   Errors: PS204 priority, PS206 spec, PS208 queue, max_attempts, PS212 run_at or
   run_in, PS213 unique_key, PS215 concurrency_key, PS219 after or
   on_parent_failure. */
DECLARE
    v_rn uuid;
BEGIN
    IF $5 IS NULL AND $9 IS NULL AND $10 IN ('cancel', 'run') THEN
        -- no key, no parents: submit_task_lean's insert, then the row read back as JSON (issue 31:
        -- a call 277 -> 265 us, p50, without _submit_task's separate checks and its loop)
        v_rn := pyscheduler._submit_one($1, $2, $3, pyscheduler._run_at($4, $7, now()), $6, now(), $8, $10, 'spec');
        RETURN (SELECT pyscheduler._task_json(t) FROM pyscheduler.tasks t WHERE t.rn = v_rn);
    END IF;
    RETURN pyscheduler._submit_task(queue, spec, priority, pyscheduler._run_at(run_at, run_in, now()), unique_key,
                                    max_attempts, now(), NULL, concurrency_key, after, on_parent_failure);
END
$$;
COMMENT ON FUNCTION pyscheduler.submit_task(pyscheduler.queue_name, pyscheduler.task_spec, bigint, timestamptz,
    pyscheduler.unique_key, integer, interval, pyscheduler.concurrency_key, uuid[], pyscheduler.parent_failure) IS
    'Submit a task to a queue (priority; run_at or run_in; unique_key; max_attempts; concurrency_key; after: wait for other tasks); returns it as JSON.';

CREATE OR REPLACE FUNCTION pyscheduler.submit_tasks(
    queue pyscheduler.queue_name, specs pyscheduler.task_specs, priority bigint DEFAULT 50,
    run_at timestamptz DEFAULT NULL, unique_keys pyscheduler.unique_key[] DEFAULT NULL,
    max_attempts integer DEFAULT NULL, run_in interval DEFAULT NULL,
    concurrency_keys pyscheduler.concurrency_key[] DEFAULT NULL, after uuid[] DEFAULT NULL,
    on_parent_failure pyscheduler.parent_failure DEFAULT 'cancel')
RETURNS TABLE (task jsonb)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* submit_tasks(queue, specs, priority => 50, run_at => NULL, unique_keys => NULL,
                max_attempts => NULL, run_in => NULL, concurrency_keys => NULL,
                after => NULL, on_parent_failure => 'cancel') -> setof (task jsonb)
   The batch form of submit_task: specs is a JSON array of spec objects, all
   submitted to queue with one priority, run_at (or run_in), max_attempts and
   after in one statement, one NOTIFY; they lease in the order of specs.
   unique_keys: NULL, or one key per spec (unique_keys[i] for specs[i - 1],
   NULL for none): a spec whose key a live task holds (or an earlier spec of
   the array) is answered with that task, "deduplicated": true; the answer
   then has one row per spec, in the order of specs. concurrency_keys: NULL,
   or one key per spec (NULL for none).
   Errors: PS204 priority, PS206 specs (not an array of objects, or an element
   too large: the message names it), PS208 queue, max_attempts, unique_keys
   not as long as specs, PS212 run_at or run_in, PS213 a unique key (named),
   PS215 a concurrency key (named) or concurrency_keys not as long as specs,
   PS219 after or on_parent_failure. */
BEGIN
    RETURN QUERY
        SELECT t.task FROM pyscheduler._submit_tasks(queue, specs, priority, pyscheduler._run_at(run_at, run_in, now()),
                                                     unique_keys, max_attempts, now(), NULL, concurrency_keys, after,
                                                     on_parent_failure) AS t;
END
$$;
COMMENT ON FUNCTION pyscheduler.submit_tasks(pyscheduler.queue_name, pyscheduler.task_specs, bigint, timestamptz,
    pyscheduler.unique_key[], integer, interval, pyscheduler.concurrency_key[], uuid[],
    pyscheduler.parent_failure) IS
    'Submit a JSON array of specs as tasks of one queue (leased in array order), optionally delayed, after other tasks, one unique and one concurrency key each; returns the tasks.';

CREATE OR REPLACE FUNCTION pyscheduler.submit_tasks_lean(
    queue pyscheduler.queue_name, specs pyscheduler.task_specs, priority bigint DEFAULT 50,
    run_at timestamptz DEFAULT NULL, unique_keys pyscheduler.unique_key[] DEFAULT NULL,
    max_attempts integer DEFAULT NULL, run_in interval DEFAULT NULL,
    concurrency_keys pyscheduler.concurrency_key[] DEFAULT NULL, after uuid[] DEFAULT NULL,
    on_parent_failure pyscheduler.parent_failure DEFAULT 'cancel')
RETURNS TABLE (rn uuid, deduplicated boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* submit_tasks_lean(queue, specs, priority => 50, run_at => NULL, unique_keys => NULL,
                     max_attempts => NULL, run_in => NULL, concurrency_keys => NULL,
                     after => NULL, on_parent_failure => 'cancel') -> setof (rn uuid, deduplicated boolean)
   submit_tasks (same arguments, checks, errors, ownership, NOTIFY), answering
   only the ids: one row per spec, in the order of specs, the id of the task
   it became, or of the live task holding its unique key (deduplicated true).
   No task is built as JSON: two thirds of submit_tasks' server time (issue 31).
   PL/pgSQL, which keeps its plan for the session: a SQL function that is
   not inlined is planned on every call (~80 us, a third of a single submit).
   One spec without unique key or parents (a single submit) takes
   _submit_one; anything else (an error too) _submit_lean. */
BEGIN
    IF $5 IS NULL AND $9 IS NULL AND jsonb_typeof($2) = 'array' AND jsonb_array_length($2) = 1
       AND ($8 IS NULL OR cardinality($8) = 1) AND $10 IN ('cancel', 'run') THEN
        rn := pyscheduler._submit_one($1, $2 -> 0, $3, pyscheduler._run_at($4, $7, now()), $6, now(), $8[1], $10,
                                       'specs[0]');
        deduplicated := false;
        RETURN NEXT;
        RETURN;
    END IF;
    RETURN QUERY
        SELECT s.rn, s.deduplicated
          FROM pyscheduler._submit_lean($1, $2, $3, pyscheduler._run_at($4, $7, now()), $5, $6, now(), NULL, $8, $9,
                                        $10) AS s;
END
$$;
COMMENT ON FUNCTION pyscheduler.submit_tasks_lean(pyscheduler.queue_name, pyscheduler.task_specs, bigint, timestamptz,
    pyscheduler.unique_key[], integer, interval, pyscheduler.concurrency_key[], uuid[],
    pyscheduler.parent_failure) IS
    'submit_tasks answering only (rn, deduplicated) per spec, in the order of specs: no task JSON built.';

CREATE OR REPLACE FUNCTION pyscheduler.submit_task_lean(
    queue pyscheduler.queue_name, spec pyscheduler.task_spec, priority bigint DEFAULT 50,
    run_at timestamptz DEFAULT NULL, unique_key pyscheduler.unique_key DEFAULT NULL,
    max_attempts integer DEFAULT NULL, run_in interval DEFAULT NULL,
    concurrency_key pyscheduler.concurrency_key DEFAULT NULL, after uuid[] DEFAULT NULL,
    on_parent_failure pyscheduler.parent_failure DEFAULT 'cancel')
RETURNS uuid
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* submit_task_lean(queue, spec, priority => 50, run_at => NULL, unique_key => NULL,
                    max_attempts => NULL, run_in => NULL, concurrency_key => NULL,
                    after => NULL, on_parent_failure => 'cancel') -> rn uuid
   submit_task (same arguments, checks, errors, ownership, NOTIFY), answering
   only the id: of the task the spec became, or of the live task holding its
   unique_key. A scalar, not a set: no rows to store and read back, ~25 us of
   server CPU less than submit_tasks_lean of one spec (issue 31). Without
   unique_key or after it takes _submit_one; else _submit_lean. */
BEGIN
    IF $5 IS NULL AND $9 IS NULL AND $10 IN ('cancel', 'run') THEN
        RETURN pyscheduler._submit_one($1, $2, $3, pyscheduler._run_at($4, $7, now()), $6, now(), $8, $10, 'spec');
    END IF;
    PERFORM pyscheduler._check_spec($2, 'spec', pyscheduler._task_limit('task_max_spec_bytes'));
    RETURN (SELECT s.rn
              FROM pyscheduler._submit_lean($1, jsonb_build_array($2), $3, pyscheduler._run_at($4, $7, now()),
                                            CASE WHEN $5 IS NOT NULL THEN ARRAY[$5::text] END, $6, now(), NULL,
                                            CASE WHEN $8 IS NOT NULL THEN ARRAY[$8::text] END, $9, $10) AS s);
END
$$;
COMMENT ON FUNCTION pyscheduler.submit_task_lean(pyscheduler.queue_name, pyscheduler.task_spec, bigint, timestamptz,
    pyscheduler.unique_key, integer, interval, pyscheduler.concurrency_key, uuid[], pyscheduler.parent_failure) IS
    'submit_task answering only the id (of the task made, or of the live task holding unique_key): no task JSON built.';

-- _json_integer_in(value, lo, hi): whether value (a JSON value; NULL: absent) is absent, JSON
-- null, or an integral JSON number in lo..hi.
CREATE OR REPLACE FUNCTION pyscheduler._json_integer_in(p_value jsonb, p_lo numeric, p_hi numeric)
RETURNS boolean
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE WHEN p_value IS NULL OR jsonb_typeof(p_value) = 'null' THEN true
                WHEN jsonb_typeof(p_value) <> 'number' THEN false
                ELSE p_value::numeric BETWEEN p_lo AND p_hi AND p_value::numeric = trunc(p_value::numeric) END
$$;

-- _workflow_refusal(node, max_spec_bytes, max_parents): what of a workflow node is refused, NULL
-- when nothing is: 'node' (not an object, or a key it may not have), else the first key, in this
-- order, whose value has the wrong JSON type or is out of submit_task's bounds (JSON null: an
-- optional key left out). Evaluated for every node in one pass; _workflow_refused raises for the
-- first node refused, naming it.
CREATE OR REPLACE FUNCTION pyscheduler._workflow_refusal(n jsonb, p_max_spec integer, p_max_parents integer)
RETURNS text
LANGUAGE sql STABLE  -- as pg_input_is_valid: so the query inlines it
AS $$
    SELECT CASE
        WHEN jsonb_typeof(n) <> 'object' THEN 'node'
        WHEN n - ARRAY['name', 'queue', 'spec', 'after', 'priority', 'unique_key', 'max_attempts', 'concurrency_key',
                       'run_in', 'on_parent_failure'] <> '{}' THEN 'node'
        WHEN jsonb_typeof(n -> 'name') IS DISTINCT FROM 'string'
          OR pyscheduler._label_refusal(n ->> 'name', 200) IS NOT NULL THEN 'name'
        WHEN jsonb_typeof(n -> 'queue') IS DISTINCT FROM 'string'
          OR pyscheduler._label_refusal(n ->> 'queue', 40) IS NOT NULL THEN 'queue'  -- the domain queue_name's rule
        WHEN jsonb_typeof(n -> 'spec') IS DISTINCT FROM 'object' OR pg_column_size(n -> 'spec') > p_max_spec THEN 'spec'
        WHEN n ? 'after' AND (jsonb_typeof(n -> 'after') <> 'array' OR jsonb_array_length(n -> 'after') > p_max_parents
                              OR jsonb_path_exists(n -> 'after', '$[*] ? (@.type() != "string")')) THEN 'after'
        WHEN NOT pyscheduler._json_integer_in(n -> 'priority', 0, 4294967295) THEN 'priority'
        WHEN NOT pyscheduler._json_integer_in(n -> 'max_attempts', 1, 1000) THEN 'max_attempts'
        WHEN coalesce(jsonb_typeof(n -> 'unique_key'), 'null') NOT IN ('string', 'null')
          OR (jsonb_typeof(n -> 'unique_key') = 'string' AND pyscheduler._label_refusal(n ->> 'unique_key', 200) IS NOT NULL)
            THEN 'unique_key'
        WHEN coalesce(jsonb_typeof(n -> 'concurrency_key'), 'null') NOT IN ('string', 'null')
          OR (jsonb_typeof(n -> 'concurrency_key') = 'string'
              AND pyscheduler._label_refusal(n ->> 'concurrency_key', 200) IS NOT NULL) THEN 'concurrency_key'
        WHEN coalesce(jsonb_typeof(n -> 'run_in'), 'null') NOT IN ('string', 'number', 'null') THEN 'run_in'
        WHEN n ->> 'run_in' IS NOT NULL AND NOT pg_input_is_valid(n ->> 'run_in', 'interval') THEN 'run_in'
        WHEN NOT coalesce(extract(epoch FROM (n ->> 'run_in')::interval) BETWEEN 0 AND 31536000, true) THEN 'run_in'
        WHEN coalesce(n ->> 'on_parent_failure', 'cancel') NOT IN ('cancel', 'run') THEN 'on_parent_failure'
    END
$$;

-- _workflow_refused(i, node, what, max_spec_bytes, max_parents): raise the error of node i
-- (0-based) of a workflow for what _workflow_refusal found, naming the node ("workflow[i]
-- ('name'): "): a value of the wrong JSON type with its key's SQLSTATE (queue PS208, spec PS206,
-- priority PS204, max_attempts PS208, unique_key PS213, concurrency_key PS215, run_in PS212,
-- on_parent_failure PS219; the node's shape, name and after PS220), a value out of bounds with
-- the error of submit_task's own check of it (_check_submit, _check_spec, _check_unique_key, ...).
CREATE OR REPLACE FUNCTION pyscheduler._workflow_refused(p_i integer, n jsonb, p_what text, p_max_spec integer,
                                                         p_max_parents integer)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_node text := format('workflow[%s]', p_i)
                   || CASE WHEN jsonb_typeof(n -> 'name') = 'string' THEN format(' (%s)', quote_literal(left(n ->> 'name', 100)))
                           ELSE '' END;
    v_type text := CASE WHEN p_what <> 'node' THEN jsonb_typeof(n -> p_what) END;
    v_got text := CASE WHEN p_what <> 'node' THEN coalesce(left((n -> p_what)::text, 200), 'nothing') END;
    v_number numeric := CASE WHEN v_type = 'number' THEN (n -> p_what)::numeric END;
    v_state text;
    v_message text;
    v_hint text;
BEGIN
    BEGIN
        CASE p_what
        WHEN 'node' THEN
            RAISE EXCEPTION 'must be an object with a "name", an "after" array of names and only the keys name, queue, spec, after, priority, unique_key, max_attempts, concurrency_key, run_in, on_parent_failure; got %',
                            left(n::text, 200)
                USING ERRCODE = 'PS220';
        WHEN 'name' THEN
            RAISE EXCEPTION 'name %, got %',
                            coalesce(CASE WHEN v_type = 'string' THEN pyscheduler._label_refusal(n ->> 'name', 200) END,
                                     'must be a JSON string'), v_got
                USING ERRCODE = 'PS220';
        WHEN 'queue' THEN
            IF v_type IS DISTINCT FROM 'string' THEN
                RAISE EXCEPTION 'queue must be a JSON string, got %', v_got
                    USING ERRCODE = 'PS208', HINT = 'The name of the queue the task is submitted to, 1 to 40 bytes.';
            END IF;
            PERFORM pyscheduler._require_label('queue', n ->> 'queue', 40, 'PS208',
                                               'The name of the queue the task is submitted to, 1 to 40 bytes.');
        WHEN 'spec' THEN
            PERFORM pyscheduler._check_spec(n -> 'spec', 'spec', p_max_spec);
        WHEN 'after' THEN
            IF v_type = 'array' AND jsonb_array_length(n -> 'after') > p_max_parents THEN
                RAISE EXCEPTION 'after names % nodes, more than task_max_parents (%)', jsonb_array_length(n -> 'after'),
                                p_max_parents
                    USING ERRCODE = 'PS219', HINT = 'A task after many tasks: submit it after fewer join tasks.';
            END IF;
            RAISE EXCEPTION 'after must be a JSON array of node names, got %', v_got USING ERRCODE = 'PS220';
        WHEN 'priority', 'max_attempts' THEN
            -- a JSON integer that fits the parameter's type; then the parameter's own check
            IF v_number IS NULL OR v_number <> trunc(v_number)
               OR abs(v_number) > (CASE p_what WHEN 'priority' THEN 9223372036854775807 ELSE 2147483647 END) THEN
                RAISE EXCEPTION '% must be a JSON integer, got %', p_what, v_got
                    USING ERRCODE = CASE p_what WHEN 'priority' THEN 'PS204' ELSE 'PS208' END;
            END IF;
            IF p_what = 'priority' THEN
                PERFORM pyscheduler._check_task_args(p_priority => v_number::bigint);
            ELSE
                PERFORM pyscheduler._check_submit(n ->> 'queue', 50, NULL, v_number::integer);
            END IF;
        WHEN 'unique_key' THEN
            IF v_type <> 'string' THEN
                RAISE EXCEPTION 'unique_key must be a JSON string, got %', v_got USING ERRCODE = 'PS213';
            END IF;
            PERFORM pyscheduler._check_unique_key(n ->> 'unique_key');
        WHEN 'concurrency_key' THEN
            IF v_type <> 'string' THEN
                RAISE EXCEPTION 'concurrency_key must be a JSON string, got %', v_got USING ERRCODE = 'PS215';
            END IF;
            PERFORM pyscheduler._check_concurrency_key(n ->> 'concurrency_key');
        WHEN 'run_in' THEN
            IF v_type NOT IN ('string', 'number') OR NOT pg_input_is_valid(n ->> 'run_in', 'interval') THEN
                RAISE EXCEPTION 'run_in must be an interval (a JSON string such as "5 minutes", or a number of seconds), got %',
                                v_got
                    USING ERRCODE = 'PS212';
            END IF;
            PERFORM pyscheduler._run_at(NULL, (n ->> 'run_in')::interval, now());
        WHEN 'on_parent_failure' THEN
            RAISE EXCEPTION 'on_parent_failure must be "cancel" or "run", got %', v_got
                USING ERRCODE = 'PS219', HINT = 'cancel (the default): a parent aborted or cancelled cancels the task; run: it runs anyway.';
        END CASE;
        RAISE EXCEPTION '% is refused, got %', p_what, v_got USING ERRCODE = 'PS220';  -- (a check above raises first)
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT, v_hint = PG_EXCEPTION_HINT;
        IF v_hint = '' THEN
            RAISE EXCEPTION '%: %', v_node, v_message USING ERRCODE = v_state;
        END IF;
        RAISE EXCEPTION '%: %', v_node, v_message USING ERRCODE = v_state, HINT = v_hint;
    END;
END
$$;

-- _submit_workflow(workflow, p_now): submit_workflow. Linear in the nodes and edges (a chain
-- of 10,000 nodes costs about what submit_tasks of 10,000 specs does): every check is one pass
-- over the nodes in SQL, the order (Kahn's, parents first) one pass over arrays indexed by
-- position, the tasks one INSERT and their edges another. A node's task: its own, new; or, with
-- a unique_key that a node earlier in that order has, that node's; or the live task that holds
-- it (locked until the transaction ends, so the nodes after it wait for a live task), both
-- answered "deduplicated" as submit_task does. A key taken by a concurrent submit meanwhile makes
-- the INSERT fail: the keys are looked up again (at most 10 rounds, then 40001).
CREATE OR REPLACE FUNCTION pyscheduler._submit_workflow(workflow jsonb, p_now timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_max integer := pyscheduler._task_limit('task_max_workflow_nodes');
    v_max_spec integer := pyscheduler._task_limit('task_max_spec_bytes');
    v_max_parents integer := pyscheduler._task_limit('task_max_parents');
    v_prefix bigint := pyscheduler._rn_prefix(p_now);
    v_by name := pyscheduler._caller();
    v_n integer;
    v_bad record;
    v_index jsonb;          -- name -> position (1-based)
    v_ep integer[];         -- the edges (parent, child) between positions, distinct, ordered by parent
    v_ec integer[];
    v_start integer[];      -- the children of position p are v_ec[v_start[p] .. v_start[p + 1] - 1]
    v_indegree integer[];
    v_order integer[];      -- positions in Kahn's order: parents first, the submission order
    v_tail integer := 0;
    v_p integer;
    v_c integer;
    v_rank integer[];       -- position -> its place in v_order
    v_seqs bigint[];        -- place in v_order -> seq
    v_any_key boolean;      -- a node has a unique_key
    v_keyed jsonb;          -- [queue, unique_key] -> position of the first node with them
    v_own integer[];        -- position -> the position whose task it is (itself; an earlier node with its key)
    v_own_rns uuid[];
    v_to integer[];         -- as v_own, 0: the live task that held the key
    v_rns uuid[];           -- position -> its task's rn
    v_waiting integer[];    -- position -> how many tasks it waits for
    v_kids boolean[];       -- position -> a new task of this workflow waits for it
    v_inserted boolean := false;
    v_firsts integer[];     -- positions whose key a live task holds, and those tasks
    v_held uuid[];
    v_parents uuid[];       -- live tasks that held a key and that new tasks wait for
    v_queues text[];
    v_tos pyscheduler.task_status[];
BEGIN
    IF workflow IS NULL OR jsonb_typeof(workflow) <> 'array' OR jsonb_array_length(workflow) = 0 THEN
        RAISE EXCEPTION 'workflow must be a non-empty JSON array of nodes, got %', coalesce(left(workflow::text, 200), 'NULL')
            USING ERRCODE = 'PS220',
                  HINT = 'e.g. ''[{"name": "a", "queue": "q", "spec": {}}, {"name": "b", "queue": "q", "spec": {}, "after": ["a"]}]''';
    END IF;
    v_n := jsonb_array_length(workflow);
    IF v_n > v_max THEN
        RAISE EXCEPTION 'workflow has % nodes, more than task_max_workflow_nodes (%)', v_n, v_max
            USING ERRCODE = 'PS220', HINT = 'Submit a large graph in parts: later parts may name earlier tasks by rn (after).';
    END IF;
    -- every node's keys and values, in one pass; the first node refused raises, naming it
    SELECT a.i - 1 AS i, a.e, r.what INTO v_bad
      FROM jsonb_array_elements(workflow) WITH ORDINALITY AS a(e, i),
           LATERAL (SELECT pyscheduler._workflow_refusal(a.e, v_max_spec, v_max_parents) AS what) AS r
     WHERE r.what IS NOT NULL
     LIMIT 1;
    IF FOUND THEN
        PERFORM pyscheduler._workflow_refused(v_bad.i::integer, v_bad.e, v_bad.what, v_max_spec, v_max_parents);
    END IF;
    -- names: unique (an object keeps the last of equal keys); the edges: each name in after, a node's
    SELECT jsonb_object_agg(a.e ->> 'name', a.i), bool_or(jsonb_typeof(a.e -> 'unique_key') = 'string')
      INTO v_index, v_any_key
      FROM jsonb_array_elements(workflow) WITH ORDINALITY AS a(e, i);
    IF (SELECT count(*) FROM jsonb_object_keys(v_index)) < v_n THEN
        SELECT d.i - 1 AS i, d.name INTO v_bad
          FROM (SELECT a.i, a.e ->> 'name' AS name, row_number() OVER (PARTITION BY a.e ->> 'name' ORDER BY a.i) AS k
                  FROM jsonb_array_elements(workflow) WITH ORDINALITY AS a(e, i)) AS d
         WHERE d.k = 2
         ORDER BY d.i
         LIMIT 1;
        RAISE EXCEPTION 'workflow[%]: the name % is used twice', v_bad.i, quote_literal(v_bad.name) USING ERRCODE = 'PS220';
    END IF;
    SELECT coalesce(array_agg(e.p), '{}'), coalesce(array_agg(e.c), '{}') INTO v_ep, v_ec
      FROM (SELECT DISTINCT (v_index ->> x.name)::integer AS p, a.i::integer AS c
              FROM jsonb_array_elements(workflow) WITH ORDINALITY AS a(e, i),
                   jsonb_array_elements_text(a.e -> 'after') AS x(name)
             ORDER BY 1, 2) AS e;
    IF array_position(v_ep, NULL) IS NOT NULL THEN
        SELECT a.i - 1 AS i, x.name INTO v_bad
          FROM jsonb_array_elements(workflow) WITH ORDINALITY AS a(e, i), jsonb_array_elements_text(a.e -> 'after') AS x(name)
         WHERE NOT v_index ? x.name
         LIMIT 1;
        RAISE EXCEPTION 'workflow[%] is after %, which no node of the workflow is named', v_bad.i,
                        quote_literal(left(v_bad.name, 100))
            USING ERRCODE = 'PS220';
    END IF;
    -- Kahn's order over the edges as adjacency arrays (a cycle leaves nodes out)
    v_indegree := array_fill(0, ARRAY[v_n]);
    v_start := array_fill(0, ARRAY[v_n + 1]);
    FOR k IN 1..cardinality(v_ec) LOOP
        v_indegree[v_ec[k]] := v_indegree[v_ec[k]] + 1;
        v_start[v_ep[k] + 1] := v_start[v_ep[k] + 1] + 1;
    END LOOP;
    v_waiting := v_indegree;
    v_start[1] := 1;
    FOR p IN 2..v_n + 1 LOOP
        v_start[p] := v_start[p] + v_start[p - 1];
    END LOOP;
    v_order := array_fill(0, ARRAY[v_n]);
    FOR p IN 1..v_n LOOP
        IF v_indegree[p] = 0 THEN
            v_tail := v_tail + 1;
            v_order[v_tail] := p;
        END IF;
    END LOOP;
    FOR h IN 1..v_n LOOP
        EXIT WHEN h > v_tail;
        v_p := v_order[h];
        FOR k IN v_start[v_p]..v_start[v_p + 1] - 1 LOOP
            v_c := v_ec[k];
            v_indegree[v_c] := v_indegree[v_c] - 1;
            IF v_indegree[v_c] = 0 THEN
                v_tail := v_tail + 1;
                v_order[v_tail] := v_c;
            END IF;
        END LOOP;
    END LOOP;
    IF v_tail < v_n THEN
        RAISE EXCEPTION 'workflow has a cycle (through %)',
                        (SELECT string_agg(quote_literal(workflow -> (i - 1) ->> 'name'), ', ')
                           FROM (SELECT i FROM generate_subscripts(v_indegree, 1) AS i WHERE v_indegree[i] > 0
                                 LIMIT 5) AS x)
            USING ERRCODE = 'PS220', HINT = 'A task cannot wait for itself, directly or through others.';
    END IF;
    v_rank := array_fill(0, ARRAY[v_n]);
    FOR k IN 1..v_n LOOP
        v_rank[v_order[k]] := k;
    END LOOP;
    v_seqs := ARRAY(SELECT nextval('pyscheduler.task_seq') FROM generate_series(1, v_n));
    v_own := ARRAY(SELECT generate_series(1, v_n));
    v_own_rns := ARRAY(SELECT pyscheduler._task_rn(v_prefix, v_seqs[v_rank[p]]) FROM generate_series(1, v_n) AS p);
    -- unique keys: a node whose key a node earlier in that order has is that node's task
    IF v_any_key THEN
        FOR v_bad IN
            SELECT k.p, first_value(k.p) OVER (PARTITION BY k.queue, k.key ORDER BY v_rank[k.p]) AS first
              FROM (SELECT a.i::integer AS p, a.e ->> 'queue' AS queue, a.e ->> 'unique_key' AS key
                      FROM jsonb_array_elements(workflow) WITH ORDINALITY AS a(e, i)
                     WHERE jsonb_typeof(a.e -> 'unique_key') = 'string') AS k
        LOOP
            IF v_bad.first <> v_bad.p THEN
                v_own[v_bad.p] := v_bad.first;
                v_own_rns[v_bad.p] := v_own_rns[v_bad.first];
            END IF;
        END LOOP;
        v_keyed := (SELECT jsonb_object_agg(jsonb_build_array(a.e ->> 'queue', a.e ->> 'unique_key')::text, a.i)
                      FROM jsonb_array_elements(workflow) WITH ORDINALITY AS a(e, i)
                     WHERE jsonb_typeof(a.e -> 'unique_key') = 'string' AND v_own[a.i] = a.i);
    END IF;
    PERFORM pyscheduler._claim_queue(q.queue, v_by, p_now)
       FROM (SELECT DISTINCT a.e ->> 'queue' AS queue FROM jsonb_array_elements(workflow) AS a(e)) AS q;
    FOR v_round IN 1..10 LOOP
        BEGIN
            v_to := v_own;
            v_rns := v_own_rns;
            IF v_any_key THEN
                -- a key that a live task holds: that task, locked (rn order) until this transaction ends
                SELECT coalesce(array_agg(h.p), '{}'), coalesce(array_agg(h.rn), '{}') INTO v_firsts, v_held
                  FROM (SELECT t.rn, (v_keyed ->> jsonb_build_array(t.queue, t.unique_key)::text)::integer AS p
                          FROM pyscheduler.tasks t
                         WHERE t.unique_key IS NOT NULL AND t.status IN ('waiting', 'scheduled', 'ready', 'running')
                           AND t.submitted_by = v_by  -- a unique key is its role's own
                           AND (t.queue, t.unique_key) IN (SELECT k.key::jsonb ->> 0, k.key::jsonb ->> 1
                                                             FROM jsonb_object_keys(v_keyed) AS k(key))
                         ORDER BY t.rn
                           FOR NO KEY UPDATE OF t) AS h;
                FOR k IN 1..cardinality(v_firsts) LOOP
                    v_to[v_firsts[k]] := 0;
                    v_rns[v_firsts[k]] := v_held[k];
                END LOOP;
                FOR p IN 1..v_n LOOP
                    IF v_to[p] > 0 AND v_to[p] <> p AND v_to[v_to[p]] = 0 THEN
                        v_rns[p] := v_rns[v_to[p]];
                        v_to[p] := 0;
                    END IF;
                END LOOP;
                -- parents counted once however many of their nodes a node names
                v_waiting := array_fill(0, ARRAY[v_n]);
                FOR v_bad IN SELECT e.c, count(DISTINCT v_rns[e.p]) AS n FROM unnest(v_ep, v_ec) AS e(p, c) GROUP BY e.c
                LOOP
                    v_waiting[v_bad.c] := v_bad.n;
                END LOOP;
            END IF;
            -- who has children among the new tasks: new tasks (has_children), live tasks that held a key
            v_kids := array_fill(false, ARRAY[v_n]);
            v_parents := '{}';
            FOR k IN 1..cardinality(v_ec) LOOP
                IF v_to[v_ec[k]] = v_ec[k] THEN
                    IF v_to[v_ep[k]] > 0 THEN
                        v_kids[v_to[v_ep[k]]] := true;
                    ELSE
                        v_parents := v_parents || v_rns[v_ep[k]];
                    END IF;
                END IF;
            END LOOP;
            -- the new tasks, in submission order: waiting for their parents (after: in the order
            -- named), else ready, or scheduled until run_in has passed
            WITH ins AS (
                INSERT INTO pyscheduler.tasks AS t (rn, seq, queue, spec, priority, status, progress, created, updated,
                                                    errors, history, run_at, max_attempts, submitted_by, unique_key,
                                                    concurrency_key, after, waiting_on, on_parent_failure, has_children)
                SELECT v_rns[a.i], v_seqs[v_rank[a.i]], a.e ->> 'queue', a.e -> 'spec',
                       coalesce((a.e ->> 'priority')::numeric::bigint, 50),
                       CASE WHEN v_waiting[a.i] > 0 THEN 'waiting' WHEN a.run_at > p_now THEN 'scheduled'
                            ELSE 'ready' END::pyscheduler.task_status,
                       0, p_now, p_now, '[]', '[]', a.run_at, (a.e ->> 'max_attempts')::numeric::integer, v_by,
                       a.e ->> 'unique_key', a.e ->> 'concurrency_key',
                       CASE WHEN v_waiting[a.i] > 0
                            THEN ARRAY(SELECT v_rns[(v_index ->> x.name)::integer]
                                         FROM jsonb_array_elements_text(a.e -> 'after') AS x(name)) END,
                       v_waiting[a.i], nullif(a.e ->> 'on_parent_failure', 'cancel'), v_kids[a.i]
                  FROM (SELECT a.i, a.e, CASE WHEN a.e ->> 'run_in' IS NOT NULL
                                              THEN pyscheduler._run_at(NULL, (a.e ->> 'run_in')::interval, p_now) END
                                             AS run_at
                          FROM jsonb_array_elements(workflow) WITH ORDINALITY AS a(e, i)) AS a
                 WHERE v_to[a.i] = a.i
                 ORDER BY v_rank[a.i]
                RETURNING t.queue, t.status)
            SELECT array_agg(ins.queue), array_agg(ins.status) INTO v_queues, v_tos FROM ins;
            v_inserted := true;
            EXIT;
        EXCEPTION WHEN unique_violation THEN
            NULL;  -- a concurrent submit took a key meanwhile: look the keys up again
        END;
    END LOOP;
    IF NOT v_inserted THEN
        RAISE EXCEPTION 'unique keys kept changing hands while submitting; try again' USING ERRCODE = '40001';
    END IF;
    -- a live task that held a key (the caller's own) and that new tasks wait for: marked
    UPDATE pyscheduler.tasks t SET has_children = true WHERE t.rn = ANY (v_parents) AND NOT t.has_children;
    INSERT INTO pyscheduler.task_edges (parent, child)
    SELECT DISTINCT v_rns[v_ep[k]], v_rns[v_ec[k]] FROM generate_subscripts(v_ep, 1) AS k WHERE v_to[v_ec[k]] = v_ec[k];
    PERFORM pyscheduler._task_tally_many(v_queues, NULL, NULL, p_tos => v_tos);
    PERFORM pyscheduler._notify_throttled(pyscheduler._task_channel(q))
       FROM (SELECT DISTINCT u.q FROM unnest(v_queues, v_tos) AS u(q, s) WHERE u.s IN ('ready', 'scheduled')) AS x;
    -- the answer: each node's task, read back by primary key
    RETURN (SELECT jsonb_object_agg(a.e ->> 'name', pyscheduler._task_json(t)
                                    || CASE WHEN v_to[a.i] = a.i THEN '{}' ELSE '{"deduplicated": true}' END::jsonb)
              FROM jsonb_array_elements(workflow) WITH ORDINALITY AS a(e, i)
              JOIN pyscheduler.tasks t ON t.rn = v_rns[a.i]);
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.submit_workflow(workflow pyscheduler.task_workflow)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* submit_workflow(workflow) -> {"<name>": task, ...}
   Submit a graph of tasks in one call (one transaction: all or nothing).
   workflow: a JSON array of nodes {"name", "queue", "spec", "after":
   [names], and optionally "priority", "unique_key", "max_attempts",
   "concurrency_key", "run_in", "on_parent_failure"} (submit_task's
   parameters; JSON null leaves one out; run_in a string such as "5
   minutes" or a number of seconds); a node waits for the nodes it names in
   after. Nodes are submitted parents first; the answer maps each name to its
   task (a node whose unique_key an earlier node or a live task holds: that
   task, "deduplicated": true). At most task_max_workflow_nodes nodes; the
   cost is linear in nodes and edges.
   Errors: PS220 not an array of such nodes, a name used twice, after not an
   array of names or naming no node, a cycle (a node after itself included),
   too many nodes; a node's value of the wrong JSON type or out of bounds
   with its parameter's code, the message naming the node and the key
   (PS208 queue, max_attempts, PS206 spec, PS204 priority, PS213 unique_key,
   PS215 concurrency_key, PS212 run_in, PS219 on_parent_failure, too many
   parents). */
BEGIN
    RETURN pyscheduler._submit_workflow(workflow, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.submit_workflow(pyscheduler.task_workflow) IS
    'Submit a graph of tasks (nodes naming the nodes they run after) in one transaction; refuses cycles and unknown names.';

CREATE OR REPLACE FUNCTION pyscheduler.get_task(rn uuid)
RETURNS jsonb
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* get_task(rn) -> task jsonb
   The task in the seed's JSON shape (never its lease token). A task of
   another role (one the caller is not a member of; admin sees all) shows
   its metadata only: spec, result, errors, history, unique_key and
   concurrency_key are null and "redacted" is true. A task suspended waiting
   for an event (await_event) is 'scheduled' and shows
   "awaiting": {"event", "since", "until"} (its contents: not when redacted).
   Errors: PS200 unknown task. */
#variable_conflict use_column
DECLARE
    v_task jsonb;
    v_awaiting jsonb;
BEGIN
    SELECT _task_seen_json(t, _seen_owners()) INTO v_task FROM tasks t WHERE t.rn = get_task.rn;
    IF v_task IS NULL THEN
        PERFORM _task_refused(get_task.rn, NULL);
    END IF;
    IF v_task ->> 'status' = 'scheduled' AND v_task -> 'redacted' IS NULL THEN
        SELECT jsonb_build_object('event', w.name, 'since', _ts(w.since), 'until', _ts(w.until)) INTO v_awaiting
          FROM task_waits w WHERE w.rn = get_task.rn ORDER BY w.since DESC LIMIT 1;
        IF v_awaiting IS NOT NULL THEN
            v_task := v_task || jsonb_build_object('awaiting', v_awaiting);
        END IF;
    END IF;
    RETURN v_task;
END
$$;
COMMENT ON FUNCTION pyscheduler.get_task(uuid) IS
    'One task as JSON (another role''s: metadata only, "redacted"); PS200 when it does not exist.';

CREATE OR REPLACE FUNCTION pyscheduler.list_tasks(
    queue pyscheduler.queue_name DEFAULT NULL, status pyscheduler.status_word DEFAULT NULL,
    owner pyscheduler.worker_id DEFAULT NULL, max_tasks integer DEFAULT 100, before_rn uuid DEFAULT NULL)
RETURNS TABLE (task jsonb)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
-- a page walks an index from the cursor on and stops at max_tasks (issues 21, 34): the plan is
-- pinned, not left to the statistics. Each statement orders by the leading column of the index
-- that serves it as well, bounded by a range or an array (= ANY: an equality would make that
-- order redundant; a range would leave the index's next column unbounded): the primary key,
-- which a skewed sample makes look cheaper, cannot give that order without a sort, and sorts
-- are off; the status is written into the query, so a partial index can serve it
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_sort = off SET enable_incremental_sort = off
SET enable_indexscan = on
AS $$
/* list_tasks(queue => NULL, status => NULL, owner => NULL, max_tasks => 100, before_rn => NULL)
       -> setof (task jsonb)
   Tasks matching every filter given (NULL = any), newest first (by rn: a task
   id is its submission millisecond, then its submission order), at most
   max_tasks.
   status: waiting | scheduled | ready | running | completed | aborted | cancelled.
   Keyset pagination: pass the last rn of a page as before_rn to get the next
   (older) page. Ids never change, so a walk returns every task that keeps
   matching once, even while others are submitted (they are newer: on pages
   already read). Without queue and status a page reads the primary key
   backwards from the cursor; aborted and cancelled tasks are read from
   tasks_failed_idx in the same order; the running tasks from
   tasks_running_deadline_idx (the work running: as many as the workers hold).
   Every other status without queue is looked for first among the newest
   tasks (the primary key, ten pages' worth at most, 10,000); when the page is
   not all there, and with queue, it is read per queue (the one given, or
   each queue the tallies have with tasks of that status) and the pages
   merged: a queue's ready tasks per priority from tasks_ready_idx, at most a
   page each (_ready_page), its waiting, scheduled, completed, aborted or
   cancelled tasks from tasks_queue_status_rn_idx (queue, status, rn), newest
   first, never their whole backlog nor other queues' tasks: a quiet queue
   among busy ones reads its own tasks. With queue and without a status each
   status is read apart and the pages merged. An owner filter reads the tasks
   it skips. Tasks of other roles show their metadata only, as get_task's.
   Errors: PS208 unknown status or max_tasks < 1. */
#variable_conflict use_column
DECLARE
    v_filters text;
    v_sql text;
    v_seen name[] := _seen_owners();
    v_queues text[];
    v_page jsonb[];
BEGIN
    IF list_tasks.status IS NOT NULL
       AND NOT list_tasks.status = ANY (enum_range(NULL::task_status)::text[]) THEN
        RAISE EXCEPTION 'status must be one of %, got %', enum_range(NULL::task_status), list_tasks.status
            USING ERRCODE = 'PS208', HINT = 'Pass NULL for any status.';
    END IF;
    IF max_tasks IS NULL OR max_tasks < 1 THEN
        RAISE EXCEPTION 'max_tasks must be at least 1, got %', coalesce(max_tasks::text, 'NULL')
            USING ERRCODE = 'PS208';
    END IF;
    v_filters := CASE WHEN list_tasks.before_rn IS NULL THEN '' ELSE ' AND t.rn < $1' END
        || CASE WHEN list_tasks.owner IS NULL THEN '' ELSE ' AND t.owner = $3' END;
    IF list_tasks.queue IS NULL AND list_tasks.status IS NULL THEN
        v_sql := 'SELECT pyscheduler._task_seen_json(t, $5) FROM pyscheduler.tasks t WHERE true' || v_filters
            || ' ORDER BY t.rn DESC LIMIT $4';
    ELSIF list_tasks.queue IS NULL AND list_tasks.status IN ('aborted', 'cancelled') THEN
        -- tasks_failed_idx (status, rn); the IN list is its predicate
        v_sql := format('SELECT pyscheduler._task_seen_json(t, $5) FROM pyscheduler.tasks t '
                        'WHERE t.status IN (''aborted'', ''cancelled'') AND t.status >= %1$L AND t.status <= %1$L%2$s '
                        'ORDER BY t.status DESC, t.rn DESC LIMIT $4', list_tasks.status, v_filters);
    ELSE
        IF list_tasks.queue IS NULL AND list_tasks.status <> 'running' THEN
            -- first the newest tasks of any status, by the primary key, ten pages' worth at most
            -- (10,000): where the page is among them, as when the status is what most tasks are
            -- or what is being added, it is read there and the merge below is not needed
            EXECUTE format('SELECT array_agg(pyscheduler._task_seen_json(p.r, $5) ORDER BY p.rn DESC) FROM ('
                           'SELECT n.r, n.rn FROM (SELECT t AS r, t.rn FROM pyscheduler.tasks t WHERE true%s '
                           'ORDER BY t.rn DESC LIMIT $6) n WHERE (n.r).status = %L%s ORDER BY n.rn DESC LIMIT $4) p',
                           CASE WHEN list_tasks.before_rn IS NULL THEN '' ELSE ' AND t.rn < $1' END,
                           list_tasks.status,
                           CASE WHEN list_tasks.owner IS NULL THEN '' ELSE ' AND (n.r).owner = $3' END)
              INTO v_page
             USING list_tasks.before_rn, list_tasks.queue, list_tasks.owner, list_tasks.max_tasks, v_seen,
                   least(10::bigint * list_tasks.max_tasks, 10000);
            IF cardinality(v_page) = list_tasks.max_tasks THEN
                RETURN QUERY SELECT unnest(v_page);
                RETURN;
            END IF;
        END IF;
        -- the queues read: the one given, or each with tasks of the status (the tallies)
        v_queues := CASE WHEN list_tasks.queue IS NOT NULL THEN ARRAY[list_tasks.queue::text]
                         ELSE ARRAY(SELECT DISTINCT c.queue FROM _task_tallied() c
                                     WHERE c.status = list_tasks.status::task_status) END;
        -- each status asked for (without one, every status) from its own index, per queue newest
        -- first (ordered on the queue too: only an index led by the queue gives that order), and
        -- the pages merged
        SELECT 'SELECT pyscheduler._task_seen_json(u.r, $5) FROM ('
               || string_agg(CASE
                    WHEN w = 't.status = ''ready''' AND list_tasks.owner IS NULL THEN
                        '(SELECT t AS r, t.rn FROM unnest($6::text[]) q (queue), '
                        'LATERAL pyscheduler._ready_page(q.queue, $1, $4) t)'
                    WHEN w = 't.status = ''running''' THEN
                        -- in deadline order first: only tasks_running_deadline_idx gives it
                        format('(SELECT s.t AS r, (s.t).rn FROM (SELECT t FROM pyscheduler.tasks t WHERE %s '
                               'AND t.queue = ANY ($6::text[])%s ORDER BY t.deadline) s ORDER BY 2 DESC LIMIT $4)',
                               w, v_filters)
                    ELSE
                        format('(SELECT x.r, x.rn FROM unnest($6::text[]) q (queue), LATERAL ('
                               'SELECT t AS r, t.rn FROM pyscheduler.tasks t '
                               'WHERE %s AND t.queue = ANY (ARRAY[q.queue])%s '
                               'ORDER BY t.queue DESC, t.rn DESC LIMIT $4) x)', w, v_filters) END, ' UNION ALL ')
               || ') u ORDER BY u.rn DESC LIMIT $4'
          INTO v_sql
          FROM unnest(CASE WHEN list_tasks.status IS NOT NULL THEN ARRAY[format('t.status = %L', list_tasks.status)]
                           ELSE ARRAY(SELECT format('t.status = %L', s) FROM unnest(enum_range(NULL::task_status)) s)
                           END) w;
    END IF;
    RETURN QUERY EXECUTE v_sql USING list_tasks.before_rn, list_tasks.queue, list_tasks.owner, list_tasks.max_tasks,
                                     v_seen, v_queues;
END
$$;
COMMENT ON FUNCTION pyscheduler.list_tasks(pyscheduler.queue_name, pyscheduler.status_word, pyscheduler.worker_id,
    integer, uuid) IS
    'Tasks filtered by queue, status and owner (NULL = any), newest first, at most max_tasks; a page '
    'from before_rn on (keyset).';

-- _owned_task(rn): task rn, locked (FOR UPDATE), when the caller may act on it
-- (convention C: the role that submitted it, a member of it, or admin);
-- PS200 when there is none, 42501 when it belongs to another role.
CREATE OR REPLACE FUNCTION pyscheduler._owned_task(p_rn uuid)
RETURNS pyscheduler.tasks
LANGUAGE plpgsql
AS $$
DECLARE
    v_task pyscheduler.tasks;
BEGIN
    SELECT * INTO v_task FROM pyscheduler.tasks t WHERE t.rn = p_rn FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM pyscheduler._task_refused(p_rn, NULL);
    END IF;
    PERFORM pyscheduler._require_owner(v_task.submitted_by, format('task %s', p_rn));
    RETURN v_task;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler._cancel_task(rn uuid, p_now timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_task pyscheduler.tasks := pyscheduler._owned_task(_cancel_task.rn);
    v_was pyscheduler.task_status := v_task.status;
BEGIN
    IF v_task.status = 'cancelled' THEN
        RETURN pyscheduler._task_json(v_task);
    ELSIF v_task.status NOT IN ('waiting', 'scheduled', 'ready', 'running') THEN
        RAISE EXCEPTION 'task % is already %', _cancel_task.rn, v_task.status
            USING ERRCODE = 'PS209', HINT = 'Only waiting, scheduled, ready or running tasks can be cancelled.';
    END IF;
    -- the current lease's TaskAssignment goes into history before the cancellation (leased_at
    -- NULL, as a yield does), so the entries read in the order they happened
    UPDATE pyscheduler.tasks t SET status = 'cancelled', deadline = NULL, updated = p_now, waiting_on = 0,
           leased_at = NULL,
           history = pyscheduler._trim_history(
                         pyscheduler._full_history(t.history, t.owner, t.leased_at) || jsonb_build_array(jsonb_build_object(
                         '_typ', 'TaskCancelled', 'by', pyscheduler._caller(), 'time', pyscheduler._ts(p_now))),
                                               pyscheduler._task_limit('task_max_history'))
     WHERE t.rn = _cancel_task.rn
    RETURNING t.* INTO v_task;
    PERFORM pyscheduler._task_tally(v_task.queue, v_was, 'cancelled', 1);
    IF v_task.owner IS NOT NULL AND v_task.lease_token IS NOT NULL THEN
        PERFORM pyscheduler._notify_throttled('pyscheduler_cancel:' || v_task.owner);
    END IF;
    IF v_task.watched OR v_task.has_children THEN
        PERFORM pyscheduler._finished(ARRAY[_cancel_task.rn], p_now);
        -- the parents' edges to a cancelled waiting task stay until they finish (_finished skips it)
    END IF;
    RETURN pyscheduler._task_json(v_task);
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.cancel_task(rn uuid)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* cancel_task(rn) -> task jsonb
   A waiting, scheduled, ready or running task becomes cancelled (terminal);
   its dependents are cancelled too (unless on_parent_failure 'run'). A running
   task keeps its owner, who is told at once (NOTIFY
   pyscheduler_cancel:<owner>) and in any case by PS203 on its next heartbeat
   or status write. Its history ends with {"_typ": "TaskCancelled", "by":
   the cancelling role, "time"}. Cancelling a cancelled task returns it unchanged. The
   task belongs to the role that submitted it: only that role, a member of
   it, or admin may cancel it (any client instance of that application, as in
   the seed; not another application's role).
   Errors: PS200 unknown task, PS209 already completed or aborted, 42501 the
   task belongs to another role. */
BEGIN
    RETURN pyscheduler._cancel_task(rn, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.cancel_task(uuid) IS
    'Cancel a waiting, scheduled, ready or running task of the caller''s role (terminal); the owner of a running task learns at once via NOTIFY.';

-- _requeue(rn, by, max_history, p_now): task rn (aborted or cancelled, locked by the caller)
-- requeued by role by for a fresh round of attempts (attempts 0, no owner, no lease, progress 0,
-- run_at NULL), errors kept, history += the last lease's TaskAssignment (when it is only in
-- leased_at) and TaskRequeued. Ready again, or, while some of its parents (after) are live,
-- waiting for them as a task submitted after them: they are locked in rn order and marked
-- has_children, and their edges to it made again (a parent that finished deleted its edges, a
-- parent requeued since had none), so each one's end counts it down (_finished). A parent that
-- completed, or was cleaned up, is done. PS211 when a parent is aborted or cancelled and the
-- task is not on_parent_failure 'run': its parent's failure would cancel it again. Raises
-- unique_violation when another live task of its queue holds its unique_key.
CREATE OR REPLACE FUNCTION pyscheduler._requeue(p_rn uuid, p_by name, p_max_history integer, p_now timestamptz)
RETURNS pyscheduler.tasks
LANGUAGE plpgsql
AS $$
DECLARE
    v_task pyscheduler.tasks;
    v_live uuid[] := '{}';
    v_failed uuid;
    v_failed_status pyscheduler.task_status;
BEGIN
    SELECT * INTO v_task FROM pyscheduler.tasks t WHERE t.rn = p_rn;
    IF v_task.after IS NOT NULL THEN
        -- the parents, locked: none finishes or is requeued before this transaction ends
        SELECT coalesce(array_agg(p.rn) FILTER (WHERE p.status IN ('waiting', 'scheduled', 'ready', 'running')), '{}'),
               (array_agg(p.rn) FILTER (WHERE p.status IN ('aborted', 'cancelled')))[1],
               (array_agg(p.status) FILTER (WHERE p.status IN ('aborted', 'cancelled')))[1]
          INTO v_live, v_failed, v_failed_status
          FROM (SELECT t.rn, t.status FROM pyscheduler.tasks t
                 WHERE t.rn = ANY (v_task.after)
                 ORDER BY t.rn
                   FOR NO KEY UPDATE) AS p;
        IF v_failed IS NOT NULL AND v_task.on_parent_failure IS NULL THEN
            RAISE EXCEPTION 'task % runs after task %, which is %: requeue that task first', p_rn, v_failed,
                            v_failed_status
                USING ERRCODE = 'PS211',
                      HINT = 'A requeued task waits for its live parents; a failed one would cancel it again.';
        END IF;
        UPDATE pyscheduler.tasks t SET has_children = true WHERE t.rn = ANY (v_live) AND NOT t.has_children;
        INSERT INTO pyscheduler.task_edges (parent, child)
        SELECT p, p_rn FROM unnest(v_live) AS p
        ON CONFLICT (parent, child) DO NOTHING;
    END IF;
    UPDATE pyscheduler.tasks t
       SET status = CASE WHEN cardinality(v_live) > 0 THEN 'waiting' ELSE 'ready' END::pyscheduler.task_status,
           waiting_on = cardinality(v_live), attempts = 0, owner = NULL, lease_token = NULL, leased_at = NULL,
           deadline = NULL, progress = 0, run_at = NULL, updated = p_now,
           history = pyscheduler._trim_history(
               pyscheduler._full_history(t.history, t.owner, t.leased_at)
               || jsonb_build_array(jsonb_build_object('_typ', 'TaskRequeued', 'by', p_by, 'status', t.status,
                                                       'attempts', t.attempts, 'time', pyscheduler._ts(p_now))),
               p_max_history)
     WHERE t.rn = p_rn
    RETURNING t.* INTO v_task;
    RETURN v_task;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler._retry_task(rn uuid, p_now timestamptz DEFAULT now())
RETURNS jsonb
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_task pyscheduler.tasks := pyscheduler._owned_task(_retry_task.rn);
    v_code text := pyscheduler._requeue_refusal(v_task.status);
    v_was pyscheduler.task_status := v_task.status;
BEGIN
    IF v_code IS NOT NULL THEN
        RAISE EXCEPTION 'task % is %: only aborted or cancelled tasks can be requeued', _retry_task.rn, v_task.status
            USING ERRCODE = v_code, HINT = 'A live task runs anyway; a completed one is done (submit a new task).';
    END IF;
    BEGIN
        v_task := pyscheduler._requeue(_retry_task.rn, pyscheduler._caller(),
                                       pyscheduler._task_limit('task_max_history'), p_now);
    EXCEPTION WHEN unique_violation THEN
        RAISE EXCEPTION 'task %: another live task of queue % holds its unique_key %', _retry_task.rn, v_task.queue,
                        quote_literal(v_task.unique_key)
            USING ERRCODE = 'PS214', HINT = 'That task runs the work already; requeue this one once it finished.';
    END;
    PERFORM pyscheduler._task_tally(v_task.queue, v_was, v_task.status, 1);
    IF v_task.status = 'ready' THEN
        PERFORM pyscheduler._notify_throttled(pyscheduler._task_channel(v_task.queue));
    END IF;
    RETURN pyscheduler._task_json(v_task);
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.retry_task(rn uuid)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* retry_task(rn) -> task jsonb
   Requeue an aborted or cancelled task: ready again for a fresh round of
   attempts (attempts 0, progress 0, no owner), its errors kept, history +=
   TaskRequeued {"by": the calling role, "status", "attempts": the ones used,
   "time"}; wakes the queue's workers. A task whose parents (after) are not
   all finished is waiting for the live ones instead, as if submitted after
   them now. An extension of the seed, whose aborted and cancelled tasks are
   terminal. Only the role that submitted the task, a member of it, or admin
   may requeue it.
   Errors: PS200 unknown task, PS211 not aborted or cancelled, or a parent is
   aborted or cancelled (requeue it first; not with on_parent_failure 'run'),
   PS214 another live task of its queue holds its unique_key, 42501 another
   role's task. */
BEGIN
    RETURN pyscheduler._retry_task(rn, now());
END
$$;
COMMENT ON FUNCTION pyscheduler.retry_task(uuid) IS
    'Requeue an aborted or cancelled task of the caller''s role: ready again with attempts reset, errors kept (TaskRequeued).';

CREATE OR REPLACE FUNCTION pyscheduler._retry_tasks(
    queue text, status text DEFAULT 'aborted', max_tasks integer DEFAULT 100, p_now timestamptz DEFAULT now())
RETURNS TABLE (task jsonb)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_caller name := pyscheduler._caller();
    v_admin boolean := pg_catalog.pg_has_role(pyscheduler._caller(), pyscheduler._role('admin'), 'MEMBER');
    v_history integer := pyscheduler._task_limit('task_max_history');
    v_task pyscheduler.tasks;
    v_tos pyscheduler.task_status[] := '{}';
BEGIN
    PERFORM pyscheduler._check_task_args(p_queue => _retry_tasks.queue, p_queue_given => true);
    IF _retry_tasks.status IS NULL OR _retry_tasks.status NOT IN ('aborted', 'cancelled') THEN
        RAISE EXCEPTION 'status must be aborted or cancelled, got %', coalesce(quote_literal(_retry_tasks.status), 'NULL')
            USING ERRCODE = 'PS208', HINT = 'Only aborted or cancelled tasks can be requeued.';
    END IF;
    IF max_tasks IS NULL OR max_tasks NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'max_tasks must be in 1..10000, got %', coalesce(max_tasks::text, 'NULL')
            USING ERRCODE = 'PS208', HINT = 'Call again while it returns max_tasks tasks.';
    END IF;
    FOR v_task IN
        SELECT * FROM pyscheduler.tasks t
         WHERE t.queue = _retry_tasks.queue AND t.status = _retry_tasks.status::pyscheduler.task_status
           AND (v_admin OR t.submitted_by = v_caller OR pyscheduler._may_act(t.submitted_by))
         ORDER BY t.updated, t.rn  -- parents before their children (ended together by a cascade)
         LIMIT max_tasks
           FOR UPDATE SKIP LOCKED
    LOOP
        BEGIN
            v_task := pyscheduler._requeue(v_task.rn, v_caller, v_history, p_now);
        EXCEPTION WHEN unique_violation OR SQLSTATE 'PS211' THEN
            CONTINUE;  -- another live task holds its unique_key, or a parent failed: it stays as it is
        END;
        v_tos := v_tos || v_task.status;
        task := pyscheduler._task_json(v_task);
        RETURN NEXT;
    END LOOP;
    PERFORM pyscheduler._task_tally_many(array_fill(_retry_tasks.queue, ARRAY[cardinality(v_tos)]),
                                         _retry_tasks.status::pyscheduler.task_status, NULL, p_tos => v_tos);
    IF 'ready' = ANY (v_tos) THEN
        PERFORM pyscheduler._notify_throttled(pyscheduler._task_channel(_retry_tasks.queue));
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.retry_tasks(
    queue pyscheduler.queue_name, status pyscheduler.status_word DEFAULT 'aborted', max_tasks integer DEFAULT 100)
RETURNS TABLE (task jsonb)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* retry_tasks(queue, status => 'aborted', max_tasks => 100) -> setof (task jsonb)
   The batch form of retry_task: requeues up to max_tasks tasks of queue in
   status (aborted or cancelled) that the caller may act on (its role's, all
   for admin), those finished longest ago first (parents before children
   ended with them); returns them (ready, or waiting for live parents, as
   retry_task). A task whose unique_key another live task holds, or whose
   parent is aborted or cancelled, is left as it is. Call again while it
   returns max_tasks tasks.
   Errors: PS208 queue, status, max_tasks (1..10000). */
BEGIN
    RETURN QUERY
        SELECT t.task FROM pyscheduler._retry_tasks(queue, status, max_tasks, now()) AS t;
END
$$;
COMMENT ON FUNCTION pyscheduler.retry_tasks(pyscheduler.queue_name, pyscheduler.status_word, integer) IS
    'Requeue up to max_tasks aborted (or cancelled) tasks of a queue that belong to the caller''s role, oldest first.';
