"""What the future checks' Python asks of sql/checks/: every function it uses, the statements of
its bench, and the limits it keeps to before a round trip (pyscheduler/sqlapi.py)."""

from __future__ import annotations

from ..sqlapi import Fn, Query

# a pending check (the type future_check): what due_checks, catch_up_checks and list_checks return
_CHECK = ("id", "entity_name", "entity_key", "job", "kind", "payload", "first_check_at", "next_check_at",
          "check_count", "max_checks", "created", "owner")

# -- the client (CheckClient, AsyncCheckClient) ---------------------------------------------------

ADD_CHECK = Fn("add_check", ("entity_name", "entity_key", "job", "check_at", "check_after", "payload", "kind",
                             "max_checks", "horizon"), ("id", "next_check_at", "added"))
DELETE_CHECKS = Fn("delete_checks", ("entity_name", "entity_key", "job"))
LIST_CHECKS = Fn("list_checks", ("entity_name", "entity_key", "job", "max", "after_at", "after_id"), _CHECK)
CHECK_HISTORY = Fn("check_history", ("entity_name", "entity_key", "job", "max", "before_at", "before_id"),
                   ("id", "entity_name", "entity_key", "job", "kind", "payload", "first_check_at", "last_check_at",
                    "check_count", "outcome", "error", "last_took", "total_took", "created", "ended", "owner"))

# -- the runner ------------------------------------------------------------------------------------

CHECK_SLOTS = Fn("check_slots", (), ("slot", "resolution", "clock"))
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

# -- the bench (pyscheduler bench checks): checks inserted straight into the table -----------------

BENCH_FILL = Query("""
INSERT INTO pyscheduler.checks (entity_name, entity_key, job, kind, first_check_at, next_check_at,
                                max_checks, horizon, created, owner)
SELECT %s, i::text, %s, %s, s, s, 5, '30 days', now(), current_user
  FROM generate_series(%s::bigint, %s::bigint) i,
       LATERAL (SELECT %s::timestamptz + CASE WHEN %s THEN (1 + mod(i, 2880)) * %s::interval
                                              ELSE interval '0' END AS s) x
""")  # (entity, job, kind, first id, last id, slot, spread over the next slots?, resolution)
BENCH_CLEAN_CHECKS = Query("DELETE FROM pyscheduler.checks WHERE entity_name = %s")
BENCH_CLEAN_HISTORY = Query("DELETE FROM pyscheduler.check_history WHERE entity_name = %s")
BENCH_DONE = Query("SELECT count(*) AS n FROM pyscheduler.check_history WHERE entity_name = %s AND outcome = 'done'")
BENCH_DUE = Query("SELECT count(*) FROM pyscheduler.due_checks(slot => %s, max => %s)")  # under EXPLAIN ANALYZE

# -- limits: SQL's, kept to in Python first. tests/checks/test_limits.py holds each to SQL. ----------

ERROR_CHARS = 2000  # the characters of an error check_history keeps (finish_checks cuts the rest)
