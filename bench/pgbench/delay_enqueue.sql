-- pgbench: enqueue a batch of 100 delayed messages (1-5 s ahead) in one call.
-- pgbench -n -f bench/pgbench/delay_enqueue.sql -c 2 -j 2 -T 10 "$DSN"
-- Messages per second = tps * 100.
\set batch 100
SELECT count(*) FROM pyscheduler.enqueue_messages(
    ids => ARRAY(SELECT md5(random()::text || clock_timestamp()::text || g::text) FROM generate_series(1, :batch) g),
    deadlines => ARRAY(SELECT clock_timestamp() + interval '1 second' + random() * interval '4 seconds'
                         FROM generate_series(1, :batch)),
    vals => ARRAY(SELECT convert_to('{"n": ' || g || '}', 'UTF8') FROM generate_series(1, :batch) g));
