-- depends: 0011_delay_claim_after
-- Hardening (issue 15), shared by every capability: the egress allow-list of HTTP targets
-- (sql/egress.sql), empty: by default no target may reach a loopback, private, link-local
-- or otherwise non-public address; and _user_code, which names the role code a client
-- supplied (a check's SQL job) acts as while it runs (pyscheduler._caller()); and every
-- NOTIFY throttle slot made once, so _notify_throttled never inserts (an insert made a
-- concurrent notifier wait for the inserting transaction, e.g. an application's that
-- enqueued a task and stayed open).
INSERT INTO pyscheduler.settings (name, value) VALUES ('http_allow', '{}') ON CONFLICT (name) DO NOTHING;

CREATE UNLOGGED TABLE pyscheduler._user_code (
    pid  integer NOT NULL,
    role name NOT NULL,
    CONSTRAINT _user_code_pkey PRIMARY KEY (pid)
);

INSERT INTO pyscheduler._notify_throttle (slot, channel, last_at)
SELECT s, '', '-infinity' FROM generate_series(0, 1023) s
ON CONFLICT (slot) DO NOTHING;
