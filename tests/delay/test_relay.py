"""The delay-queue relay end to end: input topic -> PostgreSQL -> output topic."""

from __future__ import annotations

import logging
import time
import uuid
from datetime import timedelta

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.support import wait_for
from tests.support.delay import InProcessRelay, Output, Sender, Topics, fire_time, utcnow, warm_up
from pyscheduler.delay.message import Malformed, parse_deadline
from pyscheduler.delay.publisher import KAFKA_MESSAGE_MAX_BYTES
from pyscheduler.delay.relay import DEAD_LETTERED, DROPPED, RelayConfig
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


@pytest.mark.slow
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
        assert arrival is None or arrival >= deadline - 0.050
        assert fire_time(msg) < deadline + 1.0  # and not absurdly late on an idle machine
        i = msg.value().decode()[1:]
        assert msg.key() == f"key-{i}".encode()
        assert msg.headers() == [("trace", b"t1"), ("binary", b"\x00\xff\xfe"), ("trace", b"t2"), ("empty", None)]
    assert wait_for(lambda: db.query("SELECT count(*) AS n FROM pyscheduler.delay_messages")[0]["n"] == 0 or None,
                    10, "fired messages to be deleted")


@pytest.mark.slow
def test_a_message_stored_below_the_fire_loops_mark_is_fired_by_the_rescan(wired, db):
    """The fire loop claims from its latest claimed deadline minus MARK_SLACK on (skipping the
    index entries fired messages leave behind); a message stored with an earlier deadline
    behind its back (here straight into the table, 10 s overdue, as a peer's store_late would)
    is still fired: a claim from the start of the index comes at least every RESCAN_S."""
    sender, output, _, start = wired
    start()
    warm_up(sender, output, partitions=2)
    deadline = utcnow() + timedelta(milliseconds=300)
    sender.send("recent", deadline, value=b"recent")
    sender.flush()
    output.wait_values([b"recent"])  # the fire loop's mark is now about this deadline
    db.call("enqueue_messages", ids=["old"], deadlines=[utcnow() - timedelta(seconds=10)], vals=[b"old"],
            store_late=True)
    stored = time.monotonic()
    output.wait_values([b"old"], timeout=30)
    assert time.monotonic() - stored < 15  # RESCAN_S (2 s) on a loaded machine, not "never"


def test_deadline_formats_of_the_seed_are_accepted():
    assert parse_deadline(b"2022-12-01T11:09:01.123").isoformat() == "2022-12-01T11:09:01.123000+00:00"
    assert parse_deadline(b"2022-12-01T11:09:01Z").isoformat() == "2022-12-01T11:09:01+00:00"
    assert parse_deadline(b"2022-12-01T13:09:01.5+02:00").timestamp() == parse_deadline(
        b"2022-12-01T11:09:01.5").timestamp()


@pytest.mark.parametrize("raw", ["2030-01-01T06:50:00z", "2030-01-01t06:50:00.25z", "2016-12-31T23:59:60Z",
                                 "2016-12-31T23:59:60.000Z", "20161231T235960Z", "2030-06-30T12:34:60+02:00",
                                 "2016-12-31 23:59:60"])
def test_a_lowercase_z_and_a_leap_second_are_read_as_postgresql_reads_them(tx, raw):
    """RFC 3339 allows ``z``; a leap second counts as the next second (PostgreSQL's reading).
    Both were dead-lettered as not ISO-8601 (datetime.fromisoformat refuses them)."""
    tx.execute("SET TIME ZONE 'UTC'")  # no offset means UTC, to the relay and to this session
    assert parse_deadline(raw.encode()) == tx.execute("SELECT %s::timestamptz AS t", (raw,)).fetchone()["t"]


@pytest.mark.parametrize("raw", ["2016-12-31T23:59:60.5Z", "2016-12-31T23:59:61Z", "2016-12-31T23:60:00Z"])
def test_a_leap_second_with_a_fraction_or_a_61st_second_is_malformed_as_postgresql_refuses_it(tx, raw):
    with pytest.raises(Malformed, match="not an ISO-8601"):
        parse_deadline(raw.encode())
    with pytest.raises(psycopg.Error) as info:
        tx.execute("SELECT %s::timestamptz", (raw,))
    assert info.value.sqlstate == "22008"


@pytest.mark.slow
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
    fired = [m.value() for m in output.fresh(3) if m.value() in (b"first", b"second", b"third")]
    assert len(fired) == 1 and fired[0] != b"third"  # one copy; the later one on its partition was a duplicate
    # fired, hence forgotten: the same id is scheduled again
    sender.send("same", utcnow() + timedelta(milliseconds=300), value=b"again")
    sender.flush()
    output.wait_values([b"again"])


@pytest.mark.slow
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


@pytest.mark.slow
def test_malformed_messages_are_dead_lettered_while_their_neighbours_arrive(wired, kafka, topics, caplog):
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
        b"year-1": ("x3", "0001-01-01T00:00:00+01:00"),              # BC in UTC
        b"year-10000": ("x4", "9999-12-31T23:59:59.9999999-05:00"),  # year 10000 in UTC
        # ids the database refuses (the input rule, issue 27 B): judged here, so no batch is refused
        b"newline-id": ("x7\nx", soon), b"bidi-id": ("x8\u202ex", soon), b"padded-id": ("x9 ", soon),
    }
    # all on one partition, interleaved with good ones: one batch
    sender.send("good-1", soon, value=b"good-1", partition=0)
    for value, (mid, deadline) in bad.items():
        sender.send(mid, deadline, value=value, partition=0)
    sender.send(None, None, value=b"two-ids", partition=0, raw_headers=[
        ("chronosMessageId", b"x5"), ("chronosDeadline", soon.isoformat().encode()), ("chronosMessageId", b"x6")])
    bad[b"two-ids"] = None
    sender.send("good-2", naive, value=b"good-2", partition=0)
    sender.send("good-3", offset, value=b"good-3", partition=0)
    sender.flush()
    output.wait_values([b"good-1", b"good-2", b"good-3"])
    dead = {m.value(): m for _, m in dlq.wait_values(bad)}
    assert len(dead) == 11
    reasons = {v: dict(m.headers())["pyscheduler.delay.error"].decode() for v, m in dead.items()}
    assert "chronosMessageId is missing" in reasons[b"no-id"]
    assert "chronosDeadline is missing" in reasons[b"no-deadline"]
    assert "ISO-8601" in reasons[b"bad-deadline"]
    assert "longer than 128" in reasons[b"long-id"]
    assert "empty" in reasons[b"empty-id"]
    assert "outside the supported range" in reasons[b"year-1"] and "outside" in reasons[b"year-10000"]
    assert "chronosMessageId appears 2 times" in reasons[b"two-ids"]
    assert "zero-width or bidirectional" in reasons[b"newline-id"] and "bidirectional" in reasons[b"bidi-id"]
    assert "white space" in reasons[b"padded-id"]
    assert not [r for r in caplog.records if "rejected" in r.getMessage()]  # the good ones' batch went through
    source = dict(dead[b"no-id"].headers())["pyscheduler.delay.source"].decode()
    assert source.startswith(f"{topics.input}/0/")
    # the offsets of the whole batch are committed: nothing is read again
    # (partition 0 holds 1 warm-up + 14 messages; tansu's high watermark is not reliable, so count)
    consumer = Consumer({"bootstrap.servers": kafka, "group.id": topics.group})
    try:
        wait_for(lambda: consumer.committed([TopicPartition(topics.input, 0)], timeout=10)[0].offset == 15,
                 10, "the input offsets to be committed")
    finally:
        consumer.close()
    assert relay.thread.is_alive()


@pytest.mark.slow
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
    fired = [m.value() for m in output.fresh(len(values)) if m.value() in set(values)]
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


@pytest.mark.parametrize("settings, match", [
    (dict(hold_ms=1), "hold-ms must be at least 1000"),                  # would re-fire everything constantly
    (dict(hold_ms=999), "hold-ms must be at least 1000"),
    (dict(hold_ms=1500, poll_ms=1000), "hold-ms must be at least 2000"),  # twice the poll interval
    (dict(hold_ms=3000, detect_ms=2000), "hold-ms must be at least 4000"),  # twice the detect interval
    (dict(hold_ms=5000, kafka_settings={"message.timeout.ms": "5000"}), "half the hold time"),
    (dict(hold_ms=5000, kafka_settings={"delivery.timeout.ms": "60000"}), "half the hold time"),
    (dict(timing_advance_ms=60_001), "timing-advance-ms must be at most 60000"),
])
def test_the_hold_time_is_validated_against_poll_detect_and_delivery_timeout(settings, match):
    with pytest.raises(ConfigError, match=match):
        RelayConfig(dsn="x", bootstrap_servers="y", input_topic="i", output_topic="o", **settings)
    RelayConfig(dsn="x", bootstrap_servers="y", input_topic="i", output_topic="o", hold_ms=1000, poll_ms=500,
                detect_ms=500, kafka_settings={"message.timeout.ms": "500"})  # the edge is allowed


def test_deadlines_outside_the_supported_range_are_malformed():
    for raw in (b"0001-01-01T00:00:00+01:00", b"9999-12-31T23:59:59.9999999-05:00", b"1969-12-31T23:59:59Z",
                b"9999-01-01T00:00:00Z"):
        with pytest.raises(Malformed, match="outside the supported range"):
            parse_deadline(raw)
    assert parse_deadline(b"1970-01-01T00:00:00Z").timestamp() == 0
    assert parse_deadline(b"9998-12-31T23:59:59.999999Z").year == 9998


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # kafka-python's importlib.resources use
def test_a_header_name_that_is_not_utf8_is_dead_lettered_and_the_batch_goes_on(wired, kafka, topics):
    """confluent-kafka's msg.headers() raises for it; one message is malformed, never the batch."""
    from kafka import KafkaProducer

    class RawName(str):  # kafka-python writes a header name as name.encode("utf-8"): these bytes instead
        def __new__(cls, raw: bytes):
            name = super().__new__(cls, raw.decode("latin-1"))
            name.raw = raw
            return name

        def encode(self, *args, **kwargs) -> bytes:
            return self.raw

    sender, output, dlq, start = wired
    relay = start()
    warm_up(sender, output, partitions=2)
    soon = utcnow() + timedelta(milliseconds=400)
    chronos = [("chronosDeadline", soon.isoformat().encode())]
    producer = KafkaProducer(bootstrap_servers=kafka, linger_ms=50)
    try:
        for i, name in enumerate([None, RawName(b"\xff\xfe"), None]):
            extra = [(name, b"v")] if name is not None else []
            producer.send(topics.input, value=f"n{i}".encode(), key=b"k", partition=0,
                          headers=[("chronosMessageId", f"n{i}".encode()), *chronos, *extra])
        producer.flush(10)
    finally:
        producer.close()
    output.wait_values([b"n0", b"n2"], timeout=20)
    (letter,) = [m for _, m in dlq.wait_values([b"n1"], timeout=20)]
    assert letter.key() == b"k"
    assert "unreadable headers" in dict(letter.headers())["pyscheduler.delay.error"].decode()
    assert relay.thread.is_alive()


def counted() -> tuple[float, float]:
    """(dead letters confirmed, messages dropped) so far in this process."""
    return DEAD_LETTERED._value.get(), DROPPED._value.get()


@pytest.mark.slow
def test_a_message_the_broker_refuses_is_dead_lettered_once_and_deleted(wired, db, caplog):
    sender, output, dlq, start = wired
    before = counted()
    # this node's producer refuses messages over 1000 bytes (as a broker would a too-large record)
    start(hold_ms=1000, kafka_settings_extra={"message.max.bytes": "1000"})
    warm_up(sender, output, partitions=2)
    soon = utcnow() + timedelta(milliseconds=300)
    sender.send("too-big", soon, value=b"x" * 2000, key=b"k", partition=0, headers=[("trace", b"t")])
    sender.send("small", soon + timedelta(milliseconds=100), value=b"small", partition=0)
    sender.flush()
    output.wait_values([b"small"], timeout=20)
    # dead-lettered (the dead letter is too large as well: sent without key and value) and deleted
    wait_for(lambda: db.query("SELECT id FROM pyscheduler.delay_messages") == [], 10, "the table to be empty")
    (letter,) = wait_for(lambda: dlq.fresh(1), 10, "the dead letter")
    headers = dict(letter.headers())
    assert headers["chronosMessageId"] == b"too-big" and headers["trace"] == b"t"
    assert "refused" in headers["pyscheduler.delay.error"].decode()
    assert headers["pyscheduler.delay.value-size"] == b"2001" and letter.value() is None
    # once: after several hold times, still one dead letter and one error log
    sender.send("marker", utcnow() + timedelta(milliseconds=2500), value=b"marker", partition=0)
    sender.flush()
    output.wait_values([b"marker"], timeout=20)
    assert len(dlq.fresh(1, idle=1.0)) == 1
    assert sum("the broker refused it" in r.getMessage() for r in caplog.records) == 1
    # the metrics: one dead letter on the topic, nothing dropped
    assert counted() == (before[0] + 1, before[1])


@pytest.mark.slow
def test_a_late_message_the_broker_refuses_is_dropped_with_one_error_and_the_input_moves_on(wired, db, caplog):
    sender, output, _, start = wired
    before = counted()
    start(hold_ms=1000, kafka_settings_extra={"message.max.bytes": "1000"}, dlq_topic=None)
    warm_up(sender, output, partitions=2)
    sender.send("late-big", utcnow() - timedelta(seconds=1), value=b"x" * 2000, partition=0)
    sender.send("late-small", utcnow() - timedelta(seconds=1), value=b"late-small", partition=0)
    sender.flush()
    output.wait_values([b"late-small"], timeout=20)
    # the input was not stalled behind it: a message sent afterwards comes through too
    sender.send("after", utcnow() + timedelta(milliseconds=1500), value=b"after", partition=0)
    sender.flush()
    output.wait_values([b"after"], timeout=20)
    # no dead-letter topic: dropped with one error log, never stored to be retried
    assert db.query("SELECT id FROM pyscheduler.delay_messages") == []
    errors = [r for r in caplog.records if "late-big" in r.getMessage()]
    assert len(errors) == 1 and errors[0].levelname == "ERROR" and "dropped" in errors[0].getMessage()
    assert counted() == (before[0], before[1] + 1)  # counted as dropped, not as dead-lettered


@pytest.mark.slow
def test_the_producer_size_limit_is_the_brokers_not_librdkafkas_lower_default(wired, kafka, topics, db):
    """librdkafka's message.max.bytes (1,000,000) is below a broker's (1,048,588 by default):
    a message the broker takes on the input is delivered on the output."""
    sender, output, _, start = wired
    relay = start()
    warm_up(sender, output, partitions=2)
    assert relay.relay.max_message_bytes == KAFKA_MESSAGE_MAX_BYTES  # tansu reports no limit
    big = Sender(kafka, topics.input, **{"message.max.bytes": 2_000_000})
    value = b"b" * 1_040_000
    big.send("big", utcnow() + timedelta(milliseconds=500), value=value, partition=0)
    big.send("big-late", utcnow() - timedelta(seconds=1), value=value + b"!", partition=1)
    big.flush()
    output.wait_values([value, value + b"!"], timeout=30)
    assert db.query("SELECT id FROM pyscheduler.delay_messages") == []


@pytest.mark.slow
def test_a_relay_logged_in_with_only_the_relay_role_does_its_whole_job(wired, kafka, topics, dsn, conn, db,
                                                                        caplog):
    """Item 19: relays have their own role (task workers get nothing of the delay queue)."""
    from psycopg.conninfo import make_conninfo

    name = f"relay_{uuid.uuid4().hex[:8]}"
    conn.execute(f'CREATE ROLE "{name}" LOGIN')
    conn.execute(f'GRANT pyscheduler_relay TO "{name}"')
    sender, output, _, _ = wired
    caplog.set_level(logging.WARNING, logger="pyscheduler.delay")
    relay = InProcessRelay(make_conninfo(dsn, user=name), kafka, topics, hold_ms=1000)
    try:
        warm_up(sender, output, partitions=2)
        sender.send("future", utcnow() + timedelta(milliseconds=500), value=b"future")
        sender.send("late", utcnow() - timedelta(seconds=1), value=b"late")
        sender.flush()
        output.wait_values([b"future", b"late"], timeout=20)
        wait_for(lambda: db.query("SELECT count(*) AS n FROM pyscheduler.delay_messages")[0]["n"] == 0, 10,
                 "the fired message to be deleted")
    finally:
        relay.stop()  # raises what a loop crashed with
        conn.execute(f'DROP OWNED BY "{name}"')
        conn.execute(f'DROP ROLE "{name}"')
    # enqueue, claim, delete, reset_stuck (every 100 ms) and the backlog view all went through
    assert not [r.getMessage() for r in caplog.records if "unavailable" in r.getMessage()]


@pytest.mark.slow
def test_an_enqueue_refused_for_a_missing_function_dead_letters_nothing(wired, conn):
    """Only a data error is a message's fault (dead-lettered alone). A missing function or
    privilege is the deployment's: the node crashes with its offsets uncommitted (run_daemons
    restarts it) and, once fixed, every message arrives; none was dead-lettered."""
    sender, output, dlq, start = wired
    relay = start()
    warm_up(sender, output, partitions=2)
    conn.execute("ALTER FUNCTION pyscheduler.enqueue_messages RENAME TO enqueue_messages_gone")
    soon = utcnow() + timedelta(milliseconds=300)
    for i in range(3):
        sender.send(f"gone-{i}", soon, value=f"gone-{i}".encode(), partition=0)
    sender.flush()
    wait_for(lambda: not relay.thread.is_alive(), 30, "the node to stop on the missing function")
    assert relay.error is not None and getattr(relay.error, "sqlstate", None) == "42883"
    conn.execute("ALTER FUNCTION pyscheduler.enqueue_messages_gone RENAME TO enqueue_messages")
    start()  # what run_daemons does: a fresh node
    output.wait_values([b"gone-0", b"gone-1", b"gone-2"])
    assert dlq.fresh(0, idle=0.5, timeout=5) == []
