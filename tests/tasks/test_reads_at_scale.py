"""Leased tasks: list_tasks pages by keyset (every task once, while others are
submitted); task_counts and queue_status equal a real count after a random mix of every change
and read the tallies, not the tasks; each read path reads an index (never a scan of the table)
and stops at the page; oldest_ready_tasks reads one index entry per queue and priority."""

from __future__ import annotations

import random
from datetime import timedelta

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from tests.support.reads import concurrently, fill, reads
from pyscheduler import migrate


def submit(conn, queue="q", **kw):
    args = ", ".join(f"{k} => %({k})s" for k in kw)
    return conn.execute(f"SELECT pyscheduler.submit_task(queue => %(queue)s, spec => '{{}}'"
                        f"{', ' + args if args else ''}) AS t", {"queue": queue, **kw}).fetchone()["t"]


def lease(conn, queue="q", worker="w1"):
    return conn.execute("SELECT pyscheduler.lease_task(queue => %s, worker => %s) AS t",
                        (queue, worker)).fetchone()["t"]


def walk(conn, per_page: int, between=None, **filters) -> list[str]:
    """Every page of list_tasks, each from the last rn of the one before."""
    seen, before = [], None
    while True:
        page = [r["task"]["rn"] for r in conn.execute(
            "SELECT task FROM pyscheduler.list_tasks(queue => %(queue)s, status => %(status)s, "
            "max_tasks => %(n)s, before_rn => %(before)s)",
            {"queue": filters.get("queue"), "status": filters.get("status"), "n": per_page, "before": before})]
        assert page == sorted(page, reverse=True)
        seen += page
        if len(page) < per_page:
            return seen
        before = page[-1]
        if between:
            between()


def real(conn, status_filter="true") -> list[tuple]:
    return [tuple(r.values()) for r in conn.execute(
        f"SELECT queue, status, count(*) AS n FROM pyscheduler.tasks WHERE {status_filter} "
        "GROUP BY 1, 2 ORDER BY 1, 2")]


def shown(conn) -> list[tuple]:
    return [tuple(r.values()) for r in conn.execute("SELECT queue, status, tasks FROM pyscheduler.task_counts")]


def test_list_tasks_pages_return_every_task_once_while_others_are_submitted(conn, dsn):
    rns = [submit(conn, queue=("a" if i % 3 else "b"), priority=i % 4)["rn"] for i in range(70)]
    for _ in range(20):
        t = lease(conn, "a")
        conn.execute("SELECT pyscheduler.complete_task(rn => %s, token => %s)", (t["rn"], t["token"]))
    lease(conn, "b")
    with psycopg.connect(dsn, autocommit=True) as other:
        def more() -> None:
            for q in ("a", "b"):
                other.execute("SELECT pyscheduler.submit_task(queue => %s, spec => '{}')", (q,))

        every = walk(conn, 7, more)
        assert len(every) == len(set(every))
        assert [r for r in every if r in rns] == sorted(rns, reverse=True)
        for filters, keep in [({"queue": "a"}, "queue = 'a'"), ({"status": "ready"}, "status = 'ready'"),
                              ({"status": "completed"}, "status = 'completed'"),
                              ({"queue": "b", "status": "running"}, "queue = 'b' AND status = 'running'"),
                              ({"queue": "b", "status": "ready"}, "queue = 'b' AND status = 'ready'")]:
            expected = [r["rn"] for r in conn.execute(
                f"SELECT rn::text FROM pyscheduler.tasks WHERE {keep} AND rn = ANY(%s::uuid[]) ORDER BY rn DESC",
                (rns,))]
            got = walk(conn, 4, more, **filters)
            assert len(got) == len(set(got)), filters
            assert [r for r in got if r in rns] == expected, filters
    # submitted later, listed first: the ids are time-ordered
    newest = submit(conn, "a")["rn"]
    listed = conn.execute("SELECT task ->> 'rn' AS rn FROM pyscheduler.list_tasks(max_tasks => 1)").fetchone()
    assert listed["rn"] == newest


def test_counts_equal_a_real_count_after_a_random_mix_of_every_change(tx):
    """Every function that submits, moves or deletes tasks keeps the tallies: the single and the
    batch calls, the Worker's lean lease, a limited queue's claim (q3), the lease gate that makes
    due tasks ready, dependencies, workflows, unique keys, snoozes, requeued dependents, the
    monitor's reset and cleanup."""
    rnd = random.Random(21)
    queues = ["q1", "q2", "q3"]
    tx.execute("SELECT pyscheduler.set_queue_limits(queue => 'q3', running_per_key => 2)")
    held: list[dict] = []
    seen: set[str] = set()
    for step in range(400):
        op = rnd.choice(["submit", "submit", "submit", "delayed", "after", "batch", "lease", "lease", "lean", "due",
                         "complete", "complete", "complete_many", "complete_and_lease", "fail", "fail_many", "abort",
                         "snooze", "cancel", "retry", "expire", "cleanup", "pause", "workflow", "retry_child"])
        q = rnd.choice(queues)
        if op == "submit":
            submit(tx, q, priority=rnd.choice([10, 50]), concurrency_key=rnd.choice([None, "k1", "k2"]))
        elif op == "batch":  # one key twice and one a live task may hold: deduplicated, not counted
            tx.execute("SELECT count(*) FROM pyscheduler.submit_tasks(queue => %s, specs => '[{}, {}, {}]', "
                         "unique_keys => ARRAY['u1', 'u1', %s])", (q, f"u{step}"))
        elif op == "lean":
            held += [{"rn": str(r["rn"]), "token": str(r["token"])} for r in tx.execute(
                "SELECT rn, token FROM pyscheduler.lease_tasks_lean(queue => %s, worker => 'w9', n => 3)", (q,))]
        elif op == "due":  # two hours on: the delayed tasks are due, the lease gate makes them ready
            held += [r["t"] for r in tx.execute(
                "SELECT task AS t FROM pyscheduler._lease_tasks(%s, 'w8', 2, '10 seconds', 0, 4294967295, "
                "now() + interval '2 hours')", (q,))]
        elif held and op == "complete_many":
            done, held[:] = held[:3], held[3:]
            tx.execute("SELECT count(*) FROM pyscheduler.complete_tasks(rns => %s::uuid[], tokens => %s::uuid[])",
                         ([t["rn"] for t in done], [t["token"] for t in done]))
        elif held and op == "fail_many":
            done, held[:] = held[:2], held[2:]
            tx.execute("SELECT count(*) FROM pyscheduler.fail_tasks(rns => %s::uuid[], tokens => %s::uuid[], "
                         "errors => %s)", ([t["rn"] for t in done], [t["token"] for t in done],
                                           Jsonb([{"code": "x", "args": {}, "description": "d"}] * len(done))))
        elif held and op == "complete_and_lease":
            t = held.pop()
            nxt = tx.execute("SELECT pyscheduler.complete_and_lease(worker => 'w7', queue => %s, rn => %s, "
                               "token => %s) AS t", (q, t["rn"], t["token"])).fetchone()["t"]
            if nxt:
                held.append(nxt)
        elif held and op == "snooze":
            t = held.pop()
            tx.execute("SELECT pyscheduler.yield_task(rn => %s, token => %s, run_in => %s)",
                         (t["rn"], t["token"], rnd.choice([timedelta(0), timedelta(hours=1)])))
        elif op == "delayed":
            submit(tx, q, run_in=timedelta(hours=1))
        elif op == "after":  # a child waiting for a parent
            parent = submit(tx, q)
            submit(tx, q, after=[parent["rn"]])
        elif op == "workflow":  # a graph; a unique key a live task may hold (deduplicated, not counted)
            tx.execute("SELECT pyscheduler.submit_workflow(%s)", (Jsonb([
                {"name": "a", "queue": q, "spec": {}},
                {"name": "b", "queue": q, "spec": {}, "after": ["a"], "unique_key": "wb"},
                {"name": "c", "queue": rnd.choice(queues), "spec": {}, "after": ["a", "b"], "run_in": "1 hour"}]),))
        elif op == "retry_child":  # a cancelled dependent requeued: waiting again while a parent is live
            child = tx.execute("SELECT rn FROM pyscheduler.tasks WHERE status = 'cancelled' AND after IS NOT NULL "
                                 "ORDER BY random() LIMIT 1").fetchone()
            if child:
                try:
                    tx.execute("SELECT pyscheduler.retry_task(rn => %s)", (child["rn"],))
                except psycopg.Error as exc:  # a parent failed, or its unique key is taken
                    assert exc.sqlstate in ("PS211", "PS214")
        elif op == "lease":
            t = lease(tx, q, worker=f"w{rnd.randint(1, 3)}")
            if t:
                held.append(t)
        elif held and op in ("complete", "fail", "abort"):
            t = held.pop(rnd.randrange(len(held)))
            if op == "complete":
                tx.execute("SELECT pyscheduler.complete_task(rn => %s, token => %s)", (t["rn"], t["token"]))
            elif op == "fail":  # retried after the backoff (scheduled), or aborted after its last attempt
                tx.execute("SELECT pyscheduler.fail_task(rn => %s, token => %s, error => %s, retry_in => %s)",
                             (t["rn"], t["token"], Jsonb({"code": "x", "args": {}, "description": "d"}),
                              rnd.choice([timedelta(0), timedelta(hours=1)])))
            else:
                tx.execute("SELECT pyscheduler.abort_task(rn => %s, token => %s, errors => %s)",
                             (t["rn"], t["token"], Jsonb([{"code": "x", "args": {}, "description": "d"}])))
        elif op == "cancel":
            live = tx.execute("SELECT rn FROM pyscheduler.tasks WHERE status IN ('ready', 'scheduled', 'waiting') "
                                "ORDER BY random() LIMIT 1").fetchone()
            if live:
                tx.execute("SELECT pyscheduler.cancel_task(rn => %s)", (live["rn"],))
        elif op == "retry":
            tx.execute("SELECT count(*) FROM pyscheduler.retry_tasks(queue => %s, status => %s, max_tasks => 2)",
                         (q, rnd.choice(["aborted", "cancelled"])))
        elif op == "expire":  # the monitor resets leases past their deadline
            tx.execute("SELECT count(*) FROM pyscheduler._reset_expired_tasks(100, now() + interval '1 day')")
            held.clear()
        elif op == "cleanup":
            tx.execute("SELECT pyscheduler.cleanup_tasks(retention => '0', max_tasks => 2)")
        else:
            tx.execute(f"SELECT pyscheduler.{rnd.choice(['pause_queue', 'resume_queue'])}(queue => %s)", (q,))
        if step % 20 == 0 or step == 399:
            assert shown(tx) == real(tx), (step, op)
            seen |= {s for _, s, _ in real(tx)}
            status = {r["queue"]: r for r in tx.execute("SELECT * FROM pyscheduler.queue_status")}
            counts = {(q, s): n for q, s, n in real(tx)}
            for q, row in status.items():
                assert (row["ready"], row["delayed"], row["running"], row["waiting"]) == tuple(
                    counts.get((q, s), 0) for s in ("ready", "scheduled", "running", "waiting")), (step, op, q)
                assert row["next_due"] == tx.execute(
                    "SELECT min(run_at) AS m FROM pyscheduler.tasks WHERE queue = %s AND status = 'scheduled'",
                    (q,)).fetchone()["m"]
            assert set(status) >= {q for (q, s) in counts if s in ("ready", "scheduled", "running", "waiting")}
            oldest = {r["queue"]: r["rn"]
                      for r in tx.execute("SELECT queue, rn::text FROM pyscheduler.oldest_ready_tasks")}
            assert oldest == {r["queue"]: r["rn"] for r in tx.execute(
                "SELECT DISTINCT ON (queue) queue, rn::text FROM pyscheduler.tasks WHERE status = 'ready' "
                "ORDER BY queue, created, seq")}, step
    assert seen == {"ready", "running", "completed", "aborted", "cancelled", "scheduled", "waiting"}


def test_counts_read_the_tallies_not_the_tasks_and_stay_few_rows(tx):
    """task_counts and queue_status sum the tallies: no entry of the tasks table or its indexes
    is read for a count, however many tasks there are; a writing call folds the tallies (one in
    _task_fold_chance(), the fallback of the monitor's fold: here every one), so they stay a few
    rows per (queue, status) whatever the number of writes."""
    fill(tx, 2500, "big", "ready")
    fill(tx, 3000, "big", "completed")
    fill(tx, 1200, "busy", "running")
    tx.execute("CREATE OR REPLACE FUNCTION pyscheduler._task_fold_chance() RETURNS double precision "
               "LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURN 1")  # rolled back with the test's transaction

    def tally_rows() -> int:
        return tx.execute("SELECT count(*) AS n FROM pyscheduler._task_tallies").fetchone()["n"]

    k = 5
    for _ in range(k):  # each call appends its rows, then folds them all: a row per pair
        t = lease(tx, "big")
        assert tally_rows() == 4  # big ready, big running, big completed, busy running
        tx.execute("SELECT pyscheduler.complete_task(rn => %s, token => %s)", (t["rn"], t["token"]))
        assert tally_rows() == 3  # big running back to 0
    rows, r = reads(tx, "SELECT * FROM pyscheduler.task_counts", tables=("tasks",))
    assert sum(r.returned.values()) == 0 and r.seq_scans("tasks") == 0, r.returned
    assert sorted(tuple(x.values()) for x in rows) == [("big", "completed", 3000 + k), ("big", "ready", 2500 - k),
                                                      ("busy", "running", 1200)]
    status = {x["queue"]: x for x in tx.execute("SELECT * FROM pyscheduler.queue_status")}
    assert (status["big"]["ready"], status["busy"]["running"]) == (2500 - k, 1200)
    tx.execute("SELECT pyscheduler._task_fold_tallies()")
    assert tx.execute("SELECT count(*) AS n FROM pyscheduler._task_tallies").fetchone()["n"] == 3


def test_counts_stay_right_with_concurrent_writers_and_folds(dsn, conn):
    """Four connections submit, lease, complete, fail and cancel in transactions of which a fifth
    roll back, folding the tallies as they go: appends never wait for each other, and no delta is
    lost or counted twice, whatever commits or rolls back when."""

    def writer(k: int) -> None:
        rnd = random.Random(k)
        with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as c:
            for _ in range(40):
                with c.transaction(force_rollback=rnd.random() < 0.2):
                    q = f"c{rnd.randint(1, 2)}"
                    c.execute("SELECT count(*) FROM pyscheduler.submit_tasks(queue => %s, specs => '[{}, {}, {}]')",
                              (q,))
                    got = c.execute("SELECT rn, token FROM pyscheduler.lease_tasks_lean(queue => %s, "
                                    "worker => %s, n => 2)", (q, f"w{k}")).fetchall()
                    if got:
                        c.execute("SELECT count(*) FROM pyscheduler.complete_tasks(rns => %s, tokens => %s)",
                                  ([got[0]["rn"]], [got[0]["token"]]))
                    if len(got) > 1:
                        c.execute("SELECT pyscheduler.fail_task(rn => %s, token => %s, error => %s)",
                                  (got[1]["rn"], got[1]["token"], Jsonb({"code": "x", "args": {}, "description": "d"})))
                    live = c.execute("SELECT rn FROM pyscheduler.tasks WHERE queue = %s AND status = 'ready' "
                                     "LIMIT 1 FOR UPDATE SKIP LOCKED", (q,)).fetchone()
                    if live:
                        c.execute("SELECT pyscheduler.cancel_task(rn => %s)", (live["rn"],))
                    if rnd.random() < 0.3:
                        c.execute("SELECT pyscheduler._task_fold_tallies()")

    concurrently(writer)
    assert shown(conn) == real(conn)
    assert {s for _, s, _ in real(conn)} >= {"completed", "cancelled", "scheduled"}


def test_the_monitor_folds_the_tallies_single_submits_append(dsn, conn):
    """A single submit appends a tally row a call and folds one call in 1,000, since a fold reads
    the whole tally table (issue 31); the tasks monitor folds every merge_interval, and the counts
    read stay those of the tasks."""
    import threading

    from pyscheduler.db import Database
    from pyscheduler.tasks import Monitor, TaskClient
    from tests.support import wait_for

    def rows() -> int:
        return conn.execute("SELECT count(*) AS n FROM pyscheduler._task_tallies "
                            "WHERE queue = 'folded'").fetchone()["n"]

    with Database(dsn, max_size=1) as db:
        client = TaskClient(db)
        for i in range(200):
            client.submit_ids("folded", [{"i": i}])
    before = rows()
    stop = threading.Event()
    monitor = Monitor(dsn, reset_interval=600, merge_interval=0.05)
    thread = threading.Thread(target=monitor.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(lambda: rows() == 1, timeout=30, what=f"the monitor's fold ({before} rows before)")
    finally:
        stop.set()
        thread.join(10)
    assert shown(conn) == real(conn) and ("folded", "ready", 200) in shown(conn)


def test_migrate_counts_tasks_stored_before_the_tallies(dsn, conn):
    """A database from before migration 0027: the post-apply step counts its tasks once, under a
    lock, in the transaction that loads the functions that keep the tallies; migration 0032
    drops the estimates' functions of those days."""
    fill(conn, 40, "old", "completed")
    fill(conn, 7, "old", "ready")
    conn.execute("DELETE FROM pyscheduler._task_tallies")
    conn.execute("DELETE FROM pyscheduler.settings WHERE name = 'tasks_counted'")
    conn.execute("CREATE FUNCTION pyscheduler._task_count_cap() RETURNS int LANGUAGE sql AS 'SELECT 1000'")
    conn.execute("DELETE FROM pyscheduler._yoyo_migration WHERE migration_id = '0032_tasks_current_code'")
    assert shown(conn) == []
    assert migrate.migrate(dsn).applied == ["0032_tasks_current_code"]
    assert shown(conn) == real(conn) == [("old", "ready", 7), ("old", "completed", 40)]
    assert conn.execute("SELECT to_regproc('pyscheduler._task_count_cap') AS f").fetchone()["f"] is None
    submit(conn, "old")
    migrate.migrate(dsn)  # counted once: a second migrate does not count again
    assert shown(conn) == real(conn) == [("old", "ready", 8), ("old", "completed", 40)]


def test_rows_written_by_hand_are_counted_again_and_truncate_empties_the_counts(tx):
    submit(tx, "hand")
    tx.execute("UPDATE pyscheduler.tasks SET status = 'cancelled' WHERE queue = 'hand'")  # not through a function
    assert shown(tx) == [("hand", "ready", 1)]
    tx.execute("SELECT pyscheduler._task_count_all()")
    assert shown(tx) == real(tx) == [("hand", "cancelled", 1)]
    tx.execute("TRUNCATE pyscheduler.tasks CASCADE")
    assert shown(tx) == [] and tx.execute("SELECT count(*) AS n FROM pyscheduler.queue_status").fetchone()["n"] == 0


def test_each_read_path_reads_an_index_and_stops_at_the_page(conn):
    for q in ("q1", "q2", "q3"):
        fill(conn, 2000, q, "completed")
        fill(conn, 30, q, "ready", priority="10")
        fill(conn, 30, q, "ready", priority="90")
        fill(conn, 20, q, "scheduled")
        fill(conn, 5, q, "running")
        fill(conn, 10, q, "aborted")
    conn.execute("VACUUM ANALYZE pyscheduler.tasks")
    middle = conn.execute("SELECT rn FROM pyscheduler.tasks ORDER BY rn OFFSET 3000 LIMIT 1").fetchone()["rn"]
    for sql, params, index, most in [
        ("SELECT * FROM pyscheduler.list_tasks(max_tasks => 10)", (), "tasks_pkey", 10),
        ("SELECT * FROM pyscheduler.list_tasks(max_tasks => 10, before_rn => %s)", (middle,), "tasks_pkey", 10),
        # the newest tasks first: completed ones among them
        ("SELECT * FROM pyscheduler.list_tasks(status => 'completed', max_tasks => 10)", (), "tasks_pkey", 10 * 10),
        ("SELECT * FROM pyscheduler.list_tasks(queue => 'q2', status => 'ready', max_tasks => 10)", (),
         "tasks_ready_idx", 2 * (10 + 1 + 2) + 3),  # per priority: a page, its edge's millisecond, a probe
        ("SELECT * FROM pyscheduler.list_tasks(status => 'running', max_tasks => 10)", (),
         "tasks_running_deadline_idx", 15),
        # a status the queue has none of: its index says so at once (the primary key, walked
        # backwards past every task, would read them all)
        ("SELECT * FROM pyscheduler.list_tasks(queue => 'q2', status => 'waiting', max_tasks => 10)", (),
         "tasks_queue_status_rn_idx", 1),
        ("SELECT * FROM pyscheduler.oldest_ready_tasks", (), "tasks_ready_idx", 3 * 2 * 2 + 3 + 2),
    ]:
        rows, r = reads(conn, sql, params, tables=("tasks",))
        assert r.seq_scans("tasks") == 0, sql
        assert r.scans[index] > 0 and r.entries(index) <= most, (sql, r.scans, r.returned)
        assert sum(r.returned.values()) <= most + 5, (sql, r.returned)
    oldest = conn.execute("SELECT queue, priority FROM pyscheduler.oldest_ready_tasks").fetchall()
    assert [(o["queue"], o["priority"]) for o in oldest] == [("q1", 10), ("q2", 10), ("q3", 10)]
    rows, r = reads(conn, "SELECT * FROM pyscheduler.queue_status", tables=("tasks",))
    assert r.seq_scans("tasks") == 0
    # per queue: the head of each priority in tasks_ready_idx and the first scheduled entry
    assert sum(r.returned.values()) <= 3 * (2 + 1 + 2), r.returned
    assert [(x["queue"], x["ready"], x["delayed"], x["running"]) for x in rows] == [
        (q, 60, 20, 5) for q in ("q1", "q2", "q3")]


def test_the_client_pages_with_before(tx):
    from pyscheduler.tasks import TaskClient

    client = TaskClient(tx)
    made = [client.submit("pages", {"i": i}).rn for i in range(7)]
    seen, before = [], None
    while page := client.list("pages", limit=3, before=before):
        seen += [t.rn for t in page]
        before = page[-1].rn
    assert seen == made[::-1]


def test_a_quiet_queue_among_busy_ones_reads_its_own_tasks(conn):
    """list_tasks(queue => q) reads each status of that queue from its own index and merges the
    pages (the finished ones from tasks_queue_status_rn_idx), so a queue with a few tasks among
    thousands of another queue's finished ones reads its own; pages by before_rn still return
    every task once, newest first, as a real ORDER BY rn DESC."""
    fill(conn, 5000, "busy", "completed")
    fill(conn, 200, "busy", "ready")
    for status, n in [("completed", 3), ("ready", 2), ("scheduled", 2), ("running", 1), ("aborted", 1)]:
        fill(conn, n, "quiet", status)
    conn.execute("VACUUM ANALYZE pyscheduler.tasks")

    def real(queue, status=None):
        return [r["rn"] for r in conn.execute(
            "SELECT rn::text FROM pyscheduler.tasks WHERE queue = %s AND (%s::text IS NULL OR status::text = %s) "
            "ORDER BY rn DESC", (queue, status, status))]

    rows, r = reads(conn, "SELECT task FROM pyscheduler.list_tasks(queue => 'quiet')", tables=("tasks",))
    assert [x["task"]["rn"] for x in rows] == real("quiet")
    # no walk of the primary key: its two ready tasks are fetched by id (_ready_page)
    assert r.seq_scans("tasks") == 0 and r.entries("tasks_pkey") <= 2
    assert sum(r.returned.values()) <= 9 + 10 + 2, r.returned
    rows, r = reads(conn, "SELECT task FROM pyscheduler.list_tasks(queue => 'quiet', status => 'completed')",
                    tables=("tasks",))
    assert [x["task"]["rn"] for x in rows] == real("quiet", "completed")
    assert r.entries("tasks_queue_status_rn_idx") <= 3 + 1 and sum(r.returned.values()) <= 3 + 2, r.returned
    assert walk(conn, 2, queue="quiet") == real("quiet")
    assert walk(conn, 700, queue="busy") == real("busy")
    assert walk(conn, 700, queue="busy", status="completed") == real("busy", "completed")


def test_a_queue_s_ready_backlog_is_paged_without_reading_it_all(conn):
    """list_tasks(queue, status => 'ready') reads each priority of tasks_ready_idx backwards, a page
    at most plus the last entry's millisecond, not the queue's whole backlog; the pages are exactly
    a real ORDER BY rn DESC, also where tasks of one millisecond have their created and seq in
    opposite orders (concurrent submits: the later transaction drew the earlier seq). A queue's
    scheduled and waiting tasks are read from indexes in rn order, a page at a time."""
    fill(conn, 3000, "backlog", "ready", priority="50")
    fill(conn, 3000, "backlog", "ready", priority="90")
    base = conn.execute("SELECT date_trunc('second', now()) - interval '2 days' AS b").fetchone()["b"]
    conn.execute(  # one millisecond, ten tasks, created descending while seq ascends, two priorities
        "INSERT INTO pyscheduler.tasks (rn, queue, spec, priority, status, progress, created, updated, errors, "
        "history, submitted_by) SELECT pyscheduler._task_rn(pyscheduler._rn_prefix(c), s), 'backlog', '{}', "
        "CASE WHEN k %% 2 = 0 THEN 50 ELSE 90 END, 'ready', 0, c, c, '[]', '[]', current_user "
        "FROM generate_series(0, 9) k, LATERAL (SELECT nextval('pyscheduler.task_seq') AS s, "
        "%s::timestamptz + (9 - k) * interval '50 microseconds' AS c) x", (base,))
    fill(conn, 2000, "backlog", "scheduled")
    parent = submit(conn, "parents")
    for _ in range(4):
        submit(conn, "backlog", after=[parent["rn"]])
    conn.execute("VACUUM ANALYZE pyscheduler.tasks")

    def real(status=None):
        return [r["rn"] for r in conn.execute(
            "SELECT rn::text FROM pyscheduler.tasks "
            "WHERE queue = 'backlog' AND (%s::text IS NULL OR status::text = %s) "
            "ORDER BY rn DESC", (status, status))]

    rows, r = reads(conn, "SELECT task FROM pyscheduler.list_tasks(queue => 'backlog', status => 'ready')",
                    tables=("tasks",))
    assert [x["task"]["rn"] for x in rows] == real("ready")[:100]
    assert r.seq_scans("tasks") == 0 and r.entries("tasks_pkey") <= 2 * 100 + 10, r.returned
    assert r.entries("tasks_ready_idx") <= 2 * (100 + 1) + 4, r.returned  # two priorities: a page and a probe each
    rows, r = reads(conn, "SELECT task FROM pyscheduler.list_tasks(queue => 'backlog')", tables=("tasks",))
    assert [x["task"]["rn"] for x in rows] == real()[:100]
    assert r.entries("tasks_ready_idx") <= 2 * (100 + 1) + 4, r.returned
    # a page of its scheduled tasks and its 4 waiting ones, each read with a probe past its end
    assert r.entries("tasks_queue_status_rn_idx") <= (100 + 1) + (4 + 1) and r.entries("tasks_scheduled_idx") == 0, \
        r.returned
    assert walk(conn, 7, queue="backlog", status="ready")[:400] == real("ready")[:400]
    assert walk(conn, 300, queue="backlog", status="ready") == real("ready")
    assert walk(conn, 450, queue="backlog") == real()
    # the odd millisecond, paged through one task at a time
    odd = real("ready")
    ms = conn.execute("SELECT array_agg(rn::text ORDER BY rn DESC) AS a FROM pyscheduler.tasks WHERE queue = 'backlog' "
                      "AND created >= %s AND created < %s::timestamptz + interval '1 millisecond'", (base, base)
                      ).fetchone()["a"]
    assert len(ms) == 10
    start = odd.index(ms[0])
    before = odd[start - 1]
    got = []
    for _ in range(10):  # the ten oldest tasks
        page = [x["task"]["rn"] for x in conn.execute(
            "SELECT task FROM pyscheduler.list_tasks(queue => 'backlog', status => 'ready', max_tasks => 1, "
            "before_rn => %s)", (before,))]
        got += page
        before = page[-1]
    assert got == odd[start:] == ms
    rows, r = reads(conn, "SELECT task FROM pyscheduler.list_tasks(queue => 'backlog', status => 'waiting', "
                          "max_tasks => 2)", tables=("tasks",))
    assert [x["task"]["rn"] for x in rows] == real("waiting")[:2]
    assert r.entries("tasks_queue_status_rn_idx") <= 2 + 1, r.returned
    rows, r = reads(conn, "SELECT task FROM pyscheduler.list_tasks(queue => 'backlog', status => 'scheduled')",
                    tables=("tasks",))
    assert [x["task"]["rn"] for x in rows] == real("scheduled")[:100]
    assert r.entries("tasks_queue_status_rn_idx") <= 100 + 1 and r.entries("tasks_scheduled_idx") == 0, r.returned
    assert walk(conn, 300, queue="backlog", status="scheduled") == real("scheduled")


def test_any_cursor_a_caller_passes_pages_correctly_and_a_bad_status_is_refused(tx):
    """before_rn is the caller's: an id from another system, all zero or all ones (a time in the
    year 10889 for _ready_page's millisecond bound) pages exactly like a real ORDER BY rn DESC;
    a status that is not one is PS208, never part of the query."""
    tx.execute("SELECT pyscheduler.submit_tasks(queue => 'h', specs => '[{}, {}, {}]')")
    submit(tx, "h", run_in=timedelta(hours=1))
    for before in ["ffffffff-ffff-ffff-ffff-ffffffffffff", "00000000-0000-0000-0000-000000000000",
                   "12345678-9abc-4def-8123-456789abcdef"]:
        for status in ("ready", "scheduled", "waiting", None):
            got = [r["task"]["rn"] for r in tx.execute(
                "SELECT task FROM pyscheduler.list_tasks(queue => 'h', status => %s, before_rn => %s, "
                "max_tasks => 2147483647)", (status, before))]
            assert got == [r["rn"] for r in tx.execute(
                "SELECT rn::text FROM pyscheduler.tasks WHERE queue = 'h' AND rn < %s "
                "AND (%s::text IS NULL OR status::text = %s) ORDER BY rn DESC", (before, status, status))]
    for bad in ["ready' OR true --", "ready\u202e", ""]:
        try:
            tx.execute("SELECT * FROM pyscheduler.list_tasks(queue => 'h', status => %s)", (bad,))
        except psycopg.Error as exc:
            assert exc.sqlstate == "PS208", exc
        else:
            raise AssertionError(bad)


# Issue 34's table, at 1/100 to 1/250 of its sizes: queue hot's finished tasks under newer tasks of
# busy queues, the statistics saying hot's completed tasks are most of the table (ANALYZE done).
# (hot's completed tasks, from when; the busy queues' ready tasks, each, from when; the reads)
QUIET_UNDER_BUSY = [
    pytest.param(30_000, "3 hours", 10_000, "1 hour", [{"queue": "hot"}], id="1-two-hours-queue"),
    pytest.param(30_000, "3 hours", 10_000, "1 hour", [{"queue": "hot", "status": "completed"}],
                 id="2-two-hours-queue-completed"),
    pytest.param(30_000, "3 hours", 10_000, "1 hour", [{"status": "completed"}], id="3-two-hours-completed"),
    pytest.param(40_000, "2 hours", 10_000, "1 hour", [{"queue": "hot", "status": "completed"}, {"queue": "hot"}],
                 id="4-an-hour"),
    pytest.param(40_000, "100 seconds", 10_000, "70 seconds", [{"queue": "hot"}], id="5-until-a-minute-ago"),
]


@pytest.mark.parametrize("hot, hot_ago, busy, busy_ago, filters", QUIET_UNDER_BUSY)
def test_a_quiet_queue_under_newer_tasks_of_busy_ones_reads_its_own_page(conn, hot, hot_ago, busy, busy_ago, filters):
    """Each read returns hot's newest 100 from its 100 index entries, not by the primary key backwards
    past every newer task of the busy queues (issue 34: 0.4-2.7 s at 5-15 million rows)."""
    fill(conn, hot, "hot", "completed", ago=hot_ago)
    for q in ("busy1", "busy2"):
        fill(conn, busy, q, "ready", ago=busy_ago)
    conn.execute("VACUUM ANALYZE pyscheduler.tasks")
    newest = [r["rn"] for r in conn.execute(
        "SELECT rn::text FROM pyscheduler.tasks WHERE queue = 'hot' ORDER BY rn DESC LIMIT 100")]
    for f in filters:
        rows, r = reads(conn, "SELECT task FROM pyscheduler.list_tasks(queue => %(queue)s, status => %(status)s)",
                        {"queue": f.get("queue"), "status": f.get("status")}, tables=("tasks",))
        assert [x["task"]["rn"] for x in rows] == newest, f
        # without a queue, the newest ten pages first (then hot's page, from its index)
        newer = 0 if "queue" in f else 10 * 100
        assert r.seq_scans("tasks") == 0 and r.entries("tasks_pkey") == newer, (f, r.returned)
        assert r.entries("tasks_queue_status_rn_idx") <= 100 and sum(r.returned.values()) <= newer + 100, r.returned
