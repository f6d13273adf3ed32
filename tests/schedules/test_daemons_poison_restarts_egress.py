"""Hardening of the schedule daemons, with real servers: a stored value never
stops a daemon (the poison catalogue: values an old database may hold, stored directly
as the table owner past create_schedule's checks), a taker that dies between a resync
take and its write loses nothing, a Kafka broker or PostgreSQL restart stops nothing,
HTTP goes through the egress policy (no connection to an internal address, the same
error for an open and a closed port), is not redirected, carries any schedule name, and
a target that never answers delays only its own schedules; the CLI refuses bad input
with a usage error."""

from __future__ import annotations

import logging
import os
import time
import urllib.parse
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
import redis
from click.testing import CliRunner

from pyscheduler import embedded
from pyscheduler.cli import main
from pyscheduler.delay.output import fresh_read
from pyscheduler.schedules.index import Index, Shards, idempotency_key, to_ms
from pyscheduler.schedules.targets import KAFKA_KEY_HEADER, schedule_header

from tests.support import wait_for
from tests.support.schedules import (Blackhole, Probe, Receiver, Running, allow_loopback, count, create, executions,
                                     executor, relay)

PREFIX = "t:schedules"


def index_of(redis_url: str) -> Index:
    return Index(redis.Redis.from_url(redis_url), PREFIX)


def poison(db, name: str, assignments: str, *params) -> int:
    """Store values directly as the table owner (past create_schedule's checks), as an old
    database may hold them. -> the schedule's id"""
    return db.query(f"UPDATE pyscheduler.schedules SET {assignments} WHERE name = %s RETURNING id",
                    (*params, name))[0]["id"]


def closed_port_url() -> str:
    """An allowed (loopback) HTTP target where nothing listens: every try fails, and is retried."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/closed"


def keys_of(received: list[str], schedule_id: int) -> list[str]:
    return [k for k in received if k.startswith(f"{schedule_id}:")]


def topic_keys(kafka: str, topic: str, expect: int = 0) -> list[str]:
    return [dict(m.headers())[KAFKA_KEY_HEADER].decode() for m in fresh_read(kafka, topic, expect, idle=0.5)]


def fired_on_time(db, name: str, late_s: float = 3.0) -> list[dict]:
    """The executions of a neighbour: each fired, none later than ``late_s``, none missing."""
    rows = executions(db, name)
    assert rows and all(r["outcome"] == "fired" for r in rows), rows
    assert all(r["lateness"] < timedelta(seconds=late_s) for r in rows), [r["lateness"] for r in rows]
    expected = [to_ms(r["expected_at"]) for r in rows]
    assert all(b - a == 1000 for a, b in zip(expected, expected[1:])), expected  # no occurrence skipped
    return rows


# ------------------------------------------------------------------ poison catalogue


@pytest.mark.slow
def test_poison_catalogue_neighbours_fire_on_time_and_nothing_is_retried_forever(db, dsn, redis_url, kafka, topic,
                                                                                  caplog):
    allow_loopback(db)
    caplog.set_level(logging.WARNING, logger="pyscheduler.schedules")
    receiver = Receiver()
    nb_topic, p8_topic, missing = topic("nb"), topic("p8"), f"never-created-{os.getpid()}-{time.time_ns()}"
    soon = datetime.now(timezone.utc) + timedelta(seconds=1)
    try:
        # the neighbours, one per target kind
        create(db, "nb-kafka", every=1, target_kind="kafka", target=nb_topic)
        create(db, "nb-http", every=1, target_kind="http", target=receiver.url)
        create(db, "nb-task", every=1, target_kind="task", target="nbq")
        for name, kind, target in (
                ("p-next-10000", "kafka", nb_topic), ("p-next-inf", "kafka", nb_topic),
                ("p-trigger-ninf", "kafka", nb_topic), ("p-end-inf", "http", receiver.url),
                ("p-updated-inf", "kafka", nb_topic), ("p-every-huge", "http", receiver.url),
                ("p-every-overflow", "task", "pq"), ("p-topic-dots", "kafka", nb_topic),
                ("p-topic-long", "kafka", nb_topic), ("p-payload-10mb", "kafka", nb_topic),
                ("p-url-iri", "http", receiver.url), ("p-url-bad", "http", receiver.url),
                ("p-name", "http", receiver.url), ("p-retries", "http", receiver.url),
                ("p-topic-missing", "kafka", nb_topic)):
            create(db, name, every=1, target_kind=kind, target=target)
        create(db, "p-tz", cron="* * * * * *", target_kind="kafka", target=p8_topic)
        ids = {}
        # due times no client library loads: never indexed, logged (relay, resync)
        ids["next-10000"] = poison(db, "p-next-10000", "next_run_at = '10000-01-01'")
        ids["next-inf"] = poison(db, "p-next-inf", "next_run_at = 'infinity'")
        ids["trigger-ninf"] = poison(db, "p-trigger-ninf", "paused = true, trigger_at = '-infinity'")
        # values the daemons do not load: they fire as any schedule
        ids["end-inf"] = poison(db, "p-end-inf", "end_at = 'infinity'")
        ids["updated-inf"] = poison(db, "p-updated-inf", "updated = 'infinity'")
        # fired once, then its next run would pass 9999 (year 10240) / cannot be computed
        # (overflow) / its time zone is gone: recorded alone, with an outcome and a readable error
        ids["every-huge"] = poison(db, "p-every-huge", "every = '3000000 days', next_run_at = %s",
                                   soon.replace(microsecond=0))
        ids["every-overflow"] = poison(db, "p-every-overflow", "every = '170000000 years', next_run_at = %s",
                                       soon.replace(microsecond=0))
        ids["tz"] = poison(db, "p-tz", "tz = 'Mars/Olympus'")
        # targets the clients refuse: failed tries with their errors
        ids["topic-dots"] = poison(db, "p-topic-dots", "target = '..'")
        ids["topic-long"] = poison(db, "p-topic-long", "target = repeat('x', 300)")
        ids["payload-10mb"] = poison(db, "p-payload-10mb", "payload = jsonb_build_object('x', repeat('x', 10485760))")
        ids["url-iri"] = poison(db, "p-url-iri", "target = %s", receiver.url + "/caf\u00e9")
        ids["url-bad"] = poison(db, "p-url-bad", "target = 'http://[::1/x'")
        ids["name"] = poison(db, "p-name", "name = %s", "p-\u540d\u524d \u2615\r\nX-Evil: 1")
        ids["retries"] = poison(db, "p-retries", "target = %s, retry_attempts = 1000000, retry_base = '0', "
                                "retry_jitter = '0'", closed_port_url())
        ids["topic-missing"] = poison(db, "p-topic-missing", "target = %s", missing)
        index = index_of(redis_url)
        with Running(relay(dsn, redis_url), executor(dsn, redis_url, kafka)) as running:
            ex = running.daemons[1]
            wait_for(lambda: all(count(db, n) >= 6 for n in ("nb-kafka", "nb-http", "nb-task")), 60,
                     "six firings of each neighbour")
            ended = ("p-every-huge", "p-every-overflow", "p-tz")
            wait_for(lambda: all(executions(db, n) for n in ended), 20, "the poison occurrences to be recorded")
            neighbours_then = {n: count(db, n) for n in ("nb-kafka", "nb-http", "nb-task")}
            wait_for(lambda: all(count(db, n) >= neighbours_then[n] + 3 for n in neighbours_then), 30,
                     "three more firings of each neighbour")
            assert ex.counts["poison"] == 0  # the SQL side answered each one: the executor's net never caught one
        for n in ("nb-kafka", "nb-http", "nb-task"):
            fired_on_time(db, n)
        assert ex.counts["duplicates"] == 0  # no neighbour was fired (or recorded) twice

        # due times out of range: never indexed nor fired, each logged
        for k in ("next-10000", "next-inf", "trigger-ninf"):
            assert ids[k] not in index.members() and executions(db, f"p-{k}") == []
            assert any(f"schedule {ids[k]} is due at a time outside" in r.getMessage() for r in caplog.records)
        # values the daemons never load: fired as usual
        assert count(db, "p-end-inf") >= 6 and count(db, "p-updated-inf") >= 6 and count(db, "p-topic-missing") >= 6
        # fired once, recorded once with its outcome, never fired again: the one whose next run
        # would pass 9999 ended (ended_note), the two that cannot be computed with are paused
        # with the error in last_error (and in their execution)
        assert len(keys_of(receiver.received(), ids["every-huge"])) == 1
        assert len(topic_keys(kafka, p8_topic)) == 1
        huge = db.call_value("get_schedule", name="p-every-huge")
        assert [r["outcome"] for r in executions(db, "p-every-huge")] == ["fired"]
        assert huge["next_run_at"] is None and "9999-01-01" in huge["ended_note"] and not huge["paused"]
        for k, outcome, error in (("every-overflow", "failed", "22003"), ("tz", "fired", "Mars/Olympus")):
            [run] = executions(db, f"p-{k}")
            got = db.call_value("get_schedule", name=f"p-{k}")
            assert run["outcome"] == outcome and error in run["error"], run
            assert got["paused"] and got["due_at"] is None and error in got["last_error"], got
        # the task of the one that could not be recorded was not submitted either
        assert db.query("SELECT count(*) AS n FROM pyscheduler.tasks WHERE queue = 'pq'")[0]["n"] == 0
        for k in ("every-huge", "every-overflow", "tz"):
            assert ids[k] not in index.members()
        # refused by the target's client: each occurrence a failed try with its error
        for k, error in (("topic-dots", "topic"), ("topic-long", "topic"),
                         ("payload-10mb", "Message size too large"), ("url-iri", "UnicodeEncodeError"),
                         ("url-bad", "Invalid IPv6 URL"), ("retries", "could not connect")):
            rows = executions(db, f"p-{k}")
            assert rows and all(r["outcome"] == "failed" and error in r["error"] for r in rows), (k, rows[:2])
        # at most 30 retries, whatever is stored (an occurrence still retrying when the executor
        # stopped is recorded with the tries it had)
        attempts = [r["attempts"] for r in executions(db, "p-retries")]
        assert 31 in attempts and max(attempts) == 31, attempts
        # any name stored before the input rule is sent (RFC 8187-encoded in the header); the
        # API refuses such a name (PS310), so the count is read by id
        assert db.query("SELECT fired_count FROM pyscheduler.schedules WHERE id = %s", (ids["name"],))[0][
            "fired_count"] >= 6
    finally:
        receiver.close()


def test_isolate_splits_a_batch_until_each_poison_item_is_alone(tx):
    """The executor's isolation (fire details, recorder), against real
    errors: one the server raises (22012) and one psycopg raises loading a value (a year-10000
    timestamp, no SQLSTATE); any other error is raised, not isolated."""
    from pyscheduler.schedules.recorder import isolate

    calls = []

    def call(part):
        calls.append(list(part))
        return tx.query("SELECT x, 1 / (x - 3) AS q, CASE WHEN x = 6 THEN timestamptz '10000-01-01' END AS t "
                        "FROM unnest(%s::int[]) x", (part,))

    rows, poison = isolate(list(range(1, 9)), call)
    assert [r["x"] for r in rows] == [1, 2, 4, 5, 7, 8]
    assert [(item, type(exc).__name__) for item, exc in poison] == [(3, "DivisionByZero"), (6, "DataError")]
    assert len(calls) <= 2 * 8  # a split per level, not a retry loop
    with pytest.raises(psycopg.errors.UndefinedFunction):  # 42883: a bug, not a poison item
        isolate([1, 2], lambda part: tx.query("SELECT pyscheduler.no_such_function(%s::int[])", (part,)))


@pytest.mark.slow
def test_an_answer_the_executor_cannot_load_ends_that_occurrence_alone_as_the_sql_side_does(db, dsn, redis_url):
    """The executor's net under the SQL side's per-item answers, with its own recorder: a due
    time written to the table behind the functions' back after the claim (a trigger at
    -infinity) makes record_executions' answer unloadable. That occurrence alone ends as
    record_executions ends a poison item (recorded with its outcome and the error, its
    schedule paused with the error in last_error), its neighbour is recorded and moves on,
    and the index drops the stopped one."""
    from pyscheduler.schedules.recorder import Recorder
    from pyscheduler.schedules.relay import mirror_entries
    from pyscheduler.schedules.targets import Occurrence

    for name in ("ok", "bad"):
        create(db, name, every=3600, soon=True, target_kind="kafka", target="t")
    ids = {r["name"]: r["id"] for r in db.query("SELECT id, name FROM pyscheduler.schedules")}
    index = index_of(redis_url)
    index.mirror(mirror_entries(db.call("index_entries", ids=list(ids.values()))))
    claimed: list = []
    wait_for(lambda: claimed.extend(index.claim(10).claimed) or len(claimed) == 2, 10, "both occurrences claimed")
    poison(db, "bad", "trigger_at = '-infinity'")
    ex = executor(dsn, redis_url)
    ex.db, ex.index = db, Shards(index.r, PREFIX)
    recorder = Recorder(ex)
    recorder.record([("fired", Occurrence(c.id, c.expected_ms, tries=1), None) for c in claimed])
    recorder.settle()
    first = {c.id: c.expected_ms for c in claimed}
    assert [r["outcome"] for r in executions(db, "ok")] == ["fired"]
    [run] = executions(db, "bad")
    assert run["outcome"] == "fired" and "cannot be loaded" in run["error"], run
    bad = db.call_value("get_schedule", name="bad")
    assert bad["paused"] and bad["due_at"] is None and "cannot be loaded" in bad["last_error"], bad
    assert index.members() == {ids["ok"]: first[ids["ok"]] + 3_600_000} and index.stats()["claims"] == 0
    assert ex.counts["poison"] == 1 and ex.counts["recorded"] == 2


@pytest.mark.slow
def test_degraded_mode_skips_a_critical_schedule_due_at_a_time_no_client_loads(db, dsn, kafka, topic, caplog):
    caplog.set_level(logging.ERROR, logger="pyscheduler.schedules")
    out = topic("crit")
    create(db, "crit-ok", every=1, target_kind="kafka", target=out, critical=True)
    create(db, "crit-poison", every=1, target_kind="kafka", target=out, critical=True)
    sid = poison(db, "crit-poison", "next_run_at = '-infinity'")
    # Redis never reachable: critical schedules are claimed from PostgreSQL
    with Running(executor(dsn, "redis://127.0.0.1:1/0", kafka, degraded_hold_ms=1000)):
        wait_for(lambda: count(db, "crit-ok") >= 4, 30, "four firings of the neighbour from PostgreSQL")
    fired_on_time(db, "crit-ok")
    assert executions(db, "crit-poison") == []
    assert any(f"schedule {sid} is due at -infinity" in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------------ 21: a change while an occurrence is recorded


@pytest.mark.slow
def test_a_schedule_changed_between_its_record_and_its_settle_fires_nothing_of_the_old_cadence(db, dsn, redis_url):
    """Item 21, Kafka and HTTP targets, step by step with the executor's own recorder and the
    relay: the occurrence is claimed and recorded, then the schedule changes (a new cadence;
    a trigger) and the relay writes the change while the member is still claimed, then the
    recorder settles. The index must hold the due time after the change, never the next run
    of the old cadence that the record computed."""
    from pyscheduler.schedules.recorder import Recorder
    from pyscheduler.schedules.targets import Occurrence

    create(db, "cadence", every=3600, soon=True, target_kind="kafka", target="t")
    create(db, "trigger", every=3600, soon=True, target_kind="http", target="https://example.com/hook")
    ids = {r["name"]: r["id"] for r in db.query("SELECT id, name FROM pyscheduler.schedules")}
    index = index_of(redis_url)
    the_relay = relay(dsn, redis_url)
    ex = executor(dsn, redis_url)
    ex.db, ex.index = db, Shards(index.r, PREFIX)
    recorder = Recorder(ex)

    def relay_writes(*names: str) -> None:  # the relay, notified of the change
        the_relay.pending.update(ids[n] for n in names)
        the_relay.follow(db, index)

    relay_writes("cadence", "trigger")
    claimed: list = []
    wait_for(lambda: claimed.extend(index.claim(10).claimed) or len(claimed) == 2, 10, "both occurrences claimed")
    first = {c.id: c.expected_ms for c in claimed}
    recorder.record([("fired", Occurrence(c.id, c.expected_ms, tries=1), None) for c in claimed])
    old_next = {n: first[ids[n]] + 3_600_000 for n in ids}
    assert {n: to_ms(datetime.fromisoformat(db.call_value("get_schedule", name=n)["next_run_at"])) for n in ids} \
        == old_next  # recorded: the next runs of the old cadence are computed
    new = db.call_value("update_schedule", name="cadence", every=timedelta(seconds=2))
    trig = db.call_value("trigger_schedule", name="trigger")
    relay_writes("cadence", "trigger")  # both still claimed: the relay may not write them
    recorder.settle()
    members = index.members()
    assert members[ids["cadence"]] == to_ms(datetime.fromisoformat(new["next_run_at"])) != old_next["cadence"]
    assert members[ids["trigger"]] == to_ms(datetime.fromisoformat(trig["trigger_at"])) != old_next["trigger"]
    assert index.stats()["claims"] == 0
    # what is claimed next is the new cadence's run and the trigger, nothing of the old cadence
    claimed.clear()
    wait_for(lambda: claimed.extend(index.claim(10).claimed) or len(claimed) == 2, 10, "the next two occurrences")
    assert {(c.id, c.expected_ms) for c in claimed} == {(ids["cadence"], members[ids["cadence"]]),
                                                        (ids["trigger"], members[ids["trigger"]])}


@pytest.mark.slow
def test_the_relay_ignores_notifications_that_are_not_schedule_ids(db, dsn, redis_url):
    """Any role may NOTIFY pyscheduler_schedules (PostgreSQL asks no privilege for it): a
    payload that is not a list of schedule ids (a non-ASCII digit, a number past bigint, a
    sign, 10,000 digits) neither stops the relay's listener nor crashes the relay; the
    next real change is still followed at once (the reconcile is an hour away)."""
    with Running(relay(dsn, redis_url, reconcile_interval=3600)) as running:
        the_relay = running.daemons[0]
        wait_for(lambda: the_relay.reconciles >= 1, 10, "the first reconcile")
        for payload in ("\u00b2", "\u0663", "99999999999999999999", "9223372036854775808", "-1", "1e3", "9" * 7000,
                        " , ,", "1,\u00b2,2"):
            db.query("SELECT pg_notify('pyscheduler_schedules', %s)", (payload,))
        s = create(db, "after", every=3600, target_kind="kafka", target="t")
        index = index_of(redis_url)
        wait_for(lambda: s["id"] in index.members(), 10, "the schedule created after them to be indexed")
    # Running.stop re-raised nothing: the relay never crashed


# ------------------------------------------------------------------ resync


@pytest.mark.slow
def test_a_resync_taker_that_dies_between_take_and_write_loses_no_batch(db, dsn, redis_url):
    for i in range(30):
        create(db, f"r-{i}", every=3600, target_kind="kafka", target="t", critical=i < 6,
               start_at=datetime.now(timezone.utc) + timedelta(days=1))
    ids = {r["id"] for r in db.query("SELECT id FROM pyscheduler.schedules")}
    index = index_of(redis_url)
    sync_id = index.begin_resync()  # Redis lost its data: the first taker starts a resync
    # a taker takes the first batch (the critical schedules) and dies before writing it
    dead = db.call("resync_take", sync_id=sync_id, owner="dead-taker", max_schedules=5, lease=timedelta(seconds=1))
    assert len(dead) == 5 and all(r["critical"] for r in dead)
    complete_at: list[set[int]] = []

    def complete() -> bool:
        if index.marker() is None:
            return False
        complete_at.append(set(index.members()))
        return True

    with Running(executor(dsn, redis_url, resync_batch=7)):
        wait_for(complete, 30, "the resync to complete", interval=0.005)
    assert complete_at[0] >= ids  # every schedule was in the index when it was marked complete
    assert index.marker() == sync_id
    progress = db.call_one("resync_progress", sync_id=sync_id)
    assert progress == {"done": 30, "total": 30, "complete": True}


# ------------------------------------------------------------------ dependency restarts


@pytest.mark.slow
def test_kafka_broker_restart_every_occurrence_delivered_and_recorded_once(db, dsn, redis_url, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="pyscheduler.schedules")
    broker = embedded.Kafka(tmp_path / "kafka").start()
    names = [f"k-{i}" for i in range(5)]
    try:
        embedded.create_topics(broker.bootstrap, ["sched"])
        for name in names:  # retries: the occurrences the restart catches get through afterwards
            create(db, name, every=4, target_kind="kafka", target="sched", retry_attempts=3, retry_base=0.5,
                   retry_jitter=0)
        with Running(relay(dsn, redis_url),
                     executor(dsn, redis_url, broker.bootstrap, fire_timeout_ms=2000)) as running:
            wait_for(lambda: all(count(db, n) >= 2 for n in names), 40, "two waves before the restart")
            # right after a wave (one every 4 s, at the same instants for all: aligned to the
            # epoch): what the old broker holds is read before it goes. Waited for by the
            # occurrence each last fired, not by counts: five schedules created across a wave's
            # instant fire one wave apart at first, and their counts stay one apart
            def newest(name: str) -> int:
                return to_ms(executions(db, name)[-1]["expected_at"])

            wave = max(newest(n) for n in names)
            wait_for(lambda: all(newest(n) == wave + 4000 for n in names), 20, "the next wave, fired by all five")
            fired = {n: count(db, n) for n in names}
            before = topic_keys(broker.bootstrap, "sched", sum(fired.values()))
            assert {n: count(db, n) for n in names} == fired  # no firing since: nothing unread is lost
            # killed at once (tansu keeps what it acknowledged in memory only, and a SIGTERM lets it
            # take, then lose, the next wave), then restarted empty on the same port
            broker.kill()
            broker = embedded.Kafka(tmp_path / "kafka2", port=broker.port).start()
            embedded.create_topics(broker.bootstrap, ["sched"])
            restarted = {n: count(db, n) for n in names}
            wait_for(lambda: all(count(db, n) >= restarted[n] + 3 for n in names), 60, "three waves after the restart")
            ex = running.daemons[1]
        after = topic_keys(broker.bootstrap, "sched", 15)
    finally:
        broker.stop()
    rows = db.query("SELECT schedule_id, expected_at, outcome FROM pyscheduler.schedule_executions")
    assert {r["outcome"] for r in rows} == {"fired"}  # nothing failed: the restart was ridden out
    recorded = [idempotency_key(r["schedule_id"], to_ms(r["expected_at"])) for r in rows]
    assert len(recorded) == len(set(recorded)) and ex.counts["duplicates"] == 0  # nothing recorded twice
    assert set(recorded) <= set(before) | set(after)  # each one delivered
    assert len(after) == len(set(after)) and len(before) == len(set(before))
    for name in names:  # and none skipped
        expected = [to_ms(r["expected_at"]) for r in executions(db, name)]
        assert all(b - a == 4000 for a, b in zip(expected, expected[1:])), expected
    assert any("Kafka producer replaced" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_postgres_restart_stops_no_schedule_daemon_and_fires_nothing_twice(pg, db, dsn, redis_url, kafka, topic,
                                                                            caplog):
    if pg.server is None:
        pytest.skip("needs the embedded PostgreSQL (PYSCHEDULER_TEST_DSN is set)")
    from pyscheduler.schedules.relay import Cleanup

    caplog.set_level(logging.WARNING, logger="pyscheduler.schedules")
    allow_loopback(db)
    receiver = Receiver()
    out = topic("pgr")
    try:
        create(db, "pg-http", every=1, target_kind="http", target=receiver.url)
        create(db, "pg-kafka", every=1, target_kind="kafka", target=out)
        with Running(relay(dsn, redis_url), executor(dsn, redis_url, kafka), Cleanup(dsn, interval=0.2)):
            wait_for(lambda: count(db, "pg-http") >= 2 and count(db, "pg-kafka") >= 2, 30, "firings before")
            pg.server.stop()
            try:
                wait_for(lambda: any("unavailable" in r.getMessage() for r in caplog.records), 20,
                         "the daemons to notice the outage")
                time.sleep(1.5)  # occurrences come due while PostgreSQL is down
            finally:
                pg.server.start()
            db.pool.check()
            then = {n: count(db, n) for n in ("pg-http", "pg-kafka")}
            wait_for(lambda: all(count(db, n) >= then[n] + 3 for n in then), 60, "firings after the restart")
        # Running.stop re-raised nothing: every daemon ran throughout
        keys = receiver.received()
        assert len(keys) == len(set(keys))  # nothing fired twice
        kafka_keys = topic_keys(kafka, out, count(db, "pg-kafka"))
        assert len(kafka_keys) == len(set(kafka_keys))
        for name in ("pg-http", "pg-kafka"):
            assert {r["outcome"] for r in executions(db, name)} == {"fired"}
    finally:
        receiver.close()


def test_every_schedule_daemon_has_fresh(dsn, redis_url):
    from pyscheduler.schedules.cli import build_daemons

    for d in build_daemons(dsn, redis_url, None, {}):
        new = d.fresh()
        assert type(new) is type(d) and new is not d
        if hasattr(d, "cfg"):  # an executor: the same settings, a new identity (its resync takes)
            assert new.cfg.prefix == d.cfg.prefix and new.cfg.owner != d.cfg.owner


# ------------------------------------------------------------------ HTTP: egress, slow targets, redirects, names


@pytest.mark.slow
def test_fire_time_egress_check_never_connects_to_internal_addresses_and_hides_the_port_state(db, dsn, redis_url):
    listening = Probe()
    closed = Probe()
    closed_port = closed.port
    closed.close()
    try:
        for name, url in (("open", f"http://127.0.0.1:{listening.port}/x"), ("closed", f"http://127.0.0.1:{closed_port}/x"),
                          ("metadata", "http://169.254.169.254/latest/meta-data/"),
                          ("named", f"http://localhost:{listening.port}/x")):
            # stored directly: past the create-time check, to prove the one at fire time
            create(db, name, every=1, target_kind="http", target="http://pyscheduler-test.invalid/")
            poison(db, name, "target = %s", url)
        with Running(executor(dsn, redis_url)):
            wait_for(lambda: all(count(db, n, "failed") >= 2 for n in ("open", "closed", "metadata", "named")), 30,
                     "two failed occurrences each")
        assert listening.connections == 0 and listening.received() == []  # never connected to
        errors = {n: {r["error"] for r in executions(db, n)} for n in ("open", "closed", "metadata", "named")}
        assert errors["open"] == errors["closed"]  # an open and a closed port look the same
        assert all(len(e) == 1 and next(iter(e)).startswith("http: refused by the egress policy")
                   for e in errors.values())
        last = {r["name"]: r["last_error"] for r in db.query("SELECT name, last_error FROM pyscheduler.schedules")}
        assert last["open"] == last["closed"]
    finally:
        listening.close()


@pytest.mark.slow
def test_the_egress_allow_list_is_read_again_while_the_executor_runs(db, dsn, redis_url):
    probe = Probe()
    try:
        create(db, "later", every=1, target_kind="http", target="http://pyscheduler-test.invalid/")
        poison(db, "later", "target = %s", probe.url)
        with Running(executor(dsn, redis_url, allow_refresh_ms=200)):
            wait_for(lambda: count(db, "later", "failed") >= 1, 30, "a refused occurrence")
            assert probe.connections == 0
            allow_loopback(db)  # an admin widens the allow-list: no restart needed
            wait_for(lambda: count(db, "later") >= 1, 30, "an occurrence fired once allowed")
        assert probe.connections >= 1
    finally:
        probe.close()


@pytest.mark.slow
def test_a_try_the_egress_policy_refuses_fails_the_occurrence_at_once(db, dsn, redis_url):
    """Refused now, refused on every retry until an admin changes the allow-list: the
    occurrence is recorded failed with the refusal after one try, whatever its retry policy."""
    allow_loopback(db)
    probe = Probe()
    try:
        create(db, "narrowed", every=3600, soon=True, target_kind="http", target=probe.url, retry_attempts=5,
               retry_base=0.2, retry_jitter=0)
        db.call("set_http_allow", allow=[])  # an admin narrows the allow-list after the create
        with Running(executor(dsn, redis_url)):
            wait_for(lambda: len(executions(db, "narrowed")) == 1, 30, "the occurrence to be recorded")
        [row] = executions(db, "narrowed")
        assert row["outcome"] == "failed" and row["attempts"] == 1, row
        assert row["error"].startswith("http: refused by the egress policy: 127.0.0.1")
        assert probe.connections == 0
    finally:
        probe.close()


@pytest.mark.slow
def test_a_target_that_never_answers_does_not_delay_other_schedules(db, dsn, redis_url):
    allow_loopback(db)
    hole, victim = Blackhole(), Receiver()
    try:
        for i in range(40):
            create(db, f"hole-{i}", every=1, target_kind="http", target=hole.url)
        create(db, "victim", every=1, target_kind="http", target=victim.url)
        with Running(relay(dsn, redis_url), executor(dsn, redis_url, http_concurrency=16)):
            wait_for(lambda: len(hole.held) >= 4, 30, "the black hole to hold requests")
            start = count(db, "victim")
            wait_for(lambda: count(db, "victim") >= start + 8, 30, "eight more firings of the victim")
        rows = fired_on_time(db, "victim", late_s=1.0)
        assert len(rows) >= 8
    finally:
        hole.close()
        victim.close()


@pytest.mark.slow
def test_a_redirect_is_a_failed_try_with_its_status_never_followed(db, dsn, redis_url):
    allow_loopback(db)
    probe = Probe(status=302, location="/elsewhere")
    try:
        create(db, "moved", every=3600, soon=True, target_kind="http", target=probe.url, payload={"a": 1})
        with Running(executor(dsn, redis_url)):
            wait_for(lambda: len(executions(db, "moved")) == 1, 30, "the occurrence to be recorded")
        [row] = executions(db, "moved")
        assert row["outcome"] == "failed" and row["error"] == "http: status 302"
        assert [(m, p) for m, p, _ in probe.received()] == [("POST", "/hook")]  # no GET of the Location
    finally:
        probe.close()


@pytest.mark.slow
def test_any_schedule_name_is_sent_in_the_schedule_header(db, dsn, redis_url):
    allow_loopback(db)
    probe = Probe()
    names = ["caf\u00e9 \u2615 report", "UTF-8''literal", "plain-name"]
    try:
        for name in names:
            create(db, name, every=3600, soon=True, target_kind="http", target=probe.url)
        with Running(executor(dsn, redis_url)):
            wait_for(lambda: len(probe.received()) == 3, 30, "three POSTs")
        sent = {h["X-Pyscheduler-Schedule"] for _, _, h in probe.received()}
        assert sent == {"UTF-8''caf%C3%A9%20%E2%98%95%20report", "UTF-8''UTF-8%27%27literal", "plain-name"}
        decoded = {urllib.parse.unquote(v[len("UTF-8''"):]) if v.startswith("UTF-8''") else v for v in sent}
        assert decoded == set(names) and {schedule_header(n) for n in names} == sent
        assert all(count(db, n) == 1 for n in names)
    finally:
        probe.close()


# ------------------------------------------------------------------ CLI


def test_cli_create_refuses_a_bad_payload_naming_the_flag_and_reads_a_naive_start_as_utc(db, dsn):
    cli = CliRunner()
    for payload in ('{"a": NaN}', '{"a": 1e999}', '{"a": "\\u0000"}', '{"a": '):
        result = cli.invoke(main, ["schedules", "create", "bad", "--every", "1m", "--kafka", "t", "--payload",
                                   payload, "--dsn", dsn])
        assert result.exit_code == 2 and "--payload" in result.output, result.output
        assert result.exception is None or isinstance(result.exception, SystemExit)  # no traceback
    result = cli.invoke(main, ["schedules", "create", "naive", "--every", "1h", "--kafka", "t", "--start",
                               "2030-01-02T03:04:05", "--dsn", dsn], env={"PGTZ": "Asia/Tokyo"},
                        catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert db.call_value("get_schedule", name="naive")["start_at"] == "2030-01-02T03:04:05+00:00"
    assert "without an offset: UTC" in " ".join(cli.invoke(main, ["schedules", "create", "--help"]).output.split())
