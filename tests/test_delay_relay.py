"""The delay-queue relay end to end: input topic -> PostgreSQL -> output topic."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from confluent_kafka import Consumer, TopicPartition

from delay_support import InProcessRelay, Output, Sender, Topics, fire_time, utcnow, wait_for, warm_up
from pyscheduler.delay.relay import RelayConfig, parse_deadline
from pyscheduler.errors import ConfigError


@pytest.fixture
def topics(topic) -> Topics:
    return Topics(input=topic("in", partitions=2), output=topic("out"), dlq=topic("dlq"))


@pytest.fixture
def wired(dsn, kafka, topics):
    """A sender to the input, a reader of the output and dead-letter topics, and a relay factory."""
    sender = Sender(kafka, topics.input)
    output, dlq = Output(kafka, topics.output), Output(kafka, topics.dlq)
    relays: list[InProcessRelay] = []

    def start(**overrides) -> InProcessRelay:
        relay = InProcessRelay(dsn, kafka, topics, **overrides)
        relays.append(relay)
        return relay

    yield sender, output, dlq, start
    for relay in relays:
        if relay.thread.is_alive():
            relay.stop()
    output.close()
    dlq.close()


def test_messages_fire_after_deadline_minus_advance_with_key_value_and_headers(wired, db):
    sender, output, _, start = wired
    start(timing_advance_ms=50)
    warm_up(sender, output, partitions=2)
    deadlines = {}
    for i in range(20):
        deadline = utcnow() + timedelta(milliseconds=800 + 60 * i)
        deadlines[f"v{i}".encode()] = deadline
        sender.send(f"id-{i}", deadline, value=f"v{i}".encode(), key=f"key-{i}".encode(),
                    headers=[("trace", b"t1"), ("binary", b"\x00\xff\xfe"), ("trace", b"t2"), ("empty", None)])
    sender.flush()
    arrived = output.wait_values(deadlines)
    assert len(arrived) == 20
    for arrival, msg in arrived:
        deadline = deadlines[msg.value()].timestamp()
        # never before deadline minus advance (CreateTime has millisecond resolution)
        assert fire_time(msg) >= deadline - 0.050 - 0.001
        assert arrival >= deadline - 0.050
        assert fire_time(msg) < deadline + 1.0  # and not absurdly late on an idle machine
        i = msg.value().decode()[1:]
        assert msg.key() == f"key-{i}".encode()
        assert msg.headers() == [("trace", b"t1"), ("binary", b"\x00\xff\xfe"), ("trace", b"t2"), ("empty", None)]
    assert wait_for(lambda: db.query("SELECT count(*) AS n FROM pyscheduler.delay_messages")[0]["n"] == 0 or None,
                    10, "fired messages to be deleted")


def test_deadline_formats_of_the_seed_are_accepted():
    assert parse_deadline(b"2022-12-01T11:09:01.123").isoformat() == "2022-12-01T11:09:01.123000+00:00"
    assert parse_deadline(b"2022-12-01T11:09:01Z").isoformat() == "2022-12-01T11:09:01+00:00"
    assert parse_deadline(b"2022-12-01T13:09:01.5+02:00").timestamp() == parse_deadline(
        b"2022-12-01T11:09:01.5").timestamp()


def test_duplicate_ids_are_ignored_while_waiting_and_accepted_again_after_firing(wired):
    sender, output, _, start = wired
    start()
    warm_up(sender, output, partitions=2)
    deadline = utcnow() + timedelta(milliseconds=700)
    sender.send("same", deadline, value=b"first", partition=0)
    sender.send("same", deadline, value=b"second", partition=1)   # read by the same node, either order
    sender.send("same", deadline, value=b"third", partition=0)
    sender.send("marker", deadline + timedelta(milliseconds=300), value=b"marker", partition=0)
    sender.flush()
    output.wait_values([b"marker"])
    fired = [v for v in output.values() if v in (b"first", b"second", b"third")]
    assert len(fired) == 1 and fired[0] != b"third"  # one copy; the later one on its partition was a duplicate
    # fired, hence forgotten: the same id is scheduled again
    sender.send("same", utcnow() + timedelta(milliseconds=300), value=b"again")
    sender.flush()
    output.wait_values([b"again"])


def test_late_messages_go_straight_through_without_being_stored(wired, db):
    sender, output, _, start = wired
    start()
    warm_up(sender, output, partitions=2)
    sender.send("past", utcnow() - timedelta(seconds=30), value=b"past", key=b"k", headers=[("h", b"1")])
    sender.send("now", utcnow(), value=b"now")
    sender.flush()
    arrived = dict((m.value(), m) for _, m in output.wait_values([b"past", b"now"], timeout=10))
    assert arrived[b"past"].key() == b"k" and arrived[b"past"].headers() == [("h", b"1")]
    stored = db.query("SELECT id FROM pyscheduler.delay_messages WHERE id IN ('past', 'now')")
    assert stored == []


def test_malformed_messages_are_dead_lettered_while_their_neighbours_arrive(wired, kafka, topics):
    sender, output, dlq, start = wired
    relay = start()
    warm_up(sender, output, partitions=2)
    soon = utcnow() + timedelta(milliseconds=500)
    naive = soon.replace(tzinfo=None).isoformat(timespec="milliseconds")      # the seed's format, UTC implied
    offset = soon.astimezone(__import__("datetime").timezone(timedelta(hours=2))).isoformat()
    bad = {
        b"no-id": (None, soon),
        b"no-deadline": ("x1", None),
        b"bad-deadline": ("x2", "tomorrow at noon"),
        b"long-id": ("x" * 129, soon),
        b"empty-id": ("", soon),
    }
    # all on one partition, interleaved with good ones: one batch
    sender.send("good-1", soon, value=b"good-1", partition=0)
    for value, (mid, deadline) in bad.items():
        sender.send(mid, deadline, value=value, partition=0)
    sender.send("good-2", naive, value=b"good-2", partition=0)
    sender.send("good-3", offset, value=b"good-3", partition=0)
    sender.flush()
    output.wait_values([b"good-1", b"good-2", b"good-3"])
    dead = {m.value(): m for _, m in dlq.wait_values(bad)}
    assert len(dead) == 5
    reasons = {v: dict(m.headers())["pyscheduler.delay.error"].decode() for v, m in dead.items()}
    assert "chronosMessageId is missing" in reasons[b"no-id"]
    assert "chronosDeadline is missing" in reasons[b"no-deadline"]
    assert "ISO-8601" in reasons[b"bad-deadline"]
    assert "longer than 128" in reasons[b"long-id"]
    assert "empty" in reasons[b"empty-id"]
    source = dict(dead[b"no-id"].headers())["pyscheduler.delay.source"].decode()
    assert source.startswith(f"{topics.input}/0/")
    # the offsets of the whole batch are committed: nothing is read again
    # (partition 0 holds 1 warm-up + 8 messages; tansu's high watermark is not reliable, so count)
    consumer = Consumer({"bootstrap.servers": kafka, "group.id": topics.group})
    try:
        wait_for(lambda: consumer.committed([TopicPartition(topics.input, 0)], timeout=10)[0].offset == 9,
                 10, "the input offsets to be committed")
    finally:
        consumer.close()
    assert relay.thread.is_alive()


def test_two_nodes_share_one_input_and_fire_everything_once(wired, db):
    sender, output, _, start = wired
    start(hold_ms=10_000)
    start(hold_ms=10_000)
    warm_up(sender, output, partitions=2)
    values = [f"m{i}".encode() for i in range(300)]
    for i, value in enumerate(values):
        sender.send(f"id-{i}", utcnow() + timedelta(milliseconds=500 + 3 * i), value=value, partition=i % 2)
    sender.flush()
    output.wait_values(values)
    fired = [v for v in output.values() if v in set(values)]
    assert sorted(fired) == sorted(values)  # none lost, none twice


def test_missing_topics_are_a_clear_error_at_start(dsn, kafka, topics):
    from pyscheduler.delay.relay import Relay

    relay = Relay(RelayConfig(dsn=dsn, bootstrap_servers=kafka, input_topic=topics.input,
                              output_topic=f"no-such-{uuid.uuid4().hex[:6]}"))
    with pytest.raises(ConfigError, match="no-such-.* do not exist"):
        relay.check_topics()


def test_bad_settings_name_the_setting():
    with pytest.raises(ConfigError, match="hold-ms"):
        RelayConfig(dsn="x", bootstrap_servers="y", input_topic="i", output_topic="o", hold_ms=0)


def test_a_message_the_broker_refuses_does_not_stall_the_ones_behind_it(wired, db):
    sender, output, _, start = wired
    # this node's producer refuses messages over 1000 bytes (as a broker would a too-large record)
    start(hold_ms=1000, kafka_settings_extra={"message.max.bytes": "1000"})
    warm_up(sender, output, partitions=2)
    soon = utcnow() + timedelta(milliseconds=300)
    sender.send("too-big", soon, value=b"x" * 2000, partition=0)
    sender.send("small", soon + timedelta(milliseconds=100), value=b"small", partition=0)
    sender.flush()
    output.wait_values([b"small"], timeout=20)
    # the refused one is kept (ready or waiting again), never lost; the delivered one is deleted
    wait_for(lambda: [r["id"] for r in db.query("SELECT id FROM pyscheduler.delay_messages")] == ["too-big"],
             10, "only the refused message to remain")


def test_a_late_message_the_broker_refuses_is_stored_and_the_input_moves_on(wired, db):
    sender, output, _, start = wired
    start(hold_ms=1000, kafka_settings_extra={"message.max.bytes": "1000"})
    warm_up(sender, output, partitions=2)
    sender.send("late-big", utcnow() - timedelta(seconds=1), value=b"x" * 2000, partition=0)
    sender.send("late-small", utcnow() - timedelta(seconds=1), value=b"late-small", partition=0)
    sender.flush()
    output.wait_values([b"late-small"], timeout=20)
    # the input was not stalled behind it: a message sent afterwards comes through too
    sender.send("after", utcnow() + timedelta(milliseconds=200), value=b"after", partition=0)
    sender.flush()
    output.wait_values([b"after"], timeout=20)
    # and the refused one is not lost: it waits in the table to be fired (and retried) from there
    wait_for(lambda: [r["id"] for r in db.query("SELECT id FROM pyscheduler.delay_messages")] == ["late-big"],
             10, "the refused late message to be stored")
