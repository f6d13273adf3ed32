"""The delay-queue part of ``pyscheduler bench peers``: the pyscheduler relay and the naive
baseline (naive_relay.py) at the same fixed offered loads, against the seed's SLA.

Each run gets fresh topics (and, for the pyscheduler relay, a fresh database):
start the relay, wait for one warm-up message per input partition to come out,
produce at the offered rate for a while (delays uniform between min and max),
wait until the last deadline has passed and the output topic stops growing,
then count with a FRESH read of the output topic from the beginning (a reader
that tailed the broker while it was under load can skip acknowledged messages).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import click

from ...delay.output import OutputReader, send_warm_up
from ..delay import produce, relay_command, summarize
from ..stats import percentiles
from .tasks import scratch_database

SLA_RATE = 1000  # seeds/chronos.md: 1,000 msg/s ...
SLA_P999_MS = 500.0  # ... each fired within 500 ms of its deadline at p99.9
PARTITIONS = 2
GROUP = {"session.timeout.ms": "6000", "heartbeat.interval.ms": "1000"}  # tansu joins take ~half of it
LOG_DIR = Path(tempfile.gettempdir())
RELAYS = {"pyscheduler": "pyscheduler relay", "naive": "naive relay (consume, sleep, publish)"}


@dataclass
class Load:
    rate: int
    duration: float
    min_delay: float
    max_delay: float


@contextlib.contextmanager
def _relay(relay: str, dsn: str, bootstrap: str, input_topic: str, output_topic: str) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        if relay == "pyscheduler":
            from ... import migrate

            uri = stack.enter_context(scratch_database(dsn, f"pyscheduler_peers_delay_{os.getpid()}"))
            migrate.migrate(uri)
            argv = relay_command(uri, bootstrap, input_topic, output_topic, "--group-id", f"g-{input_topic}",
                                 *[f"-X{k}={v}" for k, v in GROUP.items()])
        else:
            argv = [sys.executable, "-m", "pyscheduler.bench.peers.naive_relay", bootstrap, input_topic, output_topic]
        log = stack.enter_context(open(LOG_DIR / f"peers-{relay}-relay-{input_topic}.log", "wb"))
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        try:
            yield
        except click.ClickException as exc:
            exc.message += f" (its log: {log.name})"
            raise
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        Path(log.name).unlink()  # kept only when the run failed


def read_all(bootstrap: str, topic: str, quiet: float = 2.0) -> list:
    """A fresh read of the whole topic from the beginning, until ``quiet`` seconds bring nothing new."""
    reader = OutputReader(bootstrap, topic)
    got: list = []
    try:
        last = time.monotonic()
        while time.monotonic() - last < quiet:
            batch = reader.messages(10000, 0.5)
            if batch:
                got += batch
                last = time.monotonic()
    finally:
        reader.close()
    return got


def run_delay(dsn: str, bootstrap: str, relay: str, load: Load) -> dict:
    """One run of one relay at one offered load: throughput, jitter percentiles, lost and duplicates."""
    from confluent_kafka import Producer

    from ...embedded import create_topics

    run = uuid.uuid4().hex[:6]
    input_topic, output_topic = f"peers.delay.in.{run}", f"peers.delay.out.{run}"
    create_topics(bootstrap, [input_topic], partitions=PARTITIONS)
    create_topics(bootstrap, [output_topic])
    tail = OutputReader(bootstrap, output_topic)  # progress only: a tailing reader can skip messages
    try:
        with _relay(relay, dsn, bootstrap, input_topic, output_topic):
            producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
            send_warm_up(producer, input_topic, PARTITIONS)
            if len(tail.messages(PARTITIONS, 90)) < PARTITIONS:
                raise click.ClickException(f"the {RELAYS[relay]} did not pass the warm-up messages within 90 s")
            progress = 0
            total, produced_for = produce(producer, input_topic, run, load.rate, load.duration, load.min_delay,
                                          load.max_delay)
            del producer
            # until the last deadline has passed, and then while the output still grows
            end = time.monotonic() + max(0.0, load.max_delay - (produced_for - load.duration)) + 0.5
            last = time.monotonic()
            while progress < total and (time.monotonic() < end or time.monotonic() - last < 3.0):
                got = len(tail.messages(total - progress, 0.2))
                if got:
                    progress, last = progress + got, time.monotonic()
    finally:
        tail.close()
    messages = read_all(bootstrap, output_topic)
    stats = summarize(messages, total, load.max_delay, load.min_delay)
    stats.update(relay=relay, name=RELAYS[relay], rate=load.rate, produced_rate=total / produced_for,
                 **percentiles(stats["lags"], (50, 99, 99.9)))
    stats["sla"] = meets_sla(stats)
    return stats


def meets_sla(stats: dict) -> bool:
    """The seed's SLA at this load: everything delivered, p99.9 of the jitter <= 500 ms (a relay
    that does not keep up with the offered rate falls ever later, and misses it that way)."""
    return stats["lost"] == 0 and stats["p99.9"] <= SLA_P999_MS


def run_loads(dsn: str, bootstrap: str, loads: list[Load], rounds: int, echo: Callable[[str], None]) -> list[dict]:
    """Every relay at every load, ``rounds`` times (loads in order within a round; which relay
    goes first alternates by load and by round); one result per run, with its round."""
    results = []
    for r in range(rounds):
        for k, load in enumerate(loads):
            order = list(RELAYS) if (k + r) % 2 == 0 else list(reversed(RELAYS))
            for relay in order:
                stats = run_delay(dsn, bootstrap, relay, load)
                stats["round"] = r + 1
                results.append(stats)
                echo(f"round {r + 1}/{rounds} delay {stats['name']} at {load.rate:,} msg/s: steady "
                     f"{stats['steady']:,.0f} msg/s, p50 {stats['p50']:.1f} ms, p99 {stats['p99']:.1f} ms, "
                     f"p99.9 {stats['p99.9']:.1f} ms, max {stats['max']:.1f} ms, lost {stats['lost']}, "
                     f"duplicates {stats['duplicates']}")
    return results


def by_relay_and_load(runs: list[dict]) -> list[list[dict]]:
    """The runs grouped per (relay, offered load): loads ascending, relays in RELAYS order."""
    groups: dict[tuple[int, int], list[dict]] = {}
    for run in runs:
        groups.setdefault((run["rate"], list(RELAYS).index(run["relay"])), []).append(run)
    return [groups[key] for key in sorted(groups)]
