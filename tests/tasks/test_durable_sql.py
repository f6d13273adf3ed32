"""Durable task functions in SQL (sql/tasks/7_durable.sql): steps recorded once per task under
the lease, sleeps that end the lease, events stored and delivered once per waiting task, who may
emit to whom, and the cleanup of what they store."""

from __future__ import annotations

import psycopg
import pytest

from pyscheduler import errors
from pyscheduler.db import Jsonb
from tests.support.tasks import at, call, held, lease, submit, value


def code(fn) -> str:
    with pytest.raises(errors.SchedulerError) as info:
        fn()
    return info.value.sqlstate


def steps(tx, rn):
    return [(r["kind"], r["step"], r["result"]) for r in tx.call("task_steps", rn=rn)]


def test_a_step_is_recorded_once_per_task_and_read_back_by_the_next_lease(tx):
    rn = submit(tx, "d", now=at(0))["rn"]
    first = held(lease(tx, "d", now=at(1), timeout="10 seconds"))
    assert tx.call_value("step_results", **first) == {}
    assert tx.call_value("record_step", **first, step="charge", result=Jsonb({"charged": 10})) == {"charged": 10}
    call(tx, "reset_expired_tasks", at(100))  # the worker died: the lease expired
    second = held(lease(tx, "d", now=at(101)))
    assert tx.call_value("step_results", **second) == {"charge": {"charged": 10}}
    # a second recording of the step (a re-run that did it again) keeps and answers the first
    assert tx.call_value("record_step", **second, step="charge", result=Jsonb({"charged": 99})) == {"charged": 10}
    tx.call("record_step", **second, step="ship", result=Jsonb("parcel-7"))
    assert steps(tx, rn) == [("step", "charge", {"charged": 10}), ("step", "ship", "parcel-7")]


def test_a_stale_lease_cannot_record_a_step(tx):
    submit(tx, "d", now=at(0))
    stale = held(lease(tx, "d", now=at(1), timeout="10 seconds"))
    call(tx, "reset_expired_tasks", at(100))
    current = held(lease(tx, "d", now=at(101)))
    assert code(lambda: tx.call("record_step", **stale, step="charge", result=Jsonb(1))) == "PS201"
    assert code(lambda: tx.call("step_results", **stale)) == "PS201"
    assert tx.call_value("step_results", **current) == {}


def test_a_sleep_ends_the_lease_and_the_task_is_scheduled_with_its_steps_kept(tx):
    rn = submit(tx, "d", now=at(0))["rn"]
    h = held(lease(tx, "d", now=at(1)))
    tx.call("record_step", **h, step="mail", result=Jsonb(True))
    assert value(tx, "sleep_task", at(2), **h, duration="1 hour", step="1") == {
        "asleep": True, "until": "2030-01-01T01:00:02.000000Z"}
    task = tx.call_value("get_task", rn=rn)
    assert (task["status"], task["owner"], task["attempts"]) == ("scheduled", None, 0)  # no attempt used
    assert code(lambda: tx.call("heartbeat_task", **h)) == "PS202"
    assert lease(tx, "d", now=at(3)) is None  # not before its time
    again = held(lease(tx, "d", now=at(3603)))
    # the re-run sleeps under the same name: over already, the lease is kept
    assert value(tx, "sleep_task", at(3604), **again, duration="1 hour", step="1")["asleep"] is False
    assert tx.call_value("step_results", **again) == {"mail": True}
    assert tx.call_value("get_task", rn=rn)["status"] == "running"
    assert steps(tx, rn) == [("step", "mail", True), ("sleep", "1", {"until": "2030-01-01T01:00:02.000000Z"})]


def test_sleep_bounds(tx):
    submit(tx, "d")
    h = held(lease(tx, "d"))
    assert code(lambda: tx.call("sleep_task", **h)) == "PS212"  # neither
    assert code(lambda: tx.call("sleep_task", **h, until=at(0), duration="1 hour")) == "PS212"
    assert code(lambda: tx.call("sleep_task", **h, duration="366 days")) == "PS212"
    assert code(lambda: tx.call("sleep_task", **h, duration="1 hour", step=" padded")) == "PS230"


def wait(tx, h, name, now, timeout="1 hour"):
    return value(tx, "await_event", now, **h, name=name, timeout=timeout)


def test_an_event_emitted_before_the_wait_is_received_at_once(tx):
    rn = submit(tx, "d", now=at(0))["rn"]
    assert value(tx, "emit_event", at(1), name="order-7-paid", payload=Jsonb({"amount": 10})) == 0
    h = held(lease(tx, "d", now=at(2)))
    assert wait(tx, h, "order-7-paid", at(3)) == {"status": "received", "payload": {"amount": 10}}
    assert tx.call_value("get_task", rn=rn)["status"] == "running"


def test_an_event_emitted_during_the_wait_wakes_the_task_with_its_payload_once(tx):
    rn = submit(tx, "d", now=at(0))["rn"]
    h = held(lease(tx, "d", now=at(1)))
    assert wait(tx, h, "shipped", at(2)) == {"status": "suspended", "until": "2030-01-01T01:00:02.000000Z"}
    task = tx.call_value("get_task", rn=rn)
    assert (task["status"], task["owner"]) == ("scheduled", None)
    assert task["awaiting"] == {"event": "shipped", "since": "2030-01-01T00:00:02.000000Z",
                                "until": "2030-01-01T01:00:02.000000Z"}
    assert steps(tx, rn) == [("await", "shipped", {"until": "2030-01-01T01:00:02.000000Z"})]
    assert lease(tx, "d", now=at(3)) is None
    assert value(tx, "emit_event", at(4), name="shipped", payload=Jsonb({"parcel": 1})) == 1
    again = held(lease(tx, "d", now=at(5)))
    assert again["rn"] == rn
    assert "awaiting" not in tx.call_value("get_task", rn=rn)  # woken: waits no more
    assert wait(tx, again, "shipped", at(6)) == {"status": "received", "payload": {"parcel": 1}}
    # emitted after the wait: delivered to nobody, and the task's payload stays the first
    assert value(tx, "emit_event", at(7), name="shipped", payload=Jsonb({"parcel": 2})) == 0
    assert wait(tx, again, "shipped", at(8)) == {"status": "received", "payload": {"parcel": 1}}
    assert steps(tx, rn) == [("event", "shipped", {"status": "received", "payload": {"parcel": 1}})]


def test_a_wait_times_out_once_its_timeout_passes_not_before(tx):
    rn = submit(tx, "d", now=at(0))["rn"]
    h = held(lease(tx, "d", now=at(1)))
    assert wait(tx, h, "never", at(2), timeout="10 seconds")["status"] == "suspended"
    assert lease(tx, "d", now=at(11)) is None
    again = held(lease(tx, "d", now=at(12)))  # due at 12: made ready by the lease gate
    # a re-run asks again with another timeout: the first wait's instant stands
    assert wait(tx, again, "never", at(12), timeout="1 hour") == {"status": "timeout"}
    assert value(tx, "emit_event", at(13), name="never") == 0
    assert wait(tx, again, "never", at(14)) == {"status": "timeout"}
    assert tx.call_value("get_task", rn=rn)["attempts"] == 1  # the waits used none


def test_a_re_run_before_the_timeout_suspends_again_until_the_same_instant(tx):
    submit(tx, "d", now=at(0))
    h = held(lease(tx, "d", now=at(1)))
    assert wait(tx, h, "later", at(2), timeout="10 seconds")["until"] == "2030-01-01T00:00:12.000000Z"
    tx.execute("UPDATE pyscheduler.tasks SET status = 'ready'")  # an operator made it ready early
    again = held(lease(tx, "d", now=at(3)))
    assert wait(tx, again, "later", at(3), timeout="1 hour")["until"] == "2030-01-01T00:00:12.000000Z"


def test_cleanup_deletes_the_steps_of_the_tasks_it_deletes_and_the_events_past_retention(tx):
    rn = submit(tx, "d", now=at(0))["rn"]
    h = held(lease(tx, "d", now=at(1)))
    tx.call("record_step", **h, step="a", result=Jsonb(1))
    call(tx, "complete_task", at(2), **h)
    call(tx, "emit_event", at(2), name="old")
    call(tx, "emit_event", at(5000), name="new")
    assert value(tx, "cleanup_tasks", at(4000), retention="1 hour") == 1
    assert tx.execute("SELECT count(*) AS n FROM pyscheduler.task_checkpoints WHERE rn = %s",
                      (rn,)).fetchone()["n"] == 0
    assert [r["name"] for r in tx.execute("SELECT name FROM pyscheduler.task_events "
                                          "WHERE name IN ('old', 'new')").fetchall()] == ["new"]


def test_an_event_reaches_only_the_tasks_of_roles_its_emitter_may_act_on(dsn, login, conn):
    app, app_dsn = login("pyscheduler_client")
    other, other_dsn = login("pyscheduler_client")
    with psycopg.connect(app_dsn, autocommit=True) as c:
        c.execute("SELECT pyscheduler.submit_task(queue => 'd', spec => '{}')")
        c.execute("SELECT pyscheduler.emit_event(name => 'early', payload => '\"mine\"')")
    leased = conn.execute("SELECT pyscheduler.lease_task(queue => 'd', worker => 'w') AS t").fetchone()["t"]
    h = {"rn": leased["rn"], "token": leased["token"]}
    with psycopg.connect(other_dsn, autocommit=True) as c:
        c.execute("SELECT pyscheduler.emit_event(name => 'early', payload => '\"theirs\"')")
        c.execute("SELECT pyscheduler.emit_event(name => 'late', payload => '\"theirs\"')")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute("SELECT * FROM pyscheduler.task_steps(rn => %s)", (h["rn"],))
    got = conn.execute("SELECT pyscheduler.await_event(rn => %(rn)s, token => %(token)s, name => 'early') AS g",
                       h).fetchone()["g"]
    assert got == {"status": "received", "payload": "mine"}  # not the other role's
    assert conn.execute("SELECT pyscheduler.await_event(rn => %(rn)s, token => %(token)s, name => 'late') AS g",
                        h).fetchone()["g"]["status"] == "suspended"
    with psycopg.connect(other_dsn, autocommit=True) as c:
        assert c.execute("SELECT pyscheduler.emit_event(name => 'late')").fetchone()[0] == 0
    with psycopg.connect(app_dsn, autocommit=True) as c:
        assert c.execute("SELECT pyscheduler.emit_event(name => 'late', payload => '1')").fetchone()[0] == 1
        assert [r[0] for r in c.execute("SELECT kind FROM pyscheduler.task_steps(rn => %s)", (h["rn"],))] == [
            "event", "event"]
