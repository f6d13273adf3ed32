"""``pyscheduler bench delay``: end-to-end throughput and jitter of the delay queue.

Produces at a fixed rate R for D seconds, each message delayed uniformly
between --min-delay and --max-delay seconds, through N relay nodes (separate
processes, as deployed), and reads the output topic. Fire time is the output
message's timestamp (set by the relay when it publishes); jitter is fire time
minus deadline. Uses the servers given by --dsn/--bootstrap-servers, else
starts an embedded PostgreSQL and broker.
"""

from __future__ import annotations

import contextlib
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import click

from ..config import bootstrap_option, dsn_option, kafka_settings_option
from ..delay.message import delayed_headers
from ..delay.output import OutputReader, fresh_read, send_warm_up
from .stats import percentiles


def relay_command(dsn: str, bootstrap: str, input_topic: str, output_topic: str, *extra: str) -> list[str]:
    """argv of one relay node (``pyscheduler delay run``) in a new process."""
    return [sys.executable, "-m", "pyscheduler.delay", "run", "--dsn", dsn,
            "--bootstrap-servers", bootstrap, "--input-topic", input_topic, "--output-topic", output_topic,
            *extra]


def produce(producer, topic: str, run: str, rate: int, duration: float, min_delay: float,
            max_delay: float) -> tuple[int, float]:
    """Produce ``rate`` messages/s for ``duration`` seconds, each due uniformly ``min_delay`` to
    ``max_delay`` seconds later (value ``b"<i> <deadline epoch>"``, id ``<run>-<i>``), and flush;
    (messages, seconds taken)."""
    total = int(rate * duration)
    start = time.time()
    sent = 0
    while sent < total:
        due = min(total, int((time.time() - start) * rate) + 1)
        now = time.time()
        for i in range(sent, due):
            deadline = now + random.uniform(min_delay, max_delay)
            producer.produce(topic, value=b"%d %.6f" % (i, deadline),
                             headers=delayed_headers(f"{run}-{i}", datetime.fromtimestamp(deadline, timezone.utc)))
        sent = due
        producer.poll(0)
        time.sleep(0.002)
    producer.flush(30)
    return total, time.time() - start


def summarize(messages: list, total: int, max_delay: float, min_delay: float = 0.0) -> dict:
    """Output messages of produce() (others, e.g. warm-up ones, are left out): received, duplicates,
    lost, steady-state and whole-window msg/s, and the sorted lags (fire time - deadline, ms).

    Steady state: with delays uniform in [min_delay, max_delay], deadlines come at the full
    rate from the first message plus max_delay to the last plus min_delay, i.e. the deadlines'
    span without its first and last (max_delay - min_delay) seconds; what fired in that window
    (by fire time) over its length. The window comes from the deadlines, not the fire times,
    so a relay that fires late or in bursts still has one."""
    values = [(m.timestamp()[1] / 1000.0, *m.value().split()) for m in messages
              if not m.value().startswith(b"warmup-")]
    unique = {i for _, i, _ in values}
    lags = sorted((ts - float(deadline)) * 1000 for ts, _, deadline in values)
    if not lags:
        raise click.ClickException("nothing arrived on the output topic")
    fired = [ts for ts, _, _ in values]
    deadlines = [float(deadline) for _, _, deadline in values]
    spread = max_delay - min_delay
    t0, t1 = min(deadlines) + spread, max(deadlines) - spread
    steady = sum(1 for ts in fired if t0 <= ts <= t1) / (t1 - t0) if t1 > t0 else float("nan")
    whole = len(values) / (max(fired) - min(fired)) if max(fired) > min(fired) else float("nan")
    return {"received": len(values), "duplicates": len(values) - len(unique), "lost": max(0, total - len(unique)),
            "steady": steady, "whole": whole, "lags": lags}


def stop_processes(procs: list[subprocess.Popen], timeout: float = 30) -> None:
    """SIGTERM every relay process (they finish in-flight fires), SIGKILL what is left after ``timeout``."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def servers(dsn: str | None, bootstrap: str | None):
    from .. import embedded

    started: list = []
    with tempfile.TemporaryDirectory(prefix="pyscheduler-bench-") as tmp:
        try:
            if not dsn:
                pg = embedded.Postgres(Path(tmp) / "pg").start()
                started.append(pg)
                dsn = pg.dsn()
            if not bootstrap:
                broker = embedded.Kafka(Path(tmp) / "kafka").start()
                started.append(broker)
                bootstrap = broker.bootstrap
            yield dsn, bootstrap
        finally:
            for server in reversed(started):
                server.stop()


@click.command("delay")
@dsn_option
@bootstrap_option
@kafka_settings_option
@click.option("--rate", type=click.IntRange(min=1), default=1000, show_default=True, help="Messages per second.")
@click.option("--duration", type=click.FloatRange(min=1), default=20, show_default=True, help="Seconds of producing.")
@click.option("--min-delay", type=float, default=1.0, show_default=True, help="Shortest delay, seconds.")
@click.option("--max-delay", type=float, default=5.0, show_default=True, help="Longest delay, seconds.")
@click.option("--nodes", type=click.IntRange(min=1), default=1, show_default=True, help="Relay processes.")
@click.option("--partitions", type=click.IntRange(min=1), default=2, show_default=True,
              help="Partitions of the input topic.")
@click.option("--relay-arg", multiple=True, help="Extra flag for each relay, e.g. --relay-arg=--timing-advance-ms=10.")
def bench(dsn, kafka_bootstrap, kafka_settings, rate, duration, min_delay, max_delay, nodes, partitions,
          relay_arg) -> None:
    """Produce at --rate for --duration through relay nodes; print throughput and jitter percentiles."""
    from confluent_kafka import Producer

    from .. import migrate
    from ..embedded import create_topics

    with servers(dsn, kafka_bootstrap) as (dsn, bootstrap):
        migrate.migrate(dsn)
        run = uuid.uuid4().hex[:6]
        input_topic, output_topic = f"bench.delay.in.{run}", f"bench.delay.out.{run}"
        create_topics(bootstrap, [input_topic], partitions=partitions, settings=kafka_settings)
        create_topics(bootstrap, [output_topic], settings=kafka_settings)
        # a short session timeout: group joins on tansu take about half of it
        group = {"session.timeout.ms": "6000", "heartbeat.interval.ms": "1000", **kafka_settings}
        extra = [f"-X{k}={v}" for k, v in group.items()] + list(relay_arg)
        procs = [subprocess.Popen(relay_command(dsn, bootstrap, input_topic, output_topic, "--group-id",
                                                f"bench-{run}", *extra), stdin=subprocess.DEVNULL)
                 for _ in range(nodes)]
        reader = None
        try:
            reader = OutputReader(bootstrap, output_topic, kafka_settings)
            producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **kafka_settings})
            click.echo(f"{nodes} relay node(s) starting; waiting for a warm-up message to come through ...")
            send_warm_up(producer, input_topic, partitions)
            if len(reader.messages(partitions, 60)) < partitions:
                raise click.ClickException("the relay did not pass the warm-up messages within 60s")
            total = int(rate * duration)
            got: list = []
            read_thread = threading.Thread(target=lambda: got.extend(reader.messages(total, duration + max_delay + 30)))
            read_thread.start()
            click.echo(f"{nodes} relay node(s); producing {rate}/s for {duration:.0f}s "
                       f"with delays {min_delay:g}-{max_delay:g}s ...")
            total, produced_for = produce(producer, input_topic, run, rate, duration, min_delay, max_delay)
            del producer  # before the servers stop: no reconnect noise
            click.echo(f"produced {total} in {produced_for:.1f}s ({total / produced_for:.0f}/s); waiting ...")
            read_thread.join()
            tailed = len(got)
            # count from a fresh read of the output: the live reader is a progress hint only
            got = [m for m in fresh_read(bootstrap, output_topic, total + partitions, idle=2.0, timeout=120,
                                         settings=kafka_settings) if not m.value().startswith(b"warmup-")]
        finally:
            stop_processes(procs)
            if reader is not None:
                reader.close()
        stats = summarize(got, total, max_delay, min_delay)
        click.echo(f"received {stats['received']} ({stats['duplicates']} duplicates), lost {stats['lost']} "
                   f"(a fresh read of the output; the live reader saw {tailed})")
        click.echo(f"end-to-end throughput: {stats['steady']:.0f} msg/s in steady state; "
                   f"{stats['whole']:.0f} msg/s over the whole firing window")
        lags = stats["lags"]
        click.echo("fire time - deadline (ms): " + ", ".join(f"{k} {v:.1f}" for k, v in
                                                              percentiles(lags).items())
                   + f", min {lags[0]:.1f}")
