-- depends: 0004_roles
-- Leased tasks, hardening (issue 11). Forward-only.
--  * lease_token: the per-lease secret that proves ownership of a running task
--    (returned by the lease functions, required by heartbeat/complete/abort/yield).
--  * seq: submission order, the tie-breaker of equal priority and equal created.
--  * attempts: leases not yielded; the monitor aborts a task that keeps timing out.
--  * limits in pyscheduler.settings.
--  * the NOTIFY throttle keeps a fixed number of slots instead of a row per channel.
--  * the public functions lose their `now` parameter: drop the old signatures
--    (sql/tasks.sql creates the new ones right after this migration).
DROP FUNCTION IF EXISTS pyscheduler.submit_task(text, jsonb, bigint, timestamptz);
DROP FUNCTION IF EXISTS pyscheduler.submit_tasks(text, jsonb, bigint, timestamptz);
DROP FUNCTION IF EXISTS pyscheduler.cancel_task(uuid, timestamptz);
DROP FUNCTION IF EXISTS pyscheduler.lease_tasks(text, text, integer, interval, double precision, bigint, timestamptz);
DROP FUNCTION IF EXISTS pyscheduler.lease_task(text, text, interval, double precision, bigint, timestamptz);
DROP FUNCTION IF EXISTS pyscheduler.heartbeat_task(uuid, text, double precision, interval, timestamptz);
DROP FUNCTION IF EXISTS pyscheduler.complete_task(uuid, text, timestamptz);
DROP FUNCTION IF EXISTS pyscheduler.complete_tasks(uuid[], text, timestamptz);
DROP FUNCTION IF EXISTS pyscheduler.complete_and_lease(uuid, text, text, interval, double precision, bigint, timestamptz);
DROP FUNCTION IF EXISTS pyscheduler.abort_task(uuid, text, jsonb, timestamptz);
DROP FUNCTION IF EXISTS pyscheduler.yield_task(uuid, text, timestamptz);
DROP FUNCTION IF EXISTS pyscheduler.reset_expired_tasks(integer, timestamptz);
DROP FUNCTION IF EXISTS pyscheduler.cleanup_tasks(interval, integer, timestamptz);
DROP FUNCTION IF EXISTS pyscheduler._lease_one(text, text, interval, timestamptz);
DROP FUNCTION IF EXISTS pyscheduler._task_refused(uuid, text);
DROP FUNCTION IF EXISTS pyscheduler._check_task_args(text, text, interval, bigint, boolean, boolean);
DROP FUNCTION IF EXISTS pyscheduler._task_json(pyscheduler.tasks);
DROP VIEW IF EXISTS pyscheduler.oldest_ready_tasks;
DROP VIEW IF EXISTS pyscheduler.expired_leases;
DROP VIEW IF EXISTS pyscheduler.task_counts;

CREATE SEQUENCE pyscheduler.task_seq;
ALTER TABLE pyscheduler.tasks
    ADD COLUMN seq bigint NOT NULL DEFAULT nextval('pyscheduler.task_seq'),
    ADD COLUMN lease_token uuid,
    ADD COLUMN attempts integer NOT NULL DEFAULT 0;
ALTER SEQUENCE pyscheduler.task_seq OWNED BY pyscheduler.tasks.seq;
-- Running tasks of workers from before the upgrade get a token no worker knows:
-- their next write is refused (PS201) and the lease runs out, as after a restart.
UPDATE pyscheduler.tasks SET lease_token = gen_random_uuid()
 WHERE status = 'running' AND history -> -1 ->> '_typ' IS DISTINCT FROM 'TaskYield';
UPDATE pyscheduler.tasks SET attempts = jsonb_array_length(jsonb_path_query_array(
           history, '$[*] ? (@._typ == "TaskAssignment")'));
ALTER TABLE pyscheduler.tasks
    ADD CONSTRAINT tasks_attempts_check CHECK (attempts >= 0);
DROP INDEX pyscheduler.tasks_ready_idx;
CREATE INDEX tasks_ready_idx ON pyscheduler.tasks (queue, priority DESC, created, seq)
    WHERE status = 'ready';

INSERT INTO pyscheduler.settings (name, value) VALUES
    ('task_max_attempts', '25'),
    ('task_max_history', '100'),
    ('task_max_spec_bytes', '1048576'),
    ('task_max_errors', '100'),
    ('task_max_errors_bytes', '65536')
ON CONFLICT (name) DO NOTHING;

DROP TABLE pyscheduler._notify_throttle;
CREATE UNLOGGED TABLE pyscheduler._notify_throttle (
    slot    integer PRIMARY KEY,
    channel text NOT NULL,
    last_at timestamptz NOT NULL,
    CONSTRAINT _notify_throttle_slot_check CHECK (slot BETWEEN 0 AND 1023)
);
