-- pgbench: claim up to 100 due messages and delete them (the relay's two phases
-- without Kafka). Run together with delay_enqueue.sql, e.g.
-- pgbench -n -f bench/pgbench/delay_enqueue.sql@1 -f bench/pgbench/delay_claim.sql@1 -c 2 -j 2 -T 10 "$DSN"
-- Pass a node with -D node=<uuid> or let each client use its own random one.
\set batch 100
SELECT count(*) FROM pyscheduler.delete_fired(
    ids => ARRAY(SELECT id FROM pyscheduler.ready_and_claim(
                     node => md5(:client_id::text)::uuid, advance => interval '5 seconds', max_count => :batch)),
    node => md5(:client_id::text)::uuid);
