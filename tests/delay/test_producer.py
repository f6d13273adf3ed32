"""DelayProducer end to end: producer -> input topic -> a real relay -> PostgreSQL -> output topic;
and what the relay would dead-letter is refused, naming the argument."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from tests.support import wait_for
from tests.support.delay import InProcessRelay, Output, Sender, Topics, fire_time, utcnow, warm_up
from pyscheduler.delay import DelayProducer, DeliveryFailed
from pyscheduler.errors import InvalidArgument


@pytest.fixture
def topics(topic) -> Topics:
    return Topics(input=topic("in"), output=topic("out"), dlq=topic("dlq"))


@pytest.fixture
def relayed(dsn, kafka, topics):
    """A relay on the topics (joined: a warm-up message went through) and a reader of the output."""
    output, dlq = Output(kafka, topics.output), Output(kafka, topics.dlq)
    relay = InProcessRelay(dsn, kafka, topics, timing_advance_ms=50)
    warm_up(Sender(kafka, topics.input), output, partitions=1)
    yield output, dlq
    relay.stop()
    output.close()
    dlq.close()


@pytest.mark.slow
def test_messages_arrive_at_their_deadline_with_key_value_and_headers(kafka, topics, relayed):
    output, dlq = relayed
    berlin = ZoneInfo("Europe/Berlin")
    sent = {}
    with DelayProducer(kafka, topics.input, **{"linger.ms": 1}) as producer:
        for i in range(5):
            deadline = (utcnow() + timedelta(milliseconds=600 + 100 * i)).astimezone(berlin)  # any zone
            sent[f"d{i}".encode()] = deadline
            producer.send(f"d{i}".encode(), key=f"k{i}", deadline=deadline,
                          headers=[("trace", b"t1"), ("note", "ü"), ("empty", None)])
        for i in range(5):
            due = utcnow() + timedelta(milliseconds=600 + 100 * i)
            sent[f"r{i}".encode()] = due
            producer.send(f"r{i}", delay=timedelta(milliseconds=600 + 100 * i), headers={"trace": b"t2"})
    arrived = output.wait_values(sent)
    assert len(arrived) == 10
    for _, msg in arrived:
        value = msg.value()
        assert fire_time(msg) >= sent[value].timestamp() - 0.050 - 0.001  # not before deadline - advance
        if value.startswith(b"d"):
            assert msg.key() == b"k" + value[1:]
            assert msg.headers() == [("trace", b"t1"), ("note", "ü".encode()), ("empty", None)]
        else:
            assert msg.key() is None and msg.headers() == [("trace", b"t2")]
    assert dlq.values() == []


@pytest.mark.slow
def test_the_id_and_deadline_are_stored_as_given(kafka, topics, relayed, db):
    deadline = datetime(2031, 3, 30, 1, 59, 59, 999_999, tzinfo=ZoneInfo("Europe/Berlin"))
    ident = "order-42:" + "x" * 119  # 128 characters
    with DelayProducer(kafka, topics.input) as producer:
        assert producer.send(b"later", deadline=deadline, message_id=ident) == ident
        generated = producer.send(b"later too", delay=timedelta(hours=1))
    assert str(uuid.UUID(generated)) == generated
    rows = wait_for(lambda: len(r := db.query("SELECT id, deadline FROM pyscheduler.delay_messages ORDER BY id"))
                    == 2 and r, 30, "both messages to be stored")
    assert {r["id"]: r["deadline"] for r in rows}[ident] == deadline


def test_what_the_relay_would_dead_letter_is_refused_naming_the_argument(kafka, topics):
    producer = DelayProducer(kafka, topics.input)
    now = datetime.now(timezone.utc)
    for call, field in (
            (lambda: producer.send(b"v", deadline=datetime(2030, 1, 1)), "deadline"),  # naive
            (lambda: producer.send(b"v", deadline=datetime(1969, 12, 31, 23, tzinfo=timezone.utc)), "deadline"),
            (lambda: producer.send(b"v", deadline=datetime(9999, 1, 1, tzinfo=timezone.utc)), "deadline"),
            (lambda: producer.send(b"v", delay=timedelta(days=3_000_000)), "delay"),
            (lambda: producer.send(b"v", delay=-timedelta(days=30_000)), "delay"),
            (lambda: producer.send(b"v", delay=5), "delay"),  # type: ignore[arg-type]
            (lambda: producer.send(b"v"), "delay and deadline"),
            (lambda: producer.send(b"v", delay=timedelta(0), deadline=now), "delay and deadline"),
            (lambda: producer.send(b"v", delay=timedelta(0), message_id="x" * 129), "message_id"),
            (lambda: producer.send(b"v", delay=timedelta(0), message_id=""), "message_id"),
            (lambda: producer.send(b"v", delay=timedelta(0), message_id="a\x00b"), "message_id"),
            # what the relay dead-letters (the input rule): padded, bidi, a newline
            (lambda: producer.send(b"v", delay=timedelta(0), message_id="a "), "message_id"),
            (lambda: producer.send(b"v", delay=timedelta(0), message_id="a\u202eb"), "message_id"),
            (lambda: producer.send(b"v", delay=timedelta(0), message_id="a\nb"), "message_id"),
            (lambda: producer.send(b"v", delay=timedelta(0), headers=[("chronosDeadline", b"2030")]), "headers"),
            (lambda: producer.send(b"v", delay=timedelta(0), headers={"chronosMessageId": "x"}), "headers"),
            (lambda: producer.send(b"v", delay=timedelta(0), headers=[("bad\udcff", b"x")]), "header name"),
            (lambda: producer.send(b"v", delay=timedelta(0), headers=[("h", 5)]), "header 'h'"),  # type: ignore
            (lambda: producer.send(5, delay=timedelta(0)), "value"),  # type: ignore[arg-type]
            (lambda: producer.send(b"v", key="\udcff", delay=timedelta(0)), "key")):
        with pytest.raises(InvalidArgument, match=field):
            call()
    producer.flush(10)  # nothing was sent


def test_messages_the_broker_never_confirms_are_named_by_flush():
    producer = DelayProducer("127.0.0.1:1", "in", **{"message.timeout.ms": 300, "log_level": 0})
    first = producer.send(b"a", delay=timedelta(seconds=1))
    second = producer.send(b"b", delay=timedelta(seconds=1))
    with pytest.raises(DeliveryFailed) as failed:
        producer.flush(10)
    assert [ident for ident, _ in failed.value.failed] == [first, second] and failed.value.pending == 0
    assert first in str(failed.value)
    producer.flush(1)  # reported once
    with pytest.raises(ValueError, match="mine"):  # an exception on its way is not replaced by DeliveryFailed
        with DelayProducer("127.0.0.1:1", "in", **{"message.timeout.ms": 300, "log_level": 0}) as other:
            other.send(b"c", delay=timedelta(seconds=1))
            raise ValueError("mine")
