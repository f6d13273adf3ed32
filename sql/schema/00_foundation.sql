-- Fresh install: the current state of the foundation's tables, in one place.
-- Must equal what migrations/ build step by step (tests/ops/test_migrate.py checks).
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
    ('admin_role', 'pyscheduler_admin'),
    -- networks HTTP targets may reach although the egress policy refuses them (sql/egress.sql)
    ('http_allow', '{}');

-- NOTIFY throttling (_notify_throttled): a fixed number of slots, a channel
-- hashed to one, so the table stays small however many channels are used.
CREATE UNLOGGED TABLE pyscheduler._notify_throttle (
    slot    integer PRIMARY KEY,
    channel text NOT NULL,
    last_at timestamptz NOT NULL,
    CONSTRAINT _notify_throttle_slot_check CHECK (slot BETWEEN 0 AND 1023)
);
-- every slot exists: _notify_throttled never inserts (migration 0012_hardening)
INSERT INTO pyscheduler._notify_throttle (slot, channel, last_at)
SELECT s, '', '-infinity' FROM generate_series(0, 1023) s;

-- While code a client supplied runs (a check's SQL job), the role it acts as: the
-- pyscheduler functions it calls take the caller from here (pyscheduler._caller()),
-- not from the session's login. Written and deleted inside the transaction that runs
-- the code, so never committed; the code cannot write it.
CREATE UNLOGGED TABLE pyscheduler._user_code (
    pid  integer NOT NULL,
    role name NOT NULL,
    CONSTRAINT _user_code_pkey PRIMARY KEY (pid)
);
