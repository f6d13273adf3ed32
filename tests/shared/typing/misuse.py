"""Mistakes mypy --strict must catch in code using the clients: each line marked ``# error``
must be reported (tests/shared/test_typing.py), proving the API is typed, not Any."""

from __future__ import annotations

from datetime import timedelta

from pyscheduler.db import Database
from pyscheduler.delay import DelayProducer
from pyscheduler.schedules import ScheduleClient
from pyscheduler.tasks import TaskApp, TaskClient


def mistakes(db: Database) -> None:
    rn: str = TaskClient(db).submit("q", {}).rn  # error
    TaskClient(db).submit("q", {}, prio=1)  # error
    TaskClient(db).list(status="done")  # error
    ScheduleClient(db).create("n", "t", every=60)  # error
    ScheduleClient(db).create("n", "t", target_kind="ftp")  # error
    late: int = ScheduleClient(db).get("n").next_run_at  # error
    DelayProducer("b", "t").send(b"v", delay=5)  # error
    print(rn, late, timedelta)


def task_function_mistakes(app: TaskApp, conn: object) -> None:
    @app.task(queue="emails")
    def send_email(to: str, template: str = "welcome") -> dict[str, bool]:
        return {"sent": True}

    send_email.submit(to=1)  # error
    send_email.submit(too="a@example.com")  # error
    send_email.submit()  # error
    send_email.submit_many([{"to": "a"}], priority=1)  # error
    send_email.options(run_at=300).submit(to="a")  # error
    send_email.submit(to="a", conn=conn)  # error
    sent: str = send_email("a@example.com")  # error
    print(sent)
