-- depends: 0038_durable
-- The dashboard's search (issue 30) reads each kind of term through an index:
-- find_tasks(spec => '{"to": "a@example.com"}'): the tasks whose spec contains a fragment
-- (jsonb @>), from a GIN index of their specs' paths (jsonb_path_ops: about 80 bytes a task;
-- an insert adds its entries to the index's pending list, merged in bulk by the insert that
-- fills it or by autovacuum: submit_tasks within the noise of a 100,000-task run);
-- find_tasks(unique_key => k): the tasks of a key whatever their queue, finished ones included
-- (tasks_unique_idx holds the live ones, under queue and role); a task without a key adds no entry;
-- find_schedules(target_prefix => p): the schedules whose target starts with p (a schedule's target
-- changes only on update: firing adds nothing).
-- CREATE INDEX holds off writes to each table while it reads it.
CREATE INDEX tasks_spec_idx ON pyscheduler.tasks USING gin (spec jsonb_path_ops);
CREATE INDEX tasks_unique_key_idx ON pyscheduler.tasks (unique_key) WHERE unique_key IS NOT NULL;
CREATE INDEX schedules_target_pattern_idx ON pyscheduler.schedules (target text_pattern_ops, name);
-- task_family(rn): a task's children, whatever their state (task_edges holds a parent's edges
-- only while it is live); only a task submitted after others adds entries.
CREATE INDEX tasks_after_idx ON pyscheduler.tasks USING gin (after) WHERE after IS NOT NULL;
-- The workers the dashboard lists (issue 30): a Worker reports its queue and that it is alive
-- about every 10 s (worker_seen), off the lease path; the view `workers` joins what each holds.
CREATE TABLE pyscheduler._task_workers (
    worker     text NOT NULL,
    queue      text NOT NULL,
    registered timestamptz NOT NULL,
    seen_at    timestamptz NOT NULL,
    CONSTRAINT _task_workers_pkey PRIMARY KEY (worker, queue)
);
-- schedules_failing leaves paused schedules out (they are listed as paused): its index holds
-- only the failing schedules not paused, so nine in ten paused cost the view nothing.
DROP INDEX pyscheduler.schedules_failing_idx;
CREATE INDEX schedules_failing_idx ON pyscheduler.schedules (consecutive_failures DESC, name)
    WHERE consecutive_failures > 0 AND NOT paused;
