-- depends: 0016_tasks_queue
-- Leased tasks as a job queue (issue 16), part 2 of 2. Forward-only; function
-- code in sql/tasks.sql.
--  * run_at: a scheduled task is not leased before it (delayed tasks, retries
--    with backoff); tasks_scheduled_idx holds them per queue in due order, out
--    of the ready claim's index, and a lease promotes the due ones.
--  * unique_key: at most one live (scheduled, ready or running) task per
--    (queue, unique_key): tasks_unique_idx, the arbiter of submit's ON CONFLICT.
--  * max_attempts: per task (NULL: the setting task_max_attempts).
--  * submitted_by: the role that submitted the task (design.md: work belongs
--    to the role that created it); existing tasks belong to the client role.
--  * task_queues: one row per queue that was paused (issue 20 adds its limits).
--  * tasks_requeue_idx: aborted and cancelled tasks per queue, for retry_tasks.
--  * submit_task and submit_tasks take new parameters: drop the old signatures.
DROP FUNCTION IF EXISTS pyscheduler.submit_task(text, jsonb, bigint);
DROP FUNCTION IF EXISTS pyscheduler.submit_tasks(text, jsonb, bigint);
DROP FUNCTION IF EXISTS pyscheduler._submit_task(text, jsonb, bigint, timestamptz);
DROP FUNCTION IF EXISTS pyscheduler._submit_tasks(text, jsonb, bigint, timestamptz);
--  * lease_tasks_lean answers each lease's attempt too (a new column).
DROP FUNCTION IF EXISTS pyscheduler.lease_tasks_lean(text, text, integer, interval, double precision, bigint);
DROP FUNCTION IF EXISTS pyscheduler._lease_tasks_lean(text, text, integer, interval, double precision, bigint,
                                                      timestamptz);

ALTER TABLE pyscheduler.tasks
    ADD COLUMN run_at timestamptz,
    ADD COLUMN unique_key text,
    ADD COLUMN max_attempts integer;
-- a constant default: no rewrite of the table, then no default (submit sets it)
DO $owner$
BEGIN
    EXECUTE format('ALTER TABLE pyscheduler.tasks ADD COLUMN submitted_by name NOT NULL DEFAULT %L',
                   (SELECT value FROM pyscheduler.settings WHERE name = 'client_role'));
END
$owner$;
ALTER TABLE pyscheduler.tasks ALTER COLUMN submitted_by DROP DEFAULT;
ALTER TABLE pyscheduler.tasks
    ADD CONSTRAINT tasks_scheduled_check CHECK (status <> 'scheduled' OR run_at IS NOT NULL),
    ADD CONSTRAINT tasks_max_attempts_check CHECK (max_attempts BETWEEN 1 AND 1000);

CREATE INDEX tasks_scheduled_idx ON pyscheduler.tasks (queue, run_at)
    WHERE status = 'scheduled';
CREATE UNIQUE INDEX tasks_unique_idx ON pyscheduler.tasks (queue, unique_key)
    WHERE unique_key IS NOT NULL AND status IN ('scheduled', 'ready', 'running');
CREATE INDEX tasks_requeue_idx ON pyscheduler.tasks (queue, status, updated)
    WHERE status IN ('aborted', 'cancelled');

CREATE TABLE pyscheduler.task_queues (
    queue     text NOT NULL,
    paused    boolean NOT NULL DEFAULT false,
    note      text,
    paused_by name,
    updated   timestamptz NOT NULL,
    CONSTRAINT task_queues_pkey PRIMARY KEY (queue),
    CONSTRAINT task_queues_queue_check CHECK (octet_length(queue) BETWEEN 1 AND 40)
);

INSERT INTO pyscheduler.settings (name, value) VALUES
    ('task_backoff_base', '1 second'),
    ('task_backoff_cap', '1 hour')
ON CONFLICT (name) DO NOTHING;
