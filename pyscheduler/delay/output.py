"""Reading a topic back from its start, as the demos, the benches and the tests do: a reader
without a consumer group (``OutputReader``), a fresh read of everything (``fresh_read``: what
counts, as a reader that tailed the topic under load can skip acknowledged messages on the
embedded broker, docs/operations.md), and the warm-up messages that show the relays joined."""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timezone

from .message import delayed_headers


class OutputReader:
    """Reads a topic from the beginning without a consumer group (assign)."""

    def __init__(self, bootstrap: str, topic: str, settings: dict | None = None):
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4().hex[:8]}",
                                  "enable.auto.commit": False, "fetch.wait.max.ms": 50, **(settings or {})})
        meta = self.consumer.list_topics(topic, timeout=10).topics[topic]
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions])

    def messages(self, count: int, timeout: float) -> list:
        """Up to ``count`` raw messages, waiting at most ``timeout`` seconds."""
        got: list = []
        end = time.monotonic() + timeout
        while len(got) < count and time.monotonic() < end:
            got += [m for m in self.consumer.consume(min(10000, count - len(got)), 0.2) if m.error() is None]
        return got

    def read(self, count: int, timeout: float) -> list[tuple[float, bytes]]:
        """(fire time in epoch seconds, value) of up to ``count`` messages."""
        return [(m.timestamp()[1] / 1000.0, m.value()) for m in self.messages(count, timeout)]

    def close(self) -> None:
        self.consumer.close()


def fresh_read(bootstrap: str, topic: str, count: int, idle: float = 0.5, timeout: float = 20,
               settings: dict | None = None) -> list:
    """Every message of ``topic`` read again from the start by a new consumer (assign, no
    group): at least ``count``, then until none came for ``idle`` seconds (or ``timeout``).

    Counts of delivered messages use this, not a consumer that tailed the topic while
    producers wrote it: the embedded broker can skip acknowledged messages for such a
    consumer (docs/operations.md), which would fake a loss or hide one."""
    reader = OutputReader(bootstrap, topic, settings)
    try:
        got: list = []
        end = time.monotonic() + timeout
        last = time.monotonic()
        while time.monotonic() < end:
            batch = [m for m in reader.consumer.consume(10000, 0.1) if m.error() is None]
            if batch:
                got += batch
                last = time.monotonic()
            elif len(got) >= count and time.monotonic() - last >= idle:
                break
        return got
    finally:
        reader.close()


def send_warm_up(producer, topic: str, partitions: int) -> list[bytes]:
    """One due message per input partition; once all came out, every relay has joined the group.
    Returns their values."""
    tag = uuid.uuid4().hex[:8]
    values = [f"warmup-{tag}-{p}".encode() for p in range(partitions)]
    for p, value in enumerate(values):
        producer.produce(topic, value=value, partition=p,
                         headers=delayed_headers(value.decode(), datetime.now(timezone.utc)))
    producer.flush(10)
    return values
