"""Durable task functions end to end, on real servers: ``ctx.step`` survives a worker killed with
SIGKILL and commits with the application's transaction (``conn=``), ``ctx.sleep`` frees the
worker and resumes on time, ``ctx.await_event`` receives events emitted before and during the
wait (once) and times out; the same in ``async def`` tasks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from pyscheduler.tasks import Retry, TaskApp, TaskClient, current_context
from tests.support import REPO, wait_for
from tests.support.durable import build, count

pytestmark = pytest.mark.slow


def steps_of(client: TaskClient, rn) -> list[tuple[str, str]]:
    return [(r["kind"], r["step"]) for r in client.db.call("task_steps", rn=rn)]


def test_a_worker_killed_after_step_two_resumes_on_another_worker_at_step_three(dsn, db, tmp_path, monitor):
    app = build(dsn, tmp_path)
    handle = app.functions["three_steps"].submit(order=7)
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.durable", dsn, str(tmp_path)], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        wait_for(lambda: count(tmp_path, "three-started") == 1, what="the worker process to reach step three")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        proc.kill()
    assert (count(tmp_path, "one"), count(tmp_path, "two"), count(tmp_path, "three")) == (1, 1, 0)
    running = app.worker().start()  # another worker: the monitor resets the dead one's lease
    try:
        assert handle.result(timeout=30) == ["one", "two", "three"]
    finally:
        running.stop()
        app.close()
    assert (count(tmp_path, "one"), count(tmp_path, "two"), count(tmp_path, "three")) == (1, 1, 1)
    assert steps_of(TaskClient(db), handle.rn) == [("step", "one"), ("step", "two"), ("step", "three")]


def test_a_step_recorded_with_conn_in_a_rolled_back_transaction_is_not_recorded_and_runs_again(dsn, conn, db):
    conn.execute("CREATE TABLE public.charges (order_id int)")
    app = TaskApp(db)
    calls = []

    def charge(c: psycopg.Connection, order: int) -> dict:
        calls.append(order)
        c.execute("INSERT INTO public.charges VALUES (%s)", (order,))
        return {"charged": order}

    @app.task(queue="charges")
    def pay(order: int) -> dict:
        ctx = current_context()
        with psycopg.connect(dsn) as c:
            charged = ctx.step("charge", charge, c, order, conn=c)
            if ctx.attempt == 1:
                c.rollback()  # the application's transaction fails: neither the charge nor its checkpoint
                raise Retry(0, "declined")
        return charged

    pay.submit(order=7)
    assert [d.outcome for d in app.drain()] == ["failed", "completed"]
    assert [d.outcome for d in app.drain()] == []
    assert calls == [7, 7]  # the step ran again on the retry
    assert conn.execute("SELECT count(*) AS n FROM public.charges").fetchone()["n"] == 1
    rn = conn.execute("SELECT rn FROM pyscheduler.tasks").fetchone()["rn"]
    assert TaskClient(db).get(rn).output == {"charged": 7}
    assert steps_of(TaskClient(db), rn) == [("step", "charge")]


def test_a_step_committed_with_conn_is_not_run_again_by_a_retry(dsn, conn, db):
    app = TaskApp(db)
    calls = []

    @app.task(queue="charges")
    def pay(order: int) -> int:
        ctx = current_context()
        with psycopg.connect(dsn) as c:
            ctx.step("charge", calls.append, order, conn=c)
        if ctx.attempt == 1:
            raise Retry(0, "the mail server is down")
        return len(calls)

    handle = pay.submit(order=7)
    assert [d.outcome for d in app.drain()] == ["failed", "completed"]
    assert TaskClient(db).get(handle.rn).output == 1


def test_a_sleeping_task_frees_its_worker_and_resumes_on_time(dsn, db):
    app = TaskApp(db)
    ran = []

    @app.task(queue="sleepy")
    def nap() -> str:
        ctx = current_context()
        ran.append("nap")  # outside any step: runs again after the sleep
        ctx.step("before", effect_free, "before")
        ctx.sleep(timedelta(seconds=2))
        return datetime.now(timezone.utc).isoformat()

    @app.task(queue="sleepy")
    def quick() -> str:
        ran.append("quick")
        return datetime.now(timezone.utc).isoformat()

    client = TaskClient(db)
    napping = nap.submit()
    running = app.worker(capacity=1).start()
    try:
        slept = wait_for(lambda: [r["result"] for r in client.db.call("task_steps", rn=napping.rn)
                                  if r["kind"] == "sleep"], what="the sleep")[0]
        until = datetime.fromisoformat(slept["until"].replace("Z", "+00:00"))
        assert client.get(napping.rn).status == "scheduled"
        quick_done = datetime.fromisoformat(quick.submit().result(timeout=30))
        assert quick_done < until  # the only handler ran another task meanwhile
        woke = datetime.fromisoformat(napping.result(timeout=30))
    finally:
        running.stop()
    assert until <= woke < until + timedelta(seconds=1.5)
    assert ran == ["nap", "quick", "nap"]
    assert client.get(napping.rn).attempts == 1  # the sleep used no attempt
    assert steps_of(client, napping.rn) == [("step", "before"), ("sleep", "sleep-1")]


def effect_free(value: str) -> str:
    return value


def test_events_emitted_before_and_during_the_wait_are_received_once_and_a_wait_times_out(dsn, db):
    app = TaskApp(db)

    @app.task(queue="events")
    def waiter(event: str, timeout: float) -> object:
        return current_context().await_event(event, timeout=timedelta(seconds=timeout))

    client = TaskClient(db)
    running = app.worker(capacity=3).start()
    try:
        assert app.emit_event("before", {"v": 1}) == 0
        assert waiter.submit(event="before", timeout=60).result(timeout=30) == {"v": 1}
        during = waiter.submit(event="during", timeout=60)
        wait_for(lambda: ("await", "during") in steps_of(client, during.rn), what="the wait")
        suspended = client.get(during.rn)
        assert (suspended.status, suspended.awaiting) == ("scheduled", "during")
        never = waiter.submit(event="never", timeout=1)
        assert app.emit_event("during", {"v": 2}) == 1
        assert during.result(timeout=30) == {"v": 2}
        assert client.get(during.rn).awaiting is None
        assert app.emit_event("during", {"v": 3}) == 0  # after the wait: nobody waits for it
        assert never.result(timeout=30) is None  # timed out
    finally:
        running.stop()
    assert [r["result"] for r in client.db.call("task_steps", rn=during.rn)] == [
        {"status": "received", "payload": {"v": 2}}]


def test_async_tasks_step_sleep_and_wait(dsn, db):
    app = TaskApp(db)
    calls = []

    async def fetch(n: int) -> int:
        calls.append(n)
        return n * 2

    @app.task(queue="async-durable")
    async def flow(n: int) -> list:
        ctx = current_context()
        doubled = await ctx.step_async("fetch", fetch, n)
        await ctx.sleep_async(timedelta(milliseconds=200))
        payload = await ctx.await_event_async(f"go-{n}", timeout=timedelta(seconds=60))
        return [doubled, payload]

    handle = flow.submit(n=4)
    running = app.worker().start()
    try:
        wait_for(lambda: ("await", "go-4") in steps_of(TaskClient(db), handle.rn), what="the wait")
        app.emit_event("go-4", "now")
        assert handle.result(timeout=30) == [8, "now"]
    finally:
        running.stop()
    assert calls == [4]


def test_an_async_step_recorded_with_an_async_connection_commits_with_the_application(dsn, conn, db):
    conn.execute("CREATE TABLE public.async_charges (n int)")
    app = TaskApp(db)
    calls = []

    @app.task(queue="async-charges")
    async def pay(n: int) -> int:
        ctx = current_context()
        async with await psycopg.AsyncConnection.connect(dsn) as c:
            async def charge() -> int:
                calls.append(n)
                await c.execute("INSERT INTO public.async_charges VALUES (%s)", (n,))
                return n

            got = await ctx.step_async("charge", charge, conn=c)
            if ctx.attempt == 1:
                await c.rollback()  # neither the charge nor its checkpoint
                raise Retry(0, "declined")
        return got

    pay.submit(n=3)
    assert [d.outcome for d in app.drain()] == ["failed", "completed"]
    assert calls == [3, 3]
    assert conn.execute("SELECT count(*) AS n FROM public.async_charges").fetchone()["n"] == 1
