"""Every read path keeps its plan whatever the statistics say (issue 34). The read paths are
walked from the catalog: every public function and view of schema pyscheduler is classified
below (a read with its probes, or why it is not one), so a new one fails until it is. Each
probe runs on tasks whose statistics favour the wrong plan (a quiet queue under newer tasks of
busy ones; one queue with most of the table; statistics saying a status has most of the table
when it has none) and fails when it reads more entries of the tasks table and its indexes than
it returns, plus a few per queue and priority probed and the running tasks, or more index
pages than its descents and the entries it returns take (what a plan that scans past rows
costs, in the table or inside an index)."""

from __future__ import annotations

import pytest

from tests.support.reads import fill, reads

STATUSES = ("waiting", "scheduled", "ready", "running", "completed", "aborted", "cancelled")

# The tasks' read paths: each probe, with {quiet} and {busy} the shape's queues.
TASK_READS = {
    "list_tasks": ["list_tasks(max_tasks => 10)"]
    + [f"list_tasks(status => '{s}', max_tasks => 10)" for s in STATUSES]
    + [f"list_tasks(queue => '{{{q}}}', max_tasks => 10)" for q in ("quiet", "busy")]
    + [f"list_tasks(queue => '{{{q}}}', status => '{s}', max_tasks => 10)"
       for q in ("quiet", "busy") for s in STATUSES],
    "next_task_due": ["next_task_due(queue => '{quiet}')", "next_task_due(queue => '{busy}')"],
    "task_counts": ["SELECT * FROM pyscheduler.task_counts"],
    "queue_status": ["SELECT * FROM pyscheduler.queue_status"],
    "oldest_ready_tasks": ["SELECT * FROM pyscheduler.oldest_ready_tasks"],
    "expired_leases": ["SELECT * FROM pyscheduler.expired_leases"],
    "queue_limits": ["SELECT * FROM pyscheduler.queue_limits"],
}

# Read paths of the other capabilities: their plans are pinned and checked against their own
# indexes by each capability's reads-at-scale test (issue 21), not on skewed statistics here.
READS_ELSEWHERE = {
    name: f"tests/{cap}/test_reads_at_scale.py" for cap, names in {
        "delay": ["delay_queue", "delay_ready_by_node", "next_deadline"],
        "schedules": ["list_schedules", "get_schedule", "schedule_runs", "execution_count", "schedules_due_soon",
                      "schedules_failing", "schedules_late", "schedules_paused", "schedules_late_count",
                      "index_page", "index_entries", "fire_details", "resync_progress", "upcoming_runs"],
        "checks": ["list_checks", "check_history", "check_outcomes", "checks_per_slot", "overdue_checks",
                   "_current_check_slot", "check_slots"],
    }.items() for name in names}

# Not a read path: by primary key or of one row, no table read, or a write (the hot paths are
# the flatness bench's).
NOT_READS = {
    "by primary key": ["get_task", "parent_results", "holds_lease", "version", "http_allow"],
    "no table": ["next_cron_time", "slot_round", "retry_worst_case"],
    "reads at most max_rows rows, all counted (the dashboard's activity)": ["activity"],
    "a write": [
        "abort_task", "add_check", "cancel_message", "cancel_task", "catch_up_checks", "claim_due_critical",
        "claim_due_critical_shards", "cleanup_tasks", "complete_and_lease", "complete_task", "complete_tasks",
        "create_schedule", "delete_checks", "delete_fired", "delete_schedule", "due_checks", "end_deleted_checks",
        "enqueue_message", "enqueue_messages", "fail_task", "fail_tasks", "finish_check", "finish_checks",
        "fire_task_schedules", "heartbeat_task", "heartbeat_tasks", "lease_task", "lease_tasks", "lease_tasks_lean",
        "pause_queue", "pause_schedule", "purge_check_history", "purge_executions", "ready_and_claim",
        "record_executions", "register_worker", "reset_expired_tasks", "reset_stuck", "resume_queue",
        "resume_schedule", "resync_take", "retry_task", "retry_tasks", "run_check_jobs", "run_checks",
        "run_due_checks", "set_check_settings", "set_http_allow", "set_queue_limits", "set_queue_owner",
        "set_rate_limit", "stop_schedules", "submit_check_tasks", "submit_task", "submit_tasks", "submit_workflow",
        "trigger_schedule", "update_schedule", "watch_task", "yield_task", "yield_tasks"],
}


def test_every_public_function_and_view_is_classified(tx):
    """A read path is a view, or a function named list_*, get_*, *_count(s) or STABLE that reads a
    table; each is probed here or by its capability's test, and nothing is classified twice."""
    catalog = {r["name"]: r for r in tx.execute(
        "SELECT p.proname AS name, p.provolatile = 's' AS stable, false AS view FROM pg_proc p "
        "WHERE p.pronamespace = 'pyscheduler'::regnamespace AND p.proname !~ '^_' "
        "UNION SELECT c.relname, true, true FROM pg_class c "
        "WHERE c.relnamespace = 'pyscheduler'::regnamespace AND c.relkind = 'v'")}
    not_reads = [n for names in NOT_READS.values() for n in names]
    classified = [*TASK_READS, *READS_ELSEWHERE, *not_reads]
    assert len(classified) == len(set(classified)), "classified twice"
    assert set(catalog) == set(classified), (set(catalog) - set(classified), set(classified) - set(catalog))
    must_be_read = {n for n, r in catalog.items()
                    if r["view"] or n.startswith(("list_", "get_")) or n.endswith(("_count", "_counts"))}
    assert not must_be_read & (set(not_reads) - set(NOT_READS["by primary key"]))


def shape_quiet_under_busy(conn) -> None:
    """hot's 20,000 completed tasks, then 10,000 ready of each busy queue: the statistics say hot's
    completed tasks are most of the table, and they are older than every other task."""
    fill(conn, 20_000, "hot", "completed", ago="3 hours")
    fill(conn, 3, "hot", "aborted", ago="2 hours")
    for q in ("busy1", "busy2"):
        fill(conn, 10_000, q, "ready", ago="1 hour")
    conn.execute("ANALYZE pyscheduler.tasks")


def shape_one_queue_most(conn) -> None:
    """big holds 90 % of the table, in every status, two priorities; quiet a few of each."""
    for status, n in [("completed", 15_000), ("ready", 3_000), ("scheduled", 2_000), ("aborted", 2_000),
                      ("cancelled", 1_000), ("running", 500)]:
        fill(conn, n, "big", status, ago="2 hours")
    fill(conn, 3_000, "big", "ready", priority="90", ago="90 minutes")
    for status in ("completed", "ready", "scheduled", "running", "aborted"):
        fill(conn, 3, "quiet", status, ago="3 hours")
    conn.execute("ANALYZE pyscheduler.tasks")


def shape_stale_status(conn) -> None:
    """The statistics say most of the table is running, scheduled and aborted in one queue; then
    those tasks completed (no ANALYZE since): the planner expects to find them at once."""
    fill(conn, 10_000, "was", "running", ago="2 hours")
    fill(conn, 5_000, "was", "scheduled", ago="100 minutes")
    fill(conn, 5_000, "was", "aborted", ago="90 minutes")
    fill(conn, 5_000, "now", "ready", ago="1 hour")
    fill(conn, 3, "was", "ready", ago="3 hours")
    conn.execute("ANALYZE pyscheduler.tasks")
    conn.execute("UPDATE pyscheduler.tasks SET status = 'completed', owner = NULL, deadline = NULL, run_at = NULL "
                 "WHERE queue = 'was' AND status IN ('running', 'scheduled', 'aborted')")
    conn.execute("VACUUM pyscheduler.tasks")  # the old entries gone, the statistics kept
    conn.execute("SELECT pyscheduler._task_count_all()")


SHAPES = [pytest.param(shape_quiet_under_busy, {"quiet": "hot", "busy": "busy1"}, id="quiet-under-busy"),
          pytest.param(shape_one_queue_most, {"quiet": "quiet", "busy": "big"}, id="one-queue-most"),
          pytest.param(shape_stale_status, {"quiet": "was", "busy": "now"}, id="stale-status")]
DESCENT = 4  # the pages of one index descent, and the next leaf
PLANNING = 20  # an index's pages the planner reads (its metapage, its ends for estimates)
PER_PROBE = 100  # a page (10) per status and queue merged, the probes per priority, a page's edge


@pytest.mark.parametrize("build, queues", SHAPES)
def test_every_task_read_reads_what_it_returns_on_statistics_that_favour_the_wrong_plan(conn, build, queues):
    conn.execute("ALTER TABLE pyscheduler.tasks SET (autovacuum_enabled = false)")  # the statistics stay skewed
    build(conn)
    running = conn.execute("SELECT count(*) AS n FROM pyscheduler.tasks WHERE status = 'running'").fetchone()["n"]
    failed = []
    for probes in TASK_READS.values():
        for probe in probes:
            sql = probe.format(**queues)
            sql = sql if sql.startswith("SELECT") else f"SELECT * FROM pyscheduler.{sql}"
            rows, r = reads(conn, sql, tables=("tasks",))
            # the running tasks (as many as the workers hold) are read whole, in deadline order
            read = sum(r.returned.values()) - min(r.entries("tasks_running_deadline_idx"), running)
            # a scanned index's pages: a descent per scan, the leaves of the entries returned (none
            # of entries stepped over inside the index), and what planning reads of it
            walked = {i: b for i, b in r.blocks.items() if i.endswith(("_idx", "_pkey")) and r.scans[i]
                      and b > DESCENT * r.scans[i] + r.returned[i] // 20 + PLANNING}
            if r.seq_scans("tasks") or read > len(rows) + PER_PROBE or walked:
                failed.append((sql, len(rows), {k: v for k, v in r.returned.items() if v}, walked))
    assert not failed, "\n".join(map(str, failed))
