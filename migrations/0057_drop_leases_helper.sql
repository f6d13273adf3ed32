-- depends: 0056_tasks_queue_status_index
-- The batch writes find their leases through _by_rn (sql/tasks/4_worker.sql), not by joining
-- _leases, whose join let a plan cached on a near-empty table read the whole primary key on every
-- call (issue 31; tests/tasks/test_worker_plans.py). Nothing calls _leases any more.
DROP FUNCTION IF EXISTS pyscheduler._leases(uuid[], uuid[]);
