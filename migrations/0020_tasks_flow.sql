-- depends: 0019_tasks_flow_status
-- Flow control for tasks (issue 20), part 2 of 2. Forward-only; function code
-- in sql/tasks.sql.
--  * concurrency_key: tasks of one key share the queue's running_per_key
--    limit. limited: the task was leased under its queue's limits (or was
--    running when they were set): only such tasks are counted, through
--    tasks_limited_idx, so a queue without limits adds no index entry per lease.
--  * result: what the lease holder completed the task with.
--  * watched: someone waits for the task (watch_task): its finish NOTIFYs
--    pyscheduler_task:<rn>. Unwatched tasks finish without a NOTIFY.
--  * after, waiting_on, has_children, on_parent_failure: dependencies. A
--    waiting task counts its unfinished parents down (waiting_on); a parent
--    with children finds them in task_edges.
--  * task_queues: the queue's limits (running_per_key, running_total,
--    rate_starts per rate_per, rate_by_key), who set them, and
--    task_rate_buckets, the token buckets of rate-limited queues and keys.
--  * tasks_unique_idx: a waiting task holds its unique_key too.
--  * Functions whose parameters or results changed: drop the old signatures.
DROP FUNCTION IF EXISTS pyscheduler.submit_task(text, jsonb, bigint, timestamptz, text, integer, interval);
DROP FUNCTION IF EXISTS pyscheduler.submit_tasks(text, jsonb, bigint, timestamptz, text[], integer, interval);
DROP FUNCTION IF EXISTS pyscheduler._submit_task(text, jsonb, bigint, timestamptz, text, integer, timestamptz, name);
DROP FUNCTION IF EXISTS pyscheduler._submit_tasks(text, jsonb, bigint, timestamptz, text[], integer, timestamptz, name);
DROP FUNCTION IF EXISTS pyscheduler.complete_task(uuid, uuid);
DROP FUNCTION IF EXISTS pyscheduler._complete_task(uuid, uuid, timestamptz);
DROP FUNCTION IF EXISTS pyscheduler.complete_tasks(uuid[], uuid[]);
DROP FUNCTION IF EXISTS pyscheduler._complete_tasks(uuid[], uuid[], timestamptz);
DROP FUNCTION IF EXISTS pyscheduler.complete_and_lease(text, text, uuid, uuid, interval, double precision, bigint);
DROP FUNCTION IF EXISTS pyscheduler._complete_and_lease(text, text, uuid, uuid, interval, double precision, bigint,
                                                        timestamptz);
DROP FUNCTION IF EXISTS pyscheduler.yield_task(uuid, uuid);
DROP FUNCTION IF EXISTS pyscheduler._yield_task(uuid, uuid, timestamptz);
DROP FUNCTION IF EXISTS pyscheduler._lease_gate(text, integer, timestamptz);
DROP VIEW IF EXISTS pyscheduler.queue_status;

ALTER TABLE pyscheduler.tasks
    ADD COLUMN concurrency_key text,
    ADD COLUMN limited boolean NOT NULL DEFAULT false,
    ADD COLUMN result jsonb,
    ADD COLUMN watched boolean NOT NULL DEFAULT false,
    ADD COLUMN after uuid[],
    ADD COLUMN waiting_on integer NOT NULL DEFAULT 0,
    ADD COLUMN has_children boolean NOT NULL DEFAULT false,
    ADD COLUMN on_parent_failure text,
    ADD CONSTRAINT tasks_waiting_check CHECK (status <> 'waiting' OR waiting_on > 0);

CREATE INDEX tasks_waiting_idx ON pyscheduler.tasks (queue)
    WHERE status = 'waiting';
CREATE INDEX tasks_ready_key_idx ON pyscheduler.tasks (queue, concurrency_key, priority DESC, created, seq)
    WHERE status = 'ready' AND concurrency_key IS NOT NULL;
CREATE INDEX tasks_limited_idx ON pyscheduler.tasks (queue, concurrency_key)
    WHERE status = 'running' AND limited;
DROP INDEX pyscheduler.tasks_unique_idx;
CREATE UNIQUE INDEX tasks_unique_idx ON pyscheduler.tasks (queue, unique_key)
    WHERE unique_key IS NOT NULL AND status IN ('waiting', 'scheduled', 'ready', 'running');

CREATE TABLE pyscheduler.task_edges (
    parent uuid NOT NULL,
    child  uuid NOT NULL,
    CONSTRAINT task_edges_pkey PRIMARY KEY (parent, child)
);

ALTER TABLE pyscheduler.task_queues
    ADD COLUMN running_per_key integer,
    ADD COLUMN running_total integer,
    ADD COLUMN rate_starts integer,
    ADD COLUMN rate_per interval,
    ADD COLUMN rate_by_key boolean NOT NULL DEFAULT false,
    ADD COLUMN limits_by name,
    ADD COLUMN limits_updated timestamptz;

CREATE TABLE pyscheduler.task_rate_buckets (
    queue  text NOT NULL,
    key    text NOT NULL,
    tokens double precision NOT NULL,
    at     timestamptz NOT NULL,
    CONSTRAINT task_rate_buckets_pkey PRIMARY KEY (queue, key)
);

INSERT INTO pyscheduler.settings (name, value) VALUES
    ('task_max_result_bytes', '65536'),
    ('task_max_parents', '10000'),
    ('task_max_workflow_nodes', '10000')
ON CONFLICT (name) DO NOTHING;
