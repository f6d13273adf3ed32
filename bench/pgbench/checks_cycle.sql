-- pgbench: the runner's whole cycle for SQL jobs in one transaction per batch:
-- take a batch of the slot (due_checks, shard of the client), run the jobs (run_check_jobs),
-- record the results (finish_checks: 'done' moves each check into check_history).
-- Fill the slot first (N checks with a SQL job in the current slot), then, with 2 clients as 2 shards:
-- pgbench -n -f bench/pgbench/checks_cycle.sql -D slot_epoch=<slot> -D max=1000 -D shards=2 -c 2 -j 2 -t <N/2000> "$DSN"
\set shard :client_id % :shards
BEGIN;
SET LOCAL synchronous_commit = off;
WITH r AS (
    SELECT * FROM pyscheduler.run_check_jobs(ids => ARRAY(
        SELECT id FROM pyscheduler.due_checks(slot => to_timestamp(:slot_epoch), shard => :shard, shards => :shards,
                                              max => :max))))
SELECT count(*) FROM pyscheduler.finish_checks(ids => ARRAY(SELECT id FROM r ORDER BY id),
                                               next_check_ats => ARRAY(SELECT next_check_at FROM r ORDER BY id),
                                               errors => ARRAY(SELECT error FROM r ORDER BY id),
                                               took => ARRAY(SELECT took FROM r ORDER BY id));
COMMIT;
