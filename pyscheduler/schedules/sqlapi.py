"""What the recurring schedules' Python asks of SQL: every function, view and statement it
uses (the client, the daemons, the CLI and the demo), and the limits it checks before the
round trip. ``tests/shared/test_sqlapi.py`` checks each entry against the catalog."""

from __future__ import annotations

from ..sqlapi import Fn, View

# -- limits Python checks before the round trip: the SQL functions refuse one more with PS312 ---

MAX_SHARDS = 16384  # claim_due_critical_shards' shard_count (--shards of schedules run, resync, bench)
MIN_RESYNC_LEASE_S = 0.001  # resync_take's lease, 1 ms..1 day (schedules resync --lease)
MAX_RESYNC_LEASE_S = 86400.0

# -- the client (ScheduleClient, AsyncScheduleClient; the CLI and the demo through it or alike) --

_FIELDS = ("target", "every", "cron", "tz", "target_kind", "payload", "priority", "retry_attempts", "retry_base",
           "retry_jitter", "critical", "catchup_window", "overlap", "start_at", "end_at", "max_runs",
           "task_options")
CREATE_SCHEDULE = Fn("create_schedule", ("name", *_FIELDS, "paused", "paused_note"))
UPDATE_SCHEDULE = Fn("update_schedule", ("name", *_FIELDS))
PAUSE_SCHEDULE = Fn("pause_schedule", ("name", "note"))
RESUME_SCHEDULE = Fn("resume_schedule", ("name",))
TRIGGER_SCHEDULE = Fn("trigger_schedule", ("name",))
DELETE_SCHEDULE = Fn("delete_schedule", ("name",))
GET_SCHEDULE = Fn("get_schedule", ("name",))
FIND_SCHEDULES = Fn("find_schedules", ("target_prefix", "max_schedules"), ("schedule",))
LIST_SCHEDULES = Fn("list_schedules", ("name_like", "target_kind", "paused", "critical", "max_schedules",
                                       "after_name"), ("schedule",))
SCHEDULE_RUNS = Fn("schedule_runs", ("name", "with_outcome", "since", "max_runs", "before"),
                   ("expected_at", "outcome", "triggered", "attempts", "fired_at", "lateness", "missed_count",
                    "error", "task_rn"))
UPCOMING_RUNS = Fn("upcoming_runs", ("name", "n", "cron", "every", "tz", "start_at"), ("run_at",))
EXECUTION_COUNT = Fn("execution_count", ("name", "outcome"))

# -- views (the dashboard): schedules_due_soon lists the late ones first, by due time ---------------

SCHEDULES_DUE_SOON = View("schedules_due_soon", ("name", "due_at", "due_in", "triggered", "critical"))
SCHEDULES_LATE_COUNT = Fn("schedules_late_count", ("up_to",))  # the rows of schedules_late, up to up_to
SCHEDULES_FAILING = View("schedules_failing", ("name", "consecutive_failures", "last_error"))
SCHEDULES_PAUSED = View("schedules_paused", ("name", "paused_since", "paused_note"))
SCHEDULES_LATE = View("schedules_late", ())  # read whole by the benches

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
