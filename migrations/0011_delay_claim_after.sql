-- depends: 0006_delay_hardening
-- Delay queue claims (issue 10 item 3): ready_and_claim, _ready_and_claim and next_deadline take an
-- `after` deadline bound (sql/delay.sql creates the new signatures). Forward-only: the
-- old signatures are dropped so a call by name is not ambiguous.
DROP FUNCTION IF EXISTS pyscheduler.ready_and_claim(uuid, interval, integer);
DROP FUNCTION IF EXISTS pyscheduler._ready_and_claim(uuid, interval, integer, timestamptz);
DROP FUNCTION IF EXISTS pyscheduler.next_deadline();
