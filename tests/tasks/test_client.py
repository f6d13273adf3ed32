"""TaskClient and AsyncTaskClient: typed results, and transactional enqueue on the application's
own connection or cursor (the task exists only if the application's transaction commits)."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import threading
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from psycopg.rows import namedtuple_row, tuple_row

from pyscheduler.db import Jsonb, Session
from pyscheduler.errors import InvalidArgument, TaskFinished, TaskNotFound, TaskNotRequeueable
from pyscheduler.tasks import AsyncTaskClient, Task, TaskClient, TaskContext, Worker
from pyscheduler.tasks.client import HistoryEntry, QueueState, TaskError
from tests.support import wait_for

# A session as unlike pyscheduler's as PostgreSQL allows: psycopg's text loaders cannot
# read these DateStyle and IntervalStyle values, and the TimeZone has daylight saving.
ODD = "-c DateStyle=German,DMY -c IntervalStyle=iso_8601 -c TimeZone=America/New_York"


def odd_connection(dsn: str, **kwargs) -> psycopg.Connection:
    return psycopg.connect(dsn, options=ODD, **kwargs)


def settings_of(conn) -> tuple:
    with psycopg.Cursor(conn) as cur:
        return tuple(cur.execute("SELECT current_setting('DateStyle') AS d, current_setting('IntervalStyle') AS i, "
                                 "current_setting('TimeZone') AS t").fetchone())


class Seen:
    """A worker handler that records the spec of every task it runs."""

    def __init__(self) -> None:
        self.specs: list[dict] = []
        self.lock = threading.Lock()

    def __call__(self, ctx: TaskContext) -> None:
        with self.lock:
            self.specs.append(ctx.spec)


@pytest.fixture
def worker(dsn):
    """A worker on queue 'app' recording what it runs (``seen.specs``; ``seen.worker.polls``
    counts its lease calls)."""
    seen = Seen()
    running = Worker(dsn, "app", seen, timeout=5, capacity=1).start()
    running.wait_idle(30)
    seen.worker = running.worker
    yield seen
    running.stop()


@pytest.mark.slow
def test_a_task_submitted_in_a_rolled_back_transaction_never_exists_and_never_runs(dsn, db, worker):
    with psycopg.connect(dsn) as conn:  # not autocommit: the submit opens the application's transaction
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY)")
        conn.commit()
        conn.execute("INSERT INTO orders VALUES (1)")
        task = TaskClient(conn).submit("app", {"order": 1})
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS  # nothing committed
        conn.rollback()
    with pytest.raises(TaskNotFound):
        TaskClient(db).get(task.rn)
    TaskClient(db).submit("app", {"order": "sentinel"})  # leased after any older task of the queue
    wait_for(lambda: worker.specs, timeout=30)
    assert worker.specs == [{"order": "sentinel"}]
    assert TaskClient(db).list("app", status="ready") == []


@pytest.mark.slow
def test_a_task_submitted_in_a_transaction_is_leased_only_once_it_commits(dsn, db, worker):
    TaskClient(db).submit("app", {"order": "before"})
    wait_for(lambda: worker.specs, timeout=30)
    with psycopg.connect(dsn) as conn:
        with conn.transaction():
            task = TaskClient(conn.cursor()).submit("app", {"order": 2}, priority=90)  # on a cursor
            polls = worker.worker.polls
            wait_for(lambda: worker.worker.polls >= polls + 2, timeout=30)  # two lease calls since
            assert worker.specs == [{"order": "before"}]  # the uncommitted task is invisible to them
            assert TaskClient(conn).get(task.rn).status == "ready"  # ... but not in its own transaction
        wait_for(lambda: len(worker.specs) == 2, timeout=30)
    assert worker.specs[1] == {"order": 2}
    wait_for(lambda: TaskClient(db).get(task.rn).status == "completed", timeout=30)


def test_an_open_application_transaction_neither_blocks_nor_silences_other_submitters(dsn, db):
    """The NOTIFY throttle's row lock is not taken inside an application's transaction: a
    submit elsewhere neither waits for that transaction (it used to, on the throttle slot's
    insert, until its statement timeout) nor skips its own notification (it used to, counting
    on the open transaction's, which a rollback never sends)."""
    notes: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as listen:
        listen.execute("LISTEN \"pyscheduler_tasks:blocked\"")
        with psycopg.connect(dsn) as conn:
            TaskClient(conn).submit("blocked", {"order": 1})  # the transaction stays open
            with psycopg.connect(dsn, autocommit=True, options="-c statement_timeout=3000") as other:
                TaskClient(other).submit("blocked", {"order": 2})  # committed at once
            notes += [n.channel for n in listen.notifies(timeout=5, stop_after=1)]
            conn.rollback()
    assert notes == ["pyscheduler_tasks:blocked"]


def test_calls_on_the_callers_connection_leave_its_settings_and_return_typed_results(dsn, db):
    with odd_connection(dsn, row_factory=namedtuple_row, cursor_factory=psycopg.ClientCursor) as conn:
        before = settings_of(conn)
        client = TaskClient(conn)
        task = client.submit("odd", {"a": [1, 2.5, None], "b": "ü"}, priority=4_294_967_295)
        many = client.submit_many("odd", [{"i": 1}, {"i": 2}], priority=0)
        listed = client.list("odd", status="ready", limit=10)
        cancelled = client.cancel(many[0].rn)
        assert settings_of(conn) == before
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        conn.commit()
    assert [t.rn for t in listed] == [many[1].rn, many[0].rn, task.rn]  # newest first
    assert cancelled.status == "cancelled" and cancelled.rn == many[0].rn
    for mine in (task, *many):
        assert mine.created.tzinfo is timezone.utc and mine.updated.tzinfo is timezone.utc
    ours = TaskClient(db).get(task.rn)  # pyscheduler's own pool, its pinned settings
    assert ours == task and ours.json == task.json
    assert (task.queue, task.spec, task.priority, task.status, task.progress) == (
        "odd", {"a": [1, 2.5, None], "b": "ü"}, 4_294_967_295, "ready", 0.0)


def test_the_typed_task_round_trips_every_field(tx):
    """Every key get_task returns is a field of Task (and "deduplicated", which only a submit's
    answer has, and "redacted", which only another role's task has), loaded to its Python type."""
    rn = TaskClient(tx).submit("rt", {"k": {"nested": [1, "x"]}}, priority=7, unique_key="rt:1", max_attempts=3).rn
    leased = tx.call_value("lease_task", queue="rt", worker="w-1", timeout=timedelta(seconds=30))
    tx.call("heartbeat_task", rn=rn, token=leased["token"], progress=0.25, timeout=timedelta(seconds=30))
    tx.call("abort_task", rn=rn, token=leased["token"],
            errors=Jsonb([{"code": "bad", "args": {"why": 1}, "description": "no"}]))
    task = TaskClient(tx).get(rn)
    raw = tx.call_value("get_task", rn=rn)
    renamed = {"output": "result"}  # Task.output is the JSON's "result" (a TaskHandle's result() waits for it)
    # deduplicated (a submit's answer), redacted (another role's) and awaiting (a suspended task's)
    # are keys only some answers have
    assert {renamed.get(f.name, f.name) for f in dataclasses.fields(Task)} - {"json", "deduplicated", "redacted",
                                                                          "awaiting"} \
        == set(raw), \
        "Task misses or adds a field"
    assert (task.rn, task.queue, task.spec, task.priority, task.status, task.progress, task.owner) == (
        rn, "rt", {"k": {"nested": [1, "x"]}}, 7, "aborted", 0.25, "w-1")
    assert (task.attempts, task.max_attempts, task.unique_key, task.run_at, task.deduplicated) == (
        1, 3, "rt:1", None, False)
    assert task.submitted_by == tx.query("SELECT current_user AS u")[0]["u"]
    assert task.errors == [TaskError("bad", "no", {"why": 1})]
    assert task.deadline is None and task.created <= task.updated
    assert [(h.type, h.worker) for h in task.history] == [("TaskAssignment", "w-1")]
    assert isinstance(task.history[0], HistoryEntry) and task.history[0].time.tzinfo is timezone.utc
    assert task["errors"] == raw["errors"] and task["created"].endswith("Z")  # the seed's JSON shape
    with pytest.raises(TaskFinished):
        TaskClient(tx).cancel(rn)


def test_bad_arguments_are_refused_naming_the_field_before_any_round_trip(dsn):
    conn = psycopg.connect(dsn)
    conn.close()  # any round trip would fail with DatabaseUnavailable
    client = TaskClient(conn)
    for call, field in ((lambda: client.submit("q", {"x": math.nan}), "spec"),
                        (lambda: client.submit("q", {"x": "a\x00b"}), "spec"),
                        (lambda: client.submit("q", ["not", "an", "object"]), "spec"),
                        (lambda: client.submit("q", {}, priority=2**32), "priority"),
                        (lambda: client.submit("q", {}, priority=True), "priority"),
                        (lambda: client.submit("q\x00", {}), "queue"),
                        (lambda: client.submit_many("q", [{}, {"x": math.inf}]), "specs[1]"),
                        (lambda: client.get("not-a-uuid"), "rn"),
                        (lambda: client.list(status="done"), "status"),
                        (lambda: client.list(limit=0), "limit"),
                        (lambda: client.submit("q", {}, run_at=datetime(2030, 1, 1)), "run_at"),
                        (lambda: client.submit("q", {}, run_at=datetime(9999, 6, 1, tzinfo=timezone.utc)), "run_at"),
                        (lambda: client.submit("q", {}, run_at=3600), "run_at"),  # type: ignore[arg-type]
                        (lambda: client.submit("q", {}, unique_key="k\x00"), "unique_key"),
                        (lambda: client.submit("q", {}, max_attempts=0), "max_attempts"),
                        (lambda: client.submit_many("q", [{}, {}], unique_keys=["a"]), "unique_keys"),
                        (lambda: client.retry_many("q", status="completed"), "status"),  # type: ignore[arg-type]
                        (lambda: client.retry_many("q", limit=10_001), "limit"),
                        (lambda: client.pause_queue("q", note="\ud800"), "note")):
        with pytest.raises(InvalidArgument, match=field.replace("[", r"\[")):
            call()


def test_a_refused_call_leaves_the_application_transaction_failed_for_it_to_roll_back(dsn, db):
    with psycopg.connect(dsn) as conn:
        client = TaskClient(conn)
        with pytest.raises(TaskNotFound):
            client.get("00000000-0000-0000-0000-000000000000")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        conn.rollback()
        rn = client.submit("after", {}).rn  # the connection goes on after the rollback
        conn.commit()
    assert TaskClient(db).get(rn).status == "ready"


def test_a_session_on_an_autocommit_connection_commits_each_call_itself(dsn, db):
    with psycopg.connect(dsn, autocommit=True, row_factory=tuple_row) as conn:
        rn = TaskClient(Session.borrow(conn)).submit("auto", {}).rn
    assert TaskClient(db).get(rn).queue == "auto"


@pytest.mark.slow
def test_the_async_client_enqueues_in_the_applications_transaction(dsn, db, worker):
    async def scenario() -> tuple[Task, Task]:
        aconn = await psycopg.AsyncConnection.connect(dsn, options=ODD, row_factory=tuple_row)
        async with aconn:
            client = AsyncTaskClient(aconn)
            dropped = await client.submit("app", {"order": "rolled back"})
            await aconn.rollback()
            async with aconn.transaction():
                kept = await AsyncTaskClient(aconn.cursor()).submit("app", {"order": "committed"})
                got = await client.get(kept.rn)
                assert got == kept and got.created.tzinfo is timezone.utc
                assert [t.rn for t in await client.list("app")] == [kept.rn]
            many = await client.submit_many("other", [{"i": 1}])
            assert (await client.cancel(many[0].rn)).status == "cancelled"
            await aconn.commit()
        return dropped, kept

    dropped, kept = asyncio.run(scenario())
    wait_for(lambda: TaskClient(db).get(kept.rn).status == "completed", timeout=30)
    with pytest.raises(TaskNotFound):
        TaskClient(db).get(dropped.rn)
    assert worker.specs == [{"order": "committed"}]


def test_the_async_client_refuses_what_is_not_an_async_connection(dsn):
    with psycopg.connect(dsn) as conn:
        with pytest.raises(TypeError, match="AsyncConnection"):
            AsyncTaskClient(conn)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="Connection or Cursor"):
            TaskClient("dsn")  # type: ignore[arg-type]


def test_the_job_queue_through_the_typed_client(dsn, db):
    """Later (an instant, or a delay by the database clock), once per unique key, requeue, pause:
    each call of the client answers what the SQL did, typed."""
    client = TaskClient(db)
    now = db.query("SELECT now() AS t")[0]["t"]
    later = client.submit("jq", {"n": 1}, run_at=now + timedelta(hours=1), max_attempts=2)
    assert (later.status, later.run_at, later.max_attempts) == ("scheduled", now + timedelta(hours=1), 2)
    soon = client.submit("jq", {"n": 2}, run_at=timedelta(minutes=5))
    assert soon.status == "scheduled" and timedelta(minutes=4) < soon.run_at - now < timedelta(minutes=6)
    first = client.submit("jq", {"n": 3}, unique_key="invoice:1")
    again = client.submit("jq", {"n": 4}, unique_key="invoice:1")
    assert (again.rn, again.deduplicated, again.spec, first.deduplicated) == (first.rn, True, {"n": 3}, False)
    batch = client.submit_many("jq", [{"n": 5}, {"n": 6}], unique_keys=["invoice:1", None])
    assert [(t.rn == first.rn, t.deduplicated) for t in batch] == [(True, True), (False, False)]

    assert client.cancel(first.rn).status == "cancelled"
    with pytest.raises(TaskNotRequeueable):
        client.retry(soon.rn)  # scheduled: live, not requeueable
    requeued = client.retry(first.rn)
    assert (requeued.status, requeued.attempts, requeued.history[-1].type) == ("ready", 0, "TaskRequeued")
    assert client.cancel(batch[1].rn).status == "cancelled"
    assert [t.rn for t in client.retry_many("jq", "cancelled")] == [batch[1].rn]

    paused = client.pause_queue("jq", note="provider down")
    assert paused == QueueState("jq", True, "provider down", paused.paused_by, paused.updated) and paused.paused_by
    assert db.call_value("lease_task", queue="jq", worker="w", timeout=timedelta(seconds=5)) is None
    resumed = client.resume_queue("jq")
    assert (resumed.paused, resumed.note) == (False, None)
    assert db.call_value("lease_task", queue="jq", worker="w", timeout=timedelta(seconds=5))["rn"] == str(first.rn)


def test_the_async_client_has_the_job_queue_calls(dsn, db):
    async def scenario() -> Task:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            client = AsyncTaskClient(aconn)
            task = await client.submit("ajq", {"n": 1}, run_at=timedelta(seconds=30), unique_key="k")
            assert (await client.submit("ajq", {"n": 2}, unique_key="k")).deduplicated
            assert (await client.pause_queue("ajq")).paused and not (await client.resume_queue("ajq")).paused
            await client.cancel(task.rn)
            assert [t.rn for t in await client.retry_many("ajq", "cancelled")] == [task.rn]
            await client.cancel(task.rn)
            return await client.retry(task.rn)

    assert asyncio.run(scenario()).status == "ready"
