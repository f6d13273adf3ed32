"""Every read path keeps its plan whatever the statistics say (issue 34). The read paths are
walked from the catalog: every public function and view of schema pyscheduler is classified
below (a read with its probes, or why it is not one), so a new one fails until it is. Each
probe runs on data whose statistics favour the wrong plan (a quiet queue under busy ones, one
queue with most of the table, stale statistics; delay messages all far off or all due;
schedules all due at one instant; checks all in one slot) and fails when it reads more entries
of the capability's tables and indexes than it returns, plus a few per probe, or more index
pages than its descents and those entries take (a scan past rows, in the table or an index)."""

from __future__ import annotations

import pytest

from tests.support.reads import fill, reads
from tests.support.schedules import clone

STATUSES = ("waiting", "scheduled", "ready", "running", "completed", "aborted", "cancelled")

# Per capability, each read path's probes: SQL (a bare call is of pyscheduler's function), {a}
# and {b} the shape's names, and what it may read beyond the rows it returns (a bounded count).
READS = {
    "tasks": {
        # without a queue, the newest ten pages (100 tasks) first
        "list_tasks": ["list_tasks(max_tasks => 10)"]
        + [(f"list_tasks(status => '{s}', max_tasks => 10)", 100) for s in STATUSES]
        + [f"list_tasks(queue => '{{{q}}}', max_tasks => 10)" for q in ("a", "b")]
        + [f"list_tasks(queue => '{{{q}}}', status => '{s}', max_tasks => 10)" for q in ("a", "b") for s in STATUSES],
        "next_task_due": ["next_task_due(queue => '{a}')", "next_task_due(queue => '{b}')"],
        "task_counts": ["SELECT * FROM pyscheduler.task_counts"],
        "queue_status": ["SELECT * FROM pyscheduler.queue_status"],
        "oldest_ready_tasks": ["SELECT * FROM pyscheduler.oldest_ready_tasks"],
        "expired_leases": ["SELECT * FROM pyscheduler.expired_leases"],
        "queue_limits": ["SELECT * FROM pyscheduler.queue_limits"],
        # the dashboard's search (issue 30): an id range, a unique key, a spec fragment (answered
        # from at most 10,000 matches)
        "find_tasks": ["find_tasks(rn_from => '00000000-0000-0000-0000-000000000000', "
                       "rn_to => 'ffffffff-ffff-ffff-ffff-ffffffffffff', max_tasks => 10)",
                       "find_tasks(unique_key => '{a}', max_tasks => 10)",
                       ("find_tasks(spec => '{{\"n\": 1}}', max_tasks => 10)", 10_001)],
        "task_family": ["task_family(rn => '00000000-0000-7000-8000-000000000000')"],
        # every running task, grouped by worker and queue (bounded by what is running)
        "workers": [("SELECT * FROM pyscheduler.workers", 10_001)],
    },
    "delay": {
        # overdue messages are counted up to 10,000 (docs/sql-api.md, delay_queue)
        "delay_queue": [("SELECT * FROM pyscheduler.delay_queue", 10_001)],
        "delay_ready_by_node": ["SELECT * FROM pyscheduler.delay_ready_by_node"],
        "next_deadline": ["next_deadline()", "next_deadline(after => now())"],
        "waiting_messages": ["waiting_messages(max_messages => 10)"],
    },
    "schedules": {
        "list_schedules": ["list_schedules(max_schedules => 10)", "list_schedules(paused => true, max_schedules => 10)",
                           "list_schedules(paused => false, max_schedules => 10)",
                           "list_schedules(critical => true, max_schedules => 10)",
                           # a literal prefix: the 1,000 names with it (c-8...), not the 8,000 before them
                           ("list_schedules(name_like => 'c-8%', max_schedules => 10)", 1_001)],
        "get_schedule": ["get_schedule(name => '{b}')"],
        "schedule_runs": ["schedule_runs(name => '{b}', max_runs => 10)",
                          "schedule_runs(name => '{b}', with_outcome => 'failed', max_runs => 10)"],
        "execution_count": ["execution_count(name => '{b}')"],
        "upcoming_runs": ["upcoming_runs(name => '{b}', n => 5)"],
        "schedules_due_soon": ["SELECT * FROM pyscheduler.schedules_due_soon LIMIT 10"],
        "schedules_late": ["SELECT * FROM pyscheduler.schedules_late LIMIT 10"],
        "schedules_late_count": ["SELECT pyscheduler.schedules_late_count(up_to => 15)"],
        "schedules_paused": ["SELECT * FROM pyscheduler.schedules_paused LIMIT 10"],
        "schedules_failing": ["SELECT * FROM pyscheduler.schedules_failing LIMIT 10"],
        "index_page": ["index_page(after => 0, max_schedules => 10)"],
        # the scheduler's, once per resync: the active schedules counted
        "resync_progress": [("resync_progress(sync_id => 's1')", 10_001)],
        "find_schedules": ["find_schedules(target_prefix => '{b}', max_schedules => 10)"],
    },
    "checks": {
        "list_checks": ["list_checks(max => 10)", "list_checks(entity_name => 'order', entity_key => '{a}')"],
        "check_history": ["check_history(max => 10)", "check_history(entity_name => 'order', entity_key => '{a}')"],
        "overdue_checks": ["SELECT * FROM pyscheduler.overdue_checks LIMIT 10"],
        "checks_per_slot": ["SELECT * FROM pyscheduler.checks_per_slot LIMIT 10"],
        "check_outcomes": ["SELECT * FROM pyscheduler.check_outcomes"],
        "_current_check_slot": ["SELECT * FROM pyscheduler._current_check_slot"],
        "check_slots": ["check_slots()"],
        "find_checks": ["find_checks(entity_key => '{a}', max => 10)"],
    },
}
TABLES = {"tasks": ("tasks",), "delay": ("delay_messages",), "schedules": ("schedules", "schedule_executions"),
          "checks": ("checks", "check_history")}

# Not a read path: by primary key or of one row, no table read, or a write (the hot paths are
# the flatness bench's).
NOT_READS = {
    "by primary key": ["get_task", "parent_results", "holds_lease", "version", "http_allow", "index_entries",
                       "fire_details", "step_results", "task_steps", "find_message"],
    "no table": ["next_cron_time", "slot_round", "retry_worst_case"],
    "reads at most max_rows rows, all counted (the dashboard's activity)": ["activity", "activity_latency",
                                                                           "queue_activity"],
    "a write": [
        "abort_task", "add_check", "await_event", "delete_tasks", "emit_event", "record_step", "run_tasks_now",
        "sleep_task", "submit_task_lean", "submit_tasks_lean", "worker_seen", "cancel_message", "cancel_task",
        "catch_up_checks", "claim_due_critical",
        "claim_due_critical_shards", "cleanup_tasks", "complete_and_lease", "complete_task", "complete_tasks",
        "create_schedule", "delete_checks", "delete_fired", "delete_schedule", "due_checks", "end_deleted_checks",
        "enqueue_message", "enqueue_messages", "fail_task", "fail_tasks", "finish_check", "finish_checks",
        "merge_task_search_index", "fold_task_tallies",
        "fire_task_schedules", "heartbeat_task", "heartbeat_tasks", "lease_task", "lease_tasks", "lease_tasks_lean",
        "pause_queue", "pause_schedule", "purge_check_history", "purge_executions", "ready_and_claim",
        "record_executions", "register_worker", "reset_expired_tasks", "reset_stuck", "resume_queue",
        "resume_schedule", "resync_take", "retry_task", "retry_tasks", "run_check_jobs", "run_checks",
        "run_due_checks", "set_check_settings", "set_http_allow", "set_queue_limits", "set_queue_owner",
        "set_queue_keep_completed", "set_rate_limit", "stop_schedules", "submit_check_tasks", "submit_task",
        "submit_tasks", "submit_workflow",
        "trigger_schedule", "update_schedule", "watch_task", "yield_task", "yield_tasks"],
}


def test_every_public_function_and_view_is_classified(tx):
    """A read path is a view, or a function named list_*, get_*, *_count(s) or STABLE that reads a
    table; each is probed here (or is read by primary key), and nothing is classified twice."""
    catalog = {r["name"]: r for r in tx.execute(
        "SELECT p.proname AS name, p.provolatile = 's' AS stable, false AS view FROM pg_proc p "
        "WHERE p.pronamespace = 'pyscheduler'::regnamespace AND p.proname !~ '^_' "
        "UNION SELECT c.relname, true, true FROM pg_class c "
        "WHERE c.relnamespace = 'pyscheduler'::regnamespace AND c.relkind = 'v'")}
    not_reads = [n for names in NOT_READS.values() for n in names]
    classified = [n for probes in READS.values() for n in probes] + not_reads
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



def delay_far_off(conn) -> None:
    """20,000 messages waiting for 2099, none ready."""
    conn.execute("SELECT count(*) FROM pyscheduler._enqueue_messages(ids => ARRAY(SELECT 'f' || i FROM "
                 "generate_series(1, 20000) i), deadlines => ARRAY(SELECT timestamptz '2099-01-01' + i * interval "
                 "'1 second' FROM generate_series(1, 20000) i), store_late => false, p_now => now())")
    conn.execute("ANALYZE pyscheduler.delay_messages")


def delay_all_due(conn) -> None:
    """20,000 messages due in the last hour that no relay took (overdue), 100 taken (ready)."""
    conn.execute("SELECT count(*) FROM pyscheduler._enqueue_messages(ids => ARRAY(SELECT 'd' || i FROM "
                 "generate_series(1, 20000) i), deadlines => ARRAY(SELECT now() - interval '1 hour' + i * interval "
                 "'100 ms' FROM generate_series(1, 20000) i), store_late => false, "
                 "p_now => now() - interval '2 hours')")
    conn.execute("SELECT count(*) FROM pyscheduler._ready_and_claim(node => gen_random_uuid(), max_count => 100, "
                 "p_now => now(), after => NULL)")
    conn.execute("ANALYZE pyscheduler.delay_messages")


def schedules_base(conn) -> int:
    t = conn.execute("SELECT pyscheduler.create_schedule(name => 't', target => 'topic-a', every => '1 minute') AS s"
                     ).fetchone()["s"]
    conn.execute("SELECT * FROM pyscheduler._record_executions(ARRAY(SELECT %s::bigint FROM generate_series(1, 500)), "
                 "ARRAY(SELECT now() - i * interval '1 minute' FROM generate_series(1, 500) i), "
                 "ARRAY(SELECT CASE WHEN i %% 50 = 0 THEN 'failed' ELSE 'fired' END::pyscheduler.schedule_outcome "
                 "FROM generate_series(1, 500) i), ARRAY(SELECT 1 FROM generate_series(1, 500)), NULL, NULL, now())",
                 (t["id"],))
    return t["id"]


def schedules_all_due_at_one_instant(conn) -> None:
    """9,000 schedules a day away when ANALYZE ran; since, all due at one instant (a daily cron of
    one zone) a minute ago."""
    clone(conn, schedules_base(conn), "c-", 9_000, critical="i %% 2 = 0")
    conn.execute("ANALYZE pyscheduler.schedules")
    conn.execute("UPDATE pyscheduler.schedules SET next_run_at = date_trunc('minute', now()) - interval '1 minute'")


def schedules_most_paused_and_failing(conn) -> None:
    """9 in 10 of 9,000 schedules paused and failing, the others healthy; the critical ones last by
    name (c-8001 on)."""
    clone(conn, schedules_base(conn), "c-", 9_000, paused="i %% 10 <> 0", failures="CASE WHEN i %% 10 <> 0 THEN 3 "
          "ELSE 0 END", critical="i > 8000")
    conn.execute("ANALYZE pyscheduler.schedules")


def checks_of(conn, slot_expr: str) -> None:
    conn.execute("INSERT INTO pyscheduler.checks (entity_name, entity_key, job, kind, first_check_at, next_check_at, "
                 "max_checks, horizon, created, owner) SELECT 'order', i::text, 'app.probe', 'sql', s, s, 5, "
                 "'30 days', now(), current_user FROM generate_series(1, 20000) i, LATERAL (SELECT " + slot_expr
                 + " AS s) x")
    conn.execute("INSERT INTO pyscheduler.check_history (id, entity_name, entity_key, job, kind, first_check_at, "
                 "check_count, outcome, total_took, created, ended, owner) SELECT 100000 + i, 'order', "
                 "(i % 500)::text, 'app.probe', 'sql', now(), 1, 'done', '0', now(), now() - i * interval '1 second', "
                 "current_user FROM generate_series(1, 5000) i")


def checks_one_slot(conn) -> None:
    """20,000 checks all in the current slot."""
    checks_of(conn, "(SELECT slot FROM pyscheduler.check_slots())")
    conn.execute("ANALYZE pyscheduler.checks, pyscheduler.check_history")


def checks_stale_far_off(conn) -> None:
    """20,000 checks a month away when ANALYZE ran; since, all overdue by a slot."""
    checks_of(conn, "(SELECT slot FROM pyscheduler.check_slots()) + interval '30 days'")
    conn.execute("ANALYZE pyscheduler.checks, pyscheduler.check_history")
    conn.execute("UPDATE pyscheduler.checks SET next_check_at = next_check_at - interval '30 days 1 hour'")


SHAPES = [
    pytest.param("tasks", shape_quiet_under_busy, {"a": "hot", "b": "busy1"}, id="tasks-quiet-under-busy"),
    pytest.param("tasks", shape_one_queue_most, {"a": "quiet", "b": "big"}, id="tasks-one-queue-most"),
    pytest.param("tasks", shape_stale_status, {"a": "was", "b": "now"}, id="tasks-stale-status"),
    pytest.param("delay", delay_far_off, {}, id="delay-far-off"),
    pytest.param("delay", delay_all_due, {}, id="delay-all-due"),
    pytest.param("schedules", schedules_all_due_at_one_instant, {"a": "c-1", "b": "t"}, id="schedules-one-instant"),
    pytest.param("schedules", schedules_most_paused_and_failing, {"a": "c-1", "b": "t"}, id="schedules-most-paused"),
    pytest.param("checks", checks_one_slot, {"a": "77"}, id="checks-one-slot"),
    pytest.param("checks", checks_stale_far_off, {"a": "77"}, id="checks-stale-far-off"),
]
DESCENT = 4  # the pages of one index descent, and the next leaf
PLANNING = 20  # an index's pages the planner reads (its metapage, its ends for estimates)
PER_PROBE = 100  # a page (10) per status and queue merged, the probes per priority, a page's edge


@pytest.mark.parametrize("capability, build, names", SHAPES)
def test_every_read_reads_what_it_returns_on_statistics_that_favour_the_wrong_plan(conn, capability, build, names):
    for table in TABLES[capability]:  # the statistics stay as built
        conn.execute(f"ALTER TABLE pyscheduler.{table} SET (autovacuum_enabled = false)")
    build(conn)
    for table in TABLES[capability]:  # the old entries gone, the statistics kept
        conn.execute(f"VACUUM pyscheduler.{table}")
    running = conn.execute("SELECT count(*) AS n FROM pyscheduler.tasks WHERE status = 'running'").fetchone()["n"]
    failed = []
    for probes in READS[capability].values():
        for probe in probes:
            sql, allowed = probe if isinstance(probe, tuple) else (probe, 0)
            sql = sql.format(**names)
            sql = sql if sql.startswith("SELECT") else f"SELECT * FROM pyscheduler.{sql}"
            rows, r = reads(conn, sql, tables=TABLES[capability])
            # the running tasks (as many as the workers hold) are read whole, in deadline order
            read = sum(r.returned.values()) - min(r.returned.get("tasks_running_deadline_idx", 0), running)
            # a scanned index's pages: a descent per scan, the leaves of the entries returned (none
            # of entries stepped over inside the index), and what planning reads of it
            walked = {i: b for i, b in r.blocks.items() if i.endswith(("_idx", "_pkey", "_key")) and r.scans[i]
                      and b > DESCENT * r.scans[i] + (r.returned[i] + allowed) // 20 + PLANNING}
            if any(r.seq_scans(t) for t in TABLES[capability]) or read > len(rows) + PER_PROBE + allowed or walked:
                failed.append((sql, len(rows), {k: v for k, v in r.returned.items() if v}, walked))
    assert not failed, "\n".join(map(str, failed))
