"""Flow control for tasks, Python side: a handler's return value is its result,
``submit(...).result(timeout)`` waits for it by LISTEN, ``Snooze``, ``ctx.complete(conn=...)``
inside the application's transaction, the workflow builder, limits through the client."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import timedelta

import psycopg
import pytest

from pyscheduler import errors
from pyscheduler.tasks import (AsyncTaskClient, AsyncWorker, Snooze, TaskContext, TaskFailed, Worker,
                               Workflow)
from tests.support import wait_for


@pytest.mark.slow
def test_a_handlers_return_value_is_the_result_that_submit_waits_for(dsn, client):
    handle = client.submit("results", {"x": 20})
    assert handle.status == "ready" and handle.output is None

    def handler(ctx: TaskContext):
        return {"double": ctx.spec["x"] * 2}

    with pytest.raises(TimeoutError):
        handle.result(timeout=0.2)  # nobody works the queue yet
    running = Worker(dsn, "results", handler).start()
    try:
        assert handle.result(timeout=30) == {"double": 40}
        assert client.get(handle.rn).output == {"double": 40}
        assert client.handle(handle.rn).result(timeout=0) == {"double": 40}  # finished: answered at once
    finally:
        running.stop()


def test_result_wakes_on_the_notify_not_a_poll(dsn, client, db):
    """The waiter sleeps in LISTEN; the completion's NOTIFY wakes it within milliseconds."""
    handle = client.submit("wake", {})
    got: dict = {}

    def wait():
        got["value"] = handle.result(timeout=60)
        got["at"] = time.monotonic()

    waiter = threading.Thread(target=wait)
    waiter.start()
    wait_for(lambda: db.query("SELECT watched FROM pyscheduler.tasks WHERE rn = %s", [handle.rn])[0]["watched"])
    t = db.call_value("lease_task", queue="wake", worker="w1")
    done_at = time.monotonic()
    db.call("complete_task", rn=t["rn"], token=t["token"], result=psycopg.types.json.Jsonb([1, 2]))
    waiter.join(30)
    assert got["value"] == [1, 2]
    assert got["at"] - done_at < 2.0


def test_result_of_an_aborted_or_cancelled_task_raises(dsn, client):
    handle = client.submit("fails", {})
    client.cancel(handle.rn)
    with pytest.raises(TaskFailed) as info:
        handle.result(timeout=5)
    assert info.value.task.status == "cancelled"


@pytest.mark.slow
def test_a_result_that_is_not_json_fails_the_attempt(dsn, client):
    handle = client.submit("badresult", {}, max_attempts=1)
    running = Worker(dsn, "badresult", lambda ctx: {"when": object()}).start()
    try:
        with pytest.raises(TaskFailed) as info:
            handle.result(timeout=30)
    finally:
        running.stop()
    assert info.value.task.status == "aborted"
    assert info.value.task.errors[0].code == "InvalidArgument"


@pytest.mark.slow
def test_a_result_above_the_setting_aborts_that_task_alone(dsn, client, conn):
    conn.execute("UPDATE pyscheduler.settings SET value = '200' WHERE name = 'task_max_result_bytes'")
    small = [client.submit("big", {"n": i}) for i in range(5)]
    big = client.submit("big", {"n": "big"})
    released = threading.Event()

    def handler(ctx: TaskContext):
        released.wait(10)  # all six finish together: one batch
        return "x" * 1000 if ctx.spec["n"] == "big" else ctx.spec["n"]

    running = Worker(dsn, "big", handler, capacity=6).start()
    try:
        wait_for(lambda: client.get(big.rn).status == "running")
        released.set()
        assert [h.result(timeout=30) for h in small] == [0, 1, 2, 3, 4]
        with pytest.raises(TaskFailed) as info:
            big.result(timeout=30)
        assert info.value.task.errors[-1].code == "ResultRefused"
    finally:
        running.stop()


@pytest.mark.slow
def test_snooze_puts_the_task_back_without_using_an_attempt(dsn, client):
    handle = client.submit("snooze", {}, max_attempts=1)
    calls = []

    def handler(ctx: TaskContext):
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise Snooze(timedelta(milliseconds=300))
        return "done"

    running = Worker(dsn, "snooze", handler).start()
    try:
        assert handle.result(timeout=30) == "done"
    finally:
        running.stop()
    task = client.get(handle.rn)
    assert task.attempts == 1 and task.errors == []
    assert [h.type for h in task.history] == ["TaskAssignment", "TaskYield", "TaskAssignment"]
    assert calls[1] - calls[0] >= 0.3
    with pytest.raises(errors.InvalidArgument):
        Snooze(timedelta(days=400))


@pytest.fixture
def accounts(conn):
    conn.execute("CREATE TABLE public.accounts (id int PRIMARY KEY, balance int NOT NULL)")
    conn.execute("INSERT INTO public.accounts VALUES (1, 100)")
    return conn


@pytest.mark.slow
def test_ctx_complete_in_the_applications_transaction_is_exactly_once(dsn, client, accounts):
    handle = client.submit("charge", {"amount": 10})

    def handler(ctx: TaskContext):
        with psycopg.connect(dsn) as app:  # the application's own transaction
            app.execute("UPDATE public.accounts SET balance = balance - %s WHERE id = 1", [ctx.spec["amount"]])
            ctx.complete(conn=app, result={"charged": ctx.spec["amount"]})

    running = Worker(dsn, "charge", handler).start()
    try:
        assert handle.result(timeout=30) == {"charged": 10}
        running.wait_idle()
    finally:
        running.stop()
    assert accounts.execute("SELECT balance FROM public.accounts").fetchone()["balance"] == 90
    assert client.get(handle.rn).attempts == 1


@pytest.mark.slow
def test_ctx_complete_after_the_lease_was_lost_raises_and_the_writes_roll_back(dsn, client, accounts, db):
    handle = client.submit("lost", {})
    seen = []

    def handler(ctx: TaskContext):
        with psycopg.connect(dsn) as app:
            app.execute("UPDATE public.accounts SET balance = balance - 10 WHERE id = 1")
            # the lease is lost meanwhile: reset by the monitor (its deadline moved to the past), leased again
            with psycopg.connect(dsn) as other:  # one transaction: a heartbeat cannot slip in between
                other.execute("UPDATE pyscheduler.tasks SET deadline = now() - interval '1 minute' WHERE rn = %s",
                              [ctx.rn])
                assert other.execute("SELECT count(*) FROM pyscheduler.reset_expired_tasks()").fetchone()[0] == 1
                other.execute("SELECT pyscheduler.lease_task('lost', 'w-other')")
            try:
                ctx.complete(conn=app)
            except errors.TaskNotOwned as exc:
                seen.append(exc)
                app.rollback()
                raise

    running = Worker(dsn, "lost", handler).start()
    try:
        wait_for(lambda: seen)
    finally:
        running.stop()
    assert accounts.execute("SELECT balance FROM public.accounts").fetchone()["balance"] == 100
    assert client.get(handle.rn).owner == "w-other"


@pytest.mark.slow
def test_a_workflow_runs_parents_first_and_children_read_their_results(dsn, client):
    flow = Workflow()
    flow.add("a", "flow", {"n": 2}).add("b", "flow", {"n": 3})
    flow.add("sum", "flow", {"op": "sum"}, after=["a", "b"])
    handles = client.submit_workflow(flow)
    assert handles["sum"].status == "waiting" and handles["sum"].after == [handles["a"].rn, handles["b"].rn]

    def handler(ctx: TaskContext):
        if ctx.spec.get("op") == "sum":
            return sum(p["result"] for p in ctx.parents())
        return ctx.spec["n"] * 10

    running = Worker(dsn, "flow", handler).start()
    try:
        assert handles["sum"].result(timeout=30) == 50
    finally:
        running.stop()
    bad = Workflow().add("x", "flow", {}, after=["y"])
    with pytest.raises(errors.InvalidArgument) as info:
        client.submit_workflow(bad)
    assert info.value.sqlstate == "PS220"


def test_limits_and_keys_through_the_client(dsn, client):
    limits = client.set_queue_limits("lim", running_per_key=1, running_total=10)
    assert (limits.running_per_key, limits.running_total, limits.rate_starts) == (1, 10, None)
    rate = client.set_rate_limit("lim", 100, timedelta(seconds=2), by_key=True)
    assert (rate.rate_starts, rate.rate_per, rate.rate_by_key) == (100, timedelta(seconds=2), True)
    assert [q.queue for q in client.queue_limits()] == ["lim"]
    parent = client.submit("lim", {}, concurrency_key="k")
    child = client.submit("lim", {}, concurrency_key="k", after=[parent.rn], on_parent_failure="run")
    assert (child.concurrency_key, child.after, child.on_parent_failure) == ("k", [parent.rn], "run")
    many = client.submit_many("lim", [{}, {}], concurrency_keys=["k", None])
    assert [t.concurrency_key for t in many] == ["k", None]
    with pytest.raises(errors.InvalidArgument):
        client.set_queue_limits("lim", running_per_key=0)


@pytest.mark.slow
def test_async_client_handle_is_awaited(dsn, client):
    async def handler(ctx):
        return ctx.spec["x"] + 1

    running = AsyncWorker(dsn, "async-results", handler).start()  # its own event loop, in a thread

    async def main():
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            handle = await AsyncTaskClient(conn).submit("async-results", {"x": 1})
            return await handle.result(timeout=30)

    try:
        assert asyncio.run(main()) == 2
    finally:
        running.stop()


@pytest.mark.slow
def test_async_ctx_complete_in_the_applications_transaction(dsn, client, accounts):
    handle = client.submit("acharge", {"amount": 7})

    async def handler(ctx):
        async with await psycopg.AsyncConnection.connect(dsn) as app:
            await app.execute("UPDATE public.accounts SET balance = balance - %s WHERE id = 1", [ctx.spec["amount"]])
            await ctx.complete_in(app, result="charged")
            await app.commit()

    running = AsyncWorker(dsn, "acharge", handler).start()
    try:
        assert handle.result(timeout=30) == "charged"
    finally:
        running.stop()
    assert accounts.execute("SELECT balance FROM public.accounts").fetchone()["balance"] == 93
