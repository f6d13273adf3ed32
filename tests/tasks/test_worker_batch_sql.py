"""The Worker's batch SQL: lease_tasks_lean, heartbeat_tasks, yield_tasks."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest

from pyscheduler import errors
from pyscheduler.db import Jsonb

from tests.support import wait_for
from tests.support.tasks import held, lease, submit, types_of


def lean(db, queue="q", n=10, **kw):
    return db.call("lease_tasks_lean", queue=queue, worker="w1", n=n, **kw)


def test_lease_tasks_lean_claims_like_lease_tasks_and_answers_only_what_a_worker_needs(tx):
    low = submit(tx, spec={"p": "low"}, priority=1)
    high = [submit(tx, spec={"p": "high", "i": i}, priority=9) for i in range(3)]
    rows = lean(tx, n=3)
    assert [str(r["rn"]) for r in rows] == [t["rn"] for t in high]  # priority, then submission order
    assert set(rows[0]) == {"rn", "token", "spec", "priority", "seq", "attempt"}
    assert [r["attempt"] for r in rows] == [1, 1, 1]
    assert [r["spec"]["i"] for r in rows] == [0, 1, 2] and {r["priority"] for r in rows} == {9}
    assert rows[0]["seq"] < rows[1]["seq"] < rows[2]["seq"]
    task = tx.call_value("get_task", rn=rows[0]["rn"])
    assert task["status"] == "running" and task["owner"] == "w1" and types_of(task) == ["TaskAssignment"]
    tx.call("complete_task", rn=rows[0]["rn"], token=rows[0]["token"])  # the token is the lease's
    [last] = lean(tx, n=10)
    assert str(last["rn"]) == low["rn"] and not lean(tx)
    with pytest.raises(errors.InvalidArgument) as info:
        lean(tx, n=0)
    assert info.value.sqlstate == "PS208"


def test_heartbeat_tasks_extends_every_lease_and_returns_only_the_refused(tx):
    for i in range(4):
        submit(tx, spec={"i": i})
    leases = [{"rn": str(r["rn"]), "token": str(r["token"])} for r in lean(tx, n=4)]
    tx.call("cancel_task", rn=leases[1]["rn"])
    tx.call("complete_task", **leases[2])
    stranger = str(uuid.uuid4())
    refused = tx.call("heartbeat_tasks", rns=[x["rn"] for x in leases] + [stranger],
                      tokens=[x["token"] for x in leases[:3]] + [str(uuid.uuid4())] * 2,
                      progress=[0.5, None, 0.7, 0.9, None], timeout=timedelta(minutes=5))
    assert {str(r["rn"]): r["sqlstate"] for r in refused} == {
        leases[1]["rn"]: "PS203", leases[2]["rn"]: "PS202", leases[3]["rn"]: "PS201", stranger: "PS200"}
    kept = tx.call_value("get_task", rn=leases[0]["rn"])
    assert kept["progress"] == 0.5 and kept["deadline"] > tx.call_value("get_task", rn=leases[3]["rn"])["deadline"]
    assert tx.call_value("get_task", rn=leases[3]["rn"])["progress"] == 0  # another lease's: untouched
    assert tx.call("heartbeat_tasks", rns=[leases[0]["rn"]], tokens=[leases[0]["token"]]) == []
    assert tx.call_value("get_task", rn=leases[0]["rn"])["progress"] == 0.5  # NULL progress keeps it
    with pytest.raises(errors.InvalidArgument) as info:
        tx.call("heartbeat_tasks", rns=[leases[0]["rn"]], tokens=[leases[0]["token"]], progress=[1.5])
    assert info.value.sqlstate == "PS205"
    with pytest.raises(errors.InvalidArgument) as info:
        tx.call("heartbeat_tasks", rns=[leases[0]["rn"]], tokens=[])
    assert info.value.sqlstate == "PS208"
    with pytest.raises(errors.InvalidArgument) as info:
        tx.call("heartbeat_tasks", rns=[leases[0]["rn"]], tokens=[leases[0]["token"]], progress=[0.1, 0.2])
    assert info.value.sqlstate == "PS208"


@pytest.mark.parametrize("write", ["complete_tasks", "heartbeat_tasks", "fail_tasks", "yield_tasks"])
def test_a_null_or_repeated_rn_in_a_batch_is_refused_and_the_others_are_written(tx, write):
    """A careless batch: a NULL rn (with a NULL token) and a lease given twice. The leases are
    written once each, the NULL is refused as unknown (PS200), nothing else fails."""
    for i in range(2):
        submit(tx, spec={"i": i})
    leases = [(str(r["rn"]), str(r["token"])) for r in lean(tx, n=2)]
    rns, tokens = [leases[0][0], None, leases[1][0], leases[0][0]], [leases[0][1], None, leases[1][1], leases[0][1]]
    extra = {"errors": Jsonb([{"code": "e", "args": {}, "description": "d"}] * 4)} if write == "fail_tasks" else {}
    refused = tx.call(write, rns=rns, tokens=tokens, **extra)
    assert [(r["rn"], r["sqlstate"]) for r in refused] == [(None, "PS200")]
    after = {"complete_tasks": "completed", "heartbeat_tasks": "running", "fail_tasks": "scheduled",
             "yield_tasks": "running"}[write]  # failed: retried after the backoff; yielded: the monitor makes it ready
    assert [tx.call_value("get_task", rn=rn)["status"] for rn, _ in leases] == [after, after]
    history = ["TaskAssignment"] + {"fail_tasks": ["TaskRetry"], "yield_tasks": ["TaskYield"]}.get(write, [])
    assert [types_of(tx.call_value("get_task", rn=rn)) for rn, _ in leases] == [history, history]  # written once


def test_yield_tasks_hands_leases_back_in_one_call(tx):
    for i in range(3):
        submit(tx, spec={"i": i})
    leases = [{"rn": str(r["rn"]), "token": str(r["token"])} for r in lean(tx, n=3)]
    tx.call("complete_task", **leases[2])
    refused = tx.call("yield_tasks", rns=[x["rn"] for x in leases], tokens=[x["token"] for x in leases])
    assert [(str(r["rn"]), r["sqlstate"]) for r in refused] == [(leases[2]["rn"], "PS202")]
    for x in leases[:2]:
        task = tx.call_value("get_task", rn=x["rn"])
        assert task["status"] == "running" and types_of(task) == ["TaskAssignment", "TaskYield"]
    again = tx.call("yield_tasks", rns=[leases[0]["rn"]], tokens=[leases[0]["token"]])
    assert [r["sqlstate"] for r in again] == ["PS210"]  # the token's lease is over
    reset = tx.call("reset_expired_tasks")
    assert sorted(r["task"]["rn"] for r in reset) == sorted(x["rn"] for x in leases[:2])
    assert {r["task"]["status"] for r in reset} == {"ready"}
    assert types_of(reset[0]["task"]) == ["TaskAssignment", "TaskYield"]  # no TaskTimeout after a yield


def test_batch_writes_of_overlapping_leases_in_opposite_orders_never_deadlock(dsn, db):
    """Completions and heartbeats of the same worker run at once on two connections: both
    lock rows in rn order, so they wait for each other but never deadlock (40P01)."""
    from pyscheduler.db import Database

    for _ in range(5):
        db.call("submit_tasks", queue="dl", specs=Jsonb([{"i": i} for i in range(200)]))
        rows = lean(db, queue="dl", n=200, timeout=timedelta(minutes=5))
        rns, tokens = [str(r["rn"]) for r in rows], [str(r["token"]) for r in rows]
        failures: list[BaseException] = []
        go = threading.Barrier(2)

        def beat(order: int) -> None:
            try:
                with Database(dsn, max_size=1) as other:
                    go.wait()
                    for _ in range(5):
                        other.call("heartbeat_tasks", rns=rns[::order], tokens=tokens[::order])
            except BaseException as exc:  # noqa: BLE001 - reported below
                failures.append(exc)

        threads = [threading.Thread(target=beat, args=(o,)) for o in (1, -1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not failures, failures
        assert db.call("complete_tasks", rns=rns[::-1], tokens=tokens[::-1]) == []


def test_single_and_batch_leases_share_one_claim(tx):
    """lease_task, lease_tasks and lease_tasks_lean take turns on one queue: each task once."""
    tx.call("submit_tasks", queue="mix", specs=Jsonb([{"i": i} for i in range(30)]))
    got = [lease(tx, queue="mix")["rn"]]
    got += [r["task"]["rn"] for r in tx.call("lease_tasks", queue="mix", worker="w", n=9)]
    got += [str(r["rn"]) for r in lean(tx, queue="mix", n=100)]
    assert len(got) == len(set(got)) == 30
    assert held(lease(tx, queue="mix") or {"rn": None, "token": None}) == {"rn": None, "token": None}


def test_the_workers_pool_skips_the_check_only_for_fresh_connections(dsn, conn):
    """db.Database(fresh=s) (the Worker's pool) hands out a connection used in the last s seconds
    without looking; a default pool checks every checkout, so a connection that died in the pool
    is replaced before the caller sees it."""
    from pyscheduler.db import Database

    def kill_others() -> None:
        others = "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        conn.execute(f"SELECT pg_terminate_backend(pid) {others}")
        wait_for(lambda: conn.execute(f"SELECT count(*) AS n {others}").fetchone()["n"] == 0, timeout=30)

    with Database(dsn, min_size=1, max_size=1) as checked, Database(dsn, min_size=1, max_size=1,
                                                                      fresh=60) as fresh:
        assert checked.call_value("version") and fresh.call_value("version")
        kill_others()
        assert checked.call_value("version")  # checked on checkout: replaced, the caller never knew
        with pytest.raises(errors.DatabaseUnavailable):
            fresh.call_value("version")  # not checked: the worker's retry handles it
        assert fresh.call_value("version")  # the broken connection was dropped


def test_a_checkout_of_a_healthy_connection_costs_no_round_trip(dsn, monkeypatch):
    """A default pool's checkout looks at the socket of a connection that came back healthy: a call
    is one round trip (issue 31: a single submit paid two, the check and the call)."""
    from psycopg_pool import ConnectionPool

    from pyscheduler.db import Database

    checks = []
    real = ConnectionPool.check_connection
    monkeypatch.setattr(ConnectionPool, "check_connection", staticmethod(lambda c: checks.append(c) or real(c)))
    with Database(dsn, min_size=1, max_size=1) as db:
        db.call_value("version")
        checks.clear()
        for _ in range(3):
            assert db.call_value("version")
    assert checks == []
