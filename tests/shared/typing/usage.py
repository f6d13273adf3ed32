"""How an application uses the clients, type-checked with mypy --strict (tests/shared/test_typing.py).
Never run: it only has to type-check."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from uuid import UUID

import psycopg

from pyscheduler.checks import AddedCheck, AsyncCheckClient, Check, CheckClient, EndedCheck
from pyscheduler.db import Database
from pyscheduler.delay import DelayProducer, DeliveryFailed
from pyscheduler.errors import SchedulerError, TaskNotFound
from pyscheduler.schedules import UNBOUNDED, AsyncScheduleClient, Schedule, ScheduleClient, ScheduleRun
from pyscheduler.tasks import (AsyncTaskClient, QueueLimits, Task, TaskApp, TaskClient, TaskHandle, Workflow,
                               current_context)
from pyscheduler.tasks.app import TaskAppWorker
from pyscheduler.tasks.periodic import SyncReport
from pyscheduler.tasks.worker.drain import Drained
from pyscheduler.tasks.client import HistoryEntry, TaskError, TaskStatus


def tasks(db: Database, conn: psycopg.Connection[tuple[object, ...]]) -> None:
    task: Task = TaskClient(db).submit("emails", {"to": "a@example.com"}, priority=80)
    rn: UUID = task.rn
    created: datetime = task.created
    deadline: datetime | None = task.deadline
    errors: list[TaskError] = task.errors
    history: list[HistoryEntry] = task.history
    status: TaskStatus = task.status
    with conn.transaction():
        conn.execute("INSERT INTO orders VALUES (1)")
        mine: Task = TaskClient(conn).submit("orders", {"order": 1})
        many: list[Task] = TaskClient(conn.cursor()).submit_many("orders", [{"i": 1}, {"i": 2}])
    ready: list[Task] = TaskClient(db).list(queue="orders", status="ready", limit=10)
    try:
        TaskClient(db).cancel(rn)
    except TaskNotFound:
        pass
    print(created, deadline, errors, history, status, mine.spec, many, ready)


async def tasks_async(aconn: psycopg.AsyncConnection[dict[str, object]]) -> Task:
    async with aconn.transaction():
        task = await AsyncTaskClient(aconn).submit("orders", {"order": 2})
    got: Task = await AsyncTaskClient(aconn.cursor()).get(task.rn)
    return got


def schedules(db: Database) -> None:
    client = ScheduleClient(db)
    s: Schedule = client.create("nightly", "reports", cron="0 3 * * *", tz="Europe/Berlin", target_kind="kafka",
                                payload={"report": "daily"}, retry_base=timedelta(milliseconds=250),
                                start_at=datetime(2030, 1, 1, tzinfo=timezone.utc))
    every: timedelta | None = s.every
    target: str | None = s.target  # None: another role's schedule
    s = client.update("nightly", every=timedelta(hours=1), end_at=UNBOUNDED, max_runs=UNBOUNDED)
    client.pause("nightly", note="migration")
    client.resume("nightly")
    client.trigger("nightly")
    runs: list[ScheduleRun] = client.runs("nightly", outcome="failed", limit=5)
    upcoming: list[datetime] = client.next("nightly", 3)
    fired: int = client.count("nightly", "fired")
    listed: list[Schedule] = client.list(name_like="night%", target_kind="kafka", paused=False)
    deleted: bool = client.delete("nightly")
    print(every, target, runs, upcoming, fired, listed, deleted)


async def schedules_async(aconn: psycopg.AsyncConnection[dict[str, object]]) -> Schedule:
    return await AsyncScheduleClient(aconn).get("nightly")


def checks(db: Database) -> None:
    client = CheckClient(db)
    added: AddedCheck = client.add("order", "233", "app.order_alert", check_after=timedelta(hours=3),
                                   payload={"escalate_after": "1 hour"}, max_checks=2)
    slot: datetime = added.next_check_at
    pending: list[Check] = client.list(entity_name="order")
    ended: list[EndedCheck] = client.history(entity_name="order", limit=10)
    took: timedelta = ended[0].total_took
    n: int = client.delete("order", "233")
    print(slot, pending, took, n)


async def checks_async(aconn: psycopg.AsyncConnection[dict[str, object]]) -> AddedCheck:
    return await AsyncCheckClient(aconn).add("order", "1", "q", kind="task", check_after=timedelta(hours=1))


def delay(bootstrap: str) -> None:
    with DelayProducer(bootstrap, "pyscheduler.delay.input", **{"linger.ms": 5}) as producer:
        ident: str = producer.send(b'{"order": 42}', key=b"42", delay=timedelta(minutes=5),
                                   headers=[("trace", b"abc")])
        producer.send("text", deadline=datetime(2030, 1, 1, tzinfo=timezone.utc), message_id=ident + "-2")
    try:
        producer.flush(5)
    except DeliveryFailed as exc:
        failed: list[tuple[str, str]] = exc.failed
        print(failed, exc.pending)
    except SchedulerError:
        raise


def flow(db: Database) -> None:
    """Issue 20: handles, results, workflows, limits."""
    client = TaskClient(db)
    handle: TaskHandle = client.submit("q", {}, concurrency_key="k")
    task: Task = handle
    value: object = handle.result(timeout=1.0)
    flow_ = Workflow().add("a", "q", {}).add("b", "q", {}, after=["a"])
    handles: dict[str, TaskHandle] = client.submit_workflow(flow_)
    limits: QueueLimits = client.set_queue_limits("q", running_per_key=1)
    print(task, value, handles, limits)


def task_functions(db: Database, conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """Issue 29: task functions keep their signature; submit is typed from it (ParamSpec)."""
    app = TaskApp(db)

    @app.task(queue="emails", max_attempts=5, unique_key=lambda to, **_: f"mail:{to}")
    def send_email(to: str, template: str = "welcome") -> dict[str, bool]:
        return {"sent": True}

    @app.task
    async def fetch(url: str) -> int:
        return len(url)

    @app.periodic(every=timedelta(minutes=5), args={"kind": "daily"})
    @app.task(queue="digests", name="digest")
    def digest(kind: str) -> None:
        pass

    handle: TaskHandle = send_email.submit(to="a@example.com")
    positional: TaskHandle = send_email.submit("a@example.com", "news")
    many: list[TaskHandle] = send_email.submit_many([{"to": "b@example.com"}])
    later: TaskHandle = send_email.options(run_at=timedelta(minutes=5), after=[handle], conn=conn).submit(to="c")
    here: dict[str, bool] = send_email("d@example.com")
    pending: TaskHandle = fetch.submit(url="/")
    report: SyncReport = app.sync_schedules()
    worker: TaskAppWorker = app.worker(queues=["emails"], capacity=4, timeout=30.0)
    drained: list[Drained] = app.drain(max_tasks=10)
    with app.testing("inline"):
        result: object = send_email.submit(to="e").result()
    print(positional, many, later, here, pending, report, worker, drained, result, digest, current_context)
