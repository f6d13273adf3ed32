"""``pyscheduler bench schedules``: firings/s and lateness of recurring schedules.

Scenarios (``--scenario``, all by default), each on schedules of its own (deleted afterwards)
and a Redis key prefix of its own: ``claim`` (the Lua claim alone, then claim + settle),
``redis`` (N schedules due at once, fired by ``--executors`` executor processes for
``--seconds``, counted end to end on the Kafka topic), ``postgres`` (the same, critical and
with Redis unreachable: degraded mode), ``steady`` (``--stored`` schedules, ``--due-per-s``
due each second). The schedules are armed by writing their due times in PostgreSQL and the
index directly. How to read the figures: docs/benchmarks.md, "Recurring schedules".
"""

from __future__ import annotations

import os
import re
from datetime import datetime, timedelta, timezone
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack

import click
import redis

from ..config import bootstrap_option, dsn_option, redis_option
from ..db import Database
from ..delay.output import OutputReader
from ..redisconn import connect, is_cluster_url
from ..schedules import sqlapi as sql
from . import sqlapi as bench_sql
from ..schedules.index import Shards
from ..schedules.targets import KAFKA_EXPECTED_HEADER, KAFKA_KEY_HEADER
from .stats import children, command_line, find, parent, percentiles, process_cpu

TARGETS = {"redis": 25_000, "postgres": 5_000, "steady_p99_ms": 50.0}


def create_bulk(db: Database, prefix: str, n: int, every_s: float, topic: str, critical: bool,
                chunk: int = 100_000) -> list[int]:
    """n Kafka schedules: the first through create_schedule (validated), the rest cloned
    from its row with one INSERT ... SELECT per chunk (bench.sqlapi.CLONE_SCHEDULES). Their ids."""
    first = db.call_value(sql.CREATE_SCHEDULE, name=f"{prefix}0", every=timedelta(seconds=every_s),
                          target_kind="kafka", target=topic, critical=critical, retry_attempts=0,
                          start_at=datetime.now(timezone.utc) + timedelta(days=1))
    ids = [first["id"]]
    with db.connection() as conn:
        for start in range(1, n, chunk):
            last = min(n, start + chunk) - 1
            rows = conn.execute(bench_sql.CLONE_SCHEDULES, (prefix, start, last, first["id"])).fetchall()
            ids += [r["id"] for r in rows]
        conn.execute("ANALYZE pyscheduler.schedules")  # a utility statement: not a Query (no PREPARE)
    return ids


def arm(db: Database, index: Shards | None, ids: list[int], first_ms: int | None, spread_s: float) -> None:
    """Make schedule i due at first + (i mod spread) seconds, in PostgreSQL and in the index
    (first_ms None: index the next runs PostgreSQL has)."""
    with db.connection() as conn:
        if first_ms is not None:
            conn.execute(bench_sql.ARM_SCHEDULES, (first_ms, len(ids), spread_s, len(ids), ids))
        rows = conn.execute(bench_sql.SCHEDULE_DUE, (ids,)).fetchall()
    if index is not None:
        for k, part in index.split(rows, key=lambda r: r["id"]).items():
            shard = index.shards[k]
            shard.r.delete(shard.k_index, shard.k_claims, shard.k_last, shard.k_ver)  # one slot
            for i in range(0, len(part), 10000):
                shard.r.zadd(shard.k_index, {str(r["id"]): round(r["next_run_at"].timestamp() * 1000)
                                             for r in part[i:i + 10000]})
        for shard in index.shards:
            shard.r.set(shard.k_marker, "bench")


def drop(db: Database, prefix: str) -> None:
    with db.connection() as conn:
        # executions first: they have no foreign key (delete_schedule deletes them one schedule at a time)
        conn.execute(bench_sql.DROP_EXECUTIONS, (prefix + "%",))
        conn.execute(bench_sql.DROP_SCHEDULES, (prefix + "%",))


def executor_processes(dsn: str, redis_url: str, bootstrap: str, prefix: str, n: int, logdir: str,
                       batch: int, shards: int = 0) -> list[subprocess.Popen]:
    procs = []
    for k in range(n):
        out = open(os.path.join(logdir, f"executor-{k}.log"), "wb")
        profile = os.environ.get("PYSCHEDULER_BENCH_PROFILE")  # a directory: cProfile each executor there
        main = ["-m", "pyscheduler.bench.schedules_profile", os.path.join(profile, f"executor-{k}.prof")] if profile \
            else ["-m", "pyscheduler.schedules"]
        procs.append(subprocess.Popen(
            [sys.executable, *main, "run", "--dsn", dsn, "--redis-url", redis_url,
             "--bootstrap-servers", bootstrap, "--prefix", prefix, "--batch", str(batch), "--executors", "1",
             "--cleanup-s", "3600", "--relay", "0", "--shards", str(shards)],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYSCHEDULER_LOG_LEVEL": "INFO"}))
    for k, p in enumerate(procs):  # started (imports done, connected) before the schedules are armed
        log = os.path.join(logdir, f"executor-{k}.log")
        end = time.monotonic() + 60
        while "starting" not in open(log).read():
            if p.poll() is not None or time.monotonic() > end:
                raise click.ClickException(f"executor {k} did not start:\n{open(log).read()[-2000:]}")
            time.sleep(0.05)
    return procs


def read_fires(bootstrap: str, topic: str, timeout: float) -> list[tuple[float, int, bytes]]:
    """(message time ms, expected ms, idempotency key) of every message on the topic (a fresh read)."""
    reader = OutputReader(bootstrap, topic)
    out: list[tuple[float, int, bytes]] = []
    idle_until = time.monotonic() + timeout
    while time.monotonic() < idle_until:
        batch = reader.consumer.consume(10000, 0.5)
        for m in batch:
            if m.error() is None:
                headers = dict(m.headers())
                out.append((m.timestamp()[1], int(headers[KAFKA_EXPECTED_HEADER]), headers[KAFKA_KEY_HEADER]))
        if batch:
            idle_until = time.monotonic() + 2.0
    reader.close()
    return out


class CpuMeter:
    """CPU seconds per component over the firing window, robust to a shared machine's load
    (CPU time, not wall time): the executor processes; PostgreSQL: the backends and
    autovacuum workers of the bench's database (their process titles name it) apart from
    the server's shared processes (checkpointer, WAL writer, ...: another database of the
    same server, e.g. the other side of an A/B run, adds its share there); Redis (INFO
    used_cpu_*); the Kafka broker (the process whose command line holds the bootstrap
    address)."""

    def __init__(self, db: Database, redis_url: str, bootstrap: str, executors: list[int]):
        me = db.query(bench_sql.BACKEND)[0]
        backend, self.database = me["pid"], me["db"]
        self.postmaster = parent(backend)
        # every node of a cluster (masters and replicas: replication is part of the cost)
        if is_cluster_url(redis_url):
            cluster = connect(redis_url)
            self.redis = [redis.Redis(host=n.host, port=n.port) for n in cluster.get_nodes()]
            cluster.close()
        else:
            self.redis = [redis.Redis.from_url(redis_url)]
        self.broker = [p for p in find(bootstrap) if p not in executors and p != os.getpid()]
        self.executors = executors

    def sample(self) -> dict[str, float]:
        infos = [r.info("cpu") for r in self.redis]
        mine = shared = 0.0
        for p in children(self.postmaster):
            args = command_line(p)
            if args is None:
                continue
            title = " ".join(args).strip()
            if re.search(rf"(^|\s){re.escape(self.database)}(\s|$)", title):
                mine += process_cpu(p)
            elif not ("autovacuum worker " in title or "(" in title or "[local]" in title):
                shared += process_cpu(p)  # checkpointer, WAL writer, ... (not other databases' sessions)
        return {"executors": sum(process_cpu(p) for p in self.executors), "postgres": mine,
                "postgres shared": shared,
                "redis": sum(float(i["used_cpu_user"]) + float(i["used_cpu_sys"]) for i in infos),
                "kafka": sum(process_cpu(p) for p in self.broker)}


def fire_run(echo, db: Database, dsn: str, redis_url: str, bootstrap: str, n: int, every_s: float,
             spread_s: float, seconds: float, executors: int, batch: int, degraded: bool, shards: int = 0) -> dict:
    from ..embedded import create_topics

    tag = uuid.uuid4().hex[:6]
    name_prefix, key_prefix, topic = f"bench-{tag}-", f"pyscheduler:bench:{tag}", f"bench.schedules.{tag}"
    create_topics(bootstrap, [topic])
    started = time.perf_counter()
    ids = create_bulk(db, name_prefix, n, every_s, topic, critical=degraded)
    echo(f"  created {n} schedules in {time.perf_counter() - started:.1f}s")
    index = None if degraded else Shards.from_url(redis_url, key_prefix, shards)
    target_redis = "redis://127.0.0.1:1/0" if degraded else redis_url
    arm(db, index, ids, None, spread_s)  # indexed, due in a day (start_at)
    with tempfile.TemporaryDirectory() as logdir, ExitStack() as stack:
        procs = executor_processes(dsn, target_redis, bootstrap, key_prefix, executors, logdir, batch, shards)
        stack.callback(lambda: [p.terminate() for p in procs] and [p.wait(30) for p in procs])
        time.sleep(1.0)  # connections and producers up
        first_ms = int(time.time() * 1000 + 1000 * (2.0 + n / 10_000))  # in the future once armed
        arm(db, index, ids, first_ms, spread_s)
        start_ms = max(first_ms, int(time.time() * 1000))  # the window starts once all is armed
        meter = CpuMeter(db, redis_url, bootstrap, [p.pid for p in procs])
        load = os.getloadavg()[0]
        time.sleep(max(0.0, (start_ms - time.time() * 1000) / 1000))
        cpu0 = meter.sample()
        if start_ms > first_ms:
            echo(f"  (arming ended {start_ms - first_ms} ms after the first due time; the window starts then)")
        end_ms = start_ms + int(seconds * 1000)
        time.sleep(max(0.0, (end_ms - time.time() * 1000) / 1000))
        cpu1 = meter.sample()
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(60)
        fires = read_fires(bootstrap, topic, 10)
    drop(db, name_prefix)
    if index is not None:
        for shard in index.shards:
            shard.r.delete(shard.k_index, shard.k_claims, shard.k_last, shard.k_ver, shard.k_marker)
        index.close()
    window = [(t, e) for t, e, _ in fires if start_ms <= t <= end_ms]
    if not window:
        return {"fired": 0}
    first_t, last_t = min(t for t, _ in window), max(t for t, _ in window)
    late = [t - e for t, e in window if e >= start_ms] or [t - e for t, e in window]  # not the arming backlog
    distinct = len({k for _, _, k in fires})
    cpu_us = {k: (cpu1[k] - cpu0[k]) * 1e6 / len(window) for k in cpu0}
    return {"fired": len(window), "cpu_us": cpu_us, "load": load,
            "per_s": len(window) / max(1e-3, (end_ms - start_ms) / 1000),
            "first_ms": first_t - first_ms, "last_ms": last_t - first_ms, "messages": len(fires),
            "distinct": distinct, "lateness": percentiles(late)}


def claim_rate(echo, redis_url: str, n: int, batch: int) -> None:
    """On a cluster: one shard (one slot, one master)."""
    cluster = is_cluster_url(redis_url)
    index = Shards.from_url(redis_url, f"pyscheduler:bench:{uuid.uuid4().hex[:6]}", 1 if cluster else 0).shards[0]
    sec, usec = index.r.time() if not cluster else index.r.time(target_nodes=index.r.get_node_from_key(index.k_index))
    now = sec * 1000 + usec // 1000 - 1000

    def load() -> None:
        pipe = index.r.pipeline(transaction=False)
        for i in range(0, n, 10000):
            pipe.zadd(index.k_index, {str(j): now - j % 1000 for j in range(i, min(n, i + 10000))})
        pipe.execute()

    load()
    node = index.r if not cluster else redis.Redis(host=index.r.get_node_from_key(index.k_index).host,
                                                   port=index.r.get_node_from_key(index.k_index).port)
    node.config_resetstat()
    started = time.perf_counter()
    claimed = calls = 0
    while (res := index.claim(batch)).claimed:
        claimed += len(res.claimed)
        calls += 1
    took = time.perf_counter() - started
    server = node.info("commandstats").get("cmdstat_evalsha", {}).get("usec", 0) / 1e6
    echo(f"  Lua claim alone: {claimed} members in {took:.2f}s = {claimed / took:,.0f} members/s (batch {batch}); "
         f"inside Redis {server:.2f}s = {claimed / max(server, 1e-9):,.0f} members/s")
    index.r.delete(index.k_index, index.k_claims, index.k_last)
    load()
    started = time.perf_counter()
    claimed = 0
    while (res := index.claim(batch)).claimed:
        claimed += len(res.claimed)
        index.settle([(c.id, c.expected_ms, c.expected_ms + 3_600_000) for c in res.claimed])
    took = time.perf_counter() - started
    echo(f"  claim + settle: {claimed} in {took:.2f}s = {claimed / took:,.0f} members/s")
    index.r.delete(index.k_index, index.k_claims, index.k_last)


def _report(echo, what: str, res: dict, target: float | None = None) -> None:
    if not res.get("fired"):
        echo(f"  {what}: nothing fired")
        return
    lat = ", ".join(f"{k} {v:.0f}" for k, v in res["lateness"].items())
    echo(f"  {what}: {res['fired']} firings in the window = {res['per_s']:,.0f}/s"
         + (f" (target >= {target:,.0f}/s)" if target else "")
         + f"; lateness ms: {lat}; first fire +{res['first_ms']:.0f} ms; "
           f"{res['messages']} messages, {res['distinct']} distinct occurrences")
    cpu = res["cpu_us"]
    echo("  CPU per firing (us): " + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items())
         + f", total {sum(cpu.values()):.1f}; load average {res['load']:.2f} at the start")


@click.command("schedules")
@dsn_option
@redis_option
@bootstrap_option
@click.option("--scenario", type=click.Choice(["all", "claim", "redis", "postgres", "steady"]), default="all",
              show_default=True)
@click.option("--schedules", "n", type=click.IntRange(1), default=100_000, show_default=True,
              help="Schedules due at once (claim, redis, postgres).")
@click.option("--seconds", type=float, default=10.0, show_default=True, help="Firing window of each run.")
@click.option("--executors", type=click.IntRange(1), default=2, show_default=True, help="Executor processes.")
@click.option("--batch", type=click.IntRange(1, 2000), default=1000, show_default=True)
@click.option("--stored", type=click.IntRange(1), default=1_000_000, show_default=True)
@click.option("--due-per-s", type=click.IntRange(1), default=1000, show_default=True)
@click.option("--shards", type=click.IntRange(0, sql.MAX_SHARDS), default=0, show_default=True,
              help="Index shards (0: 1 on a single node, 16 on redis+cluster://).")
def bench(dsn, redis_url, kafka_bootstrap, scenario, n, seconds, executors, batch, stored, due_per_s,
          shards) -> None:
    """Firings/s (Redis path, Postgres-only path), Lua claim rate, lateness percentiles."""
    from ..embedded import Stack
    from .. import migrate

    echo = click.echo
    with ExitStack() as stack:
        if not (dsn and redis_url and kafka_bootstrap):
            echo("starting embedded servers for what is not configured ...")
            st = Stack(dsn=dsn, kafka_bootstrap=kafka_bootstrap, redis_url=redis_url).start()
            stack.callback(st.stop)
            dsn, redis_url, kafka_bootstrap = st.dsn, st.redis_url, st.kafka_bootstrap
        migrate.migrate(dsn)
        db = stack.enter_context(Database(dsn, max_size=2))
        if scenario in ("all", "claim"):
            echo(f"claim: {n} members due in Redis")
            claim_rate(echo, redis_url, n, batch)
        if scenario in ("all", "redis"):
            echo(f"redis: {n} schedules every 1 s, all due at once, {executors} executor processes, {seconds:.0f}s")
            _report(echo, "via Redis", fire_run(echo, db, dsn, redis_url, kafka_bootstrap, n, 1.0, 0.0, seconds,
                                                executors, batch, degraded=False, shards=shards), TARGETS["redis"])
        if scenario in ("all", "postgres"):
            echo(f"postgres: {n} critical schedules every 1 s, all due at once, Redis unreachable")
            _report(echo, "Postgres-only", fire_run(echo, db, dsn, redis_url, kafka_bootstrap, n, 1.0, 0.0,
                                                    seconds, executors, batch, degraded=True), TARGETS["postgres"])
        if scenario in ("all", "steady"):
            every = stored / due_per_s
            echo(f"steady: {stored} schedules stored, every {every:.0f}s, {due_per_s} due per second")
            _report(echo, "steady", fire_run(echo, db, dsn, redis_url, kafka_bootstrap, stored, every, every,
                                             seconds, executors, batch, degraded=False, shards=shards))
