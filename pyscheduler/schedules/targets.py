"""Firing one occurrence: Kafka, HTTP (task targets are fired in SQL, fire_task_schedules).

Every try of an occurrence carries the same idempotency key
``<schedule id>:<expected epoch ms>`` (Kafka header ``pyscheduler-idempotency-key``,
HTTP header ``Idempotency-Key``), so a receiver can drop the duplicate that a
retry after a timeout or a crash recovery may cause.
"""

from __future__ import annotations

import logging
import random
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from .index import idempotency_key

log = logging.getLogger("pyscheduler.schedules")

KAFKA_KEY_HEADER = "pyscheduler-idempotency-key"
KAFKA_SCHEDULE_HEADER = "pyscheduler-schedule"
KAFKA_EXPECTED_HEADER = "pyscheduler-expected-at"  # expected fire time, epoch ms
HTTP_KEY_HEADER = "Idempotency-Key"


@dataclass(slots=True)
class Details:
    """What an executor needs to fire a schedule (fire_details), cached by version."""

    id: int
    name: str
    kind: str  # kafka | http | task
    target: str
    body: bytes  # the payload's JSON text, sent as it is
    retry_attempts: int
    retry_base: float  # seconds
    retry_jitter: float  # seconds
    critical: bool
    active: bool  # has a due time (a paused schedule only for a pending trigger)
    paused: bool
    catchup_ms: int  # an occurrence older than this is recorded as missed, not fired
    name_b: bytes = b""  # the Kafka message key

    @classmethod
    def from_row(cls, row: dict) -> "Details":
        """From a fire_details row (JSON text payload, durations in ms)."""
        name = row["name"] or ""
        payload = row["payload"]
        catchup = row["catchup_window_ms"]
        return cls(row["id"], name, row["target_kind"], row["target"], payload.encode() if payload else b"",
                   row["retry_attempts"] or 0, (row["retry_base_ms"] or 0) / 1000, (row["retry_jitter_ms"] or 0) / 1000,
                   bool(row["critical"]), bool(row["active"]), bool(row["paused"]),
                   60000 if catchup is None else catchup, name.encode())


def retry_delay(retry: int, base: float, jitter: float, rand: Callable[[], float] = random.random) -> float:
    """Seconds before retry ``retry`` (0-based): base * 2^retry + random(0, jitter) (the seed)."""
    return base * (2 ** retry) + rand() * jitter


@dataclass(slots=True)
class Occurrence:
    """One claimed occurrence of a schedule, from claim to record."""

    id: int
    expected_ms: int
    details: Details | None = None
    tries: int = 0
    token: Any = None  # claim token of the Postgres-only claim (degraded mode)
    error: str | None = None
    fired_at_ms: int | None = None
    claimed_at: float = 0.0  # monotonic, for claim refreshes

    @property
    def key(self) -> str:
        return idempotency_key(self.id, self.expected_ms)


Done = Callable[[Occurrence, str | None], None]  # (occurrence, error or None)


@dataclass
class Firer:
    """Sends occurrences to Kafka and HTTP targets; ``done`` is called once per try."""

    kafka_settings: dict[str, Any] = field(default_factory=dict)  # bootstrap.servers etc., or empty
    timeout: float = 10.0
    http_concurrency: int = 16
    _producer: Producer | None = None
    _pool: ThreadPoolExecutor | None = None
    _http_pending: int = 0
    _fatal: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def fire(self, occ: Occurrence, done: Done) -> None:
        occ.tries += 1
        kind = occ.details.kind
        if kind == "kafka":
            self._kafka(occ, done)
        elif kind == "http":
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.http_concurrency, thread_name_prefix="schedules-http")
            with self._lock:
                self._http_pending += 1
            self._pool.submit(self._http, occ, done)
        else:
            done(occ, f"target kind {kind!r} is not fired by the executor")

    # -- Kafka ---------------------------------------------------------------------

    def producer(self) -> Producer:
        if self._fatal and self._producer is not None:
            log.warning("Kafka producer hit a fatal error: replacing it (occurrences in flight are retried)")
            self._producer.purge()  # what it still holds is reported failed (and retried)
            self._producer.flush(0)
            self._producer, self._fatal = None, False
        if self._producer is None:
            if not self.kafka_settings.get("bootstrap.servers"):
                raise KafkaException(KafkaError(KafkaError._INVALID_ARG, "no Kafka configured"))
            ms = int(self.timeout * 1000)
            # idempotent: a batch librdkafka re-sends after a request timeout is written once
            # (without it, an overloaded broker produced the same occurrence twice)
            self._producer = Producer({"enable.idempotence": True, "linger.ms": 5, "batch.num.messages": 10000,
                                       "queue.buffering.max.messages": 1_000_000,
                                       "message.timeout.ms": ms, "request.timeout.ms": min(ms, 30000),
                                       "logger": log, **self.kafka_settings})
        return self._producer

    def fire_kafka(self, occs: list[Occurrence], done: Done) -> None:
        """Fire many Kafka occurrences: the executor's hot path (one producer lookup per batch,
        the message built inline); a full local queue or a refusal takes the one-by-one path."""
        try:
            produce = self.producer().produce
        except KafkaException:
            for occ in occs:
                self.fire(occ, done)  # reports the error per occurrence
            return
        for occ in occs:
            d = occ.details
            expected = str(occ.expected_ms)
            occ.tries += 1
            try:
                produce(d.target, d.body, d.name_b, on_delivery=self._report(occ, done),
                        headers=[(KAFKA_KEY_HEADER, f"{occ.id}:{expected}".encode()), (KAFKA_SCHEDULE_HEADER, d.name_b),
                                 (KAFKA_EXPECTED_HEADER, expected.encode())])
            except (BufferError, KafkaException):
                occ.tries -= 1
                self.fire(occ, done)

    def _report(self, occ: Occurrence, done: Done) -> Callable[[KafkaError | None, Any], None]:
        def report(err: KafkaError | None, _msg: Any) -> None:
            if err is not None and err.fatal():
                self._fatal = True  # the idempotent producer cannot go on: a new one for the next tries
            done(occ, None if err is None else f"kafka: {err.str()}")
        return report

    def _kafka(self, occ: Occurrence, done: Done) -> None:
        d = occ.details
        expected = str(occ.expected_ms)
        headers = [(KAFKA_KEY_HEADER, f"{occ.id}:{expected}".encode()), (KAFKA_SCHEDULE_HEADER, d.name_b),
                   (KAFKA_EXPECTED_HEADER, expected.encode())]
        report = self._report(occ, done)
        try:
            producer = self.producer()
        except KafkaException as exc:
            done(occ, f"kafka: {exc.args[0].str()}")
            return
        while True:
            try:
                producer.produce(d.target, d.body, d.name_b, headers=headers, on_delivery=report)
                return
            except BufferError:  # local queue full: serve delivery reports first
                producer.poll(0.05)
            except KafkaException as exc:  # refused locally (unknown topic, too large)
                done(occ, f"kafka: {exc.args[0].str()}")
                return

    def poll(self, timeout: float = 0.0) -> int:
        """Serve Kafka delivery reports (calls ``done``); waits up to ``timeout`` for one."""
        return self._producer.poll(timeout) if self._producer is not None else 0

    def kafka_in_flight(self) -> int:
        return len(self._producer) if self._producer is not None else 0

    def in_flight(self) -> int:
        """Tries sent and not answered yet (Kafka deliveries, HTTP requests)."""
        return self.kafka_in_flight() + self._http_pending

    # -- HTTP ----------------------------------------------------------------------

    def _http(self, occ: Occurrence, done: Done) -> None:
        d = occ.details
        req = urllib.request.Request(d.target, data=d.body, method="POST", headers={
            "Content-Type": "application/json", HTTP_KEY_HEADER: occ.key,
            "X-Pyscheduler-Schedule": d.name, "X-Pyscheduler-Expected-At": str(occ.expected_ms)})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                resp.read()
            error = None
        except urllib.error.HTTPError as exc:
            error = f"http: status {exc.code}"
        except Exception as exc:  # URLError, timeout, connection reset: all worth a retry
            error = f"http: {type(exc).__name__}: {exc}"
        with self._lock:
            self._http_pending -= 1
        done(occ, error)

    def close(self, timeout: float = 5.0) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=False)
            self._pool = None
        if self._producer is not None:
            self._producer.flush(timeout)
            self._producer = None
