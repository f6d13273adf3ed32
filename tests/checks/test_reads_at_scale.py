"""Future checks: list_checks and check_history page by keyset (every row once, while
others are written); checks_per_slot and check_outcomes come from counts kept by triggers, which
equal a real count after a random mix of every change (never reading the checks or their
history); each read path reads its index in order and stops at the page; the take keeps its plan
whatever the session says."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from psycopg.rows import dict_row

from tests.support.reads import reads

UTC = timezone.utc
JOB = "app.probe"

JOB_SQL = """
CREATE SCHEMA app;
-- payload.next: an interval from the check's slot (NULL: done); payload.raise: raise
CREATE FUNCTION app.probe(c pyscheduler.future_check) RETURNS timestamptz
LANGUAGE plpgsql SECURITY DEFINER SET search_path = app, pg_temp AS $$
BEGIN
    IF c.payload ? 'raise' THEN
        RAISE EXCEPTION 'check % is broken', c.entity_key;
    END IF;
    RETURN c.next_check_at + (c.payload ->> 'next')::interval;
END $$;
"""


@pytest.fixture
def app(conn):
    conn.execute(JOB_SQL)
    return conn


def now_slot(conn) -> datetime:
    return conn.execute("SELECT slot FROM pyscheduler.check_slots()").fetchone()["slot"]


def add(conn, key, check_at, *, name="order", job=JOB, kind="sql", payload='{"next": null}', max_checks=None):
    return conn.execute(
        "SELECT * FROM pyscheduler.add_check(entity_name => %s, entity_key => %s, job => %s, kind => %s, "
        "check_at => %s, payload => %s::jsonb, max_checks => %s)",
        (name, key, job, kind, check_at, payload, max_checks)).fetchone()


def test_list_checks_pages_return_every_check_once_while_others_are_added(app, dsn):
    base = now_slot(app) + timedelta(hours=1)
    for i in range(90):
        add(app, str(i), base + timedelta(minutes=15 * (i % 9)), job=JOB if i % 2 else "handler_x",
            kind="sql" if i % 2 else "python")
    # some handed to a task job: listed at their slot, in the same order
    app.execute("UPDATE pyscheduler.checks SET claim = gen_random_uuid(), claim_until = now() + interval '1 hour' "
                "WHERE entity_key::int % 10 = 3")
    first = app.execute("SELECT id, next_check_at FROM pyscheduler.checks ORDER BY next_check_at, id").fetchall()
    made = iter(range(10_000))
    seen, after = [], (None, None)
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as other:
        while True:
            page = app.execute("SELECT * FROM pyscheduler.list_checks(max => 8, after_at => %s, after_id => %s)",
                               after).fetchall()
            seen += [(r["id"], r["next_check_at"]) for r in page]
            if len(page) < 8:
                break
            after = (page[-1]["next_check_at"], page[-1]["id"])
            for offset in (-30, 0, 30):  # before the cursor, at its slot (a larger id), after it
                add(other, f"new-{next(made)}", after[0] + timedelta(minutes=offset))
    ids = [i for i, _ in seen]
    assert len(ids) == len(set(ids))
    assert [r for r in seen if r[0] in {f["id"] for f in first}] == [(f["id"], f["next_check_at"]) for f in first]
    assert seen == sorted(seen, key=lambda r: (r[1], r[0]))
    # one entity's checks: its own index, paged the same way
    add(app, "e", base, job="h1", kind="python")
    add(app, "e", base, job="h2", kind="python")
    add(app, "e", base + timedelta(minutes=15), job="h3", kind="python")
    got, after = [], (None, None)
    while page := app.execute("SELECT * FROM pyscheduler.list_checks(entity_name => 'order', entity_key => 'e', "
                              "max => 1, after_at => %s, after_id => %s)", after).fetchall():
        got.append(page[0]["job"])
        after = (page[0]["next_check_at"], page[0]["id"])
    assert got == ["h1", "h2", "h3"]
    with pytest.raises(psycopg.Error) as info:
        app.execute("SELECT * FROM pyscheduler.list_checks(after_at => now())")
    assert info.value.sqlstate == "PS408"


def test_check_history_pages_newest_first_every_row_once_while_checks_end(app, dsn):
    t = datetime(2026, 1, 1, tzinfo=UTC)
    app.execute("INSERT INTO pyscheduler.check_history (id, entity_name, entity_key, job, kind, first_check_at, "
                "check_count, outcome, total_took, created, ended, owner) "
                "SELECT i, 'order', i::text, 'j', 'sql', %s, 1, 'done', '0', %s, %s + (i / 3) * interval '1 minute', "
                "current_user FROM generate_series(1, 100) i", (t, t, t))  # three rows per ended: ties by id
    seen, before = [], (None, None)
    with psycopg.connect(dsn, autocommit=True) as other:
        k = 1000
        while page := app.execute("SELECT * FROM pyscheduler.check_history(max => 7, before_at => %s, "
                                  "before_id => %s)", before).fetchall():
            seen += [(r["ended"], r["id"]) for r in page]
            before = (page[-1]["ended"], page[-1]["id"])
            if before[1] > 100:  # past the first rows: stop adding (an older row per page never ends)
                continue
            for ended in (before[0] + timedelta(seconds=30), before[0] - timedelta(seconds=30), before[0]):
                k += 1
                other.execute("INSERT INTO pyscheduler.check_history (id, entity_name, entity_key, job, kind, "
                              "first_check_at, check_count, outcome, total_took, created, ended, owner) "
                              "VALUES (%s, 'order', 'x', 'j', 'sql', %s, 1, 'done', '0', %s, %s, current_user)",
                              (k, t, t, ended))
    ids = [i for _, i in seen]
    assert len(ids) == len(set(ids))
    assert [i for i in ids if i <= 100] == sorted(range(1, 101), key=lambda i: (i // 3, i), reverse=True)
    assert seen == sorted(seen, reverse=True)


def real_per_slot(conn) -> list[tuple]:
    return [tuple(r.values()) for r in conn.execute(
        "SELECT c.next_check_at AS slot, count(*) AS checks, count(*) FILTER (WHERE c.kind = 'sql') AS sql_jobs, "
        "count(*) FILTER (WHERE c.kind = 'python') AS python_jobs, "
        "count(*) FILTER (WHERE c.kind = 'task') AS task_jobs "
        "FROM pyscheduler.checks c WHERE c.claim IS NULL "
        "AND c.next_check_at >= (SELECT slot FROM pyscheduler.check_slots()) "
        "GROUP BY 1 ORDER BY 1")]


def real_outcomes(conn) -> dict:
    return {(r["job"], r["outcome"]): (r["checks"], round(r["avg_took"] or 0, 6), r["max_took"], r["avg_runs"])
            for r in conn.execute(
                "SELECT job, outcome, count(*) AS checks, extract(epoch FROM avg(last_took)) AS avg_took, "
                "max(last_took) AS max_took, avg(check_count)::numeric(10, 2) AS avg_runs "
                "FROM pyscheduler.check_history WHERE ended >= date_trunc('hour', now() - interval '1 day') "
                "GROUP BY 1, 2")}


def shown_outcomes(conn) -> dict:
    return {(r["job"], r["outcome"]): (r["checks"], round(r["avg_took"] or 0, 6), r["max_last_took"], r["avg_runs"])
            for r in conn.execute("SELECT *, extract(epoch FROM avg_last_took) AS avg_took "
                                  "FROM pyscheduler.check_outcomes")}


def test_counts_equal_a_real_count_after_a_random_mix_of_every_change(app):
    rnd = random.Random(21)
    base = now_slot(app) + timedelta(hours=2)
    keys = [str(i) for i in range(60)]
    kinds = [("sql", JOB), ("python", "handler_x"), ("task", "q-checks")]
    clock = base
    for step in range(160):
        op = rnd.choice(["add", "add", "add", "delete", "run", "run", "finish_task", "timeout", "settings",
                         "purge", "history", "fold"])
        if op == "add":
            kind, job = rnd.choice(kinds)
            payload = rnd.choice(['{"next": null}', '{"next": "20 minutes"}', '{"next": "-1 day"}',
                                  '{"next": "90 days"}', '{"raise": 1}'])
            add(app, rnd.choice(keys), base + timedelta(minutes=rnd.randint(0, 300)), job=job, kind=kind,
                payload=payload, max_checks=rnd.choice([None, 2]))
        elif op == "delete":
            app.execute("SELECT pyscheduler.delete_checks(entity_name => 'order', entity_key => %s)",
                        (rnd.choice(keys),))
        elif op == "run":  # a runner's batch at the earliest pending slot: SQL jobs run, task jobs handed out
            slot = app.execute("SELECT min(next_check_at) AS s FROM pyscheduler.checks WHERE claim IS NULL "
                               "AND next_check_at >= %s", (base,)).fetchone()["s"]
            if slot is not None:
                clock = max(clock, slot)
                with app.transaction():
                    app.execute("SELECT * FROM pyscheduler._run_due_checks(%s, 0, 1, %s, NULL, %s)",
                                (slot, rnd.randint(1, 10), clock + timedelta(seconds=1)))
        elif op == "finish_task":  # a task worker reports
            held = app.execute("SELECT id, claim FROM pyscheduler.checks WHERE claim IS NOT NULL LIMIT 3").fetchall()
            for h in held:
                app.execute("SELECT * FROM pyscheduler.finish_check(id => %s, claim => %s, next_check_at => %s)",
                            (h["id"], h["claim"], rnd.choice([None, clock + timedelta(hours=1)])))
        elif op == "timeout":  # the catch-up pass ends task jobs that did not report
            app.execute("UPDATE pyscheduler.checks SET claim_until = now() - interval '1 second' "
                        "WHERE claim IS NOT NULL AND random() < 0.5")
            with app.transaction():
                app.execute("SELECT * FROM pyscheduler._take_checks(NULL, 0, 1, 5, NULL, %s)",
                            (datetime.now(UTC),))
        elif op == "settings":
            app.execute("SELECT pyscheduler.set_check_settings(resolution => %s::interval)",
                        (rnd.choice(["15 minutes", "1 hour", "5 minutes"]),))
        elif op == "purge":  # rows older than the window only (within it, the largest last_took would stay)
            app.execute("SELECT pyscheduler._purge_check_history(%s, now() + interval '10 days')", (rnd.randint(1, 5),))
        elif op == "history":  # an operator's UPDATE of the history
            app.execute("UPDATE pyscheduler.check_history SET ended = ended - interval '2 days' WHERE random() < 0.1")
        else:
            app.execute("SELECT pyscheduler._fold_check_counts()")
        if step % 20 == 0:
            assert [tuple(r.values()) for r in app.execute("SELECT * FROM pyscheduler.checks_per_slot")] == \
                real_per_slot(app), (step, op)
            assert shown_outcomes(app) == real_outcomes(app), (step, op)
    assert [tuple(r.values()) for r in app.execute("SELECT * FROM pyscheduler.checks_per_slot")] == real_per_slot(app)
    assert shown_outcomes(app) == real_outcomes(app)
    assert real_per_slot(app) and real_outcomes(app)
    app.execute("TRUNCATE pyscheduler.checks, pyscheduler.check_history")
    assert app.execute("SELECT count(*) AS n FROM pyscheduler.checks_per_slot").fetchone()["n"] == 0
    assert shown_outcomes(app) == {}


def test_each_read_path_reads_its_index_in_order_and_stops_at_the_page(app):
    slot = now_slot(app)
    app.execute("INSERT INTO pyscheduler.checks (entity_name, entity_key, job, kind, first_check_at, next_check_at, "
                "max_checks, horizon, created, owner) SELECT 'order', i::text, %s, 'sql', s, s, 5, '30 days', now(), "
                "current_user FROM generate_series(1, 3000) i, LATERAL (SELECT %s::timestamptz + "
                "(CASE WHEN i <= 40 THEN -1 ELSE i %% 96 END) * interval '15 minutes' AS s) x", (JOB, slot))
    app.execute("INSERT INTO pyscheduler.check_history (id, entity_name, entity_key, job, kind, first_check_at, "
                "check_count, outcome, total_took, created, ended, owner) SELECT i, 'order', (i %% 500)::text, %s, "
                "'sql', now(), 1, 'done', '0', now(), now() - i * interval '1 minute', current_user "
                "FROM generate_series(1, 3000) i", (JOB,))
    app.execute("ANALYZE pyscheduler.checks")
    app.execute("ANALYZE pyscheduler.check_history")
    for sql, table, index, n in [
        ("SELECT * FROM pyscheduler.list_checks(max => 10)", "checks", "checks_due_idx", 10),
        ("SELECT * FROM pyscheduler.list_checks(max => 10, after_at => %s, after_id => 0)" % "now()",
         "checks", "checks_due_idx", 10),
        ("SELECT * FROM pyscheduler.list_checks(entity_name => 'order', entity_key => '77')", "checks",
         "checks_entity_job_key", 1),
        ("SELECT * FROM pyscheduler.overdue_checks LIMIT 10", "checks", "checks_due_idx", 10),
        ("SELECT * FROM pyscheduler.check_history(max => 10)", "check_history", "check_history_ended_idx", 10),
        ("SELECT * FROM pyscheduler.check_history(max => 10, before_at => now() - interval '1 day', before_id => 0)",
         "check_history", "check_history_ended_idx", 10),
        ("SELECT * FROM pyscheduler.check_history(entity_name => 'order', entity_key => '77')", "check_history",
         "check_history_entity_idx", 6),
    ]:
        rows, r = reads(app, sql, tables=(table,))
        assert len(rows) == n, sql
        assert r.seq_scans(table) == 0, sql
        assert 0 < r.entries(index) <= n + 2, (sql, r.returned)
    for sql in ["SELECT * FROM pyscheduler.checks_per_slot LIMIT 10", "SELECT * FROM pyscheduler.check_outcomes"]:
        rows, r = reads(app, sql, tables=("checks", "check_history"))
        assert rows, sql
        assert not any(r.scans.values()), (sql, r.scans)  # the counts only


def test_the_take_keeps_its_plan_whatever_the_session_prefers(app):
    """due_checks reads checks_due_idx in take order and stops at max, even in a session that turns
    index scans off; checks handed to a task job in the slot are stepped over, not taken."""
    slot = now_slot(app)
    app.execute("INSERT INTO pyscheduler.checks (entity_name, entity_key, job, kind, first_check_at, next_check_at, "
                "max_checks, horizon, created, owner, claim, claim_until) SELECT 'order', i::text, %s, 'sql', %s, %s, "
                "5, '30 days', now(), current_user, CASE WHEN i <= 20 THEN gen_random_uuid() END, "
                "CASE WHEN i <= 20 THEN now() + interval '1 hour' END FROM generate_series(1, 3000) i",
                (JOB, slot, slot))
    app.execute("ANALYZE pyscheduler.checks")
    app.execute("SET enable_indexscan = off")
    rows, r = reads(app, "SELECT id FROM pyscheduler.due_checks(slot => %s, max => 100)", (slot,),
                    tables=("checks",))
    assert len(rows) == 100 and min(x["id"] for x in rows) > 20  # not the handed-out ones
    assert r.seq_scans("checks") == 0
    assert r.entries("checks_due_idx") <= 125, r.returned
