"""The worker library as a job queue's worker: a handler's exception fails
the attempt (retried with backoff, batched like completions), Abort aborts, Retry picks the
delay, a BaseException never ends the worker; idle workers lease delayed tasks when they come
due; a paused queue stops leasing."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import datetime, timedelta

import pytest

from pyscheduler.db import Jsonb
from pyscheduler.tasks import Retry, TaskContext, Worker
from pyscheduler.tasks.aio import AsyncTaskContext, AsyncWorker

from tests.support import wait_for
from tests.support.tasks import status, types_of

pytestmark = pytest.mark.slow  # every test here: daemons, processes or servers of its own, on the real clock


@pytest.fixture
def fast_backoff(conn):
    """The default backoff at 50 ms * 2^attempt (100 ms after the first attempt)."""
    conn.execute("UPDATE pyscheduler.settings SET value = '50 milliseconds' WHERE name = 'task_backoff_base'")


def ts(text: str) -> datetime:
    return datetime.fromisoformat(text)


def retries(task: dict) -> list[dict]:
    return [h for h in task["history"] if h["_typ"] == "TaskRetry"]


def test_a_handler_failing_twice_then_succeeding_completes_with_3_attempts_and_2_errors(dsn, client,
                                                                                        fast_backoff):
    calls: dict[str, int] = {}
    seen_attempts: list[int] = []

    def handler(ctx: TaskContext) -> None:
        calls[ctx.rn] = calls.get(ctx.rn, 0) + 1
        seen_attempts.append(ctx.attempt)
        if calls[ctx.rn] <= 2:
            raise ConnectionError("upstream 503")

    running = Worker(dsn, "flaky", handler, poll_interval=5).start()
    try:
        rn = client.submit("flaky", {"x": 1})["rn"]
        wait_for(lambda: status(client, rn) == "completed")
        task = client.get(rn)
        assert task["attempts"] == 3 and calls[rn] == 3 and seen_attempts == [1, 2, 3]
        assert task["errors"] == [{"code": "ConnectionError", "args": {}, "description": "upstream 503"}] * 2
        assert types_of(task) == ["TaskAssignment", "TaskRetry", "TaskAssignment", "TaskRetry", "TaskAssignment"]
        for attempt, entry in enumerate(retries(task), 1):
            delay = (ts(entry["run_at"]) - ts(entry["time"])).total_seconds()
            base = 0.05 * 2 ** attempt
            assert entry["attempt"] == attempt and base * 0.5 <= delay < base * 1.5, (attempt, delay)
        # the counter moves once the recorder's write returned, a moment after the task reads completed
        wait_for(lambda: running.worker.completed == 1)
        assert running.worker.failed == 2
    finally:
        running.stop()


def test_retry_chooses_the_delay(dsn, client):
    seen: list[float] = []

    def handler(ctx: TaskContext) -> None:
        seen.append(time.monotonic())
        if len(seen) == 1:
            raise Retry(in_=timedelta(milliseconds=400), description="rate limited", args={"limit": 10})

    running = Worker(dsn, "later", handler, poll_interval=5).start()
    try:
        rn = client.submit("later", {})["rn"]
        wait_for(lambda: status(client, rn) == "completed")
        task = client.get(rn)
        [entry] = retries(task)
        assert ts(entry["run_at"]) - ts(entry["time"]) == timedelta(milliseconds=400)
        assert task["errors"] == [{"code": "Retry", "args": {"limit": 10}, "description": "rate limited"}]
        assert seen[1] - seen[0] >= 0.4
    finally:
        running.stop()


def test_a_task_that_keeps_failing_is_aborted_after_its_max_attempts(dsn, db, client, fast_backoff):
    def handler(ctx: TaskContext) -> None:
        raise ValueError(f"bad input {ctx.spec['n']}")

    running = Worker(dsn, "doomed", handler, poll_interval=5).start()
    try:
        rn = db.call_value("submit_task", queue="doomed", spec=Jsonb({"n": 7}), max_attempts=3)["rn"]
        wait_for(lambda: status(client, rn) == "aborted")
        task = client.get(rn)
        assert task["attempts"] == 3 and [e["code"] for e in task["errors"]] == ["ValueError"] * 3 + ["TaskMaxAttempts"]
        wait_for(lambda: running.worker.failed == 3)
    finally:
        running.stop()


@pytest.mark.parametrize("raised", [SystemExit(3), KeyboardInterrupt(), GeneratorExit()])
def test_a_base_exception_in_a_handler_is_a_failure_not_the_end_of_the_worker(dsn, client, raised):
    def handler(ctx: TaskContext) -> None:
        if ctx.spec["bad"]:
            raise raised

    running = Worker(dsn, "base", handler, poll_interval=5).start()
    try:
        bad = client.submit("base", {"bad": True})["rn"]
        wait_for(lambda: client.get(bad)["errors"])
        assert client.get(bad)["errors"][0]["code"] == type(raised).__name__
        assert status(client, bad) in ("scheduled", "ready", "running")  # retried
        good = client.submit("base", {"bad": False})["rn"]
        wait_for(lambda: status(client, good) == "completed")
        assert running.thread.is_alive() and running.worker.fatal is None
    finally:
        running.stop()


def test_an_async_handlers_own_cancelled_error_is_a_failure(dsn, client):
    async def handler(ctx: AsyncTaskContext) -> None:
        if ctx.spec["bad"]:
            loop = asyncio.get_running_loop()
            future = loop.create_future()
            future.cancel()
            await future  # raises CancelledError inside the handler; the worker's task was not cancelled

    running = AsyncWorker(dsn, "acancel", handler, poll_interval=5).start()
    try:
        bad = client.submit("acancel", {"bad": True})["rn"]
        wait_for(lambda: client.get(bad)["errors"])
        assert client.get(bad)["errors"][0]["code"] == "CancelledError"
        good = client.submit("acancel", {"bad": False})["rn"]
        wait_for(lambda: status(client, good) == "completed")
        assert running.thread.is_alive() and running.worker.fatal is None
    finally:
        running.stop()


def test_idle_workers_lease_a_delayed_task_within_100_ms_of_its_run_at_and_not_before(dsn, db, client):
    """No poll would find them in time (poll_interval 30 s): the idle wait is bounded by the
    queue's next due time. Lease and run_at compared on the database clock."""
    started: dict[str, str] = {}

    def handler(ctx: TaskContext) -> None:
        started[ctx.rn] = ctx.spec["label"]

    running = [Worker(dsn, "due", handler, poll_interval=30).start() for _ in range(2)]
    try:
        for r in running:
            r.wait_idle(timeout=30)
        time.sleep(0.3)  # both asleep on their poll
        rns = []
        for label, delay in (("a", 0.4), ("b", 0.9), ("c", 1.6)):
            rns.append(db.query("SELECT pyscheduler.submit_task(queue => 'due', spec => %s, "
                                "run_at => clock_timestamp() + %s * interval '1 second') ->> 'rn' AS rn",
                                (Jsonb({"label": label}), delay))[0]["rn"])
        wait_for(lambda: len(started) == 3)
        for rn in rns:
            task = client.get(rn)
            leased_at = ts(next(h for h in task["history"] if h["_typ"] == "TaskAssignment")["time"])
            late = (leased_at - ts(task["run_at"])).total_seconds()
            assert 0 <= late < 0.1, (rn, late)
    finally:
        for r in running:
            r.stop()


def test_a_retry_wakes_idle_workers_when_it_comes_due(dsn, client):
    attempts: list[float] = []

    def handler(ctx: TaskContext) -> None:
        attempts.append(time.monotonic())
        if len(attempts) == 1:
            raise Retry(in_=0.5)

    running = Worker(dsn, "wake", handler, poll_interval=30).start()
    try:
        running.wait_idle(timeout=30)
        rn = client.submit("wake", {})["rn"]
        wait_for(lambda: status(client, rn) == "completed")
        task = client.get(rn)
        second = ts([h for h in task["history"] if h["_typ"] == "TaskAssignment"][-1]["time"])
        assert 0 <= (second - ts(task["run_at"])).total_seconds() < 0.1
    finally:
        running.stop()


def test_a_paused_queue_stops_a_running_worker_within_one_lease_cycle(dsn, db, client):
    ran: list[str] = []
    running = Worker(dsn, "pz", lambda ctx: ran.append(ctx.rn), poll_interval=0.2).start()
    try:
        running.wait_idle(timeout=30)
        db.call("pause_queue", queue="pz", note="test")
        rns = [t["rn"] for t in client.submit_many("pz", [{"i": i} for i in range(3)])]
        polls = running.worker.polls
        wait_for(lambda: running.worker.polls >= polls + 3)  # woken by the submit, then polling: nothing
        assert ran == [] and {status(client, rn) for rn in rns} == {"ready"}
        db.call("resume_queue", queue="pz")
        wait_for(lambda: all(status(client, rn) == "completed" for rn in rns))
    finally:
        running.stop()


def test_failures_are_recorded_in_batches_and_one_the_database_refuses_fails_alone(dsn, conn, client):
    """Failures are batched like completions (fail_tasks, not one call per task); when the
    database refuses one failure's error, the others are recorded all the same."""
    conn.execute(f"ALTER DATABASE \"{conn.info.dbname}\" SET track_functions = 'all'")
    conn.execute("UPDATE pyscheduler.settings SET value = '1500' WHERE name = 'task_max_errors_bytes'")
    seen: set[str] = set()
    lock = threading.Lock()

    def handler(ctx: TaskContext) -> None:
        with lock:
            first = ctx.rn not in seen
            seen.add(ctx.rn)
        if first:
            raise Retry(in_=0, description="x" * (3000 if ctx.spec["i"] == 7 else 10))

    rns = [t["rn"] for t in client.submit_many("batch", [{"i": i} for i in range(300)])]
    running = Worker(dsn, "batch", handler, capacity=4, poll_interval=5).start()
    try:
        wait_for(lambda: running.worker.completed == 300, timeout=60)
        assert running.worker.failed == 300
    finally:
        running.stop()
    poison = client.get(rns[7])
    assert poison["status"] == "completed" and poison["errors"][0]["args"]["refused"]  # a short error instead
    assert all(len(client.get(rn)["errors"]) == 1 for rn in rns[:20])
    def calls() -> dict[str, int]:  # the worker's backends report their counts when they exit
        return {r["funcname"]: r["calls"] for r in conn.execute(
            "SELECT funcname, calls FROM pg_stat_user_functions WHERE funcname IN ('fail_tasks', 'fail_task')")}

    counted = wait_for(lambda: (c := calls()).get("fail_tasks") and c)
    assert counted["fail_tasks"] < 100, counted  # 300 failures in fewer calls
