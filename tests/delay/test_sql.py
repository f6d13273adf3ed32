"""The delay queue's SQL functions, called directly (sql/delay.sql)."""

from __future__ import annotations

import re
import threading
import uuid
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from pyscheduler import errors
from pyscheduler.db import Jsonb

T0 = datetime(2030, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
MS = timedelta(milliseconds=1)
S = timedelta(seconds=1)


def enqueue(db, id, deadline, now=T0, key=None, value=None, headers=None, **kw):
    """enqueue_message at a chosen time: the private _enqueue_messages (granted to no role)."""
    return db.call("_enqueue_messages", ids=[id], deadlines=[deadline], keys=[key], vals=[value],
                   header_lists=[headers], p_now=now, **kw)[0]["outcome"]


def claim(db, node, now=T0, **kw):
    return db.call("_ready_and_claim", node=node, p_now=now, **kw)


def rows(conn):
    return conn.execute("SELECT id, readied_at, readied_by FROM pyscheduler.delay_messages ORDER BY id").fetchall()


# -- enqueue ------------------------------------------------------------------

def test_enqueue_stores_the_message_and_is_idempotent_on_id(tx):
    headers = [{"trace": "abc"}, {"trace": "def"}, {"bin": {"base64": "AP8="}}]
    assert enqueue(tx, "m1", T0 + 5 * S, key=b"k", value=b"\x00\xffnot json", headers=Jsonb(headers)) == "enqueued"
    assert enqueue(tx, "m1", T0 + 9 * S, value=b"other") == "duplicate"
    row = tx.execute("SELECT * FROM pyscheduler.delay_messages").fetchone()
    assert (row["id"], row["deadline"], row["key"], row["value"], row["headers"]) == (
        "m1", T0 + 5 * S, b"k", b"\x00\xffnot json", headers)
    assert row["readied_at"] is None and row["readied_by"] is None


def test_enqueue_late_message_is_not_stored_unless_already_present(tx):
    # within the timing advance: late, the caller publishes it now
    assert enqueue(tx, "late", T0 + 40 * MS, advance=timedelta(milliseconds=50)) == "late"
    assert enqueue(tx, "past", T0 - 3 * S) == "late"
    assert rows(tx) == []
    # just outside the advance: stored
    assert enqueue(tx, "ok", T0 + 60 * MS, advance=timedelta(milliseconds=50)) == "enqueued"
    # an id already waiting is a duplicate even when the new copy is late
    assert enqueue(tx, "ok", T0 - S) == "duplicate"
    assert [r["id"] for r in rows(tx)] == ["ok"]


def test_enqueue_messages_reports_each_message_in_input_order(tx):
    enqueue(tx, "old", T0 + 10 * S)
    out = tx.call("_enqueue_messages", ids=["a", "b", "a", "old", "c"],
                  deadlines=[T0 + S, T0 - S, T0 + 2 * S, T0 + S, T0 + 3 * S],
                  keys=[b"ka", None, b"ka2", None, b"kc"], vals=[b"va", b"vb", b"va2", b"vo", None],
                  header_lists=[Jsonb([{"h": "1"}]), None, None, None, Jsonb([])], p_now=T0)
    assert [(r["ord"], r["id"], r["outcome"]) for r in out] == [
        (1, "a", "enqueued"), (2, "b", "late"), (3, "a", "duplicate"), (4, "old", "duplicate"), (5, "c", "enqueued")]
    stored = {r["id"]: r for r in tx.execute("SELECT * FROM pyscheduler.delay_messages").fetchall()}
    assert sorted(stored) == ["a", "c", "old"]
    assert (stored["a"]["key"], stored["a"]["value"], stored["a"]["headers"]) == (b"ka", b"va", [{"h": "1"}])
    assert stored["c"]["value"] is None and stored["c"]["headers"] == []


def test_enqueue_messages_can_store_late_messages(tx):
    out = tx.call("_enqueue_messages", ids=["late", "later"], deadlines=[T0 - S, T0 + S], p_now=T0, store_late=True)
    assert [r["outcome"] for r in out] == ["enqueued", "enqueued"]
    assert [r["id"] for r in claim(tx, uuid.uuid4(), now=T0)] == ["late"]


def test_store_late_null_is_refused_not_a_dropped_duplicate(tx):
    """store_late => NULL answered a late message 'duplicate' without storing it: a direct SQL
    caller dropped it. Refused instead, naming the argument; nothing stored."""
    for deadline in (T0 - S, T0 + S):  # late or not: NULL is no answer
        with pytest.raises(errors.InvalidArgument, match="store_late") as info:
            tx.call("_enqueue_messages", ids=["m"], deadlines=[deadline], p_now=T0, store_late=None)
        assert info.value.sqlstate == "PS105"
    with pytest.raises(errors.InvalidArgument, match="store_late"):
        tx.call("enqueue_messages", ids=["m"], deadlines=[T0], store_late=None)
    assert rows(tx) == []


def test_enqueue_messages_with_only_ids_and_deadlines(tx):
    out = tx.call("_enqueue_messages", ids=["x", "y"], deadlines=[T0 + S, T0 + S], p_now=T0)
    assert [r["outcome"] for r in out] == ["enqueued", "enqueued"]
    assert tx.call("_enqueue_messages", ids=[], deadlines=[], p_now=T0) == []


@pytest.mark.parametrize("args, code", [
    (dict(id="", deadline=T0), "PS101"),
    (dict(id="x" * 129, deadline=T0), "PS101"),
    (dict(id=None, deadline=T0), "PS101"),
    (dict(id="x", deadline=None), "PS102"),
    (dict(id="x", deadline=T0, headers=Jsonb({"a": "b"})), "PS104"),
    (dict(id="x", deadline=T0, headers=Jsonb([{"a": "b", "c": "d"}])), "PS104"),
    (dict(id="x", deadline=T0, headers=Jsonb(["a"])), "PS104"),
    (dict(id="x", deadline=T0, advance=timedelta(seconds=-1)), "PS105"),
])
def test_enqueue_rejects_bad_arguments_with_their_code(tx, args, code):
    with pytest.raises(errors.InvalidArgument) as info:
        tx.call_value("enqueue_message", **args)
    assert info.value.sqlstate == code


def test_enqueue_accepts_an_id_of_128_characters(tx):
    assert enqueue(tx, "x" * 128, T0 + S) == "enqueued"


def test_enqueue_messages_rejects_arrays_of_different_lengths(tx):
    with pytest.raises(errors.InvalidArgument) as info:
        tx.call("_enqueue_messages", ids=["a", "b"], deadlines=[T0 + S], p_now=T0)
    assert info.value.sqlstate == "PS103"
    with pytest.raises(errors.InvalidArgument) as info:
        tx.call("_enqueue_messages", ids=["a"], deadlines=[T0 + S], keys=[b"1", b"2"], p_now=T0)
    assert info.value.sqlstate == "PS103"
    assert rows(tx) == []


# -- claim ---------------------------------------------------------------------

def test_ready_and_claim_takes_due_messages_earliest_first_in_batches(tx):
    node = uuid.uuid4()
    for i, offset in enumerate([3, 1, 2, 60]):
        enqueue(tx, f"m{i}", T0 + offset * S)
    # nothing due yet: deadline minus advance is later than now
    assert claim(tx, node, now=T0 + 900 * MS) == []
    assert [r["id"] for r in claim(tx, node, now=T0 + 960 * MS)] == ["m1"]  # 1 s - 50 ms advance
    got = claim(tx, node, now=T0 + 10 * S, max_count=1)
    assert [r["id"] for r in got] == ["m2"]
    got = claim(tx, node, now=T0 + 10 * S)
    assert [r["id"] for r in got] == ["m0"]
    assert got[0]["readied_at"] == T0 + 10 * S
    by = {r["id"]: r for r in rows(tx)}
    assert by["m0"]["readied_by"] == node and by["m3"]["readied_at"] is None
    # claimed rows are not claimed again
    assert claim(tx, uuid.uuid4(), now=T0 + 10 * S) == []


def test_ready_and_claim_returns_what_to_publish(tx):
    enqueue(tx, "m", T0 + S, key=b"key", value=b"\x01\x02", headers=Jsonb([{"a": "1"}]))
    (row,) = claim(tx, uuid.uuid4(), now=T0 + 2 * S)
    assert (row["id"], row["deadline"], row["key"], row["value"], row["headers"]) == (
        "m", T0 + S, b"key", b"\x01\x02", [{"a": "1"}])


@pytest.mark.parametrize("args", [dict(node=None), dict(max_count=0), dict(advance=timedelta(seconds=-1))])
def test_ready_and_claim_rejects_bad_arguments(tx, args):
    with pytest.raises(errors.InvalidArgument) as info:
        tx.call("ready_and_claim", **{"node": uuid.uuid4(), **args})
    assert info.value.sqlstate == "PS105"


def test_two_connections_claiming_at_once_never_get_the_same_row(dsn, db):
    n = 400
    db.call("_enqueue_messages", ids=[f"m{i}" for i in range(n)], deadlines=[T0 + S] * n, p_now=T0)
    # First: an open transaction holding a claim makes the other skip, not wait.
    with psycopg.connect(dsn) as a, psycopg.connect(dsn, autocommit=True) as b:
        first = a.execute("SELECT id FROM pyscheduler._ready_and_claim(node => %s, max_count => 50, p_now => %s)",
                          (uuid.uuid4(), T0 + 2 * S)).fetchall()
        b.execute("SET lock_timeout = '2s'")
        second = b.execute("SELECT id FROM pyscheduler._ready_and_claim(node => %s, max_count => 50, p_now => %s)",
                           (uuid.uuid4(), T0 + 2 * S)).fetchall()
        assert len(first) == len(second) == 50
        assert not {r[0] for r in first} & {r[0] for r in second}
        a.rollback()  # a's 50 go back to waiting; b's 50 stay claimed
    # Then: two threads racing in small batches claim every remaining row exactly once.
    claimed: dict[str, list[str]] = {"x": [], "y": []}
    barrier = threading.Barrier(2)

    def worker(name: str) -> None:
        node = uuid.uuid4()
        with psycopg.connect(dsn, autocommit=True) as c:
            barrier.wait()
            while True:
                got = c.execute("SELECT id FROM pyscheduler._ready_and_claim(node => %s, max_count => 7, p_now => %s)",
                                (node, T0 + 2 * S)).fetchall()
                if not got:
                    return
                claimed[name] += [r[0] for r in got]

    threads = [threading.Thread(target=worker, args=(k,)) for k in claimed]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    everything = claimed["x"] + claimed["y"]
    assert len(everything) == len(set(everything)) == n - 50
    assert not set(everything) & {r[0] for r in second}


def test_ready_and_claim_after_takes_only_deadlines_from_the_bound_on(tx):
    node = uuid.uuid4()
    for i in range(4):
        enqueue(tx, f"m{i}", T0 + (i + 1) * S)
    # all four are due at T0 + 10 s; from T0 + 3 s on only m2 and m3
    got = claim(tx, node, now=T0 + 10 * S, after=T0 + 3 * S)
    assert sorted(r["id"] for r in got) == ["m2", "m3"]
    assert tx.call_value("next_deadline", after=T0 + 3 * S) is None
    assert tx.call_value("next_deadline", after=T0 + 2 * S) == T0 + 2 * S
    assert tx.call_value("next_deadline") == T0 + S
    # the rest is not lost: a claim without the bound takes it
    assert [r["id"] for r in claim(tx, node, now=T0 + 10 * S)] == ["m0", "m1"]
    assert {r["id"] for r in rows(tx) if r["readied_at"] is None} == set()


def test_a_claim_with_after_skips_the_index_entries_fired_messages_left(db, conn):
    """Fired (claimed and deleted) messages leave their entries at the low end of the waiting
    index until VACUUM: a claim from the start reads every one of them, one with `after`
    starts where the relay got to."""
    n = 5000
    node = uuid.uuid4()
    db.call("_enqueue_messages", ids=[f"f{i}" for i in range(n)], deadlines=[T0 + i * MS for i in range(n)],
            p_now=T0 - S)
    fired = claim(db, node, now=T0 + 10 * S, max_count=n)
    db.call("delete_fired", ids=[r["id"] for r in fired], node=node)
    enqueue(db, "next", T0 + 6 * S, now=T0)

    def buffers(after):
        conn.execute("SET enable_seqscan = off")
        plan = "\n".join(r["QUERY PLAN"] for r in conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT TEXT) SELECT m.deadline FROM pyscheduler.delay_messages m "
            "WHERE m.readied_at IS NULL AND m.deadline >= coalesce(%s::timestamptz, '-infinity') "
            "ORDER BY m.deadline LIMIT 1", (after,)).fetchall())
        return sum(int(x) for x in re.findall(r"shared hit=(\d+)", plan.split("Planning")[0])[:1])

    assert db.call_value("next_deadline", after=T0 + 4 * S) == db.call_value("next_deadline") == T0 + 6 * S
    from_start, bounded = buffers(None), buffers(T0 + 4 * S)
    assert bounded <= 5 < from_start, (bounded, from_start)


def test_claim_uses_the_partial_index_on_waiting_rows(tx):
    tx.execute("SET enable_seqscan = off")
    plan = "\n".join(r["QUERY PLAN"] for r in tx.execute(
        "EXPLAIN SELECT id FROM pyscheduler.delay_messages WHERE readied_at IS NULL AND deadline <= now() "
        "ORDER BY deadline LIMIT 10 FOR UPDATE SKIP LOCKED").fetchall())
    assert "delay_messages_waiting_idx" in plan
    indexdef = tx.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'delay_messages_waiting_idx'"
                            ).fetchone()["indexdef"]
    assert "WHERE (readied_at IS NULL)" in indexdef


# -- delete --------------------------------------------------------------------

def test_delete_fired_deletes_and_reports_what_was_already_gone(tx):
    node, peer = uuid.uuid4(), uuid.uuid4()
    for i in range(3):
        enqueue(tx, f"m{i}", T0 + S)
    claim(tx, node, now=T0 + 2 * S)
    gone = tx.call("delete_fired", ids=["m0", "m1", "nope"], node=node)
    assert [r["id"] for r in gone] == ["nope"]
    assert [r["id"] for r in rows(tx)] == ["m2"]
    # a peer's delete leaves this node's ready row alone and reports it
    assert [r["id"] for r in tx.call("delete_fired", ids=["m2"], node=peer)] == ["m2"]
    assert [r["id"] for r in tx.call("delete_fired", ids=["m2"])] == []
    assert rows(tx) == []


def test_delete_fired_never_deletes_a_waiting_message(tx):
    # fired, forgotten, and enqueued again with the same id: a late delete must not lose it
    node = uuid.uuid4()
    enqueue(tx, "m", T0 + S)
    claim(tx, node, now=T0 + 2 * S)
    assert tx.call("delete_fired", ids=["m"], node=node) == []
    assert enqueue(tx, "m", T0 + 10 * S, now=T0 + 2 * S) == "enqueued"
    assert [r["id"] for r in tx.call("delete_fired", ids=["m"], node=node)] == ["m"]
    assert [r["id"] for r in rows(tx)] == ["m"]


# -- reset ---------------------------------------------------------------------

def test_reset_stuck_resets_only_rows_held_longer_than_the_hold_time(tx):
    stale, fresh = uuid.uuid4(), uuid.uuid4()
    enqueue(tx, "old", T0 + S)
    enqueue(tx, "new", T0 + 3 * S)
    claim(tx, stale, now=T0 + 2 * S)            # readied at T0+2s
    claim(tx, fresh, now=T0 + 6 * S)            # readied at T0+6s
    hold = timedelta(seconds=5)
    assert tx.call("_reset_stuck", hold=hold, p_now=T0 + 7 * S) == []
    out = tx.call("_reset_stuck", hold=hold, p_now=T0 + 7500 * MS)
    assert [(r["id"], r["suspected_node"], r["readied_at"]) for r in out] == [("old", stale, T0 + 2 * S)]
    by = {r["id"]: r for r in rows(tx)}
    assert by["old"]["readied_at"] is None and by["old"]["readied_by"] is None
    assert by["new"]["readied_by"] == fresh
    # the reset message is claimable again, by another node
    assert [r["id"] for r in claim(tx, fresh, now=T0 + 8 * S)] == ["old"]


def test_reset_stuck_skips_a_row_whose_owner_is_busy_with_it(dsn, db, conn):
    node = uuid.uuid4()
    enqueue(db, "m", T0 + S)
    claim(db, node, now=T0 + 2 * S)
    with psycopg.connect(dsn) as owner:  # the owner is deleting it right now (uncommitted)
        owner.execute("SELECT * FROM pyscheduler.delete_fired(ids => ARRAY['m'], node => %s)", (node,))
        assert db.call("_reset_stuck", hold=timedelta(seconds=1), p_now=T0 + 10 * S) == []
        owner.commit()
    assert rows(conn) == []


def test_reset_stuck_rejects_a_non_positive_hold(tx):
    with pytest.raises(errors.InvalidArgument) as info:
        tx.call("reset_stuck", hold=timedelta(0))
    assert info.value.sqlstate == "PS105"


@pytest.mark.parametrize("hold", ["1000000 years", "294276 years", "101 years"])
def test_reset_stuck_refuses_a_hold_past_100_years_with_ps105_not_22008(tx, hold):
    """now - hold past the first timestamp gave a raw 'timestamp out of range' (22008)."""
    with pytest.raises(psycopg.Error) as info:
        tx.execute("SELECT * FROM pyscheduler.reset_stuck(hold => %s::interval)", (hold,))
    assert info.value.sqlstate == "PS105" and "hold" in str(info.value)


def test_reset_stuck_takes_a_hold_of_100_years(tx):
    node = uuid.uuid4()
    enqueue(tx, "m", T0 + S)
    claim(tx, node, now=T0 + 2 * S)
    assert tx.call("reset_stuck", hold="100 years") == []


# -- wake-ups, cancel, views, roles ---------------------------------------------

def test_enqueue_notifies_when_a_message_is_due_before_what_sleepers_expect(dsn, db):
    def soon(ms: int) -> datetime:
        return datetime.now(timezone.utc) + timedelta(milliseconds=ms)

    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pyscheduler_delay")

        def notes() -> list:
            return list(listener.notifies(timeout=0.3, stop_after=5))

        # due in 1 minute: the poll will find it, no notification
        db.call_value("enqueue_message", id="far", deadline=soon(60_000))
        assert notes() == []
        # due within the poll interval and earlier than everything waiting: wake sleepers
        db.call_value("enqueue_message", id="soon", deadline=soon(120))
        assert [n.channel for n in notes()] == ["pyscheduler_delay"]
        # later than the head of the queue: sleepers already expect an earlier one
        db.call_value("enqueue_message", id="after", deadline=soon(140))
        assert notes() == []


def test_next_deadline_is_the_earliest_waiting_one(tx):
    assert tx.call_value("next_deadline") is None
    enqueue(tx, "a", T0 + 5 * S)
    enqueue(tx, "b", T0 + 3 * S)
    assert tx.call_value("next_deadline") == T0 + 3 * S
    claim(tx, uuid.uuid4(), now=T0 + 4 * S)
    assert tx.call_value("next_deadline") == T0 + 5 * S


def test_cancel_message_removes_only_waiting_messages(tx):
    enqueue(tx, "a", T0 + S)
    enqueue(tx, "b", T0 + 9 * S)
    claim(tx, uuid.uuid4(), now=T0 + 2 * S)
    assert tx.call_value("cancel_message", id="b") is True
    assert tx.call_value("cancel_message", id="a") is False  # being fired
    assert tx.call_value("cancel_message", id="zz") is False


def test_views_show_counts_next_deadline_and_ready_per_node(tx):
    now = datetime.now(timezone.utc)
    node = uuid.uuid4()
    tx.call("_enqueue_messages", ids=["a", "b", "c", "d"],
            deadlines=[now + timedelta(minutes=1), now + timedelta(minutes=2), now + timedelta(minutes=3),
                       now + timedelta(hours=1)], p_now=now - timedelta(hours=1))
    tx.call("_ready_and_claim", node=node, max_count=2, p_now=now + timedelta(minutes=2, seconds=30))
    stats = tx.query("SELECT * FROM pyscheduler.delay_queue")[0]
    assert (stats["waiting"], stats["ready"], stats["overdue"]) == (2, 2, 0)
    assert stats["next_deadline"] == now + timedelta(minutes=3)
    assert stats["oldest_ready_age"] < timedelta(0)  # readied "in the future" by the test clock
    (per_node,) = tx.query("SELECT * FROM pyscheduler.delay_ready_by_node")
    assert (per_node["node"], per_node["ready"]) == (node, 2)


def test_relay_and_client_roles_get_their_functions_and_task_workers_none(tx):
    def can(role: str, fn: str) -> bool:
        return tx.execute("SELECT has_function_privilege(%s, p.oid, 'EXECUTE') AS ok FROM pg_proc p "
                            "WHERE p.pronamespace = 'pyscheduler'::regnamespace AND p.proname = %s",
                            (role, fn)).fetchone()["ok"]

    for fn in ("enqueue_messages", "ready_and_claim", "delete_fired", "reset_stuck", "next_deadline"):
        assert can("pyscheduler_relay", fn)
        assert fn == "next_deadline" or not can("pyscheduler_worker", fn)
    assert can("pyscheduler_client", "cancel_message") and can("pyscheduler_client", "next_deadline")
    assert not can("pyscheduler_client", "ready_and_claim") and not can("pyscheduler_client", "enqueue_messages")
    assert not can("public", "enqueue_message")
    assert tx.execute("SELECT has_table_privilege('pyscheduler_client', 'pyscheduler.delay_queue', 'SELECT') AS ok"
                        ).fetchone()["ok"]


# -- issue 11: the clock, deadline range, batch boundaries, who may cancel -------

DELAY_FUNCTIONS = ("enqueue_message", "enqueue_messages", "ready_and_claim", "delete_fired", "reset_stuck",
                   "next_deadline", "cancel_message")
AUDIENCES = ("client", "worker", "relay", "scheduler", "checker", "monitor", "admin")


def as_role(conn, audience: str, statement: str, params=()):
    """Run statement as the audience's group role; returns rows or the psycopg error."""
    with conn.transaction(force_rollback=True):
        conn.execute(f'SET LOCAL ROLE "pyscheduler_{audience}"')
        try:
            with conn.transaction():
                return conn.execute(statement, params).fetchall()
        except psycopg.Error as exc:
            return exc


def test_no_public_delay_function_takes_a_clock_and_the_clocked_ones_are_granted_to_no_role(tx):
    args = tx.execute(
        "SELECT p.proname, coalesce(p.proargnames, '{}') AS names FROM pg_proc p "
        "WHERE p.pronamespace = 'pyscheduler'::regnamespace AND p.proname = ANY(%s)", (list(DELAY_FUNCTIONS),)
    ).fetchall()
    assert {a["proname"] for a in args} == set(DELAY_FUNCTIONS)
    for a in args:
        assert not {"now", "p_now"} & set(a["names"]), a
    for private in ("_enqueue_messages", "_ready_and_claim", "_reset_stuck"):
        for audience in AUDIENCES:
            assert not tx.execute(
                "SELECT bool_or(has_function_privilege(%s, p.oid, 'EXECUTE')) AS ok FROM pg_proc p "
                "WHERE p.pronamespace = 'pyscheduler'::regnamespace AND p.proname = %s",
                (f"pyscheduler_{audience}", private)).fetchone()["ok"], (private, audience)
    # the relay's old way of parking a message forever no longer exists ...
    err = as_role(tx, "relay", "SELECT * FROM pyscheduler.ready_and_claim(node => gen_random_uuid(), "
                                 "now => 'infinity')")
    assert isinstance(err, psycopg.errors.UndefinedFunction)
    err = as_role(tx, "relay", "SELECT * FROM pyscheduler._ready_and_claim(node => gen_random_uuid(), "
                                 "p_now => 'infinity')")
    assert isinstance(err, psycopg.errors.InsufficientPrivilege)


def test_the_relay_cannot_claim_future_messages_through_a_huge_timing_advance(tx):
    tx.call_value("enqueue_message", id="next-year", deadline=datetime.now(timezone.utc) + timedelta(days=365))
    err = as_role(tx, "relay", "SELECT * FROM pyscheduler.ready_and_claim(node => gen_random_uuid(), "
                                 "advance => '400 days')")
    assert isinstance(err, psycopg.Error) and err.sqlstate == "PS105"
    err = as_role(tx, "relay", "SELECT * FROM pyscheduler.enqueue_message(id => 'x', deadline => now(), "
                                 "advance => '2 minutes')")
    assert isinstance(err, psycopg.Error) and err.sqlstate == "PS105"
    assert as_role(tx, "relay", "SELECT * FROM pyscheduler.ready_and_claim(node => gen_random_uuid(), "
                                  "advance => '1 minute')") == []


@pytest.mark.parametrize("deadline", [
    "0001-01-01T00:00:00+01:00",           # .NET DateTime.MinValue with an offset: a BC timestamp in UTC
    "9999-12-31T23:59:59.999999-05:00",    # year 10000 in UTC: no client library loads it
    "1969-12-31T23:59:59Z", "infinity", "-infinity",
])
def test_deadlines_outside_the_supported_range_are_refused_with_ps106(tx, deadline):
    for store_late in (False, True):
        with pytest.raises(errors.InvalidMessage) as info:
            tx.call("enqueue_messages", ids=["ok", "bad"], deadlines=[T0.isoformat(), deadline], store_late=store_late)
        assert info.value.sqlstate == "PS106" and "bad" in str(info.value)
        assert errors.rejects_arguments(info.value)  # bad data, never an outage
    with pytest.raises(psycopg.errors.CheckViolation):  # the table's CHECK, whoever writes
        tx.execute("INSERT INTO pyscheduler.delay_messages (id, deadline) VALUES ('direct', %s)", (deadline,))
    assert rows(tx) == []


def test_deadlines_at_the_ends_of_the_range_are_stored_and_load(tx):
    out = tx.call("enqueue_messages", ids=["first", "last"],
                  deadlines=["1970-01-01T00:00:00Z", "9998-12-31T23:59:59.999999Z"], store_late=True)
    assert [r["outcome"] for r in out] == ["enqueued", "enqueued"]
    assert tx.call_value("next_deadline") == datetime(1970, 1, 1, tzinfo=timezone.utc)
    assert tx.call("_ready_and_claim", node=uuid.uuid4(), p_now=datetime(9999, 1, 1, tzinfo=timezone.utc))[-1][
        "deadline"] == datetime(9998, 12, 31, 23, 59, 59, 999999, tzinfo=timezone.utc)


@pytest.mark.parametrize("sequence", [("late", "future"), ("future", "late"), ("late", "late"),
                                      ("future", "future"), ("late", "future", "late", "future")])
def test_the_outcome_of_repeated_ids_does_not_depend_on_batch_boundaries(tx, sequence):
    """The rule: in input order, an id waiting or ready is a duplicate; a late one is fired
    and forgotten, so the next occurrence is judged afresh."""
    deadline = {"late": T0 - S, "future": T0 + 10 * S}
    tag = "-".join(sequence)
    one_batch = [r["outcome"] for r in tx.call("_enqueue_messages", ids=[f"one-{tag}"] * len(sequence),
                                               deadlines=[deadline[k] for k in sequence], p_now=T0)]
    separate = [enqueue(tx, f"sep-{tag}", deadline[k]) for k in sequence]
    assert one_batch == separate
    first_future = sequence.index("future") if "future" in sequence else len(sequence)
    assert one_batch == ["late"] * first_future + ["enqueued"] * (first_future < len(sequence)) + [
        "duplicate"] * (len(sequence) - first_future - 1)


def test_any_client_may_cancel_any_waiting_message_and_no_daemon_role_may(tx):
    """Decision (docs/sql-api.md, Delay queue): cancelling is the application's, by id."""
    enqueue(tx, "someone-elses", T0 + 9 * S)
    for audience in ("worker", "relay", "scheduler", "checker", "monitor"):
        err = as_role(tx, audience, "SELECT pyscheduler.cancel_message(id => 'someone-elses')")
        assert isinstance(err, psycopg.errors.InsufficientPrivilege), audience
    assert as_role(tx, "client", "SELECT pyscheduler.cancel_message(id => 'someone-elses') AS ok") == [
        {"ok": True}]


def test_a_queue_analyzed_empty_is_still_read_through_its_indexes(dsn, db):
    """Autovacuum often analyzes the queue when it is empty (everything fired); planned with
    those statistics, "the earliest waiting deadlines" became a sequential scan and a sort
    whose cost grows with the backlog (the relay bench's collapse). Every function that
    reads the table still uses an index, whatever the statistics say."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("VACUUM ANALYZE pyscheduler.delay_messages")  # analyzed empty
        assert c.execute("SELECT reltuples FROM pg_class WHERE oid = 'pyscheduler.delay_messages'::regclass"
                         ).fetchone()[0] <= 0
    now = datetime.now(timezone.utc)
    n = 5000
    db.call("enqueue_messages", ids=[f"b{i}" for i in range(n)],
            deadlines=[now + timedelta(seconds=10 + i / 1000) for i in range(n)], advance=timedelta(0))
    node = uuid.uuid4()
    with psycopg.connect(dsn) as c:  # one transaction: pg_stat_xact_user_tables counts its scans
        c.execute("SELECT * FROM pyscheduler._enqueue_messages(ARRAY['x'], ARRAY[%s::timestamptz], "
                  "p_now => %s)", (now + timedelta(seconds=60), now))
        claimed = c.execute("SELECT id FROM pyscheduler._ready_and_claim(%s, interval '0', 100, %s)",
                            (node, now + timedelta(seconds=10.05))).fetchall()
        c.execute("SELECT * FROM pyscheduler.delete_fired(%s, %s)", ([r[0] for r in claimed], node))
        c.execute("SELECT * FROM pyscheduler._reset_stuck(p_now => %s)", (now,))
        c.execute("SELECT pyscheduler.next_deadline(), pyscheduler.cancel_message('b4999')")
        seq, idx = c.execute("SELECT seq_scan, idx_scan FROM pg_stat_xact_user_tables "
                             "WHERE relid = 'pyscheduler.delay_messages'::regclass").fetchone()
        c.commit()
    assert len(claimed) == 51  # b0 .. b50 due 10.05 s on
    assert seq == 0 and idx > 0, (seq, idx)
