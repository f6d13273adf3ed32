-- Roles for every audience: task workers, the delay relay, the schedule
-- daemons, the check runners and read-only monitoring each get their own group
-- role (names configurable in pyscheduler.settings). Forward-only.
INSERT INTO pyscheduler.settings (name, value) VALUES
    ('relay_role', 'pyscheduler_relay'),
    ('scheduler_role', 'pyscheduler_scheduler'),
    ('checker_role', 'pyscheduler_checker'),
    ('monitor_role', 'pyscheduler_monitor')
ON CONFLICT (name) DO NOTHING;
