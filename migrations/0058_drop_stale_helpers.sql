-- depends: 0057_drop_leases_helper
-- Private helpers that sql/ stopped defining without a migration dropping them, so a database
-- migrated while they existed keeps them (found by tests/ops/test_migrate.py's walk of sql/'s
-- git history): _spec_index_on (replaced by _spec_index_state, bb502ba), the checks' and
-- schedules' ownership and label helpers of issue 15, the sharded critical claim (folded into
-- _claim_due_critical) and the queue limits' row (issue 27). Nothing calls them.
DROP FUNCTION IF EXISTS pyscheduler._spec_index_on();
DROP FUNCTION IF EXISTS pyscheduler._check_caller();
DROP FUNCTION IF EXISTS pyscheduler._check_may_act(name);
DROP FUNCTION IF EXISTS pyscheduler._check_name(text);
DROP FUNCTION IF EXISTS pyscheduler._check_note(text, text);
DROP FUNCTION IF EXISTS pyscheduler._claim_due_critical_shards(integer[], integer, integer, interval, timestamptz);
DROP FUNCTION IF EXISTS pyscheduler._limits_row(text, timestamptz);
