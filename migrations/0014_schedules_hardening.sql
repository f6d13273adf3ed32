-- depends: 0012_hardening
-- Hardening of recurring schedules (issue 15). Forward-only; function code in
-- sql/schedules.sql. A schedule belongs to the role that created it (owner);
-- the ones that exist already belong to the client role, so the clients that
-- made them keep access. ended_note says why a schedule ended.

-- a constant default: no rewrite of the table, then no default (create_schedule sets it)
DO $owner$
BEGIN
    EXECUTE format('ALTER TABLE pyscheduler.schedules ADD COLUMN owner name NOT NULL DEFAULT %L',
                   (SELECT value FROM pyscheduler.settings WHERE name = 'client_role'));
END
$owner$;
ALTER TABLE pyscheduler.schedules ALTER COLUMN owner DROP DEFAULT;
ALTER TABLE pyscheduler.schedules ADD COLUMN ended_note text;

-- infinite bounds meant none
UPDATE pyscheduler.schedules SET end_at = NULL WHERE end_at = 'infinity';
UPDATE pyscheduler.schedules SET start_at = NULL WHERE start_at = '-infinity';
-- a catch-up window shorter than an executor's claim missed almost every occurrence
UPDATE pyscheduler.schedules SET catchup_window = interval '1 second' WHERE catchup_window < interval '1 second';
UPDATE pyscheduler.schedules SET catchup_window = interval '366 days' WHERE catchup_window > interval '366 days';
-- a time the daemons cannot load (outside [1970-01-01Z, 9999-01-01Z)) ends its schedule
UPDATE pyscheduler.schedules
   SET next_run_at = NULL, trigger_at = NULL,
       ended_note = 'ended by migration 0014: a time outside [1970-01-01T00:00:00Z, 9999-01-01T00:00:00Z) '
                    '(start_at, end_at or the next run); update it, then resume it'
 WHERE NOT (coalesce(next_run_at, 'epoch') >= timestamptz '1970-01-01 00:00:00+00'
            AND coalesce(next_run_at, 'epoch') < timestamptz '9999-01-01 00:00:00+00'
            AND coalesce(start_at, 'epoch') >= timestamptz '1970-01-01 00:00:00+00'
            AND coalesce(start_at, 'epoch') < timestamptz '9999-01-01 00:00:00+00'
            AND coalesce(end_at, 'epoch') >= timestamptz '1970-01-01 00:00:00+00'
            AND coalesce(end_at, 'epoch') < timestamptz '9999-01-01 00:00:00+00');

-- replaced in sql/schedules.sql: _check_tz by _tz_name, _first_run and _past_end by
-- _set_first_run and _ended_note; _advance returns ended_note too (a new return type)
DROP FUNCTION IF EXISTS pyscheduler._check_tz(text);
DROP FUNCTION IF EXISTS pyscheduler._first_run(pyscheduler.schedules, timestamptz);
DROP FUNCTION IF EXISTS pyscheduler._past_end(pyscheduler.schedules, timestamptz);
DROP FUNCTION IF EXISTS pyscheduler._advance(pyscheduler.schedules, timestamptz, timestamptz);
