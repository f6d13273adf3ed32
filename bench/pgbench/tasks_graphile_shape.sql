-- pgbench: the same work in graphile-worker's shape, for comparison with
-- tasks_lease_complete.sql (docs/benchmarks.md, "Leased tasks: what a task costs the
-- database"): lease = one UPDATE ... FOR UPDATE SKIP LOCKED ... RETURNING setting
-- locked_at/locked_by/attempts; complete = DELETE of the finished jobs by id (no row
-- kept, no history, no token), two statements per batch. Create and fill its table first:
--   psql "$DSN" -c "CREATE TABLE gjobs (id bigserial PRIMARY KEY, queue text NOT NULL,
--     payload jsonb NOT NULL, priority int NOT NULL DEFAULT 0, run_at timestamptz NOT NULL DEFAULT now(),
--     attempts int NOT NULL DEFAULT 0, locked_at timestamptz, locked_by text,
--     created_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz NOT NULL DEFAULT now(),
--     is_available boolean GENERATED ALWAYS AS (locked_at IS NULL AND attempts < 25) STORED);
--     CREATE INDEX ON gjobs (priority, run_at) INCLUDE (id, queue) WHERE is_available;
--     INSERT INTO gjobs (queue, payload) SELECT 'q', jsonb_build_object('i', i) FROM generate_series(1, 200000) i"
-- then:
--   pgbench -n -f bench/pgbench/tasks_graphile_shape.sql -D n=500 -c 2 -j 2 -t 100 "$DSN"
WITH l AS (
    UPDATE gjobs SET attempts = gjobs.attempts + 1, locked_by = 'pgbench-' || :client_id, locked_at = now()
     WHERE id = ANY (ARRAY(SELECT id FROM gjobs WHERE is_available AND run_at <= now()
                            ORDER BY priority, run_at LIMIT :n FOR UPDATE SKIP LOCKED))
    RETURNING id)
SELECT quote_literal(coalesce(array_agg(id), '{}')::text) AS ids FROM l \gset
DELETE FROM gjobs WHERE id = ANY (:ids::bigint[]);
