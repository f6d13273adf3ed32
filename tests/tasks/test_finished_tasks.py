"""Leased tasks: what every reader (get_task, list_tasks, task_counts, the state machine's
refusals, cancel, cleanup) shows of finished tasks, before and after cleanup and under a
concurrent write (the contract any change to how tasks are stored must keep;
docs/benchmarks.md, "Finished tasks in their own table" measured one)."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

import psycopg
import pytest

from pyscheduler import errors
from pyscheduler.db import Jsonb

T0 = datetime.fromisoformat("2030-01-01T00:00:00+00:00")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def private(db, fn, now, **kw):
    rows = db.call(f"_{fn}", p_now=now, **kw)
    return next(iter(rows[0].values())) if rows else None


def lease(db, now, queue="f", worker="w1"):
    task = private(db, "lease_task", now, queue=queue, worker=worker)
    return {"rn": task["rn"], "token": task["token"]}


def readers(db) -> dict:
    """Everything a client or the monitor reads about tasks."""
    tasks = {t["task"]["rn"]: t["task"] for t in db.call("list_tasks", max_tasks=1000)}
    for rn, task in tasks.items():
        assert db.call_value("get_task", rn=rn) == task
    return {"list": [t["task"] for t in db.call("list_tasks", max_tasks=1000)],
            "by_status": {s: [t["task"]["rn"] for t in db.call("list_tasks", status=s)]
                          for s in ("ready", "running", "completed", "aborted", "cancelled")},
            "by_owner": [t["task"]["rn"] for t in db.call("list_tasks", owner="w1")],
            "counts": sorted((r["queue"], r["status"], r["tasks"]) for r in db.query(
                "SELECT queue, status::text, tasks FROM pyscheduler.task_counts"))}


def every_ending(db) -> dict:
    """One task in every state, each ended the way the seed allows, at times 0..30."""
    rns = [t["task"]["rn"] for t in db.call("_submit_tasks", queue="f", specs=Jsonb([{"i": i} for i in range(7)]),
                                             p_now=at(0))]
    done, aborted, cancelled_running, given_up, running = (lease(db, at(1)) for _ in range(5))
    private(db, "complete_task", at(2), **done)
    private(db, "abort_task", at(3), **aborted, errors=Jsonb([{"code": "bad", "args": {"x": 1}}]))
    private(db, "cancel_task", at(4), rn=cancelled_running["rn"])
    private(db, "cancel_task", at(5), rn=rns[5])  # a ready task
    with db.connection() as conn:
        conn.execute("UPDATE pyscheduler.settings SET value = '1' WHERE name = 'task_max_attempts'")
    private(db, "heartbeat_task", at(6), **running, timeout=timedelta(hours=1))
    aborted_by_monitor = [r["task"] for r in db.call("_reset_expired_tasks", p_now=at(30))]
    assert [t["rn"] for t in aborted_by_monitor] == [given_up["rn"]]
    assert aborted_by_monitor[0]["status"] == "aborted"
    assert aborted_by_monitor[0]["errors"][0]["code"] == "TaskMaxAttempts"
    return {"rns": rns, "done": done, "aborted": aborted, "cancelled_running": cancelled_running,
            "given_up": given_up, "running": running, "cancelled_ready": rns[5], "ready": rns[6]}


def test_finished_tasks_read_as_before_until_cleanup_deletes_them(tx):
    t = every_ending(tx)
    seen = readers(tx)
    # newest first across both tables, as submitted (equal created: by submission order)
    assert [task["rn"] for task in seen["list"]] == list(reversed(t["rns"]))
    assert seen["by_status"] == {
        "ready": [t["ready"]], "running": [t["running"]["rn"]], "completed": [t["done"]["rn"]],
        "aborted": [t["given_up"]["rn"], t["aborted"]["rn"]],
        "cancelled": [t["cancelled_ready"], t["cancelled_running"]["rn"]]}
    assert seen["counts"] == [("f", "aborted", 2), ("f", "cancelled", 2), ("f", "completed", 1),
                              ("f", "ready", 1), ("f", "running", 1)]
    done = tx.call_value("get_task", rn=t["done"]["rn"])
    assert (done["status"], done["progress"], done["owner"], done["deadline"]) == ("completed", 1.0, "w1", None)
    assert [e["_typ"] for e in done["history"]] == ["TaskAssignment"]
    aborted = tx.call_value("get_task", rn=t["aborted"]["rn"])
    assert aborted["errors"] == [{"code": "bad", "args": {"x": 1}, "description": ""}]

    # the state machine answers for finished tasks as before: single and batch writes
    with pytest.raises(errors.TaskNotRunning):
        tx.call("complete_task", **t["done"])
    with pytest.raises(errors.TaskCancelled):
        tx.call("heartbeat_task", **t["cancelled_running"])
    with pytest.raises(errors.TaskNotRunning):
        tx.call("abort_task", **t["given_up"], errors=Jsonb([{"code": "x"}]))
    held = [t["done"], t["cancelled_running"], t["aborted"], t["running"]]
    refused = tx.call("_complete_tasks", rns=[h["rn"] for h in held], tokens=[h["token"] for h in held], p_now=at(8))
    assert sorted((str(r["rn"]), r["sqlstate"]) for r in refused) == sorted(
        [(t["done"]["rn"], "PS202"), (t["cancelled_running"]["rn"], "PS203"), (t["aborted"]["rn"], "PS202")])
    with pytest.raises(errors.TaskFinished):
        tx.call("cancel_task", rn=t["done"]["rn"])
    assert tx.call_value("cancel_task", rn=t["cancelled_ready"]) == tx.call_value("get_task", rn=t["cancelled_ready"])
    seen = readers(tx)  # the running task was completed by the batch: it moved too
    assert seen["by_status"]["completed"] == [t["running"]["rn"], t["done"]["rn"]]

    # cleanup: finished tasks past retention go, in any state; live tasks stay, however old
    private(tx, "heartbeat_task", at(35), **lease(tx, at(34)), timeout=timedelta(hours=1))
    assert tx.call_value("_cleanup_tasks", retention=timedelta(seconds=10), p_now=at(15.5)) == 4  # finished by 5 s
    gone = [t["done"]["rn"], t["aborted"]["rn"], t["cancelled_running"]["rn"], t["cancelled_ready"]]
    for rn in gone:
        with pytest.raises(errors.TaskNotFound):
            tx.call("get_task", rn=rn)
        with pytest.raises(errors.TaskNotFound):
            tx.call("cancel_task", rn=rn)
    seen = readers(tx)
    assert {task["rn"] for task in seen["list"]} == {t["given_up"]["rn"], t["running"]["rn"], t["ready"]}
    assert seen["counts"] == [("f", "aborted", 1), ("f", "completed", 1), ("f", "running", 1)]
    assert tx.call_value("_cleanup_tasks", retention=timedelta(0), p_now=at(3600)) == 2
    assert [task["status"] for task in readers(tx)["list"]] == ["running"]


def test_a_task_finishing_while_a_client_cancels_it_is_refused_by_the_state_machine(db, dsn):
    """Writes waiting on a task that finishes meanwhile answer as the state machine says
    (PS209, PS202), never with an error of their own (e.g. a serialization failure)."""
    db.call("submit_tasks", queue="c", specs=Jsonb([{}, {}]))
    first, second = (db.call_value("lease_task", queue="c", worker="wc") for _ in range(2))
    results = {}
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT pyscheduler.complete_task(rn => %s, token => %s)", (first["rn"], first["token"]))
        holder.execute("SELECT pyscheduler.complete_task(rn => %s, token => %s)", (second["rn"], second["token"]))

        def write(name, call):
            try:
                results[name] = call()
            except errors.SchedulerError as exc:
                results[name] = exc

        threads = [threading.Thread(target=write, args=("cancel", lambda: db.call("cancel_task", rn=first["rn"]))),
                   threading.Thread(target=write, args=("beat", lambda: db.call(
                       "heartbeat_tasks", rns=[second["rn"]], tokens=[second["token"]])))]
        for thread in threads:
            thread.start()
        with psycopg.connect(dsn, autocommit=True) as watch:
            for _ in range(600):
                waiting = watch.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                                        " AND wait_event_type = 'Lock'").fetchone()[0]
                if waiting == 2:
                    break
                threading.Event().wait(0.05)
            assert waiting == 2
        holder.commit()
    for thread in threads:
        thread.join(30)
    assert isinstance(results["cancel"], errors.TaskFinished)
    assert [(str(r["rn"]), r["sqlstate"]) for r in results["beat"]] == [(second["rn"], "PS202")]
    assert db.call_value("get_task", rn=first["rn"])["status"] == "completed"
