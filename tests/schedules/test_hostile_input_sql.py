"""Recurring schedules, SQL side of the hardening: values the daemons load are
refused where they come in (instants, intervals, zones, cron, labels, targets), a schedule
ends rather than pass 9999-01-01, a batch ends a poison item alone, triggers and stale
occurrences fire once, and a schedule belongs to the role that created it. Ends with the
class tests: a poison catalogue of every client-writable field and a privilege walk."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import psycopg
import pytest
from psycopg.rows import dict_row

from pyscheduler import errors, migrate
from pyscheduler.db import Database, Jsonb
from tests.support import REPO

UTC = timezone.utc
DOCS = REPO / "docs"


def create(db, name="s", **kw):
    kw.setdefault("target", "topic-a")
    if "cron" not in kw:
        kw.setdefault("every", "10 seconds")
    return db.call_value("create_schedule", name=name, **kw)


def refused(db, function, sqlstate, **kw):
    """Call function; it must fail with sqlstate (and be a data error, never an outage)."""
    with pytest.raises(errors.SchedulerError) as info:
        db.call(function, **kw)
    got = info.value.sqlstate
    assert got == sqlstate, (function, kw, got, str(info.value))
    if sqlstate.startswith("PS"):
        assert errors.rejects_arguments(info.value) and not errors.is_retryable(info.value)
    return info.value


def record(conn, ids, expected, now, outcomes=None):
    return conn.execute(
        "SELECT * FROM pyscheduler._record_executions(%s, %s, %s, %s, NULL, NULL, %s)",
        (ids, expected, outcomes or ["fired"] * len(ids), [1] * len(ids), now)).fetchall()


def row(conn, schedule_id):
    return conn.execute("SELECT * FROM pyscheduler.schedules WHERE id = %s", (schedule_id,)).fetchone()


def due(conn, schedule_id):
    """What the index relay reads, loaded by psycopg as the daemons load it."""
    return conn.execute("SELECT * FROM pyscheduler.index_entries(%s)", ([schedule_id],)).fetchone()


# ------------------------------------------------------------------ 15, 27: instants and intervals


@pytest.mark.parametrize("sqlstate,kw", [
    ("PS314", dict(start_at="10000-01-01T00:00:00Z")),
    ("PS314", dict(start_at="infinity")),
    ("PS314", dict(start_at="0001-01-01T00:00:00Z")),
    ("PS314", dict(start_at="1969-12-31T23:59:59Z")),
    ("PS314", dict(end_at="10000-01-01T00:00:00Z")),
    ("PS314", dict(end_at="-infinity")),
    ("PS306", dict(every="3000000 days")),
    ("PS306", dict(every="36526 days")),
    ("PS309", dict(retry_base="2 hours")),
    ("PS309", dict(retry_jitter="100000000 years")),
    ("PS312", dict(catchup_window="367 days")),
])
def test_instants_and_intervals_the_daemons_cannot_load_are_refused(tx, sqlstate, kw):
    refused(tx, "create_schedule", sqlstate, name="s", target="t", **{"every": "1 minute", **kw})
    assert tx.call("list_schedules") == []


def test_a_first_run_after_9999_is_refused_and_infinite_bounds_mean_none(tx):
    # the first occurrence of 0 0 1 1 * after 9998-06-01 is 9999-01-01: out of range
    refused(tx, "create_schedule", "PS314", name="s", target="t", cron="0 0 1 1 *", start_at="9998-06-01T00:00:00Z")
    s = create(tx, end_at="infinity", start_at="-infinity")
    assert s["end_at"] is None and s["start_at"] is None
    refused(tx, "update_schedule", "PS314", name="s", start_at="infinity")
    refused(tx, "next_cron_time", "PS314", expr="* * * * *", after="infinity")
    refused(tx, "next_cron_time", "PS314", expr="* * * * *", after="-infinity")
    refused(tx, "upcoming_runs", "PS314", every="1 minute", start_at="infinity")
    # a computation that would pass 9999 answers NULL / stops, it never returns year 10000
    assert tx.call_value("next_cron_time", expr="0 0 1 1 *", after="9998-06-01T00:00:00Z") is None
    assert [r["run_at"] for r in tx.call("upcoming_runs", every="1 day", start_at="9998-12-29T00:00:00Z", n=10)] == [
        datetime(9998, 12, d, tzinfo=UTC) for d in (29, 30, 31)]


def test_a_schedule_whose_next_occurrence_would_pass_9999_ends_and_says_why(tx):
    s = create(tx, every="400 days", start_at="9998-12-31T00:00:00Z", catchup_window="1 day")
    c = create(tx, "c", cron="0 0 1 12 *", start_at="9998-06-01T00:00:00Z", catchup_window="1 day")
    t, tc = datetime(9998, 12, 31, tzinfo=UTC), datetime(9998, 12, 1, tzinfo=UTC)
    rows = record(tx, [s["id"], c["id"]], [t, tc], t)  # loaded by psycopg: no year 10000 in it
    assert {r["id"]: (r["recorded"], r["next_run_at"]) for r in rows} == {s["id"]: (True, None), c["id"]: (True, None)}
    for name in ("s", "c"):
        got = tx.call_value("get_schedule", name=name)
        assert got["next_run_at"] is None and "9999-01-01" in got["ended_note"], got
        assert not due(tx, got["id"])["active"]
    assert tx.call("upcoming_runs", name="s") == []
    # end_at and max_runs say so too
    m = create(tx, "m", max_runs=1)
    tm = datetime.fromisoformat(m["next_run_at"])
    record(tx, [m["id"]], [tm], tm)
    assert tx.call_value("get_schedule", name="m")["ended_note"] == "ended: max_runs reached"
    assert tx.call_value("update_schedule", name="m", max_runs=0)["ended_note"] is None  # lifted: running again


# ------------------------------------------------------------------ A, 23: a poison item ends alone


def poison(conn, schedule_id):
    """What a row from before the bounds may hold: an interval whose microseconds overflow bigint."""
    conn.execute("UPDATE pyscheduler.schedules SET every = interval '100000000 years' WHERE id = %s", (schedule_id,))


def test_record_executions_ends_a_poison_item_alone(tx):
    a, b, c = (create(tx, n) for n in "abc")
    poison(tx, b["id"])
    t = {x["id"]: datetime.fromisoformat(x["next_run_at"]) for x in (a, b, c)}
    now = max(t.values()) + timedelta(milliseconds=20)
    rows = record(tx, list(t), list(t.values()), now)
    got = {r["id"]: (r["recorded"], r["next_run_at"]) for r in rows}
    ten = timedelta(seconds=10)
    assert got == {a["id"]: (True, t[a["id"]] + ten), b["id"]: (True, None), c["id"]: (True, t[c["id"]] + ten)}
    stopped = tx.call_value("get_schedule", name="b")
    assert stopped["paused"] and "could not be recorded" in stopped["paused_note"]
    assert "22003" in stopped["last_error"] and stopped["due_at"] is None
    [run] = tx.call("schedule_runs", name="b")
    assert run["outcome"] == "fired" and "22003" in run["error"]
    assert [tx.call_value("execution_count", name=n) for n in "abc"] == [1, 1, 1]
    # the next batch is not blocked by it either
    assert record(tx, [a["id"]], [t[a["id"]] + ten], now + ten)[0]["recorded"]
    # an unknown outcome is the caller's error: the whole batch, as before
    with pytest.raises(psycopg.Error) as info:
        record(tx, [a["id"], c["id"]], [t[a["id"]] + 2 * ten, t[c["id"]] + ten], now, ["fired", "exploded"])
    assert info.value.sqlstate == "PS312"


def task_schedule(db, name, **kw):
    return create(db, name, target_kind="task", target=f"q-{name}", payload=Jsonb({"job": name}), **kw)


def fire_tasks(conn, ids, expected, now):
    return {r["id"]: r for r in conn.execute("SELECT * FROM pyscheduler._fire_task_schedules(%s, %s, NULL, %s)",
                                             (ids, expected, now)).fetchall()}


def test_fire_task_schedules_answers_each_item_alone(tx):
    """Item 23: one schedule changed (no longer a task target) and one poison row in a batch:
    the others are submitted and recorded; the changed one gets its due time back (the
    executor fires it by its new kind), the poison one is stopped with its error."""
    a, changed, bad, d = (task_schedule(tx, n) for n in ("a", "changed", "bad", "d"))
    t = {x["id"]: datetime.fromisoformat(x["next_run_at"]) for x in (a, changed, bad, d)}
    tx.call("update_schedule", name="changed", target_kind="kafka", target="topic-a")  # after the claim
    poison(tx, bad["id"])
    now = max(t.values()) + timedelta(milliseconds=5)
    got = fire_tasks(tx, list(t), list(t.values()), now)
    assert got[a["id"]]["recorded"] and got[d["id"]]["recorded"]
    assert got[a["id"]]["next_run_at"] == t[a["id"]] + timedelta(seconds=10)
    assert not got[changed["id"]]["recorded"] and got[changed["id"]]["next_run_at"] == t[changed["id"]]
    assert got[bad["id"]]["next_run_at"] is None
    assert [len(tx.call("list_tasks", queue=f"q-{n}")) for n in ("a", "changed", "bad", "d")] == [1, 0, 0, 1]
    stopped = tx.call_value("get_schedule", name="bad")
    assert stopped["paused"] and "22003" in stopped["last_error"]
    assert [r["outcome"] for r in tx.call("schedule_runs", name="bad")] == ["failed"]


def test_a_stale_task_occurrence_is_not_submitted(tx):
    """Item 21 (task targets): the recurrence changed after the occurrence was claimed;
    firing the old cadence's occurrence submits nothing and answers the new due time.
    The two cadences never meet (the hour's :00 against its :30), whatever the clock."""
    s = task_schedule(tx, "t", every="1 hour")
    old = datetime.fromisoformat(s["next_run_at"])
    assert old.minute == 0
    new = tx.call_value("update_schedule", name="t", cron="30 * * * *")
    got = fire_tasks(tx, [s["id"]], [old], old)[s["id"]]
    assert not got["recorded"] and got["next_run_at"] == datetime.fromisoformat(new["next_run_at"]) != old
    assert tx.call("list_tasks", queue="q-t") == [] and tx.call("schedule_runs", name="t") == []


# ------------------------------------------------------------------ 22: a trigger on the regular millisecond


def test_a_trigger_never_shares_the_regular_runs_millisecond(tx):
    s = create(tx, every="1 hour")
    t = datetime.fromisoformat(s["next_run_at"])
    trig = tx.execute("SELECT pyscheduler._trigger_schedule('s', %s) AS s", (t,)).fetchone()["s"]
    assert datetime.fromisoformat(trig["trigger_at"]) == t + timedelta(milliseconds=1)
    first = record(tx, [s["id"]], [t], t)[0]  # the regular run: the trigger is still due, on its own
    assert first["recorded"] and first["next_run_at"] == t + timedelta(milliseconds=1)
    second = record(tx, [s["id"]], [first["next_run_at"]], t)[0]
    assert second["recorded"] and second["next_run_at"] == t + timedelta(hours=1)
    assert sorted((r["expected_at"], r["triggered"]) for r in tx.call("schedule_runs", name="s")) == [
        (t, False), (t + timedelta(milliseconds=1), True)]


def test_a_pending_trigger_met_by_the_regular_run_fires_once_and_is_cleared(tx):
    """A pending trigger that a regular occurrence lands on (e.g. an update moved the run
    there) is cleared with it on the set-based path too: it does not fire again."""
    s = create(tx, every="1 hour")
    t = datetime.fromisoformat(s["next_run_at"])
    tx.execute("UPDATE pyscheduler.schedules SET trigger_at = next_run_at WHERE id = %s", (s["id"],))
    [r] = record(tx, [s["id"]], [t], t)
    assert r["recorded"] and r["next_run_at"] == t + timedelta(hours=1)
    assert row(tx, s["id"])["trigger_at"] is None
    assert tx.call_value("execution_count", name="s") == 1


# ------------------------------------------------------------------ 20: catch-up window


def test_the_catchup_window_is_at_least_a_second(tx):
    for window in ("0", "999 milliseconds"):
        refused(tx, "create_schedule", "PS312", name="s", target="t", every="1 minute", catchup_window=window)
    s = create(tx, catchup_window="1 second")
    refused(tx, "update_schedule", "PS312", name="s", catchup_window="0")
    # an executor that claims the occurrence a few hundred ms late still fires it
    t = datetime.fromisoformat(s["next_run_at"])
    details = tx.execute("SELECT * FROM pyscheduler.fire_details(%s)", ([s["id"]],)).fetchone()
    assert details["catchup_window_ms"] == 1000
    [r] = record(tx, [s["id"]], [t], t + timedelta(milliseconds=400))
    assert r["recorded"] and tx.call_value("execution_count", name="s", outcome="missed") == 0


# ------------------------------------------------------------------ 25: time zones


def test_time_zones_are_exactly_iana_names_in_any_case(tx):
    for tz in ("ABC-3/x", "XYZ+3", "PST", "Mars/Olympus_Mons", "Europe/Berlin ", "posixrules", "", "a" * 10_000_000):
        refused(tx, "create_schedule", "PS303", name="s", target="t", cron="0 12 * * *", tz=tz)
        refused(tx, "next_cron_time", "PS303", expr="0 12 * * *", tz=tz)
    assert create(tx, "u", tz="utc")["tz"] == "UTC"
    b = create(tx, "b", cron="0 12 * * *", tz="europe/berlin", start_at="2031-01-01T00:00:00Z")
    assert b["tz"] == "Europe/Berlin" and b["next_run_at"] == "2031-01-01T11:00:00+00:00"
    assert create(tx, "ny", tz="America/New_York")["tz"] == "America/New_York"
    assert tx.call_value("next_cron_time", expr="0 12 * * *", after="2031-07-01T00:00:00Z", tz="EUROPE/BERLIN") == \
        datetime(2031, 7, 1, 10, tzinfo=UTC)
    refused(tx, "update_schedule", "PS303", name="b", tz="ABC-3/x")


# ------------------------------------------------------------------ 26: cron with white space


def test_cron_with_a_newline_or_control_character_is_refused_and_tabs_separate_fields(tx):
    for expr in ("0 3 1 1\n", "* * * * *\n", "0 3\n* * *", "0 3 * * *\r", "1,,2 * * * *", ",1 * * * *",
                 "0 3 * * \u202eMON", "0 3 * * *" + " " * 2000):
        refused(tx, "next_cron_time", "PS301", expr=expr)
        refused(tx, "create_schedule", "PS301", name="s", target="t", cron=expr)
    after = datetime(2031, 1, 1, tzinfo=UTC)
    assert tx.call_value("next_cron_time", expr="0\t3 * *\t* ", after=after) == datetime(2031, 1, 1, 3, tzinfo=UTC)
    assert create(tx, cron=" 0\t3 * * *\t")["cron"] == "0\t3 * * *"


# ------------------------------------------------------------------ 29: daylight saving, as documented


def walk(db, expr, tz, start, n):
    out, t = [], start
    for _ in range(n):
        t = db.call_value("next_cron_time", expr=expr, after=t, tz=tz)
        out.append(t)
    return out


def test_daylight_saving_in_a_30_minute_zone_follows_the_documented_rule(tx):
    """Australia/Lord_Howe moves its clocks by 30 minutes (2024-10-06 02:00 -> 02:30,
    2024-04-07 02:00 -> 01:30). A wildcard-hour job follows the wall clock: skipped wall
    times do not happen, repeated ones happen twice, so 0 * * * * has a 90-minute gap in
    both directions (only whole-hour shifts keep its elapsed-time rhythm); a fixed-time job
    fires once: at the end of a gap, in the first pass of a repeat."""
    tz = "Australia/Lord_Howe"
    hourly = walk(tx, "0 * * * *", tz, datetime(2024, 10, 5, 13, 0, tzinfo=UTC), 3)
    assert hourly == [datetime(2024, 10, 5, 13, 30, tzinfo=UTC), datetime(2024, 10, 5, 14, 30, tzinfo=UTC),
                      datetime(2024, 10, 5, 16, 0, tzinfo=UTC)]
    back = walk(tx, "0 * * * *", tz, datetime(2024, 4, 6, 13, 30, tzinfo=UTC), 2)
    assert back == [datetime(2024, 4, 6, 14, 0, tzinfo=UTC), datetime(2024, 4, 6, 15, 30, tzinfo=UTC)]
    quarter = walk(tx, "*/15 * * * *", tz, datetime(2024, 10, 5, 14, 0, tzinfo=UTC), 8)
    assert all(b - a == timedelta(minutes=15) for a, b in zip(quarter, quarter[1:]))
    quarter = walk(tx, "*/15 * * * *", tz, datetime(2024, 4, 6, 14, 0, tzinfo=UTC), 8)
    assert all(b - a == timedelta(minutes=15) for a, b in zip(quarter, quarter[1:]))
    zone = ZoneInfo(tz)
    # 02:15 does not exist on 2024-10-06: once, at the first instant after the gap (02:30 +11)
    gap = walk(tx, "15 2 * * *", tz, datetime(2024, 10, 5, 12, 0, tzinfo=UTC), 2)
    assert (gap[0] == datetime(2024, 10, 6, 2, 30, tzinfo=zone).astimezone(UTC)
            == datetime(2024, 10, 5, 15, 30, tzinfo=UTC))
    assert gap[1].astimezone(zone).replace(tzinfo=None) == datetime(2024, 10, 7, 2, 15)
    # 01:45 happens twice on 2024-04-07: once, the first (+11)
    twice = walk(tx, "45 1 * * *", tz, datetime(2024, 4, 6, 12, 0, tzinfo=UTC), 2)
    assert twice[0] == datetime(2024, 4, 6, 14, 45, tzinfo=UTC)
    assert twice[1].astimezone(zone).replace(tzinfo=None) == datetime(2024, 4, 8, 1, 45)
    # unlike cronie, only the hour field makes a job wildcard: * 2 * * * is a fixed-time job,
    # its 02:00-02:29 fire once at 02:30 (which is one of its own minutes too)
    every_minute = walk(tx, "* 2 * * *", tz, datetime(2024, 10, 5, 12, 0, tzinfo=UTC), 3)
    assert every_minute == [datetime(2024, 10, 5, 15, m, tzinfo=UTC) for m in (30, 31, 32)]
    docs = (DOCS / "sql-api.md").read_text()
    assert "as cronie" not in docs and "Lord_Howe" in docs


# ------------------------------------------------------------------ 30: labels and topics


def test_names_topics_and_queues_refuse_what_would_print_as_something_else(tx):
    for name in (" ", "", " padded", "padded\t", "a\u202eb", "a\u200bb", "a\nb", "x" * 201):
        refused(tx, "create_schedule", "PS310", name=name, target="t", every="1 minute")
    for topic in ("..", ".", "a b", "t" * 250, "topic\u200b"):
        refused(tx, "create_schedule", "PS307", name="s", target=topic, every="1 minute")
    for queue in ("", "q\u202e", " q", "q" * 41):
        refused(tx, "create_schedule", "PS307", name="s", target_kind="task", target=queue, every="1 minute")
    for note in ("two\nlines", "a\u202eb", "n" * 1001):
        refused(tx, "create_schedule", "PS312", name="s", target="t", every="1 minute", paused=True, paused_note=note)
    assert tx.call("list_schedules") == []
    assert create(tx, "Zürich-Bericht 06:00", target="a..b")["name"] == "Zürich-Bericht 06:00"
    refused(tx, "pause_schedule", "PS312", name="Zürich-Bericht 06:00", note="\u202e")


# ------------------------------------------------------------------ 19, D: http targets, egress policy


def test_http_targets_are_checked_against_the_egress_policy_at_create_and_update(tx):
    for url in ("http://169.254.169.254/latest/meta-data", "http://127.0.0.1:5432/", "http://localhost:6379/",
                "http://[::1]/", "http://10.0.0.5/hook", "http://user:pass@example.com/", "http://2130706433/",
                "https://bücher.example/", "http://example.com/\u202e", "ftp://example.com/"):
        refused(tx, "create_schedule", "PS307", name="h", target_kind="http", target=url, every="1 minute")
    h = create(tx, "h", target_kind="http", target="https://example.com/hook")
    refused(tx, "update_schedule", "PS307", name="h", target="http://192.168.1.1/")
    k = create(tx, "k")
    refused(tx, "update_schedule", "PS307", name="k", target_kind="http", target="http://127.0.0.1/")
    tx.execute("SELECT pyscheduler.set_http_allow(ARRAY['127.0.0.0/8']::cidr[])")
    assert create(tx, "local", target_kind="http", target="http://127.0.0.1:8080/hook")["target"].startswith("http://127")
    assert h["target"] == "https://example.com/hook" and k["target_kind"] == "kafka"


# ------------------------------------------------------------------ C: ownership, the privilege walk


def test_privilege_walk_a_client_cannot_act_on_or_see_the_details_of_another_roles_schedule(db, conn, login):
    alice, alice_dsn = login("pyscheduler_client")
    bob, bob_dsn = login("pyscheduler_client")
    _, monitor_dsn = login("pyscheduler_monitor")
    _, admin_dsn = login("pyscheduler_admin")
    _, scheduler_dsn = login("pyscheduler_scheduler")
    team, _ = login("pyscheduler_client")  # a group: its members act on what it owns
    carol, carol_dsn = login("pyscheduler_client", team)
    secret = "https://example.com/hook?token=s3cret"
    with Database(alice_dsn, max_size=1) as a, Database(bob_dsn, max_size=1) as b, \
            Database(monitor_dsn, max_size=1) as m, Database(admin_dsn, max_size=1) as adm, \
            Database(scheduler_dsn, max_size=1) as sch, Database(carol_dsn, max_size=1) as c:
        s = a.call_value("create_schedule", name="alices", every="1 hour", target_kind="http", target=secret,
                         payload=Jsonb({"api_key": "k"}), retry_attempts=0)
        assert s["owner"] == alice and s["target"] == secret
        t = datetime.fromisoformat(s["next_run_at"])
        record(conn, [s["id"]], [t], t, ["failed"])
        conn.execute("UPDATE pyscheduler.schedule_executions SET error = 'connect to 10.0.0.7:5432: refused'")
        conn.execute("UPDATE pyscheduler.schedules SET last_error = 'connect to 10.0.0.7:5432: refused'")
        # bob may do nothing to it...
        for function, args in [("update_schedule", {"payload": Jsonb({})}), ("pause_schedule", {}),
                               ("resume_schedule", {}), ("trigger_schedule", {}), ("delete_schedule", {})]:
            with pytest.raises(errors.PermissionDenied) as info:
                b.call(function, name="alices", **args)
            assert info.value.sqlstate == "42501", function
        # ...and sees it without target, payload and errors, as the monitor does
        for reader in (b, m):
            seen = reader.call_value("get_schedule", name="alices")
            assert seen["name"] == "alices" and seen["owner"] == alice and seen["failed_count"] == 1
            assert not {"target", "payload", "last_error"} & set(seen), seen
            [listed] = [r["schedule"] for r in reader.call("list_schedules")]
            assert not {"target", "payload", "last_error"} & set(listed)
            [run] = reader.call("schedule_runs", name="alices")
            assert run["outcome"] == "failed" and run["error"] is None
            [failing] = reader.query("SELECT * FROM pyscheduler.schedules_failing")
            assert failing["name"] == "alices" and failing["last_error"] is None and failing["target"] is None
            assert reader.call_value("execution_count", name="alices", outcome="failed") == 1
        b.call("upcoming_runs", name="alices", n=1)
        listed = subprocess.run([sys.executable, "-m", "pyscheduler", "schedules", "list", "--dsn", bob_dsn],
                                capture_output=True, text=True, timeout=60)
        assert listed.returncode == 0 and "alices" in listed.stdout and "s3cret" not in listed.stdout, listed
        # the owner, a member of a group that owns one, and admin see and act
        assert a.call_value("get_schedule", name="alices")["last_error"].startswith("connect")
        assert a.call("schedule_runs", name="alices")[0]["error"].startswith("connect")
        assert a.query("SELECT * FROM pyscheduler.schedules_failing")[0]["target"] == secret
        assert adm.call_value("get_schedule", name="alices")["payload"] == {"api_key": "k"}
        assert adm.call_value("pause_schedule", name="alices", note="admin")["paused"]
        assert a.call_value("resume_schedule", name="alices")["paused"] is False
        with psycopg.connect(carol_dsn, autocommit=True, row_factory=dict_row) as cc:
            cc.execute(f'SET ROLE "{team}"')  # creates as the group...
            cc.execute("SELECT pyscheduler.create_schedule(name => 'teams', every => '1 hour', target => 't')")
        assert c.call_value("get_schedule", name="teams")["owner"] == team
        assert c.call_value("trigger_schedule", name="teams")["trigger_at"] is not None  # ...and acts as a member
        # the views show a target to its owner, a member of the owning group and admin only
        conn.execute("UPDATE pyscheduler.schedules "
                     "SET consecutive_failures = 1, next_run_at = now() - interval '1 hour'")
        for view, paused in [("schedules_failing", False), ("schedules_due_soon", False), ("schedules_late", False),
                             ("schedules_paused", True)]:
            conn.execute("UPDATE pyscheduler.schedules SET paused = %s", (paused,))
            for reader, sees in [(a, {"alices"}), (c, {"teams"}), (b, set()), (m, set()), (adm, {"alices", "teams"})]:
                rows = reader.query(f"SELECT name, target FROM pyscheduler.{view}")
                assert {r["name"] for r in rows} == {"alices", "teams"}, view
                assert {r["name"] for r in rows if r["target"] is not None} == sees, (view, reader)
        conn.execute("UPDATE pyscheduler.schedules SET paused = false")
        with pytest.raises(errors.PermissionDenied):
            b.call("delete_schedule", name="teams")
        # the scheduler role reads what it needs to fire, whoever owns it
        [d] = sch.call("fire_details", ids=[s["id"]])
        assert d["target"] == secret and d["payload"] == '{"api_key": "k"}'
        assert adm.call_value("delete_schedule", name="alices") is True


def test_schedules_from_before_ownership_belong_to_the_client_role(db, conn, login):
    _, alice_dsn = login("pyscheduler_client")
    s = create(db, "old")
    conn.execute("UPDATE pyscheduler.schedules SET owner = 'pyscheduler_client' WHERE id = %s", (s["id"],))
    with Database(alice_dsn, max_size=1) as a:
        assert a.call_value("pause_schedule", name="old")["paused"]
        assert a.call_value("get_schedule", name="old")["target"] == "topic-a"


def test_operations_doc_lists_every_role():
    """Item 31: docs/operations.md's roles table names every audience's role."""
    text = (DOCS / "operations.md").read_text()
    section = text.split("\n## Roles\n", 1)[1].split("\n## ", 1)[0]
    listed = {cell.strip().strip("`") for line in section.splitlines() if line.startswith("| `")
              for cell in line.split("|")[1:2]}
    assert listed == {f"pyscheduler_{a}" for a in migrate.AUDIENCES}
    assert "three roles" not in text


# ------------------------------------------------------------------ class test: the poison catalogue

NON_UTF8 = object()  # sent as the bytes b'\xff\xfe' decoded by the server as UTF-8
TEN_MB = "x" * 10_000_000
TEXT = ["NaN", "infinity", "-infinity", "0001-01-01", "10000-01-01", "a\x00b", NON_UTF8, TEN_MB, "a\x07b", "a\nb",
        "a\u202eb", "a\u200bb", " ", ""]
HOSTILE = {
    "text": TEXT,
    "timestamptz": ["NaN", "infinity", "-infinity", "0001-01-01T00:00:00Z", "10000-01-01T00:00:00Z",
                    "1969-12-31T23:59:59Z", "2031-01-01\x00", NON_UTF8, TEN_MB, "2031-01-01\u202e"],
    "interval": ["NaN", "infinity", "-infinity", "1 year", "10000 years", "-1 second", "0", "178000000 years",
                 "1 microsecond", "\x00", TEN_MB],
    "bigint": ["NaN", "Infinity", "-1", "0", "9223372036854775807", "-9223372036854775808", TEN_MB],
    "integer": ["NaN", "Infinity", "-1", "2147483647", TEN_MB],
    "jsonb": ['{"a": NaN}', '{"a": Infinity}', '"\\u0000"', '{"s": "\\u202e\\u200b\\n"}', NON_UTF8,
              '{"x": "' + "y" * 10_000_000 + '"}', "[]", "1e400", '{"at": "10000-01-01"}', "null"],
    "boolean": ["NaN", TEN_MB],
}
# every client-writable field: (type, the target kind it is tried with)
FIELDS = {
    "name": "text", "cron": "text", "tz": "text", "every": "interval", "start_at": "timestamptz",
    "end_at": "timestamptz", "max_runs": "bigint", "target_kind": "text", "priority": "bigint", "payload": "jsonb",
    "retry_attempts": "integer", "retry_base": "interval", "retry_jitter": "interval", "critical": "boolean",
    "catchup_window": "interval", "overlap": "text", "paused_note": "text",
    "target:kafka": "text", "target:http": "text", "target:task": "text",
}
BASE = {"every": "1 hour", "target": "topic-a", "retry_attempts": 0}


def hostile_call(conn, function, name, field, value):
    """Call function with every base argument and field = value (cast to its type)."""
    args = dict(BASE) if function == "create_schedule" else {}
    field, _, kind = field.partition(":")
    if kind:
        args["target_kind"] = kind
    if field == "cron":
        args.pop("every", None)
    args.pop(field, None)
    if field == "paused_note":
        args["paused"] = True
    names, params = ["name => %s"], [name]
    for key, v in args.items():
        names.append(f"{key} => %s")
        params.append(v)
    fragment = "convert_from(%s::bytea, 'UTF8')" if value is NON_UTF8 else "%s"
    params.append(b"\xff\xfe" if value is NON_UTF8 else value)
    if field == "name":
        names, params = names[1:], params[1:]
    names.append(f"{field} => ({fragment})::{FIELDS[field if not kind else 'target:' + kind]}")
    return conn.execute(f"SELECT pyscheduler.{function}({', '.join(names)}) AS s", params).fetchone()["s"]


def assert_loadable(conn, schedule_id):
    """What each daemon loads about it, loaded as the daemons load it (binary for fire_details)."""
    with conn.cursor(binary=True) as cur:
        cur.execute("SELECT * FROM pyscheduler.fire_details(%s)", ([schedule_id],))
        cur.fetchall()
    conn.execute("SELECT * FROM pyscheduler.index_entries(%s)", ([schedule_id],)).fetchall()
    conn.execute("SELECT * FROM pyscheduler.index_page(0, 100000)").fetchall()
    name = conn.execute("SELECT name FROM pyscheduler.schedules WHERE id = %s", (schedule_id,)).fetchone()["name"]
    conn.execute("SELECT pyscheduler.get_schedule(%s)", (name,)).fetchone()
    conn.execute("SELECT * FROM pyscheduler.upcoming_runs(name => %s, n => 3)", (name,)).fetchall()


def test_poison_catalogue_every_hostile_value_is_refused_clearly_or_stored_loadable(tx):
    """Every client-writable field of create_schedule and update_schedule gets NaN, +-infinity,
    year 1 and 10000, NUL, non-UTF-8, 10 MB, control and bidi characters: each is refused with
    a data error (class 22/23, 54000, a PS3xx code, or refused by the client library before it
    is sent), never 0A000/XX000/P0001, or stored in a form every daemon loads."""
    neighbour = create(tx, "neighbour", every="1 hour")
    outcomes: dict[str, set] = {}
    for function in ("create_schedule", "update_schedule"):
        for field, type_ in FIELDS.items():
            if function == "update_schedule" and field in ("name", "paused_note"):
                continue  # update cannot rename, pause_schedule sets the note (below)
            for i, value in enumerate(HOSTILE[type_]):
                name = f"p-{field}-{i}"
                if function == "update_schedule":
                    kind = field.partition(":")[2] or "kafka"
                    target = {"kafka": "topic-a", "http": "https://example.com/", "task": "q"}[kind]
                    create(tx, name, every="1 hour", target_kind=kind, target=target, retry_attempts=0)
                try:
                    got = hostile_call(tx, function, name, field, value)
                except psycopg.Error as exc:
                    state = exc.sqlstate
                    label = state or "client"
                    assert state not in ("0A000", "XX000", "P0001"), (function, field, repr(value)[:40], exc)
                    assert (state is None and isinstance(exc, psycopg.DataError)) or \
                        state.startswith(("22", "23", "PS3")) or state == "54000", (function, field, exc)
                else:
                    label = "stored"
                    assert_loadable(tx, got["id"])
                outcomes.setdefault(field, set()).add(label)
                tx.execute("SELECT pyscheduler.delete_schedule(%s)", (name,))
    assert_loadable(tx, neighbour["id"])
    # every field refused something, and the obviously unusable ones with their own code
    for field in ("name", "cron", "tz", "every", "start_at", "end_at", "target:kafka", "target:http", "target:task",
                  "retry_base", "retry_jitter", "catchup_window", "overlap", "paused_note"):
        assert outcomes[field] & {"PS301", "PS303", "PS306", "PS307", "PS309", "PS310", "PS312", "PS314"}, \
            (field, outcomes[field])
    # the note of pause_schedule, too
    for value in HOSTILE["text"]:
        try:
            fragment = "convert_from(%s::bytea, 'UTF8')" if value is NON_UTF8 else "%s"
            tx.execute(f"SELECT pyscheduler.pause_schedule(name => 'neighbour', note => {fragment})",
                         (b"\xff\xfe" if value is NON_UTF8 else value,))
        except psycopg.Error as exc:
            assert exc.sqlstate is None or exc.sqlstate.startswith(("22", "PS3")), exc
    assert_loadable(tx, neighbour["id"])


# ------------------------------------------------------------------ migration 0014 on existing rows


def test_migration_0014_gives_old_schedules_to_the_client_role_and_ends_unloadable_ones(empty_dsn):
    from yoyo import get_backend

    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute("CREATE SCHEMA pyscheduler")
    backend = get_backend(migrate.yoyo_uri(empty_dsn), migration_table=migrate.MIGRATION_TABLE)
    migrations = migrate._migrations()
    before = migrations.filter(lambda m: m.id < "0014")
    backend.apply_migrations_only(backend.to_apply(before))
    backend.connection.close()
    with psycopg.connect(empty_dsn, autocommit=True, row_factory=dict_row) as c:
        c.execute(
            "INSERT INTO pyscheduler.schedules (name, every, tz, start_at, end_at, target_kind, target, priority, "
            "payload, retry_attempts, retry_base, retry_jitter, critical, catchup_window, overlap, paused, "
            "next_run_at, created, updated) VALUES "
            "('fine', '1 hour', 'UTC', NULL, 'infinity', 'kafka', 't', 50, '{}', 0, '0', '0', false, '0', 'allow', "
            " false, '2031-01-01Z', now(), now()), "
            "('far', '3000000 days', 'UTC', NULL, NULL, 'kafka', 't', 50, '{}', 0, '0', '0', false, '1 minute', "
            " 'allow', false, '10183-05-01Z', now(), now()), "
            "('early', '1 hour', 'UTC', '0001-01-01Z', NULL, 'kafka', 't', 50, '{}', 0, '0', '0', false, "
            " '1 minute', 'allow', false, '2031-01-01Z', now(), now())")
    migrate.migrate(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True, row_factory=dict_row) as c:
        rows = {r["name"]: r for r in c.execute(
            "SELECT name, owner, end_at, catchup_window, next_run_at, ended_note FROM pyscheduler.schedules"
        ).fetchall()}
        assert {r["owner"] for r in rows.values()} == {"pyscheduler_client"}
        assert rows["fine"]["end_at"] is None and rows["fine"]["catchup_window"] == timedelta(seconds=1)
        assert rows["fine"]["next_run_at"] == datetime(2031, 1, 1, tzinfo=UTC) and rows["fine"]["ended_note"] is None
        for name in ("far", "early"):
            assert rows[name]["next_run_at"] is None and "migration 0014" in rows[name]["ended_note"]
        # every daemon loads the table now
        c.execute("SELECT * FROM pyscheduler.index_page(0, 1000)").fetchall()
        c.execute("SELECT * FROM pyscheduler.fire_details(ARRAY(SELECT id FROM pyscheduler.schedules))").fetchall()
