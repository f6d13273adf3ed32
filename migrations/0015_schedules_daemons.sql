-- depends: 0012_hardening
-- Hardening of the schedule daemons (issue 15): a resync hands out leases on
-- key ranges, acknowledged after the taker wrote them to Redis, so a taker
-- that dies between the take and the write loses nothing (its lease expires
-- and another taker takes the range again). Forward-only.
ALTER TABLE pyscheduler._schedule_resyncs ADD COLUMN exhausted boolean NOT NULL DEFAULT false;
CREATE TABLE pyscheduler._schedule_resync_leases (
    sync_id  text NOT NULL,
    critical boolean NOT NULL,
    after_id bigint NOT NULL,
    last_id  bigint NOT NULL,
    n        bigint NOT NULL,
    owner    text NOT NULL,
    until    timestamptz NOT NULL,
    CONSTRAINT _schedule_resync_leases_pkey PRIMARY KEY (sync_id, critical, after_id)
);
-- resync_take has a lease parameter, resync_progress a completion column (new signatures)
DROP FUNCTION IF EXISTS pyscheduler.resync_take(text, text, integer);
DROP FUNCTION IF EXISTS pyscheduler.resync_progress(text);
