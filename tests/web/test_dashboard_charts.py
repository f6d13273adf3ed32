"""The dashboard's charts over a chosen range (1 h, 6 h, 24 h, 7 d): throughput, failures and
latency per capability from what the database keeps (activity(), activity_latency()), so a
new dashboard process draws the same; the tasks page's counts by status over the range."""

from __future__ import annotations

import html
import re
from datetime import timedelta

import psycopg
import pytest

from pyscheduler.dashboard import make_app
from tests.support.dashboard import Client, served
from tests.support.reads import fill, reads


def _finished(x, queue: str, waited: list[float], ended_ago: str) -> None:
    """Tasks of ``queue`` leased and completed, each ``waited`` seconds from submit to start,
    ended ``ended_ago`` (only their timestamps moved: the status went through the API)."""
    worker = x("SELECT pyscheduler.register_worker() AS w").fetchone()["w"]
    for w in waited:
        rn = x("SELECT pyscheduler.submit_task(queue => %s, spec => '{}') ->> 'rn' AS rn", (queue,)).fetchone()["rn"]
        t = x("SELECT pyscheduler.lease_task(queue => %s, worker => %s) AS t", (queue, worker)).fetchone()["t"]
        assert str(t["rn"]) == str(rn)
        x("SELECT pyscheduler.complete_task(rn => %s, token => %s)", (t["rn"], t["token"]))
        x("UPDATE pyscheduler.tasks SET updated = now() - %s::interval, "
          "leased_at = now() - %s::interval - interval '1 second', "
          "created = now() - %s::interval - interval '1 second' - make_interval(secs => %s) WHERE rn = %s",
          (ended_ago, ended_ago, ended_ago, w, rn))


def _history(x) -> None:
    """A schedule execution 2 h ago, 5 s late, and a check ended 10 min ago, 7 s after its slot."""
    x("INSERT INTO pyscheduler.schedule_executions (schedule_id, expected_at, outcome, triggered, attempts, "
      "fired_at, lateness) VALUES (1, now() - interval '2 hours 5 seconds', 'fired', false, 1, "
      "now() - interval '2 hours', interval '5 seconds')")
    x("INSERT INTO pyscheduler.check_history (id, entity_name, entity_key, job, kind, first_check_at, "
      "last_check_at, check_count, outcome, total_took, created, ended, owner) VALUES (1, 'order', '1', 'sms', "
      "'python', now() - interval '1 hour', now() - interval '10 minutes 7 seconds', 1, 'done', interval '0', "
      "now() - interval '1 hour', now() - interval '10 minutes', current_user)")


def test_activity_latency_per_capability_and_bucket(tx):
    _finished(tx.execute, "lat", [float(i) for i in range(1, 21)], "3 days")
    _finished(tx.execute, "lat", [100.0], "1 minute")
    _history(tx.execute)
    week = tx.execute("SELECT * FROM pyscheduler.activity_latency(since => '7 days', bucket => '6 hours') "
                      "ORDER BY capability, bucket_start").fetchall()
    tasks = [r for r in week if r["capability"] == "tasks"]
    assert [(r["n"], r["p50"], r["p95"]) for r in tasks] == [
        (20, timedelta(seconds=10.5), timedelta(seconds=19.05)), (1, timedelta(seconds=100), timedelta(seconds=100))]
    assert all(r["complete"] for r in week)
    assert [(r["capability"], r["n"], r["p50"]) for r in week if r["capability"] != "tasks"] == [
        ("checks", 1, timedelta(seconds=7)), ("schedules", 1, timedelta(seconds=5))]
    day = tx.execute("SELECT capability, sum(n) AS n FROM pyscheduler.activity_latency(since => '1 day', "
                     "bucket => '1 hour') GROUP BY 1 ORDER BY 1").fetchall()
    assert [(r["capability"], r["n"]) for r in day] == [("checks", 1), ("schedules", 1), ("tasks", 1)]
    # activity() now reaches back 7 days too; past that both refuse
    old = tx.execute("SELECT sum(n) AS n FROM pyscheduler.activity(since => '7 days', bucket => '6 hours') "
                     "WHERE capability = 'tasks'").fetchone()["n"]
    assert old == 21
    # at most max_rows rows per capability, newest first: complete says where it stopped
    cut = tx.execute("SELECT * FROM pyscheduler.activity_latency(since => '7 days', bucket => '7 days', "
                     "max_rows => 5) WHERE capability = 'tasks'").fetchall()
    assert sum(r["n"] for r in cut) == 5 and not any(r["complete"] for r in cut)
    for args in ("since => '8 days'", "bucket => '2 hours'", "max_rows => 0"):
        with pytest.raises(psycopg.Error) as e, tx.conn.transaction():
            tx.execute(f"SELECT * FROM pyscheduler.activity_latency({args})")
        assert e.value.sqlstate == "PS001"


def _titles(page: str) -> list[str]:
    return [html.unescape(t) for t in re.findall(r"<title>([^<]*)</title>", page)]


def test_the_overview_s_charts_follow_the_chosen_range(conn, login):
    _finished(conn.execute, "lat", [float(i) for i in range(1, 21)], "3 days")
    _history(conn.execute)
    app = make_app(login("pyscheduler_monitor")[1])
    with served(app) as base:
        c = Client(base)
        hour, week, bad = c.get("/")[2], c.get("/?range=7d")[2], c.get("/?range=2d")
    app.close()
    assert bad[0] == 400 and "unknown range" in bad[2]
    # the picker: the range shown is marked, the others link with the range
    assert '<strong aria-current="true">1h</strong>' in hour and 'href="/?range=7d"' in hour
    assert '<strong aria-current="true">7d</strong>' in week and 'href="/?range=1h"' in week
    assert "<dt>finished last 7d</dt><dd>20 " in week and "<dt>finished last 1h</dt><dd>0 " in hour
    # bars per 6 h and latency lines with each bucket's figures in its title
    assert "max 20/6 h" in week
    titles = _titles(week)
    assert any(t.endswith("Z: p50 10.5 s, p95 19.1 s (20)") for t in titles), titles
    assert any(t.endswith("Z: p50 5 s, p95 5 s (1)") for t in titles), titles  # schedule lateness
    assert any(t.endswith("Z: p50 7 s, p95 7 s (1)") for t in titles), titles  # check lag
    assert not any("(20)" in t for t in _titles(hour))
    assert any(t.endswith("Z: p50 7 s, p95 7 s (1)") for t in _titles(hour))  # 10 minutes ago


def _cell(page: str, cell: str) -> str:
    return re.search(rf'<td class="num" id="{cell}"><a [^>]*title="([^"]*)">([^<]*)</a>', page).group(2, 1)


def test_the_tasks_page_counts_what_finished_per_queue_over_the_chosen_range(conn, login):
    _finished(conn.execute, "lat", [1.0] * 3, "3 days")
    _finished(conn.execute, "lat", [1.0], "1 minute")
    conn.execute("SELECT pyscheduler.cancel_task(rn => (pyscheduler.submit_task(queue => 'lat', spec => '{}') "
                 "->> 'rn')::uuid)")
    app = make_app(login("pyscheduler_monitor")[1])
    with served(app) as base:
        c = Client(base)
        hour, week = c.get("/tasks?status=completed")[2], c.get("/tasks?status=completed&range=7d")[2]
        assert c.get("/tasks?range=1y")[0] == 400
    app.close()
    assert _cell(hour, "completed-lat") == ("1", "4 kept") and _cell(week, "completed-lat") == ("4", "4 kept")
    assert _cell(hour, "cancelled-lat") == ("1", "1 kept") and _cell(hour, "aborted-lat") == ("0", "0 kept")
    assert "<th class=\"num\">completed 7d</th>" in week
    # the picker keeps the list's filter; the filter form keeps the range
    assert 'href="/tasks?status=completed&amp;range=24h"' in hour
    assert '<input type="hidden" name="range" value="7d">' in week


def _fire_delayed(x, ids: list[str], late: str) -> None:
    """Messages stored ``late`` past their deadline, claimed and fired (deleted) by one node."""
    x("SELECT * FROM pyscheduler.enqueue_messages(ids => %s, deadlines => "
      "array_fill(now() - %s::interval, ARRAY[%s]), store_late => true)", (ids, late, len(ids)))
    node = x("SELECT gen_random_uuid() AS n").fetchone()["n"]
    claimed = x("SELECT * FROM pyscheduler.ready_and_claim(node => %s, max_count => 100)", (node,)).fetchall()
    assert len(claimed) == len(ids)
    assert x("SELECT * FROM pyscheduler.delete_fired(ids => %s::pyscheduler.message_ref[], node => %s)",
             (ids, node)).fetchall() == []


def test_activity_counts_delay_messages_fired_per_minute_kept_8_days(tx):
    x = tx.execute
    _fire_delayed(x, ["a", "b", "c"], "5 seconds")
    _fire_delayed(x, ["d"], "2 seconds")
    rows = x("SELECT * FROM pyscheduler.activity(since => '1 hour', bucket => '5 minutes') "
             "WHERE capability = 'delay'").fetchall()
    assert [(r["outcome"], r["n"], r["worst"], r["complete"]) for r in rows] == [
        ("fired", 4, timedelta(seconds=5), True)]
    # a minute 9 days back goes at the next fold; this minute's rows become one
    x("INSERT INTO pyscheduler._delay_fired_minutes VALUES (date_trunc('minute', now() - interval '9 days'), "
      "7, 7, 1)")
    # (delete_fired folds now and then itself, 2 % of its calls: its two rows may be one already)
    assert x("SELECT sum(n) FILTER (WHERE minute = date_trunc('minute', now())) AS now, "
             "count(*) FILTER (WHERE minute < now() - interval '8 days') AS old "
             "FROM pyscheduler._delay_fired_minutes").fetchone() == {"now": 4, "old": 1}
    x("SELECT pyscheduler._delay_fold_counts()")
    kept = x("SELECT minute = date_trunc('minute', now()) AS now, n, lag_sum_s, lag_max_s "
             "FROM pyscheduler._delay_fired_minutes").fetchall()
    assert kept == [{"now": True, "n": 4, "lag_sum_s": 17.0, "lag_max_s": 5.0}]
    assert x("SELECT sum(n) AS n FROM pyscheduler.activity(since => '7 days', bucket => '1 day') "
             "WHERE capability = 'delay'").fetchone()["n"] == 4


def test_activity_latency_of_the_delay_queue_from_its_lag_per_minute(tx):
    x = tx.execute
    _fire_delayed(x, ["a", "b", "c"], "5 seconds")
    _fire_delayed(x, ["d"], "2 seconds")
    [row] = x("SELECT * FROM pyscheduler.activity_latency(since => '1 hour', bucket => '5 minutes') "
              "WHERE capability = 'delay'").fetchall()
    # the histogram's buckets are a factor sqrt(2) wide, each answered by its middle
    assert row["n"] == 4 and row["complete"]
    assert 5 / 2 ** 0.25 <= row["p50"].total_seconds() <= 5 * 2 ** 0.25, row
    assert 5 / 2 ** 0.25 <= row["p95"].total_seconds() <= 5 * 2 ** 0.25, row
    # the fold: this minute's rows become one a bucket; a minute 9 days back goes; one 30
    # minutes back (past the minutes a fold rewrites) stays as it was, and is read
    x("INSERT INTO pyscheduler._delay_lag_minutes VALUES (date_trunc('minute', now() - interval '9 days'), 20, 7), "
      "(date_trunc('minute', now() - interval '30 minutes'), 30, 2), "
      "(date_trunc('minute', now() - interval '30 minutes'), 30, 1)")
    x("SELECT pyscheduler._delay_fold_counts()")
    kept = x("SELECT minute = date_trunc('minute', now()) AS now, k, n FROM pyscheduler._delay_lag_minutes "
             "ORDER BY minute, k, n").fetchall()
    five, two = x("SELECT pyscheduler._latency_k(interval '5 seconds') AS a, "
                  "pyscheduler._latency_k(interval '2 seconds') AS b").fetchone().values()
    assert kept == [{"now": False, "k": 30, "n": 1}, {"now": False, "k": 30, "n": 2},
                    *sorted([{"now": True, "k": five, "n": 3}, {"now": True, "k": two, "n": 1}], key=lambda r: r["k"])]
    assert sum(r["n"] for r in x("SELECT n FROM pyscheduler.activity_latency(since => '1 hour', bucket => '1 hour') "
                                 "WHERE capability = 'delay'").fetchall()) == 4 + 3


def test_the_overview_shows_delay_messages_fired_over_the_range(conn, login):
    _fire_delayed(conn.execute, ["m1", "m2"], "3 seconds")
    app = make_app(login("pyscheduler_monitor")[1])
    with served(app) as base:
        page = Client(base).get("/?range=6h")[2]
    app.close()
    card = page.split('id="card-delay"')[1].split("</section>")[0]
    assert "<dt>fired last 6h</dt><dd>2 " in card, card
    assert any(t.endswith("Z: 2 ok, 0 failed") for t in _titles(card)), _titles(card)
    # its fire lag, p50 and p95 of the two, each within the histogram's factor 2^(1/4) of 3 s
    [lag] = [m.groups() for t in _titles(card) if (m := re.search(r"Z: p50 ([0-9.]+) s, p95 ([0-9.]+) s \(2\)$", t))]
    assert all(3 / 2 ** 0.25 <= float(v) <= 3 * 2 ** 0.25 for v in lag), lag


def _answers(x, since: str, bucket: str = "1 hour") -> tuple[list, list, list]:
    """The tasks' rows of activity(), activity_latency() (by ``bucket``) and queue_activity() over ``since``."""
    act = x("SELECT outcome, bucket_start, n, complete FROM pyscheduler.activity(since => %s, bucket => %s) "
            "WHERE capability = 'tasks'", (since, bucket)).fetchall()
    lat = x("SELECT bucket_start, n, p50, p95, complete FROM pyscheduler.activity_latency(since => %s, "
            "bucket => %s) WHERE capability = 'tasks'", (since, bucket)).fetchall()
    return act, lat, x("SELECT * FROM pyscheduler.queue_activity(since => %s)", (since,)).fetchall()


def _same_bucket(x, a: timedelta, b: timedelta) -> bool:
    return x("SELECT pyscheduler._latency_k(%s) = pyscheduler._latency_k(%s) AS same", (a, b)).fetchone()["same"]


def test_long_ranges_read_the_minutes_folded_and_answer_as_the_tasks_do(conn):
    _finished(conn.execute, "a", [float(i) for i in range(1, 21)], "3 days")
    _finished(conn.execute, "b", [2.1, 2.7], "5 hours")
    _finished(conn.execute, "a", [0.9], "23 hours 59 minutes 40 seconds")  # in the range's first minute
    _finished(conn.execute, "b", [1.0], "1 day 2 hours")  # before the 1 day range (and its first hour)
    _finished(conn.execute, "a", [1.5, 1.6, 1.65], "30 minutes")  # one histogram bucket (k 22)
    _finished(conn.execute, "b", [1.55], "59 minutes 40 seconds")  # in the 1 h range's first minute
    conn.execute("SELECT pyscheduler.cancel_task(rn => (pyscheduler.submit_task(queue => 'b', spec => '{}') "
                 "->> 'rn')::uuid)")  # ended now: not folded yet, read live
    ranges = {"1 hour": "5 minutes", "6 hours": "15 minutes", "1 day": "1 hour", "7 days": "1 hour"}  # the pages'
    direct = {since: _answers(conn.execute, since, bucket) for since, bucket in ranges.items()}
    assert conn.execute("SELECT pyscheduler.cleanup_tasks()").fetchone()  # the monitor's minutely call folds
    upto = conn.execute("SELECT upto FROM pyscheduler._task_minutes_folded").fetchone()["upto"]
    assert upto is not None
    assert conn.execute("SELECT sum(n) AS n FROM pyscheduler._task_minutes").fetchone()["n"] == 28  # not the cancel
    for since, (act, lat, queues) in direct.items():
        r_act, r_lat, r_queues = _answers(conn.execute, since, ranges[since])
        assert r_act == act and r_queues == queues  # counts: exactly
        assert [(r["bucket_start"], r["n"], r["complete"]) for r in r_lat] == [
            (r["bucket_start"], r["n"], r["complete"]) for r in lat]
        for rolled, exact in zip(r_lat, lat):  # percentiles: within a histogram bucket
            assert _same_bucket(conn.execute, rolled["p50"], exact["p50"])
            assert _same_bucket(conn.execute, rolled["p95"], exact["p95"])
    # a second fold at the first one's time (now(): a minute may have ended since) and one a few
    # minutes later count nothing twice
    assert conn.execute("SELECT pyscheduler._fold_task_minutes(%s::timestamptz + interval '1 minute') AS m",
                        (upto,)).fetchone()["m"] == 0
    assert conn.execute("SELECT pyscheduler._fold_task_minutes(now() + interval '3 minutes') AS m").fetchone()["m"] > 0
    assert conn.execute("SELECT sum(n) AS n FROM pyscheduler._task_minutes").fetchone()["n"] == 29
    for since in ("1 hour", "7 days"):
        assert _answers(conn.execute, since, ranges[since])[0] == direct[since][0]
        assert _answers(conn.execute, since, ranges[since])[2] == direct[since][2]


def test_the_fold_deletes_minutes_older_than_8_days(tx):
    for ago in ("9 days", "7 days"):
        tx.execute("INSERT INTO pyscheduler._task_minutes VALUES (now() - %s::interval, 'completed', 1)", (ago,))
        tx.execute("INSERT INTO pyscheduler._task_queue_hours VALUES (now() - %s::interval, 'q', 'completed', 1)",
                   (ago,))
        tx.execute("INSERT INTO pyscheduler._task_latency_minutes VALUES (now() - %s::interval, 3, 1)", (ago,))
    tx.execute("SELECT pyscheduler._fold_task_minutes()")
    for table, minute in (("_task_minutes", "minute"), ("_task_latency_minutes", "minute"),
                          ("_task_queue_hours", "hour")):
        kept = tx.execute(f"SELECT {minute} > now() - interval '8 days' AS recent FROM pyscheduler.{table}").fetchall()
        assert [r["recent"] for r in kept] == [True]


def test_a_week_or_an_hour_read_reads_only_the_tasks_ended_since_the_last_fold(conn):
    fill(conn, 300, "old", "completed", ago="3 days")
    fill(conn, 300, "old", "completed", ago="30 minutes")
    conn.execute("SELECT pyscheduler._fold_task_minutes()")
    _finished(conn.execute, "new", [1.0, 2.0], "0 seconds")
    conn.execute("VACUUM pyscheduler.tasks")  # the index entries of the versions _finished replaced
    for sql, n in (("SELECT * FROM pyscheduler.activity(since => '7 days', bucket => '1 hour')", 602),
                   ("SELECT * FROM pyscheduler.activity_latency(since => '7 days', bucket => '1 hour')", 2),
                   ("SELECT * FROM pyscheduler.queue_activity(since => '7 days')", 602),
                   ("SELECT * FROM pyscheduler.activity(since => '1 hour', bucket => '5 minutes')", 302),  # overview
                   ("SELECT * FROM pyscheduler.activity_latency(since => '1 hour', bucket => '5 minutes')", 2)):
        rows, r = reads(conn, sql, tables=("tasks",))
        assert r.seq_scans("tasks") == 0
        assert r.entries("tasks_terminal_updated_idx") == 2, sql  # the 2 since the fold, not the 300
        assert sum(x["n"] for x in rows if x.get("capability", "tasks") == "tasks") == n, sql


def _executions(x, n: int, ago: str, late: float, outcome: str = "fired") -> None:
    """n schedule executions recorded ``ago`` (one a millisecond apart), each ``late`` s late."""
    x("INSERT INTO pyscheduler.schedule_executions (schedule_id, expected_at, outcome, triggered, attempts, "
      "fired_at, lateness) SELECT i, f - make_interval(secs => %s), %s, false, 1, f, make_interval(secs => %s) "
      "FROM generate_series(1, %s) i, LATERAL (SELECT clock_timestamp() - %s::interval "
      "+ i * interval '1 millisecond' AS f) x", (late, outcome, late, n, ago))


def _schedule_answers(x, since: str, bucket: str) -> tuple[list, list]:
    """The schedules' rows of activity() and activity_latency() over ``since`` by ``bucket``."""
    act = x("SELECT outcome, bucket_start, n, worst, complete FROM pyscheduler.activity(since => %s, bucket => %s) "
            "WHERE capability = 'schedules'", (since, bucket)).fetchall()
    lat = x("SELECT bucket_start, n, p50, p95, complete FROM pyscheduler.activity_latency(since => %s, "
            "bucket => %s) WHERE capability = 'schedules'", (since, bucket)).fetchall()
    return act, lat


def test_schedule_executions_folded_answer_as_the_executions_do(conn):
    x = conn.execute
    _executions(x, 3, "3 days", 2.0)
    _executions(x, 2, "5 hours", 0.5, "failed")
    _executions(x, 1, "23 hours 59 minutes 40 seconds", 7.0, "missed")  # in the 1 day range's first minute
    _executions(x, 3, "30 minutes", 1.5, "skipped_overlap")
    _executions(x, 1, "59 minutes 40 seconds", 1.55)  # in the 1 h range's first minute
    _executions(x, 1, "0 seconds", 1.6)  # recorded now: not folded yet, read live (the last hour: k 22)
    ranges = {"1 hour": "5 minutes", "6 hours": "15 minutes", "1 day": "1 hour", "7 days": "1 hour"}  # the pages'
    direct = {since: _schedule_answers(x, since, bucket) for since, bucket in ranges.items()}
    assert x("SELECT pyscheduler.purge_executions() AS n").fetchone()["n"] == 0  # the cleanup's call folds
    upto = x("SELECT upto FROM pyscheduler._schedule_minutes_folded").fetchone()["upto"]
    assert upto is not None
    assert x("SELECT sum(n) AS n FROM pyscheduler._schedule_minutes").fetchone()["n"] == 10  # not the last
    for since, (act, lat) in direct.items():
        r_act, r_lat = _schedule_answers(x, since, ranges[since])
        assert r_act == act, since  # counts and the worst lateness: exactly
        assert [(r["bucket_start"], r["n"], r["complete"]) for r in r_lat] == [
            (r["bucket_start"], r["n"], r["complete"]) for r in lat], since
        for rolled, exact in zip(r_lat, lat):  # percentiles: within a histogram bucket
            assert _same_bucket(x, rolled["p50"], exact["p50"]) and _same_bucket(x, rolled["p95"], exact["p95"])
    # a second fold at the first one's time (now(): a minute may have ended since) and one a few
    # minutes later count nothing twice
    assert x("SELECT pyscheduler._fold_schedule_minutes(%s::timestamptz + interval '1 minute') AS m",
             (upto,)).fetchone()["m"] == 0
    assert x("SELECT pyscheduler._fold_schedule_minutes(now() + interval '3 minutes') AS m").fetchone()["m"] > 0
    assert x("SELECT sum(n) AS n FROM pyscheduler._schedule_minutes").fetchone()["n"] == 11
    assert _schedule_answers(x, "7 days", "1 hour")[0] == direct["7 days"][0]
    # purged past retention, the executions stay counted
    x("UPDATE pyscheduler.settings SET value = '1 day' WHERE name = 'schedules_execution_retention'")
    assert x("SELECT pyscheduler.purge_executions() AS n").fetchone()["n"] == 3
    assert _schedule_answers(x, "7 days", "1 hour")[0] == direct["7 days"][0]


def test_the_schedule_fold_deletes_minutes_older_than_8_days(tx):
    for ago in ("9 days", "7 days"):
        tx.execute("INSERT INTO pyscheduler._schedule_minutes VALUES (now() - %s::interval, 'fired', 1, '1 s')",
                   (ago,))
        tx.execute("INSERT INTO pyscheduler._schedule_latency_minutes VALUES (now() - %s::interval, 3, 1)", (ago,))
    tx.execute("SELECT pyscheduler._fold_schedule_minutes()")
    for table in ("_schedule_minutes", "_schedule_latency_minutes"):
        kept = tx.execute(f"SELECT minute > now() - interval '8 days' AS recent FROM pyscheduler.{table}").fetchall()
        assert [r["recent"] for r in kept] == [True]


def test_a_folded_read_reads_only_the_executions_recorded_since_the_last_fold(conn):
    _executions(conn.execute, 60000, "3 days", 1.0)  # a few BRIN ranges of 128 pages
    _executions(conn.execute, 10000, "30 minutes", 1.0)
    conn.execute("SELECT pyscheduler._fold_schedule_minutes()")
    _executions(conn.execute, 2, "0 seconds", 2.0)
    conn.execute("VACUUM ANALYZE pyscheduler.schedule_executions")
    pages = conn.execute("SELECT relpages FROM pg_class WHERE oid = 'pyscheduler.schedule_executions'::regclass"
                         ).fetchone()["relpages"]
    assert pages > 5 * 128
    for since, bucket, n in (("7 days", "1 hour", 70002), ("1 hour", "5 minutes", 10002)):
        for fn in ("activity", "activity_latency"):
            rows, r = reads(conn, f"SELECT * FROM pyscheduler.{fn}(since => %s, bucket => %s)", (since, bucket),
                            tables=("schedule_executions",))
            assert r.seq_scans("schedule_executions") == 0
            # the BRIN ranges at the range's edges (its first minute, the fold's), not them all
            assert r.blocks["schedule_executions"] <= 2 * 128 + 2, (fn, since)
            assert sum(x["n"] for x in rows if x["capability"] == "schedules") == n, (fn, since)
