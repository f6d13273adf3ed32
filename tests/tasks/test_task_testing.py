"""Testing task functions: ``app.testing("inline")`` runs submits at once without a database,
``app.drain()`` works the ready tasks in the caller's thread on the real one, and the pytest
plugin ``pyscheduler.testing`` gives an application's tests a fresh migrated database."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from datetime import timedelta

import pytest

from pyscheduler.errors import InvalidArgument
from pyscheduler.tasks import Abort, Retry, Snooze, TaskApp, TaskClient, current_context

NOWHERE = "postgresql://nobody@nowhere.invalid:1/none?connect_timeout=1"


def test_inline_mode_runs_the_function_at_submit_without_a_database():
    app = TaskApp(NOWHERE)
    calls = []

    @app.task(queue="mail")
    def send_email(to: str, tags: tuple = ()) -> dict:
        calls.append((to, tags, current_context().queue))
        return {"sent": to}

    @app.task(queue="mail")
    def broken(to: str) -> None:
        raise ConnectionError("SMTP down")

    @app.task(queue="mail")
    def not_json() -> object:
        return object()

    @app.task(queue="mail")
    def durable(n: int) -> int:  # no lease inline: steps just run, with or without the app's connection
        return current_context().step("a", lambda: n + 1) + current_context().step("b", lambda: n, conn=object())

    @app.task(queue="mail")
    async def later(n: int) -> int:
        return n + current_context().attempt

    with app.testing("inline"):
        handle = send_email.submit(to="a@example.com", tags=("x", "y"))
        assert (handle.status, handle.result(), handle.wait().output) == ("completed", {"sent": "a@example.com"},
                                                                           {"sent": "a@example.com"})
        assert [h.result() for h in send_email.submit_many([{"to": "b"}, {"to": "c"}])] == [{"sent": "b"},
                                                                                        {"sent": "c"}]
        assert later.options(run_at=timedelta(hours=1)).submit(n=1).result() == 2  # options ignored: runs now
        assert durable.submit(n=1).result() == 3
        with pytest.raises(ConnectionError, match="SMTP down"):
            broken.submit(to="a")
        with pytest.raises(InvalidArgument, match="missing a required argument: 'to'"):
            send_email.submit()
        with pytest.raises(InvalidArgument, match="the result is a object, which is not JSON"):
            not_json.submit()
    # the arguments came through JSON, as a worker gets them: the tuple is a list
    assert calls == [("a@example.com", ["x", "y"], "mail"), ("b", (), "mail"), ("c", (), "mail")]
    assert not app.inline
    with pytest.raises(InvalidArgument, match="testing mode must be 'inline'"):
        with app.testing("manual"):  # type: ignore[arg-type]
            pass


def test_drain_works_every_ready_task_in_the_callers_thread_and_returns_their_outcomes(dsn, conn):
    import threading

    with TaskApp(dsn) as app:
        threads = set()

        @app.task(queue="orders")
        def place(order: int) -> int:
            threads.add(threading.current_thread())
            if order == 2:
                raise Abort("out_of_stock", "no more", {"order": order})
            if order == 3:
                raise Retry(timedelta(hours=1), "payment provider busy")
            if order == 4:
                raise Snooze(timedelta(hours=1))
            if order == 5:
                raise ValueError("bad order")
            invoice.submit(order=order)  # a task that submits a task: drained in the same call
            return order * 10

        @app.task(queue="invoices")
        async def invoice(order: int) -> str:
            return f"invoice {order}"

        handles = place.submit_many([{"order": i} for i in range(1, 6)])
        drained = app.drain()
        assert [(d.ctx.spec["task"].rsplit(".", 1)[1], d.outcome, d.result) for d in drained] == [
            ("place", "completed", 10), ("place", "aborted", None), ("place", "failed", None),
            ("place", "snoozed", None), ("place", "failed", None), ("invoice", "completed", "invoice 1")]
        assert [type(d.error).__name__ for d in drained] == ["NoneType", "Abort", "Retry", "Snooze", "ValueError",
                                                             "NoneType"]
        assert threads == {threading.current_thread()}
        client = TaskClient(app.db)
        assert [client.get(h.rn).status for h in handles] == ["completed", "aborted", "scheduled", "scheduled",
                                                              "scheduled"]
        assert handles[0].result(timeout=5) == 10
        assert app.drain() == []  # nothing ready: the failed ones wait for their retry


def test_drain_takes_at_most_max_tasks_of_the_queue_asked_for(dsn, conn):
    with TaskApp(dsn) as app:
        @app.task(queue="a")
        def one(i: int) -> int:
            return i

        @app.task(queue="b")
        def two(i: int) -> int:
            return -i

        one.submit_many([{"i": i} for i in range(3)])
        two.submit(i=1)
        assert [d.result for d in app.drain(queue="a", max_tasks=2)] == [0, 1]
        assert [d.result for d in app.drain(max_tasks=5)] == [2, -1]


PLUGGED = '''
import psycopg
from pyscheduler.tasks import TaskApp

def test_a_fresh_database(pyscheduler_dsn):
    with TaskApp(pyscheduler_dsn) as app:
        @app.task(queue="q")
        def double(n: int) -> int:
            return 2 * n

        handle = double.submit(n=21)
        assert [d.result for d in app.drain()] == [42]
        assert handle.result(timeout=5) == 42

def test_another_fresh_database(pyscheduler_dsn):
    with psycopg.connect(pyscheduler_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM pyscheduler.tasks").fetchone()[0] == 0
'''


@pytest.mark.parametrize("server", ["configured", "embedded"])
def test_the_pytest_plugin_gives_each_test_a_fresh_migrated_database(tmp_path, request, server):
    (tmp_path / "test_app.py").write_text(textwrap.dedent(PLUGGED))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    if server == "configured":
        env["PYSCHEDULER_TEST_DSN"] = request.getfixturevalue("pg").base_dsn  # the suite's server
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "pyscheduler.testing", "-p", "no:cacheprovider",
                             "-q", "test_app.py"], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout
