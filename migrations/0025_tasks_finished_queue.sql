-- depends: 0024_delay_fillfactor
-- list_tasks(queue => q), with or without status => 'completed' (issue 21): the finished tasks
-- of one queue, newest first. It walked the primary key and skipped the other queues' tasks:
-- a quiet queue among 10 million finished tasks of busy ones took 8.2 s (2.8 s for its
-- completed ones). The price: the update that finishes a task (not HOT: its status changes)
-- writes one entry more, ~1-2.5 us of ~25 us database CPU per task (bench/tasks_cost.py sql,
-- docs/benchmarks.md). CREATE INDEX holds off writes to tasks while it runs (about 5 s per
-- million tasks).
CREATE INDEX tasks_finished_queue_idx ON pyscheduler.tasks (queue, rn)
    WHERE status IN ('completed', 'aborted', 'cancelled');
