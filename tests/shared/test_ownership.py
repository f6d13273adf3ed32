"""The one ownership rule (docs/sql-api.md, "Ownership"): a role sees and changes its own work;
another role sees its metadata only, the monitor metadata and counts; unique keys are a role's
own; a queue's settings are its owner's, who can always undo them."""

from __future__ import annotations

import json

import psycopg
import pytest

from pyscheduler.db import Database, Jsonb
from pyscheduler.tasks.client import TaskClient

from tests.support import code

SECRET = "4111-1111-1111-1111"  # a card number in the first application's work


@pytest.fixture
def apps(login, dsn):
    """Databases as two client applications, a worker, the monitor and admin."""
    roles = {"a": "pyscheduler_client", "b": "pyscheduler_client", "worker": "pyscheduler_worker",
             "monitor": "pyscheduler_monitor", "admin": "pyscheduler_admin"}
    made = {who: login(role) for who, role in roles.items()}
    dbs = {who: Database(d, max_size=1) for who, (_, d) in made.items()}
    for d in dbs.values():
        d.open()
    yield {who: d for who, d in dbs.items()} | {f"{who}_role": made[who][0] for who in made}
    for d in dbs.values():
        d.close()


def test_another_role_and_the_monitor_never_read_a_task_s_contents(apps):
    """Issue 27, reproduction 3: a second application (and the monitor, and a worker that does
    not hold the lease) read the first's spec, result and errors through get_task and list_tasks."""
    a, b, worker, monitor, admin = (apps[k] for k in ("a", "b", "worker", "monitor", "admin"))
    done = a.call_value("submit_task", queue="cards", spec=Jsonb({"card": SECRET}), unique_key=f"card:{SECRET}",
                        concurrency_key=SECRET)
    failed = a.call_value("submit_task", queue="cards", spec=Jsonb({"card": SECRET}))
    wid = worker.call_value("register_worker")
    for _ in range(2):
        held = worker.call_value("lease_task", queue="cards", worker=wid)
        assert SECRET in json.dumps(held["spec"])  # the lease holder sees what it works on
        if held["rn"] == done["rn"]:
            worker.call("complete_task", rn=held["rn"], token=held["token"], result=Jsonb({"charged": SECRET}))
        else:
            worker.call("fail_task", rn=held["rn"], token=held["token"],
                        error=Jsonb({"code": "declined", "args": {"card": SECRET}}))

    for who in ("b", "monitor", "worker"):
        for rn in (done["rn"], failed["rn"]):
            seen = apps[who].call_value("get_task", rn=rn)
            assert SECRET not in json.dumps(seen), who
            assert seen["redacted"] is True and seen["status"] in ("completed", "scheduled")
            assert (seen["queue"], seen["submitted_by"]) == ("cards", apps["a_role"])  # metadata stays
        for filters in ({}, {"queue": "cards"}, {"queue": "cards", "status": "completed"}):
            if who == "worker":
                break  # list_tasks is not the worker's
            listed = apps[who].call("list_tasks", **filters)
            assert listed and SECRET not in json.dumps(listed), (who, filters)
    for who in ("a", "admin"):
        assert SECRET in json.dumps(apps[who].call_value("get_task", rn=done["rn"]))
        assert SECRET in json.dumps(apps[who].call_value("get_task", rn=failed["rn"]))
        assert SECRET in json.dumps(apps[who].call("list_tasks", queue="cards"))
    # the Python client: a redacted task reads as one
    task = TaskClient(b).get(done["rn"])
    assert task.redacted and task.spec == {} and task.output is None and task.errors == []
    assert not TaskClient(a).get(done["rn"]).redacted


def test_a_unique_key_never_merges_two_roles_work(apps):
    """Issue 27, reproduction 4: the second role's submit with the first's key in the first's
    queue was answered with the first's task (deduplicated), and its work silently dropped."""
    a, b = apps["a"], apps["b"]
    first = a.call_value("submit_task", queue="invoices", spec=Jsonb({"n": 1}), unique_key="invoice:233")
    theirs = b.call_value("submit_task", queue="invoices", spec=Jsonb({"n": 2}), unique_key="invoice:233")
    assert "deduplicated" not in theirs and theirs["rn"] != first["rn"] and theirs["spec"] == {"n": 2}
    assert theirs["submitted_by"] == apps["b_role"]
    many = b.call("submit_tasks", queue="invoices", specs=Jsonb([{"n": 3}, {"n": 4}]),
                  unique_keys=["invoice:233", "invoice:234"])
    assert many[0]["task"]["rn"] == theirs["rn"] and many[0]["task"]["deduplicated"]  # b's own key: b's task
    flow = b.call_value("submit_workflow", workflow=Jsonb([{"name": "x", "queue": "invoices", "spec": {"n": 6},
                                                           "unique_key": "invoice:233"}]))
    assert flow["x"]["rn"] == theirs["rn"] and flow["x"]["deduplicated"]  # b's own key, never a's
    flow = b.call_value("submit_workflow", workflow=Jsonb([{"name": "x", "queue": "invoices", "spec": {"n": 7},
                                                           "unique_key": "invoice:235"}]))
    assert a.call_value("submit_workflow", workflow=Jsonb([{"name": "x", "queue": "invoices", "spec": {"n": 8},
                                                           "unique_key": "invoice:235"}]))["x"]["rn"] != flow["x"]["rn"]
    again = a.call_value("submit_task", queue="invoices", spec=Jsonb({"n": 5}), unique_key="invoice:233")
    assert again["rn"] == first["rn"] and again["deduplicated"]
    counts = {(r["queue"], r["status"]): r["tasks"] for r in a.query("SELECT * FROM pyscheduler.task_counts")}
    assert counts[("invoices", "ready")] == 5  # a's, b's, b's invoice:234, b's and a's invoice:235


def test_a_queue_s_settings_are_its_owner_s_and_the_owner_can_always_undo_them(apps):
    """Issue 27, reproduction 5: any client could throttle or freeze another application's queue
    (rate limit, limits, pause) and the victim got 42501 on each undo."""
    a, b, admin = apps["a"], apps["b"], apps["admin"]
    a.call("submit_task", queue="orders", spec=Jsonb({}))  # a's queue: a submitted to it first
    assert code(lambda: b.call("set_rate_limit", queue="orders", starts=1, per="1 day")) == "42501"
    assert code(lambda: b.call("set_queue_limits", queue="orders", running_total=1)) == "42501"
    assert code(lambda: b.call("pause_queue", queue="orders")) == "42501"
    assert a.query("SELECT * FROM pyscheduler.queue_limits WHERE queue = 'orders'") == []
    b.call("submit_task", queue="orders", spec=Jsonb({}))  # submitting stays open to every client
    # whoever set them, the owner undoes them
    admin.call("set_rate_limit", queue="orders", starts=1, per="1 day")
    admin.call("set_queue_limits", queue="orders", running_total=1)
    admin.call("pause_queue", queue="orders", note="admin")
    assert a.call_value("set_rate_limit", queue="orders", starts=None)["rate_starts"] is None
    assert a.call_value("set_queue_limits", queue="orders")["running_total"] is None
    assert a.call_value("resume_queue", queue="orders")["paused"] is False
    # the admin hands the queue over
    assert admin.call_value("set_queue_owner", queue="orders", owner=apps["b_role"])["owner"] == apps["b_role"]
    assert b.call_value("pause_queue", queue="orders")["paused"]
    assert code(lambda: a.call("resume_queue", queue="orders")) == "42501"
    assert code(lambda: admin.call("set_queue_owner", queue="orders", owner="no_such_role")) == "PS208"
    assert code(lambda: a.call("set_queue_owner", queue="orders", owner=apps["a_role"])) == "42501"


def test_a_queue_made_by_an_open_transaction_never_blocks_another_submitter(conn, dsn):
    """The first submit to a new queue makes its row; an application's transaction that stays
    open after it must not hold up another submit to that queue."""
    with psycopg.connect(dsn) as app:
        app.execute("SELECT pyscheduler.submit_task(queue => 'fresh', spec => '{}')")  # open, not committed
        with psycopg.connect(dsn, autocommit=True) as other:
            other.execute("SET statement_timeout = '5s'")
            other.execute("SELECT pyscheduler.submit_task(queue => 'fresh', spec => '{}')")
        app.commit()
    assert conn.execute("SELECT owner FROM pyscheduler.task_queues WHERE queue = 'fresh'").fetchall() == [
        {"owner": "postgres"}]
