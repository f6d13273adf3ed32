"""The delay-queue relay (seeds/chronos.md): one ``Relay`` is one queuing node, three loops in
threads: consume the input topic and enqueue (or publish the late, dead-letter the malformed),
then commit; claim what is due, publish it and delete it once delivered; reset what a suspected
node holds past the hold time. SQL decides, this moves bytes and retries outages with backoff
(docs/operations.md, "Delay relay: limits and guarantees"); message.py parses, publisher.py
publishes. Over 600 lines as one job: the three loops share one node's state (stop, wake-up,
claim mark, batches in flight).
"""

from __future__ import annotations

import bisect
import dataclasses
import gc
import logging
import queue
import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient
from prometheus_client.core import GaugeMetricFamily

from ..db import Database, Jsonb, Listener, Outage, Wakeup
from ..errors import ConfigError, SchedulerError, is_retryable, rejects_arguments
from ..metrics import Reads, counter, gauge, histogram
from . import sqlapi as sql
from .message import HEADER_DEADLINE, HEADER_ID, Delayed, Malformed, headers_from_json, headers_to_json, parse, where
from .publisher import KAFKA_MESSAGE_MAX_BYTES, UNREACHABLE, DeadLetter, Outgoing, Publisher, broker_message_limit

log = logging.getLogger("pyscheduler.delay")

DLQ_REASON_HEADER = "pyscheduler.delay.error"
DLQ_SOURCE_HEADER = "pyscheduler.delay.source"
CONSUMER_ONLY = {"session.timeout.ms", "heartbeat.interval.ms", "max.poll.interval.ms", "group.instance.id",
                 "partition.assignment.strategy", "auto.offset.reset", "fetch.wait.max.ms", "fetch.min.bytes",
                 "fetch.max.bytes", "max.partition.fetch.bytes", "isolation.level", "enable.auto.commit"}

DLQ_SIZE_HEADER = "pyscheduler.delay.value-size"
MIN_HOLD_MS = 1000  # the relay's own floor of the hold time (SQL takes any positive one)
# batches claimed and not yet deleted under load: one being delivered while the next is claimed
PIPELINE = 2
# claims start this far below the latest deadline claimed (fire_loop) ...
MARK_SLACK = timedelta(seconds=1)
# ... and from the start of the waiting index at least this often (seconds)
RESCAN_S = 2.0
# gen-0 threshold of the cyclic garbage collector in a relay process (relax_gc)
GC_THRESHOLD = 50_000

CONSUMED = counter("pyscheduler_delay_consumed", "Messages consumed from the input topic")
ENQUEUED = counter("pyscheduler_delay_enqueued", "Messages stored to wait for their deadline")
DUPLICATES = counter("pyscheduler_delay_duplicates", "Messages ignored: id already waiting or ready")
LATE = counter("pyscheduler_delay_late", "Messages published at once: deadline within the timing advance")
FIRED = counter("pyscheduler_delay_fired", "Messages published on the output topic (late ones included)")
DEAD_LETTERED = counter("pyscheduler_delay_dead_lettered",
                        "Dead letters the broker confirmed on the dead-letter topic (malformed input, messages the "
                        "broker refused)")
DROPPED = counter("pyscheduler_delay_dropped",
                  "Messages given up without a dead letter: no dead-letter topic, or the dead letter was refused")
CLAIMS = counter("pyscheduler_delay_claims", "ready_and_claim calls of the fire loop")
RESETS = counter("pyscheduler_delay_resets", "Ready messages reset after a suspected node failure")
ALREADY_GONE = counter("pyscheduler_delay_already_gone", "Fired messages a peer had already deleted")
BACKLOG = gauge("pyscheduler_delay_backlog", "Messages in the database (waiting + ready)")
FIRE_LAG = histogram("pyscheduler_delay_fire_lag_seconds", "Fire time minus deadline",
                     buckets=(-0.1, -0.05, -0.025, -0.01, 0, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
SERIES = (CONSUMED, ENQUEUED, DUPLICATES, LATE, FIRED, DEAD_LETTERED, DROPPED, CLAIMS, RESETS, ALREADY_GONE,
          BACKLOG, FIRE_LAG)


def queue_gauges(topic: str) -> Callable[[Database], Any]:
    """The delay queue's waiting and overdue messages (delay_queue: kept counts, overdue counted
    up to 10,000), labelled with the output topic the relay fires them to."""
    def read(db: Database):
        q = db.query(sql.DELAY_QUEUE.select())[0]
        waiting = GaugeMetricFamily("pyscheduler_delay_waiting", "Messages waiting for their deadline",
                                    labels=["topic"])
        overdue = GaugeMetricFamily("pyscheduler_delay_overdue", "Messages past their deadline not yet fired "
                                                                 "(counted up to 10,000)", labels=["topic"])
        waiting.add_metric([topic], q["waiting"])
        overdue.add_metric([topic], q["overdue"])
        return waiting, overdue
    return read


@dataclass
class RelayConfig:
    """Settings of one relay node; the CLI flags map one to one."""

    dsn: str
    bootstrap_servers: str
    input_topic: str
    output_topic: str
    group_id: str = "pyscheduler-delay"
    dlq_topic: str | None = None
    timing_advance_ms: int = 50
    hold_ms: int = 5000
    poll_ms: int = 100
    detect_ms: int = 500
    consume_batch: int = 2000
    fire_batch: int = 2000
    kafka_settings: dict[str, str] = field(default_factory=dict)
    create_topics: bool = False  # create missing topics when Kafka answers (``pyscheduler run``), else refuse
    node: uuid.UUID = field(default_factory=uuid.uuid4)

    def __post_init__(self) -> None:
        for name in ("timing_advance_ms", "hold_ms", "poll_ms", "detect_ms", "consume_batch", "fire_batch"):
            value = getattr(self, name)
            if value < (0 if name == "timing_advance_ms" else 1):
                raise ConfigError(f"{name.replace('_', '-')} must be positive, got {value}")
        for name in ("dsn", "bootstrap_servers", "input_topic", "output_topic", "group_id"):
            if not getattr(self, name):
                raise ConfigError(f"{name.replace('_', '-')} is required")
        if self.timing_advance_ms > sql.MAX_ADVANCE_MS:
            raise ConfigError(f"timing-advance-ms must be at most {sql.MAX_ADVANCE_MS}, got {self.timing_advance_ms}")
        # The hold time is how long a node may hold a ready message before peers take it over:
        # it must leave room for a claim (poll), a scan (detect) and a delivery (the producer's
        # message.timeout.ms), or messages are fired again while their first copy is on its way.
        floor = max(MIN_HOLD_MS, 2 * self.poll_ms, 2 * self.detect_ms)
        if self.hold_ms < floor:
            raise ConfigError(f"hold-ms must be at least {floor} (1000, and twice poll-ms and detect-ms), "
                              f"got {self.hold_ms}")
        for name in ("message.timeout.ms", "delivery.timeout.ms"):
            raw = self.kafka_settings.get(name)
            if raw is not None:
                try:
                    timeout = int(raw)
                except ValueError:
                    raise ConfigError(f"-X {name} must be an integer, got {raw!r}") from None
                if not 0 < timeout <= self.hold_ms // 2:
                    raise ConfigError(f"-X {name}={timeout} must be between 1 and half the hold time "
                                      f"({self.hold_ms // 2} ms): a delivery still pending after the hold "
                                      "time is fired again by a peer")

    @property
    def advance(self) -> timedelta:
        return timedelta(milliseconds=self.timing_advance_ms)


def count_fired(fired_at: float, deadlines: Sequence[datetime]) -> None:
    """FIRED and FIRE_LAG for messages fired at ``fired_at`` (epoch seconds) with these
    deadlines, the lags in one pass over the buckets: Histogram.observe per message (a lock and
    a bucket search each) was a visible share of the relay's CPU. Falls back to observe() if
    prometheus_client changes."""
    FIRED.inc(len(deadlines))
    try:
        bounds, buckets, total = FIRE_LAG._upper_bounds, FIRE_LAG._buckets, FIRE_LAG._sum
    except AttributeError:
        for d in deadlines:
            FIRE_LAG.observe(fired_at - d.timestamp())
        return
    counts = [0] * len(bounds)
    lags = [fired_at - d.timestamp() for d in deadlines]
    for lag in lags:
        counts[bisect.bisect_left(bounds, lag)] += 1
    total.inc(sum(lags))
    for bucket, n in zip(buckets, counts):
        if n:
            bucket.inc(n)


def _count_dead_letters(sent: Sequence["Outgoing"], *failed: Sequence["Outgoing"]) -> None:
    """DEAD_LETTERED: the dead letters of ``sent`` that the broker confirmed (none of ``failed``)."""
    gone = {id(item) for items in failed for item in items}
    n = sum(1 for item in sent if isinstance(item.tag, DeadLetter) and id(item) not in gone)
    if n:
        DEAD_LETTERED.inc(n)


def relax_gc(threshold: int = GC_THRESHOLD) -> None:
    """Run the cyclic garbage collector every ``threshold`` allocations instead of Python's 700
    (never lowering a higher setting). The relay allocates several container objects per
    message (Kafka messages, header lists, rows, tuples) that never form cycles, and with the
    default the collector ran dozens of times per batch: ~12 % of the relay's CPU at 10,000
    msg/s (py-spy --native). Process-wide, so ``Relay.run`` calls it once."""
    first, *rest = gc.get_threshold()
    if 0 < first < threshold:
        gc.set_threshold(threshold, *rest)


# -- the relay ----------------------------------------------------------------

class Relay:
    """One queuing node: three loops in threads; ``run(stop)`` until stop is set."""

    series = SERIES  # the class's; an instance adds its Reads (waiting, overdue)
    label = "delay-relay"  # its daemon label in /metrics (its name has the node's id)

    def __init__(self, config: RelayConfig):
        self.cfg = config
        self.node = config.node
        self.name = f"delay-relay-{str(self.node)[:8]}"
        # what a process running a relay exports (pyscheduler.metrics)
        self.series = (*SERIES, Reads(config.dsn, "delay", queue_gauges(config.output_topic)))
        self.db: Database | None = None
        self.wakeup = Wakeup()
        self.stop = threading.Event()
        self.kafka_outage = Outage("Kafka", log)
        self.max_message_bytes = KAFKA_MESSAGE_MAX_BYTES
        self.crashed: list[BaseException] = []
        self._commits_pending = 0  # asynchronous input commits not yet answered
        self._in_flight = 0  # claimed batches not yet deleted (fire_loop)
        self._rescan = False  # the next claim starts at the start of the waiting index (fire_loop)

    def fresh(self) -> "Relay":
        """A new node with these settings (run_daemons' restart after a crash): a new node id,
        so the messages the crashed node held ready are reset after the hold time (reset_stuck)."""
        return Relay(dataclasses.replace(self.cfg, node=uuid.uuid4()))

    # -- configuration ---------------------------------------------------------

    def _kafka(self, producer: bool = False, **extra: Any) -> dict[str, Any]:
        settings = {k: v for k, v in self.cfg.kafka_settings.items()
                    if not (producer and k in CONSUMER_ONLY)}  # librdkafka warns about them
        if producer:
            # librdkafka retries a delivery for 300 s by default; publish() gives up after half
            # the hold time, so the producer should not keep (and later deliver) much longer
            # and the size limit is the broker's (see check_topics), not librdkafka's lower default
            extra = {"message.timeout.ms": max(1000, self.cfg.hold_ms // 2),
                     "message.max.bytes": self.max_message_bytes, **extra}
        out = {"bootstrap.servers": self.cfg.bootstrap_servers, "logger": log,
               "error_cb": self._kafka_error, **extra, **settings}
        if producer:
            # Publisher.publish proves delivery by the absence of a failure report
            out["delivery.report.only.error"] = True
        return out

    def _kafka_error(self, err: KafkaError) -> None:
        if err.code() in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE):
            self.kafka_outage.failed(KafkaException(err))
        else:
            log.warning("Kafka: %s", err)

    def check_topics(self) -> None:
        """Retries while Kafka is unreachable (at start as later); then creates the missing topics
        with ``create_topics``, else raises ConfigError naming them."""
        from ..embedded import create_topics

        admin = AdminClient(self._kafka())
        outage = Outage(f"Kafka at {self.cfg.bootstrap_servers}", log)
        wanted = [self.cfg.input_topic, self.cfg.output_topic] + ([self.cfg.dlq_topic] if self.cfg.dlq_topic else [])
        while True:
            try:
                missing = [t for t in wanted if t not in admin.list_topics(timeout=2).topics]
                if missing and self.cfg.create_topics:
                    try:
                        create_topics(self.cfg.bootstrap_servers, missing, settings=self.cfg.kafka_settings)
                    except KafkaException as exc:
                        err = exc.args[0]
                        if not isinstance(err, KafkaError) or err.retriable() or err.code() in UNREACHABLE:
                            raise
                        raise ConfigError(f"could not create topic(s) {', '.join(missing)} on "
                                          f"{self.cfg.bootstrap_servers}: {err.str()}; create them first") from None
                    log.info("created topic(s) %s", ", ".join(missing))
                    missing = []
                outage.ok()
                break
            except KafkaException as exc:
                if self.stop.wait(outage.failed(exc)):
                    return
        if missing:
            raise ConfigError(f"topic(s) {', '.join(missing)} do not exist on {self.cfg.bootstrap_servers}; "
                              f"create them first (input, output{' and dead-letter' if self.cfg.dlq_topic else ''})")
        self.max_message_bytes = broker_message_limit(admin, self.cfg.output_topic)

    # -- running ---------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Run until ``stop``; then finish in-flight fires, commit, return."""
        self.stop = stop
        cfg = self.cfg
        relax_gc()
        self.check_topics()
        if stop.is_set():  # stopped while waiting for Kafka
            return
        log.info("delay relay node %s starting: %s -> %s (group %s, advance %dms, hold %dms, poll %dms, "
                 "detect %dms, dead letters %s, largest message %d bytes)", self.node, cfg.input_topic,
                 cfg.output_topic, cfg.group_id, cfg.timing_advance_ms, cfg.hold_ms, cfg.poll_ms, cfg.detect_ms,
                 cfg.dlq_topic or "dropped", self.max_message_bytes)
        self.db = Database.for_daemon(cfg.dsn, name=self.name, max_size=5)
        listener = Listener(cfg.dsn, [sql.NOTIFY_CHANNEL], self.wakeup.poke, on_reconnect=self.wakeup.poke,
                            logger=log).start()
        self.crashed = []
        threads = [self._thread(loop) for loop in (self.consume_loop, self.fire_loop, self.detect_loop)]
        for t in threads:
            t.start()
        try:
            stop.wait()
            self.wakeup.poke()
            for t in threads:
                t.join()
        finally:
            listener.stop()
            self.db.close()
        log.info("delay relay node %s stopped", self.node)
        if self.crashed:
            raise self.crashed[0]

    def _thread(self, loop: Callable[..., None], *args: Any) -> threading.Thread:
        """A thread running ``loop``; a crash (a bug) stops the node rather than let it limp on."""
        def target() -> None:
            try:
                loop(*args)
            except BaseException as exc:
                log.exception("delay relay %s: %s crashed", self.node, loop.__name__)
                self.crashed.append(exc)
                self.stop.set()
                self.wakeup.poke()
        return threading.Thread(target=target, name=f"{self.name}:{loop.__name__}")

    def _db_call(self, outage: Outage, function: sql.Fn, give_up: Callable[[], bool],
                 **args: Any) -> list[tuple] | None:
        """``db.call_tuples`` retried with backoff while the database is unavailable or refuses for
        a reason that may pass (errors.is_retryable); None when giving up. A rejection of the
        values passed (errors.rejects_arguments) is raised."""
        while True:
            try:
                rows = self.db.call_tuples(function, **args)
                outage.ok()
                return rows
            except (SchedulerError, psycopg.Error) as exc:
                if not is_retryable(exc):
                    raise
                if give_up():
                    return None
                time.sleep(outage.failed(exc))

    # -- 1. consume and enqueue -------------------------------------------------

    def consume_loop(self) -> None:
        cfg = self.cfg
        # A 10 s session (Kafka's default is 45 s): a crashed node's partitions move on sooner.
        consumer = Consumer(self._kafka(**{
            "group.id": cfg.group_id, "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 100, "session.timeout.ms": 10000, "heartbeat.interval.ms": 2000,
            "on_commit": self._committed}))
        publisher = Publisher(self._kafka(producer=True, **{"linger.ms": 2}), self.kafka_outage)
        db_outage = Outage("PostgreSQL (enqueue)", log)
        consumer.subscribe([cfg.input_topic])
        try:
            while not self.stop.is_set():
                msgs = consumer.consume(cfg.consume_batch, 0.2)
                if msgs:
                    self._handle_batch(consumer, publisher, db_outage, msgs)
        finally:
            publisher.close()
            # let the asynchronous commits be answered (bounded: the broker may be away); what
            # this returns is not handled and not committed, so it is read again
            end = time.monotonic() + 5.0
            while self._commits_pending > 0 and time.monotonic() < end:
                consumer.consume(cfg.consume_batch, 0.1)
            consumer.close()

    def _committed(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """The broker's answer to an asynchronous commit (served by consume())."""
        self._commits_pending -= 1
        if err is not None:  # e.g. a rebalance: the batch may be read again, duplicates are ignored
            log.warning("could not commit input offsets (the batch may be read again): %s", err)

    def _handle_batch(self, consumer: Consumer, publisher: Publisher, db_outage: Outage,
                      msgs: list[Message]) -> None:
        """Store (or publish, or dead-letter) a batch, then commit its offsets without waiting
        for the broker's answer (the commit is only issued once every message of the batch
        was stored, published or dead-lettered; not at all when stopping first)."""
        good: list[tuple[Message, Delayed]] = []
        bad: list[tuple[Message, str, list]] = []  # (message, reason, its headers)
        consumed = len(msgs)
        for msg in msgs:
            if msg.error() is not None:
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    log.warning("input topic: %s", msg.error())
                consumed -= 1
                continue
            try:
                good.append((msg, parse(msg)))
            except Malformed as exc:
                bad.append((msg, str(exc), exc.headers))
        CONSUMED.inc(consumed)
        stopping = self.stop.is_set
        outcomes = self._enqueue(good, bad, db_outage, stopping)
        if outcomes is None:
            return  # stopping during an outage: nothing committed, the batch is read again
        out: list[Outgoing] = []
        for (_msg, d), outcome in zip(good, outcomes):
            if outcome == "late":
                out.append(Outgoing(self.cfg.output_topic, d.key, d.value, d.headers, d))
        for msg, reason, headers in bad:
            letter = self._dead_letter(msg.key(), msg.value(), headers, f"malformed message: {reason}", where(msg))
            if letter is not None:
                out.append(letter)
        if out and not self._publish_or_store(publisher, db_outage, out):
            return  # stopping before the broker (or the table) took them: not committed, read again
        # The consumer's position: past the last message consume() returned per partition, i.e.
        # past this batch (the previous ones were handled before it was read), without a
        # Python step per message. A partition nothing was read from yet has none (negative).
        offsets = [tp for tp in consumer.position(consumer.assignment()) if tp.offset >= 0]
        if not offsets:
            return
        try:
            consumer.commit(offsets=offsets, asynchronous=True)
            self._commits_pending += 1
        except KafkaException as exc:  # e.g. a rebalance: the batch may be read again, duplicates are ignored
            log.warning("could not commit input offsets (the batch may be read again): %s", exc)

    def _enqueue(self, good: list[tuple[Message, Delayed]], bad: list[tuple[Message, str, list]],
                 outage: Outage, give_up: Callable[[], bool]) -> list[str] | None:
        """Outcome per good message; a message the database rejects (errors.rejects_arguments)
        moves to ``bad``. An outage (a timeout, a lock, a read-only or unreachable database)
        is retried with backoff by _db_call; any other error (a missing privilege or
        function) is raised: the node crashes and is restarted, its offsets uncommitted.
        Neither is ever a reason to drop a message. None when stopping first."""
        if not good:
            return []
        try:
            rows = self._enqueue_call([d for _, d in good], outage, give_up)
        except (SchedulerError, psycopg.Error) as exc:
            if not rejects_arguments(exc):
                raise
            # Rejected as a whole: find the culprit(s) one by one so neighbours still go through.
            log.warning("batch of %d rejected (%s); enqueueing one by one", len(good), exc)
            outcomes: list[str] = []
            for msg, d in list(good):
                try:
                    rows = self._enqueue_call([d], outage, give_up)
                except (SchedulerError, psycopg.Error) as one:
                    if not rejects_arguments(one):
                        raise
                    bad.append((msg, f"rejected by the database: {one}", [
                        (HEADER_ID, d.id.encode()), (HEADER_DEADLINE, d.deadline.isoformat().encode()), *d.headers]))
                    outcomes.append("rejected")
                    continue
                if rows is None:
                    return None
                outcomes.append(rows[0][2])
            self._count(outcomes)
            return outcomes
        if rows is None:
            return None
        outcomes = [r[2] for r in rows]  # (ord, id, outcome), in input order
        self._count(outcomes)
        return outcomes

    # -- dead letters --------------------------------------------------------------

    def _dead_letter(self, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]],
                     reason: str, source: str, row_id: str | None = None) -> Outgoing | None:
        """The dead letter of a message the relay cannot deliver (malformed, or refused by the
        broker): logged once here; None when there is no dead-letter topic (dropped)."""
        log.error("%s: %s; %s", source, reason,
                  f"sent to {self.cfg.dlq_topic}" if self.cfg.dlq_topic else "dropped (no dead-letter topic)")
        if not self.cfg.dlq_topic:
            DROPPED.inc()
            return None
        return Outgoing(self.cfg.dlq_topic, key, value,
                        [*headers, (DLQ_REASON_HEADER, reason.encode()), (DLQ_SOURCE_HEADER, source.encode())],
                        DeadLetter(source, row_id))

    def _instead_of_refused(self, item: Outgoing, err: KafkaError) -> Outgoing | None:
        """What to publish instead of a message the broker refused for itself (REFUSED): its dead
        letter; for a refused dead letter, a copy without key and value (their size in a
        header); None when even that was refused (dropped, logged)."""
        tag = item.tag
        if isinstance(tag, DeadLetter):
            if tag.stripped:
                log.error("the dead letter of the message at %s was refused even without key and value (%s): "
                          "dropped", tag.source, err.str())
                DROPPED.inc()
                return None
            size = len(item.key or b"") + len(item.value or b"")
            log.warning("the dead letter of the message at %s was refused (%s); sent without key and value "
                        "(%d bytes)", tag.source, err.str(), size)
            return Outgoing(item.topic, None, None, [*item.headers, (DLQ_SIZE_HEADER, str(size).encode())],
                            DeadLetter(tag.source, tag.row_id, stripped=True))
        row_id = tag.id if isinstance(tag, Delayed) else tag[0]
        return self._dead_letter(item.key, item.value, [(HEADER_ID, row_id.encode()), *item.headers],
                                 f"the broker refused it ({err.str()})", f"message {row_id}",
                                 row_id=row_id)

    def _publish_refusing(self, publisher: Publisher, out: list[Outgoing], give_up: Callable[[], bool],
                          refused: list[Outgoing] | None = None) -> list[Outgoing]:
        """publish() within half the hold time; a message refused for itself is replaced by its
        dead letter (published in the next round) or dropped; ``refused`` collects the refused
        messages that are not dead letters. Returns the undelivered (dead letters included)."""
        undelivered: list[Outgoing] = []
        while out:
            rounds: list[tuple[Outgoing, KafkaError]] = []
            missed = publisher.publish(out, give_up, until=time.monotonic() + self.cfg.hold_ms / 2000.0,
                                       on_refused=lambda item, err, rounds=rounds: rounds.append((item, err)))
            undelivered += missed
            _count_dead_letters(out, missed, [item for item, _ in rounds])
            out = []
            for item, err in rounds:
                if refused is not None and not isinstance(item.tag, DeadLetter):
                    refused.append(item)
                instead = self._instead_of_refused(item, err)
                if instead is not None:
                    out.append(instead)
        return undelivered

    def _publish_or_store(self, publisher: Publisher, outage: Outage, out: list[Outgoing]) -> bool:
        """Publish late and dead-letter messages; False when stopping first.

        A late message the broker does not take within half the hold time is
        stored instead (enqueue_messages(store_late)), so the fire loop retries
        it and the input never stalls; one the broker refuses for itself (too
        large) is dead-lettered, or dropped with one error log; a dead letter the
        broker cannot reach is retried. Stopping before every message was either
        delivered or stored, False: the caller does not commit the input."""
        stopping = self.stop.is_set
        refused: list[Outgoing] = []
        fired_at = time.time()
        undelivered = self._publish_refusing(publisher, out, stopping, refused)
        failed = {id(item) for item in undelivered} | {id(item) for item in refused}
        fired = [item.tag.deadline for item in out if id(item) not in failed and isinstance(item.tag, Delayed)]
        count_fired(fired_at, fired)
        if not undelivered:
            return True
        if stopping():
            return False  # neither delivered nor stored: the input is not committed, it is read again
        late = [item.tag for item in undelivered if isinstance(item.tag, Delayed)]
        dead = [item for item in undelivered if not isinstance(item.tag, Delayed)]
        if late:
            log.warning("could not publish %d late message(s) at once (%s); stored to be fired from the table",
                        len(late), publisher.last_error)
            if self._enqueue_call(late, outage, stopping, store_late=True) is None:
                return False
            self._rescan = True  # stored with past deadlines: below the fire loop's mark
        if dead and publisher.last_error is not None and publisher.last_error.code() in UNREACHABLE:
            # the broker is away (not refusing them): dead letters have no table to wait in, so
            # they are retried until delivered; stopping first, the input is read again
            sent, dead = dead, publisher.publish(dead, stopping)
            _count_dead_letters(sent, dead)
            if dead and stopping():
                return False
        for item in dead:
            log.error("could not dead-letter the message at %s (%s): dropped", item.tag.source, publisher.last_error)
        if dead:
            DROPPED.inc(len(dead))
        return True

    def _enqueue_call(self, batch: list[Delayed], outage: Outage, give_up: Callable[[], bool],
                      store_late: bool = False) -> list[dict] | None:
        """One enqueue_messages call for the batch, its arrays sent in binary (as text, dumping
        them was the relay's largest cost); an array whose elements are all NULL is sent as
        NULL, and a message without extra headers has a NULL element (stored as [])."""
        keys = [d.key for d in batch]
        vals = [d.value for d in batch]
        headers = [Jsonb(headers_to_json(d.headers)) if d.headers else None for d in batch]
        return self._db_call(
            outage, sql.ENQUEUE_MESSAGES, give_up,
            ids=[d.id for d in batch], deadlines=[d.deadline for d in batch],
            keys=keys if any(k is not None for k in keys) else None,
            vals=vals if any(v is not None for v in vals) else None,
            header_lists=headers if any(h is not None for h in headers) else None,
            advance=self.cfg.advance, store_late=store_late)

    @staticmethod
    def _count(outcomes: list[str]) -> None:
        for name, metric in (("enqueued", ENQUEUED), ("duplicate", DUPLICATES), ("late", LATE)):
            n = outcomes.count(name)
            if n:
                metric.inc(n)

    # -- 2. ready and fire ------------------------------------------------------

    def fire_loop(self) -> None:
        """Claim due batches and hand them to the delivery thread (_deliver_loop), so the claim
        of batch N+1 overlaps the delivery of batch N and the wait for the broker's
        acknowledgements. At most PIPELINE batches are claimed and not yet deleted; a batch is
        deleted only after its delivery was acknowledged, so a crash at any point leaves the
        claimed, unacknowledged ones ready, to be reset after the hold time and fired again.

        The claim runs ahead only after a full batch (more are due: under load); after a
        smaller one it waits until the previous batch is deleted, as an unpipelined loop
        would, so a light load is claimed in batches, not one message at a time, and at least
        half the timing advance after the previous claim started.

        Claims (and next_deadline) start at the latest deadline claimed so far minus
        MARK_SLACK (``after``), not at the start of the waiting index, whose low end holds the
        entries of every message fired since the last VACUUM (sql/delay.sql,
        _delay_dead_head). A message can be waiting below that mark only if it was stored by
        an enqueue that ran longer than MARK_SLACK, stored late (store_late), skipped while a
        peer held it, or reset by reset_stuck: every RESCAN_S, and at once after a reset or a
        late store by this node, a claim starts from the start instead."""
        cfg = self.cfg
        outage = Outage("PostgreSQL (fire)", log)
        poll = cfg.poll_ms / 1000.0
        self._in_flight = 0  # batches handed to the delivery thread and not yet deleted
        done = threading.Condition()
        batches: queue.SimpleQueue[list[dict] | None] = queue.SimpleQueue()
        deliverer = self._thread(self._deliver_loop, batches, done)
        deliverer.start()
        # after a batch that was not full, the next claim waits at least half the timing advance
        # (never longer than the poll interval): a message claimed that much later is still
        # fired before its deadline, and a steady load is claimed in batches of that many
        # milliseconds' worth instead of a few messages per round trip
        gap = min(poll, cfg.timing_advance_ms / 2000.0)
        full = False
        mark: datetime | None = None  # the latest deadline claimed
        rescan_at = 0.0
        try:
            while not self.stop.is_set():
                limit = PIPELINE if full else 1
                with done:
                    if not done.wait_for(lambda limit=limit: self._in_flight < limit, timeout=poll):
                        continue  # still delivering
                claimed_at, started = time.time(), time.monotonic()
                after = None
                if mark is not None and not self._rescan and time.monotonic() < rescan_at:
                    after = mark - MARK_SLACK
                else:
                    self._rescan = False
                    rescan_at = time.monotonic() + RESCAN_S
                CLAIMS.inc()
                rows = self._db_call(outage, sql.READY_AND_CLAIM, self.stop.is_set, node=self.node,
                                     advance=cfg.advance, max_count=cfg.fire_batch, after=after)
                if rows is None:
                    break
                if rows:
                    top = max(row[1] for row in rows)
                    mark = top if mark is None or top > mark else mark
                    with done:
                        self._in_flight += 1
                    batches.put(rows)
                full = len(rows) >= cfg.fire_batch
                if full:
                    continue  # more are due: no sleep
                sleep = self._sleep_time(outage, poll, None if rows else claimed_at, after)
                rest = started + gap - time.monotonic()
                if rest > 0:  # a NOTIFY does not cut this short; it is still seen after it
                    if self.stop.wait(rest):
                        break
                    sleep -= rest
                self.wakeup.wait(sleep, jitter=0.2)
        finally:
            batches.put(None)  # the claimed batches are still delivered (bounded), then it stops
            deliverer.join()

    def _deliver_loop(self, batches: "queue.SimpleQueue[list[dict] | None]", done: threading.Condition) -> None:
        """Publish each claimed batch, wait for the acknowledgements, delete the acknowledged."""
        publisher = Publisher(self._kafka(producer=True, **{"linger.ms": 1}), self.kafka_outage)
        outage = Outage("PostgreSQL (delete)", log)
        try:
            while (rows := batches.get()) is not None:
                try:
                    self._fire(publisher, outage, rows)
                finally:
                    with done:
                        self._in_flight -= 1
                        done.notify_all()
        finally:
            publisher.close()

    def _sleep_time(self, outage: Outage, poll: float, claimed_nothing_at: float | None = None,
                    after: datetime | None = None) -> float:
        """Until the next deadline (from ``after`` on) minus the advance, at most the poll interval.

        ``claimed_nothing_at``: when a ready_and_claim that returned nothing started. A
        message that was already due then but was not claimed is row-locked by another
        session (SKIP LOCKED): the poll interval, not a hot loop on its past deadline."""
        try:
            nxt = self.db.call_value(sql.NEXT_DEADLINE, after=after)
            outage.ok()
        except (SchedulerError, psycopg.Error) as exc:
            if not is_retryable(exc):
                raise
            return outage.failed(exc)
        if nxt is None:
            return poll
        due_at = (nxt - self.cfg.advance).timestamp()
        if claimed_nothing_at is not None and due_at < claimed_nothing_at - 0.01:  # 10 ms: clock rounding
            return poll
        return min(poll, max(0.0, due_at - time.time()))

    def _fire(self, publisher: Publisher, outage: Outage, rows: list[tuple]) -> None:
        """Publish claimed rows (ready_and_claim's columns: id, deadline, headers, key, value,
        readied_at), then delete the delivered, dead-lettered or dropped ones."""
        topic = self.cfg.output_topic
        out = [Outgoing(topic, key, value, headers_from_json(headers), (ident, deadline))
               for ident, deadline, headers, key, value, _ in rows]
        refused: list[Outgoing] = []
        fired_at = time.time()
        # Once stopping, in-flight fires still finish (bounded); undelivered ones stay
        # ready and are reset by a peer (or this node's successor) after the hold time.
        # Retries stop at half the hold time, so a message the broker keeps refusing (too
        # large, say) never stalls the messages behind it, and the delivered ones of the
        # batch are deleted before the detector would reset them.
        # A message the broker refuses for itself (too large) is dead-lettered or dropped, and
        # deleted like a fired one: never retried every hold period.
        undelivered = self._publish_refusing(publisher, out, self.stop.is_set, refused)
        if undelivered and not self.stop.is_set():
            log.error("could not publish %d message(s) within half the hold time (%s), e.g. %s; they stay "
                      "ready and are tried again once reset", len(undelivered), publisher.last_error,
                      ", ".join(str(item.tag.row_id if isinstance(item.tag, DeadLetter) else item.tag[0])
                                for item in undelivered[:5]))
        kept = {item.tag.row_id if isinstance(item.tag, DeadLetter) else item.tag[0] for item in undelivered}
        delivered = [row[0] for row in rows if row[0] not in kept]  # fired, dead-lettered or dropped
        failed = kept.union(item.tag[0] for item in refused)
        fired = [row[1] for row in rows if row[0] not in failed]
        count_fired(fired_at, fired)
        if not delivered:
            return
        deadline = time.monotonic() + self.cfg.hold_ms / 1000.0
        gone = self._db_call(outage, sql.DELETE_FIRED, lambda: self.stop.is_set() and time.monotonic() > deadline,
                             ids=delivered, node=self.node)
        for (ident,) in gone or []:
            ALREADY_GONE.inc()
            log.warning("fired message %s was already gone (a peer suspected this node %s and fired it too)",
                        ident, self.node)

    # -- 3. detect and recover --------------------------------------------------

    def detect_loop(self) -> None:
        cfg = self.cfg
        outage = Outage("PostgreSQL (detect)", log)
        hold = timedelta(milliseconds=cfg.hold_ms)
        next_backlog = 0.0
        while not self.stop.wait(cfg.detect_ms / 1000.0 * (1.0 + random.random() * 0.2)):
            try:
                rows = self.db.call(sql.RESET_STUCK, hold=hold)
                if time.monotonic() >= next_backlog:
                    BACKLOG.set(self.db.query(sql.DELAY_QUEUE.select(columns="waiting + ready AS n"))[0]["n"])
                    next_backlog = time.monotonic() + 5.0
                outage.ok()
            except (SchedulerError, psycopg.Error) as exc:
                if not is_retryable(exc):
                    raise
                self.stop.wait(outage.failed(exc))
                continue
            for row in rows:
                RESETS.inc()
                log.warning("suspected failure of %s for message %s", row["suspected_node"], row["id"])
            if rows:
                self._rescan = True  # reset messages wait below the fire loop's mark
                self.wakeup.poke()
