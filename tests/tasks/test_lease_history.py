"""Leased tasks, cheaper leases: a lease writes no history entry, yet every
reader sees exactly the history of before; tokens per task and per lease; time-ordered
ids; migration 0010 keeps the tasks of an older schema working."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from pyscheduler import errors, migrate
from pyscheduler.db import Database, Jsonb

T0 = datetime.fromisoformat("2030-01-01T00:00:00+00:00")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def ts(seconds: float) -> str:
    """A time as tasks JSON writes it."""
    return at(seconds).astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def entry(typ: str, worker: str, seconds: float, progress: float | None = None) -> dict:
    e = {"_typ": typ, "worker": worker, "time": ts(seconds)}
    return e if progress is None else {**e, "progress": progress}


def private(db, fn, now, **kw):
    rows = db.call(f"_{fn}", p_now=now, **kw)
    return next(iter(rows[0].values())) if rows else None


def lease(db, worker, now, queue="q"):
    task = private(db, "lease_task", now, queue=queue, worker=worker)
    return {"rn": task["rn"], "token": task["token"]}


def seen(db, rn):
    """The task as get_task and list_tasks show it (they must agree)."""
    task = db.call_value("get_task", rn=rn)
    listed = [r["task"] for r in db.call("list_tasks", max_tasks=1000) if r["task"]["rn"] == rn]
    assert listed == [task]
    return task


def test_history_reads_as_if_every_lease_appended_its_entry(tx):
    rn = private(tx, "submit_task", at(0), queue="q", spec=Jsonb({}))["rn"]
    h = lease(tx, "w1", at(1))
    expected = [entry("TaskAssignment", "w1", 1)]
    assert seen(tx, rn)["history"] == expected
    private(tx, "heartbeat_task", at(2), **h, progress=0.25)
    assert seen(tx, rn)["history"] == expected
    reset = [r["task"] for r in tx.call("_reset_expired_tasks", p_now=at(20))]
    expected.append(entry("TaskTimeout", "w1", 20, 0.25))
    assert [t["history"] for t in reset] == [expected] == [seen(tx, rn)["history"]]

    h = lease(tx, "w2", at(21))
    expected.append(entry("TaskAssignment", "w2", 21))
    assert seen(tx, rn)["history"] == expected
    assert private(tx, "yield_task", at(22), **h)["history"] == expected + [entry("TaskYield", "w2", 22, 0.0)]
    expected.append(entry("TaskYield", "w2", 22, 0.0))
    tx.call("_reset_expired_tasks", p_now=at(23))  # a yielded lease: no TaskTimeout
    assert seen(tx, rn)["history"] == expected

    h = lease(tx, "w3", at(24))
    expected.append(entry("TaskAssignment", "w3", 24))
    cancelled = private(tx, "cancel_task", at(25), rn=rn)
    expected.append({"_typ": "TaskCancelled", "by": tx.execute("SELECT current_user AS u").fetchone()["u"],
                     "time": "2030-01-01T00:00:25.000000Z"})  # who cancelled it, after its lease
    assert cancelled["status"] == "cancelled" and cancelled["history"] == expected == seen(tx, rn)["history"]
    with pytest.raises(errors.TaskCancelled):
        tx.call("complete_task", **h)

    other = private(tx, "submit_task", at(30), queue="q", spec=Jsonb({}))["rn"]
    h = lease(tx, "w4", at(31))
    assert h["rn"] == other
    done = private(tx, "complete_task", at(32), **h)
    assert done["status"] == "completed" and done["history"] == [entry("TaskAssignment", "w4", 31)]
    assert seen(tx, other)["history"] == done["history"]


def test_batch_leases_and_yields_keep_the_history(tx):
    tx.call("_submit_tasks", queue="b", specs=Jsonb([{"i": i} for i in range(5)]), p_now=at(0))
    rows = [r["task"] for r in tx.call("_lease_tasks", queue="b", worker="wb", n=5, p_now=at(1))]
    assert all(t["history"] == [entry("TaskAssignment", "wb", 1)] for t in rows)
    refused = tx.call("_yield_tasks", rns=[t["rn"] for t in rows], tokens=[t["token"] for t in rows], p_now=at(2))
    assert refused == []
    for t in rows:
        assert seen(tx, t["rn"])["history"] == [entry("TaskAssignment", "wb", 1), entry("TaskYield", "wb", 2, 0.0)]
    tx.call("_reset_expired_tasks", p_now=at(3))
    lean = tx.call("_lease_tasks_lean", queue="b", worker="wc", n=5, p_now=at(4))
    assert len(lean) == 5
    for r in lean:
        assert seen(tx, str(r["rn"]))["history"][-1] == entry("TaskAssignment", "wc", 4)
        assert len(seen(tx, str(r["rn"]))["history"]) == 3


def test_every_lease_gets_its_own_token(tx):
    tx.call("submit_tasks", queue="t", specs=Jsonb([{"i": i} for i in range(50)]))
    first = [r["task"] for r in tx.call("_lease_tasks", queue="t", worker="w1", n=50, p_now=at(0))]
    tokens = {t["token"] for t in first}
    assert len(tokens) == 50 and not tokens & {t["rn"] for t in first}
    tx.call("_reset_expired_tasks", p_now=at(60))
    again = [r["task"] for r in tx.call("_lease_tasks", queue="t", worker="w2", n=50, p_now=at(61))]
    assert len(again) == 50 and not tokens & {t["token"] for t in again}
    refused = tx.call("complete_tasks", rns=[t["rn"] for t in first], tokens=[t["token"] for t in first])
    assert {r["sqlstate"] for r in refused} == {"PS201"} and len(refused) == 50


def test_ids_follow_submission_order(tx):
    many = [r["task"]["rn"] for r in tx.call("submit_tasks", queue="o", specs=Jsonb([{"i": i} for i in range(300)]))]
    one = tx.call_value("submit_task", queue="o", spec=Jsonb({}))["rn"]
    ids = [uuid.UUID(rn) for rn in many + [one]]
    assert len(set(ids)) == 301 and ids == sorted(ids)  # sorted as the primary key sorts them
    assert {i.version for i in ids} == {7}


def test_migration_0010_keeps_the_tasks_of_an_older_schema(empty_dsn):
    """Rows written by the 0009 schema (history holding every TaskAssignment entry) read
    exactly as before, and a running task's holder completes it with its old token."""
    from yoyo import get_backend

    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute("CREATE SCHEMA pyscheduler")
    backend = get_backend(migrate.yoyo_uri(empty_dsn), migration_table=migrate.MIGRATION_TABLE)
    known = migrate._migrations()
    backend.apply_migrations_only(backend.to_apply(known[:[m.id for m in known].index("0010_tasks_lean")]))
    backend.connection.close()
    a1, t5, a6 = entry("TaskAssignment", "w1", 1), entry("TaskTimeout", "w1", 5, 0.5), entry("TaskAssignment", "w2", 6)
    running, done, ready, old = uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    token, old_token = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        insert = ("INSERT INTO pyscheduler.tasks (rn, queue, spec, priority, status, progress, created, updated,"
                  " errors, owner, deadline, history, lease_token, attempts)"
                  " VALUES (%s, 'm', '{}', 50, %s, %s, %s, %s, '[]', %s, %s, %s, %s, %s)")
        c.execute(insert, (running, "running", 0.5, at(0), at(6), "w2", at(16), Jsonb([a1, t5, a6]), token, 2))
        c.execute(insert, (done, "completed", 1, at(0), at(3), "w1", None, Jsonb([a1]), token, 1))
        c.execute(insert, (ready, "ready", 0, at(0), at(5), None, None, Jsonb([a1, t5]), None, 1))
        c.execute(insert, (old, "running", 0, at(0), at(1), "w1", at(2), Jsonb([a1]), old_token, 1))
    migrate.migrate(empty_dsn)
    with Database(empty_dsn, max_size=2) as db:
        before = {running: [a1, t5, a6], done: [a1], ready: [a1, t5], old: [a1]}
        for rn, history in before.items():
            assert db.call_value("get_task", rn=rn)["history"] == history
        finished = private(db, "complete_task", at(7), rn=running, token=token)
        assert finished["status"] == "completed" and finished["history"] == [a1, t5, a6]
        reset = {r["task"]["rn"]: r["task"] for r in db.call("_reset_expired_tasks", p_now=at(8))}
        assert reset[str(old)]["history"] == [a1, entry("TaskTimeout", "w1", 8, 0.0)]
        leased = {r["task"]["rn"]: r["task"] for r in db.call("_lease_tasks", queue="m", worker="w3", n=5, p_now=at(9))}
        assert set(leased) == {str(ready), str(old)}
        a9 = entry("TaskAssignment", "w3", 9)
        assert leased[str(ready)]["history"] == [a1, t5, a9]
        assert leased[str(old)]["history"] == [a1, entry("TaskTimeout", "w1", 8, 0.0), a9]
        assert db.call_value("get_task", rn=done)["history"] == [a1]
