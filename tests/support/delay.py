"""Helpers of the delay-queue relay tests (real Postgres, real broker)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from pyscheduler.bench.delay import relay_command
from pyscheduler.delay.output import OutputReader, fresh_read, send_warm_up
from pyscheduler.delay.relay import Relay, RelayConfig
from tests.support import wait_for

# tansu: a consumer-group join takes about half the session timeout
GROUP_SETTINGS = {"session.timeout.ms": "6000", "heartbeat.interval.ms": "1000"}
FAST = dict(hold_ms=1500, poll_ms=50, detect_ms=100)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class Topics:
    input: str
    output: str
    dlq: str
    group: str = field(default_factory=lambda: f"g-{uuid.uuid4().hex[:8]}")


class Sender:
    """Publishes input messages (Chronos headers added) and flushes each call."""

    def __init__(self, bootstrap: str, topic: str, **settings):
        self.topic = topic
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1, **settings})

    def send(self, message_id: str | None, deadline: datetime | str | None, value: bytes | None = b"v",
             key: bytes | None = None, headers: list | None = None, partition: int | None = None,
             raw_headers: list | None = None) -> None:
        if raw_headers is None:
            raw_headers = []
            if message_id is not None:
                raw_headers.append(("chronosMessageId", message_id.encode()))
            if deadline is not None:
                text = deadline.isoformat() if isinstance(deadline, datetime) else deadline
                raw_headers.append(("chronosDeadline", text.encode()))
        kwargs = {} if partition is None else {"partition": partition}
        self.producer.produce(self.topic, value=value, key=key, headers=raw_headers + (headers or []), **kwargs)

    def flush(self) -> None:
        assert self.producer.flush(10) == 0


class Output:
    """Everything that arrived on a topic so far, read in the background.

    The embedded broker (tansu) can skip acknowledged messages for a consumer
    tailing a topic while producers write it (docs/operations.md): what this
    live reader saw is a hint. ``fresh()`` reads the topic again from the start
    with a new consumer; waits and counts use it, so a broker quirk can neither
    hide a loss nor fake one."""

    def __init__(self, bootstrap: str, topic: str):
        self.bootstrap, self.topic = bootstrap, topic
        self.reader = OutputReader(bootstrap, topic)
        self.messages: list = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for m in self.reader.consumer.consume(1000, 0.1):
                if m.error() is None:
                    with self._lock:
                        self.messages.append((time.time(), m))

    def values(self) -> list[bytes]:
        with self._lock:
            return [m.value() for _, m in self.messages]

    def fresh(self, count: int, idle: float = 0.5, timeout: float = 20) -> list:
        """Every message of the topic, read again from the start by a new consumer: at least
        ``count`` of them, then until none came for ``idle`` seconds (or ``timeout``)."""
        return fresh_read(self.bootstrap, self.topic, count, idle, timeout)

    def wait_values(self, wanted, timeout: float = 30) -> list:
        """Wait until every value in ``wanted`` arrived (seen by the live reader, or else
        confirmed by a fresh read); returns the (arrival, message) pairs of the live reader
        and, for values only the fresh read found, (None, message)."""
        wanted = set(wanted)
        checked = {"at": time.monotonic()}

        def arrived():
            if wanted <= set(self.values()):
                return True
            if time.monotonic() - checked["at"] > 2.0:  # the live reader may have skipped some
                checked["at"] = time.monotonic()
                return wanted <= {m.value() for m in self.fresh(0, idle=0.3, timeout=10)}
            return False

        wait_for(arrived, timeout, f"{len(wanted - set(self.values()))} of {len(wanted)} messages on the output")
        with self._lock:
            pairs = [(t, m) for t, m in self.messages if m.value() in wanted]
        missed = wanted - {m.value() for _, m in pairs}
        if missed:
            pairs += [(None, m) for m in self.fresh(0, idle=0.3) if m.value() in missed]
        return pairs

    def close(self) -> None:
        if self._stop.is_set():
            return  # closed already
        self._stop.set()
        self._thread.join(5)
        self.reader.close()


class InProcessRelay:
    """A Relay in a thread of the test process."""

    def __init__(self, dsn: str, bootstrap: str, topics: Topics, kafka_settings_extra: dict | None = None,
                 **overrides):
        settings = {**FAST, "dlq_topic": topics.dlq, **overrides}
        self.relay = Relay(RelayConfig(dsn=dsn, bootstrap_servers=bootstrap, input_topic=topics.input,
                                       output_topic=topics.output, group_id=topics.group,
                                       kafka_settings={**GROUP_SETTINGS, **(kafka_settings_extra or {})},
                                       **settings))
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=self.relay.name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.relay.run(self.stop_event)
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def stop(self, timeout: float = 30) -> None:
        self.stop_event.set()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "relay did not stop"
        if self.error:
            raise self.error


class RelayProcess:
    """``python -m pyscheduler.delay run ...`` in a subprocess, log in a file."""

    def __init__(self, dsn: str, bootstrap: str, topics: Topics, log: Path, *extra: str, hold_ms: int = 1500):
        args = ["--group-id", topics.group, "--hold-ms", str(hold_ms), "--poll-ms", "50", "--detect-ms", "100",
                *[f"-X{k}={v}" for k, v in GROUP_SETTINGS.items()], *extra]
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(relay_command(dsn, bootstrap, topics.input, topics.output, *args),
                                         stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def node(self, timeout: float = 30) -> str:
        def found():
            for line in self.text().splitlines():
                if "delay relay node " in line and " starting" in line:
                    return line.split("delay relay node ")[1].split()[0]
            assert self.proc.poll() is None, f"relay exited:\n{self.text()}"
            return None
        return wait_for(found, timeout, "the relay's start line")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def warm_up(sender: Sender, output: Output, partitions: int, timeout: float = 40) -> None:
    """One due message per input partition through the relay: its consumers have joined."""
    output.wait_values(send_warm_up(sender.producer, sender.topic, partitions), timeout)


def fire_time(message) -> float:
    """When the relay published the message (its CreateTime), epoch seconds."""
    return message.timestamp()[1] / 1000.0





def _every_thread_stopped(pid: int) -> bool:
    """Whether every thread of process ``pid`` is stopped (state T in /proc/<pid>/task/*/stat)."""
    states = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError):  # a thread that just exited
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
    return bool(states) and all(state in ("T", "t") for state in states)


def freeze(broker, timeout: float = 10) -> None:
    """Stop the broker (SIGSTOP) and return once it is stopped: every one of its threads.

    kill() returns as soon as the signal is queued. The kernel wakes one thread to handle
    it, and that thread stops the others once it runs: on a loaded machine the broker went
    on answering for milliseconds after kill() (up to 18 ms at load 13), so a message the
    relay published right after a bare SIGSTOP could be delivered, and a test staging a
    publish to a frozen broker raced the freeze."""
    broker.proc.send_signal(signal.SIGSTOP)
    wait_for(lambda: _every_thread_stopped(broker.proc.pid), timeout, "the broker to stop (SIGSTOP)",
             interval=0.001)


@contextlib.contextmanager
def private_broker(tmp_path: Path) -> Iterator[tuple[Any, Topics, Sender, Output]]:
    """A broker of the test's own (one it may freeze with SIGSTOP) with topics in, out and
    dlq: (broker, topics, sender, output); the broker is resumed and stopped at the end."""
    from pyscheduler import embedded

    broker = embedded.Kafka(tmp_path / "kafka").start()
    try:
        topics = Topics(input="in", output="out", dlq="dlq")
        embedded.create_topics(broker.bootstrap, [topics.input, topics.output, topics.dlq])
        output = Output(broker.bootstrap, topics.output)
        try:
            yield broker, topics, Sender(broker.bootstrap, topics.input), output
        finally:
            broker.proc.send_signal(signal.SIGCONT)  # no-op unless frozen
            output.close()
    finally:
        broker.stop()
