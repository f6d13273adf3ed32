-- depends: 0011_delay_claim_after
-- Hardening (issue 15): the egress allow-list of HTTP targets (sql/egress.sql), empty:
-- by default no target may reach a loopback, private, link-local or otherwise
-- non-public address.
INSERT INTO pyscheduler.settings (name, value) VALUES ('http_allow', '{}') ON CONFLICT (name) DO NOTHING;
