-- depends: 0036_flat_read_plans
-- Durable task functions (issue 33): checkpointed steps, sleeps and events on the leased tasks
-- (sql/tasks/7_durable.sql). New tables only: the tasks table, its indexes and the statuses are
-- unchanged (a sleeping task and a task waiting for an event are 'scheduled').
-- task_checkpoints: what a task recorded, once per task (not per attempt): kind 'step' (record_step:
-- its result), 'sleep' (sleep_task: {"until"}), 'event' (await_event: {"status", "payload"}).
-- task_waits: the event each suspended task waits for, until its timeout (emit_event's probe).
-- task_events: the last event of each name per emitting role (await_event sees one emitted before
-- it waited); cleanup_tasks purges them after its retention.

CREATE TABLE pyscheduler.task_checkpoints (
    rn       uuid NOT NULL,
    kind     text NOT NULL,
    step     text NOT NULL,
    result   jsonb,
    recorded timestamptz NOT NULL,
    CONSTRAINT task_checkpoints_pkey PRIMARY KEY (rn, kind, step),
    CONSTRAINT task_checkpoints_kind_check CHECK (kind IN ('step', 'sleep', 'event'))
);

CREATE TABLE pyscheduler.task_waits (
    rn    uuid NOT NULL,
    name  text NOT NULL,
    until timestamptz NOT NULL,
    since timestamptz NOT NULL,
    CONSTRAINT task_waits_pkey PRIMARY KEY (rn, name)
);
CREATE INDEX task_waits_name_idx ON pyscheduler.task_waits (name);

CREATE TABLE pyscheduler.task_events (
    name       text NOT NULL,
    emitted_by name NOT NULL,
    payload    jsonb,
    emitted    timestamptz NOT NULL,
    CONSTRAINT task_events_pkey PRIMARY KEY (name, emitted_by)
);
CREATE INDEX task_events_emitted_idx ON pyscheduler.task_events (emitted);

-- the input rule (0031): a step's and an event's name are labels, an event's payload a payload
CREATE DOMAIN pyscheduler.step_name AS text
    CHECK (VALUE IS NULL OR pyscheduler._label_ok(VALUE, 200) OR pyscheduler._refuse_label(VALUE, 'step', 200, 'PS230'));
CREATE DOMAIN pyscheduler.event_name AS text
    CHECK (VALUE IS NULL OR pyscheduler._label_ok(VALUE, 200) OR pyscheduler._refuse_label(VALUE, 'event', 200, 'PS231'));
CREATE DOMAIN pyscheduler.event_payload AS jsonb
    CHECK (VALUE IS NULL OR pyscheduler._payload_ok(VALUE, 64, 16777216)
           OR pyscheduler._refuse_payload(VALUE, 'payload', 64, 16777216, 'PS232'));
