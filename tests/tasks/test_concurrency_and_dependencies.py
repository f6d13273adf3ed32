"""Flow control for tasks, SQL API: concurrency keys and queue limits, results and
the finish NOTIFY, snooze, exactly-once effects in the application's transaction
(complete_task there, holds_lease); bounds and hostile input."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import defaultdict

import psycopg
import pytest
from psycopg.rows import dict_row

from pyscheduler import errors
from pyscheduler.db import Jsonb

from tests.support.tasks import at, call, held, lease, submit, value

ERROR = {"code": "upstream", "args": {}, "description": "upstream 503"}


def code(fn) -> str | None:
    try:
        fn()
    except (errors.SchedulerError, psycopg.Error) as exc:
        return exc.sqlstate or type(exc).__name__  # a NUL: the driver's DataError, no SQLSTATE
    return None


def get(db, rn):
    return db.call_value("get_task", rn=rn)


def submit_many(db, queue, n, keys, now=None):
    return [r["task"] for r in call(db, "submit_tasks", now, queue=queue, specs=Jsonb([{"i": i} for i in range(n)]),
                                    concurrency_keys=keys)]


def lease_n(db, queue, n, worker="w1", now=None, **kw):
    return [r["task"] for r in call(db, "lease_tasks", now, queue=queue, worker=worker, n=n, **kw)]


# ------------------------------------------------------------------ item 1: concurrency keys


def test_a_key_at_its_limit_waits_and_other_keys_lease(tx):
    tx.call("set_queue_limits", queue="q", running_per_key=2)
    submit_many(tx, "q", 6, ["a", "a", "a", "b", None, "a"])
    got = lease_n(tx, "q", 10)
    assert [t["concurrency_key"] for t in got] == ["a", "a", "b", None]  # claim order; the third "a" waits
    assert lease_n(tx, "q", 10) == []
    value(tx, "complete_task", **held(got[0]))  # a slot of "a" is free
    again = lease_n(tx, "q", 10)
    assert [t["concurrency_key"] for t in again] == ["a"]
    assert again[0]["spec"] == {"i": 2}  # the next "a" in claim order


def test_no_head_of_line_blocking_ten_thousand_of_a_full_key_and_one_other(tx):
    tx.call("set_queue_limits", queue="q", running_per_key=1)
    call(tx, "submit_tasks", queue="q", specs=Jsonb([{"i": i} for i in range(10_001)]),
         concurrency_keys=["A"] * 10_001)
    b = submit(tx, concurrency_key="B")
    first = lease(tx)
    assert first["concurrency_key"] == "A"
    started = time.monotonic()
    second = lease(tx)  # one call: past 10,000 ready tasks of the full key A
    elapsed = time.monotonic() - started
    assert second["rn"] == b["rn"]
    assert lease(tx) is None
    assert lease_n(tx, "q", 5) == []
    assert elapsed < 2.0, elapsed


def test_running_total_limits_the_queue(tx):
    tx.call("set_queue_limits", queue="q", running_total=3)
    submit_many(tx, "q", 5, None)
    assert len(lease_n(tx, "q", 5)) == 3
    assert lease(tx) is None
    row = tx.query("SELECT * FROM pyscheduler.queue_limits")[0]
    assert (row["queue"], row["running_total"], row["running"]) == ("q", 3, 3)


def test_every_way_out_of_running_frees_the_slot(tx):
    """completed, failed (retry), aborted, yielded, snoozed, cancelled, reset by the monitor."""
    tx.call("set_queue_limits", queue="q", running_per_key=1)
    submit_many(tx, "q", 8, ["k"] * 8)

    def one():
        t = lease(tx, now=at(0))
        assert t is not None and lease(tx, now=at(0)) is None  # the key is full
        return t

    value(tx, "complete_task", **held(one()))
    value(tx, "fail_task", **held(one()), error=Jsonb(ERROR), retry_in="0 seconds")
    value(tx, "abort_task", **held(one()), errors=Jsonb([ERROR]))
    value(tx, "yield_task", **held(one()))  # handed back: running until the monitor resets it, but not counted
    value(tx, "yield_task", **held(one()), run_in="1 hour")
    tx.call("cancel_task", rn=one()["rn"])
    one()
    call(tx, "reset_expired_tasks", at(60))  # the timed-out lease (and the yielded one) are reset
    assert lease(tx, now=at(60)) is not None


def test_limits_set_while_tasks_run_count_them(tx):
    submit_many(tx, "q", 3, ["k", "k", "k"])
    running = lease(tx)
    tx.call("set_queue_limits", queue="q", running_per_key=1)
    assert lease(tx) is None
    value(tx, "complete_task", **held(running))
    assert lease(tx) is not None


def test_removing_the_limits_leases_as_before(tx):
    tx.call("set_queue_limits", queue="q", running_per_key=1)
    submit_many(tx, "q", 3, ["k", "k", "k"])
    assert len(lease_n(tx, "q", 3)) == 1
    answer = tx.call_value("set_queue_limits", queue="q")
    assert answer["running_per_key"] is None and answer["limits_by"] is None
    assert len(lease_n(tx, "q", 3)) == 2
    assert tx.query("SELECT * FROM pyscheduler.queue_limits") == []


def test_limits_and_keys_refuse_hostile_values(tx):
    for bad in (0, -1):
        assert code(lambda: tx.call("set_queue_limits", queue="q", running_per_key=bad)) == "PS216"
        assert code(lambda: tx.call("set_queue_limits", queue="q", running_total=bad)) == "PS216"
        assert code(lambda: tx.call("set_rate_limit", queue="q", starts=bad)) == "PS216"
    # 10^12 does not fit the integer parameter: no such function for a bigint, out of range as text
    assert code(lambda: tx.call("set_queue_limits", queue="q", running_per_key=10**12)) == "42883"
    assert code(lambda: tx.execute("SELECT pyscheduler.set_queue_limits('q', '1000000000000')")) == "22003"
    assert code(lambda: tx.execute("SELECT pyscheduler.set_rate_limit('q', 1, 'NaN')")) == "22007"
    assert code(lambda: tx.execute("SELECT pyscheduler.set_queue_limits('q', 'NaN'::float8::integer)")) == "22003"
    assert code(lambda: tx.execute("SELECT pyscheduler.set_queue_limits('q', 'NaN')")) == "22P02"
    assert code(lambda: tx.call("set_queue_limits", queue="q", running_per_key=1_000_001)) == "PS216"
    for per in ("0 seconds", "-1 second", "1 month", "2 days", "0.5 milliseconds"):
        assert code(lambda: tx.call("set_rate_limit", queue="q", starts=5, per=per)) == "PS216", per
    assert code(lambda: tx.call("set_queue_limits", queue="x" * 10_000_000, running_per_key=1)) == "PS208"
    assert code(lambda: tx.call("set_queue_limits", queue="a\x00b", running_per_key=1)) == "DataError"
    assert code(lambda: tx.execute(b"SELECT pyscheduler.set_queue_limits(convert_from('\\xc3'::bytea, 'UTF8'), 1)")) \
        == "22021"
    for key in ("k" * 10_000_000, "", " k", "a\u200bb", "a\x01b"):
        assert code(lambda: submit(tx, concurrency_key=key)) == "PS215", repr(key[:10])
        assert code(lambda: tx.call("submit_tasks", queue="q", specs=Jsonb([{}]), concurrency_keys=[key])) == "PS215"
    assert code(lambda: submit(tx, concurrency_key="a\x00b")) == "DataError"
    assert code(lambda: tx.call("submit_tasks", queue="q", specs=Jsonb([{}, {}]), concurrency_keys=["a"])) == "PS215"
    assert tx.query("SELECT count(*) AS n FROM pyscheduler.tasks")[0]["n"] == 0


def test_limits_belong_to_the_role_that_set_them(dsn, login):
    from pyscheduler.db import Database
    with Database(login("pyscheduler_client")[1]) as one, Database(login("pyscheduler_client")[1]) as other:
        one.call("set_queue_limits", queue="q", running_per_key=3)
        assert code(lambda: other.call("set_queue_limits", queue="q", running_per_key=5)) == "42501"
        assert code(lambda: other.call("set_rate_limit", queue="q", starts=5)) == "42501"
        one.call("set_queue_limits", queue="q", running_per_key=5)


def test_a_limited_queue_refuses_a_lease_outside_read_committed(dsn):
    with psycopg.connect(dsn, row_factory=dict_row) as c:
        c.execute("SELECT pyscheduler.set_queue_limits('q', 1)")
        c.execute("SELECT pyscheduler.submit_task('q', '{}', concurrency_key => 'k')")
        c.commit()
        c.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        with pytest.raises(psycopg.Error) as info:
            c.execute("SELECT pyscheduler.lease_task('q', 'w1')")
        assert info.value.sqlstate == "PS218"


@pytest.mark.slow
def test_racing_workers_never_exceed_the_limits(dsn, db):
    """8 workers lease (n 1..3), complete, fail, snooze and yield tasks of 5 keys while a monitor
    resets short leases: each worker records when a lease of a key began (after the lease's
    commit) and when it ended (before the call that ends it), so in a correct run those intervals
    of one key never overlap more than running_per_key, nor all of them more than running_total."""
    per_key, total = 2, 5
    db.call("set_queue_limits", queue="race", running_per_key=per_key, running_total=total)
    keys = [f"k{i % 5}" for i in range(400)]
    submit_many(db, "race", 400, keys)
    events: list[tuple[float, int, str]] = []  # (time, +1 or -1, key)
    lock = threading.Lock()
    live: dict[tuple[str, str], str] = {}  # (rn, the lease's TaskAssignment time) -> key: for the monitor's resets

    def lease_of(task):  # which lease of the task: its last TaskAssignment entry
        return task["rn"], [h for h in task["history"] if h["_typ"] == "TaskAssignment"][-1]["time"]
    stop = threading.Event()
    barrier = threading.Barrier(9)
    failures: list[BaseException] = []

    def record(delta, key, at_time):
        with lock:
            events.append((at_time, delta, key))

    def worker(i):
        rnd = random.Random(i)
        try:
            with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as c:
                barrier.wait()
                while not stop.is_set():
                    rows = c.execute("SELECT task FROM pyscheduler.lease_tasks('race', %s, n => %s, "
                                     "timeout => '0.3 seconds')", (f"w{i}", rnd.randint(1, 3))).fetchall()
                    began = time.monotonic()
                    if not rows:
                        if not c.execute("SELECT 1 FROM pyscheduler.tasks WHERE status <> 'completed' "
                                         "AND queue = 'race' LIMIT 1").fetchall():
                            return
                        continue
                    for r in rows:
                        t = r["task"]
                        record(+1, t["concurrency_key"], began)
                        with lock:
                            live[lease_of(t)] = t["concurrency_key"]
                    for r in rows:
                        t = r["task"]
                        time.sleep(rnd.random() * 0.004)  # the work
                        what = rnd.random()
                        ended = time.monotonic()
                        try:
                            if what < 0.70:
                                c.execute("SELECT pyscheduler.complete_task(%s, %s)", (t["rn"], t["token"]))
                            elif what < 0.80:
                                c.execute("SELECT pyscheduler.fail_task(%s, %s, %s, retry_in => '0')",
                                          (t["rn"], t["token"], Jsonb(ERROR)))
                            elif what < 0.87:
                                c.execute("SELECT pyscheduler.yield_task(%s, %s, run_in => '0.01 seconds')",
                                          (t["rn"], t["token"]))
                            elif what < 0.93:
                                c.execute("SELECT pyscheduler.yield_task(%s, %s)", (t["rn"], t["token"]))
                            else:
                                continue  # lost: the monitor resets it after its timeout
                        except psycopg.Error as exc:  # the monitor reset it first: ended there
                            assert exc.sqlstate in ("PS202", "PS201", "PS210"), exc
                            continue
                        with lock:
                            if live.pop(lease_of(t), None) is not None:
                                events.append((ended, -1, t["concurrency_key"]))
        except BaseException as exc:  # noqa: BLE001
            failures.append(exc)
            stop.set()

    def monitor():
        with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as c:
            barrier.wait()
            while not stop.is_set():
                before = time.monotonic()
                rows = c.execute("SELECT task FROM pyscheduler.reset_expired_tasks()").fetchall()
                with lock:
                    for r in rows:  # a lease that timed out (a yielded one ended at its yield)
                        if live.pop(lease_of(r["task"]), None) is not None:
                            events.append((before, -1, r["task"]["concurrency_key"]))
                time.sleep(0.05)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    mon = threading.Thread(target=monitor)
    for t in threads + [mon]:
        t.start()
    for t in threads:
        t.join(120)
    stop.set()
    mon.join(10)
    assert not failures, failures
    assert db.query("SELECT count(*) AS n FROM pyscheduler.tasks WHERE status = 'completed'")[0]["n"] == 400
    per: dict[str, int] = defaultdict(int)
    running = peak = 0
    peaks: dict[str, int] = defaultdict(int)
    for _, delta, key in sorted(events, key=lambda e: (e[0], e[1])):  # an end before a start at the same time
        per[key] += delta
        running += delta
        peaks[key] = max(peaks[key], per[key])
        peak = max(peak, running)
        assert per[key] <= per_key, (key, per[key])
        assert running <= total, running
    assert peak == total and max(peaks.values()) == per_key  # the limits were reached, not just respected


# ------------------------------------------------------------------ item 3: results, the finish NOTIFY


def test_complete_stores_a_result_that_get_task_shows(tx):
    submit(tx)
    t = lease(tx)
    done = value(tx, "complete_task", **held(t), result=Jsonb({"total": 42, "items": [1, 2]}))
    assert done["result"] == {"total": 42, "items": [1, 2]}
    assert get(tx, t["rn"])["result"] == {"total": 42, "items": [1, 2]}
    submit(tx), submit(tx)
    a, b = lease(tx), lease(tx)
    refused = tx.call("complete_tasks", rns=[a["rn"], b["rn"]], tokens=[a["token"], b["token"]],
                      results=Jsonb([7, None]))
    assert refused == []
    assert (get(tx, a["rn"])["result"], get(tx, b["rn"])["result"]) == (7, None)
    submit(tx)
    c = lease(tx)
    assert tx.call_value("complete_and_lease", worker="w1", queue="q", rn=c["rn"], token=c["token"],
                         result=Jsonb("text")) is None
    assert get(tx, c["rn"])["result"] == "text"


def test_a_result_above_the_setting_is_refused_and_the_task_stays_running(tx):
    tx.execute("UPDATE pyscheduler.settings SET value = '1000' WHERE name = 'task_max_result_bytes'")
    submit(tx), submit(tx)
    t, u = lease(tx), lease(tx)
    assert code(lambda: value(tx, "complete_task", **held(t), result=Jsonb({"x": "y" * 5000}))) == "PS217"
    assert code(lambda: tx.call("complete_tasks", rns=[t["rn"], u["rn"]], tokens=[t["token"], u["token"]],
                                results=Jsonb([1, {"x": "y" * 5000}]))) == "PS217"
    assert code(lambda: tx.call("complete_tasks", rns=[t["rn"]], tokens=[t["token"]], results=Jsonb([1, 2]))) \
        == "PS208"
    assert get(tx, t["rn"])["status"] == get(tx, u["rn"])["status"] == "running"


def test_a_watched_task_notifies_its_channel_when_it_finishes(dsn, db):
    rn = submit(db)["rn"]
    other = submit(db)["rn"]
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(f'LISTEN "pyscheduler_task:{rn}"')
        listener.execute(f'LISTEN "pyscheduler_task:{other}"')
        watched = db.call_value("watch_task", rn=rn)
        assert watched["status"] == "ready"
        t = lease(db)
        assert t["rn"] == rn
        value(db, "complete_task", **held(t), result=Jsonb(5))
        got = [(n.channel, n.payload) for n in listener.notifies(timeout=5.0, stop_after=1)]
        assert got == [(f"pyscheduler_task:{rn}", "completed")]
        db.call("cancel_task", rn=other)  # not watched: no NOTIFY
        assert list(listener.notifies(timeout=0.3)) == []
    assert db.call_value("watch_task", rn=rn)["result"] == 5  # finished already: answered at once


# ------------------------------------------------------------------ item 5: snooze


def test_yield_with_run_in_snoozes_without_using_an_attempt(tx):
    submit(tx, max_attempts=1, now=at(0))
    t = lease(tx, now=at(0))
    snoozed = value(tx, "yield_task", at(1), **held(t), run_in="30 seconds")
    assert (snoozed["status"], snoozed["attempts"], snoozed["owner"]) == ("scheduled", 0, None)
    assert snoozed["run_at"].startswith("2030-01-01T00:00:31")
    assert [h["_typ"] for h in snoozed["history"]] == ["TaskAssignment", "TaskYield"]
    assert snoozed["history"][-1]["run_at"] == snoozed["run_at"]
    assert lease(tx, now=at(30)) is None
    again = lease(tx, now=at(31))
    assert again["rn"] == t["rn"] and again["attempts"] == 1
    assert code(lambda: value(tx, "heartbeat_task", **held(t))) == "PS201"
    zero = value(tx, "yield_task", **held(again), run_in="0 seconds")
    assert zero["status"] == "ready"
    t3 = lease(tx)
    for bad in ("-1 second", "366 days"):
        assert code(lambda: value(tx, "yield_task", **held(t3), run_in=bad)) == "PS212"


# ------------------------------------------------------------------ item 6: the application's transaction


@pytest.fixture
def app(conn):
    conn.execute("CREATE TABLE public.accounts (id int PRIMARY KEY, balance int NOT NULL)")
    conn.execute("INSERT INTO public.accounts VALUES (1, 100)")
    conn.execute("GRANT ALL ON public.accounts TO pyscheduler_worker")
    return conn


def balance(conn) -> int:
    return conn.execute("SELECT balance FROM public.accounts WHERE id = 1").fetchone()["balance"]


def test_completing_in_the_applications_transaction_commits_both(dsn, db, app):
    submit(db)
    t = lease(db)
    with psycopg.connect(dsn) as c:  # the application's transaction
        c.execute("UPDATE public.accounts SET balance = balance - 10 WHERE id = 1")
        c.execute("SELECT pyscheduler.complete_task(%s, %s, %s)", (t["rn"], t["token"], Jsonb({"charged": 10})))
    assert balance(app) == 90
    assert get(db, t["rn"])["result"] == {"charged": 10}


def test_a_worker_that_lost_its_lease_mid_transaction_writes_nothing(dsn, db, app):
    submit(db, now=at(0))
    t = lease(db, now=at(0), timeout="10 seconds")
    with psycopg.connect(dsn) as c:
        c.execute("UPDATE public.accounts SET balance = balance - 10 WHERE id = 1")
        # meanwhile the lease times out and another worker leases the task
        call(db, "reset_expired_tasks", at(20))
        other = lease(db, now=at(20), worker="w2")
        with pytest.raises(psycopg.Error) as info:
            c.execute("SELECT pyscheduler.complete_task(%s, %s)", (t["rn"], t["token"]))
        assert info.value.sqlstate == "PS201"
        c.rollback()
    assert balance(app) == 100
    assert get(db, t["rn"])["owner"] == "w2" and other["rn"] == t["rn"]


def test_holds_lease_guards_an_update_and_keeps_the_lease_until_commit(dsn, db, app):
    submit(db, now=at(0))
    t = lease(db, now=at(0))
    with psycopg.connect(dsn) as c:
        got = c.execute("UPDATE public.accounts SET balance = balance - 10 "
                        "WHERE id = 1 AND pyscheduler.holds_lease(%s, %s)", (t["rn"], t["token"]))
        assert got.rowcount == 1
        # the lease cannot be lost before this transaction ends: the monitor skips the locked task
        assert call(db, "reset_expired_tasks", at(60)) == []
        value(db, "heartbeat_task", **held(t))  # the worker's heartbeats go on
        c.execute("SELECT pyscheduler.complete_task(%s, %s)", (t["rn"], t["token"]))
    assert balance(app) == 90
    # a lease that is gone guards nothing
    submit(db, now=at(0))
    u = lease(db, now=at(0))
    call(db, "reset_expired_tasks", at(60))
    with psycopg.connect(dsn) as c:
        got = c.execute("UPDATE public.accounts SET balance = balance - 10 "
                        "WHERE id = 1 AND pyscheduler.holds_lease(%s, %s)", (u["rn"], u["token"]))
        assert got.rowcount == 0
    assert balance(app) == 90
    assert db.call_value("holds_lease", rn=str(uuid.uuid4()), token=str(uuid.uuid4())) is False


YIELDS = {  # the lease holder's own yield (a worker stopping); the SQLSTATE it was refused with, or None
    "yield_task": ("SELECT pyscheduler.yield_task(%(rn)s, %(token)s)", None),
    "snooze": ("SELECT pyscheduler.yield_task(%(rn)s, %(token)s, run_in => '0 seconds')", None),
    "yield_tasks": ("SELECT sqlstate FROM pyscheduler.yield_tasks(ARRAY[%(rn)s]::uuid[], ARRAY[%(token)s]::uuid[])",
                    "rows"),
}


@pytest.mark.parametrize("ends", ["commit", "rollback"])
@pytest.mark.parametrize("how", sorted(YIELDS))
def test_the_holders_own_yield_waits_for_the_transaction_that_holds_its_lease(dsn, db, app, how, ends):
    """holds_lease keeps the lease until the guarding transaction ends, against the worker's own
    yield too (issue 27 item 9): the yield waits; if that transaction completed the task with its
    guarded write, the yield is refused and no worker leases the task again, else it yields."""
    submit(db)
    t = lease(db)
    sql, answer = YIELDS[how]
    got: dict = {}

    def worker_yields() -> None:
        with psycopg.connect(dsn, autocommit=True) as w:
            try:
                rows = w.execute(sql, held(t)).fetchall()
                got["refused"] = rows[0][0] if answer == "rows" and rows else None
            except psycopg.Error as exc:
                got["refused"] = exc.sqlstate

    with psycopg.connect(dsn) as c, psycopg.connect(dsn, autocommit=True) as watch:  # the application's transaction
        guarded = c.execute("UPDATE public.accounts SET balance = balance - 10 "
                            "WHERE id = 1 AND pyscheduler.holds_lease(%s, %s)", (t["rn"], t["token"]))
        assert guarded.rowcount == 1
        stopping = threading.Thread(target=worker_yields)
        stopping.start()
        deadline = time.monotonic() + 30
        while stopping.is_alive() and time.monotonic() < deadline and not watch.execute(
                "SELECT 1 FROM pg_stat_activity "
                "WHERE wait_event_type = 'Lock' AND query LIKE '%%yield_task%%'").fetchall():
            pass
        assert stopping.is_alive(), "the yield went through while a transaction held the lease"
        if ends == "commit":
            c.execute("SELECT pyscheduler.complete_task(%s, %s)", (t["rn"], t["token"]))
            c.commit()
        else:
            c.rollback()
        stopping.join(30)
    assert not stopping.is_alive()
    if ends == "commit":  # done once: the yield is refused, the task never runs again
        assert got["refused"] == "PS202"
        assert (balance(app), get(db, t["rn"])["status"]) == (90, "completed")
        assert lease(db) is None
    else:
        assert got["refused"] is None
        assert balance(app) == 100
        assert get(db, t["rn"])["history"][-1]["_typ"] == "TaskYield"


# ------------------------------------------------------------------ item 2: rate limits


def test_a_rate_limit_is_a_token_bucket_on_the_database_clock(tx):
    tx.call("set_rate_limit", queue="q", starts=5, per="1 second")
    submit_many(tx, "q", 40, None, now=at(0))
    assert len(lease_n(tx, "q", 10, now=at(0))) == 5  # a full bucket: the burst
    assert len(lease_n(tx, "q", 10, now=at(0))) == 0  # over the limit: the tasks wait in ready
    assert len(lease_n(tx, "q", 10, now=at(0.5))) == 2  # 2.5 tokens
    assert len(lease_n(tx, "q", 10, now=at(1.0))) == 3  # 0.5 + 2.5
    assert len(lease_n(tx, "q", 10, now=at(11))) == 5  # never more than the burst
    assert len(lease_n(tx, "q", 1, now=at(11.2))) == 1
    assert tx.query("SELECT count(*) AS n FROM pyscheduler.tasks WHERE status = 'ready'")[0]["n"] == 40 - 16


def test_a_rate_limit_by_key_has_a_bucket_per_key(tx):
    tx.call("set_rate_limit", queue="q", starts=2, per="1 minute", by_key=True)
    submit_many(tx, "q", 9, ["a", "a", "a", "b", "b", "b", None, None, None], now=at(0))
    got = lease_n(tx, "q", 20, now=at(0))
    assert sorted((t["concurrency_key"] or "-") for t in got) == ["-", "-", "-", "a", "a", "b", "b"]
    assert lease_n(tx, "q", 20, now=at(29)) == []
    assert [t["concurrency_key"] for t in lease_n(tx, "q", 20, now=at(30))] == ["a", "b"]


@pytest.mark.slow
def test_racing_workers_hold_a_rate_on_the_real_clock(dsn, db):
    """4 workers on their own connections lease a queue limited to 20 starts a second for 3 s,
    sleeping only as next_task_due says: a full bucket's burst (20) plus 20/s."""
    db.call("set_rate_limit", queue="rate", starts=20, per="1 second")
    submit_many(db, "rate", 400, None)
    starts: list[float] = []
    waits: list[float] = []  # what next_task_due said when a lease got nothing: the time to the next token
    lock = threading.Lock()
    barrier = threading.Barrier(4)

    failures: list[BaseException] = []

    def worker(i):
        try:
            run(i)
        except BaseException as exc:  # noqa: BLE001 - reported by the test, not lost in a thread
            failures.append(exc)

    def run(i):
        with psycopg.connect(dsn, autocommit=True) as c:
            barrier.wait()
            begin = time.monotonic()
            while time.monotonic() - begin < 3.0:
                rows = c.execute("SELECT rn FROM pyscheduler.lease_tasks_lean('rate', %s, n => 10)",
                                 (f"w{i}",)).fetchall()
                now = time.monotonic()
                with lock:
                    starts.extend([now] * len(rows))
                if not rows:
                    due = c.execute("SELECT extract(epoch FROM pyscheduler.next_task_due('rate'))").fetchone()[0]
                    if due is None:
                        continue  # a token came in since the lease: lease again
                    with lock:
                        waits.append(float(due))
                    time.sleep(float(due))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    begin = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    elapsed = time.monotonic() - begin
    assert not failures, failures
    assert 20 + 20 * 2.7 <= len(starts) <= 20 + 20 * elapsed + 1, (len(starts), elapsed)
    assert waits and max(waits) <= 0.05 + 1e-6, waits[:10]  # at most one token's time (1/20 s), never a poll


# ------------------------------------------------------------------ item 4: dependencies


def test_a_task_after_others_waits_for_them_and_reads_their_results(tx):
    a, b = submit(tx, spec={"p": "a"}), submit(tx, queue="other", spec={"p": "b"})  # any queue of the role
    child = submit(tx, spec={"c": 1}, after=[a["rn"], b["rn"]])
    assert (child["status"], child["after"]) == ("waiting", [a["rn"], b["rn"]])
    assert tx.query("SELECT waiting FROM pyscheduler.queue_status WHERE queue = 'q'")[0]["waiting"] == 1
    ta = lease(tx)
    assert ta["rn"] == a["rn"] and lease(tx) is None  # the child is not leased while it waits
    value(tx, "complete_task", **held(ta), result=Jsonb({"a": 1}))
    assert get(tx, child["rn"])["status"] == "waiting"
    tb = lease(tx, queue="other")
    value(tx, "complete_task", **held(tb), result=Jsonb([2]))
    assert get(tx, child["rn"])["status"] == "ready"
    tc = lease(tx)
    assert tc["rn"] == child["rn"]
    assert tc["parents"] == [{"rn": a["rn"], "status": "completed", "result": {"a": 1}},
                             {"rn": b["rn"], "status": "completed", "result": [2]}]
    assert value(tx, "parent_results", **held(tc)) == tc["parents"]
    assert "parents" not in lease_or_none(tx, submit(tx))


def lease_or_none(db, task):
    t = lease(db)
    assert t["rn"] == task["rn"]
    return t


def test_a_failed_parent_cancels_its_dependents_in_turn_unless_they_run_anyway(tx):
    p = submit(tx)
    child = submit(tx, after=[p["rn"]])
    grandchild = submit(tx, after=[child["rn"]])
    anyway = submit(tx, after=[p["rn"]], on_parent_failure="run")
    value(tx, "abort_task", **held(lease(tx)), errors=Jsonb([ERROR]))
    c = get(tx, child["rn"])
    assert c["status"] == "cancelled"
    assert c["history"][-1] | {"time": None} == {"_typ": "TaskParentFailed", "parent": p["rn"], "status": "aborted",
                                                 "time": None}
    g = get(tx, grandchild["rn"])
    assert (g["status"], g["history"][-1]["parent"]) == ("cancelled", child["rn"])
    assert get(tx, anyway["rn"])["status"] == "ready"
    # a parent cancelled by its client: the same
    q = submit(tx)
    d = submit(tx, after=[q["rn"]])
    tx.call("cancel_task", rn=q["rn"])
    assert get(tx, d["rn"])["history"][-1]["status"] == "cancelled"


def test_after_a_finished_task(tx):
    done = submit(tx)
    value(tx, "complete_task", **held(lease(tx)))
    assert submit(tx, after=[done["rn"]])["status"] == "ready"
    assert submit(tx, after=[done["rn"]], run_in="1 hour")["status"] == "scheduled"
    lease(tx), lease(tx)  # empty the queue of ready tasks
    failed = submit(tx, queue="f")
    tx.call("cancel_task", rn=failed["rn"])
    late = submit(tx, after=[failed["rn"]])
    assert (late["status"], late["history"][0]["_typ"]) == ("cancelled", "TaskParentFailed")
    assert submit(tx, after=[failed["rn"]], on_parent_failure="run")["status"] == "ready"


def test_after_refuses_missing_foreign_and_too_many_parents(db, conn, dsn, login):
    p = submit(db)
    for after in ([str(uuid.uuid4())], [p["rn"], None]):
        assert code(lambda: submit(db, after=after)) == "PS219"
    assert code(lambda: submit(db, after=[p["rn"]], on_parent_failure="ignore")) == "PS219"
    conn.execute("UPDATE pyscheduler.settings SET value = '3' WHERE name = 'task_max_parents'")
    others = [submit(db)["rn"] for _ in range(3)]
    assert code(lambda: submit(db, after=others + [p["rn"]])) == "PS219"
    twice = submit(db, after=[p["rn"], p["rn"]])
    assert db.query("SELECT waiting_on FROM pyscheduler.tasks WHERE rn = %s", [twice["rn"]])[0]["waiting_on"] == 1
    from pyscheduler.db import Database
    with Database(login("pyscheduler_client")[1]) as stranger:
        assert code(lambda: stranger.call("submit_task", queue="q", spec=Jsonb({}), after=[p["rn"]])) == "PS219"
    # a task after itself cannot be named before it exists: only through a workflow (a cycle, PS220)
    before = db.query("SELECT count(*) AS n FROM pyscheduler.tasks")[0]["n"]
    assert code(lambda: db.call("submit_workflow", workflow=Jsonb([{"name": "a", "queue": "q", "spec": {},
                                                                     "after": ["a"]}]))) == "PS220"
    assert db.query("SELECT count(*) AS n FROM pyscheduler.tasks")[0]["n"] == before


def test_a_join_after_ten_thousand_parents_is_released_by_a_counter(tx):
    submitted = tx.call("submit_tasks", queue="fan", specs=Jsonb([{"i": i} for i in range(10_000)]))
    parents = [r["task"]["rn"] for r in submitted]
    join = submit(tx, queue="join", after=parents)
    assert join["status"] == "waiting"
    leased = []
    while True:
        rows = lease_n(tx, "fan", 1000)
        if not rows:
            break
        leased += rows
        assert tx.call("complete_tasks", rns=[t["rn"] for t in rows], tokens=[t["token"] for t in rows]) == []
        left = tx.query("SELECT waiting_on, status FROM pyscheduler.tasks WHERE rn = %s", [join["rn"]])[0]
        assert left["waiting_on"] == 10_000 - len(leased)
    assert len(leased) == 10_000
    assert get(tx, join["rn"])["status"] == "ready"
    assert tx.query("SELECT count(*) AS n FROM pyscheduler.task_edges")[0]["n"] == 0


def test_a_parent_finishing_while_its_child_is_submitted_releases_it(dsn, db):
    """The submit locks the parent: a completion racing with it waits for its commit, then finds the edge."""
    p = submit(db)
    t = lease(db)
    with psycopg.connect(dsn) as c:
        child = c.execute("SELECT pyscheduler.submit_task('q', '{}', after => ARRAY[%s]::uuid[])",
                          [p["rn"]]).fetchone()[0]
        done = threading.Thread(target=lambda: value(db, "complete_task", **held(t)))
        done.start()
        with psycopg.connect(dsn, autocommit=True) as w:
            while not w.execute("SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                "AND query LIKE '%%complete_task%%'").fetchall():
                pass
        c.commit()
        done.join(10)
    assert get(db, child["rn"])["status"] == "ready"


def test_a_waiting_task_holds_its_unique_key_and_can_be_cancelled(tx):
    p = submit(tx)
    w = submit(tx, after=[p["rn"]], unique_key="once")
    assert submit(tx, unique_key="once")["deduplicated"] is True
    assert tx.call_value("cancel_task", rn=w["rn"])["status"] == "cancelled"
    value(tx, "complete_task", **held(lease(tx)))
    assert get(tx, w["rn"])["status"] == "cancelled"


def waiting_on(db, rn) -> int:
    return db.query("SELECT waiting_on FROM pyscheduler.tasks WHERE rn = %s", [rn])[0]["waiting_on"]


@pytest.mark.parametrize("requeue", ["retry_task", "retry_tasks"])
def test_a_requeued_dependent_waits_again_for_its_parents_that_have_not_completed(tx, requeue):
    """Issue 27 item 8: requeuing a cancelled dependent made it ready while its parents were
    still scheduled, ready or running; it waits for them again, counted down by their ends."""
    def again(task):
        if requeue == "retry_task":
            return tx.call_value("retry_task", rn=task["rn"])
        rows = [r["task"] for r in tx.call("retry_tasks", queue=task["queue"], status="cancelled")]
        assert [r["rn"] for r in rows] == [task["rn"]]
        return rows[0]

    later = submit(tx, queue="p", run_in="1 hour")  # scheduled
    first = submit(tx, queue="p")
    done = submit(tx, queue="p")
    value(tx, "complete_task", **held(lease(tx, queue="p")))  # `first` completed
    child = submit(tx, queue="c", after=[later["rn"], first["rn"], done["rn"]])
    assert tx.call_value("cancel_task", rn=child["rn"])["status"] == "cancelled"
    requeued = again(child)
    assert (requeued["status"], waiting_on(tx, child["rn"])) == ("waiting", 2)  # `later` and `done`
    assert lease(tx, queue="c") is None
    value(tx, "complete_task", **held(lease(tx, queue="p")))  # `done`
    assert (get(tx, child["rn"])["status"], waiting_on(tx, child["rn"])) == ("waiting", 1)
    tx.call("cancel_task", rn=later["rn"])  # a parent that fails cancels it again
    assert get(tx, child["rn"])["history"][-1]["_typ"] == "TaskParentFailed"
    # requeued while that parent is cancelled: refused (left as it is by retry_tasks); once the
    # parent is requeued, it waits for it (the edge its cancel deleted is made again)
    if requeue == "retry_task":
        assert code(lambda: again(child)) == "PS211"
    else:
        assert tx.call("retry_tasks", queue="c", status="cancelled") == []
    tx.call_value("retry_task", rn=later["rn"])
    assert (again(child)["status"], waiting_on(tx, child["rn"])) == ("waiting", 1)
    value(tx, "complete_task", **held(lease(tx, queue="p")))
    assert get(tx, child["rn"])["status"] == "ready"
    assert lease(tx, queue="c")["rn"] == child["rn"]
    counts = {(r["queue"], r["status"]): r["tasks"] for r in tx.query("SELECT * FROM pyscheduler.task_counts")}
    assert counts == {(r["queue"], r["status"]): r["n"] for r in tx.query(
        "SELECT queue, status::text, count(*) AS n FROM pyscheduler.tasks GROUP BY 1, 2")}


# ------------------------------------------------------------------ submit_workflow


def test_a_workflow_is_submitted_parents_first_and_runs_in_order(tx):
    flow = [{"name": "join", "queue": "q", "spec": {"s": "join"}, "after": ["left", "right"]},
            {"name": "left", "queue": "q", "spec": {"s": "left"}, "after": ["fetch"]},
            {"name": "right", "queue": "q", "spec": {"s": "right"}, "after": ["fetch"], "priority": 60},
            {"name": "fetch", "queue": "q", "spec": {"s": "fetch"}, "concurrency_key": "api"}]
    tasks = tx.call_value("submit_workflow", workflow=Jsonb(flow))
    assert set(tasks) == {"join", "left", "right", "fetch"}
    assert tasks["fetch"]["status"] == "ready" and tasks["join"]["after"] == [tasks["left"]["rn"], tasks["right"]["rn"]]
    order = []
    while (t := lease(tx)) is not None:
        order.append(t["spec"]["s"])
        value(tx, "complete_task", **held(t))
    assert order == ["fetch", "right", "left", "join"]


@pytest.mark.parametrize("flow", [
    [{"name": "a", "queue": "q", "spec": {}, "after": ["b"]}, {"name": "b", "queue": "q", "spec": {}, "after": ["a"]}],
    [{"name": "a", "queue": "q", "spec": {}, "after": ["nobody"]}],
    [{"name": "a", "queue": "q", "spec": {}}, {"name": "a", "queue": "q", "spec": {}}],
    [{"name": "a", "queue": "q", "spec": {}, "after": "a"}],
    [{"name": "", "queue": "q", "spec": {}}],
    [{"queue": "q", "spec": {}}],
    [{"name": "a", "queue": "q", "spec": {}, "colour": "red"}],
    [],
    {"a": {}},
])
def test_a_bad_workflow_is_refused_and_nothing_is_submitted(tx, flow):
    ok = {"name": "z", "queue": "q", "spec": {}}
    body = flow + [ok] if isinstance(flow, list) and flow else flow
    assert code(lambda: tx.call("submit_workflow", workflow=Jsonb(body))) == "PS220"
    assert tx.query("SELECT count(*) AS n FROM pyscheduler.tasks")[0]["n"] == 0


def test_a_workflow_above_the_setting_is_refused(tx):
    nodes = [{"name": f"n{i}", "queue": "q", "spec": {}} for i in range(100_000)]
    assert code(lambda: tx.call("submit_workflow", workflow=Jsonb(nodes))) == "PS220"
    assert tx.query("SELECT count(*) AS n FROM pyscheduler.tasks")[0]["n"] == 0


def test_unique_keys_in_a_workflow_are_deduplicated_as_submit_task_does(dsn, db):
    """A node whose key an earlier node or a live task holds is that task; the nodes after it wait
    for it. A key a concurrent submit takes while the workflow is inserted: its task too."""
    live = submit(db, unique_key="fetch")
    flow = [{"name": "fetch", "queue": "q", "spec": {}, "unique_key": "fetch"},
            {"name": "parse", "queue": "q", "spec": {}, "after": ["fetch"], "unique_key": "parse"},
            {"name": "parse2", "queue": "q", "spec": {}, "after": ["fetch"], "unique_key": "parse"},
            {"name": "load", "queue": "q", "spec": {}, "after": ["parse", "parse2"]}]
    tasks = db.call_value("submit_workflow", workflow=Jsonb(flow))
    assert (tasks["fetch"]["rn"], tasks["fetch"]["deduplicated"]) == (live["rn"], True)
    assert (tasks["parse2"]["rn"], tasks["parse2"]["deduplicated"]) == (tasks["parse"]["rn"], True)
    assert tasks["parse"]["after"] == [live["rn"]] and tasks["load"]["after"] == [tasks["parse"]["rn"]] * 2
    assert [waiting_on(db, tasks[n]["rn"]) for n in ("parse", "load")] == [1, 1]
    value(db, "complete_task", **held(lease(db)))  # the live task: parse is released
    assert get(db, tasks["parse"]["rn"])["status"] == "ready"
    with psycopg.connect(dsn) as other, psycopg.connect(dsn, autocommit=True) as watch:
        taken = other.execute("SELECT pyscheduler.submit_task('q', '{}', unique_key => 'raced')").fetchone()[0]
        got: dict = {}
        racing = threading.Thread(target=lambda: got.update(db.call_value("submit_workflow", workflow=Jsonb(
            [{"name": "r", "queue": "q", "spec": {}, "unique_key": "raced"},
             {"name": "s", "queue": "q", "spec": {}, "after": ["r"]}]))))
        racing.start()
        while racing.is_alive() and not watch.execute(
                "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%%submit_workflow%%'"
                ).fetchall():
            pass
        other.commit()
        racing.join(30)
    assert (got["r"]["rn"], got["r"]["deduplicated"]) == (taken["rn"], True)
    assert get(db, got["s"]["rn"])["after"] == [taken["rn"]]


@pytest.mark.parametrize("key, bad, sqlstate", [
    ("queue", {"x": 1}, "PS208"), ("queue", 7, "PS208"), ("queue", "", "PS208"), ("queue", None, "PS208"),
    ("spec", [], "PS206"), ("spec", "{}", "PS206"),
    ("priority", "60", "PS204"), ("priority", 1.5, "PS204"), ("priority", 10**30, "PS204"),
    ("priority", 5_000_000_000, "PS204"), ("priority", -1, "PS204"),
    ("max_attempts", "3", "PS208"), ("max_attempts", 2.5, "PS208"), ("max_attempts", 0, "PS208"),
    ("max_attempts", 10**12, "PS208"),
    ("unique_key", 5, "PS213"), ("unique_key", " x", "PS213"),
    ("concurrency_key", {"k": 1}, "PS215"), ("concurrency_key", "", "PS215"),
    ("run_in", "soon", "PS212"), ("run_in", True, "PS212"), ("run_in", -5, "PS212"), ("run_in", "400 days", "PS212"),
    ("on_parent_failure", "ignore", "PS219"), ("on_parent_failure", 1, "PS219"),
    ("after", [1], "PS220"), ("after", {"a": 1}, "PS220"), ("name", 5, "PS220"),
])
def test_a_node_value_of_the_wrong_type_or_out_of_bounds_names_the_node_and_its_key(tx, key, bad, sqlstate):
    """Issue 27 item 12: raw 22P02/22003 errors naming neither, or a queue {"x": 1} taken as the
    text of the object; now the key's own SQLSTATE, as submit_task's, and nothing submitted."""
    flow = [{"name": "a", "queue": "q", "spec": {}}, {"name": "b", "queue": "q", "spec": {}, key: bad}]
    with pytest.raises(errors.SchedulerError) as info:
        tx.call("submit_workflow", workflow=Jsonb(flow))
    assert info.value.sqlstate == sqlstate
    assert str(info.value).startswith("workflow[1]") and key in str(info.value)
    assert tx.query("SELECT count(*) AS n FROM pyscheduler.tasks")[0]["n"] == 0


def test_a_node_may_leave_out_an_optional_key_with_null(tx):
    optional = ["priority", "unique_key", "max_attempts", "concurrency_key", "run_in", "on_parent_failure"]
    tasks = tx.call_value("submit_workflow", workflow=Jsonb([{"name": "a", "queue": "q", "spec": {}, "after": [],
                                                              **dict.fromkeys(optional)}]))
    a = tasks["a"]
    assert (a["status"], a["priority"], a["after"], a["max_attempts"], a["on_parent_failure"]) == (
        "ready", 50, None, None, "cancel")


def test_a_node_with_a_bad_value_refuses_the_whole_workflow(tx):
    flow = [{"name": "a", "queue": "q", "spec": {}}, {"name": "b", "queue": "q", "spec": [], "after": ["a"]}]
    assert code(lambda: tx.call("submit_workflow", workflow=Jsonb(flow))) == "PS206"
    assert tx.query("SELECT count(*) AS n FROM pyscheduler.tasks")[0]["n"] == 0
