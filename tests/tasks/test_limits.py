"""The bounds Python checks before a round trip (pyscheduler/tasks/sqlapi.py) are the SQL's: at
each bound the SQL function accepts the value, at bound + 1 it refuses it with its SQLSTATE when
Python's check is bypassed, and Python refuses bound + 1 itself where it checks."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest

from pyscheduler.db import Jsonb
from pyscheduler.errors import InvalidArgument, SchedulerError
from pyscheduler.tasks import Retry, Snooze, TaskClient, Worker
from pyscheduler.tasks import sqlapi as sql

US = timedelta(microseconds=1)


def refused(call) -> str | None:
    """The SQLSTATE ``call()`` was refused with; None when it was accepted."""
    try:
        call()
    except SchedulerError as exc:
        return exc.sqlstate
    return None


def leased(db, queue: str = "lim") -> dict:
    db.call(sql.SUBMIT_TASK, queue=queue, spec=Jsonb({}))
    return db.call_value(sql.LEASE_TASK, queue=queue, worker="w", timeout=timedelta(seconds=60))


def test_priority(tx):
    submit = lambda p: lambda: tx.call(sql.SUBMIT_TASK, queue="lim", spec=Jsonb({}), priority=p)  # noqa: E731
    assert refused(submit(sql.MAX_PRIORITY)) is None
    assert refused(submit(sql.MAX_PRIORITY + 1)) == "PS204"
    with pytest.raises(InvalidArgument):
        TaskClient(tx).submit("lim", {}, sql.MAX_PRIORITY + 1)


def test_attempts(tx):
    submit = lambda n: lambda: tx.call(sql.SUBMIT_TASK, queue="lim", spec=Jsonb({}), max_attempts=n)  # noqa: E731
    assert refused(submit(sql.MAX_ATTEMPTS)) is None
    assert refused(submit(sql.MAX_ATTEMPTS + 1)) == "PS208"
    with pytest.raises(InvalidArgument):
        TaskClient(tx).submit("lim", {}, max_attempts=sql.MAX_ATTEMPTS + 1)


def test_queue_bytes(db, dsn):
    lease = lambda q: lambda: db.call(sql.LEASE_TASKS_LEAN, queue=q, worker="w", n=1)  # noqa: E731
    assert refused(lease("é" * (sql.MAX_QUEUE_BYTES // 2))) is None
    assert refused(lease("q" * (sql.MAX_QUEUE_BYTES + 1))) == "PS208"
    with pytest.raises(InvalidArgument):
        Worker(dsn, "q" * (sql.MAX_QUEUE_BYTES + 1), lambda ctx: None)


def test_lease(db, dsn):
    lease = lambda t: lambda: db.call(sql.LEASE_TASKS_LEAN, queue="lim", worker="w", n=1, timeout=t)  # noqa: E731
    assert refused(lease(sql.MAX_LEASE)) is None
    assert refused(lease(sql.MAX_LEASE + US)) == "PS208"
    with pytest.raises(InvalidArgument):
        Worker(dsn, "lim", lambda ctx: None, timeout=(sql.MAX_LEASE + US).total_seconds())


def test_retry_in(tx):
    for bound, expected in ((sql.MAX_RETRY_IN, None), (sql.MAX_RETRY_IN + US, "PS212")):
        task = leased(tx)
        assert refused(lambda: tx.call(sql.FAIL_TASK, rn=task["rn"], token=task["token"],
                                       error=Jsonb({"code": "x"}), retry_in=bound)) == expected
        task = leased(tx)
        assert refused(lambda: tx.call(sql.YIELD_TASK, rn=task["rn"], token=task["token"], run_in=bound)) == expected
    for outcome in (Retry, Snooze):
        assert outcome(sql.MAX_RETRY_IN).in_ == sql.MAX_RETRY_IN
        with pytest.raises(InvalidArgument):
            outcome(sql.MAX_RETRY_IN + US)


def test_progress(tx):
    task = leased(tx)
    beat = lambda p: lambda: tx.call(sql.HEARTBEAT_TASK, rn=task["rn"], token=task["token"], progress=p)  # noqa: E731
    assert refused(beat(sql.MAX_PROGRESS)) is None
    assert refused(beat(math.nextafter(sql.MAX_PROGRESS, 2))) == "PS205"


def test_queue_limit(tx):
    for fn, arg in ((sql.SET_QUEUE_LIMITS, "running_per_key"), (sql.SET_QUEUE_LIMITS, "running_total"),
                    (sql.SET_RATE_LIMIT, "starts")):
        assert refused(lambda: tx.call(fn, queue="lim", **{arg: sql.MAX_QUEUE_LIMIT})) is None
        assert refused(lambda: tx.call(fn, queue="lim", **{arg: sql.MAX_QUEUE_LIMIT + 1})) == "PS216"
        with pytest.raises(InvalidArgument):
            getattr(TaskClient(tx), str(fn))("lim", **{arg: sql.MAX_QUEUE_LIMIT + 1})


def test_requeue(tx):
    requeue = lambda n: lambda: tx.call(sql.RETRY_TASKS, queue="lim", max_tasks=n)  # noqa: E731
    assert refused(requeue(sql.MAX_REQUEUE)) is None
    assert refused(requeue(sql.MAX_REQUEUE + 1)) == "PS208"
    with pytest.raises(InvalidArgument):
        TaskClient(tx).retry_many("lim", limit=sql.MAX_REQUEUE + 1)


def test_every_bound_has_its_test():
    bounds = {name.removeprefix("MAX_").lower() for name in vars(sql) if name.startswith("MAX_")}
    tested = {name.removeprefix("test_") for name in globals() if name.startswith("test_")}
    assert bounds <= tested, bounds - tested


def test_bulk(tx):
    ids = lambda n: [f"00000000-0000-7000-8000-{i:012x}" for i in range(n)]  # noqa: E731
    for fn in (sql.DELETE_TASKS, sql.RUN_TASKS_NOW):
        assert refused(lambda: tx.call(fn, rns=ids(sql.MAX_BULK))) is None  # unknown ids: none acted on
        assert refused(lambda: tx.call(fn, rns=ids(sql.MAX_BULK + 1))) == "PS208"
    for many in (TaskClient(tx).delete_many, TaskClient(tx).run_now):
        with pytest.raises(InvalidArgument, match="at most 1000 task ids"):
            many(ids(sql.MAX_BULK + 1))
