"""Leased tasks against bad input, hostile callers and crash loops."""

from __future__ import annotations

import re
import uuid

import psycopg
import pytest

from tests.support import REPO
from pyscheduler import errors
from pyscheduler.db import Jsonb

from tests.support.tasks import at, call, code_of, held, lease, submit, types_of

PUBLIC_TASK_FUNCTIONS = ("submit_task", "submit_tasks", "cancel_task", "lease_task", "lease_tasks",
                         "heartbeat_task", "complete_task", "complete_tasks", "complete_and_lease", "abort_task",
                         "yield_task", "reset_expired_tasks", "cleanup_tasks", "lease_tasks_lean",
                         "heartbeat_tasks", "yield_tasks", "fail_task", "fail_tasks", "retry_task", "retry_tasks",
                         "pause_queue", "resume_queue")


# ------------------------------------------------------------------ item 1: the clock


def test_no_public_tasks_function_takes_a_clock(tx):
    """Item 1: every role could pass `now` (a client jumping the queue, a worker heartbeating
    to 2999). Public functions read the database clock; the private twins that take p_now
    are granted to no role."""
    rows = tx.execute(
        "SELECT p.proname, p.proargnames, p.oid FROM pg_proc p "
        "WHERE p.pronamespace = 'pyscheduler'::regnamespace AND p.proname = ANY(%s)",
        (list(PUBLIC_TASK_FUNCTIONS),)).fetchall()
    assert {r["proname"] for r in rows} == set(PUBLIC_TASK_FUNCTIONS)
    for r in rows:
        assert not {"now", "p_now"} & set(r["proargnames"] or []), r["proname"]
    roles = [tx.execute("SELECT pyscheduler._role(%s) AS r", (a,)).fetchone()["r"]
             for a in ("client", "worker", "relay", "scheduler", "checker", "monitor", "admin")]
    for name in PUBLIC_TASK_FUNCTIONS:
        [private] = tx.execute("SELECT p.oid FROM pg_proc p WHERE p.pronamespace = 'pyscheduler'::regnamespace "
                                 "AND p.proname = %s", ("_" + name,)).fetchall()
        for role in roles:
            assert not tx.execute("SELECT has_function_privilege(%s, %s::oid, 'EXECUTE') AS ok",
                                    (role, private["oid"])).fetchone()["ok"], (role, name)


def test_a_worker_role_cannot_reach_the_clock(dsn, conn):
    suffix = uuid.uuid4().hex[:8]
    conn.execute(f"CREATE ROLE t_w_{suffix} LOGIN IN ROLE pyscheduler_worker")
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn) | {"user": f"t_w_{suffix}"}
        with psycopg.connect(**params, autocommit=True) as w:
            with pytest.raises(psycopg.errors.UndefinedFunction):
                w.execute("SELECT pyscheduler.lease_task(queue => 'q', worker => 'x', now => '2999-01-01')")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                w.execute("SELECT pyscheduler._heartbeat_task(rn => gen_random_uuid(), token => gen_random_uuid(),"
                          " p_now => '2999-01-01')")
    finally:
        conn.execute(f"DROP ROLE t_w_{suffix}")


# ------------------------------------------------------------------ item 6: the state machine table

STATES = ("ready", "scheduled (this lease failed)", "running (this lease)", "running (another lease)",
          "yielded (this lease)", "completed", "aborted", "cancelled", "deleted", "waiting")


def state_machine_table() -> dict[tuple[str, str], str]:
    """docs/sql-api.md's state machine: (call, state) -> 'ok' or a SQLSTATE."""
    text = (REPO / "docs" / "sql-api.md").read_text()
    section = text.split("\n### State machine\n", 1)[1]
    first_table = section[section.index("\n|") + 1:].split("\n\n", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in first_table.splitlines()]
    header = [h.strip("`") for h in rows[0][1:]]
    assert tuple(header) == STATES, header
    table = {}
    for row in rows[2:]:
        fn = re.match(r"`(\w+)", row[0])[1]
        for state, cell in zip(header, row[1:]):
            table[(fn, state)] = ("ok" if cell.startswith("ok") else cell.split()[0]
                                  if cell.startswith(("true", "false")) else re.search(r"PS\d{3}", cell)[0])
    return table


def put_task_in(db, conn, state: str) -> dict:
    """A task in ``state``, and the rn and token of 'this lease' (a lease of the task)."""
    queue = f"sm-{uuid.uuid4().hex[:8]}"  # a queue of its own: leases take this task
    if state == "waiting":  # a task after a parent that has not finished: never leased, this lease is another's
        parent = submit(db, queue=queue)["rn"]
        rn = submit(db, queue=queue, after=[parent])["rn"]
        return {"rn": rn, "token": str(uuid.uuid4())}
    rn = submit(db, queue=queue)["rn"]
    mine = lease(db, queue=queue, now=at(0))
    assert mine["rn"] == rn
    h = held(mine)
    if state == "ready":
        call(db, "reset_expired_tasks", at(100))
    elif state == "scheduled (this lease failed)":
        db.call("fail_task", **h, error=Jsonb({"code": "x"}), retry_in="1 hour")
    elif state == "running (another lease)":
        call(db, "reset_expired_tasks", at(100))
        assert lease(db, queue=queue, worker="w2", now=at(101))["rn"] == rn
    elif state == "yielded (this lease)":
        db.call("yield_task", **h)
    elif state == "completed":
        db.call("complete_task", **h)
    elif state == "aborted":
        db.call("abort_task", **h, errors=Jsonb([{"code": "x"}]))
    elif state == "cancelled":
        db.call("cancel_task", rn=rn)
    elif state == "deleted":
        conn.execute("DELETE FROM pyscheduler.tasks WHERE rn = %s", (rn,))
    return h


CALLS = {
    "heartbeat_task": lambda db, h: db.call("heartbeat_task", **h),
    "complete_task": lambda db, h: db.call("complete_task", **h),
    "complete_tasks": lambda db, h: [r["sqlstate"] for r in db.call("complete_tasks", rns=[h["rn"]],
                                                                     tokens=[h["token"]])],
    "complete_and_lease": lambda db, h: db.call("complete_and_lease", worker="w1", queue="elsewhere", **h),
    "abort_task": lambda db, h: db.call("abort_task", **h, errors=Jsonb([{"code": "x"}])),
    "yield_task": lambda db, h: db.call("yield_task", **h),
    "heartbeat_tasks": lambda db, h: [r["sqlstate"] for r in db.call("heartbeat_tasks", rns=[h["rn"]],
                                                                      tokens=[h["token"]])],
    "yield_tasks": lambda db, h: [r["sqlstate"] for r in db.call("yield_tasks", rns=[h["rn"]],
                                                                  tokens=[h["token"]])],
    "cancel_task": lambda db, h: db.call("cancel_task", rn=h["rn"]),
    "fail_task": lambda db, h: db.call("fail_task", **h, error=Jsonb({"code": "x"})),
    "fail_tasks": lambda db, h: [r["sqlstate"] for r in db.call("fail_tasks", rns=[h["rn"]], tokens=[h["token"]],
                                                                 errors=Jsonb([{"code": "x"}]))],
    "retry_task": lambda db, h: db.call("retry_task", rn=h["rn"]),
    "parent_results": lambda db, h: db.call("parent_results", **h),
    "watch_task": lambda db, h: db.call("watch_task", rn=h["rn"]),
    "holds_lease": lambda db, h: [str(db.call_value("holds_lease", **h)).lower()],
    "record_step": lambda db, h: db.call("record_step", **h, step="s"),
    "step_results": lambda db, h: db.call("step_results", **h),
    "sleep_task": lambda db, h: db.call("sleep_task", **h, duration="1 hour"),
    "await_event": lambda db, h: db.call("await_event", **h, name="e"),
}


def test_the_state_machine_table_in_the_docs_is_what_the_sql_does(tx):
    """Item 6: the documented table (which call is valid in which state, for which lease)
    is checked cell by cell against the functions."""
    table = state_machine_table()
    assert {fn for fn, _ in table} == set(CALLS)
    for (fn, state), expected in sorted(table.items()):
        h = put_task_in(tx, tx, state)
        try:
            result = CALLS[fn](tx, h)
            got = result[0] if result and isinstance(result[0], str) else "ok"
        except errors.SchedulerError as exc:
            got = exc.sqlstate
        assert got == expected, (fn, state)


@pytest.mark.parametrize("state, breaking, rule", [
    ("running", "owner = NULL", "a running task has an owner and a deadline"),
    ("running", "deadline = NULL", "a running task has an owner and a deadline"),
    ("scheduled", "run_at = NULL", "a scheduled task has a run_at"),
    ("waiting", "waiting_on = 0", "a waiting task waits for at least one parent"),
])
def test_a_row_breaking_its_states_rule_is_refused_whoever_writes_it(tx, state, breaking, rule):
    """The states' rules hold for every writer, a superuser's UPDATE too (tasks_state_rules_idx,
    migration 0055: the CHECKs' guarantee at a third of their cost a statement): 23514 naming the
    task and the rule, whether the row breaks it in its state or on entering it."""
    rn = submit(tx)["rn"]
    legal = {"running": "owner = 'w1', deadline = now()", "scheduled": "run_at = now()",
             "waiting": "waiting_on = 1"}[state]
    tx.execute(f"UPDATE pyscheduler.tasks SET status = '{state}', {legal} WHERE rn = %s", (rn,))
    with pytest.raises(psycopg.errors.CheckViolation) as e:
        tx.execute(f"UPDATE pyscheduler.tasks SET {breaking} WHERE rn = %s", (rn,))
    assert str(rn) in str(e.value) and rule in str(e.value), str(e.value)
    tx.execute(f"UPDATE pyscheduler.tasks SET status = 'ready', {breaking} WHERE rn = %s", (rn,))
    with pytest.raises(psycopg.errors.CheckViolation):
        tx.execute(f"UPDATE pyscheduler.tasks SET status = '{state}' WHERE rn = %s", (rn,))
    assert tx.execute("SELECT status FROM pyscheduler.tasks WHERE rn = %s", (rn,)).fetchone()["status"] == "ready"


# ------------------------------------------------------------------ item 8: submission order


def test_ten_thousand_tasks_of_one_submit_tasks_call_lease_in_order(tx):
    """Item 8: equal priority and equal created (one statement) used to lease in random
    (uuid) order; seq is the tie-breaker."""
    n = 10_000
    tx.call("submit_tasks", queue="order", specs=Jsonb([{"i": i} for i in range(n)]))
    got = [r["task"]["spec"]["i"] for r in tx.call("lease_tasks", queue="order", worker="w", n=4000)]
    got += [lease(tx, queue="order")["spec"]["i"] for _ in range(100)]
    got += [r["task"]["spec"]["i"] for r in tx.call("lease_tasks", queue="order", worker="w", n=n)]
    assert got == list(range(n))


def test_tasks_submitted_in_one_transaction_lease_in_submission_order(dsn, db):
    with psycopg.connect(dsn) as c:
        for i in range(50):
            c.execute("SELECT pyscheduler.submit_task(queue => 'tx', spec => %s)", (Jsonb({"i": i}),))
    assert [lease(db, queue="tx")["spec"]["i"] for _ in range(50)] == list(range(50))


# ------------------------------------------------------------------ item 9: bounds


def test_timeouts_outside_their_bounds_are_ps208(tx):
    """Item 9: '-1 month 31 days' (zero length in some months, yet "positive"), years, and
    anything over a day were accepted."""
    submit(tx)
    submit(tx)
    h = held(lease(tx))
    calls = {"lease_task": {"queue": "q", "worker": "w"}, "lease_tasks": {"queue": "q", "worker": "w"},
             "heartbeat_task": h, "complete_and_lease": {"queue": "q", "worker": "w"}}
    for fn, args in calls.items():
        for timeout in ["-1 month 31 days", "1 year", "2 days", "0", "-1 second", "1 mon", "1 day 1 second"]:
            with pytest.raises(errors.InvalidArgument) as info:
                tx.call(fn, **args, timeout=timeout)
            assert code_of(info) == "PS208" and "timeout" in str(info.value), (fn, timeout)
    assert len(tx.call("list_tasks", status="running")) == 1


def test_a_day_long_lease_is_86400_seconds_whatever_the_calendar(tx):
    submit(tx)
    task = lease(tx, timeout="1 day", now=at(0))
    assert task["deadline"] == "2030-01-02T00:00:00.000000Z"


def test_aging_outside_its_bounds_is_ps208(tx):
    """Item 9: a NaN or infinite aging_rate was accepted."""
    submit(tx)
    for fn in ("lease_task", "lease_tasks", "complete_and_lease"):
        for args in (dict(aging_rate=float("nan")), dict(aging_rate=float("inf")), dict(aging_rate=-1.0),
                     dict(aging_rate=1.0, aging_cap=-1), dict(aging_rate=1.0, aging_cap=4294967296)):
            with pytest.raises(errors.InvalidArgument) as info:
                tx.call(fn, queue="q", worker="w", **args)
            assert code_of(info) == "PS208" and "aging" in str(info.value), (fn, args)
    assert tx.call("list_tasks", status="running") == []


def test_worker_rejects_a_heartbeat_interval_not_shorter_than_the_lease():
    from pyscheduler.tasks import Worker

    for kw in (dict(timeout=5, heartbeat_interval=5), dict(timeout=5, heartbeat_interval=9),
               dict(timeout=5, heartbeat_interval=0), dict(timeout=86_401), dict(poll_interval=0)):
        with pytest.raises(errors.InvalidArgument) as info:
            Worker("dsn", "q", lambda ctx: None, **kw)
        field = "heartbeat_interval" if "heartbeat_interval" in kw else next(iter(kw))
        assert field in str(info.value)


# ------------------------------------------------------------------ item 10: limits


def set_limit(conn, name: str, value: int) -> None:
    conn.execute("UPDATE pyscheduler.settings SET value = %s WHERE name = %s", (str(value), name))


def test_spec_size_is_limited(tx):
    set_limit(tx, "task_max_spec_bytes", 1000)
    submit(tx, spec={"x": "y" * 500})
    with pytest.raises(errors.InvalidArgument) as info:
        submit(tx, spec={"x": "y" * 2000})
    assert code_of(info) == "PS206" and "task_max_spec_bytes" in str(info.value)
    with pytest.raises(errors.InvalidArgument) as info:
        tx.call("submit_tasks", queue="q", specs=Jsonb([{}, {}, {"x": "y" * 2000}]))
    assert code_of(info) == "PS206" and "specs[2]" in str(info.value)
    assert len(tx.call("list_tasks")) == 1


def test_errors_are_limited(tx):
    set_limit(tx, "task_max_errors", 3)
    set_limit(tx, "task_max_errors_bytes", 2000)
    submit(tx)
    h = held(lease(tx))
    for errs in ([{"code": "x"}] * 4, [{"code": "x", "description": "d" * 3000}]):
        with pytest.raises(errors.InvalidArgument) as info:
            tx.call("abort_task", **h, errors=Jsonb(errs))
        assert code_of(info) == "PS207"
    assert tx.call_value("abort_task", **h, errors=Jsonb([{"code": "x"}] * 3))["status"] == "aborted"


def crash_loop(db, times: int, start: int = 0) -> list[dict]:
    """The task is leased and times out ``times`` times (a worker that always dies)."""
    out = []
    for k in range(start, start + times):
        lease(db, now=at(100 * k))
        out += [r["task"] for r in call(db, "reset_expired_tasks", at(100 * k + 50))]
    return out


def test_a_task_that_keeps_timing_out_is_aborted_with_task_max_attempts(tx):
    """Item 10: the crash-loop guard. A task whose leases all time out is aborted after
    task_max_attempts leases instead of being retried forever."""
    set_limit(tx, "task_max_attempts", 3)
    rn = submit(tx)["rn"]
    resets = crash_loop(tx, 3)
    assert [t["status"] for t in resets] == ["ready", "ready", "aborted"]
    task = tx.call_value("get_task", rn=rn)
    assert task["status"] == "aborted" and task["owner"] == "w1" and task["deadline"] is None
    assert task["errors"] == [{"code": "TaskMaxAttempts", "args": {"attempts": 3, "max_attempts": 3},
                               "description": "attempt 3 of 3: the lease timed out"}]
    assert types_of(task)[-1] == "TaskTimeout"
    assert lease(tx, now=at(1000)) is None


def test_yields_do_not_count_as_attempts_and_history_is_bounded(tx):
    set_limit(tx, "task_max_attempts", 3)
    set_limit(tx, "task_max_history", 5)
    rn = submit(tx)["rn"]
    for k in range(10):  # a graceful worker yields each time (rebalancing): never aborted
        h = held(lease(tx, now=at(100 * k)))
        call(tx, "yield_task", at(100 * k + 1), **h)
        call(tx, "reset_expired_tasks", at(100 * k + 2))
    assert [t["status"] for t in crash_loop(tx, 2, start=10)] == ["ready", "ready"]
    task = tx.call_value("get_task", rn=rn)
    assert task["status"] == "ready" and len(task["history"]) == 5
    assert types_of(task) == ["TaskYield", "TaskAssignment", "TaskTimeout", "TaskAssignment", "TaskTimeout"]
    assert task["history"][-1]["time"] == task["updated"]
    assert [t["status"] for t in crash_loop(tx, 1, start=12)] == ["aborted"]


# ------------------------------------------------------------------ item 12: the NOTIFY throttle


def test_the_notify_throttle_stays_bounded_however_many_queues(tx):
    """Item 12: the throttle table used to keep one row per queue name ever used."""
    tx.call("submit_task", queue="first", spec=Jsonb({}))
    tx.execute("SELECT count(pyscheduler._notify_throttled('pyscheduler_tasks:q' || i)) "
               "FROM generate_series(1, 3000) i")
    assert tx.execute("SELECT count(*) AS n FROM pyscheduler._notify_throttle").fetchone()["n"] <= 1024


def test_channels_sharing_a_throttle_slot_both_notify(dsn, db, conn):
    """Two queues hashed to one slot must not swallow each other's wakeups."""
    slot = lambda name: conn.execute("SELECT hashtext(%s) & 1023 AS s", (name,)).fetchone()["s"]  # noqa: E731
    a = "qa"
    target = slot(f"pyscheduler_tasks:{a}")
    b = conn.execute("SELECT 'qb' || i AS q FROM generate_series(1, 500000) i "
                     "WHERE hashtext('pyscheduler_tasks:qb' || i) & 1023 = %s LIMIT 1", (target,)).fetchone()["q"]
    with psycopg.connect(dsn, autocommit=True) as listen:
        listen.execute(f'LISTEN "pyscheduler_tasks:{a}"')
        listen.execute(f'LISTEN "pyscheduler_tasks:{b}"')
        with psycopg.connect(dsn) as c:  # one transaction: within the 10 ms gap
            c.execute("SELECT pyscheduler.submit_task(queue => %s, spec => '{}')", (a,))
            c.execute("SELECT pyscheduler.submit_task(queue => %s, spec => '{}')", (b,))
        got = {n.channel for n in listen.notifies(timeout=5, stop_after=2)}
    assert got == {f"pyscheduler_tasks:{a}", f"pyscheduler_tasks:{b}"}
