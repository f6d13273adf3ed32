-- pgbench: a single-task worker's loop with complete_and_lease: each transaction
-- completes the task the client holds (rn and its lease token) and leases the next
-- one (one round trip, one durable commit per task). Fill the queue first (see
-- tasks_lease_complete.sql), then:
--   pgbench -n -f bench/pgbench/tasks_complete_and_lease.sql -D rn=NULL -D token=NULL -c 2 -j 2 -T 10 "$DSN"
-- (-D rn=NULL -D token=NULL: nothing held at the start.) tasks/s = tps while the queue
-- lasts; each client's last leased task stays running until the monitor resets it.
SELECT quote_nullable(t ->> 'rn') AS rn, quote_nullable(t ->> 'token') AS token
  FROM pyscheduler.complete_and_lease(worker => 'pgbench-' || :client_id, queue => 'pgbench',
                                      rn => :rn, token => :token) AS t \gset
