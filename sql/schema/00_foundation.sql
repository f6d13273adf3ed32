-- Fresh install: the current state of the foundation's tables, in one place.
-- Must equal what migrations/ build step by step (tests/test_migrate.py checks).
CREATE SCHEMA IF NOT EXISTS pyscheduler;

CREATE TABLE pyscheduler.settings (
    name  text PRIMARY KEY,
    value text NOT NULL
);

INSERT INTO pyscheduler.settings (name, value) VALUES
    ('client_role', 'pyscheduler_client'),
    ('worker_role', 'pyscheduler_worker'),
    ('relay_role', 'pyscheduler_relay'),
    ('scheduler_role', 'pyscheduler_scheduler'),
    ('checker_role', 'pyscheduler_checker'),
    ('monitor_role', 'pyscheduler_monitor'),
    ('admin_role', 'pyscheduler_admin');

CREATE UNLOGGED TABLE pyscheduler._notify_throttle (
    channel text PRIMARY KEY,
    last_at timestamptz NOT NULL
);
