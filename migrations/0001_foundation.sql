-- The foundation: the schema, settings, and notification throttling state.
-- Forward-only. Function code lives in sql/ and is reloaded on every migrate.
CREATE SCHEMA IF NOT EXISTS pyscheduler;

CREATE TABLE pyscheduler.settings (
    name  text PRIMARY KEY,
    value text NOT NULL
);

INSERT INTO pyscheduler.settings (name, value) VALUES
    ('client_role', 'pyscheduler_client'),
    ('worker_role', 'pyscheduler_worker'),
    ('admin_role', 'pyscheduler_admin');

CREATE UNLOGGED TABLE pyscheduler._notify_throttle (
    channel text PRIMARY KEY,
    last_at timestamptz NOT NULL
);
