"""What the future checks' Python asks of sql/checks/: every function and view it uses, and the
limits it keeps to before a round trip (pyscheduler/sqlapi.py)."""

from __future__ import annotations

from ..sqlapi import Fn, Query, View

# a pending check (the type future_check): what due_checks, catch_up_checks and list_checks return
_CHECK = ("id", "entity_name", "entity_key", "job", "kind", "payload", "first_check_at", "next_check_at",
          "check_count", "max_checks", "created", "owner")

# -- the client (CheckClient, AsyncCheckClient) ---------------------------------------------------

ADD_CHECK = Fn("add_check", ("entity_name", "entity_key", "job", "check_at", "check_after", "payload", "kind",
                             "max_checks", "horizon"), ("id", "next_check_at", "added"))
DELETE_CHECKS = Fn("delete_checks", ("entity_name", "entity_key", "job"))
FIND_CHECKS = Fn("find_checks", ("entity_key", "max"), ("entity_name", "job", "state", "at", "owner"))
LIST_CHECKS = Fn("list_checks", ("entity_name", "entity_key", "job", "max", "after_at", "after_id"), _CHECK)
CHECK_HISTORY = Fn("check_history", ("entity_name", "entity_key", "job", "max", "before_at", "before_id"),
                   ("id", "entity_name", "entity_key", "job", "kind", "payload", "first_check_at", "last_check_at",
                    "check_count", "outcome", "error", "last_took", "total_took", "created", "ended", "owner"))

# -- views (the dashboard) -------------------------------------------------------------------------

CHECKS_PER_SLOT = View("checks_per_slot", ("slot", "checks", "sql_jobs", "python_jobs", "task_jobs"))
# oldest first: a LIMIT stops its index walk
OVERDUE_CHECKS = View("overdue_checks", ("entity_name", "entity_key", "job", "kind", "next_check_at", "overdue",
                                         "why"))
# how many overdue_checks has, up to %s (the runner's gauge)
OVERDUE_CHECKS_COUNT = Query(f"SELECT count(*) AS n FROM ({OVERDUE_CHECKS.select('LIMIT %s', '1')}) x")
CHECK_OUTCOMES = View("check_outcomes", ("job", "outcome", "checks", "avg_last_took", "max_last_took"))

# -- the runner ------------------------------------------------------------------------------------

CHECK_SLOTS = Fn("check_slots", (), ("slot", "next_slot", "resolution", "clock"))
# one batch in one statement; outcomes: from a database before job_outcomes (migration 0022)
RUN_DUE_CHECKS = Fn("run_due_checks", ("slot", "shard", "shards", "max", "after"),
                    ("taken", "last_id", "outcomes", "job_outcomes", "checks"))
# ... and the batch again, carefully, after a timeout
DUE_CHECKS = Fn("due_checks", ("slot", "shard", "shards", "max"), _CHECK)
CATCH_UP_CHECKS = Fn("catch_up_checks", ("shard", "shards", "max"), _CHECK)
RUN_CHECK_JOBS = Fn("run_check_jobs", ("ids",), ("next_check_at", "error", "took"))
SUBMIT_CHECK_TASKS = Fn("submit_check_tasks", ("ids",), ("id", "task_rn"))
END_DELETED_CHECKS = Fn("end_deleted_checks", ("ids",))  # SETOF bigint: the ids
FINISH_CHECKS = Fn("finish_checks", ("ids", "next_check_ats", "errors", "timed_out", "took"), ("id", "outcome"))
PURGE_CHECK_HISTORY = Fn("purge_check_history", ("batch",))
# the watchdog ends a statement that outlived its deadline
TERMINATE_BACKEND = Query("SELECT pg_terminate_backend(%s)")

# -- a task job (task_handler) and the demo --------------------------------------------------------

FINISH_CHECK = Fn("finish_check", ("id", "next_check_at", "error", "took", "claim"), ("outcome",))
SET_CHECK_SETTINGS = Fn("set_check_settings", ("resolution",), ("resolution",))

# -- limits: SQL's, kept to in Python first. tests/checks/test_limits.py holds each to SQL. ----------

ERROR_CHARS = 2000  # the characters of an error check_history keeps (finish_checks cuts the rest)
