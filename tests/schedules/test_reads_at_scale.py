"""Recurring schedules: list_schedules and schedule_runs page by keyset (every row once,
while others are written), each read path reads the index in its order and stops at the page, the
paused and failing views have indexes of their own, and claim_due_critical keeps its plan whatever
the statistics and the session say."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import psycopg

from tests.support.reads import reads
from tests.support.schedules import clone
from pyscheduler.db import Database

UTC = timezone.utc


def create(db, name, **kw):
    kw.setdefault("target", "topic-a")
    kw.setdefault("every", "10 seconds")
    return db.call_value("create_schedule", name=name, **kw)


def page_through(db: Database, per_page: int, between=None, **filters) -> list[str]:
    names, after = [], None
    while True:
        page = [r["schedule"]["name"] for r in db.call("list_schedules", max_schedules=per_page, after_name=after,
                                                       **filters)]
        assert page == sorted(page)
        names += page
        if len(page) < per_page:
            return names
        after = page[-1]
        if between:
            between(after)


def test_list_schedules_pages_return_every_schedule_once_while_others_are_created(db, dsn):
    for i in range(60):
        create(db, f"m-{i:03d}", paused=(i % 4 == 0))
    made = iter(range(1000))

    with psycopg.connect(dsn, autocommit=True) as other:
        def create_around(cursor: str) -> None:  # one before the cursor, one after it, one right at it
            for name in (f"a-{next(made)}", f"z-{next(made)}", f"{cursor}-{next(made)}"):
                other.execute("SELECT pyscheduler.create_schedule(name => %s, target => 'topic-a', "
                              "every => '10 seconds')", (name,))

        seen = page_through(db, 7, create_around)
    assert len(seen) == len(set(seen))
    assert [n for n in seen if n.startswith("m-") and "-" not in n[2:]] == [f"m-{i:03d}" for i in range(60)]
    assert all(n > "m-" for n in seen if n.startswith("z-") or n.startswith("m-"))
    paused = page_through(db, 4, paused=True)
    assert paused == [f"m-{i:03d}" for i in range(0, 60, 4)]
    assert [n for n in page_through(db, 5, name_like="m-00%") if n.count("-") == 1] == [f"m-{i:03d}" for i in range(10)]


def test_schedule_runs_pages_newest_first_every_execution_once(tx):
    s = create(tx, "r", every="1 second", retry_attempts=0, catchup_window="1 day")
    t0 = datetime.fromisoformat(s["next_run_at"])
    expected = [t0 + timedelta(seconds=i) for i in range(150)]
    tx.execute("SELECT * FROM pyscheduler._record_executions(%s, %s, %s, %s, NULL, NULL, %s)",
                 ([s["id"]] * 150, expected, ["failed" if i % 7 == 0 else "fired" for i in range(150)],
                  [1] * 150, t0 + timedelta(seconds=150)))

    def walk(**kw) -> list[datetime]:
        got, before = [], None
        while page := tx.call("schedule_runs", name="r", max_runs=40, before=before, **kw):
            got += [r["expected_at"] for r in page]
            before = page[-1]["expected_at"]
        return got

    assert walk() == sorted(expected, reverse=True)
    assert walk(with_outcome="failed") == sorted(expected[::7], reverse=True)
    assert walk(with_outcome="fired") == sorted(set(expected) - set(expected[::7]), reverse=True)
    assert walk(since=expected[100]) == sorted(expected[100:], reverse=True)


def test_each_read_path_reads_its_index_in_order_and_stops_at_the_page(tx):
    t = create(tx, "t", every="1 minute")
    clone(tx, t["id"], "c-", 3000, paused="i %% 10 = 1", failures="CASE WHEN i %% 20 = 3 THEN 1 + i %% 4 ELSE 0 END")
    first = datetime.fromisoformat(t["next_run_at"])
    tx.execute("SELECT * FROM pyscheduler._record_executions(%s, %s, %s, %s, NULL, NULL, %s)",
                 ([t["id"]] * 500, [first + timedelta(minutes=i) for i in range(500)],
                  ["failed" if i % 50 == 0 else "fired" for i in range(500)], [1] * 500, datetime.now(UTC)))
    tx.execute("ANALYZE pyscheduler.schedules")
    tx.execute("ANALYZE pyscheduler.schedule_executions")
    checks = [
        ("SELECT * FROM pyscheduler.list_schedules(max_schedules => 10)", "schedules_name_key", 10),
        ("SELECT * FROM pyscheduler.list_schedules(max_schedules => 10, after_name => 'c-1500')",
         "schedules_name_key", 10),
        ("SELECT * FROM pyscheduler.list_schedules(max_schedules => 10, paused => true)",
         "schedules_paused_name_idx", 10),
        ("SELECT * FROM pyscheduler.schedules_paused LIMIT 10", "schedules_paused_name_idx", 10),
        ("SELECT * FROM pyscheduler.schedules_failing LIMIT 10", "schedules_failing_idx", 10),
    ]
    # planning a cursor at the low end of the names ('' before every name) probes the index for
    # the actual smallest name (get_actual_variable_range), stepping over the dead entries that
    # earlier tests' rolled-back schedules left in this shared database: the planner's reading,
    # bounded by the dead entries, not the page's; measured on its own and allowed for
    _, probe = reads(tx, "EXPLAIN SELECT 1 FROM pyscheduler.schedules WHERE name > '' ORDER BY name LIMIT 10",
                     tables=("schedules",))
    for sql, index, n in checks:
        rows, r = reads(tx, sql, tables=("schedules",))
        assert len(rows) == n, sql
        assert r.seq_scans("schedules") == 0, sql
        assert 0 < r.entries(index) <= n + 2 + probe.entries("schedules_name_key"), (sql, r.returned)
    # a pattern with a literal prefix reads the names with that prefix only (100 of 3,000 here)
    rows, r = reads(tx, "SELECT schedule ->> 'name' AS name FROM pyscheduler.list_schedules(name_like => 'c-15%%', "
                    "max_schedules => 10, after_name => 'c-1500')", tables=("schedules",))
    assert [x["name"] for x in rows] == [f"c-{i}" for i in range(1501, 1511)]
    assert r.seq_scans("schedules") == 0
    assert r.entries("schedules_name_key") + r.entries("schedules_name_pattern_idx") <= 100 + 2, r.returned
    failing = [row["consecutive_failures"] for row in tx.execute("SELECT * FROM pyscheduler.schedules_failing")]
    assert failing == sorted(failing, reverse=True) and len(failing) == 150
    for sql, index in [("SELECT * FROM pyscheduler.schedule_runs(name => 't', max_runs => 10)",
                        "schedule_executions_pkey"),
                       ("SELECT * FROM pyscheduler.schedule_runs(name => 't', max_runs => 5, with_outcome => 'failed')",
                        "schedule_executions_unfired_idx")]:
        rows, r = reads(tx, sql, tables=("schedule_executions",))
        assert rows and r.seq_scans("schedule_executions") == 0, sql
        assert 0 < r.entries(index) <= 12, (sql, r.returned)


def test_claim_due_critical_keeps_its_plan_whatever_the_statistics_and_the_session(tx):
    """The statistics were taken while every critical schedule was a day away (issue 21's degraded
    case); then 1,500 of them fall due. Even in a session that turns index scans off, the claim
    reads schedules_critical_due_idx in due order and stops at max_schedules (before, a bitmap scan read
    every due entry and sorted them)."""
    t = create(tx, "t", critical=True)
    clone(tx, t["id"], "k-", 4000, critical="true")
    tx.execute("ANALYZE pyscheduler.schedules")
    tx.execute("UPDATE pyscheduler.schedules SET next_run_at = now() - interval '1 minute' - i * interval '1 ms' "
                 "FROM generate_series(1, 1500) i WHERE name = 'k-' || lpad(i::text, 4, '0')")
    tx.execute("SET enable_indexscan = off")
    rows, r = reads(tx, "SELECT * FROM pyscheduler.claim_due_critical(max_schedules => 100)", tables=("schedules",))
    assert len(rows) == 100
    due = sorted(rows, key=lambda x: x["expected_at"])
    assert due[0]["expected_at"] < due[-1]["expected_at"]  # the oldest due first: k-1500 .. k-1401
    assert {x["id"] for x in rows} == {x["id"] for x in tx.execute(
        "SELECT id FROM pyscheduler.schedules WHERE name >= 'k-1401' AND name <= 'k-1500'").fetchall()}
    assert r.seq_scans("schedules") == 0
    assert r.entries("schedules_critical_due_idx") <= 110, r.returned


def test_the_due_views_and_the_late_count_read_only_the_entries_they_return(db, conn):
    """schedules_due_soon, schedules_late and schedules_late_count read schedules_due_idx in
    due_at order and stop at their LIMIT, also among many healthy schedules firing more often
    than hourly, due within the minute and none late (a due time binned to the hour held those
    all in one bin, which each view read whole)."""
    t = create(db, "t", every="1 minute")
    # 40 late (an hour ago, then one a minute), 3,000 every-minute ones due within the next
    # 50 seconds (healthy), 3,000 due from 2 hours to 30 days ahead
    clone(conn, t["id"], "late-", 40,
          next_run="date_trunc('hour', now()) - interval '1 hour' + i * interval '1 minute'")
    clone(conn, t["id"], "fast-", 3000, next_run="now() + interval '10 seconds' + (i %% 40) * interval '1 second'")
    clone(conn, t["id"], "later-", 3000, next_run="now() + interval '2 hours' + i * interval '13 minutes'")
    conn.execute("DELETE FROM pyscheduler.schedules WHERE name = 't'")
    conn.execute("ANALYZE pyscheduler.schedules")
    late = [f"late-{i:04d}" for i in range(1, 41)]
    for sql, names in [("SELECT name FROM pyscheduler.schedules_late LIMIT 10", late[:10]),
                       ("SELECT name FROM pyscheduler.schedules_due_soon LIMIT 10", late[:10]),
                       ("SELECT name FROM pyscheduler.schedules_due_soon LIMIT 50", None),
                       ("SELECT name FROM pyscheduler.schedules_late LIMIT 100", late)]:
        rows, r = reads(conn, sql, tables=("schedules",))
        got = [x["name"] for x in rows]
        if names is None:  # the late ones, then the soonest fast ones
            assert got[:40] == late and len(got) == 50 and all(n.startswith("fast-") for n in got[40:]), sql
        else:
            assert got == names, sql
        assert r.seq_scans("schedules") == 0, sql
        assert r.entries("schedules_due_idx") <= len(got) + 1, (sql, r.returned)
    rows, r = reads(conn, "SELECT pyscheduler.schedules_late_count(up_to => 15) AS n", tables=("schedules",))
    assert rows[0]["n"] == 15 and r.seq_scans("schedules") == 0 and r.entries("schedules_due_idx") <= 16
    rows, r = reads(conn, "SELECT pyscheduler.schedules_late_count() AS n", tables=("schedules",))
    assert rows[0]["n"] == 40 and r.entries("schedules_due_idx") <= 41, r.returned


def test_the_views_ask_who_sees_targets_once_per_query(tx):
    """The views decide whether their reader sees a target by testing each row's owner against
    _seen_owners(), evaluated once per query (an InitPlan), not by a call per row (a call
    through a SECURITY DEFINER function cost ~65 us a row)."""
    for view in ("schedules_due_soon", "schedules_late", "schedules_paused", "schedules_failing"):
        plan = "\n".join(r["QUERY PLAN"] for r in tx.execute(f"EXPLAIN SELECT * FROM pyscheduler.{view} LIMIT 100"))
        assert "InitPlan" in plan and "SubPlan" not in plan, (view, plan)
        defn = tx.execute("SELECT pg_get_viewdef(%s::regclass) AS d", (f"pyscheduler.{view}",)).fetchone()["d"]
        assert "_seen_owners()" in defn and "_may_act" not in defn, view
