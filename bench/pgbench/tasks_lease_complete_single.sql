-- pgbench: single-task lease then complete, two transactions (two round trips) as a worker does.
-- Fill the queue first (see tasks_lease_complete.sql), then:
--   pgbench -n -f bench/pgbench/tasks_lease_complete_single.sql -c 2 -j 2 -T 10 "$DSN"
-- tasks/s = tps while the queue lasts.
SELECT quote_literal(pyscheduler.lease_task(queue => 'pgbench', worker => 'pgbench-' || :client_id) ->> 'rn') AS rn \gset
SELECT pyscheduler.complete_task(rn => :rn, worker => 'pgbench-' || :client_id) IS NOT NULL AS ok;
