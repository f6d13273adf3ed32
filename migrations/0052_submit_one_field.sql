-- depends: 0051_spec_index_merged_by_monitor
-- _submit_one, the single submit's path, names the refused spec by a parameter of its own
-- (field): 'specs[0]' for submit_tasks_lean of one spec, 'spec' for submit_task_lean, the single
-- submit that answers a scalar (issue 31). A new parameter is a new signature: the old function
-- is dropped here and created again by sql/tasks/2_client.sql (IF EXISTS: a step-by-step install
-- from an empty database loads the functions only after the last migration).
DROP FUNCTION IF EXISTS pyscheduler._submit_one(text, jsonb, bigint, timestamptz, integer, timestamptz, text, text);
