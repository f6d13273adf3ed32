-- pgbench: submit one task per transaction (pyscheduler.submit_task).
-- pgbench -n -f bench/pgbench/tasks_submit.sql -c 2 -j 2 -T 10 "$DSN"
\set prio random(0, 100)
SELECT pyscheduler.submit_task(queue => 'pgbench', spec => '{"orderId": "233"}', priority => :prio);
