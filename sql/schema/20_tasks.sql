-- Fresh install: the leased tasks' tables (seeds/scylla.md), in one place.
-- Must equal what migrations/0003_tasks.sql, 0005_tasks_hardening.sql,
-- 0010_tasks_lean.sql, 0016_tasks_queue.sql, 0017_tasks_queue_tables.sql,
-- 0019_tasks_flow_status.sql, 0020_tasks_flow.sql, 0021_flat_reads_tasks.sql, 0025_tasks_finished_queue.sql, 0027_tasks_tallies.sql, 0029_tasks_live_rn.sql,
-- 0030_ownership.sql, 0036_flat_read_plans.sql, 0038_durable.sql, 0039_dashboard.sql, 0042_activity_minutes.sql, 0045_e2e.sql,
-- 0048_spec_index_live.sql, 0049_unique_key_first.sql, 0053_keep_completed.sql,
-- 0055_tasks_state_rules_index.sql, 0056_tasks_queue_status_index.sql and 0059_unique_key_bytes.sql build
-- (tests/ops/test_migrate.py checks).
-- waiting: for its parents to finish (dependencies, issue 20).
-- scheduled: waiting for its run_at (delayed, or a failure waiting to be retried).
CREATE TYPE pyscheduler.task_status AS ENUM ('waiting', 'scheduled', 'ready', 'running', 'completed', 'aborted', 'cancelled');

-- Worker ids ('worker-27') come from this sequence: unique across processes
-- and restarts (register_worker()).
CREATE SEQUENCE pyscheduler.worker_id_seq;

-- Submission order: equal priority and equal created lease in this order.
CREATE SEQUENCE pyscheduler.task_seq;

-- One row per task. rn is the task id: unique on its own, so (queue, rn), the
-- seed's composite key, is unique too. Times come from the database clock.
-- seq: submission order. lease_token: the secret of the current lease (NULL
-- when none, or yielded); never shown by get/list. attempts: leases not
-- handed back by a yield (= timed-out leases when the monitor resets it).
-- leased_at: the time of the current lease while its TaskAssignment entry is
-- not yet in history (a lease writes no history; the entry is shown by
-- _task_json and written into history when the lease ends by a yield or a
-- reset); NULL when history is complete.
-- rn of tasks submitted since 0010 is time-ordered (_task_rn: the
-- submission millisecond, then seq), so the writes of a task's life touch
-- the recent end of the primary key instead of a random page.
-- run_at: a scheduled task is not leased before it (NULL: due at submission;
-- kept once the task is ready). unique_key: at most one live task per (queue,
-- unique_key), keys compared byte by byte (COLLATE "C", 0059). max_attempts:
-- NULL means the setting task_max_attempts.
-- submitted_by: the role that submitted it (only it, its members or admin
-- cancel or requeue it).
-- Issue 20: concurrency_key (tasks of one key share the queue's
-- running_per_key limit); limited (leased under its queue's limits, or
-- running when they were set: only these are counted, through
-- tasks_limited_idx, so a queue without limits adds no index entry per
-- lease); result (of its completion); watched (someone waits for it:
-- watch_task; its finish NOTIFYs pyscheduler_task:<rn>); after (its parents),
-- waiting_on (parents not finished yet), has_children (task_edges has its
-- children), on_parent_failure (NULL: cancel; 'run').
CREATE TABLE pyscheduler.tasks (
    rn       uuid NOT NULL,
    queue    text NOT NULL,
    spec     jsonb NOT NULL,
    priority bigint NOT NULL,
    status   pyscheduler.task_status NOT NULL,
    progress double precision NOT NULL,
    created  timestamptz NOT NULL,
    updated  timestamptz NOT NULL,
    errors   jsonb NOT NULL,
    owner    text,
    deadline timestamptz,
    history  jsonb NOT NULL,
    seq      bigint NOT NULL DEFAULT nextval('pyscheduler.task_seq'),
    lease_token uuid,
    attempts integer NOT NULL DEFAULT 0,
    leased_at timestamptz,
    run_at   timestamptz,
    unique_key text COLLATE "C",
    max_attempts integer,
    submitted_by name NOT NULL,
    concurrency_key text,
    limited boolean NOT NULL DEFAULT false,
    result jsonb,
    watched boolean NOT NULL DEFAULT false,
    after uuid[],
    waiting_on integer NOT NULL DEFAULT 0,
    has_children boolean NOT NULL DEFAULT false,
    on_parent_failure text,
    -- no CHECK: the input rules (queue, priority, max_attempts, progress) are the functions'
    -- (domains, _check_task_args; 0054), the states' rules tasks_state_rules_idx's (0055)
    CONSTRAINT tasks_pkey PRIMARY KEY (rn)
)
-- Autovacuum by counts, not by a fraction of the table: a lease leaves the
-- task's entry in tasks_ready_idx until VACUUM, and every later claim steps
-- over it (after 20,000 leases a claim read 190 index pages, 0.14 ms instead
-- of 0.04 ms). The default scale factor (0.2) waits for dead rows worth a
-- fifth of the table, finished tasks of the retention period included.
WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 2000,
      autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 20000,
      autovacuum_vacuum_cost_delay = 0, autovacuum_analyze_scale_factor = 0.05);

-- The states' rules: running has an owner and a deadline, scheduled a run_at, waiting
-- waiting_on > 0. Not CHECKs, which PostgreSQL re-reads and plans at the start of every INSERT
-- or UPDATE statement (~30 us of a one-row statement; 0054, 0055): a partial index holding no
-- row, whose predicate (kept parsed in the relation cache) matches a row breaking a rule, and
-- whose expression then refuses it: 23514 naming the task and the rule.
CREATE FUNCTION pyscheduler._task_state_refused(p_rn uuid, p_status pyscheduler.task_status)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'task % breaks the rule of its state: %', p_rn,
                    CASE p_status WHEN 'running' THEN 'a running task has an owner and a deadline'
                                  WHEN 'scheduled' THEN 'a scheduled task has a run_at'
                                  ELSE 'a waiting task waits for at least one parent (waiting_on > 0)' END
        USING ERRCODE = '23514', HINT = 'A bug in the pyscheduler function that wrote it: please report it.';
END
$$;

CREATE INDEX tasks_state_rules_idx ON pyscheduler.tasks ((pyscheduler._task_state_refused(rn, status)))
    WHERE CASE status WHEN 'running' THEN owner IS NULL OR deadline IS NULL
                      WHEN 'scheduled' THEN run_at IS NULL
                      WHEN 'waiting' THEN waiting_on <= 0
                      ELSE false END;

-- The claim scans exactly this: ready rows of one queue in claim order.
CREATE INDEX tasks_ready_idx ON pyscheduler.tasks (queue, priority DESC, created, seq)
    WHERE status = 'ready';
ALTER SEQUENCE pyscheduler.task_seq OWNED BY pyscheduler.tasks.seq;

-- The monitor's scan for expired leases.
CREATE INDEX tasks_running_deadline_idx ON pyscheduler.tasks (deadline)
    WHERE status = 'running';
-- Cleanup's scan for terminal tasks past retention.
CREATE INDEX tasks_terminal_updated_idx ON pyscheduler.tasks (updated)
    WHERE status IN ('completed', 'aborted', 'cancelled');
-- Delayed tasks and retries waiting for their run_at, per queue in due order:
-- a lease promotes the due ones with one probe here, so they never sit in
-- tasks_ready_idx (a claim stepping over not-yet-due entries would cost more
-- the more tasks are delayed).
CREATE INDEX tasks_scheduled_idx ON pyscheduler.tasks (queue, run_at)
    WHERE status = 'scheduled';
-- Unique tasks: at most one live task per (queue, submitting role, unique_key); the arbiter of
-- submit's ON CONFLICT (concurrent submits of one key make one task; 0030: never another role's).
-- The key first (0049): find_tasks finds a key's live tasks here, across queues and roles.
CREATE UNIQUE INDEX tasks_unique_idx ON pyscheduler.tasks (unique_key, queue, submitted_by)
    WHERE unique_key IS NOT NULL AND status IN ('waiting', 'scheduled', 'ready', 'running');
-- Ready tasks with a concurrency key, per key in claim order: a lease of a
-- queue with per-key limits finds the best task of each key that has room
-- (one probe per key), however many ready tasks of full keys come first.
CREATE INDEX tasks_ready_key_idx ON pyscheduler.tasks (queue, concurrency_key, priority DESC, created, seq)
    WHERE status = 'ready' AND concurrency_key IS NOT NULL;
-- The running tasks a queue's limits count: only those leased under limits
-- (per concurrency key, and per queue by its first column).
CREATE INDEX tasks_limited_idx ON pyscheduler.tasks (queue, concurrency_key)
    WHERE status = 'running' AND limited;
-- retry_tasks' scan: aborted and cancelled tasks of a queue, oldest first.
CREATE INDEX tasks_requeue_idx ON pyscheduler.tasks (queue, status, updated)
    WHERE status IN ('aborted', 'cancelled');
-- list_tasks(status => 'aborted' | 'cancelled'), newest first (0021): a task enters it when
-- it fails for good or is cancelled, never on the way submit -> lease -> complete.
CREATE INDEX tasks_failed_idx ON pyscheduler.tasks (status, rn) WHERE status IN ('aborted', 'cancelled');
-- list_tasks(queue => q) and list_tasks(queue => q, status => s): a queue's tasks of one
-- status newest first, however many other queues' and other statuses' are kept (0025, 0029,
-- 0036_flat_read_plans); ready and running tasks are read from their own indexes. One index
-- for five statuses, not one each: every INSERT or UPDATE statement opens each index (0056).
CREATE INDEX tasks_queue_status_rn_idx ON pyscheduler.tasks (queue, status, rn)
    WHERE status IN ('waiting', 'scheduled', 'completed', 'aborted', 'cancelled');
-- find_tasks (the dashboard's search, 0039): a spec fragment (jsonb @>), a unique key in any
-- queue and status. New entries go to the index's pending list; the tasks monitor merges it every
-- reset_interval (merge_task_search_index, 0051), and the write that fills 4 MB merges it when no
-- monitor has (0045 had 256 kB: the submits paid every merge). Running tasks are left out (0048):
-- a lease is never HOT, and would write the spec's entries again; find_tasks reads them by
-- tasks_running_deadline_idx.
CREATE INDEX tasks_spec_idx ON pyscheduler.tasks USING gin (spec jsonb_path_ops) WITH (gin_pending_list_limit = 4096)
    WHERE status <> 'running';
-- A key's finished tasks (0049: live ones are in tasks_unique_idx; a key goes into one B-tree
-- at submit, not two, and none at a lease). status >= 'completed': the finished statuses in
-- task_status' order, so that no index of finished tasks with an IN list matches find_tasks' read.
CREATE INDEX tasks_unique_key_idx ON pyscheduler.tasks (unique_key)
    WHERE unique_key IS NOT NULL AND status >= 'completed';
-- task_family (0039): a task's children, whatever their state; only tasks with parents.
CREATE INDEX tasks_after_idx ON pyscheduler.tasks USING gin (after) WHERE after IS NOT NULL;
-- The most common (queue, status) pairs of ANALYZE's sample (0021): without them the planner
-- takes a queue's rare status for 5 % x 1 % of the table and list_tasks(queue, status) walks
-- the primary key past every task (a second on 10 million) instead of the status's index.
CREATE STATISTICS pyscheduler.tasks_queue_status_stats (mcv) ON queue, status FROM pyscheduler.tasks;
ALTER STATISTICS pyscheduler.tasks_queue_status_stats SET STATISTICS 250;
-- task_counts' and queue_status' counts (0027): deltas per (queue, status), summed by the
-- readers (sql/tasks/1_model.sql, "Counts").
CREATE TABLE pyscheduler._task_tallies (
    queue  text                     NOT NULL,
    status pyscheduler.task_status  NOT NULL,
    n      bigint                   NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);

-- One row per queue that was submitted to, paused or limited: a lease reads
-- it by primary key; a queue without a row, or neither paused nor limited, is
-- leased as if the table did not exist. owner (0030): the role whose queue it
-- is (the first to submit to it, pause or limit it; set_queue_owner): only it,
-- its members and admin change its settings. Limits (issue 20, set_queue_limits,
-- set_rate_limit; NULL: none): running_per_key, running_total, rate_starts
-- per rate_per (per queue, or per concurrency key with rate_by_key). keep_completed (0053,
-- set_queue_keep_completed): false, a completion deletes the task.
CREATE TABLE pyscheduler.task_queues (
    queue     text NOT NULL,
    paused    boolean NOT NULL DEFAULT false,
    note      text,
    paused_by name,
    updated   timestamptz NOT NULL,
    running_per_key integer,
    running_total integer,
    rate_starts integer,
    rate_per interval,
    rate_by_key boolean NOT NULL DEFAULT false,
    limits_by name,
    limits_updated timestamptz,
    owner name,
    keep_completed boolean NOT NULL DEFAULT true,
    CONSTRAINT task_queues_pkey PRIMARY KEY (queue),
    CONSTRAINT task_queues_queue_check CHECK (octet_length(queue) BETWEEN 1 AND 40)
);
CREATE INDEX task_queues_discarding_idx ON pyscheduler.task_queues (queue) WHERE NOT keep_completed;

-- The workers that report (worker_seen, 0039): one row per worker and queue, seen_at renewed
-- about every 10 s; rows not seen for a day are deleted by the reports of others.
CREATE TABLE pyscheduler._task_workers (
    worker     text NOT NULL,
    queue      text NOT NULL,
    registered timestamptz NOT NULL,
    seen_at    timestamptz NOT NULL,
    CONSTRAINT _task_workers_pkey PRIMARY KEY (worker, queue)
);

-- Dependencies: the children of a parent (a child's parents are its after).
CREATE TABLE pyscheduler.task_edges (
    parent uuid NOT NULL,
    child  uuid NOT NULL,
    CONSTRAINT task_edges_pkey PRIMARY KEY (parent, child)
);

-- The token buckets of rate limits: one per rate-limited queue (key '') or,
-- with rate_by_key, per concurrency key; tokens as of at.
CREATE TABLE pyscheduler.task_rate_buckets (
    queue  text NOT NULL,
    key    text NOT NULL,
    tokens double precision NOT NULL,
    at     timestamptz NOT NULL,
    CONSTRAINT task_rate_buckets_pkey PRIMARY KEY (queue, key)
);

-- Durable task functions (0038, sql/tasks/7_durable.sql): what a task recorded, once per task
-- (not per attempt): kind 'step' (record_step: its result), 'sleep' (sleep_task: {"until"}),
-- 'event' (await_event: {"status", "payload"}); cleanup_tasks deletes them with their task.
CREATE TABLE pyscheduler.task_checkpoints (
    rn       uuid NOT NULL,
    kind     text NOT NULL,
    step     text NOT NULL,
    result   jsonb,
    recorded timestamptz NOT NULL,
    CONSTRAINT task_checkpoints_pkey PRIMARY KEY (rn, kind, step),
    CONSTRAINT task_checkpoints_kind_check CHECK (kind IN ('step', 'sleep', 'event'))
);
-- The event each suspended task waits for, until its timeout (emit_event's probe by name).
CREATE TABLE pyscheduler.task_waits (
    rn    uuid NOT NULL,
    name  text NOT NULL,
    until timestamptz NOT NULL,
    since timestamptz NOT NULL,
    CONSTRAINT task_waits_pkey PRIMARY KEY (rn, name)
);
CREATE INDEX task_waits_name_idx ON pyscheduler.task_waits (name);
-- The last event of each name per emitting role (await_event sees one emitted before it
-- waited); cleanup_tasks purges them after its retention (task_events_emitted_idx).
CREATE TABLE pyscheduler.task_events (
    name       text NOT NULL,
    emitted_by name NOT NULL,
    payload    jsonb,
    emitted    timestamptz NOT NULL,
    CONSTRAINT task_events_pkey PRIMARY KEY (name, emitted_by)
);
CREATE INDEX task_events_emitted_idx ON pyscheduler.task_events (emitted);

-- Limits (issue 11), changed by an admin with
-- UPDATE pyscheduler.settings SET value = '50' WHERE name = 'task_max_attempts';
INSERT INTO pyscheduler.settings (name, value) VALUES
    ('task_max_attempts', '25'),
    ('task_max_history', '100'),
    ('task_max_spec_bytes', '1048576'),
    ('task_max_errors', '100'),
    ('task_max_errors_bytes', '65536'),
    ('task_backoff_base', '1 second'),
    ('task_backoff_cap', '1 hour'),
    ('task_max_result_bytes', '65536'),
    ('task_max_parents', '10000'),
    ('task_max_workflow_nodes', '10000')
ON CONFLICT (name) DO NOTHING;

-- migrations/0042_activity_minutes.sql: long dashboard ranges without reading the tasks
-- (issue 30): per minute, the tasks finished per status (per queue: by the hour) and a
-- histogram of their due-to-started latency, folded now and then by
-- _fold_task_minutes (called by cleanup_tasks, the tasks monitor's minutely job) from
-- tasks_terminal_updated_idx, up to _task_minutes_folded.upto; minutes older than 8 days
-- are deleted by the fold. activity(), activity_latency() and queue_activity() read it for
-- any whole-minute bucket (queue_activity: ranges of a day or more) and the index for what
-- ended since.
CREATE TABLE pyscheduler._task_minutes (
    minute timestamptz NOT NULL,
    status text        NOT NULL,
    n      bigint      NOT NULL,
    PRIMARY KEY (minute, status)
);
-- per queue by the hour (a minute per queue would be a row per task at a few tasks a minute)
CREATE TABLE pyscheduler._task_queue_hours (
    hour   timestamptz NOT NULL,
    queue  text        NOT NULL,
    status text        NOT NULL,
    n      bigint      NOT NULL,
    PRIMARY KEY (hour, queue, status)
);
CREATE TABLE pyscheduler._task_latency_minutes (
    minute timestamptz NOT NULL,
    k      smallint    NOT NULL,
    n      bigint      NOT NULL,
    PRIMARY KEY (minute, k)
);
-- 0053: the tasks a queue that keeps no completed tasks deleted as they completed, a row per
-- completing call, queue and latency bucket (k as in _task_latency_minutes), until folded.
CREATE TABLE pyscheduler._task_done_log (
    at    timestamptz NOT NULL,
    queue text        NOT NULL,
    k     smallint    NOT NULL,
    n     bigint      NOT NULL
);
CREATE INDEX _task_done_log_at_idx ON pyscheduler._task_done_log (at);
-- what _fold_task_minutes folded of it, by the minute, kept 8 days (activity's live reads)
CREATE TABLE pyscheduler._task_done_minutes (
    minute timestamptz NOT NULL,
    queue  text        NOT NULL,
    k      smallint    NOT NULL,
    n      bigint      NOT NULL,
    PRIMARY KEY (minute, queue, k)
);
CREATE TABLE pyscheduler._task_minutes_folded (
    one  boolean     PRIMARY KEY DEFAULT true CHECK (one),
    upto timestamptz
);
INSERT INTO pyscheduler._task_minutes_folded (upto) VALUES (NULL);
