"""Delay queue: delay_queue counts from kept deltas (never the table), which equal a real
count after any mix of what changes them, also from concurrent writers; the views read only the
ready messages and the head of the waiting index; the claim keeps its plan."""

from __future__ import annotations

import random
import uuid
from datetime import datetime, timedelta, timezone

import psycopg
from psycopg.rows import dict_row

from tests.support.reads import concurrently, reads
from pyscheduler import migrate

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)
S = timedelta(seconds=1)


def real(conn) -> dict:
    counts = conn.execute("SELECT count(*) FILTER (WHERE readied_at IS NULL) AS waiting, "
                          "count(*) FILTER (WHERE readied_at IS NOT NULL) AS ready FROM pyscheduler.delay_messages"
                          ).fetchone()
    by_node = {r["readied_by"]: (r["n"], r["oldest"]) for r in conn.execute(
        "SELECT readied_by, count(*) AS n, min(readied_at) AS oldest FROM pyscheduler.delay_messages "
        "WHERE readied_at IS NOT NULL GROUP BY readied_by")}
    oldest = min((o for _, o in by_node.values()), default=None)
    return {**counts, "oldest": oldest, "by_node": by_node}


def shown(conn) -> dict:
    """delay_queue's counts and oldest ready message (as now() - its age), and
    delay_ready_by_node's rows, in one transaction (one now())."""
    with conn.transaction():
        row = conn.execute("SELECT waiting, ready, now() - oldest_ready_age AS oldest FROM pyscheduler.delay_queue"
                           ).fetchone()
        by_node = {r["node"]: (r["ready"], r["oldest_readied_at"])
                   for r in conn.execute("SELECT * FROM pyscheduler.delay_ready_by_node")}
    return {"waiting": row["waiting"], "ready": row["ready"], "oldest": row["oldest"], "by_node": by_node}


def counts(d: dict) -> dict:
    return {"waiting": d["waiting"], "ready": d["ready"]}


def enqueue(conn, ids, deadlines, now, store_late=False):
    return conn.execute("SELECT * FROM pyscheduler._enqueue_messages(ids => %s, deadlines => %s, "
                        "store_late => %s, p_now => %s)", (ids, deadlines, store_late, now)).fetchall()


def claim(conn, node, now, n, after=None):
    return conn.execute("SELECT id FROM pyscheduler._ready_and_claim(node => %s, max_count => %s, p_now => %s, "
                        "after => %s)", (node, n, now, after)).fetchall()


def test_counts_equal_a_real_count_after_a_random_mix_of_every_change(tx):
    rnd = random.Random(21)
    nodes = [uuid.uuid4() for _ in range(3)]
    ids = [f"m{i}" for i in range(400)]
    now, most_nodes = T0, 0
    for step in range(300):
        op = rnd.choice(["enqueue", "enqueue", "claim", "fire", "fire", "reset", "cancel", "fold"])
        now += S * rnd.random()
        if op == "enqueue":  # duplicates, late ones (not stored), stored late ones, repeats within a batch
            batch = rnd.sample(ids, 20) + rnd.sample(ids, 3)
            deadlines = [now + S * rnd.uniform(-2, 30) for _ in batch]
            enqueue(tx, batch, deadlines, now, store_late=rnd.random() < 0.3)
        elif op == "claim":
            claim(tx, rnd.choice(nodes), now, rnd.randint(1, 40), after=now - 5 * S if rnd.random() < 0.3 else None)
        elif op == "fire":  # some by another node: not deleted
            ready = tx.execute("SELECT id, readied_by FROM pyscheduler.delay_messages WHERE readied_at IS NOT NULL"
                                 ).fetchall()
            pick = rnd.sample(ready, min(len(ready), rnd.randint(0, 30)))
            tx.execute("SELECT * FROM pyscheduler.delete_fired(ids => %s, node => %s)",
                         ([r["id"] for r in pick] + ["absent"], rnd.choice(nodes + [None])))
        elif op == "reset":
            tx.execute("SELECT * FROM pyscheduler._reset_stuck(hold => '2 seconds', max_count => 50, p_now => %s)",
                         (now,))
        elif op == "cancel":
            tx.execute("SELECT pyscheduler.cancel_message(id => %s)", (rnd.choice(ids),))
        else:
            tx.execute("SELECT pyscheduler._delay_fold_counts()")
        if step % 25 == 0:
            assert shown(tx) == real(tx), (step, op)
            most_nodes = max(most_nodes, len(real(tx)["by_node"]))
    assert shown(tx) == real(tx)
    assert most_nodes > 1  # ready messages of several nodes were compared
    tx.execute("TRUNCATE pyscheduler.delay_messages")
    assert counts(shown(tx)) == counts(real(tx)) == {"waiting": 0, "ready": 0}
    assert shown(tx)["by_node"] == {}


def test_counts_stay_right_with_concurrent_writers_and_folds(dsn, conn):
    """Deltas are appended and folded with SKIP LOCKED: writers never wait for each other, and no
    delta is lost or counted twice, whatever commits or rolls back when."""
    def writer(k: int) -> None:
        rnd = random.Random(k)
        node = uuid.uuid4()
        with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as c:
            for i in range(60):
                with c.transaction(force_rollback=rnd.random() < 0.2):
                    batch = [f"w{k}-{i}-{j}" for j in range(10)]
                    enqueue(c, batch, [T0 - S] * 10, T0 - 2 * S)
                    got = claim(c, node, T0, 5)
                    c.execute("SELECT * FROM pyscheduler.delete_fired(ids => %s, node => %s)",
                              ([r["id"] for r in got], node))
                    c.execute("SELECT pyscheduler.cancel_message(id => %s)", (batch[-1],))
                    if rnd.random() < 0.5:
                        c.execute("SELECT pyscheduler._delay_fold_counts()")

    concurrently(writer)
    assert shown(conn) == real(conn)
    assert real(conn)["waiting"] > 0


def test_the_views_read_the_counts_and_the_index_heads_not_the_table(conn):
    """The ready messages are counted per claim: the views read no entry of the ready index,
    whose pages keep the entries of fired messages until a vacuum of the whole table."""
    n = 3000
    enqueue(conn, [f"w{i}" for i in range(n)], [T0 + i * S for i in range(n)], T0 - S)
    node, other = uuid.uuid4(), uuid.uuid4()
    fired = claim(conn, other, T0 + 1000 * S, 1000)  # 1,000 claimed and fired: dead entries in the ready index
    conn.execute("SELECT * FROM pyscheduler.delete_fired(ids => %s, node => %s)", ([m["id"] for m in fired], other))
    claim(conn, node, T0 + 1004 * S, 5)  # five ready, the rest waiting
    conn.execute("ANALYZE pyscheduler.delay_messages")
    rows, r = reads(conn, "SELECT * FROM pyscheduler.delay_queue", tables=("delay_messages",))
    assert (rows[0]["waiting"], rows[0]["ready"]) == (n - 1005, 5)
    assert r.seq_scans("delay_messages") == 0
    assert r.entries("delay_messages_ready_idx") == 0
    assert r.entries("delay_messages_waiting_idx") <= 10  # the next deadline; none overdue (the clock is 2026)
    rows, r = reads(conn, "SELECT * FROM pyscheduler.delay_ready_by_node", tables=("delay_messages",))
    assert [(x["node"], x["ready"]) for x in rows] == [(node, 5)]
    assert r.seq_scans("delay_messages") == 0 and sum(r.returned.values()) == 0


def test_overdue_is_counted_up_to_ten_thousand(tx):
    past = datetime.now(timezone.utc) - timedelta(hours=1)
    enqueue(tx, [f"o{i}" for i in range(50)], [past] * 50, past - S)
    assert tx.execute("SELECT overdue FROM pyscheduler.delay_queue").fetchone()["overdue"] == 50
    enqueue(tx, [f"p{i}" for i in range(10_100)], [past] * 10_100, past - S)
    rows, r = reads(tx, "SELECT * FROM pyscheduler.delay_queue", tables=("delay_messages",))
    assert rows[0]["overdue"] == 10_000 and rows[0]["waiting"] == 10_150
    assert r.seq_scans("delay_messages") == 0 and r.entries("delay_messages_waiting_idx") <= 10_001 + 1


def test_migrate_counts_a_queue_whose_rows_were_written_without_counts(dsn, conn):
    """A database from before migration 0018 (or written by hand): the post-apply step counts it
    once, under a lock, in the transaction that loads the functions that keep the counts."""
    conn.execute("INSERT INTO pyscheduler.delay_messages (id, deadline) SELECT 'h' || i, %s "
                 "FROM generate_series(1, 70) i", (T0,))
    conn.execute("UPDATE pyscheduler.delay_messages SET readied_at = now(), readied_by = gen_random_uuid() "
                 "WHERE id IN ('h1', 'h2')")
    assert counts(shown(conn)) == {"waiting": 0, "ready": 0}  # neither the INSERT nor the UPDATE was counted
    conn.execute("DELETE FROM pyscheduler.settings WHERE name = 'delay_counted'")
    migrate.migrate(dsn)
    assert shown(conn) == real(conn)
    assert counts(real(conn)) == {"waiting": 68, "ready": 2} and len(real(conn)["by_node"]) == 2
    migrate.migrate(dsn)  # counted once: a second migrate does not count again
    assert conn.execute("SELECT count(*) AS n FROM pyscheduler.settings WHERE name = 'delay_counted'"
                        ).fetchone()["n"] == 1


def test_the_claim_keeps_its_plan_whatever_the_session_prefers(conn):
    """ready_and_claim reads the waiting index in deadline order and stops at max_count, even in a
    session that disables index scans (the plan is pinned on the function)."""
    n = 4000
    enqueue(conn, [f"c{i}" for i in range(n)], [T0 + (i % 50) * S for i in range(n)], T0 - S)
    conn.execute("ANALYZE pyscheduler.delay_messages")
    conn.execute("SET enable_indexscan = off")
    rows, r = reads(conn, "SELECT id FROM pyscheduler._ready_and_claim(node => gen_random_uuid(), max_count => 100, "
                          "p_now => %s)", (T0 + 60 * S,), tables=("delay_messages",))
    assert len(rows) == 100
    assert r.seq_scans("delay_messages") == 0
    assert r.entries("delay_messages_waiting_idx") <= 110


def test_a_claim_keeps_each_message_on_its_page(tx):
    """delay_messages keeps a tenth of each page free (fillfactor 90), so a claim's new version of
    a message (readied_at, readied_by) is written on the page of the old one when the claim takes
    a few messages of a page (deadlines fire in another order than they were stored): no other
    page is dirtied, and no one-row hole is left elsewhere for enqueues to fill."""
    ids = [f"m{i:05d}" for i in range(3000)]
    tx.execute("SELECT count(*) FROM pyscheduler._enqueue_messages(ids => %s, deadlines => %s, "
                 "vals => array_fill(convert_to(repeat('v', 200), 'UTF8'), ARRAY[3000]), p_now => %s)",
                 (ids, [T0 if i % 15 == 0 else T0 + timedelta(days=1) for i in range(3000)], T0 - 60 * S))
    page = "SELECT id, (ctid::text::point)[0]::int AS page FROM pyscheduler.delay_messages"
    before = {r["id"]: r["page"] for r in tx.execute(page).fetchall()}
    assert len(set(before.values())) > 80  # about 27 messages a page
    claimed = sorted(r["id"] for r in claim(tx, uuid.uuid4(), T0 + 10 * S, 3000))
    assert claimed == ids[::15]
    after = {r["id"]: r["page"] for r in tx.execute(page).fetchall()}
    moved = [i for i in claimed if after[i] != before[i]]
    assert not moved, f"{len(moved)} of {len(claimed)} claimed messages moved to another page"


def test_the_enqueue_keeps_index_plans_made_on_an_empty_table(conn, dsn):
    """_enqueue_messages keeps its generic plans (plan_cache_mode, issue 31). Made while
    delay_messages is empty and analysed, they still read only index entries once 20,000 messages
    wait (no ANALYZE since): the head of the waiting index, and the batch's own ids."""
    with psycopg.connect(dsn, autocommit=True) as other:
        other.execute("ALTER TABLE pyscheduler.delay_messages SET (autovacuum_enabled = false)")
        other.execute("ANALYZE pyscheduler.delay_messages")
    batch = "SELECT * FROM pyscheduler.enqueue_messages(ids => %s, deadlines => %s, header_lists => %s)"
    one = "SELECT pyscheduler.enqueue_message(id => %s, deadline => %s, value => 'v')"
    far = datetime(2090, 1, 1, tzinfo=timezone.utc)
    for i in range(8):  # past the plan cache's five custom plans, on the empty table
        conn.execute(batch, ([f"w{i}-{k}" for k in range(3)], [far] * 3, ['[{"a": "b"}]'] * 3)).fetchall()
        conn.execute(one, (f"w{i}", far)).fetchall()
        conn.execute("DELETE FROM pyscheduler.delay_messages")
    with psycopg.connect(dsn, autocommit=True) as other:
        enqueue(other, [f"f{i}" for i in range(20_000)], [far + i * S for i in range(20_000)],
                datetime.now(timezone.utc))
    rows, batch_read = reads(conn, batch, ([f"b{k}" for k in range(10)], [far - S] * 10, ['[{"a": "b"}]'] * 10),
                             tables=("delay_messages",))
    assert [r["outcome"] for r in rows] == ["enqueued"] * 10
    (row,), one_read = reads(conn, one, ("o1", far - S), tables=("delay_messages",))
    assert row["enqueue_message"] == "enqueued"
    for read in (batch_read, one_read):
        assert read.seq_scans("delay_messages") == 0
        assert sum(read.returned.values()) <= 30, read.returned
