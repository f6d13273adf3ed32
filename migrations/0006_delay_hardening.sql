-- depends: 0004_roles
-- Delay queue hardening (issue 11). Forward-only.
--
-- Deadlines are bounded to [1970-01-01T00:00:00Z, 9999-01-01T00:00:00Z): every
-- client library loads them in any time zone (a BC or year-10000 deadline made
-- psycopg fail on every claim and looked like an outage). Rows stored before
-- with a deadline outside it are moved to the nearest end first (a BC deadline
-- fires at once).
UPDATE pyscheduler.delay_messages
   SET deadline = greatest(timestamptz '1970-01-01 00:00:00+00',
                           least(deadline, timestamptz '9998-12-31 23:59:59.999999+00'))
 WHERE NOT (deadline >= timestamptz '1970-01-01 00:00:00+00' AND deadline < timestamptz '9999-01-01 00:00:00+00');
ALTER TABLE pyscheduler.delay_messages ADD CONSTRAINT delay_messages_deadline_range
    CHECK (deadline >= '1970-01-01 00:00:00+00' AND deadline < '9999-01-01 00:00:00+00');

-- Signatures that took a caller-chosen `now` (issue 11): dropped here, so a
-- database migrated before keeps no public function that takes a clock.
DROP FUNCTION IF EXISTS pyscheduler.enqueue_messages(text[], timestamptz[], bytea[], bytea[], jsonb[], interval,
                                                     timestamptz, interval);
DROP FUNCTION IF EXISTS pyscheduler.enqueue_messages(text[], timestamptz[], bytea[], bytea[], jsonb[], interval,
                                                     timestamptz, interval, boolean);
DROP FUNCTION IF EXISTS pyscheduler.enqueue_message(text, timestamptz, bytea, bytea, jsonb, interval, timestamptz,
                                                    interval);
DROP FUNCTION IF EXISTS pyscheduler.ready_and_claim(uuid, interval, integer, timestamptz);
DROP FUNCTION IF EXISTS pyscheduler.reset_stuck(interval, integer, timestamptz);

DROP FUNCTION IF EXISTS pyscheduler._delay_check_interval(text, interval, boolean);
