"""What the leased tasks' Python asks of SQL (sql/tasks/, docs/sql-api.md): every function, view,
statement and NOTIFY channel it uses, and the bounds it checks before the round trip.

``tests/shared/test_sqlapi.py`` checks each declaration against the migrated catalog;
``tests/tasks/test_limits.py`` has SQL refuse each bound + 1 with its SQLSTATE.
"""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

from ..sqlapi import Fn, View

# -- clients (TaskClient, AsyncTaskClient, the CLI) ------------------------------------------------

_SUBMIT = ("queue", "priority", "run_at", "run_in", "max_attempts", "after", "on_parent_failure")
# the submit functions' defaults that are not NULL: a single submit leaves out what equals them
SUBMIT_DEFAULTS = {"priority": 50, "on_parent_failure": "cancel"}
SUBMIT_TASK = Fn("submit_task", ("spec", "unique_key", "concurrency_key") + _SUBMIT)
SUBMIT_TASK_LEAN = Fn("submit_task_lean", ("spec", "unique_key", "concurrency_key") + _SUBMIT)  # the id only
SUBMIT_TASKS = Fn("submit_tasks", ("specs", "unique_keys", "concurrency_keys") + _SUBMIT, ("task",))
SUBMIT_TASKS_LEAN = Fn("submit_tasks_lean", ("specs", "unique_keys", "concurrency_keys") + _SUBMIT,
                       ("rn", "deduplicated"))  # submit_tasks answering ids only
SUBMIT_WORKFLOW = Fn("submit_workflow", ("workflow",))
GET_TASK = Fn("get_task", ("rn",))
LIST_TASKS = Fn("list_tasks", ("queue", "status", "owner", "max_tasks", "before_rn"), ("task",))
MAX_BULK = 1000  # delete_tasks', run_tasks_now's ids per call
DELETE_TASKS = Fn("delete_tasks", ("rns",), ("rn",))
RUN_TASKS_NOW = Fn("run_tasks_now", ("rns",), ("rn",))
TASK_FAMILY = Fn("task_family", ("rn", "max_tasks"), ("relation", "task_rn", "queue", "status", "updated"))
FIND_TASKS = Fn("find_tasks", ("rn_from", "rn_to", "unique_key", "spec", "max_tasks"), ("task",))
CANCEL_TASK = Fn("cancel_task", ("rn",))
RETRY_TASK = Fn("retry_task", ("rn",))
RETRY_TASKS = Fn("retry_tasks", ("queue", "status", "max_tasks"), ("task",))
PAUSE_QUEUE = Fn("pause_queue", ("queue", "note"))
RESUME_QUEUE = Fn("resume_queue", ("queue",))
SET_QUEUE_LIMITS = Fn("set_queue_limits", ("queue", "running_per_key", "running_total"))
SET_RATE_LIMIT = Fn("set_rate_limit", ("queue", "starts", "per", "by_key"))
SET_QUEUE_KEEP_COMPLETED = Fn("set_queue_keep_completed", ("queue", "keep"))
EMIT_EVENT = Fn("emit_event", ("name", "payload"))  # app.emit_event: how many waiting tasks it woke
TASK_STEPS = Fn("task_steps", ("rn",), ("kind", "step", "result", "recorded"))  # the dashboard's timeline
WATCH_TASK = Fn("watch_task", ("rn",))  # a handle's wait: the task, and NOTIFY watch_channel(rn) when it ends
QUEUE_LIMITS = View("queue_limits", ("queue", "running_per_key", "running_total", "rate_starts", "rate_per",
                                     "rate_by_key", "limits_by", "limits_updated"))
QUEUE_STATUS = View("queue_status", ("queue", "ready", "delayed", "running", "paused", "paused_by", "note",
                                     "oldest_ready_age", "next_due"))
TASK_COUNTS = View("task_counts", ("queue", "status", "tasks"))
EXPIRED_LEASES = View("expired_leases", ("rn", "queue", "owner", "deadline", "overdue", "progress"))
OLDEST_READY_TASKS = View("oldest_ready_tasks", ())  # read whole by pyscheduler bench flatness

# -- the Worker: lease, heartbeats, outcomes -------------------------------------------------------

REGISTER_WORKER = Fn("register_worker")
WORKER_SEEN = Fn("worker_seen", ("worker", "queue"))
WORKERS = View("workers", ("worker", "queue", "registered", "seen_at", "holds", "oldest_lease_age", "last_heartbeat",
                           "last_seen"))
# rows (rn, token, spec, priority, seq, attempt), read as tuples in this order
LEASE_TASKS_LEAN = Fn("lease_tasks_lean", ("queue", "worker", "n", "timeout", "aging_rate", "aging_cap"),
                      ("rn", "token", "spec", "priority", "seq", "attempt"))
NEXT_TASK_DUE = Fn("next_task_due", ("queue",))
# the batch writes answer only the leases they refused: (rn, sqlstate)
HEARTBEAT_TASKS = Fn("heartbeat_tasks", ("rns", "tokens", "progress", "timeout"), ("rn", "sqlstate"))
COMPLETE_TASKS = Fn("complete_tasks", ("rns", "tokens", "results"), ("rn", "sqlstate"))
FAIL_TASKS = Fn("fail_tasks", ("rns", "tokens", "errors", "retry_in"), ("rn", "sqlstate"))
YIELD_TASKS = Fn("yield_tasks", ("rns", "tokens"), ("rn", "sqlstate"))
# one lease at a time: a write the batch refused as data, the application's own transaction
HEARTBEAT_TASK = Fn("heartbeat_task", ("rn", "token", "progress", "timeout"))
COMPLETE_TASK = Fn("complete_task", ("rn", "token", "result"))
FAIL_TASK = Fn("fail_task", ("rn", "token", "error", "retry_in"))
ABORT_TASK = Fn("abort_task", ("rn", "token", "errors"))
YIELD_TASK = Fn("yield_task", ("rn", "token", "run_in"))
PARENT_RESULTS = Fn("parent_results", ("rn", "token"))
# durable task functions (ctx.step, ctx.sleep, ctx.await_event; sql/tasks/7_durable.sql)
RECORD_STEP = Fn("record_step", ("rn", "token", "step", "result"))
STEP_RESULTS = Fn("step_results", ("rn", "token"))  # {"<step>": result}
SLEEP_TASK = Fn("sleep_task", ("rn", "token", "until", "duration", "step"))  # {"asleep", "until"}
AWAIT_EVENT = Fn("await_event", ("rn", "token", "name", "timeout"))  # {"status", "payload" | "until"}

# -- the monitor -----------------------------------------------------------------------------------

RESET_EXPIRED_TASKS = Fn("reset_expired_tasks", ("max_tasks",), ("task",))
CLEANUP_TASKS = Fn("cleanup_tasks", ("retention", "max_tasks"))
MERGE_TASK_SEARCH_INDEX = Fn("merge_task_search_index")
FOLD_TASK_TALLIES = Fn("fold_task_tallies")

# -- one task per lease (pyscheduler bench tasks; the Worker leases in batches) ---------------------

LEASE_TASK = Fn("lease_task", ("queue", "worker", "timeout"))
COMPLETE_AND_LEASE = Fn("complete_and_lease", ("worker", "queue", "rn", "token", "timeout"))

# -- NOTIFY channels (sql/tasks/1_model.sql, "Notifications") --------------------------------------

MONITOR_CHANNEL = "pyscheduler_tasks_monitor"  # a task was yielded: the monitor may reset it now


def task_channel(queue: str) -> str:
    """``queue`` may have work (_task_channel)."""
    return f"pyscheduler_tasks:{queue}"


def cancel_channel(worker: str) -> str:
    """A task ``worker`` holds was cancelled."""
    return f"pyscheduler_cancel:{worker}"


def watch_channel(rn: UUID) -> str:
    """Watched task ``rn`` (watch_task) finished."""
    return f"pyscheduler_task:{rn}"


# -- bounds the SQL functions enforce and Python checks first, so a mistake is an InvalidArgument
# naming the argument before any round trip (SQLSTATE of SQL's refusal of bound + 1 in brackets)

MAX_PRIORITY = 4_294_967_295  # priority 0..MAX_PRIORITY (PS204); a Worker's aging_cap defaults to it
MAX_ATTEMPTS = 1000  # a task's max_attempts 1..MAX_ATTEMPTS (PS208)
MAX_QUEUE_BYTES = 40  # a queue's name, 1..MAX_QUEUE_BYTES bytes of UTF-8 (PS208)
MAX_LEASE = timedelta(days=1)  # a lease's timeout, more than 0 (PS208)
MAX_RETRY_IN = timedelta(days=365)  # a delay, 0..MAX_RETRY_IN: Retry's retry_in, Snooze's and submit's run_in (PS212)
MAX_PROGRESS = 1.0  # a heartbeat's progress 0..MAX_PROGRESS (PS205)
MAX_QUEUE_LIMIT = 1_000_000  # running_per_key, running_total, rate starts: 1..MAX_QUEUE_LIMIT (PS216)
MAX_REQUEUE = 10_000  # tasks one retry_tasks call requeues, 1..MAX_REQUEUE (PS208)
