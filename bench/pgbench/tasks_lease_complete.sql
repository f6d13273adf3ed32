-- pgbench: lease up to :n tasks and complete them (with their lease tokens), one round
-- trip per batch. Fill the queue first, e.g.
--   psql "$DSN" -c "SELECT count(*) FROM pyscheduler.submit_tasks(queue => 'pgbench',
--                   specs => (SELECT jsonb_agg(jsonb_build_object('i', i)) FROM generate_series(1, 200000) i))"
-- then (each transaction handles up to :n tasks; tasks/s = tps * n while the queue lasts):
--   pgbench -n -f bench/pgbench/tasks_lease_complete.sql -D n=1000 -c 2 -j 2 -t 100 "$DSN"
-- -D n=1 measures single-task lease+complete (one statement instead of two round trips).
WITH l AS (SELECT task FROM pyscheduler.lease_tasks(queue => 'pgbench', worker => 'pgbench-' || :client_id, n => :n))
SELECT count(*) FROM pyscheduler.complete_tasks(rns => ARRAY(SELECT (task ->> 'rn')::uuid FROM l),
                                                tokens => ARRAY(SELECT (task ->> 'token')::uuid FROM l));
