"""Schedule daemons end to end: real PostgreSQL, Redis, Kafka-protocol broker and a local
HTTP server. Racing executors, kill -9 after a claim, FLUSHALL, Redis stopped,
retries, idempotency keys, overlap with a slow task, catch-up, the CLI."""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest
import redis
from click.testing import CliRunner

from pyscheduler import embedded
from pyscheduler.cli import main
from pyscheduler.delay.output import OutputReader
from prometheus_client import CollectorRegistry
from pyscheduler.metrics import process_registry
from pyscheduler.schedules.executor import Executor
from pyscheduler.schedules.index import Index, idempotency_key, to_ms
from pyscheduler.schedules.targets import KAFKA_KEY_HEADER
from pyscheduler.tasks.worker import Worker

from tests.support import wait_for
from tests.support.schedules import (Receiver, Running, allow_loopback, count, create, executions, executor,
                                     executor_process, relay)

pytestmark = pytest.mark.slow  # every test here: daemons, processes or servers of its own, on the real clock

PREFIX = "t:schedules"


@pytest.fixture
def receiver(db):
    allow_loopback(db)
    r = Receiver()
    yield r
    r.close()


# the executor's series, as a process that runs one exports them (pyscheduler.metrics)
REGISTRY = process_registry([Executor], registry=CollectorRegistry())


def degraded() -> float:
    return REGISTRY.get_sample_value("pyscheduler_schedules_degraded")


def index_of(redis_url: str) -> Index:
    return Index(redis.Redis.from_url(redis_url), PREFIX)


def kafka_keys(kafka: str, topic: str, expect: int, timeout: float = 20) -> list[str]:
    """Idempotency keys of the messages on ``topic`` (a fresh read), once ``expect`` arrived."""
    reader = OutputReader(kafka, topic)
    try:
        return [dict(m.headers())[KAFKA_KEY_HEADER].decode() for m in reader.messages(expect, timeout)] + [
            dict(m.headers())[KAFKA_KEY_HEADER].decode() for m in reader.messages(10_000, 1.0)]
    finally:
        reader.close()


def test_two_executors_racing_never_fire_an_occurrence_twice(db, dsn, redis_url, kafka, topic):
    out = topic("sched")
    for i in range(150):
        create(db, f"race-{i}", every=1, target_kind="kafka", target=out, payload={"i": i})
    # small batches: the two executors interleave their claims on every wave
    with Running(relay(dsn, redis_url), executor(dsn, redis_url, kafka, batch=7),
                 executor(dsn, redis_url, kafka, batch=7)) as running:
        wait_for(lambda: db.query("SELECT count(*) AS n FROM pyscheduler.schedule_executions")[0]["n"] >= 450,
                 60, "three waves of 150 firings")
        ex1, ex2 = running.daemons[1], running.daemons[2]
    assert ex1.counts["fired"] > 0 and ex2.counts["fired"] > 0  # both took part
    assert ex1.counts["prefetched"] + ex2.counts["prefetched"] > 0  # claims made while a batch was fired
    rows = db.query("SELECT schedule_id, expected_at, outcome FROM pyscheduler.schedule_executions")
    keys = kafka_keys(kafka, out, len(rows))
    assert len(keys) == len(set(keys)), "an occurrence was fired twice"
    assert {idempotency_key(r["schedule_id"], to_ms(r["expected_at"])) for r in rows} == set(keys)
    assert all(r["outcome"] == "fired" for r in rows)
    assert ex1.counts["duplicates"] == ex2.counts["duplicates"] == 0


def test_executor_killed_after_claiming_fires_after_recovery_counted_once(db, dsn, redis_url, tmp_path):
    allow_loopback(db)
    hold = threading.Event()
    receiver = Receiver()
    original = receiver.server.RequestHandlerClass.do_POST

    def stall_first(handler):  # the first request hangs: the executor is killed while firing
        if not hold.is_set():
            hold.set()
            handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
            with receiver.lock:
                receiver.keys.append(handler.headers.get("Idempotency-Key"))
            time.sleep(30)
            return
        original(handler)

    receiver.server.RequestHandlerClass.do_POST = stall_first
    try:
        s = create(db, "killed", every=3600, soon=True, target_kind="http", target=receiver.url)
        proc = executor_process(dsn, redis_url, tmp_path / "ex.log", "--stuck-after-ms", "1500",
                                "--check-every-ms", "300")
        try:
            try:
                wait_for(hold.is_set, 40, "the executor to claim and fire")
            except TimeoutError:
                raise AssertionError((tmp_path / "ex.log").read_text()[-3000:]) from None
            proc.kill()  # SIGKILL: no settle, no record; its claim stays in Redis
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
        index = index_of(redis_url)
        assert index.stats()["claimed"] == 1
        assert count(db, "killed") == 0
        with Running(executor(dsn, redis_url)):
            wait_for(lambda: count(db, "killed") == 1, 30, "the recovered occurrence to be recorded")
            wait_for(lambda: index.stats()["claimed"] == 0, 10, "the claim to be settled")
        keys = receiver.received()
        assert len(keys) == 2 and keys[0] == keys[1]  # the crash duplicate carries the same key
        [row] = executions(db, "killed")
        assert keys[0] == idempotency_key(s["id"], to_ms(row["expected_at"]))
        assert index.members()[s["id"]] == to_ms(row["expected_at"]) + 3_600_000  # next hour, no drift
    finally:
        receiver.close()


def test_flushall_resyncs_critical_first_and_misses_nothing(db, dsn, redis_url, receiver):
    names = [f"crit-{i}" for i in range(30)] + [f"plain-{i}" for i in range(90)]
    for name in names:
        create(db, name, every=2, target_kind="http", target=receiver.url, critical=name.startswith("crit"))
    crit_ids = {r["id"] for r in db.query("SELECT id FROM pyscheduler.schedules WHERE critical")}
    index = index_of(redis_url)
    with Running(executor(dsn, redis_url, resync_batch=10)):
        wait_for(lambda: all(count(db, n) >= 1 for n in names[::10]), 30, "the first firings")
        # The claims held at the instant of the flush, read in the same transaction; flushed
        # between two firings of the 120 schedules (at most 10 in flight: WATCH makes the
        # transaction fail when a claim came or went after the count), so most of them are
        # resynced and their order means something.
        flushed: list = []

        def flush_between_firings() -> bool:
            with index.r.pipeline() as pipe:
                try:
                    pipe.watch(index.k_claims)
                    if pipe.zcard(index.k_claims) > 10:
                        return False
                    pipe.multi()
                    pipe.zrange(index.k_claims, 0, -1)
                    pipe.flushall()
                    flushed.append(pipe.execute()[0])
                    return True
                except redis.WatchError:
                    return False

        wait_for(flush_between_firings, 30, "a moment between firings", interval=0.001)
        in_flight = {int(m) for m in flushed[0]}
        seen: dict[int, int] = {}
        step = 0

        def refilled() -> bool:
            nonlocal step
            step += 1
            for member in index.members():
                seen.setdefault(member, step)
            return len(seen) == len(names)

        wait_for(refilled, 30, "the index to be refilled", interval=0.001)
        wait_for(lambda: index.marker() is not None, 30, "the resync to complete")
        before = {n: count(db, n) for n in names}
        wait_for(lambda: all(count(db, n) > before[n] for n in names), 30, "every schedule to fire after the resync")
    # An occurrence claimed before the flush is settled into the empty index by its
    # executor (from PostgreSQL's answer), ahead of the resync: it is not part of the
    # resync's order. Every other schedule comes back critical first.
    resynced_plain = [seen[i] for i in seen if i not in crit_ids and i not in in_flight]
    assert len(resynced_plain) >= 60  # most were not in flight: the order below means something
    assert max(seen[i] for i in crit_ids - in_flight) <= min(resynced_plain)
    outcomes = {r["outcome"] for r in db.query("SELECT outcome FROM pyscheduler.schedule_executions")}
    assert outcomes == {"fired"}  # nothing missed


def test_redis_stopped_critical_fire_from_postgres_others_resume_after(db, dsn, tmp_path, receiver, caplog):
    server = embedded.Redis(tmp_path / "redis").start()
    url = server.url
    crit = create(db, "crit", every=1, target_kind="http", target=receiver.url, critical=True)
    plain = create(db, "plain", every=1, target_kind="http", target=receiver.url)
    caplog.set_level(logging.WARNING, logger="pyscheduler.schedules")
    try:
        with Running(relay(dsn, url), executor(dsn, url)):
            wait_for(lambda: count(db, "crit") >= 1 and count(db, "plain") >= 1, 30, "both to fire")
            server.stop()  # by its PID
            wait_for(lambda: degraded() == 1, 20, "degraded mode")
            crit_then, plain_then = count(db, "crit"), count(db, "plain")
            wait_for(lambda: count(db, "crit") >= crit_then + 3, 30, "critical firings from PostgreSQL")
            assert count(db, "plain") <= plain_then + 1  # at most one in flight when Redis went away
            plain_down = count(db, "plain")
            server = embedded.Redis(tmp_path / "redis2", port=server.port).start()
            wait_for(lambda: degraded() == 0, 30, "leaving degraded mode")
            wait_for(lambda: count(db, "plain") >= plain_down + 2, 30, "the others to resume")
    finally:
        server.stop()
    down = [r for r in caplog.records if "degraded mode, critical" in r.getMessage()]
    back = [r for r in caplog.records if "leaving degraded mode" in r.getMessage()]
    assert len(down) == 1 and len(back) == 1  # one line per transition
    received = set(receiver.received())
    for name, s in (("crit", crit), ("plain", plain)):  # every recorded firing reached the target
        fired = {idempotency_key(s["id"], to_ms(r["expected_at"])) for r in executions(db, name)
                 if r["outcome"] == "fired"}
        assert len(fired) == count(db, name) and fired <= received


def test_degraded_mode_with_a_backlog_prefetches_and_fires_each_occurrence_once(db, dsn, kafka, topic):
    out = topic("degraded")
    for i in range(60):
        create(db, f"dcrit-{i}", every=1, target_kind="kafka", target=out, critical=True)
    create(db, "dplain", every=1, target_kind="kafka", target=out)
    # Redis never reachable; small batches: the next Postgres-only claim is made while one is fired
    with Running(executor(dsn, "redis://127.0.0.1:1/0", kafka, degraded_batch=7),
                 executor(dsn, "redis://127.0.0.1:1/0", kafka, degraded_batch=7)) as running:
        wait_for(lambda: db.query("SELECT count(*) AS n FROM pyscheduler.schedule_executions")[0]["n"] >= 180,
                 60, "three waves of 60 critical firings from PostgreSQL")
        ex1, ex2 = running.daemons
    assert ex1.counts["prefetched"] + ex2.counts["prefetched"] > 0
    rows = db.query("SELECT schedule_id, expected_at, outcome FROM pyscheduler.schedule_executions")
    keys = kafka_keys(kafka, out, len(rows))
    assert len(keys) == len(set(keys)), "an occurrence was fired twice"
    assert {idempotency_key(r["schedule_id"], to_ms(r["expected_at"])) for r in rows} == set(keys)
    assert all(r["outcome"] == "fired" for r in rows) and count(db, "dplain") == 0  # critical ones only
    assert ex1.counts["duplicates"] == ex2.counts["duplicates"] == 0


def test_retries_follow_the_policy_and_stop_after_the_attempts(db, dsn, redis_url):
    allow_loopback(db)
    receiver = Receiver(status=500)
    times: list[float] = []
    original = receiver.server.RequestHandlerClass.do_POST

    def timed(handler):
        times.append(time.monotonic())
        original(handler)

    receiver.server.RequestHandlerClass.do_POST = timed
    try:
        s = create(db, "flaky", every=60, soon=True, target_kind="http", target=receiver.url, retry_attempts=3,
                   retry_base=0.1, retry_jitter=0.05)
        with Running(executor(dsn, redis_url)):
            wait_for(lambda: count(db, "flaky") + len(executions(db, "flaky")) >= 1, 30,
                     "the occurrence to be recorded")
            time.sleep(0.5)  # room for a wrong fifth try to show up
        [row] = executions(db, "flaky")
        assert row["outcome"] == "failed" and row["attempts"] == 4
        keys = receiver.received()
        assert keys == [idempotency_key(s["id"], to_ms(row["expected_at"]))] * 4  # same key every try
        gaps = [b - a for a, b in zip(times, times[1:])]
        for n, gap in enumerate(gaps):  # base * 2^n + random(0, jitter), plus scheduling slack
            assert 0.1 * 2 ** n - 0.01 <= gap <= 0.1 * 2 ** n + 0.05 + 0.5, gaps
    finally:
        receiver.close()


def test_http_target_receives_the_idempotency_key(db, dsn, redis_url, receiver):
    s = create(db, "hook", every=1, target_kind="http", target=receiver.url, payload={"a": 1})
    with Running(executor(dsn, redis_url)):
        wait_for(lambda: count(db, "hook") >= 2, 30, "two firings")
    expected = [idempotency_key(s["id"], to_ms(r["expected_at"])) for r in executions(db, "hook")]
    assert receiver.received()[:2] == expected[:2]
    assert to_ms(executions(db, "hook")[1]["expected_at"]) - to_ms(executions(db, "hook")[0]["expected_at"]) == 1000


def test_overlap_skip_with_a_slow_task(db, dsn, redis_url):
    create(db, "slow", every=1, target_kind="task", target="slowq", overlap="skip")
    started: list[float] = []

    def handler(ctx):
        started.append(time.monotonic())
        ctx.stopping.wait(2.5)

    with Running(executor(dsn, redis_url), Worker(dsn, "slowq", handler, capacity=4, timeout=10, poll_interval=0.2)):
        wait_for(lambda: len(started) >= 2, 40, "two tasks worked")
    outcomes = [r["outcome"] for r in executions(db, "slow")]
    assert "skipped_overlap" in outcomes and outcomes.count("fired") >= 2
    assert all(b - a >= 2.0 for a, b in zip(started, started[1:]))  # never two at once


def test_overlap_buffer_one_with_a_slow_task_lets_one_occurrence_wait(db, dsn, redis_url):
    create(db, "buffered", every=1, target_kind="task", target="bufq", overlap="buffer_one")
    started: list[str] = []
    release = threading.Event()

    def handler(ctx):
        started.append(ctx.spec["pyscheduler"]["idempotency_key"])
        release.wait(30)

    def unfinished() -> dict[str, int]:
        return {r["status"]: r["n"] for r in db.query(
            "SELECT status::text, count(*) AS n FROM pyscheduler.tasks WHERE queue = 'bufq' "
            "AND status IN ('ready', 'running') GROUP BY status")}

    with Running(executor(dsn, redis_url), Worker(dsn, "bufq", handler, capacity=1, timeout=60, poll_interval=0.2)):
        # the first task runs (and hangs), the second waits, every later occurrence is skipped
        wait_for(lambda: count(db, "buffered", "skipped_overlap") >= 2, 40, "two skipped occurrences")
        assert unfinished() == {"running": 1, "ready": 1} and len(started) == 1
        fired_before = count(db, "buffered")
        assert fired_before == 2
        release.set()  # the slow task ends: the waiting one runs, and occurrences fire again
        wait_for(lambda: count(db, "buffered") > fired_before and len(started) >= 3, 40, "firing after the release")
    outcomes = [r["outcome"] for r in executions(db, "buffered")]
    assert outcomes[:2] == ["fired", "fired"] and outcomes[2] == "skipped_overlap"
    first_after = outcomes.index("fired", 2)
    assert set(outcomes[2:first_after]) == {"skipped_overlap"}


def test_reconcile_prunes_the_last_and_version_entries_of_deleted_and_ended_schedules(db, dsn, redis_url):
    live, deleted, ended = (create(db, name, every=3600, target="t.prune") for name in ("live", "deleted", "ended"))
    r = relay(dsn, redis_url, prune_after=0.0)
    index = index_of(redis_url)
    r.reconcile(db, index)
    assert index.hashed_ids() == {live["id"], deleted["id"], ended["id"]}  # versions mirrored
    for s in (live, deleted, ended):  # each fired once long ago
        index.r.hset(index.k_last, s["id"], 1000)
    db.call("delete_schedule", name="deleted")
    db.call("update_schedule", name="ended", end_at=datetime.now(timezone.utc) - timedelta(seconds=1))
    r.reconcile(db, index)
    assert index.hashed_ids() == {live["id"]} and r.pruned == 4
    assert set(index.members()) == {live["id"]}


def test_catch_up_after_executors_were_down_three_intervals(db, dsn, redis_url, receiver):
    s = create(db, "catchup", every=1, target_kind="http", target=receiver.url)
    with Running(relay(dsn, redis_url), executor(dsn, redis_url)):
        wait_for(lambda: count(db, "catchup") >= 1, 30, "a first firing")
    down_from = count(db, "catchup")
    time.sleep(3.3)  # the outage itself: three intervals with no executor
    with Running(executor(dsn, redis_url)):
        wait_for(lambda: count(db, "catchup") >= down_from + 4, 30, "the missed occurrences")
    rows = executions(db, "catchup")
    expected = [to_ms(r["expected_at"]) for r in rows]
    assert all(b - a == 1000 for a, b in zip(expected, expected[1:]))  # each one, no gap, no drift
    keys = receiver.received()
    assert keys[: len(expected)] == [idempotency_key(s["id"], e) for e in expected]  # oldest first
    assert {r["outcome"] for r in rows} == {"fired"}


def test_cli_pause_resume_trigger(dsn, redis_url, receiver, db):
    cli = CliRunner()

    def run(*args):
        result = cli.invoke(main, ["schedules", *args, "--dsn", dsn], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.output

    run("create", "cli", "--every", "1h", "--http", receiver.url)
    sid = db.call_value("get_schedule", name="cli")["id"]
    index = index_of(redis_url)
    with Running(relay(dsn, redis_url), executor(dsn, redis_url)):
        wait_for(lambda: sid in index.members(), 10, "the new schedule to be indexed")
        run("pause", "cli", "--note", "maintenance")
        wait_for(lambda: sid not in index.members(), 10, "the paused schedule to leave the index")
        run("trigger", "cli")
        wait_for(lambda: count(db, "cli") == 1, 30, "the triggered firing (while paused)")
        wait_for(lambda: sid not in index.members(), 10, "the paused schedule to leave the index again")
        run("resume", "cli")
        wait_for(lambda: sid in index.members(), 10, "the resumed schedule to be indexed")
        score = index.members()[sid]  # its next regular run (on the hour: every 1h from the epoch), not now
        assert score > time.time() * 1000 and score % 3_600_000 == 0
        run("trigger", "cli")
        wait_for(lambda: count(db, "cli") == 2, 30, "the second triggered firing")
        assert "execution count: 2" in run("runs", "cli")
    assert len(receiver.received()) == 2
    assert len(run("next", "cli", "-n", "3").split()) >= 3
    assert "cli" in run("list")
    run("delete", "cli")




def test_resync_by_hand_shows_progress_and_rebuilds_the_index(db, dsn, redis_url):
    for i in range(25):
        create(db, f"r-{i}", every=60, target_kind="kafka", target="t", critical=i < 5)
    index = index_of(redis_url)
    index.mirror([(999999, 1, None)])  # a member PostgreSQL does not have stays until a reconcile
    result = CliRunner().invoke(main, ["schedules", "resync", "--dsn", dsn, "--redis-url", redis_url,
                                       "--prefix", PREFIX, "--batch", "10"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert result.output.split()[2:5] == ["5/25", "15/25", "25/25"]  # the 5 critical first
    ids = {r["id"] for r in db.query("SELECT id FROM pyscheduler.schedules")}
    assert ids <= set(index.members()) and index.marker() is not None


def test_pyscheduler_run_includes_relay_executors_and_cleanup(dsn, redis_url, monkeypatch):
    from pyscheduler.daemon import RunContext
    from pyscheduler.schedules.cli import daemons

    monkeypatch.setenv("PYSCHEDULER_SCHEDULES_EXECUTORS", "2")
    names = [d.name for d in daemons(RunContext(dsn=dsn, redis_url=redis_url))]
    assert names[0] == "schedules-relay" and names[1] == "schedules-cleanup"
    assert len([n for n in names if n.startswith("schedules-executor-")]) == 2


def test_cleanup_purges_old_executions_and_counts_survive(db, dsn):
    from pyscheduler.schedules.relay import Cleanup

    s = create(db, "old", every=60, target_kind="kafka", target="t")
    db.query("SELECT * FROM pyscheduler._record_executions(%s, %s, %s, %s, NULL, NULL, now() - interval '40 days')",
             ([s["id"]], [s["next_run_at"]], ["fired"], [1]))
    assert count(db, "old") == 1 and len(executions(db, "old")) == 1
    assert Cleanup(dsn, batch=1).purge_once(db) == 1
    assert executions(db, "old") == [] and count(db, "old") == 1
