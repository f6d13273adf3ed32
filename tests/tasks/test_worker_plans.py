"""The Worker's hot path reads tasks by index whatever statistics its session's plans were made
on: a session leases and completes while the queue is empty (its plans cached then), 20,000 tasks
arrive with no ANALYZE since and another worker holds 1,000 leases; its lease, heartbeat,
completion, failure and yield (and the one-task forms) still read a bounded number of index
entries and never scan the table (design.md: "pin the plan"; issue 31)."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from tests.support.reads import reads

ERROR = '{"code": "e", "args": {}, "description": "failed"}'
LEASE = "SELECT rn, token FROM pyscheduler.lease_tasks_lean(queue => 'q', worker => 'w1', n => 10)"
WRITES = {  # the Worker's batch writes of the leases (rns, tokens) it holds, and the one-task forms
    "complete": "SELECT * FROM pyscheduler.complete_tasks(rns => %(rns)s, tokens => %(tokens)s)",
    "complete with results": "SELECT * FROM pyscheduler.complete_tasks(rns => %(rns)s, tokens => %(tokens)s, "
                             "results => %(results)s::jsonb)",
    "heartbeat": "SELECT * FROM pyscheduler.heartbeat_tasks(rns => %(rns)s, tokens => %(tokens)s)",
    "fail": "SELECT * FROM pyscheduler.fail_tasks(rns => %(rns)s, tokens => %(tokens)s, "
            "errors => %(errors)s::jsonb, retry_in => NULL)",
    "yield": "SELECT * FROM pyscheduler.yield_tasks(rns => %(rns)s, tokens => %(tokens)s)",
    "lease one": "SELECT pyscheduler.lease_task(queue => 'q', worker => 'w1')",
    "complete one": "SELECT pyscheduler.complete_task(rn => %(rn)s, token => %(token)s)",
    "complete one and lease": "SELECT pyscheduler.complete_and_lease(worker => 'w1', queue => 'q', "
                              "rn => %(rn)s, token => %(token)s)",
}


# a batch whose first token is wrong: its answer read by _refused (planned per call, a rare path)
REFUSED = {"complete, one refused": "SELECT * FROM pyscheduler.complete_tasks(rns => %(rns)s, tokens => %(wrong)s)"}


def submit(conn, n: int) -> None:
    conn.execute("SELECT count(*) FROM pyscheduler.submit_tasks_lean(queue => 'q', "
                 "specs => (SELECT jsonb_agg(jsonb_build_object('i', i)) FROM generate_series(1, %s) i))", (n,))


def leases(conn) -> dict:
    return leases_of(conn, LEASE)


def leases_of(conn, lease: str) -> dict:
    rows = conn.execute(lease).fetchall()
    return {"rns": [r["rn"] for r in rows], "tokens": [r["token"] for r in rows],
            "rn": rows[0]["rn"], "token": rows[0]["token"],
            "wrong": [uuid.UUID(int=0)] + [r["token"] for r in rows[1:]],
            "results": "[" + ", ".join(["1"] * len(rows)) + "]",
            "errors": "[" + ", ".join([ERROR] * len(rows)) + "]"}


@pytest.mark.parametrize("per_round", [1, 2])  # the plans made on a table of 64 or 128 tasks
def test_plans_made_on_an_empty_queue_read_by_index_once_it_fills(conn, dsn, per_round):
    with psycopg.connect(dsn, autocommit=True) as producer:
        producer.execute("ALTER TABLE pyscheduler.tasks SET (autovacuum_enabled = false)")  # no ANALYZE meanwhile
        producer.execute("ANALYZE pyscheduler.tasks")  # empty and analysed: what a fresh Worker's session sees
        for _ in range(8):  # past plpgsql's five custom plans: the cached ones are the generic plans
            for write in {**WRITES, **REFUSED}.values():
                submit(producer, per_round)
                conn.execute(write, leases(conn)).fetchall()
        submit(producer, 20_000)
        producer.execute("SELECT count(*) FROM pyscheduler.lease_tasks_lean(queue => 'q', worker => 'w2', n => 1000)")
        held = leases(conn)
        assert len(held["rns"]) == 10
        _, read = reads(conn, LEASE, tables=("tasks",))
        scans = {"lease": read}
        for name, write in {**WRITES, **REFUSED}.items():
            rows, scans[name] = reads(conn, write, held, tables=("tasks",))
            refused = [r["rn"] for r in rows if "sqlstate" in r]
            assert refused == ([held["rn"]] if name in REFUSED else []), (name, rows)
        assert {name: read.seq_scans("tasks") for name, read in scans.items()} == dict.fromkeys(scans, 0)
        entries = {name: sum(read.returned.values()) for name, read in scans.items()}
        assert {name: n for name, n in entries.items() if n > 100} == {}


def retry_due(conn) -> None:
    """A delayed task due by the next call: every lease then promotes one, as leases do while
    delayed tasks and retries wait (else a retry's backoff ending mid-test would make the lease's
    promotion run for its first times there, with the plan cache's first five custom plans)."""
    conn.execute("SELECT count(*) FROM pyscheduler.submit_tasks_lean(queue => 'q', specs => '[{}]', "
                 "run_in => '1 microsecond')")


@pytest.mark.parametrize("n", [10, 100])
def test_the_hot_paths_are_not_planned_on_every_call(conn, n):
    """A call's statements keep their cached plans: after a warm-up, a lease or a batch write of n
    leases plans nothing (log_planner_stats reports each planning). A SQL function that is not
    inlined (a volatile one, one with a sub-SELECT, an IMMUTABLE one calling a STABLE function)
    is planned on every call, and a statement whose custom plan folds away (_refused's when every
    lease was written) keeps the plan cache choosing custom plans: ~40-250 us a call each (issue
    31). Batches of one still plan their UPDATE: its custom plan knows the array's length."""
    lease = LEASE.replace("n => 10", f"n => {n}")
    calls = {"lease": lease, **WRITES}

    def run(name: str) -> None:
        submit(conn, n)
        retry_due(conn)
        held = leases_of(conn, lease)
        if name != "lease":
            conn.execute(calls[name], held).fetchall()

    for _ in range(12):  # past psycopg's prepare threshold and the plan cache's five custom plans
        for name in calls:
            run(name)
    try:
        conn.execute("SET log_planner_stats = on")
    except psycopg.errors.InsufficientPrivilege:
        pytest.skip("log_planner_stats needs a superuser (the embedded server's role is one)")
    notes: list[str] = []
    conn.add_notice_handler(lambda d: notes.append(d.message_primary or ""))
    # Up to ten calls each, the fewest plannings counted: a statement planned on every call plans
    # in all of them; a branch a session reaches for the first time (the 2 % of writes that fold the
    # tallies) or an invalidation (autovacuum's ANALYZE of a table a plan reads; a burst of DDL in
    # the cluster's other databases, which can reset every backend's caches) plans once or a few
    # times and stops.
    plannings = {}
    for name, call in calls.items():
        counts: list[int] = []
        while len(counts) < 10 and 0 not in counts:
            submit(conn, n)
            retry_due(conn)
            args = None if name == "lease" else leases_of(conn, lease)
            conn.execute("SET client_min_messages = log")
            notes.clear()
            conn.execute(call, args).fetchall()
            conn.execute("SET client_min_messages = notice")
            counts.append(sum("PLANNER STATISTICS" in m for m in notes))
        plannings[name] = min(counts)
    assert plannings == dict.fromkeys(calls, 0)
