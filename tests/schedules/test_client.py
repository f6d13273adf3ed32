"""ScheduleClient: every field round-trips, on pyscheduler's pool and on the application's own
connection whatever its session settings; ownership hides details; the schedules CLI (update,
list filters, hints naming CLI commands) goes through it."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import psycopg
import pytest
from click.testing import CliRunner

from pyscheduler.cli import main
from pyscheduler.errors import InvalidArgument, InvalidSchedule, PermissionDenied, ScheduleExists, ScheduleNotFound
from pyscheduler.schedules import UNBOUNDED, AsyncScheduleClient, Schedule, ScheduleClient, ScheduleRun

BERLIN = ZoneInfo("Europe/Berlin")
STYLES = ("postgres", "postgres_verbose", "sql_standard", "iso_8601")

# every field create_schedule takes, set (a cron schedule; `every` is checked by the update below)
FIELDS = dict(target="reports", cron="*/30 9-17 * * MON-FRI", tz="Europe/Berlin", target_kind="task",
              payload={"report": "billing", "n": [1, 2.5, None], "ü": True}, priority=4_294_967_295,
              start_at=datetime(2030, 7, 1, 10, 0, tzinfo=BERLIN),  # summer time, +02:00
              end_at=datetime(2031, 1, 15, 10, 0, tzinfo=BERLIN),  # winter time, +01:00
              max_runs=1000, retry_attempts=2, retry_base=timedelta(milliseconds=250),
              retry_jitter=timedelta(seconds=1, microseconds=500_000), critical=True,
              catchup_window=timedelta(days=2, hours=3), overlap="buffer_one", paused=True,
              paused_note="until the ledger migration")


def odd_connection(dsn: str, style: str) -> psycopg.Connection:
    """The application's connection: DateStyle and IntervalStyle psycopg cannot read as text,
    a daylight-saving TimeZone, tuple rows."""
    return psycopg.connect(dsn, autocommit=True,
                           options=f"-c DateStyle=SQL,DMY -c IntervalStyle={style} -c TimeZone=America/New_York")


def settings_of(conn) -> tuple:
    return conn.execute("SELECT current_setting('DateStyle'), current_setting('IntervalStyle'), "
                        "current_setting('TimeZone'), current_setting('search_path')").fetchone()


def assert_fields(s: Schedule, name: str, **expected) -> None:
    for key, want in expected.items():
        assert getattr(s, key) == want, key
    assert s.name == name
    for at in (s.start_at, s.end_at, s.next_run_at, s.created, s.updated):
        assert at is None or at.tzinfo is timezone.utc


@pytest.mark.parametrize("style", STYLES)
def test_every_field_round_trips_in_any_interval_style(dsn, db, style):
    with odd_connection(dsn, style) as conn:
        before = settings_of(conn)
        client = ScheduleClient(conn)
        created = client.create("billing-report", **FIELDS)
        assert_fields(created, "billing-report", **FIELDS)
        assert client.get("billing-report") == created
        updated = client.update("billing-report", every=timedelta(hours=1, minutes=30, milliseconds=5),
                                retry_base=timedelta(0), catchup_window=timedelta(days=366))
        assert (updated.every, updated.cron, updated.retry_base, updated.catchup_window) == (
            timedelta(hours=1, minutes=30, milliseconds=5), None, timedelta(0), timedelta(days=366))
        assert settings_of(conn) == before  # nothing SET on the application's session
    ours = ScheduleClient(db).get("billing-report")  # the pool: pinned settings, same values
    assert ours == updated
    raw = db.call_value("get_schedule", name="billing-report")
    assert {f.name for f in dataclasses.fields(Schedule)} == set(raw), "Schedule misses or adds a field"


def test_update_removes_bounds_and_changes_only_what_is_given(tx):
    client = ScheduleClient(tx)
    client.create("bounded", "t", every=timedelta(minutes=5), start_at=datetime(2030, 1, 1, tzinfo=timezone.utc),
                  end_at=datetime(2031, 1, 1, tzinfo=timezone.utc), max_runs=3, payload={"a": 1})
    s = client.update("bounded", start_at=UNBOUNDED, end_at=UNBOUNDED, max_runs=UNBOUNDED)
    assert (s.start_at, s.end_at, s.max_runs, s.payload, s.every) == (None, None, None, {"a": 1},
                                                                        timedelta(minutes=5))
    assert s.next_run_at is not None and s.next_run_at < datetime(2030, 1, 1, tzinfo=timezone.utc)
    s = client.update("bounded", cron="0 3 * * *", target_kind="http", target="https://example.com/hook")
    assert (s.cron, s.every, s.target_kind, s.target) == ("0 3 * * *", None, "http", "https://example.com/hook")
    assert client.next("bounded", 2) == [at.astimezone(timezone.utc) for at in client.next("bounded", 2)]
    assert [at.hour for at in client.next("bounded", 2)] == [3, 3]


def test_pause_resume_trigger_delete_list_runs_and_counts(tx):
    client = ScheduleClient(tx)
    client.create("ticks", "ticks", every=timedelta(minutes=1), retry_attempts=0)
    client.create("exports", "exports", target_kind="task", cron="0 2 * * *", payload={"export": "all"})
    assert client.pause("ticks", note="maintenance").paused_note == "maintenance"
    assert [s.name for s in client.list(paused=True)] == ["ticks"]
    assert [s.name for s in client.list(paused=False, target_kind="task")] == ["exports"]
    assert [s.name for s in client.list(name_like="ex%")] == ["exports"]
    assert [s.name for s in client.list(limit=1)] == ["exports"]
    assert client.next("ticks") == []  # paused: nothing upcoming
    resumed = client.resume("ticks")
    assert not resumed.paused and resumed.next_run_at is not None
    # a failed occurrence recorded as the executors do, and a task target fired once
    tx.call("record_executions", ids=[resumed.id], expected=[resumed.due_at], outcomes=["failed"],
            attempts=[3], errors=["HTTP 503"])
    triggered = client.trigger("exports")
    tx.call("fire_task_schedules", ids=[triggered.id], expected=[triggered.due_at])
    [failed] = client.runs("ticks")
    assert failed == ScheduleRun(expected_at=resumed.due_at, outcome="failed", triggered=False, attempts=3,
                                 fired_at=failed.fired_at, lateness=failed.fired_at - resumed.due_at,
                                 missed_count=None, error="HTTP 503", task_rn=None)
    [fired] = client.runs("exports", outcome="fired", since=triggered.due_at - timedelta(seconds=1))
    assert fired.triggered and fired.task_rn is not None
    assert client.runs("exports", outcome="failed") == []
    assert (client.count("ticks", "failed"), client.count("ticks"), client.count("exports", "fired")) == (1, 0, 1)
    assert client.delete("ticks") is True and client.delete("ticks") is False
    with pytest.raises(ScheduleNotFound):
        client.get("ticks")


def test_another_roles_schedule_comes_without_its_details(dsn, login):
    _, owner_dsn = login("pyscheduler_client")
    _, other_dsn = login("pyscheduler_client")
    with psycopg.connect(owner_dsn, autocommit=True) as conn:
        mine = ScheduleClient(conn).create("private", "secret-topic", every=timedelta(hours=1),
                                           payload={"token": "s3cr3t"})
    assert not mine.details_hidden and mine.payload == {"token": "s3cr3t"}
    with psycopg.connect(other_dsn, autocommit=True) as conn:
        client = ScheduleClient(conn)
        theirs = client.get("private")
        assert theirs.details_hidden and (theirs.target, theirs.payload, theirs.last_error) == (None, None, None)
        assert theirs.every == timedelta(hours=1) and theirs.owner == mine.owner
        assert [s.target for s in client.list()] == [None]
        with pytest.raises(PermissionDenied):
            client.pause("private")


def test_a_schedule_created_in_a_rolled_back_transaction_does_not_exist(dsn, db):
    with psycopg.connect(dsn) as conn:
        ScheduleClient(conn).create("tx", "t", every=timedelta(minutes=1))
        assert ScheduleClient(conn).get("tx").name == "tx"
        conn.rollback()
    with pytest.raises(ScheduleNotFound):
        ScheduleClient(db).get("tx")


def test_bad_arguments_are_refused_naming_the_field(tx):
    client = ScheduleClient(tx)
    naive = datetime(2030, 1, 1)
    for call, field in ((lambda: client.create("x", "t", every=timedelta(minutes=1), start_at=naive), "start_at"),
                        (lambda: client.create("x", "t", every=timedelta(minutes=1),
                                               end_at=datetime(9999, 6, 1, tzinfo=timezone.utc)), "end_at"),
                        (lambda: client.create("x", "t", every=60), "every"),  # type: ignore[arg-type]
                        (lambda: client.create("x", "t", every=timedelta(minutes=1), payload={"a": math.nan}),
                         "payload"),
                        (lambda: client.create("x", "t", every=timedelta(minutes=1), retry_attempts=2**40),
                         "retry_attempts"),
                        (lambda: client.create("x\x00", "t", every=timedelta(minutes=1)), "name"),
                        (lambda: client.create("x", "t", every=timedelta(minutes=1), overlap="never"), "overlap"),
                        (lambda: client.update("x", max_runs=0), "max_runs"),
                        (lambda: client.runs("x", outcome="exploded"), "outcome"),
                        (lambda: client.next("x", 0), "n")):
        with pytest.raises(InvalidArgument, match=field):
            call()
    client.create("x", "t", every=timedelta(minutes=1))
    with pytest.raises(ScheduleExists):
        client.create("x", "t", every=timedelta(minutes=1))
    with pytest.raises(InvalidSchedule):  # the SQL function's own check (PS305)
        client.create("fast", "t", every=timedelta(seconds=1))


def test_the_async_client_creates_in_the_applications_transaction(dsn, db):
    async def scenario() -> Schedule:
        async with await psycopg.AsyncConnection.connect(dsn, options="-c IntervalStyle=iso_8601") as aconn:
            client = AsyncScheduleClient(aconn)
            await client.create("a-dropped", "t", every=timedelta(minutes=2))
            await aconn.rollback()
            kept = await client.create("a-kept", "t", every=timedelta(minutes=2), retry_base=timedelta(seconds=1))
            assert await client.get("a-kept") == kept
            assert [s.name for s in await client.list()] == ["a-kept"]
            await aconn.commit()
            return kept

    kept = asyncio.run(scenario())
    assert ScheduleClient(db).get("a-kept") == kept and kept.retry_base == timedelta(seconds=1)
    with pytest.raises(ScheduleNotFound):
        ScheduleClient(db).get("a-dropped")


# ------------------------------------------------------------------ CLI


def run(dsn, *args, code=0):
    result = CliRunner().invoke(main, ["schedules", *args, "--dsn", dsn])
    assert result.exit_code == code, result.output
    return result.output


def test_cli_update_changes_only_the_options_given_and_removes_bounds(dsn, db):
    run(dsn, "create", "nightly", "--cron", "0 3 * * *", "--kafka", "t", "--end", "2031-01-01T00:00:00",
        "--max-runs", "5", "--critical")
    out = run(dsn, "update", "nightly", "--every", "90m", "--no-end", "--no-max-runs", "--not-critical",
              "--payload", '{"a": 1}')
    assert '"every": "90m"' in out and '"cron": null' in out
    s = ScheduleClient(db).get("nightly")
    assert (s.every, s.cron, s.end_at, s.max_runs, s.critical, s.payload, s.target) == (
        timedelta(minutes=90), None, None, None, False, {"a": 1}, "t")
    run(dsn, "update", "nightly", "--task", "q", "--priority", "7", "--start", "2030-01-01T00:00:00+02:00")
    s = ScheduleClient(db).get("nightly")
    assert (s.target_kind, s.target, s.priority, s.start_at) == (
        "task", "q", 7, datetime(2029, 12, 31, 22, tzinfo=timezone.utc))
    assert "nothing to change" in run(dsn, "update", "nightly", code=2)
    assert "at most one target" in run(dsn, "update", "nightly", "--kafka", "a", "--task", "b", code=2)
    assert "not both" in run(dsn, "update", "nightly", "--end", "2031-01-01T00:00:00", "--no-end", code=2)


def test_cli_sets_and_clears_a_task_targets_task_options(dsn, db):
    run(dsn, "create", "billing", "--every", "1h", "--task", "billing", "--task-options",
        '{"max_attempts": 2, "concurrency_key": "customer:42"}')
    assert ScheduleClient(db).get("billing").task_options == {"max_attempts": 2, "concurrency_key": "customer:42"}
    assert "task_options.max_attempts must be an integer" in run(dsn, "update", "billing", "--task-options",
                                                                 '{"max_attempts": 0}', code=2)
    assert "--task-options" in run(dsn, "update", "billing", "--task-options", "{max_attempts: 2}", code=2)
    run(dsn, "update", "billing", "--kafka", "t", "--task-options", "{}")
    assert ScheduleClient(db).get("billing").task_options is None


def test_cli_list_filters_and_runs_filters(dsn, db):
    client = ScheduleClient(db)
    client.create("k-1", "t", every=timedelta(minutes=1), retry_attempts=0, critical=True)
    client.create("k-2", "t", every=timedelta(minutes=1), retry_attempts=0, paused=True)
    client.create("h-1", "https://example.com/x", target_kind="http", every=timedelta(minutes=1), retry_attempts=0)
    names = lambda out: [line.split()[0] for line in out.splitlines() if not line.startswith("(")]  # noqa: E731
    assert names(run(dsn, "list")) == ["h-1", "k-1", "k-2"]
    assert names(run(dsn, "list", "--paused")) == ["k-2"]
    assert names(run(dsn, "list", "--not-paused", "--target-kind", "kafka")) == ["k-1"]
    assert names(run(dsn, "list", "--critical")) == ["k-1"]
    assert names(run(dsn, "list", "--name-like", "k-%")) == ["k-1", "k-2"]
    assert "(the first 2: --limit for more)" in run(dsn, "list", "--limit", "2")
    s = client.get("k-1")
    db.call("record_executions", ids=[s.id], expected=[s.due_at], outcomes=["failed"], attempts=[1],
            errors=["boom"])
    assert "outcome=failed" in run(dsn, "runs", "k-1", "--outcome", "failed")
    assert "outcome=" not in run(dsn, "runs", "k-1", "--outcome", "fired")
    assert "outcome=" not in run(dsn, "runs", "k-1", "--since", "2099-01-01T00:00:00")


def test_cli_hints_name_cli_commands_not_sql_functions(dsn, db):
    result = CliRunner().invoke(main, ["schedules", "get", "nope", "--dsn", dsn])
    assert result.exit_code == 1
    assert "hint: pyscheduler schedules list shows" in result.output and "list_schedules()" not in result.output
    run(dsn, "create", "dup", "--every", "1m", "--kafka", "t")
    out = run(dsn, "create", "dup", "--every", "1m", "--kafka", "t", code=1)
    assert "pyscheduler schedules update NAME" in out and "update_schedule()" not in out
    out = run(dsn, "create", "fast", "--every", "1s", "--kafka", "t", code=2)  # PS305: a bad flag value
    assert "--retry-attempts" in out and "retry_worst_case()" not in out
