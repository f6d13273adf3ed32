"""Firing one occurrence: Kafka, HTTP (task targets are fired in SQL, fire_task_schedules).

``Firer`` sends each try with the occurrence's idempotency key (``<schedule id>:<expected
epoch ms>``: Kafka header ``pyscheduler-idempotency-key``, HTTP ``Idempotency-Key``) and
ends it with a report (``done``), never an exception: a value a client library refuses is a
failed try. HTTP goes through the egress policy (``pyscheduler.egress.post``) with a
bounded number of requests per host; the Kafka producer is replaced after a fatal error or
a delivery timeout without deliveries. ``Details`` is what fires a schedule (``fire_details``),
``Occurrence`` one claimed occurrence. Why: docs/operations.md, "Schedule daemons".
"""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from .. import egress
from .index import idempotency_key

log = logging.getLogger("pyscheduler.schedules")

KAFKA_KEY_HEADER = "pyscheduler-idempotency-key"
KAFKA_SCHEDULE_HEADER = "pyscheduler-schedule"
KAFKA_EXPECTED_HEADER = "pyscheduler-expected-at"  # expected fire time, epoch ms
HTTP_KEY_HEADER = "Idempotency-Key"
# how long librdkafka waits for a topic it does not know to appear before it fails the message
# (its default, 30 s, outlasts the delivery timeout); kafka_settings may set another
TOPIC_WAIT_MS = 1000
_NO_TOPIC = (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC)
HTTP_SCHEDULE_HEADER = "X-Pyscheduler-Schedule"
_EXT_VALUE = "UTF-8''"  # RFC 8187 ext-value prefix


def kafka_error(err: object, topic: str) -> str:
    """A failed Kafka try as executions record it (last_error); a missing topic is named, with the fix."""
    if isinstance(err, KafkaError) and err.code() in _NO_TOPIC:
        return (f"kafka: topic {topic!r} does not exist and the broker does not create topics on first use: "
                f"create it (kafka-topics.sh --create --topic {topic}); tries fail until it exists")
    return f"kafka: {err.str() if isinstance(err, KafkaError) else err}"


def schedule_header(name: str) -> str:
    """The value of ``X-Pyscheduler-Schedule``: the name itself when it is printable ASCII
    without leading or trailing white space, else the RFC 8187 ext-value ``UTF-8''`` +
    the name's UTF-8 bytes percent-encoded (``urllib.parse.unquote`` of the rest gives
    the name back). A value that starts with ``UTF-8''`` is always encoded."""
    if name.isascii() and name.isprintable() and name == name.strip() and not name.startswith(_EXT_VALUE):
        return name
    return _EXT_VALUE + urllib.parse.quote(name, safe="!#$&+-.^_`|~")


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
    # the last try was refused by the egress policy before any connection: every try would
    # be, until an admin changes the allow-list, so the occurrence fails without retries
    refused: bool = False
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
    http_concurrency: int = 64  # HTTP requests in flight in all (threads)
    http_per_host: int = 4  # ... to one host (scheme, host, port)
    http_queue_per_host: int = 1000  # tries waiting for a slot of one host; more fail at once
    allow: tuple = ()  # egress allow-list (networks), from http_allow()
    _producer: Producer | None = None
    _retired: list = field(default_factory=list)  # replaced producers with reports still due
    _replace: str | None = None  # why the producer must be replaced before the next produce
    _last_ok: float = 0.0  # monotonic time of the last successful delivery
    _pool: ThreadPoolExecutor | None = None
    _http_pending: int = 0  # HTTP tries queued or in flight
    _http_active: dict = field(default_factory=dict)  # host -> requests in flight
    _http_queued: dict = field(default_factory=dict)  # host -> deque of (occ, done) waiting
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def fire(self, occ: Occurrence, done: Done) -> None:
        occ.tries += 1
        kind = occ.details.kind
        if kind == "kafka":
            self._kafka(occ, done)
        elif kind == "http":
            self._http(occ, done)
        else:
            done(occ, f"target kind {kind!r} is not fired by the executor")

    # -- Kafka ---------------------------------------------------------------------

    def producer(self) -> Producer:
        if self._replace is not None:
            self._retire()
        if self._producer is None:
            if not self.kafka_settings.get("bootstrap.servers"):
                raise KafkaException(KafkaError(KafkaError._INVALID_ARG, "no Kafka configured"))
            ms = int(self.timeout * 1000)
            # idempotent: a batch librdkafka re-sends after a request timeout is written once
            # (without it, an overloaded broker produced the same occurrence twice)
            self._producer = Producer({"enable.idempotence": True, "linger.ms": 5, "batch.num.messages": 10000,
                                       "queue.buffering.max.messages": 1_000_000,
                                       "message.timeout.ms": ms, "request.timeout.ms": min(ms, 30000),
                                       "topic.metadata.propagation.max.ms": min(ms, TOPIC_WAIT_MS),
                                       "logger": log, "error_cb": self._on_error, **self.kafka_settings})
            self._last_ok = time.monotonic()
        return self._producer

    def _on_error(self, err: KafkaError) -> None:
        """librdkafka's error callback (served by poll/flush): a fatal error ends the producer."""
        if err.fatal():
            self._replace = f"fatal error {err.str()}"

    def _retire(self) -> None:
        """Replace the producer: what it still holds is purged and reported failed (a failed
        try, retried per the schedule's policy with the same idempotency key)."""
        old, self._producer = self._producer, None
        why, self._replace = self._replace, None
        if old is None:
            return
        log.warning("Kafka producer replaced (%s): %d message(s) it held are retried", why, len(old))
        try:
            old.purge()
            old.flush(0)
        except KafkaException:  # a fatal state: the reports still come
            pass
        if len(old):
            self._retired.append(old)  # polled until every report was served

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
            except Exception:  # noqa: BLE001  (queue full, or a value it refuses: reported per occurrence)
                occ.tries -= 1
                self.fire(occ, done)

    def _report(self, occ: Occurrence, done: Done) -> Callable[[KafkaError | None, Any], None]:
        def report(err: KafkaError | None, _msg: Any) -> None:
            if err is None:
                self._last_ok = time.monotonic()
                done(occ, None)
                return
            if err.fatal():
                self._replace = f"fatal error {err.str()}"  # the idempotent producer cannot go on
            elif (err.code() == KafkaError._MSG_TIMED_OUT and self._replace is None
                  and time.monotonic() - self._last_ok >= self.timeout):
                self._replace = f"nothing delivered for {self.timeout:g}s"
            done(occ, kafka_error(err, occ.details.target))
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
                self.poll(0.05)
            except KafkaException as exc:  # refused locally (unknown topic, too large), or fatal
                err = exc.args[0]
                if isinstance(err, KafkaError) and err.fatal():
                    self._replace = f"fatal error {err.str()}"
                done(occ, kafka_error(err, d.target))
                return
            except Exception as exc:  # noqa: BLE001  (e.g. a topic name with a NUL character)
                done(occ, f"kafka: {type(exc).__name__}: {exc}")
                return

    def poll(self, timeout: float = 0.0) -> int:
        """Serve Kafka delivery reports (calls ``done``); waits up to ``timeout`` for one."""
        served = 0
        if self._retired:
            for old in list(self._retired):
                served += self._served(old, 0)
                if not len(old):
                    self._retired.remove(old)
        if self._producer is not None:
            served += self._served(self._producer, timeout)
        return served

    def _served(self, producer: Producer, timeout: float) -> int:
        try:
            return producer.poll(timeout)
        except KafkaException as exc:  # a fatal error raised by poll itself
            err = exc.args[0]
            if producer is self._producer:
                self._replace = f"{err.str() if isinstance(err, KafkaError) else err} (raised by poll)"
            return 0

    def kafka_in_flight(self) -> int:
        return (len(self._producer) if self._producer is not None else 0) + sum(len(p) for p in self._retired)

    def in_flight(self) -> int:
        """Tries sent and not answered yet (Kafka deliveries, HTTP requests queued or in flight)."""
        return self.kafka_in_flight() + self._http_pending

    # -- HTTP ----------------------------------------------------------------------

    def _http(self, occ: Occurrence, done: Done) -> None:
        """Start the try now if its host has a free slot, else queue it behind that host's."""
        host = _host_key(occ.details.target)
        with self._lock:
            active = self._http_active.get(host, 0)
            if active < self.http_per_host:
                self._http_active[host] = active + 1
                self._http_pending += 1
                start, full = True, False
            else:
                waiting = self._http_queued.setdefault(host, collections.deque())
                full = len(waiting) >= self.http_queue_per_host
                if not full:
                    waiting.append((occ, done))
                    self._http_pending += 1
                start = False
        if full:
            done(occ, f"http: {self.http_queue_per_host} tries wait for {host} already (it answers slowly or not "
                      f"at all): not sent")
        elif start:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.http_concurrency, thread_name_prefix="schedules-http")
            self._pool.submit(self._http_slot, host, occ, done)

    def _http_slot(self, host: str, occ: Occurrence | None, done: Done | None) -> None:
        """One of ``host``'s slots: send this try, then the host's waiting ones, in turn."""
        while occ is not None:
            error = self._http_try(occ)
            with self._lock:
                self._http_pending -= 1
                waiting = self._http_queued.get(host)
                nxt = waiting.popleft() if waiting else None
                if waiting is not None and not waiting:
                    del self._http_queued[host]
                if nxt is None:
                    left = self._http_active.get(host, 1) - 1
                    if left > 0:
                        self._http_active[host] = left
                    else:
                        self._http_active.pop(host, None)
            done(occ, error)
            occ, done = nxt if nxt is not None else (None, None)

    def _http_try(self, occ: Occurrence) -> str | None:
        """POST one try through the egress policy: None when the target answered 2xx, else the
        error (a 3xx is not followed: a failed try with its status)."""
        d = occ.details
        try:
            status = egress.post(d.target, d.body, {
                "Content-Type": "application/json", HTTP_KEY_HEADER: occ.key,
                HTTP_SCHEDULE_HEADER: schedule_header(d.name), "X-Pyscheduler-Expected-At": str(occ.expected_ms)},
                timeout=self.timeout, allow=self.allow)
        except egress.EgressRefused as exc:  # before any connection: the same words, open port or not
            occ.refused = True
            return f"http: refused by the egress policy: {exc}"
        except Exception as exc:  # noqa: BLE001  (timeout, reset, a URL or header it cannot send)
            return f"http: {type(exc).__name__}: {exc}"
        return None if 200 <= status < 300 else f"http: status {status}"

    def drop_queued(self) -> int:
        """On stop: forget the tries waiting for a slow host (never reported: their claims are
        recovered by another executor). -> how many"""
        with self._lock:
            n = sum(len(q) for q in self._http_queued.values())
            self._http_queued.clear()
            self._http_pending -= n
        return n

    def close(self, timeout: float = 5.0) -> None:
        self.drop_queued()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=False)
            self._pool = None
        for producer in [*self._retired, self._producer]:
            if producer is not None:
                try:
                    producer.flush(timeout)
                except KafkaException:
                    pass
        self._producer, self._retired = None, []


def _host_key(url: str) -> str:
    """The slot key of an HTTP target: scheme://host:port (lower case), or the URL when it
    does not parse (its try fails alone)."""
    try:
        parts = urllib.parse.urlsplit(url)
        return f"{parts.scheme}://{(parts.hostname or '')}:{parts.port or ''}".lower()
    except ValueError:
        return url
