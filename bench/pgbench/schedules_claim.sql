-- pgbench: the Postgres-only firing loop of degraded mode without Kafka: claim up
-- to :batch due critical schedules, then record them as fired with the claim
-- tokens (two transactions, as the executor does). Set up e.g. 100,000 critical
-- 1-second schedules first:
--   psql "$DSN" -c "SELECT count(pyscheduler.create_schedule(name => 'b' || i, target => 'bench',
--                   every => '1 second', retry_attempts => 0, critical => true))
--                   FROM generate_series(1, 100000) i"
-- pgbench -n -f bench/pgbench/schedules_claim.sql -D batch=100 -c 2 -j 2 -T 15 "$DSN"
-- firings/s = tps x batch (while more than batch x clients are due).
\set batch 100
SELECT coalesce(array_agg(id), '{}') AS ids, coalesce(array_agg(expected_at), '{}') AS ex,
       coalesce(array_agg(claim_token), '{}') AS tk, count(*) AS n
  FROM pyscheduler.claim_due_critical(max_schedules => :batch, hold => '30 seconds') \gset
SELECT count(*) FROM pyscheduler.record_executions(ids => ':ids'::bigint[], expected => ':ex'::timestamptz[],
    outcomes => array_fill('fired'::text, ARRAY[:n]::int[]), attempts => array_fill(1, ARRAY[:n]::int[]),
    tokens => ':tk'::uuid[]);
