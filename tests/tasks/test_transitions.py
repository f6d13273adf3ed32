"""Leased tasks, SQL API: every transition and error code, interleavings, concurrency."""

from __future__ import annotations

import queue as queue_mod
import threading
import uuid
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from psycopg.rows import dict_row

from pyscheduler import errors
from pyscheduler.db import Jsonb, Listener
from tests.support.tasks import T0, at, call, code_of, held, lease, submit, types_of, value

# ------------------------------------------------------------------ submit / get / list


def test_submit_returns_a_ready_task_in_the_seed_shape(tx):
    task = submit(tx, spec={"orderId": "233"}, now=T0)
    seed = {"rn", "spec", "queue", "priority", "status", "progress", "created", "updated", "errors", "owner",
            "deadline", "history"}
    extensions = {"run_at", "attempts", "max_attempts", "unique_key", "submitted_by"}  # issue 16, documented
    extensions |= {"concurrency_key", "result", "after", "on_parent_failure"}  # issue 20, documented
    assert set(task) == seed | extensions
    assert (task["run_at"], task["attempts"], task["max_attempts"], task["unique_key"]) == (None, 0, None, None)
    assert uuid.UUID(task["rn"])
    assert task["spec"] == {"orderId": "233"}
    assert (task["queue"], task["priority"], task["status"], task["progress"]) == ("q", 50, "ready", 0)
    assert datetime.fromisoformat(task["created"]) == T0 == datetime.fromisoformat(task["updated"])
    assert task["created"] == "2030-01-01T00:00:00.000000Z"  # UTC, ending in Z as in the seed
    assert (task["errors"], task["owner"], task["deadline"], task["history"]) == ([], None, None, [])
    assert tx.call_value("get_task", rn=task["rn"]) == task
    assert "token" not in tx.call_value("get_task", rn=task["rn"])


def test_times_come_from_the_database_clock(tx):
    task = submit(tx)
    db_now = tx.query("SELECT now() AS n")[0]["n"]
    assert abs((db_now - datetime.fromisoformat(task["created"])).total_seconds()) < 5


def test_submit_tasks_batch(tx):
    tasks = [r["task"] for r in tx.call("submit_tasks", queue="b", specs=Jsonb([{"i": i} for i in range(5)]),
                                        priority=7)]
    assert sorted(t["spec"]["i"] for t in tasks) == list(range(5))
    assert {t["priority"] for t in tasks} == {7} and len({t["rn"] for t in tasks}) == 5


@pytest.mark.parametrize("priority", [-1, 4294967296])
def test_priority_out_of_range_is_ps204(tx, priority):
    with pytest.raises(errors.InvalidArgument) as info:
        submit(tx, priority=priority)
    assert code_of(info) == "PS204" and "priority" in str(info.value)


def test_priority_bounds_are_accepted(tx):
    assert submit(tx, priority=0)["priority"] == 0
    assert submit(tx, priority=4294967295)["priority"] == 4294967295


@pytest.mark.parametrize("spec", [[1, 2], "text", 3, None])
def test_spec_must_be_a_json_object_ps206(tx, spec):
    with pytest.raises(errors.InvalidArgument) as info:
        tx.call("submit_task", queue="q", spec=Jsonb(spec) if spec is not None else None)
    assert code_of(info) == "PS206"


@pytest.mark.parametrize("specs", [{"a": 1}, [{"a": 1}, 2]])
def test_batch_specs_must_be_an_array_of_objects_ps206(tx, specs):
    with pytest.raises(errors.InvalidArgument) as info:
        tx.call("submit_tasks", queue="q", specs=Jsonb(specs))
    assert code_of(info) == "PS206"
    assert tx.call("list_tasks") == []


@pytest.mark.parametrize("queue", ["", "x" * 41, None])
def test_bad_queue_is_ps208(tx, queue):
    with pytest.raises(errors.InvalidArgument) as info:
        tx.call("submit_task", queue=queue, spec=Jsonb({}))
    assert code_of(info) == "PS208" and "queue" in str(info.value)


def test_get_unknown_task_is_ps200(tx):
    with pytest.raises(errors.TaskNotFound) as info:
        tx.call_value("get_task", rn=uuid.uuid4())
    assert code_of(info) == "PS200"


def test_list_tasks_filters_and_limit(tx):
    a = submit(tx, queue="a", now=at(1))
    b = submit(tx, queue="b", now=at(2))
    a2 = submit(tx, queue="a", now=at(3))
    leased = lease(tx, queue="a", worker="w9")
    assert leased["rn"] == a["rn"]
    rns = lambda **kw: [r["task"]["rn"] for r in tx.call("list_tasks", **kw)]  # noqa: E731
    assert len(rns()) == 3
    assert rns(queue="a") == [a2["rn"], a["rn"]]  # newest first
    assert rns(queue="b") == [b["rn"]]
    assert rns(status="running") == [leased["rn"]]
    assert rns(owner="w9") == [leased["rn"]]
    assert rns(queue="a", status="ready", owner="w9") == []
    assert len(rns(max_tasks=2)) == 2
    with pytest.raises(errors.InvalidArgument) as info:
        tx.call("list_tasks", status="done")
    assert code_of(info) == "PS208"
    with pytest.raises(errors.InvalidArgument):
        tx.call("list_tasks", max_tasks=0)


# ------------------------------------------------------------------ workers and leasing


def test_register_worker_gives_unique_ids_from_a_sequence(tx):
    ids = [tx.call_value("register_worker") for _ in range(3)]
    nums = [int(i.removeprefix("worker-")) for i in ids]
    assert all(i.startswith("worker-") for i in ids) and nums == sorted(set(nums))


def test_lease_makes_the_task_running_with_owner_deadline_and_history(tx):
    rn = submit(tx, now=at(0))["rn"]
    task = lease(tx, worker="worker-27", timeout=timedelta(seconds=30), now=at(5))
    assert task["rn"] == rn and task["status"] == "running" and task["owner"] == "worker-27"
    assert uuid.UUID(task["token"])  # the lease's secret, in the lease answer only
    assert "token" not in tx.call_value("get_task", rn=rn)
    assert datetime.fromisoformat(task["deadline"]) == at(35)
    assert datetime.fromisoformat(task["updated"]) == at(5)
    assert task["history"] == [{"_typ": "TaskAssignment", "worker": "worker-27", "time": task["updated"]}]
    assert lease(tx, worker="worker-28") is None  # nothing else is ready


def test_default_timeout_is_ten_seconds(tx):
    submit(tx)
    task = lease(tx, now=at(0))
    assert datetime.fromisoformat(task["deadline"]) == at(10)


def test_priority_is_numeric_10_beats_9_beats_2(tx):
    for p in (2, 9, 10):
        submit(tx, priority=p, spec={"p": p})
    assert [lease(tx)["priority"] for _ in range(3)] == [10, 9, 2]


def test_equal_priority_oldest_first_and_queues_are_separate(tx):
    submit(tx, spec={"i": "new"}, now=at(20))
    submit(tx, spec={"i": "old"}, now=at(10))
    submit(tx, queue="other", spec={"i": "other"}, now=at(0))
    assert [lease(tx)["spec"]["i"] for _ in range(2)] == ["old", "new"]
    assert lease(tx) is None


def test_lease_tasks_takes_n_in_claim_order(tx):
    tx.call("submit_tasks", queue="q", specs=Jsonb([{"i": i} for i in range(5)]), priority=1)
    top = submit(tx, priority=3)
    got = [r["task"] for r in tx.call("lease_tasks", queue="q", worker="w", n=3)]
    assert len({t["token"] for t in got}) == 3
    assert len(got) == 3 and top["rn"] in {t["rn"] for t in got}
    assert len(tx.call("lease_tasks", queue="q", worker="w", n=10)) == 3


@pytest.mark.parametrize("args", [dict(n=0), dict(timeout=timedelta(0)), dict(worker=""),
                                  dict(worker=None), dict(queue=""), dict(aging_rate=-1)])
def test_bad_lease_arguments_are_ps208(tx, args):
    call = dict(queue="q", worker="w", n=1) | args
    with pytest.raises(errors.InvalidArgument) as info:
        tx.call("lease_tasks", **call)
    assert code_of(info) == "PS208"


# ------------------------------------------------------------------ heartbeat


def test_heartbeat_extends_the_deadline_and_reports_progress(tx):
    submit(tx)
    h = held(lease(tx, now=at(0)))
    beat = value(tx, "heartbeat_task", at(8), **h, progress=0.25, timeout=timedelta(seconds=60))
    assert datetime.fromisoformat(beat["deadline"]) == at(68) and beat["progress"] == 0.25
    beat = value(tx, "heartbeat_task", at(9), **h)
    assert beat["progress"] == 0.25 and datetime.fromisoformat(beat["deadline"]) == at(19)
    task = tx.call_value("get_task", rn=h["rn"])
    assert task["status"] == "running" and len(task["history"]) == 1 and task["deadline"] == beat["deadline"]


def test_heartbeat_answer_is_small(tx):
    """Item 10: a beat answers rn, status, progress and deadline, not the whole task."""
    submit(tx, spec={"big": "x" * 10000})
    h = held(lease(tx))
    beat = tx.call_value("heartbeat_task", **h, progress=0.5)
    assert set(beat) == {"rn", "status", "progress", "deadline"}
    assert (beat["rn"], beat["status"], beat["progress"]) == (h["rn"], "running", 0.5)
    assert len(str(beat)) < 200


@pytest.mark.parametrize("progress", [-0.1, 1.5, float("nan")])
def test_heartbeat_progress_outside_0_1_is_ps205(tx, progress):
    submit(tx)
    h = held(lease(tx))
    with pytest.raises(errors.InvalidArgument) as info:
        tx.call("heartbeat_task", **h, progress=progress)
    assert code_of(info) == "PS205"


def test_heartbeat_error_codes(tx):
    submit(tx)
    h = held(lease(tx, worker="w1"))
    with pytest.raises(errors.TaskNotFound) as info:
        tx.call("heartbeat_task", rn=uuid.uuid4(), token=h["token"])
    assert code_of(info) == "PS200"
    with pytest.raises(errors.TaskNotOwned) as info:
        tx.call("heartbeat_task", rn=h["rn"], token=uuid.uuid4())
    assert code_of(info) == "PS201"
    with pytest.raises(errors.InvalidArgument) as info:
        tx.call("heartbeat_task", **h, timeout=timedelta(seconds=-1))
    assert code_of(info) == "PS208"
    tx.call("complete_task", **h)
    with pytest.raises(errors.TaskNotRunning) as info:
        tx.call("heartbeat_task", **h)
    assert code_of(info) == "PS202"


def test_heartbeat_after_timeout_and_release_is_not_the_owner(tx):
    submit(tx)
    h = held(lease(tx, worker="w1", now=at(0)))
    call(tx, "reset_expired_tasks", at(11))
    with pytest.raises(errors.TaskNotRunning):
        call(tx, "heartbeat_task", at(12), **h)
    assert lease(tx, worker="w2", now=at(13))["rn"] == h["rn"]
    with pytest.raises(errors.TaskNotOwned):
        call(tx, "heartbeat_task", at(14), **h)


def test_only_the_token_of_the_current_lease_proves_ownership(tx):
    """Item 2: the worker id is a label anyone can pass; the token is the proof. The same
    worker leasing the task again gets a new token, so its earlier execution's late
    completion cannot finish the new lease (the race of a completion sent as the task is
    re-leased)."""
    submit(tx)
    first = lease(tx, worker="w1", now=at(0))
    call(tx, "reset_expired_tasks", at(11))
    second = lease(tx, worker="w1", now=at(12))  # the same worker, a new lease
    assert second["rn"] == first["rn"] and second["token"] != first["token"]
    for fn, args in [("complete_task", {}), ("heartbeat_task", {}), ("yield_task", {}),
                     ("abort_task", {"errors": Jsonb([{"code": "stale"}])})]:
        with pytest.raises(errors.TaskNotOwned) as info:
            tx.call(fn, **held(first), **args)
        assert code_of(info) == "PS201", fn
    assert tx.call("complete_tasks", rns=[first["rn"]], tokens=[first["token"]]) == [
        {"rn": uuid.UUID(first["rn"]), "sqlstate": "PS201"}]
    with pytest.raises(errors.TaskNotOwned):
        tx.call("complete_and_lease", worker="w1", queue="q", **held(first))
    assert tx.call_value("get_task", rn=first["rn"])["status"] == "running"
    assert tx.call_value("complete_task", **held(second))["status"] == "completed"


# ------------------------------------------------------------------ complete / abort / yield


def test_complete_sets_progress_one(tx):
    submit(tx)
    h = held(lease(tx))
    tx.call("heartbeat_task", **h, progress=0.4)
    task = value(tx, "complete_task", at(100), **h)
    assert (task["status"], task["progress"], task["owner"], task["deadline"]) == ("completed", 1, "w1", None)
    assert datetime.fromisoformat(task["updated"]) == at(100)
    with pytest.raises(errors.TaskNotRunning) as info:
        tx.call("complete_task", **h)
    assert code_of(info) == "PS202"


def test_complete_with_a_wrong_token_or_unknown_task(tx):
    submit(tx)
    h = held(lease(tx))
    with pytest.raises(errors.TaskNotOwned):
        tx.call("complete_task", rn=h["rn"], token=uuid.uuid4())
    with pytest.raises(errors.TaskNotFound):
        tx.call("complete_task", rn=uuid.uuid4(), token=h["token"])
    assert tx.call_value("get_task", rn=h["rn"])["status"] == "running"


def test_complete_tasks_batch_reports_what_it_did_not_complete(tx):
    tx.call("submit_tasks", queue="q", specs=Jsonb([{"i": i} for i in range(4)]))
    mine = [r["task"] for r in tx.call("lease_tasks", queue="q", worker="w1", n=3)]
    theirs = lease(tx, worker="w2")
    tx.call("cancel_task", rn=mine[2]["rn"])
    unknown = str(uuid.uuid4())
    rns = [t["rn"] for t in mine] + [theirs["rn"], unknown]
    tokens = [t["token"] for t in mine] + [mine[0]["token"], mine[0]["token"]]
    failed = {str(r["rn"]): r["sqlstate"] for r in tx.call("complete_tasks", rns=rns, tokens=tokens)}
    assert failed == {mine[2]["rn"]: "PS203", theirs["rn"]: "PS201", unknown: "PS200"}
    assert [tx.call_value("get_task", rn=t["rn"])["status"] for t in mine] == ["completed", "completed", "cancelled"]
    again = tx.call("complete_tasks", rns=[mine[0]["rn"]], tokens=[mine[0]["token"]])
    assert [r["sqlstate"] for r in again] == ["PS202"]
    with pytest.raises(errors.InvalidArgument) as info:
        tx.call("complete_tasks", rns=rns, tokens=tokens[:1])
    assert code_of(info) == "PS208"


def cal(db, task, queue="q", worker="w1", now=None, **kw):
    """complete_and_lease of the held ``task`` (None: lease only)."""
    return value(db, "complete_and_lease", now, worker=worker, queue=queue,
                 **(held(task) if task else {}), **kw)


def test_complete_and_lease_completes_the_held_task_and_leases_the_next(tx):
    first = submit(tx, priority=9, now=at(0))["rn"]
    second = submit(tx, priority=1, now=at(0))["rn"]
    got = cal(tx, None, timeout=timedelta(seconds=30), now=at(1))  # nothing held: lease only
    assert got["rn"] == first and got["status"] == "running" and got["owner"] == "w1"
    assert datetime.fromisoformat(got["deadline"]) == at(31) and types_of(got) == ["TaskAssignment"]
    tx.call("heartbeat_task", **held(got), progress=0.3)
    nxt = cal(tx, got, timeout=timedelta(seconds=30), now=at(5))
    assert nxt["rn"] == second and nxt["status"] == "running" and nxt["owner"] == "w1"
    assert datetime.fromisoformat(nxt["deadline"]) == at(35) and nxt["token"] != got["token"]
    assert nxt["history"] == [{"_typ": "TaskAssignment", "worker": "w1", "time": nxt["updated"]}]
    done = tx.call_value("get_task", rn=first)
    assert (done["status"], done["progress"], done["owner"], done["deadline"]) == ("completed", 1, "w1", None)
    assert datetime.fromisoformat(done["updated"]) == at(5) and types_of(done) == ["TaskAssignment"]
    assert cal(tx, nxt) is None  # completed; nothing left to lease
    assert tx.call_value("get_task", rn=second)["status"] == "completed"
    assert cal(tx, None) is None


def test_complete_and_lease_refused_completion_leases_nothing(tx):
    first = submit(tx, priority=9)["rn"]
    waiting = submit(tx, priority=1)["rn"]
    got = cal(tx, None)
    assert got["rn"] == first
    tx.call("cancel_task", rn=first)
    with pytest.raises(errors.TaskCancelled) as info:
        cal(tx, got)
    assert code_of(info) == "PS203"
    assert tx.call_value("get_task", rn=first)["status"] == "cancelled"  # stays cancelled
    assert tx.call_value("get_task", rn=waiting)["status"] == "ready"  # and nothing was leased
    with pytest.raises(errors.TaskNotFound):
        cal(tx, {"rn": str(uuid.uuid4()), "token": got["token"]})
    mine = cal(tx, None)
    assert mine["rn"] == waiting
    with pytest.raises(errors.TaskNotOwned):
        cal(tx, {"rn": mine["rn"], "token": str(uuid.uuid4())}, worker="w2")
    with pytest.raises(errors.InvalidArgument) as info:  # a bad lease argument undoes the completion too
        cal(tx, mine, queue="")
    assert code_of(info) == "PS208"
    assert tx.call_value("get_task", rn=mine["rn"])["status"] == "running"
    assert cal(tx, mine) is None
    with pytest.raises(errors.TaskNotRunning):
        cal(tx, mine)


def sync_commit(c) -> str:
    return c.execute("SELECT current_setting('synchronous_commit')").fetchone()[0]


def test_complete_and_lease_commits_the_completion_durably(dsn, db):
    submit(db)
    submit(db)
    with psycopg.connect(dsn) as c:  # explicit transactions
        t = c.execute("SELECT pyscheduler.complete_and_lease(worker => 'w1', queue => 'q')").fetchone()[0]
        c.commit()
        t = c.execute("SELECT pyscheduler.complete_and_lease(worker => 'w1', queue => 'q', rn => %s, token => %s)",
                      (t["rn"], t["token"])).fetchone()[0]
        assert sync_commit(c) == "on"
        c.commit()
        submit(db, priority=1, now=at(0))
        submit(db, priority=5, now=at(90))
        # the aging path (through _lease_tasks) too: the completion stays durable
        got = c.execute("SELECT pyscheduler._complete_and_lease(worker => 'w1', queue => 'q', rn => %s, token => %s,"
                        " aging_rate => 1.0, aging_cap => 255, p_now => %s)",
                        (t["rn"], t["token"], at(100))).fetchone()[0]
        assert got["priority"] == 1  # aged past 5
        assert sync_commit(c) == "on"
        c.commit()
    assert db.call_value("get_task", rn=t["rn"])["status"] == "completed"


LEASE_CALLS = [
    "SELECT pyscheduler.lease_task(queue => 'q', worker => 'w1')",
    "SELECT * FROM pyscheduler.lease_tasks(queue => 'q', worker => 'w1', n => 2)",
    "SELECT pyscheduler.complete_and_lease(worker => 'w1', queue => 'q')",
    "SELECT pyscheduler.heartbeat_task(rn => {rn}, token => {token})",
]


@pytest.mark.parametrize("sql", LEASE_CALLS)
def test_a_lease_call_inside_a_larger_transaction_leaves_its_durability_alone(dsn, db, sql):
    """Item 4: lease and heartbeat functions used to SET LOCAL synchronous_commit = off, so
    the caller's own writes in the same transaction lost their durability."""
    db.call("submit_tasks", queue="q", specs=Jsonb([{}, {}, {}]))
    h = held(lease(db))
    query = sql.format(rn=f"'{h['rn']}'", token=f"'{h['token']}'")
    with psycopg.connect(dsn) as c:  # an explicit transaction: the caller writes too
        c.execute("CREATE TABLE mine (x int)")
        c.execute(query, prepare=False)
        c.execute("INSERT INTO mine VALUES (1)")
        assert sync_commit(c) == "on"
        c.commit()
    with psycopg.connect(dsn, autocommit=True) as c:  # from the caller's own function
        c.execute("CREATE FUNCTION mine_fn() RETURNS text LANGUAGE plpgsql AS $f$ BEGIN "
                  f"PERFORM * FROM ({query}) x; INSERT INTO mine VALUES (2); "
                  "RETURN current_setting('synchronous_commit'); END $f$")
        assert c.execute("SELECT mine_fn()", prepare=False).fetchone()[0] == "on"
        # two statements in one query message: one implicit transaction with the caller's insert
        cur = c.execute(f"{query}; INSERT INTO mine VALUES (3); SELECT current_setting('synchronous_commit')",
                        prepare=False)
        while cur.nextset():
            pass
        assert cur.fetchone()[0] == "on"


def test_a_lease_call_that_is_the_whole_transaction_still_commits_asynchronously(dsn, db):
    """The speed stays where nothing else shares the commit: one statement, its own transaction."""
    db.call("submit_tasks", queue="q", specs=Jsonb([{}, {}]))
    with psycopg.connect(dsn, autocommit=True) as c:
        got = c.execute("SELECT pyscheduler.lease_task(queue => 'q', worker => 'w1') IS NOT NULL, "
                        "current_setting('synchronous_commit')", prepare=False).fetchone()
        assert got == (True, "off")
        assert sync_commit(c) == "on"  # and only for that transaction


def test_abort_records_errors_in_the_seed_shape(tx):
    submit(tx)
    h = held(lease(tx))
    task = tx.call_value("abort_task", **h, errors=Jsonb([
        {"code": "new task added", "args": {"id": 2}, "description": "new task superseded"},
        {"code": "bare"}]))
    assert task["status"] == "aborted" and task["deadline"] is None
    assert task["errors"] == [{"code": "new task added", "args": {"id": 2}, "description": "new task superseded"},
                              {"code": "bare", "args": {}, "description": ""}]
    with pytest.raises(errors.TaskNotRunning):
        tx.call("abort_task", **h, errors=Jsonb([{"code": "x"}]))


@pytest.mark.parametrize("errs", [[], {"code": "x"}, [{"args": {}}], [{"code": 1}], [{"code": "x", "args": []}],
                                  [{"code": "x", "description": 3}], ["x"], None])
def test_abort_with_malformed_errors_is_ps207(tx, errs):
    submit(tx)
    h = held(lease(tx))
    with pytest.raises(errors.InvalidArgument) as info:
        tx.call("abort_task", **h, errors=Jsonb(errs) if errs is not None else None)
    assert code_of(info) == "PS207"
    assert tx.call_value("get_task", rn=h["rn"])["status"] == "running"


def test_yield_returns_to_ready_without_a_timeout_entry(tx):
    submit(tx)
    h = held(lease(tx, worker="w1", now=at(0)))
    call(tx, "heartbeat_task", at(1), **h, progress=0.1)
    task = value(tx, "yield_task", at(2), **h)
    assert datetime.fromisoformat(task["deadline"]) == at(1) and task["status"] == "running"
    assert task["history"][-1] == {"_typ": "TaskYield", "worker": "w1", "progress": 0.1, "time": task["updated"]}
    reset = [r["task"] for r in call(tx, "reset_expired_tasks", at(2))]
    assert [t["rn"] for t in reset] == [h["rn"]]
    assert [h["_typ"] for h in reset[0]["history"]] == ["TaskAssignment", "TaskYield"]
    assert (reset[0]["status"], reset[0]["owner"], reset[0]["progress"]) == ("ready", None, 0)
    assert lease(tx, worker="w2", now=at(3))["rn"] == h["rn"]


def test_yield_error_codes(tx):
    submit(tx)
    h = held(lease(tx))
    with pytest.raises(errors.TaskNotOwned):
        tx.call("yield_task", rn=h["rn"], token=uuid.uuid4())
    with pytest.raises(errors.TaskNotFound):
        tx.call("yield_task", rn=uuid.uuid4(), token=h["token"])
    tx.call("cancel_task", rn=h["rn"])
    with pytest.raises(errors.TaskCancelled):
        tx.call("yield_task", **h)


def test_a_yielded_lease_is_over(tx):
    """Item 6: after yield_task, the same lease's heartbeat used to be accepted (cancelling
    the yield), a second yield appended history again, and complete succeeded."""
    submit(tx)
    h = held(lease(tx, now=at(0)))
    call(tx, "yield_task", at(1), **h)
    for fn, args in [("heartbeat_task", {}), ("yield_task", {}), ("complete_task", {}),
                     ("abort_task", {"errors": Jsonb([{"code": "late"}])})]:
        with pytest.raises(errors.TaskYielded) as info:
            call(tx, fn, at(2), **h, **args)
        assert code_of(info) == "PS210", fn
    task = tx.call_value("get_task", rn=h["rn"])
    assert types_of(task) == ["TaskAssignment", "TaskYield"] and datetime.fromisoformat(task["deadline"]) == at(0)
    assert [r["task"]["status"] for r in call(tx, "reset_expired_tasks", at(3))] == ["ready"]


# ------------------------------------------------------------------ cancel


def test_cancel_ready_task_is_terminal_and_never_leased(tx):
    rn = submit(tx)["rn"]
    task = tx.call_value("cancel_task", rn=rn)
    assert task["status"] == "cancelled" and task["owner"] is None
    assert lease(tx) is None
    assert tx.call_value("cancel_task", rn=rn) == task  # idempotent


def test_cancel_running_task_the_owner_learns_on_heartbeat_and_completion_keeps_it_cancelled(tx):
    submit(tx)
    h = held(lease(tx, worker="w1"))
    rn = h["rn"]
    task = tx.call_value("cancel_task", rn=rn)
    assert (task["status"], task["owner"], task["deadline"]) == ("cancelled", "w1", None)
    with pytest.raises(errors.TaskCancelled) as info:
        tx.call("heartbeat_task", **h, progress=0.5)
    assert code_of(info) == "PS203"
    with pytest.raises(errors.TaskCancelled):
        tx.call("complete_task", **h)
    with pytest.raises(errors.TaskCancelled):
        tx.call("abort_task", **h, errors=Jsonb([{"code": "x"}]))
    assert tx.call_value("get_task", rn=rn)["status"] == "cancelled"
    assert call(tx, "reset_expired_tasks", at(10**6)) == []


def test_cancel_finished_or_unknown_task(tx):
    submit(tx)
    h = held(lease(tx))
    rn = h["rn"]
    tx.call("complete_task", **h)
    with pytest.raises(errors.TaskFinished) as info:
        tx.call("cancel_task", rn=rn)
    assert code_of(info) == "PS209"
    with pytest.raises(errors.TaskNotFound):
        tx.call("cancel_task", rn=uuid.uuid4())


# ------------------------------------------------------------------ monitor


def test_reset_expired_only_after_the_deadline_with_task_timeout(tx):
    submit(tx)
    h = held(lease(tx, worker="w1", now=at(0)))
    call(tx, "heartbeat_task", at(5), **h, progress=0.23)  # deadline 15
    assert call(tx, "reset_expired_tasks", at(14)) == []
    [row] = call(tx, "reset_expired_tasks", at(16))
    task = row["task"]
    assert (task["status"], task["owner"], task["progress"], task["deadline"]) == ("ready", None, 0, None)
    assert task["history"][-1] == {"_typ": "TaskTimeout", "worker": "w1", "progress": 0.23,
                                   "time": task["updated"]}
    assert task["updated"].endswith("Z") and all(e["time"].endswith("Z") for e in task["history"])
    assert call(tx, "reset_expired_tasks", at(100)) == []


def test_reset_expired_tasks_in_batches(tx):
    tx.call("submit_tasks", queue="q", specs=Jsonb([{}] * 5))
    call(tx, "lease_tasks", at(0), queue="q", worker="w", n=5)
    assert len(call(tx, "reset_expired_tasks", at(20), max_tasks=3)) == 3
    assert len(call(tx, "reset_expired_tasks", at(20), max_tasks=3)) == 2


def test_cleanup_keeps_tasks_within_retention_and_unfinished_ones(tx):
    old_done = submit(tx, spec={"k": "old_done"}, now=at(0))["rn"]
    recent_done = submit(tx, spec={"k": "recent_done"}, now=at(0))["rn"]
    old_ready = submit(tx, spec={"k": "old_ready"}, now=at(0))["rn"]
    call(tx, "cancel_task", at(0), rn=old_done)
    call(tx, "cancel_task", at(3000), rn=recent_done)
    hour = timedelta(hours=1)
    assert value(tx, "cleanup_tasks", at(3599), retention=hour) == 0  # not yet past retention
    assert value(tx, "cleanup_tasks", at(3700), retention=hour) == 1
    assert {r["task"]["rn"] for r in tx.call("list_tasks")} == {recent_done, old_ready}
    assert value(tx, "cleanup_tasks", at(3700), retention=hour) == 0
    with pytest.raises(errors.InvalidArgument) as info:
        tx.call("cleanup_tasks", retention=-hour)
    assert code_of(info) == "PS208"


def test_views_for_psql(tx):
    submit(tx, queue="a", now=at(0))
    submit(tx, queue="a", now=at(1))
    submit(tx, queue="b", now=at(2))
    an_hour_ago = datetime.now(timezone.utc) - timedelta(hours=1)  # the views read the real clock
    lease(tx, queue="b", timeout=timedelta(seconds=1), now=an_hour_ago)
    counts = {(r["queue"], r["status"]): r["tasks"] for r in tx.query("SELECT * FROM pyscheduler.task_counts")}
    assert counts == {("a", "ready"): 2, ("b", "running"): 1}
    assert [r["queue"] for r in tx.query("SELECT * FROM pyscheduler.expired_leases")] == ["b"]
    oldest = tx.query("SELECT * FROM pyscheduler.oldest_ready_tasks")
    assert [(r["queue"], r["created"]) for r in oldest] == [("a", at(0))]


# ------------------------------------------------------------------ interleavings and concurrency


def _session(dsn):
    return psycopg.connect(dsn, row_factory=dict_row)  # not autocommit: explicit transactions


def test_interleaving_a_open_lease_b_skips_the_locked_row(dsn, db):
    first = submit(db, priority=9)["rn"]
    second = submit(db, priority=1)["rn"]
    with _session(dsn) as a, _session(dsn) as b:
        got_a = a.execute("SELECT pyscheduler.lease_task(queue => 'q', worker => 'A') AS t").fetchone()["t"]
        assert got_a["rn"] == first  # A holds the row lock, transaction still open
        got_b = b.execute("SELECT pyscheduler.lease_task(queue => 'q', worker => 'B') AS t").fetchone()["t"]
        assert got_b["rn"] == second  # B did not wait for A and did not take A's row
        b.commit()
        a.rollback()  # A crashed before committing: its task is ready again
    assert lease(db, worker="C")["rn"] == first


def test_interleaving_heartbeat_waits_for_cancel_and_sees_it(dsn, db):
    submit(db)
    h = held(lease(db, worker="w1"))
    rn = h["rn"]
    with _session(dsn) as a:
        a.execute("SELECT pyscheduler.cancel_task(rn => %s)", (rn,))  # open, row locked
        result: queue_mod.Queue = queue_mod.Queue()

        def beat():
            try:
                db.call("heartbeat_task", **h)
                result.put("ok")
            except errors.SchedulerError as exc:
                result.put(exc.sqlstate)

        t = threading.Thread(target=beat)
        t.start()
        # the heartbeat blocks on the row lock until the cancel commits
        deadline = threading.Event()
        for _ in range(200):
            waiting = db.query("SELECT count(*) AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                               " AND datname = current_database()")[0]["n"]
            if waiting:
                break
            deadline.wait(0.02)
        assert waiting, "heartbeat did not wait for the cancel's row lock"
        a.commit()
        t.join(10)
    assert result.get(timeout=1) == "PS203"


def test_interleaving_monitor_skips_a_task_whose_heartbeat_is_in_flight(dsn, db):
    submit(db)
    t = lease(db, worker="w1", now=at(0))  # deadline at(10)
    rn = t["rn"]
    with _session(dsn) as a:
        # A: the heartbeat at at(9) extends the deadline to at(19), not yet committed
        a.execute("SELECT pyscheduler._heartbeat_task(rn => %s, token => %s, p_now => %s)", (rn, t["token"], at(9)))
        # the monitor at at(12) sees the old deadline as expired but must not wait for, nor reset, the row
        assert call(db, "reset_expired_tasks", at(12)) == []
        a.commit()
    assert call(db, "reset_expired_tasks", at(12)) == []  # the committed heartbeat holds until at(19)
    assert db.call_value("get_task", rn=rn)["owner"] == "w1"
    assert [r["task"]["rn"] for r in call(db, "reset_expired_tasks", at(20))] == [rn]


def test_interleaving_completion_racing_the_monitor_wins_once(dsn, db):
    submit(db)
    t = lease(db, worker="w1", now=at(0))
    rn = t["rn"]
    with _session(dsn) as a:
        a.execute("SELECT pyscheduler._complete_task(rn => %s, token => %s, p_now => %s)", (rn, t["token"], at(11)))
        assert call(db, "reset_expired_tasks", at(12)) == []  # skipped: locked by the completion
        a.commit()
    assert call(db, "reset_expired_tasks", at(12)) == []
    task = db.call_value("get_task", rn=rn)
    assert task["status"] == "completed" and types_of(task) == ["TaskAssignment"]


def test_concurrent_workers_never_hold_the_same_task(dsn, db):
    total, workers = 400, 4
    db.call("submit_tasks", queue="c", specs=Jsonb([{"i": i} for i in range(total)]))
    leased: list[list[str]] = [[] for _ in range(workers)]
    barrier = threading.Barrier(workers)

    def work(k: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            barrier.wait()
            while True:
                rows = c.execute("SELECT task ->> 'rn' FROM pyscheduler.lease_tasks("
                                 "queue => 'c', worker => %s, n => 7)", (f"w{k}",)).fetchall()
                if not rows:
                    return
                leased[k] += [r[0] for r in rows]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    everything = [rn for part in leased for rn in part]
    assert len(everything) == total == len(set(everything))
    owners = db.query("SELECT owner, count(*) AS n FROM pyscheduler.tasks GROUP BY owner")
    assert sum(r["n"] for r in owners) == total and all(r["owner"] for r in owners)
    assert {r["owner"]: r["n"] for r in owners} == {f"w{k}": len(leased[k]) for k in range(workers)
                                                      if leased[k]}


def test_interleaving_complete_and_lease_skips_a_row_another_worker_is_leasing(dsn, db):
    first = submit(db, priority=9)["rn"]
    second = submit(db, priority=5)["rn"]
    third = submit(db, priority=1)["rn"]
    mine = cal(db, None, worker="B")
    assert mine["rn"] == first
    with _session(dsn) as a:
        got_a = a.execute("SELECT pyscheduler.lease_task(queue => 'q', worker => 'A') AS t").fetchone()["t"]
        assert got_a["rn"] == second  # A holds the row lock, transaction open
        nxt = cal(db, mine, worker="B")
        assert nxt["rn"] == third  # B completed its task and skipped A's row
        a.rollback()  # A crashed before committing: its task is ready again
    assert db.call_value("get_task", rn=first)["status"] == "completed"
    assert cal(db, nxt, worker="B")["rn"] == second


def test_interleaving_complete_and_lease_racing_the_monitor_wins_once(dsn, db):
    submit(db)
    t = lease(db, worker="w1", now=at(0))
    rn = t["rn"]
    with _session(dsn) as a:
        a.execute("SELECT pyscheduler._complete_and_lease(worker => 'w1', queue => 'q', rn => %s, token => %s,"
                  " p_now => %s)", (rn, t["token"], at(11)))
        assert call(db, "reset_expired_tasks", at(12)) == []  # skipped: locked by the completion
        a.commit()
    assert call(db, "reset_expired_tasks", at(12)) == []
    task = db.call_value("get_task", rn=rn)
    assert task["status"] == "completed" and types_of(task) == ["TaskAssignment"]


def test_concurrent_complete_and_lease_workers_never_hold_the_same_task(dsn, db):
    total, workers = 300, 4
    db.call("submit_tasks", queue="c", specs=Jsonb([{"i": i} for i in range(total)]))
    leased: list[list[str]] = [[] for _ in range(workers)]
    barrier = threading.Barrier(workers)

    def work(k: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            barrier.wait()
            rn = token = None
            while True:
                rn, token = c.execute("SELECT t ->> 'rn', t ->> 'token' FROM pyscheduler.complete_and_lease("
                                      "worker => %s, queue => 'c', rn => %s, token => %s) AS t",
                                      (f"w{k}", rn, token)).fetchone()
                if rn is None:
                    return
                leased[k].append(rn)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    everything = [rn for part in leased for rn in part]
    assert len(everything) == total == len(set(everything))
    rows = db.query("SELECT owner, status::text AS status, count(*) AS n FROM pyscheduler.tasks"
                    " WHERE queue = 'c' GROUP BY owner, status")
    assert {r["status"] for r in rows} == {"completed"}
    assert {r["owner"]: r["n"] for r in rows} == {f"w{k}": len(leased[k]) for k in range(workers) if leased[k]}


# ------------------------------------------------------------------ fairness (aging)


def test_aging_lets_an_old_low_priority_task_through_a_stream_of_high_ones(tx):
    def stream(queue: str, aging_rate: float) -> int | None:
        """Each second a priority-100 task arrives and one task is leased; when does low go?"""
        low = submit(tx, queue=queue, priority=1, spec={"k": "low"}, now=at(0))["rn"]
        for second in range(1, 150):
            submit(tx, queue=queue, priority=100, now=at(second))
            task = lease(tx, queue=queue, aging_rate=aging_rate, aging_cap=255, now=at(second))
            if task["rn"] == low:
                return second
        return None

    assert stream("off", 0) is None  # aging off (the default): starved
    # on: 1 + 1/s * age reaches the fresh task's 100 after ~99 s (ties go to the older task)
    assert stream("on", 1.0) == 99


def test_aging_never_lowers_a_priority_above_the_cap(tx):
    submit(tx, priority=1000, spec={"k": "high"}, now=at(10))
    submit(tx, priority=1, spec={"k": "old"}, now=at(0))
    assert lease(tx, aging_rate=100.0, aging_cap=255, now=at(20))["spec"]["k"] == "high"


# ------------------------------------------------------------------ notifications and roles


def test_submit_and_cancel_notify(dsn, db):
    got: queue_mod.Queue = queue_mod.Queue()
    listener = Listener(dsn, ["pyscheduler_tasks:q", "pyscheduler_cancel:w1"],
                        lambda ch, payload: got.put(ch)).start()
    try:
        assert listener.ready.wait(10)
        rn = submit(db)["rn"]
        assert got.get(timeout=10) == "pyscheduler_tasks:q"
        lease(db, worker="w1")
        db.call("cancel_task", rn=rn)
        assert got.get(timeout=10) == "pyscheduler_cancel:w1"
    finally:
        listener.stop()


def test_roles_split_client_worker_admin(dsn, db):
    suffix = uuid.uuid4().hex[:8]
    with psycopg.connect(dsn, autocommit=True) as c:
        for audience in ("client", "worker"):
            c.execute(f"CREATE ROLE t_{audience}_{suffix} LOGIN IN ROLE pyscheduler_{audience}")
    try:
        rn = submit(db)["rn"]
        params = psycopg.conninfo.conninfo_to_dict(dsn)
        with psycopg.connect(**(params | {"user": f"t_client_{suffix}"}), autocommit=True) as client:
            client.execute("SELECT pyscheduler.get_task(rn => %s)", (rn,))
            client.execute("SELECT * FROM pyscheduler.task_counts")
            for call in ("SELECT pyscheduler.lease_task(queue => 'q', worker => 'x')",
                         "SELECT * FROM pyscheduler.reset_expired_tasks()"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    client.execute(call)
        with psycopg.connect(**(params | {"user": f"t_worker_{suffix}"}), autocommit=True) as worker:
            assert worker.execute("SELECT pyscheduler.lease_task(queue => 'q', worker => 'x')").fetchone()[0]
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                worker.execute("SELECT pyscheduler.cleanup_tasks()")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                worker.execute("SELECT pyscheduler.cancel_task(rn => %s)", (rn,))
    finally:
        with psycopg.connect(dsn, autocommit=True) as c:
            for audience in ("client", "worker"):
                c.execute(f"DROP ROLE t_{audience}_{suffix}")
