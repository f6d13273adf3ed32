-- pgbench: the runner's whole cycle for SQL jobs, one transaction per batch: run_due_checks takes a
-- batch of the slot (the client's shard), runs the jobs and records the results ('done' moves each
-- check into check_history) in one statement, as `pyscheduler checks run` does.
-- Fill the slot first (N checks with a SQL job in the current slot), then, with 2 clients as 2 shards:
-- pgbench -n -f bench/pgbench/checks_cycle.sql -D slot_epoch=<slot> -D max=1000 -D shards=2 -c 2 -j 2 -t <N/2000> "$DSN"
\set shard :client_id % :shards
BEGIN;
SET LOCAL synchronous_commit = off;
SELECT taken FROM pyscheduler.run_due_checks(slot => to_timestamp(:slot_epoch), shard => :shard, shards => :shards,
                                             max => :max);
COMMIT;
