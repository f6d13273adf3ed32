-- Fresh install: the leased tasks' tables (seeds/scylla.md), in one place.
-- Must equal what migrations/0003_tasks.sql, 0005_tasks_hardening.sql and
-- 0010_tasks_lean.sql build
-- (tests/test_migrate.py checks).
CREATE TYPE pyscheduler.task_status AS ENUM ('ready', 'running', 'completed', 'aborted', 'cancelled');

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
    CONSTRAINT tasks_pkey PRIMARY KEY (rn),
    CONSTRAINT tasks_queue_check CHECK (octet_length(queue) BETWEEN 1 AND 40),
    CONSTRAINT tasks_priority_check CHECK (priority BETWEEN 0 AND 4294967295),
    CONSTRAINT tasks_progress_check CHECK (progress BETWEEN 0 AND 1),
    CONSTRAINT tasks_attempts_check CHECK (attempts >= 0),
    CONSTRAINT tasks_running_check CHECK (status <> 'running' OR (owner IS NOT NULL AND deadline IS NOT NULL))
)
-- Autovacuum by counts, not by a fraction of the table: a lease leaves the
-- task's entry in tasks_ready_idx until VACUUM, and every later claim steps
-- over it (after 20,000 leases a claim read 190 index pages, 0.14 ms instead
-- of 0.04 ms). The default scale factor (0.2) waits for dead rows worth a
-- fifth of the table, finished tasks of the retention period included.
WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 2000,
      autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 20000,
      autovacuum_vacuum_cost_delay = 0, autovacuum_analyze_scale_factor = 0.05);

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

-- Limits (issue 11), changed by an admin with
-- UPDATE pyscheduler.settings SET value = '50' WHERE name = 'task_max_attempts';
INSERT INTO pyscheduler.settings (name, value) VALUES
    ('task_max_attempts', '25'),
    ('task_max_history', '100'),
    ('task_max_spec_bytes', '1048576'),
    ('task_max_errors', '100'),
    ('task_max_errors_bytes', '65536')
ON CONFLICT (name) DO NOTHING;
