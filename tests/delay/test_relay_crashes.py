"""The delay-queue relay under failures: kill -9, SIGTERM, PostgreSQL restart. Nothing is lost."""

from __future__ import annotations

import logging
import signal
import time
from datetime import timedelta

import pytest

from tests.support import wait_for
from tests.support.delay import (InProcessRelay, Output, RelayProcess, Sender, Topics, fire_time, freeze,
                                 private_broker, utcnow, warm_up)

pytestmark = pytest.mark.slow  # every test here: daemons, processes or servers of its own, on the real clock


@pytest.fixture
def topics(topic) -> Topics:
    return Topics(input=topic("in", partitions=1), output=topic("out"), dlq=topic("dlq"))


@pytest.fixture
def io(kafka, topics):
    sender, output = Sender(kafka, topics.input), Output(kafka, topics.output)
    yield sender, output
    output.close()


def ready_by(db, node: str) -> list[dict]:
    return db.query("SELECT id, readied_at FROM pyscheduler.delay_messages WHERE readied_by = %s", (node,))


def test_kill_9_of_a_node_holding_ready_messages_another_node_fires_them_after_the_hold_time(
        dsn, kafka, db, conn, topics, io, tmp_path, caplog):
    sender, output = io
    a = RelayProcess(dsn, kafka, topics, tmp_path / "a.log", hold_ms=3000)
    try:
        node_a = a.node()
        warm_up(sender, output, partitions=1)
        # Node A publishes but cannot delete what it fired (its delete_fired fails as a lock
        # timeout would, and is retried): it holds the messages ready, as a node killed between
        # publishing and deleting does.
        conn.execute(f"""
            CREATE FUNCTION pyscheduler.test_refuse_delete() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'held by the test' USING ERRCODE = '55P03'; END $$;
            CREATE TRIGGER test_refuse_delete BEFORE DELETE ON pyscheduler.delay_messages FOR EACH ROW
              WHEN (OLD.readied_by = '{node_a}') EXECUTE FUNCTION pyscheduler.test_refuse_delete();""")
        values = [f"{i:04d}".encode() for i in range(20)]
        due = utcnow() + timedelta(milliseconds=300)
        for i, value in enumerate(values):
            sender.send(f"m-{i}", due, value=value)
        sender.flush()
        held = wait_for(lambda: len(ready_by(db, node_a)) == 20 and ready_by(db, node_a), 30,
                        "node A to claim all 20 messages")
        # a claim marks them ready before they are published: the kill comes once they were
        output.wait_values(values, 30)
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait(10)
    finally:
        a.close()
    readied_at = max(r["readied_at"] for r in held).timestamp()
    caplog.set_level(logging.WARNING, logger="pyscheduler.delay")
    b = InProcessRelay(dsn, kafka, topics, hold_ms=3000)
    try:
        wait_for(lambda: db.query("SELECT count(*) AS n FROM pyscheduler.delay_messages")[0]["n"] == 0, 30,
                 "node B to fire and delete the 20 messages")
    finally:
        b.stop()
    fired = [m for m in output.fresh(40) if m.value() in set(values)]
    # each once by A (before it was killed) and once more by B, only after the hold time
    assert sorted(m.value() for m in fired) == sorted(values * 2)
    late = [m for m in fired if fire_time(m) >= readied_at + 3.0 - 0.2]  # taken over after the hold (+ rounding)
    assert sorted(m.value() for m in late) == sorted(values)
    suspected = [r.getMessage() for r in caplog.records if "suspected failure of" in r.getMessage()]
    assert len(suspected) == 20 and all(node_a in line for line in suspected)


def test_sigterm_finishes_in_flight_work_commits_and_exits_0(dsn, kafka, db, topics, io, tmp_path):
    sender, output = io
    proc = RelayProcess(dsn, kafka, topics, tmp_path / "relay.log")
    try:
        proc.node()
        warm_up(sender, output, partitions=1)
        later = [f"later-{i}".encode() for i in range(50)]
        now = [f"now-{i}".encode() for i in range(50)]
        for i in range(50):
            sender.send(f"later-{i}", utcnow() + timedelta(seconds=3), value=later[i])
            sender.send(f"now-{i}", utcnow() - timedelta(seconds=1), value=now[i])
        sender.flush()
        output.wait_values(now)
        wait_for(lambda: db.query("SELECT count(*) AS n FROM pyscheduler.delay_messages")[0]["n"] == 50, 10,
                 "the delayed messages to be stored")
        proc.proc.send_signal(signal.SIGTERM)
        assert proc.proc.wait(20) == 0, proc.text()
        assert "stopped" in proc.text()
    finally:
        proc.close()
    # a successor fires the waiting ones; the input was committed, so nothing is read (or fired) twice
    successor = InProcessRelay(dsn, kafka, topics)
    try:
        output.wait_values(later)
        warm_up(sender, output, partitions=1)  # everything before this has been consumed
    finally:
        successor.stop()
    values = [m.value() for m in output.fresh(len(now) + len(later))]
    assert sorted(v for v in values if v in set(now) | set(later)) == sorted(now + later)


def test_postgres_restarted_mid_run_loses_nothing(pg, dsn, kafka, db, topics, io, caplog):
    if pg.server is None:
        pytest.skip("needs the embedded PostgreSQL (PYSCHEDULER_TEST_DSN is set)")
    sender, output = io
    caplog.set_level(logging.WARNING, logger="pyscheduler.delay")
    relay = InProcessRelay(dsn, kafka, topics)
    try:
        warm_up(sender, output, partitions=1)
        before = [f"before-{i}".encode() for i in range(100)]
        for i, value in enumerate(before):
            sender.send(f"before-{i}", utcnow() + timedelta(milliseconds=1500 + 10 * i), value=value)
        sender.flush()
        wait_for(lambda: db.query("SELECT count(*) AS n FROM pyscheduler.delay_messages")[0]["n"] > 0, 10,
                 "messages to be stored")
        pg.server.stop()
        try:
            during = [f"during-{i}".encode() for i in range(100)]
            for i, value in enumerate(during):
                deadline = utcnow() + (timedelta(milliseconds=500) if i % 2 else -timedelta(seconds=1))
                sender.send(f"during-{i}", deadline, value=value)
            sender.flush()
            wait_for(lambda: any("unavailable" in r.getMessage() for r in caplog.records), 20,
                     "the relay to notice the outage")
        finally:
            pg.server.start()
        output.wait_values(before + during, timeout=60)
    finally:
        relay.stop()
    assert any(" back after " in r.getMessage() for r in caplog.records)
    assert relay.relay.node  # still the same process, it never gave up


def test_broker_frozen_mid_run_loses_nothing(dsn, db, tmp_path, caplog):
    """A private broker is stopped (SIGSTOP) while messages are due, then resumed.
    (tansu keeps topics in memory, so a broker restart would lose them: a freeze is
    the outage we can stage honestly.)"""
    with private_broker(tmp_path) as (broker, topics, sender, output):
        bootstrap = broker.bootstrap
        relay = InProcessRelay(dsn, bootstrap, topics)
        try:
            warm_up(sender, output, partitions=1)
            values = [f"m{i}".encode() for i in range(50)]
            for i, value in enumerate(values):
                sender.send(f"m{i}", utcnow() + timedelta(milliseconds=800), value=value)
            sender.flush()
            wait_for(lambda: db.query("SELECT count(*) AS n FROM pyscheduler.delay_messages")[0]["n"] == 50, 10,
                     "the messages to be stored")
            freeze(broker)
            try:
                # due while the broker is gone: claimed, but cannot be published
                caplog.set_level(logging.WARNING, logger="pyscheduler.delay")
                wait_for(lambda: db.query("SELECT count(*) AS n FROM pyscheduler.delay_messages "
                                          "WHERE readied_at IS NOT NULL")[0]["n"] > 0, 10,
                         "the relay to try firing during the outage")
                # ... and held longer than the hold time: the detector resets them meanwhile
                wait_for(lambda: any("suspected failure of" in r.getMessage() for r in caplog.records), 10,
                         "a reset during the outage")
            finally:
                broker.proc.send_signal(signal.SIGCONT)
            output.wait_values(values, timeout=60)  # duplicates are allowed, losses are not
            wait_for(lambda: db.query("SELECT count(*) AS n FROM pyscheduler.delay_messages")[0]["n"] == 0, 20,
                     "the fired messages to be deleted")
        finally:
            relay.stop()
            output.close()


def test_claims_run_ahead_of_unacknowledged_deliveries_and_a_kill_9_there_loses_nothing(dsn, db, tmp_path):
    """The fire loop claims batch N+1 while batch N waits for the broker's acknowledgement
    (pipelining), but deletes nothing unacknowledged and holds at most two batches. The
    broker freezes (SIGSTOP) after the messages were stored: the node claims two batches of
    5 and deletes none; killed (kill -9) right there, with its deliveries unacknowledged,
    a successor fires every message after its hold time (copies of the killed node's
    in-flight ones allowed: the only duplicates, across the crash)."""
    with private_broker(tmp_path) as (broker, topics, sender, output):
        bootstrap = broker.bootstrap
        # A long hold for node A: it gives a batch up after half its hold time (10 s here),
        # which would let a third claim through on a slow machine during the check below.
        a = RelayProcess(dsn, bootstrap, topics, tmp_path / "a.log", "--fire-batch", "5", hold_ms=20000)
        try:
            node_a = a.node()
            warm_up(sender, output, partitions=1)
            values = [f"p{i:02d}".encode() for i in range(20)]
            due = utcnow() + timedelta(seconds=2)
            for i, value in enumerate(values):
                sender.send(f"p-{i}", due, value=value)
            sender.flush()
            wait_for(lambda: db.query("SELECT count(*) AS n FROM pyscheduler.delay_messages")[0]["n"] == 20, 20,
                     "the 20 messages to be stored")
            freeze(broker)
            wait_for(lambda: len(ready_by(db, node_a)) == 10, 20, "node A to claim two batches of 5")
            # while neither batch is acknowledged: nothing deleted, no third batch claimed
            until = time.monotonic() + 1.5
            while time.monotonic() < until:
                assert db.query("SELECT count(*) AS n FROM pyscheduler.delay_messages")[0]["n"] == 20
                assert len(ready_by(db, node_a)) == 10
                time.sleep(0.1)
            a.proc.send_signal(signal.SIGKILL)
            a.proc.wait(10)
        finally:
            broker.proc.send_signal(signal.SIGCONT)
            a.close()
        b = InProcessRelay(dsn, bootstrap, topics, hold_ms=3000)
        try:
            wait_for(lambda: db.query("SELECT count(*) AS n FROM pyscheduler.delay_messages")[0]["n"] == 0, 60,
                     "node B to fire and delete the 20 messages")
        finally:
            b.stop()
        fired = [m.value() for m in output.fresh(20) if m.value() in set(values)]
    assert set(fired) == set(values)  # nothing lost
    assert len(fired) - len(values) <= 10  # copies only of the two batches in flight at the kill
