-- depends: 0034_schedules_names
-- A task-target schedule carries the options of the tasks it submits (issue 29: a periodic task
-- function's max_attempts and concurrency_key): task_options, NULL = none, checked by
-- _validate_schedule (keys max_attempts and concurrency_key, task targets only). create_schedule
-- and update_schedule take it as a new last parameter: a new signature for CREATE OR REPLACE, so
-- the old functions are dropped here and created again by sql/schedules/3_api.sql (IF EXISTS: a
-- step-by-step install from an empty database loads the functions only after the last migration).

ALTER TABLE pyscheduler.schedules ADD COLUMN task_options jsonb;

-- the input rule (0031): a JSON parameter is of a domain bounding its size and nesting
CREATE DOMAIN pyscheduler.schedule_task_options AS jsonb
    CHECK (VALUE IS NULL OR pyscheduler._payload_ok(VALUE, 64, 16777216)
           OR pyscheduler._refuse_payload(VALUE, 'task_options', 64, 16777216, 'PS312'));

DROP FUNCTION IF EXISTS pyscheduler.create_schedule(pyscheduler.schedule_name, pyscheduler.schedule_target, interval,
    pyscheduler.cron_expr, pyscheduler.time_zone, pyscheduler.target_kind, pyscheduler.schedule_payload, bigint,
    timestamptz, timestamptz, bigint, integer, interval, interval, boolean, interval, pyscheduler.schedule_overlap,
    boolean, pyscheduler.schedule_note);
DROP FUNCTION IF EXISTS pyscheduler.update_schedule(pyscheduler.schedule_ref, pyscheduler.schedule_target, interval,
    pyscheduler.cron_expr, pyscheduler.time_zone, pyscheduler.target_kind, pyscheduler.schedule_payload, bigint,
    timestamptz, timestamptz, bigint, integer, interval, interval, boolean, interval, pyscheduler.schedule_overlap);
