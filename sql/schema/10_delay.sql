-- Fresh install: the delay queue's tables (same DDL as migrations/0002_delay.sql, 0006_delay_hardening.sql,
-- 0018_flat_reads.sql, 0024_delay_fillfactor.sql, 0028_delay_ready_counts.sql, 0041_delay_fired_minutes.sql and
-- 0046_delay_lag_minutes.sql).
-- Delay queue (chronos.md): messages waiting for their deadline or readied for firing.
-- waiting: readied_at IS NULL; ready: readied_at/readied_by set by the node that claimed it.
CREATE TABLE pyscheduler.delay_messages (
    id         text        NOT NULL,
    deadline   timestamptz NOT NULL,
    readied_at timestamptz,
    readied_by uuid,
    headers    jsonb       NOT NULL DEFAULT '[]'::jsonb,
    key        bytea,
    value      bytea,
    CONSTRAINT delay_messages_pkey PRIMARY KEY (id),
    CONSTRAINT delay_messages_id_length CHECK (length(id) BETWEEN 1 AND 128),
    CONSTRAINT delay_messages_readied_pair CHECK ((readied_at IS NULL) = (readied_by IS NULL)),
    CONSTRAINT delay_messages_headers_array CHECK (jsonb_typeof(headers) = 'array'),
    -- migrations/0006_delay_hardening.sql: every client library loads these, in any time zone
    CONSTRAINT delay_messages_deadline_range
        CHECK (deadline >= '1970-01-01 00:00:00+00' AND deadline < '9999-01-01 00:00:00+00')
)
-- fillfactor 90: a claim's new version stays on its page (0024_delay_fillfactor).
WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_insert_scale_factor = 0.02, fillfactor = 90);

-- ready_and_claim scans only waiting rows, in deadline order: its cost does not
-- grow with the number of ready rows.
CREATE INDEX delay_messages_waiting_idx ON pyscheduler.delay_messages (deadline) WHERE readied_at IS NULL;
-- reset_stuck scans only ready rows, oldest first; delay_ready_by_node reads their node here.
CREATE INDEX delay_messages_ready_idx ON pyscheduler.delay_messages (readied_at) INCLUDE (readied_by)
    WHERE readied_at IS NOT NULL;

-- delay_queue's counts (migrations/0018_flat_reads.sql): the rows sum to the number of stored
-- messages (waiting + ready); each statement that stores or deletes messages appends its
-- delta (appends never wait for each other), and the deltas are folded into one row now and
-- then. sql/delay.sql keeps them.
CREATE TABLE pyscheduler._delay_counts (
    n bigint NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 500);
-- delay_queue's and delay_ready_by_node's ready messages (migrations/0028_delay_ready_counts.sql):
-- per claim (node, readied_at), +n when claimed, -n as its messages are fired or reset.
CREATE TABLE pyscheduler._delay_ready_counts (
    node       uuid        NOT NULL,
    readied_at timestamptz NOT NULL,
    n          bigint      NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 500);
-- activity()'s delay queue (migrations/0041_delay_fired_minutes.sql): per minute, the messages
-- fired (deleted by delete_fired) and their lag (fired minus deadline), one row per call, folded
-- per minute now and then; minutes older than 8 days are deleted by the fold.
CREATE TABLE pyscheduler._delay_fired_minutes (
    minute    timestamptz      NOT NULL,
    n         bigint           NOT NULL,
    lag_sum_s double precision NOT NULL,
    lag_max_s double precision NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 500);
CREATE INDEX _delay_fired_minutes_idx ON pyscheduler._delay_fired_minutes (minute);
-- activity_latency()'s delay queue (migrations/0046_delay_lag_minutes.sql): per minute, a
-- histogram of the fired messages' lag (_latency_k buckets), appended and folded as above.
CREATE TABLE pyscheduler._delay_lag_minutes (
    minute timestamptz NOT NULL,
    k      smallint    NOT NULL,
    n      bigint      NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 500);
CREATE INDEX _delay_lag_minutes_idx ON pyscheduler._delay_lag_minutes (minute);
