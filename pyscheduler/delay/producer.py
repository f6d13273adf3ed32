"""Publish to the delay queue's input topic (seeds/chronos.md), over confluent-kafka::

    with DelayProducer("localhost:9092", "pyscheduler.delay.input") as producer:
        producer.send(b'{"order": 42}', key=b"42", delay=timedelta(minutes=5))

``send`` sets the Chronos headers and refuses, naming the argument, what the relay would
dead-letter (docs/python-api.md, "Delay queue"). The message reaches the output topic with
the same key, value and other headers no earlier than the deadline minus the relay's timing
advance, at least once.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from ..calls import aware, duration, label_refusal, text
from ..errors import InvalidArgument, SchedulerError
from . import sqlapi as sql
from .message import HEADER_DEADLINE, HEADER_ID, delayed_headers

__all__ = ["DelayProducer", "DeliveryFailed"]

Bytes = bytes | str | None
Headers = Sequence[tuple[str, Bytes]] | Mapping[str, Bytes]


class DeliveryFailed(SchedulerError):
    """Messages the broker did not confirm: ``failed`` lists (message id, reason), ``pending``
    how many were still waiting when ``flush`` timed out."""

    def __init__(self, failed: list[tuple[str, str]], pending: int):
        shown = ", ".join(f"{ident} ({why})" for ident, why in failed[:5]) + (" ..." if len(failed) > 5 else "")
        parts = [f"{len(failed)} message(s) not delivered: {shown}"] if failed else []
        if pending:
            parts.append(f"{pending} message(s) still waiting for the broker")
        super().__init__("; ".join(parts))
        self.failed = failed
        self.pending = pending


def _bytes(name: str, raw: Any) -> bytes | None:
    if raw is None or isinstance(raw, bytes):
        return raw
    if isinstance(raw, str):
        try:
            return raw.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(f"{name} is not valid Unicode (a lone surrogate)") from None
    raise InvalidArgument(f"{name} must be bytes, str or None, got {type(raw).__name__}")


class DelayProducer:
    """A confluent-kafka producer for the delay queue's input ``topic``; ``kafka_settings`` are
    librdkafka settings, e.g. ``DelayProducer(bootstrap, topic, **{"linger.ms": 5})``."""

    def __init__(self, bootstrap: str, topic: str, **kafka_settings: Any) -> None:
        self.topic = str(text("topic", topic))
        self._producer = Producer({"bootstrap.servers": bootstrap, **kafka_settings})
        self._failed: list[tuple[str, str]] = []

    def send(self, value: Bytes, *, key: Bytes = None, delay: timedelta | None = None,
             deadline: datetime | None = None, message_id: str | None = None, headers: Headers | None = None) -> str:
        """Publish ``value`` (with ``key`` and ``headers``) to appear on the output topic at
        ``deadline`` (an aware datetime) or after ``delay`` from now: exactly one of them.
        ``message_id`` (default: a new uuid) makes a resend idempotent while the first copy
        waits. Returns the message id. Delivery is asynchronous: ``flush`` waits for it."""
        if (delay is None) == (deadline is None):
            raise InvalidArgument("give exactly one of delay and deadline")
        if delay is not None:
            try:
                deadline = datetime.now(timezone.utc) + duration("delay", delay)
            except OverflowError:
                raise InvalidArgument(f"delay {delay!r} puts the deadline outside [1970, 9999)") from None
            aware("delay", deadline)  # now + delay, in the relay's range
        at = aware("deadline", deadline).astimezone(timezone.utc)
        ident = str(uuid.uuid4()) if message_id is None else str(text("message_id", message_id))
        if not 1 <= len(ident) <= sql.MAX_ID_LENGTH:
            raise InvalidArgument(f"message_id must have 1..{sql.MAX_ID_LENGTH} characters, got {len(ident)}")
        why = label_refusal(ident, sql.MAX_ID_BYTES)  # what the relay would dead-letter
        if why is not None:
            raise InvalidArgument(f"message_id {why}, got {ident[:64]!r}")
        out: list[tuple[str, str | bytes | None]] = list(delayed_headers(ident, at))
        pairs = headers.items() if isinstance(headers, Mapping) else (headers or ())
        for name, raw in pairs:
            text("header name", name)
            if name in (HEADER_ID, HEADER_DEADLINE):
                raise InvalidArgument(f"headers must not contain {name}: the producer sets it")
            out.append((name, _bytes(f"header {name!r}", raw)))
        payload, partition_key = _bytes("value", value), _bytes("key", key)

        def delivered(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                self._failed.append((ident, str(err.str())))

        while True:
            try:
                self._producer.produce(self.topic, value=payload, key=partition_key, headers=out,
                                       on_delivery=delivered)
                break
            except BufferError:  # the local queue is full: serve delivery reports, then try again
                self._producer.poll(0.1)
        self._producer.poll(0)
        return ident

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until the broker confirmed every message sent; DeliveryFailed names those it did
        not (and counts those still waiting after ``timeout`` seconds)."""
        pending = self._producer.flush(timeout)
        failed, self._failed = self._failed, []
        if failed or pending:
            raise DeliveryFailed(failed, pending)

    def __enter__(self) -> DelayProducer:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        """Flush; a DeliveryFailed does not replace an exception already on its way."""
        try:
            self.flush()
        except DeliveryFailed:
            if kind is None:
                raise
