"""Periodic task functions (pyscheduler/tasks/periodic.py): ``@app.periodic`` declares a schedule
with a task target whose payload is the task's spec; ``sync_schedules`` (the worker at start,
``pyscheduler tasks sync-schedules``) writes it idempotently and deletes nothing."""

from __future__ import annotations

import json
import textwrap
from datetime import timedelta

import pytest
from click.testing import CliRunner

from pyscheduler.cli import main
from pyscheduler.db import Database
from pyscheduler.errors import InvalidArgument, InvalidSchedule
from pyscheduler.schedules import ScheduleClient
from pyscheduler.tasks import TaskApp


def declare(dsn: str, digest_cron: str = "*/5 * * * *", with_cleanup: bool = True) -> TaskApp:
    """An application as a module declares it (each call: a new process's declarations)."""
    app = TaskApp(dsn)

    @app.periodic(cron=digest_cron, timezone="Europe/Paris", name="digest", args={"kind": "daily"})
    @app.task(queue="digests", name="mail.digest")
    def digest(kind: str, limit: int = 10) -> str:
        return f"{kind} digest of {limit}"

    if with_cleanup:
        @app.periodic(every=timedelta(minutes=10), overlap="skip")
        @app.task(queue="maintenance", name="db.cleanup", priority=5)
        def cleanup() -> None:
            pass

    return app


def test_sync_creates_the_schedules_once_and_a_second_sync_changes_nothing(dsn, db):
    with declare(dsn) as app:
        first = app.sync_schedules()
        assert (first.created, first.updated, first.unchanged, first.removed) == (["digest", "db.cleanup"], [], [], [])
        second = app.sync_schedules()
        assert (second.created, second.updated, second.unchanged, second.removed) == (
            [], [], ["digest", "db.cleanup"], [])
        assert first.changed and not second.changed
    client = ScheduleClient(db)
    digest, cleanup = client.get("digest"), client.get("db.cleanup")
    assert (digest.target_kind, digest.target, digest.cron, digest.tz, digest.payload, digest.priority) == (
        "task", "digests", "*/5 * * * *", "Europe/Paris", {"task": "mail.digest", "args": {"kind": "daily"}}, 50)
    assert (cleanup.target, cleanup.every, cleanup.overlap, cleanup.priority, cleanup.payload) == (
        "maintenance", timedelta(minutes=10), "skip", 5, {"task": "db.cleanup", "args": {}})


def test_a_changed_declaration_is_updated_and_a_removed_one_reported_never_deleted(db, login):
    _, mine = login("pyscheduler_client")  # the application's role
    with declare(mine) as app:
        app.sync_schedules()
    with declare(mine, digest_cron="0 7 * * *", with_cleanup=False) as app:
        report = app.sync_schedules()
        assert (report.created, report.updated, report.unchanged, report.removed) == ([], ["digest"], [],
                                                                                      ["db.cleanup"])
        again = app.sync_schedules()
        assert (again.updated, again.unchanged, again.removed) == ([], ["digest"], ["db.cleanup"])
    client = ScheduleClient(db)
    assert client.get("digest").cron == "0 7 * * *"
    assert client.get("db.cleanup").payload == {"task": "db.cleanup", "args": {}}  # still there
    # schedules that do not submit a task function, or of another role, are not reported
    _, other = login("pyscheduler_client")
    with Database(mine) as db_mine, Database(other) as db_other:
        ScheduleClient(db_mine).create("plain", "q", every=timedelta(hours=1), target_kind="task",
                                       payload={"job": "x"})
        ScheduleClient(db_mine).create("kafka", "topic", every=timedelta(hours=1), payload={"task": "x"})
        ScheduleClient(db_other).create("theirs", "q", every=timedelta(hours=1), target_kind="task",
                                        payload={"task": "x"})
    with declare(mine, with_cleanup=False) as app:
        assert app.sync_schedules().removed == ["db.cleanup"]


def test_a_firing_submits_the_spec_and_the_worker_runs_the_function_with_its_args(dsn, conn):
    with declare(dsn) as app:
        app.sync_schedules()
        # what the schedules' executor does when the schedule is due: fire_task_schedules
        conn.execute("SELECT pyscheduler.trigger_schedule(name => 'digest')")
        s = conn.execute("SELECT pyscheduler.get_schedule(name => 'digest') AS s").fetchone()["s"]
        conn.execute("SELECT * FROM pyscheduler.fire_task_schedules(ids => ARRAY[%s::bigint], "
                     "expected => ARRAY[%s::timestamptz])", (s["id"], s["due_at"]))
        drained = app.drain()
        assert [(d.outcome, d.result) for d in drained] == [("completed", "daily digest of 10")]
        spec = drained[0].ctx.spec
        assert spec["task"] == "mail.digest" and spec["args"] == {"kind": "daily"}
        assert spec["pyscheduler"]["schedule"] == "digest"  # the firing's own key, beside the task's


def declare_billing(dsn: str, max_attempts: int) -> TaskApp:
    app = TaskApp(dsn)

    @app.periodic(every=timedelta(hours=1), name="billing", args={"customer": 42})
    @app.task(queue="billing", name="billing.run", max_attempts=max_attempts,
              concurrency_key=lambda customer: f"customer:{customer}")
    def bill(customer: int) -> None:
        pass

    return app


def fire_now(conn, name: str) -> dict:
    """What the schedules' executor does when the schedule is due (here: triggered now):
    fire_task_schedules; the task it submitted."""
    s = conn.execute("SELECT pyscheduler.trigger_schedule(name => %s) AS s", (name,)).fetchone()["s"]
    [row] = conn.execute("SELECT * FROM pyscheduler.fire_task_schedules(ids => ARRAY[%s::bigint], "
                         "expected => ARRAY[%s::timestamptz])", (s["id"], s["due_at"])).fetchall()
    assert row["recorded"]
    [run] = conn.execute("SELECT * FROM pyscheduler.schedule_runs(name => %s, max_runs => 1)", (name,)).fetchall()
    assert run["outcome"] == "fired", run
    return conn.execute("SELECT pyscheduler.get_task(rn => %s) AS t", (run["task_rn"],)).fetchone()["t"]


def test_a_firing_submits_with_the_functions_max_attempts_and_concurrency_key(dsn, conn):
    """Before issue 29's follow-up, a firing submitted with the queue and priority only."""
    with declare_billing(dsn, max_attempts=2) as app:
        assert app.sync_schedules().created == ["billing"]
        assert ScheduleClient(conn).get("billing").task_options == {"max_attempts": 2,
                                                                    "concurrency_key": "customer:42"}
        task = fire_now(conn, "billing")
        assert (task["max_attempts"], task["concurrency_key"]) == (2, "customer:42")
        assert app.sync_schedules().unchanged == ["billing"]
    with declare_billing(dsn, max_attempts=3) as app:  # a changed option: updated, and the next firing uses it
        report = app.sync_schedules()
        assert (report.updated, report.unchanged) == (["billing"], [])
        task = fire_now(conn, "billing")
        assert (task["max_attempts"], task["concurrency_key"]) == (3, "customer:42")
        assert app.sync_schedules().unchanged == ["billing"]


def test_declarations_are_checked_and_the_schedules_own_checks_name_the_problem(dsn):
    with TaskApp(dsn) as app:
        @app.task(queue="q")
        def job(n: int) -> None:
            pass

        with pytest.raises(InvalidArgument, match="exactly one of cron and every"):
            app.periodic(cron="* * * * *", every=timedelta(minutes=1))(job)
        with pytest.raises(InvalidArgument, match="unexpected keyword argument 'm'"):
            app.periodic(every=timedelta(minutes=1), args={"n": 1, "m": 1})(job)
        with pytest.raises(InvalidArgument, match="@app.periodic goes above @app.task"):
            app.periodic(every=timedelta(minutes=1))(lambda: None)  # type: ignore[arg-type]
        app.periodic(cron="61 * * * *", args={"n": 1})(job)
        with pytest.raises(InvalidSchedule, match="minute"):
            app.sync_schedules()


def test_the_worker_syncs_at_start(dsn, db):
    with declare(dsn) as app:
        running = app.worker(queues=["digests"]).start()
        try:
            running.wait_idle(30)
        finally:
            running.stop()
    assert [s.name for s in ScheduleClient(db).list(target_kind="task")] == ["db.cleanup", "digest"]


def test_the_cli_syncs_an_applications_schedules(dsn, db, tmp_path, monkeypatch):
    module = f"periodic_app_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(f'''
        from datetime import timedelta
        from pyscheduler.tasks import TaskApp

        app = TaskApp({dsn!r})

        @app.periodic(every=timedelta(hours=1))
        @app.task(queue="reports", name="reports.hourly")
        def hourly() -> None:
            pass
        '''))
    monkeypatch.chdir(tmp_path)
    first = CliRunner().invoke(main, ["tasks", "sync-schedules", f"{module}:app"])
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout) == {"created": ["reports.hourly"], "updated": [], "unchanged": [], "removed": []}
    second = CliRunner().invoke(main, ["tasks", "sync-schedules", f"{module}:app"])
    assert json.loads(second.stdout)["unchanged"] == ["reports.hourly"]
    for bad, says in ((f"{module}", "expected MODULE:ATTRIBUTE"), (f"{module}:nope", "cannot load"),
                      ("json:dumps", "not a TaskApp")):
        result = CliRunner().invoke(main, ["tasks", "sync-schedules", bad])
        assert result.exit_code == 2 and says in result.output, result.output
