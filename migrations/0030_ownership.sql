-- depends: 0029_tasks_live_rn
-- One ownership rule (issue 27; docs/sql-api.md "Ownership"): a queue belongs to a role, and a
-- unique key is its submitting role's.
--  * task_queues.owner: the role that first submitted to the queue (or first paused or limited
--    it); only it, its members and admin change the queue's settings (pause, limits, rate
--    limits), whoever set them; set_queue_owner (admin) hands a queue over. Every queue with
--    tasks gets its row now, owned by the role of its oldest task (a queue that only has a row
--    keeps who limited or paused it), so no other role can claim it first after this step.
--  * tasks_unique_idx becomes (queue, submitted_by, unique_key): two roles' tasks of one key
--    both run; a second submit of a role's own live key is answered with its task, as before.
ALTER TABLE pyscheduler.task_queues ADD COLUMN owner name;

-- one sort of the table (seconds at 10 million tasks), once
CREATE TEMP TABLE first_submitters ON COMMIT DROP AS
SELECT DISTINCT ON (t.queue) t.queue, t.submitted_by FROM pyscheduler.tasks t ORDER BY t.queue, t.rn;

UPDATE pyscheduler.task_queues q
   SET owner = coalesce((SELECT f.submitted_by FROM first_submitters f WHERE f.queue = q.queue),
                        q.limits_by, q.paused_by);

INSERT INTO pyscheduler.task_queues (queue, updated, owner)
SELECT f.queue, now(), f.submitted_by FROM first_submitters f
ON CONFLICT (queue) DO NOTHING;

DROP INDEX pyscheduler.tasks_unique_idx;
CREATE UNIQUE INDEX tasks_unique_idx ON pyscheduler.tasks (queue, submitted_by, unique_key)
    WHERE unique_key IS NOT NULL AND status IN ('waiting', 'scheduled', 'ready', 'running');
