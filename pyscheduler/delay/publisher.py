"""Publishing to Kafka with proof of delivery: ``Publisher.publish`` returns once the broker
confirmed every message (or what it could not deliver), ``Outgoing`` is one message and its
tag, ``DeadLetter`` the tag of a dead letter; ``broker_message_limit`` reads the largest record
the broker takes."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient

from ..db import Outage

log = logging.getLogger("pyscheduler.delay")

# delivery errors that mean the broker could not be reached (rather than that it refused)
UNREACHABLE = {KafkaError._MSG_TIMED_OUT, KafkaError._TIMED_OUT, KafkaError._TRANSPORT,
               KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE}
# delivery errors that are about the message itself (its size or encoding): retrying it cannot
# help, so it is dead-lettered (or dropped with one error log), never retried. Errors about the
# topic or the cluster (authorization, unknown topic, an outage) are retried instead: a
# misconfigured ACL must not send every message to the dead-letter topic.
REFUSED = {KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_RECORD, KafkaError.RECORD_LIST_TOO_LARGE,
           KafkaError.INVALID_MSG, KafkaError.INVALID_MSG_SIZE, KafkaError._BAD_MSG}
# the reports of messages Publisher.publish purged when its time was up
PURGED = {KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT}
# the producer's size limit when the broker does not report its own: Kafka's stock
# message.max.bytes (librdkafka's own default, 1,000,000, is below it)
KAFKA_MESSAGE_MAX_BYTES = 1048588


@dataclass
class DeadLetter:
    """The tag of a dead letter: where the message came from and, for a message refused
    when fired from the table, its row id (deleted once the dead letter is delivered)."""

    source: str
    row_id: str | None = None
    stripped: bool = False  # a refused dead letter sent again without key and value

@dataclass(slots=True)
class Outgoing:
    """One message to publish; ``tag`` comes back with the delivery report."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    tag: Any = None


class Publisher:
    """A producer whose ``publish`` returns once the broker confirmed every message.

    Failed deliveries are retried (with backoff, the outage logged once) until
    they succeed or ``give_up`` says to stop (then the undelivered are returned).
    """

    STOP_GRACE = 5.0

    def __init__(self, settings: dict[str, Any], outage: Outage):
        self.producer = Producer(settings)
        self.outage = outage
        self.last_error: KafkaError | None = None

    def publish(self, items: Sequence[Outgoing], give_up: Callable[[], bool],
                until: float | None = None,
                on_refused: Callable[[Outgoing, KafkaError], None] | None = None) -> list[Outgoing]:
        """Publish all; returns the ones not delivered (empty unless ``give_up`` or
        the monotonic time ``until`` came first; ``last_error`` says why).

        With ``on_refused``, an item refused for itself (REFUSED: too large, invalid)
        is handed to it once and neither retried nor returned.

        The producer reports failed deliveries only (delivery.report.only.error): an item
        is delivered once the producer's queue drained (flush() returned 0) without a
        report for it, so a successful delivery costs no Python call. Every item without
        that proof is returned as not delivered: when time runs out, what is still queued
        or in flight is purged (its reports name it) before returning, so nothing of this
        call can be delivered later, and the caller stores it or leaves it to be retried.
        Once ``give_up`` is true, in-flight deliveries get at most ``STOP_GRACE`` seconds
        (and never past ``until``)."""
        pending = list(items)
        while pending:
            failed: list[tuple[Outgoing, KafkaError]] = []
            report = partial(self._report, failed)
            for item in pending:
                self._produce(item, report)
            stop_by: float | None = None
            left = 1
            while left:
                now = time.monotonic()
                limit = now + 1.0
                if until is not None:
                    limit = min(limit, until)
                if give_up():
                    stop_by = now + self.STOP_GRACE if stop_by is None else stop_by
                    limit = min(limit, stop_by)
                if now >= limit:
                    break
                left = self.producer.flush(limit - now)
            unknown = False
            if left:  # time is up: what is left is purged, each with a failed report
                self.producer.purge()
                unknown = self.producer.flush(1.0) > 0  # reports not all served: nothing is proven
            errors = []
            retry: list[Outgoing] = []
            if unknown:
                refused = [(item, err) for item, err in failed if on_refused is not None and err.code() in REFUSED]
                seen = {id(item) for item, _ in refused}
                failed = refused + [(item, KafkaError(KafkaError._MSG_TIMED_OUT)) for item in pending
                                    if id(item) not in seen]
            for item, err in failed:
                if on_refused is not None and err.code() in REFUSED:
                    on_refused(item, err)
                else:
                    retry.append(item)
                    errors.append(err)
            if not retry:
                if pending:
                    self.outage.ok()
                return []
            if left:  # out of time: why, as the caller needs it (a purge is not the reason)
                real = [e for e in errors if e.code() not in PURGED]
                self.last_error = real[0] if real else KafkaError(KafkaError._MSG_TIMED_OUT)
                return retry
            self.last_error = errors[0]
            if give_up() or (until is not None and time.monotonic() >= until):
                return retry
            pause = self.outage.failed(KafkaException(errors[0]))
            time.sleep(pause if until is None else min(pause, max(0.0, until - time.monotonic())))
            pending = retry
        return []

    @staticmethod
    def _report(failed: list[tuple[Outgoing, KafkaError]], item: Outgoing, err: KafkaError | None,
                _msg: Message | None) -> None:
        """A delivery report: with delivery.report.only.error, only failures come here."""
        if err is not None:
            failed.append((item, err))

    def _produce(self, item: Outgoing, report: Callable) -> None:
        on_delivery = partial(report, item)
        while True:
            try:
                self.producer.produce(item.topic, item.value, item.key, headers=item.headers or None,
                                      on_delivery=on_delivery)
                return
            except BufferError:  # local queue full: serve delivery reports, then retry
                self.producer.poll(0.1)
            except KafkaException as exc:  # refused locally (e.g. too large): a failed delivery
                report(item, exc.args[0], None)
                return

    def close(self, timeout: float = 5.0) -> None:
        """Wait a bounded time for in-flight deliveries, then drop what is left:
        ``publish`` returned those as undelivered, so they are stored or their
        input was not committed."""
        if self.producer.flush(timeout) > 0:
            self.producer.purge()
            self.producer.flush(0)


def broker_message_limit(admin: AdminClient, topic: str) -> int:
    """The largest record the broker takes on ``topic``: the smaller of the broker's
    message.max.bytes and the topic's max.message.bytes, as the broker reports them;
    Kafka's stock default (1,048,588) for what it does not report (e.g. the embedded
    broker) or when describing configs is not allowed."""
    from confluent_kafka.admin import ConfigResource

    limits: list[int] = []
    try:
        brokers = list(admin.list_topics(timeout=5).brokers)
        resources = [ConfigResource(ConfigResource.Type.TOPIC, topic)]
        if brokers:
            resources.append(ConfigResource(ConfigResource.Type.BROKER, str(brokers[0])))
        for future in admin.describe_configs(resources).values():
            config = future.result(timeout=10)
            for name in ("max.message.bytes", "message.max.bytes"):
                entry = config.get(name)
                if entry is not None and entry.value and str(entry.value).isdigit():
                    limits.append(int(entry.value))
    except Exception as exc:  # an old broker, missing DescribeConfigs rights: the stock default
        log.info("could not read the broker's message size limit (%s); using %d bytes", exc,
                 KAFKA_MESSAGE_MAX_BYTES)
    return min(limits) if limits else KAFKA_MESSAGE_MAX_BYTES

