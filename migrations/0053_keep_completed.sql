-- depends: 0052_submit_one_field
-- A queue may keep no completed tasks (issue 31, end to end): set_queue_keep_completed(queue,
-- false) makes a completion delete the task instead of marking it completed. A completion is an
-- UPDATE that is never HOT (the status is in the partial indexes' predicates): it writes a new
-- version of the row and its entries into the primary key, the two indexes of finished tasks and
-- the spec index, and leaves the old version for vacuum; a DELETE writes no entry. Capacity with
-- a Worker under a producer: +19 % (trees_ab, 4 rounds, docs/benchmarks.md).
--  * task_queues.keep_completed: true (the default) keeps them, as before.
--  * _task_done_log: what the dashboards' activity would have read from the deleted rows, a row
--    per completing call, queue and latency bucket (at = the completion's time, k =
--    _latency_k(due to started), n tasks), until _fold_task_minutes folds it into the minutes and
--    moves it to _task_done_minutes (by the minute, 8 days: activity's live reads).
ALTER TABLE pyscheduler.task_queues ADD COLUMN keep_completed boolean NOT NULL DEFAULT true;
CREATE INDEX task_queues_discarding_idx ON pyscheduler.task_queues (queue) WHERE NOT keep_completed;
CREATE TABLE pyscheduler._task_done_log (
    at    timestamptz NOT NULL,
    queue text        NOT NULL,
    k     smallint    NOT NULL,
    n     bigint      NOT NULL
);
CREATE INDEX _task_done_log_at_idx ON pyscheduler._task_done_log (at);
CREATE TABLE pyscheduler._task_done_minutes (
    minute timestamptz NOT NULL,
    queue  text        NOT NULL,
    k      smallint    NOT NULL,
    n      bigint      NOT NULL,
    PRIMARY KEY (minute, queue, k)
);
