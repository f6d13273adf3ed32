"""Task functions (pyscheduler/tasks/app.py, functions.py): ``@app.task`` declares, ``submit``
checks the arguments against the signature and writes ``{"task": name, "args": {...}}``, and a
worker of the app runs the function the spec names, sync or async, whoever submitted it."""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from pyscheduler.db import Database
from pyscheduler.errors import InvalidArgument
from pyscheduler.tasks import Abort, TaskApp, TaskClient, TaskFailed, Worker, Workflow, current_context
from pyscheduler.tasks.aio import AsyncWorker


@pytest.fixture
def fast_backoff(conn):
    """A failed attempt is retried within about 100 ms (not 1-3 s)."""
    conn.execute("UPDATE pyscheduler.settings SET value = '20 milliseconds' WHERE name = 'task_backoff_base'")
    conn.execute("UPDATE pyscheduler.settings SET value = '100 milliseconds' WHERE name = 'task_backoff_cap'")


def tasks_of(conn, queue: str) -> list[dict]:
    return [r["task"] for r in conn.execute("SELECT task FROM pyscheduler.list_tasks(queue => %s)", (queue,))]


def test_one_queue_serves_many_task_names_and_the_spec_has_the_documented_shape(dsn, conn):
    with TaskApp(dsn) as app:
        @app.task(queue="mail")
        def send_email(to: str, template: str = "welcome") -> dict:
            return {"sent": to, "template": template}

        @app.task(queue="mail", name="mail.bounce")
        def bounce(address: str) -> str:
            return f"bounced {address}"

        sent = send_email.submit(to="a@example.com")
        bounced = bounce.submit("b@example.com")  # positional arguments are stored by name
        assert sent.spec == {"task": f"{__name__}.test_one_queue_serves_many_task_names_and_the_spec_has_the_"
                                     f"documented_shape.<locals>.send_email", "args": {"to": "a@example.com"}}
        assert bounced.spec == {"task": "mail.bounce", "args": {"address": "b@example.com"}}
        assert (sent.queue, sent.priority, sent.status) == ("mail", 50, "ready")
        assert send_email("c@x", template="t") == {"sent": "c@x", "template": "t"}  # still a plain function
        running = app.worker(queues=["mail"], capacity=2).start()
        try:
            assert sent.result(timeout=30) == {"sent": "a@example.com", "template": "welcome"}
            assert bounced.result(timeout=30) == "bounced b@example.com"
        finally:
            running.stop()
        assert [type(w) for w in running.app_worker.workers] == [Worker]


def deep(levels: int) -> list:
    """A list nested ``levels`` deep: [[[...]]]."""
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


@pytest.mark.parametrize("call, message", [
    (lambda f: f.submit(), "missing a required argument: 'to'"),
    (lambda f: f.submit(to="a", too="b"), "unexpected keyword argument 'too'"),
    (lambda f: f.submit(to=datetime(2024, 1, 1)), "args['to'] is a datetime, which is not JSON"),
    (lambda f: f.submit(to="a", cc=[float("nan")]), "args['cc'][0] is nan"),
    (lambda f: f.submit_many([{"to": "a"}, {"to": "b", "bcc": 1}]), "unexpected keyword argument 'bcc'"),
    (lambda f: f.submit("a", "b", "c"), "too many positional arguments"),
    (lambda f: f.submit(to="a", cc=deep(10_000)), "args['cc']" + "[0]" * 200 + " is nested deeper than 200 levels"),
])
def test_arguments_are_checked_against_the_signature_before_anything_is_written(dsn, conn, call, message):
    with TaskApp(dsn) as app:
        @app.task(queue="mail")
        def send_email(to: str, cc: list | None = None) -> None:
            pass

        with pytest.raises(InvalidArgument, match="task .*send_email: .*" + re.escape(message)):
            call(send_email)
        assert tasks_of(conn, "mail") == []


def test_declarations_a_spec_cannot_hold_are_refused():
    app = TaskApp("postgresql://nowhere.invalid/db")  # declaring touches no database

    def positional_only(a, /):
        pass

    def star_args(*items):
        pass

    def conn_param(conn):
        pass

    for f, what in ((positional_only, "'a' cannot be passed by name"), (star_args, "'items' cannot be passed"),
                    (conn_param, "'conn' is taken by submit")):
        with pytest.raises(InvalidArgument, match=what):
            app.task(f)
    app.task(name="x")(lambda: None)
    with pytest.raises(InvalidArgument, match="'x' is declared already"):
        app.task(name="x")(lambda: None)


def test_options_reach_every_argument_of_submit_task(dsn, conn):
    with TaskApp(dsn) as app:
        @app.task(queue="sync", priority=7, max_attempts=3, concurrency_key=lambda customer, **_: f"c:{customer}")
        def sync_customer(customer: int, full: bool = False) -> None:
            pass

        plain = sync_customer.submit(customer=1)
        assert (plain.priority, plain.max_attempts, plain.concurrency_key, plain.unique_key) == (7, 3, "c:1", None)
        later = sync_customer.options(run_at=timedelta(minutes=5), unique_key="sync:2", priority=90,
                                      queue="sync-slow").submit(customer=2)
        assert (later.status, later.queue, later.priority, later.unique_key) == ("scheduled", "sync-slow", 90, "sync:2")
        again = sync_customer.options(unique_key=lambda customer, full: f"sync:{customer}",
                                      queue="sync-slow").submit(2)
        assert again.deduplicated and again.rn == later.rn
        at = datetime(2100, 1, 1, tzinfo=timezone.utc)
        child = sync_customer.options(after=[plain, later.rn], on_parent_failure="run", run_at=at).submit(customer=3)
        assert (child.status, child.after, child.on_parent_failure) == ("waiting", [plain.rn, later.rn], "run")
        many = sync_customer.options(max_attempts=1).submit_many([{"customer": 4}, {"customer": 5, "full": True}])
        assert [(h.spec["args"], h.concurrency_key, h.max_attempts) for h in many] == [
            ({"customer": 4}, "c:4", 1), ({"customer": 5, "full": True}, "c:5", 1)]
        assert sync_customer.queue == "sync"  # options() made copies
        flow = Workflow().add("first", sync_customer.queue, sync_customer.spec(7))
        flow.add("then", sync_customer.queue, sync_customer.spec(customer=8, full=True), after=["first"])
        nodes = TaskClient(app.db).submit_workflow(flow)
        assert (nodes["then"].status, nodes["then"].spec) == ("waiting", {"task": sync_customer.name,
                                                                         "args": {"customer": 8, "full": True}})
        with pytest.raises(InvalidArgument, match="unexpected keyword argument 'partial'"):
            sync_customer.spec(customer=9, partial=True)
        with pytest.raises(InvalidArgument, match="concurrency_key must answer a str or None, got int"):
            sync_customer.options(concurrency_key=lambda customer, **_: customer).submit(customer=6)


def test_submit_in_the_callers_transaction_exists_only_if_it_commits(dsn, conn):
    with TaskApp(dsn) as app:
        @app.task(queue="invoices")
        def invoice(order: int) -> None:
            pass

        with psycopg.connect(dsn) as mine:
            with mine.transaction():
                kept = invoice.submit(order=1, conn=mine)
                typed = invoice.options(conn=mine).submit(order=2)
            with pytest.raises(RuntimeError), mine.transaction():
                invoice.submit(order=3, conn=mine)
                invoice.options(conn=mine).submit_many([{"order": 4}])
                raise RuntimeError("rolled back")
        assert sorted(t["spec"]["args"]["order"] for t in tasks_of(conn, "invoices")) == [1, 2]
        assert kept.rn != typed.rn


def test_the_spec_submitted_from_psql_runs_the_python_function(dsn, conn):
    with TaskApp(dsn) as app:
        seen = []

        @app.task(queue="reports", name="reports.build")
        def build(report: str, pages: int = 1) -> dict:
            seen.append((report, pages, current_context().attempt))
            return {"report": report, "pages": pages}

        with psycopg.connect(dsn, autocommit=True) as psql:
            rn = psql.execute("SELECT pyscheduler.submit_task(queue => 'reports', spec => "
                              "'{\"task\": \"reports.build\", \"args\": {\"report\": \"billing\", \"pages\": 3}}')"
                              " ->> 'rn'").fetchone()[0]
            bare = psql.execute("SELECT pyscheduler.submit_task(queue => 'reports', spec => "
                                "'{\"task\": \"reports.build\", \"args\": {\"report\": \"sales\"}}') ->> 'rn'"
                                ).fetchone()[0]
        running = app.worker(queues=["reports"]).start()
        try:
            client = TaskClient(app.db)
            assert client.handle(rn).result(timeout=30) == {"report": "billing", "pages": 3}
            assert client.handle(bare).result(timeout=30) == {"report": "sales", "pages": 1}
        finally:
            running.stop()
        assert sorted(seen) == [("billing", 3, 1), ("sales", 1, 1)]


def test_arguments_a_function_cannot_take_and_a_spec_of_another_shape_abort_the_task(dsn, conn):
    with TaskApp(dsn) as app:
        @app.task(queue="reports", name="reports.build")
        def build(report: str) -> None:
            raise TypeError("the function's own TypeError is an ordinary failure")

        client = TaskClient(app.db)
        wrong = client.submit("reports", {"task": "reports.build", "args": {"report": "x", "colour": "red"}})
        notdict = client.submit("reports", {"task": "reports.build", "args": ["x"]})
        shape = client.submit("reports", {"report": "x"})
        own = client.submit("reports", {"task": "reports.build", "args": {"report": "x"}}, max_attempts=1)
        outcomes = {d.ctx.rn: d for d in app.drain()}
        assert [outcomes[str(t.rn)].outcome for t in (wrong, notdict, shape, own)] == ["aborted"] * 3 + ["failed"]
        for handle, code, text in ((wrong, "InvalidArguments", "unexpected keyword argument 'colour'"),
                                   (notdict, "InvalidArguments", "args must be a JSON object, got list"),
                                   (shape, "InvalidSpec", '{"task": "<name>", "args": {...}}'),
                                   (own, "TypeError", "own TypeError")):
            task = client.get(handle.rn)
            assert task.status == "aborted" and task.errors[0].code == code and text in task.errors[0].description
        assert client.get(own.rn).errors[-1].code == "TaskMaxAttempts"


def test_an_unknown_task_name_fails_the_attempt_for_another_worker_and_is_logged_once(dsn, conn, caplog):
    with TaskApp(dsn) as app:
        @app.task(queue="mail")
        def send_email(to: str) -> None:
            pass

        client = TaskClient(app.db)
        a = client.submit("mail", {"task": "mail.fax", "args": {}}, max_attempts=3)
        b = client.submit("mail", {"task": "mail.fax", "args": {}}, max_attempts=3)
        with caplog.at_level(logging.ERROR, logger="pyscheduler.tasks.app"):
            assert [d.outcome for d in app.drain()] == ["failed", "failed"]
        for handle in (a, b):
            task = client.get(handle.rn)
            assert task.status == "scheduled" and task.attempts == 1  # again after the backoff
            assert task.errors[0].code == "UnknownTask" and task.errors[0].args == {"task": "mail.fax"}
        logged = [r.getMessage() for r in caplog.records if "mail.fax" in r.getMessage()]
        assert len(logged) == 1 and "no task function named 'mail.fax'" in logged[0], logged


def test_two_workers_serving_different_task_names_on_one_queue_run_each_task_by_its_function(dsn, conn,
                                                                                             fast_backoff):
    ran: dict[str, list[int]] = {"a": [], "b": []}
    with TaskApp(dsn) as one, TaskApp(dsn) as other:
        @one.task(queue="shared", name="shared.a", max_attempts=100)
        def a(i: int) -> str:
            ran["a"].append(i)
            return "a"

        @other.task(queue="shared", name="shared.b", max_attempts=100)
        def b(i: int) -> str:
            ran["b"].append(i)
            return "b"

        handles = a.submit_many([{"i": i} for i in range(10)]) + b.submit_many([{"i": i} for i in range(10)])
        workers = [one.worker(capacity=2).start(), other.worker(capacity=2).start()]
        try:
            assert [h.result(timeout=60) for h in handles] == ["a"] * 10 + ["b"] * 10
        finally:
            for w in workers:
                w.stop()
        assert sorted(ran["a"]) == sorted(ran["b"]) == list(range(10))  # each once, by its own function
        misses = [e["code"] for t in tasks_of(conn, "shared") for e in t["errors"]]
        assert set(misses) <= {"UnknownTask"}


def test_async_def_tasks_run_on_an_async_worker_and_on_a_sync_one(dsn, conn):
    with TaskApp(dsn) as app:
        loops = []

        @app.task(queue="fetch")
        async def fetch(url: str) -> int:
            await asyncio.sleep(0)
            loops.append(threading.current_thread().name)
            assert current_context().spec["args"] == {"url": url}
            return len(url)

        @app.task(queue="mixed")
        async def fetch_mixed(url: str) -> int:
            await asyncio.sleep(0)
            return len(url) * 2

        @app.task(queue="mixed")
        def count(url: str) -> int:
            return len(url) * 3

        worker = app.worker(capacity=2)
        assert [(w.queue, type(w).__name__) for w in worker.workers] == [("fetch", "AsyncWorker"),
                                                                        ("mixed", "Worker")]
        handles = [fetch.submit(url="/abc"), fetch_mixed.submit(url="/abc"), count.submit(url="/abc")]
        # a sync task routed to the async worker's queue runs in a thread
        handles.append(count.options(queue="fetch").submit(url="/a"))
        running = worker.start()
        try:
            assert [h.result(timeout=30) for h in handles] == [4, 8, 12, 6]
        finally:
            running.stop()
        assert isinstance(worker.workers[0], AsyncWorker) and len(loops) == 1


def test_the_task_context_is_the_running_tasks_and_abort_ends_it(dsn, conn):
    with TaskApp(Database(dsn, max_size=2)) as app:  # on a Database of the application's
        @app.task(queue="steps")
        def steps(n: int) -> list:
            ctx = current_context()
            ctx.progress(0.5)
            if n < 0:
                raise Abort("negative", "n must not be negative", {"n": n})
            return [ctx.queue, ctx.attempt, n]

        with pytest.raises(RuntimeError, match="only available inside a running task function"):
            current_context()
        app.db.open()
        ok, bad = steps.submit(n=2), steps.submit(n=-1)
        running = app.worker().start()
        try:
            assert ok.result(timeout=30) == ["steps", 1, 2]
            with pytest.raises(TaskFailed) as failed:
                bad.result(timeout=30)
        finally:
            running.stop()
            app.db.close()
        assert failed.value.task.errors[0].code == "negative"
