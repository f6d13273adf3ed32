"""The delay-queue relay under failures: kill -9, SIGTERM, PostgreSQL restart. Nothing is lost."""

from __future__ import annotations

import logging
import signal
from datetime import timedelta

import pytest

from delay_support import InProcessRelay, Output, RelayProcess, Sender, Topics, fire_time, utcnow, wait_for, warm_up


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
        dsn, kafka, db, topics, io, tmp_path, caplog):
    sender, output = io
    # Node A cannot publish messages over 1000 bytes: it claims them and keeps them ready.
    a = RelayProcess(dsn, kafka, topics, tmp_path / "a.log", "-Xmessage.max.bytes=1000", hold_ms=3000)
    try:
        node_a = a.node()
        warm_up(sender, output, partitions=1)
        values = [f"{i:04d}".encode() + b"x" * 2000 for i in range(20)]
        for i, value in enumerate(values):
            sender.send(f"big-{i}", utcnow() + timedelta(milliseconds=300), value=value)
        sender.flush()
        held = wait_for(lambda: len(ready_by(db, node_a)) == 20 and ready_by(db, node_a), 30,
                        "node A to claim all 20 messages")
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait(10)
    finally:
        a.close()
    readied_at = max(r["readied_at"] for r in held).timestamp()
    assert output.values().count(values[0]) == 0
    caplog.set_level(logging.WARNING, logger="pyscheduler.delay")
    b = InProcessRelay(dsn, kafka, topics, hold_ms=3000)
    try:
        arrived = output.wait_values(values, timeout=30)
    finally:
        b.stop()
    assert sorted(m.value() for _, m in arrived) == sorted(values)  # none lost, each once
    for _, msg in arrived:
        assert fire_time(msg) >= readied_at + 3.0 - 0.2  # taken over only after the hold time (+ rounding)
    suspected = [r.getMessage() for r in caplog.records if "suspected failure of" in r.getMessage()]
    assert len(suspected) == 20 and all(node_a in line for line in suspected)
    assert db.query("SELECT count(*) AS n FROM pyscheduler.delay_messages")[0]["n"] == 0


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
    values = output.values()
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
    from pyscheduler import embedded

    broker = embedded.Kafka(tmp_path / "kafka").start()
    try:
        bootstrap = broker.bootstrap
        topics = Topics(input="in", output="out", dlq="dlq")
        embedded.create_topics(bootstrap, [topics.input, topics.output, topics.dlq])
        sender, output = Sender(bootstrap, topics.input), Output(bootstrap, topics.output)
        relay = InProcessRelay(dsn, bootstrap, topics)
        try:
            warm_up(sender, output, partitions=1)
            values = [f"m{i}".encode() for i in range(50)]
            for i, value in enumerate(values):
                sender.send(f"m{i}", utcnow() + timedelta(milliseconds=800), value=value)
            sender.flush()
            wait_for(lambda: db.query("SELECT count(*) AS n FROM pyscheduler.delay_messages")[0]["n"] == 50, 10,
                     "the messages to be stored")
            broker.proc.send_signal(signal.SIGSTOP)
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
    finally:
        broker.stop()
