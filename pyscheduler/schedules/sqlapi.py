"""What the recurring schedules' Python asks of SQL: every function, view and statement it
uses (the client, the daemons, the CLI, the demo and the bench), and the limits it checks
before the round trip. ``tests/shared/test_sqlapi.py`` checks each entry against the catalog."""

from __future__ import annotations

from ..sqlapi import Fn, Query, View

# -- limits Python checks before the round trip: the SQL functions refuse one more with PS312 ---

MAX_SHARDS = 16384  # claim_due_critical_shards' shard_count (--shards of schedules run, resync, bench)
MIN_RESYNC_LEASE_S = 0.001  # resync_take's lease, 1 ms..1 day (schedules resync --lease)
MAX_RESYNC_LEASE_S = 86400.0

# -- the client (ScheduleClient, AsyncScheduleClient; the CLI and the demo through it or alike) --

_FIELDS = ("target", "every", "cron", "tz", "target_kind", "payload", "priority", "retry_attempts", "retry_base",
           "retry_jitter", "critical", "catchup_window", "overlap", "start_at", "end_at", "max_runs")
CREATE_SCHEDULE = Fn("create_schedule", ("name", *_FIELDS, "paused", "paused_note"))
UPDATE_SCHEDULE = Fn("update_schedule", ("name", *_FIELDS))
PAUSE_SCHEDULE = Fn("pause_schedule", ("name", "note"))
RESUME_SCHEDULE = Fn("resume_schedule", ("name",))
TRIGGER_SCHEDULE = Fn("trigger_schedule", ("name",))
DELETE_SCHEDULE = Fn("delete_schedule", ("name",))
GET_SCHEDULE = Fn("get_schedule", ("name",))
LIST_SCHEDULES = Fn("list_schedules", ("name_like", "target_kind", "paused", "critical", "max_schedules",
                                       "after_name"), ("schedule",))
SCHEDULE_RUNS = Fn("schedule_runs", ("name", "with_outcome", "since", "max_runs", "before"),
                   ("expected_at", "outcome", "triggered", "attempts", "fired_at", "lateness", "missed_count",
                    "error", "task_rn"))
UPCOMING_RUNS = Fn("upcoming_runs", ("name", "n"), ("run_at",))
EXECUTION_COUNT = Fn("execution_count", ("name", "outcome"))

# -- the daemons (scheduler role) ----------------------------------------------------------------

# the index relay, the executors' re-reads and the resync: what the Redis index should hold
INDEX_ENTRIES = Fn("index_entries", ("ids",), ("id", "next_run_at", "active", "updated"))
INDEX_PAGE = Fn("index_page", ("after", "max_schedules"), ("id", "next_run_at", "updated"))
RESYNC_TAKE = Fn("resync_take", ("sync_id", "owner", "max_schedules", "lease"), ("id", "next_run_at", "updated"))
RESYNC_PROGRESS = Fn("resync_progress", ("sync_id",), ("done", "total", "complete"))
# what an executor fires by (targets.Details.from_row), cached by version
FIRE_DETAILS = Fn("fire_details", ("ids",),
                  ("id", "name", "target_kind", "target", "payload", "retry_attempts", "retry_base_ms",
                   "retry_jitter_ms", "critical", "paused", "active", "catchup_window_ms", "version"))
# the recorder's batches (binary arrays: arrays.py), each item answered
_RECORDED = ("id", "expected_at", "next_run_at", "recorded")
RECORD_EXECUTIONS = Fn("record_executions", ("ids", "expected", "outcomes", "attempts", "errors", "tokens"),
                       _RECORDED)
FIRE_TASK_SCHEDULES = Fn("fire_task_schedules", ("ids", "expected", "tokens"), _RECORDED)
STOP_SCHEDULES = Fn("stop_schedules", ("ids", "expected", "outcomes", "errors"), _RECORDED)
# degraded mode: the PostgreSQL claim (call_tuples: the columns in this order)
_CLAIMED = ("id", "expected_at", "claim_token")
CLAIM_DUE_CRITICAL = Fn("claim_due_critical", ("max_schedules", "hold"), _CLAIMED)
CLAIM_DUE_CRITICAL_SHARDS = Fn("claim_due_critical_shards", ("shards", "shard_count", "max_schedules", "hold"),
                               _CLAIMED)
PURGE_EXECUTIONS = Fn("purge_executions", ("max_executions",))

# -- the demo --------------------------------------------------------------------------------------

# the tasks' view: what the demo's task target left on its queue
TASK_COUNTS = View("task_counts", ("queue", "status", "tasks"))

# -- the bench (pyscheduler bench schedules): setup and cleanup behind the functions' back ---------

# the columns a bench schedule is cloned with from the first one (all but id, name and the
# generated ones; tests/schedules/test_sql.py checks it is every one): 1M create_schedule calls
# would take ~15 minutes, and the setup is not what is measured
CLONED_COLUMNS = (
    "every", "cron", "cron_spec", "tz", "start_at", "end_at", "max_runs", "target_kind", "target", "priority",
    "payload", "retry_attempts", "retry_base", "retry_jitter", "critical", "catchup_window", "overlap", "paused",
    "paused_note", "next_run_at", "trigger_at", "runs_count", "fired_count", "failed_count", "skipped_count",
    "missed_count", "consecutive_failures", "last_expected_at", "last_outcome", "last_error", "task_rns",
    "claim_token", "claimed_until", "created", "updated", "owner", "ended_note")
# (name prefix, first i, last i, id of the schedule cloned) -> id of each clone, named prefix || i
CLONE_SCHEDULES = Query(
    f"INSERT INTO pyscheduler.schedules (name, {', '.join(CLONED_COLUMNS)}) "
    f"SELECT %s || i, {', '.join('s.' + c for c in CLONED_COLUMNS)} FROM pyscheduler.schedules s, "
    "generate_series(%s::int, %s::int) i WHERE s.id = %s RETURNING id")
# (first due ms, n, spread s, n, ids): schedule k of ids due at first + (k mod n) * spread / n
ARM_SCHEDULES = Query(
    "UPDATE pyscheduler.schedules s SET next_run_at = timestamptz 'epoch' + "
    "(%s + ((a.o - 1) %% %s) * 1000 * %s::numeric / %s)::bigint * interval '1 millisecond' "
    "FROM unnest(%s::bigint[]) WITH ORDINALITY a(id, o) WHERE s.id = a.id")
SCHEDULE_DUE = Query("SELECT id, next_run_at FROM pyscheduler.schedules WHERE id = ANY(%s)")
# (name LIKE pattern) twice: executions first (no foreign key), then the schedules
DROP_EXECUTIONS = Query("DELETE FROM pyscheduler.schedule_executions WHERE schedule_id IN "
                        "(SELECT id FROM pyscheduler.schedules WHERE name LIKE %s)")
DROP_SCHEDULES = Query("DELETE FROM pyscheduler.schedules WHERE name LIKE %s")
# the bench's own backend and database: the CPU meter tells its processes from the server's
BACKEND = Query("SELECT pg_backend_pid() AS pid, current_database() AS db")
