-- pgbench: single-task lease then complete, two transactions (two round trips) as a worker does.
-- Fill the queue first (see tasks_lease_complete.sql), then:
--   pgbench -n -f bench/pgbench/tasks_lease_complete_single.sql -c 2 -j 2 -T 10 "$DSN"
-- tasks/s = tps while the queue lasts.
SELECT quote_literal(t ->> 'rn') AS rn, quote_literal(t ->> 'token') AS token
  FROM pyscheduler.lease_task(queue => 'pgbench', worker => 'pgbench-' || :client_id) AS t \gset
SELECT pyscheduler.complete_task(rn => :rn, token => :token) IS NOT NULL AS ok;
