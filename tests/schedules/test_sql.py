"""Recurring schedules, SQL API: validation codes, cron against croniter, daylight saving,
executions counted once, catch-up, limits, pause/resume/trigger, overlap policies with real
tasks, the degraded-mode claim under concurrency, retention, resync hand-out, notifications."""

from __future__ import annotations

import re
import threading
import uuid
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import psycopg
import pytest
from croniter import CroniterBadDateError, croniter
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from psycopg.rows import dict_row

from pyscheduler import errors
from pyscheduler.db import Jsonb

UTC = timezone.utc


def create(db, name="s", **kw):
    kw.setdefault("target", "topic-a")
    if "cron" not in kw:
        kw.setdefault("every", "10 seconds")
    return db.call_value("create_schedule", name=name, **kw)


def entry(conn, schedule_id):
    return conn.execute("SELECT * FROM pyscheduler.index_entries(ids => %s)", ([schedule_id],)).fetchone()


def record(conn, schedule_id, expected, now, outcome="fired", attempts=1, token=None, error=None):
    return conn.execute(
        "SELECT * FROM pyscheduler._record_executions(%s, %s, %s, %s, %s, %s, %s)",
        ([schedule_id], [expected], [outcome], [attempts], [error], [token] if token else None, now),
    ).fetchone()


def runs(db, name):
    return db.call("schedule_runs", name=name)


def code(exc_info) -> str:
    return exc_info.value.sqlstate


# ------------------------------------------------------------------ validation


def test_retry_worst_case_is_the_seeds_2900_ms(tx):
    assert tx.call_value("retry_worst_case", attempts=3, base="200 milliseconds",
                         jitter_limit="500 milliseconds") == timedelta(milliseconds=2900)
    assert tx.call_value("retry_worst_case", attempts=0, base="1 second", jitter_limit="1 second") == timedelta(0)
    with pytest.raises(errors.InvalidArgument) as info:
        tx.call_value("retry_worst_case", attempts=-1)
    assert code(info) == "PS309"


BAD = [
    ("PS301", dict(cron="61 * * * *")),
    ("PS301", dict(cron="every day at noon")),
    ("PS301", dict(cron="* * * * * * *")),
    ("PS301", dict(cron="0 0 * FOO *")),
    ("PS301", dict(cron="*/0 * * * *")),
    ("PS302", dict(every="1 minute", cron="* * * * *")),
    ("PS302", dict(every=None)),
    ("PS303", dict(every="1 minute", tz="Mars/Olympus_Mons")),
    ("PS303", dict(every="1 minute", tz="PST")),
    ("PS304", dict(every="1 minute", start_at="2031-01-02T00:00:00Z", end_at="2031-01-01T00:00:00Z")),
    ("PS305", dict(every="2 seconds")),  # default retry policy: worst case 2.9 s
    ("PS305", dict(cron="* * * * * *")),  # every second
    ("PS306", dict(every="0 seconds")),
    ("PS306", dict(every="-5 seconds")),
    ("PS306", dict(every="1 month")),
    ("PS306", dict(every="10.0005 seconds")),
    ("PS307", dict(every="1 minute", target="not a topic!")),
    ("PS307", dict(every="1 minute", target_kind="http", target="ftp://x")),
    ("PS307", dict(every="1 minute", target_kind="task", target="q" * 41)),
    ("PS307", dict(every="1 minute", target_kind="smoke-signal")),
    ("PS308", dict(every="1 minute", payload=Jsonb({"blob": "x" * 70000}))),
    ("PS308", dict(every="1 minute", target_kind="task", target="q", payload=Jsonb([1, 2]))),
    ("PS309", dict(every="1 minute", retry_attempts=31)),
    ("PS309", dict(every="1 minute", retry_base="-1 second")),
    ("PS310", dict(every="1 minute", name="")),
    ("PS310", dict(every="1 minute", name="x" * 201)),
    ("PS312", dict(every="1 minute", max_runs=0)),
    ("PS312", dict(every="1 minute", overlap="sometimes")),
    ("PS312", dict(every="1 minute", catchup_window="-1 second")),
    ("PS313", dict(cron="0 0 30 2 *")),
]


def test_bad_input_gets_its_code_names_the_field_and_breaks_nothing(tx):
    create(tx, name="good", every="1 minute")
    for sqlstate, kw in BAD:  # one database for all cases: each error must leave it intact
        kw = dict(kw)
        name = kw.pop("name", "bad")
        with pytest.raises(errors.InvalidSchedule) as info:
            create(tx, name=name, **kw)
        assert code(info) == sqlstate, kw
        assert not errors.is_retryable(info.value) and errors.rejects_arguments(info.value)
        field = {"PS301": "cron", "PS302": "every", "PS303": "tz", "PS304": "end_at", "PS305": "recurrence",
                 "PS306": "every", "PS307": "target", "PS308": "payload", "PS309": "retry", "PS310": "name",
                 "PS312": next(iter(k for k in kw if k not in ("every", "cron")), ""), "PS313": "cron"}[sqlstate]
        assert field in str(info.value), (sqlstate, str(info.value))
        # nothing half-made, the other schedule untouched
        assert [s["schedule"]["name"] for s in tx.call("list_schedules")] == ["good"]
    assert create(tx, name="good2", every="1 minute")["name"] == "good2"


def test_cron_errors_name_the_field(tx):
    with pytest.raises(errors.InvalidSchedule, match="hour field '25'"):
        create(tx, cron="0 25 * * *")
    with pytest.raises(errors.InvalidSchedule, match="day-of-week field 'funday'"):
        create(tx, cron="0 0 * * funday")


def test_payload_limit_is_a_setting(tx):
    tx.execute("UPDATE pyscheduler.settings SET value = '100' WHERE name = 'schedules_max_payload_bytes'")
    with pytest.raises(errors.InvalidSchedule) as info:
        create(tx, payload=Jsonb({"x": "y" * 100}))
    assert code(info) == "PS308" and "limit of 100 bytes" in str(info.value)
    assert create(tx, payload=Jsonb({"x": 1}))["payload"] == {"x": 1}


def test_unknown_and_duplicate_names(tx):
    create(tx, name="dup")
    with pytest.raises(errors.ScheduleExists) as info:
        create(tx, name="dup")
    assert code(info) == "PS311"
    for function in ("get_schedule", "pause_schedule", "resume_schedule", "trigger_schedule", "schedule_runs",
                     "execution_count", "update_schedule"):
        with pytest.raises(errors.ScheduleNotFound) as info:
            tx.call(function, name="nope")
        assert code(info) == "PS300", function
    assert tx.call_value("delete_schedule", name="nope") is False


# ------------------------------------------------------------------ cron against croniter


def _field(lo: int, hi: int, names: list[str] | None = None):
    value = st.integers(lo, hi)
    named = (st.integers(lo, hi).map(lambda v: names[v - lo]) if names else value.map(str))

    def rng(pair):
        a, b = sorted(pair)
        return f"{a}-{b}" if a < b else str(a)  # croniter reads day-of-week 'a-a' wrongly (1-1 as Sunday)

    part = st.one_of(
        named,
        st.tuples(value, value).map(rng),
        st.integers(1, hi - lo + 1).map(lambda s: f"*/{s}"),
        st.tuples(st.tuples(value, value).map(sorted), st.integers(1, 12)).filter(lambda t: t[0][0] < t[0][1])
        .map(lambda t: f"{t[0][0]}-{t[0][1]}/{t[1]}"),
    )
    return st.one_of(st.just("*"), part, st.lists(part, min_size=2, max_size=3).map(",".join))


MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
CRON = st.tuples(
    st.booleans(), _field(0, 59), _field(0, 59), _field(0, 23), _field(1, 31), _field(1, 12, MONTHS),
    _field(0, 6, DAYS),
).map(lambda f: " ".join((f[1:] if f[0] else f[2:])))
INSTANT = st.datetimes(min_value=datetime(1995, 1, 1), max_value=datetime(2045, 1, 1)).map(
    lambda d: d.replace(tzinfo=UTC))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(expr=CRON, after=INSTANT)
def test_next_cron_time_matches_croniter_in_utc(tx, expr, after):
    six = len(expr.split()) == 6
    dom, dow = expr.split()[-3], expr.split()[-1]
    expanded = croniter(expr, second_at_beginning=six).expanded
    # croniter turns a day list that covers every day (e.g. 'sun,*/1') into '*' and then ANDs the
    # day fields; Vixie cron (and pyscheduler) look at the field's first character only, so such
    # a field still ORs. That corner is pinned in the test below instead.
    # (croniter's expanded fields are minute, hour, day, month, day of week, then the seconds of a
    # six-field expression: the day fields are [2] and [4] either way)
    assume(not any(e == ["*"] and not f.startswith("*") for e, f in ((expanded[2], dom), (expanded[4], dow))))
    oracle = croniter(expr, after, implement_cron_bug=True, second_at_beginning=six)
    try:
        expected = [oracle.get_next(datetime) for _ in range(3)]
    except CroniterBadDateError:  # e.g. the 31st of a month with 30 days: never
        assert tx.execute("SELECT pyscheduler.next_cron_time(expr => %s, after => %s) AS t",
                            (expr, after)).fetchone()["t"] is None
        return
    got, t = [], after
    for _ in range(3):
        t = tx.execute("SELECT pyscheduler.next_cron_time(expr => %s, after => %s) AS t", (expr, t)).fetchone()["t"]
        got.append(t)
    assert got == expected, expr


def test_cron_supports_names_macros_sunday_7_and_the_vixie_day_rule(tx):
    def nxt(expr, after):
        return tx.call_value("next_cron_time", expr=expr, after=after)

    monday = datetime(2024, 1, 1, tzinfo=UTC)  # a Monday
    assert nxt("0 9 * * MON-FRI", datetime(2024, 1, 6, tzinfo=UTC)) == datetime(2024, 1, 8, 9, tzinfo=UTC)
    assert nxt("@weekly", monday) == nxt("0 0 * * 7", monday) == datetime(2024, 1, 7, tzinfo=UTC)
    assert nxt("@hourly", monday) == monday + timedelta(hours=1)
    assert nxt("0 0 13 * FRI", monday) == datetime(2024, 1, 5, tzinfo=UTC)  # either: Friday 5th
    assert nxt("0 0 */10 * MON", monday) == datetime(2024, 3, 11, tzinfo=UTC)  # both: '*' first
    # a day-of-week list covering every day, not written as '*': the day fields still OR
    assert nxt("0 0 1,*/2 * sun,*/1", monday) == monday + timedelta(days=1)
    assert nxt("30 15 10 * * *", monday) == datetime(2024, 1, 1, 10, 15, 30, tzinfo=UTC)
    assert nxt("0 0 29 2 *", datetime(2024, 3, 1, tzinfo=UTC)) == datetime(2028, 2, 29, tzinfo=UTC)
    assert nxt("0 0 30 2 *", monday) is None  # never
    with pytest.raises(errors.InvalidSchedule) as info:
        tx.call_value("next_cron_time", expr="0 0 * * *", tz="Nowhere/City")
    assert code(info) == "PS303"


# ------------------------------------------------------------------ daylight saving


def fire_times(conn, expr, tz, start, n):
    out, t = [], start
    for _ in range(n):
        t = conn.execute("SELECT pyscheduler.next_cron_time(expr => %s, after => %s, tz => %s) AS t",
                         (expr, t, tz)).fetchone()["t"]
        out.append(t)
    return out


@pytest.mark.parametrize("tz,spring,fall", [
    ("Europe/Berlin", datetime(2024, 3, 31), datetime(2024, 10, 27)),
    ("America/New_York", datetime(2024, 3, 10), datetime(2024, 11, 3)),
])
def test_daylight_saving_rules(tx, tz, spring, fall):
    zone = ZoneInfo(tz)
    gap_hour = 2  # both zones skip 02:00-03:00 in spring and repeat an hour in autumn
    repeat_hour = 2 if tz == "Europe/Berlin" else 1

    def local(day, hour, minute=0, fold=0):
        # as UTC: Python never calls an ambiguous wall time equal to an instant in another zone
        return day.replace(hour=hour, minute=minute, tzinfo=zone, fold=fold).astimezone(UTC)

    # spring forward: 02:30 does not exist -> once, at the first instant after the gap
    times = fire_times(tx, f"30 {gap_hour} * * *", tz, local(spring - timedelta(days=1), 0), 3)
    assert times[0] == local(spring - timedelta(days=1), gap_hour, 30)
    assert times[1] == local(spring, 3, 0)  # 03:00 summer time
    assert times[1].astimezone(zone).utcoffset() > times[0].astimezone(zone).utcoffset()
    assert times[2] == local(spring + timedelta(days=1), gap_hour, 30)
    # fall back: the repeated 01:30/02:30 fires once, at the first (summer time)
    times = fire_times(tx, f"30 {repeat_hour} * * *", tz, local(fall - timedelta(days=1), 12), 2)
    assert times[0] == local(fall, repeat_hour, 30, fold=0)
    assert times[1] == local(fall + timedelta(days=1), repeat_hour, 30)
    # wildcard hour: by elapsed time, no gap and no repeat, across both transitions
    for day in (spring, fall):
        times = fire_times(tx, "*/15 * * * *", tz, local(day, 0), 4 * 6)
        assert all(b - a == timedelta(minutes=15) for a, b in zip(times, times[1:])), times
        assert len(set(times)) == len(times)
    hourly = fire_times(tx, "0 * * * *", tz, local(fall, 0), 4)
    assert [b - a for a, b in zip(hourly, hourly[1:])] == [timedelta(hours=1)] * 3


# ------------------------------------------------------------------ model: intervals, upcoming runs


def test_interval_schedules_are_aligned_and_upcoming_runs_show_them(tx):
    s = create(tx, every="1 hour")
    nxt = datetime.fromisoformat(s["next_run_at"])
    assert nxt.minute == nxt.second == nxt.microsecond == 0 and nxt > datetime.now(UTC) - timedelta(seconds=5)
    upcoming = [r["run_at"] for r in tx.call("upcoming_runs", name="s", n=3)]
    assert upcoming == [nxt + timedelta(hours=h) for h in range(3)]
    start = datetime(2031, 5, 5, 10, 7, 3, 250000, tzinfo=UTC)
    s2 = create(tx, name="anchored", every="90 seconds", start_at=start, max_runs=2)
    assert datetime.fromisoformat(s2["next_run_at"]) == start
    assert [r["run_at"] for r in tx.call("upcoming_runs", name="anchored", n=5)] == [
        start, start + timedelta(seconds=90)]
    # an expression can be checked before creating anything
    rows = tx.execute("SELECT run_at FROM pyscheduler._upcoming_runs(NULL, 3, '0 12 * * *', NULL, 'Europe/Berlin', "
                        "NULL, '2031-01-01T00:00:00Z')").fetchall()
    assert [r["run_at"] for r in rows] == [datetime(2031, 1, d, 11, tzinfo=UTC) for d in (1, 2, 3)]
    assert len(tx.call("upcoming_runs", cron="*/5 * * * *", n=4)) == 4


# ------------------------------------------------------------------ executions


def test_an_execution_recorded_twice_counts_once(tx):
    s = create(tx)
    t = datetime.fromisoformat(s["next_run_at"])
    first = record(tx, s["id"], t, t + timedelta(milliseconds=30))
    assert first["recorded"] and first["next_run_at"] == t + timedelta(seconds=10)
    again = record(tx, s["id"], t, t + timedelta(milliseconds=900))
    assert not again["recorded"] and again["next_run_at"] == t + timedelta(seconds=10)
    assert tx.call_value("execution_count", name="s") == 1
    [run] = runs(tx, "s")
    assert (run["outcome"], run["attempts"], run["lateness"]) == ("fired", 1, timedelta(milliseconds=30))


def test_a_batch_mixing_the_set_based_and_the_row_by_row_path_records_each_occurrence_once(tx):
    a, b, c, d = (create(tx, name) for name in "abcd")
    t = {x["id"]: datetime.fromisoformat(x["next_run_at"]) for x in (a, b, c, d)}
    # c's regular occurrence was recorded already (and its schedule not moved on)
    tx.execute("INSERT INTO pyscheduler.schedule_executions (schedule_id, expected_at, outcome, triggered, "
                 "attempts, fired_at) VALUES (%s, %s, 'fired', false, 1, now())", (c["id"], t[c["id"]]))
    now = max(t.values()) + timedelta(milliseconds=20)
    ids = [a["id"], b["id"], b["id"], c["id"], d["id"]]  # b twice in one batch
    expected = [t[a["id"]], t[b["id"]], t[b["id"]], t[c["id"]], t[d["id"]] - timedelta(seconds=10)]  # d: stale
    rows = tx.execute("SELECT * FROM pyscheduler._record_executions(%s, %s, %s, %s, NULL, NULL, %s)",
                        (ids, expected, ["fired", "fired", "fired", "failed", "fired"], [1] * 5, now)).fetchall()
    got = sorted((r["id"], r["expected_at"], r["recorded"], r["next_run_at"]) for r in rows)
    ten = timedelta(seconds=10)
    assert got == sorted([
        (a["id"], t[a["id"]], True, t[a["id"]] + ten),  # the set-based path
        (b["id"], t[b["id"]], True, t[b["id"]] + ten), (b["id"], t[b["id"]], False, t[b["id"]] + ten),
        (c["id"], t[c["id"]], False, t[c["id"]] + ten),  # moved on, counted nothing
        (d["id"], t[d["id"]] - ten, True, t[d["id"]])])  # a stale occurrence: recorded, moves nothing
    assert [tx.call_value("execution_count", name=n) for n in "abcd"] == [1, 1, 0, 1]
    assert tx.call_value("execution_count", name="c", outcome="failed") == 0


def test_critical_due_at_is_the_due_time_of_critical_schedules_only(tx):
    """critical_due_at (what the Postgres-only claim scans) is due_at for a critical schedule and
    NULL for the others, so claim_due_critical's index holds the critical ones only."""
    crit = create(tx, "crit", critical=True)
    plain = create(tx, "plain")
    rows = {r["id"]: r for r in tx.execute(
        "SELECT id, critical_due_at, due_at FROM pyscheduler.schedules WHERE id IN (%s, %s)",
        (crit["id"], plain["id"])).fetchall()}
    assert rows[crit["id"]]["critical_due_at"] == rows[crit["id"]]["due_at"] is not None
    assert rows[plain["id"]]["critical_due_at"] is None and rows[plain["id"]]["due_at"] is not None


def test_delete_schedule_deletes_its_executions(tx):
    s = create(tx)
    t = datetime.fromisoformat(s["next_run_at"])
    record(tx, s["id"], t, t)
    keep = create(tx, "keep")
    record(tx, keep["id"], datetime.fromisoformat(keep["next_run_at"]), t)
    assert tx.call_value("delete_schedule", name="s")
    left = tx.execute("SELECT schedule_id FROM pyscheduler.schedule_executions").fetchall()
    assert left == [{"schedule_id": keep["id"]}]


def test_fire_details_are_in_the_executors_forms(tx):
    s = create(tx, payload=Jsonb({"b": [1, 2], "a": "x"}), retry_base="250 milliseconds", retry_jitter="1 second",
               catchup_window="90 seconds")
    d = tx.execute("SELECT * FROM pyscheduler.fire_details(ids => %s)", ([s["id"], -1],)).fetchall()
    assert d[0]["payload"] == '{"a": "x", "b": [1, 2]}'  # the stored JSON text, not decoded
    assert (d[0]["retry_base_ms"], d[0]["retry_jitter_ms"], d[0]["catchup_window_ms"]) == (250, 1000, 90000)
    assert d[0]["version"] == round(datetime.fromisoformat(s["updated"]).timestamp() * 1000)
    assert d[0]["active"] and not d[1]["active"] and d[1]["name"] is None


def test_the_next_run_is_computed_from_the_expected_time_not_from_now(tx):
    s = create(tx)
    t = datetime.fromisoformat(s["next_run_at"])
    row = record(tx, s["id"], t, t + timedelta(seconds=7))  # late, within the catch-up window
    assert row["next_run_at"] == t + timedelta(seconds=10)


def test_catch_up_after_the_executors_were_down_three_intervals(tx):
    s = create(tx, catchup_window="15 seconds")
    t0 = datetime.fromisoformat(s["next_run_at"])
    record(tx, s["id"], t0, t0)
    # down from t0 to t0 + 45 s: t0+10 and t0+20 are older than the window, t0+30 and t0+40 within
    now = t0 + timedelta(seconds=45)
    details = tx.execute("SELECT * FROM pyscheduler.fire_details(ids => %s)", ([s["id"]],)).fetchone()
    stale = t0 + timedelta(seconds=10)
    assert details["catchup_window_ms"] == 15_000 and stale < now - timedelta(milliseconds=details["catchup_window_ms"])
    row = record(tx, s["id"], stale, now, outcome="missed", attempts=0)
    assert row["next_run_at"] == t0 + timedelta(seconds=30)
    row = record(tx, s["id"], row["next_run_at"], now)  # fired, oldest first
    assert row["next_run_at"] == t0 + timedelta(seconds=40)
    row = record(tx, s["id"], row["next_run_at"], now + timedelta(milliseconds=5))
    assert row["next_run_at"] == t0 + timedelta(seconds=50)
    history = sorted(runs(tx, "s"), key=lambda r: r["expected_at"])
    assert [(r["expected_at"] - t0, r["outcome"], r["missed_count"]) for r in history] == [
        (timedelta(0), "fired", None), (timedelta(seconds=10), "missed", 2),
        (timedelta(seconds=30), "fired", None), (timedelta(seconds=40), "fired", None)]
    sched = tx.call_value("get_schedule", name="s")
    assert (sched["fired_count"], sched["missed_count"]) == (3, 2)


def test_a_stale_occurrence_fired_anyway_and_a_very_long_outage_never_stop_a_schedule(tx):
    s = create(tx, catchup_window="1 minute")
    t0 = datetime.fromisoformat(s["next_run_at"])
    now = t0 + timedelta(days=30)  # 259,200 intervals
    row = record(tx, s["id"], t0, now)
    assert row["recorded"] and now - timedelta(minutes=1) <= row["next_run_at"] <= now
    assert row["next_run_at"] == now - timedelta(minutes=1)  # the oldest occurrence within the window
    [missed] = [r for r in runs(tx, "s") if r["outcome"] == "missed"]
    # t0 + 10 s .. now - 70 s: every occurrence older than the window, in one summary row
    assert (missed["expected_at"], missed["missed_count"]) == (t0 + timedelta(seconds=10), 259_193)
    assert tx.call_value("execution_count", name="s", outcome="missed") == 259_193
    # a cron schedule too
    c = create(tx, name="c", cron="*/10 * * * * *", catchup_window="1 minute")
    t = datetime.fromisoformat(c["next_run_at"])
    row = record(tx, c["id"], t, t + timedelta(days=3))
    assert row["next_run_at"] >= t + timedelta(days=3) - timedelta(minutes=1)


def test_end_at_and_max_runs_end_the_schedule(tx):
    s = create(tx, max_runs=2)
    t = datetime.fromisoformat(s["next_run_at"])
    assert record(tx, s["id"], t, t)["next_run_at"] == t + timedelta(seconds=10)
    assert record(tx, s["id"], t + timedelta(seconds=10), t + timedelta(seconds=10))["next_run_at"] is None
    assert not entry(tx, s["id"])["active"]
    assert tx.call_value("execution_count", name="s", outcome="runs") == 2

    start = (datetime.now(UTC) + timedelta(hours=1)).replace(microsecond=0)
    e = create(tx, name="e", every="10 seconds", start_at=start, end_at=start + timedelta(seconds=15))
    t = datetime.fromisoformat(e["next_run_at"])
    assert t == start
    assert record(tx, e["id"], t, t)["next_run_at"] == t + timedelta(seconds=10)
    assert record(tx, e["id"], t + timedelta(seconds=10), t + timedelta(seconds=10))["next_run_at"] is None
    assert tx.call("upcoming_runs", name="e") == []
    # lifting the limit restarts it
    assert tx.call_value("update_schedule", name="e", end_at="infinity")["next_run_at"] is not None


def test_pause_resume_and_trigger(tx):
    s = create(tx, every="1 hour")
    regular = datetime.fromisoformat(s["next_run_at"])
    paused = tx.call_value("pause_schedule", name="s", note="maintenance")
    assert paused["paused"] and paused["paused_note"] == "maintenance" and paused["due_at"] is None
    assert not entry(tx, s["id"])["active"]
    assert [r["name"] for r in tx.query("SELECT * FROM pyscheduler.schedules_paused")] == ["s"]
    # a trigger fires even while paused, out of band, without moving the regular run
    trig = tx.call_value("trigger_schedule", name="s")
    due = datetime.fromisoformat(trig["due_at"])
    assert entry(tx, s["id"])["active"] and due == datetime.fromisoformat(trig["trigger_at"])
    row = record(tx, s["id"], due, due + timedelta(milliseconds=3))
    assert row["recorded"] and row["next_run_at"] is None  # paused again: nothing due
    [run] = runs(tx, "s")
    assert run["triggered"] and run["outcome"] == "fired"
    resumed = tx.call_value("resume_schedule", name="s")
    assert not resumed["paused"] and datetime.fromisoformat(resumed["next_run_at"]) == regular
    assert tx.call_value("execution_count", name="s") == 1
    assert tx.call_value("execution_count", name="s", outcome="runs") == 0  # triggers do not count


def test_resume_skips_the_occurrences_of_the_pause(tx):
    create(tx)
    tx.call("pause_schedule", name="s")
    later = datetime.now(UTC) + timedelta(hours=2)
    resumed = tx.execute("SELECT pyscheduler._resume_schedule('s', %s) AS s", (later,)).fetchone()["s"]
    assert datetime.fromisoformat(resumed["next_run_at"]) >= later
    assert tx.call_value("execution_count", name="s", outcome="missed") == 0


def test_a_stale_record_moves_nothing_and_returns_the_current_due_time(tx):
    s = create(tx)
    t = datetime.fromisoformat(s["next_run_at"])
    tx.call("update_schedule", name="s", every="20 seconds")
    current = datetime.fromisoformat(tx.call_value("get_schedule", name="s")["next_run_at"])
    row = record(tx, s["id"], t - timedelta(seconds=100), t)
    assert row["recorded"] and row["next_run_at"] == current


def test_failures_show_in_the_failing_view_and_record_rejects_bad_outcomes(tx):
    s = create(tx)
    t = datetime.fromisoformat(s["next_run_at"])
    record(tx, s["id"], t, t, outcome="failed", attempts=4, error="HTTP 503")
    [row] = tx.query("SELECT * FROM pyscheduler.schedules_failing")
    assert (row["name"], row["consecutive_failures"], row["last_error"]) == ("s", 1, "HTTP 503")
    with pytest.raises(psycopg.Error) as info:
        record(tx, s["id"], t + timedelta(seconds=10), t, outcome="exploded")
    assert info.value.sqlstate == "PS312"
    with pytest.raises(errors.InvalidSchedule):
        tx.call("record_executions", ids=[s["id"], s["id"]], expected=[t], outcomes=["fired"], attempts=[1])
    assert len(runs(tx, "s")) == 1


def test_purge_deletes_old_executions_in_batches_and_keeps_the_counts(tx):
    s = create(tx)
    t = datetime.fromisoformat(s["next_run_at"])
    for i in range(5):
        record(tx, s["id"], t + timedelta(seconds=10 * i), t + timedelta(seconds=10 * i))
    later = t + timedelta(days=31)
    purged = [tx.execute("SELECT pyscheduler._purge_executions(2, %s) AS n", (later,)).fetchone()["n"]
              for _ in range(4)]
    assert purged == [2, 2, 1, 0]
    assert runs(tx, "s") == [] and tx.call_value("execution_count", name="s") == 5
    assert tx.call_value("purge_executions") == 0  # recent ones stay


# ------------------------------------------------------------------ task targets


def task_schedule(db, overlap):
    return create(db, name=f"t-{overlap}", target_kind="task", target=f"q-{overlap}", overlap=overlap,
                  payload=Jsonb({"report": "daily"}), priority=7)


def fire_task(conn, s, now_offset=0.0):
    e = entry(conn, s["id"])
    t = e["next_run_at"]
    row = conn.execute("SELECT * FROM pyscheduler._fire_task_schedules(%s, %s, NULL, %s)",
                       ([s["id"]], [t], t + timedelta(seconds=now_offset))).fetchone()
    return t, row


def last_outcome(db, name):
    return runs(db, name)[0]["outcome"]


def finish_one(db, queue):
    task = db.call_value("lease_task", queue=queue, worker="worker-1")
    db.call("complete_task", rn=task["rn"], token=task["token"])
    return task


@pytest.mark.parametrize("overlap,outcomes", [
    ("allow", ["fired", "fired", "fired", "fired"]),
    ("skip", ["fired", "skipped_overlap", "skipped_overlap", "fired"]),
    ("buffer_one", ["fired", "fired", "skipped_overlap", "fired"]),
])
def test_overlap_policies_with_real_tasks(tx, overlap, outcomes):
    s = task_schedule(tx, overlap)
    got = []
    for i in range(3):
        fire_task(tx, s)
        got.append(last_outcome(tx, s["name"]))
        if i == 0:  # the first task is running (leased, not finished)
            task = tx.call_value("lease_task", queue=f"q-{overlap}", worker="worker-1")
            assert task["spec"]["report"] == "daily" and task["priority"] == 7
            key = task["spec"]["pyscheduler"]["idempotency_key"]
            assert key.startswith(f"{s['id']}:")
    tx.call("complete_task", rn=task["rn"], token=task["token"])
    leased = []
    while (t := tx.call_value("lease_task", queue=f"q-{overlap}", worker="worker-2")) is not None:
        leased.append(t)  # the other tasks are taken by a worker and left running...
    for t in leased:
        tx.call("complete_task", rn=t["rn"], token=t["token"])  # ...and finished
    fire_task(tx, s)
    got.append(last_outcome(tx, s["name"]))
    assert got == outcomes
    tasks = tx.call("list_tasks", queue=f"q-{overlap}")
    assert len(tasks) == outcomes.count("fired")
    sched = tx.call_value("get_schedule", name=s["name"])
    assert sched["skipped_count"] == outcomes.count("skipped_overlap")


@pytest.mark.parametrize("kind, options, says", [
    ("kafka", {"max_attempts": 2}, "task_options (max_attempts) are for a task target, not kafka"),
    ("http", {"concurrency_key": "k"}, "task_options (concurrency_key) are for a task target, not http"),
    ("task", {"max_attempts": 2, "unique_key": "k"}, "task_options.unique_key is not a task option"),
    ("task", {"max_attempts": "2"}, "task_options.max_attempts must be an integer in 1..1000"),
    ("task", {"max_attempts": 1.5}, "task_options.max_attempts must be an integer in 1..1000"),
    ("task", {"max_attempts": 0}, "task_options.max_attempts must be an integer in 1..1000"),
    ("task", {"max_attempts": 1001}, "task_options.max_attempts must be an integer in 1..1000"),
    ("task", {"concurrency_key": 42}, "task_options.concurrency_key must be a JSON string"),
    ("task", {"concurrency_key": "a\u202eb"}, "task_options.concurrency_key must not contain"),
    ("task", {"concurrency_key": "x" * 201}, "task_options.concurrency_key must be at most 200 bytes"),
    ("task", [], "task_options must be a JSON object"),
])
def test_task_options_are_refused_with_ps312_naming_the_key(tx, kind, options, says):
    target = {"kafka": "topic-a", "http": "https://example.com/hook", "task": "q"}[kind]
    with pytest.raises(errors.InvalidSchedule, match=re.escape(says)) as info:
        create(tx, name="opts", target_kind=kind, target=target, task_options=Jsonb(options))
    assert code(info) == "PS312"
    s = create(tx, name="opts", target_kind="task", target="q")
    with pytest.raises(errors.InvalidSchedule, match=re.escape(says)) as info:
        tx.call_value("update_schedule", name="opts", target_kind=kind, target=target, task_options=Jsonb(options))
    assert code(info) == "PS312"
    assert tx.call_value("get_schedule", name="opts") == s  # unchanged


def submitted(db, name):
    """The tasks the schedule's firings submitted, the latest first."""
    return [db.call_value("get_task", rn=r["task_rn"]) for r in runs(db, name)]


def test_task_options_are_stored_updated_cleared_and_a_firing_submits_with_them(tx):
    s = create(tx, name="t-opts", target_kind="task", target="q-opts",
               task_options=Jsonb({"max_attempts": 2.0, "concurrency_key": "customer:42", "unused": None}))
    assert s["task_options"] == {"max_attempts": 2, "concurrency_key": "customer:42"}  # as stored
    fire_task(tx, s)
    [task] = submitted(tx, "t-opts")
    assert (task["max_attempts"], task["concurrency_key"]) == (2, "customer:42")
    # NULL: unchanged; a new object replaces them; '{}' clears them (and lets the kind change)
    assert tx.call_value("update_schedule", name="t-opts", priority=3)["task_options"] == s["task_options"]
    s = tx.call_value("update_schedule", name="t-opts", task_options=Jsonb({"max_attempts": 5}))
    assert s["task_options"] == {"max_attempts": 5}
    fire_task(tx, s)
    assert [(t["max_attempts"], t["concurrency_key"]) for t in submitted(tx, "t-opts")] == [(5, None),
                                                                                           (2, "customer:42")]
    with pytest.raises(errors.InvalidSchedule, match="are for a task target, not kafka"):
        tx.call_value("update_schedule", name="t-opts", target_kind="kafka", target="topic-a")
    s = tx.call_value("update_schedule", name="t-opts", target_kind="kafka", target="topic-a", task_options=Jsonb({}))
    assert s["task_options"] is None and s["target_kind"] == "kafka"


def test_firing_a_task_occurrence_twice_submits_once(tx):
    s = task_schedule(tx, "allow")
    t, row = fire_task(tx, s)
    assert row["recorded"]
    again = tx.execute("SELECT * FROM pyscheduler._fire_task_schedules(%s, %s, NULL, %s)",
                         ([s["id"]], [t], t)).fetchone()
    assert not again["recorded"]
    assert len(tx.call("list_tasks", queue="q-allow")) == 1
    [run] = runs(tx, s["name"])
    assert run["task_rn"] is not None
    # not a task target: answered alone (nothing submitted, its due time back), not an error
    k = create(tx, name="kafka-one")
    [row] = tx.call("fire_task_schedules", ids=[k["id"]], expected=[k["next_run_at"]])
    assert not row["recorded"] and row["next_run_at"] == datetime.fromisoformat(k["next_run_at"])
    assert len(tx.call("list_tasks", queue="q-allow")) == 1


# ------------------------------------------------------------------ degraded mode: the claim


def make_critical(conn, n):
    """n critical schedules and one other, all first due at the same instant (returned)."""
    start = conn.execute("SELECT date_trunc('second', now()) + interval '1 hour' AS t").fetchone()["t"]
    conn.execute(
        "SELECT pyscheduler.create_schedule(name => 'c' || i, target => 't', every => '10 seconds', "
        "start_at => %s, critical => true) FROM generate_series(1, %s) i", (start, n))
    conn.execute("SELECT pyscheduler.create_schedule(name => 'not-critical', target => 't', every => '10 seconds', "
                 "start_at => %s)", (start,))
    return start


def test_claim_due_critical_two_sessions_never_get_the_same_schedule(dsn, conn):
    now = make_critical(conn, 50) + timedelta(milliseconds=1)
    claim = "SELECT * FROM pyscheduler._claim_due_critical(%s, '30 seconds', %s)"
    with psycopg.connect(dsn, row_factory=dict_row) as a, psycopg.connect(dsn, row_factory=dict_row) as b:
        got_a = a.execute(claim, (30, now)).fetchall()  # a's transaction stays open: rows locked
        got_b = b.execute(claim, (30, now)).fetchall()  # SKIP LOCKED: the others
        assert len(got_a) == 30 and len(got_b) == 20
        assert not {r["id"] for r in got_a} & {r["id"] for r in got_b}
        a.commit()
        b.commit()
    # claimed for 30 s: nobody else gets them meanwhile; the non-critical one never
    assert conn.execute(claim, (100, now)).fetchall() == []
    again = conn.execute(claim, (100, now + timedelta(seconds=31))).fetchall()
    assert len(again) == 50  # claims not recorded in time are taken again


def test_claim_then_record_with_the_token_and_a_stale_token_is_refused(tx):
    now = make_critical(tx, 1) + timedelta(milliseconds=1)
    [c] = tx.execute("SELECT * FROM pyscheduler._claim_due_critical(10, '30 seconds', %s)", (now,)).fetchall()
    stale = record(tx, c["id"], c["expected_at"], now, token=uuid.uuid4())
    assert not stale["recorded"] and stale["next_run_at"] == c["expected_at"]
    ok = record(tx, c["id"], c["expected_at"], now, token=c["claim_token"])
    assert ok["recorded"] and ok["next_run_at"] == c["expected_at"] + timedelta(seconds=10)
    row = tx.execute("SELECT claim_token FROM pyscheduler.schedules WHERE id = %s", (c["id"],)).fetchone()
    assert row["claim_token"] is None


def test_concurrent_executors_fire_each_occurrence_once(dsn, conn):
    now = make_critical(conn, 200) + timedelta(milliseconds=1)
    fired: list[tuple] = []
    lock = threading.Lock()

    def executor():
        with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as c:
            while True:
                batch = c.execute("SELECT * FROM pyscheduler._claim_due_critical(17, '30 seconds', %s)",
                                  (now,)).fetchall()
                if not batch:
                    return
                with lock:
                    fired.extend((r["id"], r["expected_at"]) for r in batch)
                c.execute("SELECT * FROM pyscheduler._record_executions(%s, %s, %s, %s, NULL, %s, %s)",
                          ([r["id"] for r in batch], [r["expected_at"] for r in batch], ["fired"] * len(batch),
                           [1] * len(batch), [r["claim_token"] for r in batch], now))

    threads = [threading.Thread(target=executor) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(fired) == len(set(fired)) == 200
    total = conn.execute("SELECT sum(fired_count) AS n FROM pyscheduler.schedules WHERE critical").fetchone()["n"]
    assert total == 200


# ------------------------------------------------------------------ index, resync, notifications


def test_resync_hands_out_every_active_schedule_once_critical_first(tx):
    tx.execute("SELECT pyscheduler.create_schedule(name => 'n' || i, target => 't', every => '1 minute', "
                 "critical => i % 3 = 0) FROM generate_series(1, 25) i")
    tx.call("pause_schedule", name="n1")
    taken = []
    for owner in ("a", "b", "a", "b", "a", "b", "a"):
        taken.append(tx.call("resync_take", sync_id="sync-1", owner=owner, max_schedules=4))
    ids = [r["id"] for batch in taken for r in batch]
    assert len(ids) == len(set(ids)) == 24
    flags = [r["critical"] for batch in taken for r in batch]
    assert flags == sorted(flags, reverse=True)  # critical first
    # a taker acknowledges its batch by calling again (after writing it): b's last is still out
    assert tx.call_one("resync_progress", sync_id="sync-1") == {"done": 20, "total": 24, "complete": False}
    assert tx.call("resync_take", sync_id="sync-1", owner="b") == []
    assert tx.call_one("resync_progress", sync_id="sync-1") == {"done": 24, "total": 24, "complete": True}
    assert tx.call("resync_take", sync_id="sync-1", owner="c") == []
    second = []  # a new sync id starts over; callers loop until a call returns nothing
    while batch := tx.call("resync_take", sync_id="sync-2", owner="c", max_schedules=100):
        second += batch
    assert sorted(r["id"] for r in second) == sorted(ids)
    page = tx.call("index_page", after=0, max_schedules=10)
    assert [r["id"] for r in page] == sorted(r["id"] for r in page) and len(page) == 10


def test_every_change_is_notified(dsn, db):
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pyscheduler_schedules")
        s = create(db)
        db.call("update_schedule", name="s", payload=Jsonb({"v": 2}))
        db.call("pause_schedule", name="s")
        db.call("resume_schedule", name="s")
        db.call("trigger_schedule", name="s")
        db.call("delete_schedule", name="s")
        got = []
        for note in listener.notifies(timeout=10, stop_after=6):
            got.append(note.payload)
        assert got == [str(s["id"])] * 6


def test_the_bench_clones_every_insertable_column_of_a_schedule(tx):
    """pyscheduler bench schedules clones its schedules from the first one with
    sqlapi.CLONE_SCHEDULES: a column added to the table is in its list, or the clones would
    differ from the schedule they copy."""
    from pyscheduler.bench.sqlapi import CLONED_COLUMNS

    columns = [r["column_name"] for r in tx.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = 'pyscheduler' "
        "AND table_name = 'schedules' AND is_generated = 'NEVER' AND identity_generation IS NULL "
        "AND column_name <> 'name' ORDER BY ordinal_position").fetchall()]
    assert sorted(columns) == sorted(CLONED_COLUMNS)


@pytest.mark.parametrize("flag, beyond", [("--shards", lambda sql: sql.MAX_SHARDS + 1),
                                          ("--lease", lambda sql: sql.MAX_RESYNC_LEASE_S + 0.001),
                                          ("--lease", lambda sql: sql.MIN_RESYNC_LEASE_S - 0.0001)])
def test_the_cli_refuses_one_step_beyond_the_limits_before_the_round_trip(flag, beyond):
    """The schedules CLI checks sqlapi's limits itself (a usage error, no database asked)."""
    from click.testing import CliRunner

    from pyscheduler.cli import main
    from pyscheduler.schedules import sqlapi as sql

    result = CliRunner().invoke(main, ["schedules", "resync", flag, str(beyond(sql)), "--redis-url",
                                       "redis://127.0.0.1:1/0", "--dsn", "host=127.0.0.1 port=1"])
    assert result.exit_code == 2 and f"Invalid value for '{flag}'" in result.output, result.output


def test_sql_refuses_one_step_beyond_each_limit_python_checks(tx):
    """sqlapi's limits block holds the bounds Python checks before the round trip; at each one
    SQL accepts the bound and refuses one step beyond it with PS312 when Python's check is
    bypassed, so the two cannot drift."""
    from pyscheduler.schedules import sqlapi as sql

    us = timedelta(microseconds=1)
    assert tx.call(sql.CLAIM_DUE_CRITICAL_SHARDS, shards=[0], shard_count=sql.MAX_SHARDS) == []
    lease_min, lease_max = timedelta(seconds=sql.MIN_RESYNC_LEASE_S), timedelta(seconds=sql.MAX_RESYNC_LEASE_S)
    tx.call(sql.RESYNC_TAKE, sync_id="limits", owner="at-min", lease=lease_min)
    tx.call(sql.RESYNC_TAKE, sync_id="limits", owner="at-max", lease=lease_max)
    for fn, args in ((sql.CLAIM_DUE_CRITICAL_SHARDS, dict(shards=[0], shard_count=sql.MAX_SHARDS + 1)),
                     (sql.RESYNC_TAKE, dict(sync_id="limits", owner="below", lease=lease_min - us)),
                     (sql.RESYNC_TAKE, dict(sync_id="limits", owner="above", lease=lease_max + us))):
        with pytest.raises(errors.InvalidSchedule) as info:
            tx.call(fn, **args)
        assert code(info) == "PS312", (fn, args)
