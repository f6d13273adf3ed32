-- depends: 0027_tasks_tallies
-- delay_queue and delay_ready_by_node read kept counts of the ready messages (issue 21): they
-- read every entry of delay_messages_ready_idx, whose pages keep the entries of fired
-- (deleted) messages until a vacuum of the whole table (after 2 % of it changed: 200,000
-- messages at 10 million), 1,208 index pages for 1,000 ready messages. Now each claim appends
-- (its node, its readied_at, +n) and each fire or reset (node, readied_at, -n) per claim it
-- ends (sql/delay.sql keeps them); the readers sum the rows of the claims in flight. The
-- setting delay_counted goes, so the post-apply step counts the table again (stored and ready
-- messages, a sequential scan under a SHARE lock) in the transaction that loads the functions
-- that keep the counts.
CREATE TABLE pyscheduler._delay_ready_counts (
    node       uuid        NOT NULL,
    readied_at timestamptz NOT NULL,
    n          bigint      NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 500);
DELETE FROM pyscheduler.settings WHERE name = 'delay_counted';
