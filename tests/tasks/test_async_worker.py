"""The asyncio flavour: AsyncWorker runs ``async def`` handlers with Worker's semantics."""

from __future__ import annotations

import asyncio
import threading

import pytest

from pyscheduler.db import Jsonb
from pyscheduler.tasks import Abort
from pyscheduler.tasks.aio import AsyncTaskContext, AsyncWorker

from tests.support import wait_for
from tests.support.tasks import status, types_of

pytestmark = pytest.mark.slow  # every test here: daemons, processes or servers of its own, on the real clock


def test_async_handlers_complete_tasks_report_progress_and_respect_capacity(dsn, client):
    active, peak = [0], [0]
    release = threading.Event()

    async def handler(ctx: AsyncTaskContext) -> None:
        active[0] += 1  # one event loop: no lock needed
        peak[0] = max(peak[0], active[0])
        ctx.progress(0.5)
        while not release.is_set():
            await asyncio.sleep(0.01)
        active[0] -= 1

    running = AsyncWorker(dsn, "a", handler, capacity=2, timeout=3, heartbeat_interval=0.1).start()
    try:
        rns = [t["rn"] for t in client.submit_many("a", [{"i": i} for i in range(5)])]
        wait_for(lambda: sum(client.get(rn)["progress"] == 0.5 for rn in rns) == 2)  # heartbeats carry it
        assert active[0] == 2
        release.set()
        wait_for(lambda: all(status(client, rn) == "completed" for rn in rns))
        assert peak[0] == 2
        assert all(client.get(rn)["progress"] == 1 for rn in rns)
    finally:
        release.set()
        running.stop()


def test_async_cancellation_reaches_the_awaiting_handler_and_the_task_stays_cancelled(dsn, client):
    seen = threading.Event()

    async def handler(ctx: AsyncTaskContext) -> None:
        if await ctx.cancelled.wait(60):  # longer than the test waits: a loaded machine delays the lease
            seen.set()

    running = AsyncWorker(dsn, "ac", handler, timeout=90, heartbeat_interval=30).start()
    try:
        rn = client.submit("ac", {})["rn"]
        wait_for(lambda: status(client, rn) == "running")
        client.cancel(rn)
        assert seen.wait(20), "the handler did not learn of the cancellation"  # heartbeats: every 30 s
        wait_for(lambda: not running.worker.held)
        assert status(client, rn) == "cancelled"
    finally:
        running.stop()


def test_async_abort_aborts_and_other_exceptions_fail_the_attempt(dsn, db, client):
    async def handler(ctx: AsyncTaskContext) -> None:
        await asyncio.sleep(0)
        if ctx.spec["kind"] == "abort":
            raise Abort("superseded", "new task superseded", {"by": 2})
        raise ValueError("bad input")

    running = AsyncWorker(dsn, "ae", handler, capacity=2).start()
    try:
        a = client.submit("ae", {"kind": "abort"})["rn"]
        # any other exception fails the attempt (retried after a backoff); its only attempt: aborted
        b = db.call_value("submit_task", queue="ae", spec=Jsonb({"kind": "crash"}), max_attempts=1)["rn"]
        wait_for(lambda: status(client, a) == "aborted" and status(client, b) == "aborted")
        assert client.get(a)["errors"] == [{"code": "superseded", "args": {"by": 2},
                                            "description": "new task superseded"}]
        assert client.get(b)["errors"] == [{"code": "ValueError", "args": {}, "description": "bad input"},
                                           {"code": "TaskMaxAttempts", "args": {"attempts": 1, "max_attempts": 1},
                                            "description": "attempt 1 of 1 failed"}]
    finally:
        running.stop()


def test_async_stop_yields_held_tasks_and_another_worker_takes_them(dsn, client, monitor):
    async def block(ctx: AsyncTaskContext) -> None:
        await ctx.stopping.wait(30)

    first = AsyncWorker(dsn, "ay", block, timeout=60).start()
    rn = client.submit("ay", {})["rn"]
    wait_for(lambda: status(client, rn) == "running")
    first.stop()
    assert not first.thread.is_alive()

    async def done(ctx: AsyncTaskContext) -> None:
        return None

    second = AsyncWorker(dsn, "ay", done).start()
    try:
        wait_for(lambda: status(client, rn) == "completed")
        assert types_of(client.get(rn)) == ["TaskAssignment", "TaskYield", "TaskAssignment"]
    finally:
        second.stop()


def test_async_many_short_tasks_each_run_once(dsn, db, client):
    ran: list[str] = []

    async def handler(ctx: AsyncTaskContext) -> None:
        ran.append(ctx.rn)

    db.call("submit_tasks", queue="am", specs=Jsonb([{"i": i} for i in range(2000)]))
    workers = [AsyncWorker(dsn, "am", handler, capacity=8).start() for _ in range(2)]
    try:
        wait_for(lambda: sum(w.worker.completed for w in workers) == 2000, timeout=120)
    finally:
        for w in workers:
            w.stop()
    assert len(ran) == len(set(ran)) == 2000
    assert {t["status"] for t in client.list("am", limit=2000)} == {"completed"}


def test_run_async_works_in_the_callers_event_loop(dsn, client):
    rn = client.submit("al", {"n": 1})["rn"]
    seen: list[asyncio.AbstractEventLoop] = []

    async def main() -> None:
        stop = asyncio.Event()

        async def handler(ctx: AsyncTaskContext) -> None:
            seen.append(asyncio.get_running_loop())
            stop.set()

        worker = AsyncWorker(dsn, "al", handler)
        await asyncio.wait_for(worker.run_async(stop), 60)
        assert seen == [asyncio.get_running_loop()]
        assert worker.completed == 1

    asyncio.run(main())
    assert status(client, rn) == "completed"
