-- pgbench: slot selection, the '=' pass: take (lock) one slot's checks and roll back.
-- Fill a table with `pyscheduler bench checks --skip sql --skip python` logic or by hand, then:
-- pgbench -n -f bench/pgbench/checks_due.sql -D slot_epoch=<epoch of a slot with checks> -D max=1000 -c 1 -T 10 "$DSN"
BEGIN;
SELECT count(*) FROM pyscheduler.due_checks(slot => to_timestamp(:slot_epoch), max => :max);
ROLLBACK;
