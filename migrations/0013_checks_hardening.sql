-- depends: 0012_hardening
-- Hardening of future checks (issue 15): every check records the role that added it
-- (owner, as text: existing checks and history belong to the client role, so existing clients
-- keep access), the composites carry it; requests a client makes of a check a runner
-- holds (delete, add again) wait in check_requests instead of waiting for the runner;
-- history retention and the payload limit are settings. The same end state as sql/schema/40_checks.sql.
ALTER TYPE pyscheduler.future_check ADD ATTRIBUTE owner text;
ALTER TYPE pyscheduler.ended_check ADD ATTRIBUTE owner text;

ALTER TABLE pyscheduler.checks ADD COLUMN owner text;
UPDATE pyscheduler.checks SET owner = (SELECT value FROM pyscheduler.settings WHERE name = 'client_role');
ALTER TABLE pyscheduler.checks ALTER COLUMN owner SET NOT NULL;

ALTER TABLE pyscheduler.check_history ADD COLUMN owner text;
UPDATE pyscheduler.check_history SET owner = (SELECT value FROM pyscheduler.settings WHERE name = 'client_role');
ALTER TABLE pyscheduler.check_history ALTER COLUMN owner SET NOT NULL;

CREATE TABLE pyscheduler.check_requests (
    check_id         bigint NOT NULL,
    entity_name      text NOT NULL,
    entity_key       text NOT NULL,
    job              text NOT NULL,
    delete_by        text,
    readd_kind       text,
    readd_payload    jsonb,
    readd_at         timestamptz,
    readd_max_checks integer,
    readd_horizon    interval,
    readd_by         text,
    requested        timestamptz NOT NULL,
    CONSTRAINT check_requests_pkey PRIMARY KEY (check_id)
);

INSERT INTO pyscheduler.settings (name, value) VALUES
    ('checks_history_retention', '30 days'),
    ('checks_max_payload_bytes', '65536')
ON CONFLICT (name) DO NOTHING;

-- set_check_settings gained history_retention and max_payload_bytes (sql/checks.sql)
DROP FUNCTION IF EXISTS pyscheduler.set_check_settings(interval, integer, interval, interval);
