"""A queue that keeps no completed tasks (set_queue_keep_completed, migration 0053, issue 31): a
completion deletes the task instead of marking it completed, on every completion path, except a
task someone watches or a parent; failures are kept; task_counts counts none completed; the
dashboards' activity still counts each one, before and after the minutes' fold."""

from __future__ import annotations

import threading

import psycopg
import pytest

from pyscheduler import errors
from pyscheduler.db import Jsonb
from pyscheduler.tasks import TaskClient, Worker

from tests.support import code, wait_for
from tests.support.tasks import held, lease, submit


def counts(tx, queue: str) -> dict[str, int]:
    return {r["status"]: r["tasks"] for r in tx.query("SELECT * FROM pyscheduler.task_counts WHERE queue = %s",
                                                      (queue,))}


def gone(tx, rn) -> bool:
    return code(lambda: tx.call("get_task", rn=rn)) == "PS200"


def tasks_activity(tx, queue: str) -> tuple[int, int, int]:
    """The completions activity(), activity_latency() and queue_activity() count for the last hour
    (the first two over every queue: the test's transaction holds no other completion)."""
    done = sum(r["n"] for r in tx.call("activity", since="1 hour", bucket="1 minute")
               if r["capability"] == "tasks" and r["outcome"] == "completed")
    waited = sum(r["n"] for r in tx.call("activity_latency", since="1 hour", bucket="1 minute")
                 if r["capability"] == "tasks")
    by_queue = sum(r["n"] for r in tx.call("queue_activity", since="1 hour")
                   if r["queue"] == queue and r["status"] == "completed")
    return done, waited, by_queue


def test_every_completion_path_deletes_the_task_and_activity_still_counts_it(tx):
    tx.execute("DELETE FROM pyscheduler._task_done_log; DELETE FROM pyscheduler._task_done_minutes;"
               "DELETE FROM pyscheduler.tasks WHERE status >= 'completed'")
    assert tx.call_value("set_queue_keep_completed", queue="gone", keep=False)["keep_completed"] is False
    for i in range(6):
        submit(tx, "gone", {"i": i})
    leases = [lease(tx, "gone") for _ in range(5)]
    batch = leases[:3]
    assert tx.call("complete_tasks", rns=[t["rn"] for t in batch], tokens=[t["token"] for t in batch]) == []
    assert tx.call_value("complete_task", **held(leases[3]), result=Jsonb({"ok": 1}))["status"] == "completed"
    following = tx.call_value("complete_and_lease", worker="w1", queue="gone", **held(leases[4]))
    assert following is not None and following["spec"] == {"i": 5}  # the next one leased
    assert all(gone(tx, t["rn"]) for t in leases)
    assert counts(tx, "gone") == {"running": 1}  # none completed: there are none
    assert tasks_activity(tx, "gone") == (5, 5, 5)
    # a second completion of a deleted task is refused as of a task unknown
    assert tx.call("complete_tasks", rns=[batch[0]["rn"]], tokens=[batch[0]["token"]])[0]["sqlstate"] == "PS200"
    # with results, the batch path deletes them too
    assert tx.call("complete_tasks", rns=[following["rn"]], tokens=[following["token"]],
                   results=Jsonb([{"r": 1}])) == []
    assert gone(tx, following["rn"]) and counts(tx, "gone") == {}
    # folded into the minutes (as the monitor's minutely fold does once they are a minute old):
    # the same counts, read from the rollup and the minutes of the deleted tasks
    tx.execute("SELECT pyscheduler._fold_task_minutes(now() + interval '3 minutes')")
    assert tx.query("SELECT * FROM pyscheduler._task_done_log") == []
    assert tasks_activity(tx, "gone") == (6, 6, 6)


def test_the_default_keeps_them_and_a_queue_may_keep_them_again(tx):
    submit(tx, "kept")
    kept = lease(tx, "kept")
    tx.call("complete_tasks", rns=[kept["rn"]], tokens=[kept["token"]])
    assert tx.call_value("get_task", rn=kept["rn"])["status"] == "completed"
    tx.call("set_queue_keep_completed", queue="kept", keep=False)
    assert tx.call_value("set_queue_keep_completed", queue="kept", keep=True)["keep_completed"] is True
    submit(tx, "kept")
    again = lease(tx, "kept")
    tx.call("complete_tasks", rns=[again["rn"]], tokens=[again["token"]])
    assert tx.call_value("get_task", rn=again["rn"])["status"] == "completed"


def test_a_watched_task_a_parent_and_a_failure_are_kept(tx):
    tx.call("set_queue_keep_completed", queue="gone", keep=False)
    watched, parent, failing, plain = (submit(tx, "gone", {"i": i}) for i in range(4))
    child = submit(tx, "gone", {"child": 1}, after=[parent["rn"]])
    tx.call("watch_task", rn=watched["rn"])
    by_spec = {}
    for _ in range(4):
        t = lease(tx, "gone")
        by_spec[t["spec"]["i"]] = t
    batch = [by_spec[0], by_spec[1], by_spec[3]]  # one batch: two kept, one deleted
    assert tx.call("complete_tasks", rns=[t["rn"] for t in batch], tokens=[t["token"] for t in batch]) == []
    assert gone(tx, plain["rn"])
    tx.call("abort_task", **held(by_spec[2]), errors=Jsonb([{"code": "bug"}]))
    assert tx.call_value("get_task", rn=watched["rn"])["status"] == "completed"  # its watcher reads it
    assert tx.call_value("get_task", rn=parent["rn"])["status"] == "completed"
    assert tx.call_value("get_task", rn=child["rn"])["status"] == "ready"  # its parent's completion counted
    assert tx.call_value("get_task", rn=failing["rn"])["status"] == "aborted"
    # the child has no children: deleted when it completes
    c = lease(tx, "gone")
    tx.call("complete_task", **held(c))
    assert gone(tx, child["rn"])


def test_a_durable_task_is_deleted_with_its_steps(tx):
    tx.call("set_queue_keep_completed", queue="gone", keep=False)
    submit(tx, "gone")
    task = lease(tx, "gone")
    tx.call("record_step", **held(task), step="charge", result=Jsonb({"paid": True}))
    assert tx.query("SELECT 1 FROM pyscheduler.task_checkpoints WHERE rn = %s", (task["rn"],))
    tx.call("complete_tasks", rns=[task["rn"]], tokens=[task["token"]])
    assert tx.query("SELECT 1 FROM pyscheduler.task_checkpoints WHERE rn = %s", (task["rn"],)) == []


def test_keep_must_be_a_boolean_and_the_queue_a_queue_name(tx):
    tx.call("set_queue_keep_completed", queue="mine", keep=True)  # the queue becomes this role's
    assert code(lambda: tx.call("set_queue_keep_completed", queue="mine", keep=None)) == "PS208"
    assert code(lambda: tx.call("set_queue_keep_completed", queue="", keep=False)) == "PS208"
    assert code(lambda: tx.execute("SELECT pyscheduler.set_queue_keep_completed('mine', 'maybe')")) == "22P02"


def test_another_roles_queue_is_refused(db, login):
    TaskClient(db).set_queue_keep_completed("theirs", True)  # made by the test's role
    _, other = login("pyscheduler_client")
    with psycopg.connect(other, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT pyscheduler.set_queue_keep_completed('theirs', false)")
    assert TaskClient(db).set_queue_keep_completed("theirs", False).keep_completed is False


def test_the_client_names_the_field(db):
    client = TaskClient(db)
    with pytest.raises(errors.InvalidArgument, match="keep"):
        client.set_queue_keep_completed("q", "no")  # type: ignore[arg-type]
    assert client.set_queue_keep_completed("q", False).keep_completed is False


def test_a_worker_runs_every_task_once_and_keeps_none(dsn, db):
    client = TaskClient(db)
    client.set_queue_keep_completed("fast", False)
    seen: list[int] = []
    lock = threading.Lock()

    def handle(ctx) -> None:
        with lock:
            seen.append(ctx.spec["i"])

    running = Worker(dsn, "fast", handle, capacity=4).start()
    try:
        client.submit_ids("fast", [{"i": i} for i in range(300)])
        wait_for(lambda: len(seen) >= 300, 60)
    finally:
        running.stop()
    assert sorted(seen) == list(range(300))
    assert db.query("SELECT count(*) AS n FROM pyscheduler.tasks WHERE queue = 'fast'")[0]["n"] == 0
    assert sum(r["n"] for r in db.call("queue_activity", since="1 hour") if r["queue"] == "fast") == 300
