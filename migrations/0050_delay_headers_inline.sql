-- depends: 0049_unique_key_first
-- _enqueue_messages tests a batch's headers in its own statement (issue 31): the SQL function it
-- called a message each, meant to be inlined, never was (a sub-SELECT), and was planned on every call.
DROP FUNCTION IF EXISTS pyscheduler._delay_headers_ok(jsonb);
