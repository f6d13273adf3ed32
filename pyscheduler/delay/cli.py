"""``pyscheduler delay ...``: the delay queue's commands and its capability contract.

Every flag of ``delay run`` has an environment variable PYSCHEDULER_DELAY_<FLAG>
(the servers keep the shared PYSCHEDULER_DSN / PYSCHEDULER_KAFKA_BOOTSTRAP /
PYSCHEDULER_KAFKA_SETTINGS). ``pyscheduler run`` reads the same variables, with
the default topics ``pyscheduler.delay.input`` / ``pyscheduler.delay.output``,
which its relay creates when missing once Kafka answers (on the embedded broker,
or any broker that allows it).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone

import click

from ..config import (bootstrap_option, dsn_option, env, http_options, kafka_settings_option, option,
                      require_dsn, wait_for_database)
from ..daemon import RunContext, install_signal_handlers
from ..db import Database
from ..errors import ConfigError
from ..bench.stats import percentiles
from . import sqlapi as sql
from .message import delayed_headers
from .output import OutputReader, fresh_read, send_warm_up
from .relay import MIN_HOLD_MS, Relay, RelayConfig

log = logging.getLogger("pyscheduler.delay")

DEFAULT_INPUT = "pyscheduler.delay.input"
DEFAULT_OUTPUT = "pyscheduler.delay.output"
DEFAULTS = {"group_id": "pyscheduler-delay", "timing_advance_ms": 50, "hold_ms": 5000, "poll_ms": 100,
            "detect_ms": 500, "consume_batch": 2000, "fire_batch": 2000}


def _env(name: str) -> str:
    return env("delay_" + name)


def relay_options(f):
    """The relay's flags; each mirrored by PYSCHEDULER_DELAY_<FLAG>."""
    opts = [
        option("--input-topic", envvar=_env("input_topic"), default=DEFAULT_INPUT,
               help="Topic applications publish delayed messages to."),
        option("--output-topic", envvar=_env("output_topic"), default=DEFAULT_OUTPUT,
               help="Topic the delayed messages are published to."),
        option("--group-id", envvar=_env("group_id"), default=DEFAULTS["group_id"],
               help="Consumer group of the input topic (all nodes share it)."),
        option("--dlq-topic", envvar=_env("dlq_topic"), default=None,
               help="Dead-letter topic for malformed messages (default: log and drop)."),
        option("--timing-advance-ms", envvar=_env("timing_advance_ms"),
               type=click.IntRange(min=0, max=sql.MAX_ADVANCE_MS), default=DEFAULTS["timing_advance_ms"],
               help="Fire this long before the deadline."),
        option("--hold-ms", envvar=_env("hold_ms"), type=click.IntRange(min=MIN_HOLD_MS), default=DEFAULTS["hold_ms"],
               help="A node holding a ready message longer than this is suspected of failure (at least 1000 "
                    "and twice --poll-ms and --detect-ms; docs/operations.md)."),
        option("--poll-ms", envvar=_env("poll_ms"), type=click.IntRange(min=1), default=DEFAULTS["poll_ms"],
               help="Longest sleep between two claims (plus random jitter)."),
        option("--detect-ms", envvar=_env("detect_ms"), type=click.IntRange(min=1), default=DEFAULTS["detect_ms"],
               help="Interval of the stuck-message scan (plus random jitter)."),
        option("--consume-batch", envvar=_env("consume_batch"), type=click.IntRange(min=1),
               default=DEFAULTS["consume_batch"], help="Most input messages enqueued per round trip."),
        option("--fire-batch", envvar=_env("fire_batch"), type=click.IntRange(min=1),
               default=DEFAULTS["fire_batch"], help="Most messages claimed per round trip."),
    ]
    for deco in reversed(opts):
        f = deco(f)
    return f


@click.group("delay")
def group() -> None:
    """Delay queue: a Kafka topic that adds a delay (input topic -> PostgreSQL -> output topic)."""


@group.command("run")
@dsn_option
@bootstrap_option
@kafka_settings_option
@relay_options
@http_options(_env("metrics_port"))
def run_cmd(dsn, kafka_bootstrap, kafka_settings, http_port, http_host, **flags) -> None:
    """Run one relay node until SIGTERM/Ctrl-C (finishes in-flight fires, commits, exits 0)."""
    require_dsn(dsn, reach=False)
    if not kafka_bootstrap:
        raise click.UsageError("no Kafka: pass --bootstrap-servers or set PYSCHEDULER_KAFKA_BOOTSTRAP")
    try:  # a flag value the relay refuses (e.g. --hold-ms shorter than twice --poll-ms): a usage error
        config = RelayConfig(dsn=dsn, bootstrap_servers=kafka_bootstrap, kafka_settings=kafka_settings, **flags)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    wait_for_database(dsn, http_host, http_port)
    stop = threading.Event()
    install_signal_handlers(stop)
    from ..web.endpoint import run_serving

    # Kafka down at start: the relay waits for it, /readyz names it; topics missing once it
    # answers: the relay cannot start, and the command exits 1 saying which
    raise SystemExit(run_serving([Relay(config)], stop, http_host, http_port, dsn=dsn,
                                 kafka_bootstrap=kafka_bootstrap, kafka_settings=kafka_settings))


@group.command("status")
@dsn_option
def status_cmd(dsn) -> None:
    """Print the delay_queue and delay_ready_by_node views."""
    require_dsn(dsn)
    with Database(dsn, max_size=1) as db:
        for view in (sql.DELAY_QUEUE, sql.DELAY_READY_BY_NODE):
            for row in db.query(view.select()):
                click.echo(f"{view}: " + ", ".join(f"{k}={v}" for k, v in row.items()))


def _config_from_env(ctx: RunContext) -> RelayConfig:
    """The relay of ``pyscheduler run``: PYSCHEDULER_DELAY_* variables, else the defaults."""
    values = {"input_topic": DEFAULT_INPUT, "output_topic": DEFAULT_OUTPUT, "dlq_topic": None, **DEFAULTS}
    for name, default in list(values.items()):
        raw = os.environ.get(_env(name))
        if raw:
            try:
                values[name] = int(raw) if isinstance(default, int) else raw
            except ValueError:
                raise ConfigError(f"{_env(name)} must be an integer, got {raw!r}") from None
    return RelayConfig(dsn=ctx.dsn, bootstrap_servers=ctx.kafka_bootstrap, kafka_settings=ctx.kafka_settings,
                       create_topics=True, **values)


def daemons(ctx: RunContext) -> list:
    """One relay node for ``pyscheduler run``; none without Kafka."""
    if not ctx.kafka_bootstrap:
        log.info("delay queue: no Kafka configured, relay skipped")
        return []
    cfg = _config_from_env(ctx)
    log.info("delay queue: relay %s -> %s", cfg.input_topic, cfg.output_topic)
    return [Relay(cfg)]


# -- demo -----------------------------------------------------------------------

def demo(ctx: RunContext, echo) -> None:
    """Publish delayed messages through a relay, print throughput and jitter from the output topic."""
    if not ctx.kafka_bootstrap:
        echo("no Kafka configured: delay queue demo skipped")
        return
    from confluent_kafka import Producer

    from ..embedded import create_topics

    suffix = uuid.uuid4().hex[:6]
    cfg = RelayConfig(dsn=ctx.dsn, bootstrap_servers=ctx.kafka_bootstrap, kafka_settings=ctx.kafka_settings,
                      input_topic=f"demo.delay.in.{suffix}", output_topic=f"demo.delay.out.{suffix}",
                      group_id=f"demo-{suffix}")
    create_topics(ctx.kafka_bootstrap, [cfg.input_topic, cfg.output_topic], settings=ctx.kafka_settings)
    reader = OutputReader(ctx.kafka_bootstrap, cfg.output_topic, ctx.kafka_settings)
    stop = threading.Event()
    relay = Relay(cfg)
    thread = threading.Thread(target=relay.run, args=(stop,), name="demo-relay", daemon=True)
    thread.start()
    count, spread = 3000, 2.0
    echo(f"relay node {relay.node}: {cfg.input_topic} -> {cfg.output_topic}; waiting for it to join ...")
    producer = Producer({"bootstrap.servers": ctx.kafka_bootstrap, "linger.ms": 5, **ctx.kafka_settings})
    send_warm_up(producer, cfg.input_topic, 1)
    if not reader.messages(1, 60):
        stop.set()
        echo("the relay did not pass a warm-up message within 60s; demo skipped")
        return
    echo(f"publishing {count} messages over {spread:.0f}s, each delayed 1-3 s ...")
    start = time.time()
    for i in range(count):
        due = start + spread * i / count
        while time.time() < due:
            time.sleep(0.001)
        deadline = datetime.now(timezone.utc) + timedelta(seconds=1 + 2 * (i % 100) / 100)
        producer.produce(cfg.input_topic, value=f"{deadline.timestamp():.6f}".encode(), key=f"k{i % 10}".encode(),
                         headers=[*delayed_headers(f"demo-{suffix}-{i}", deadline), ("app", b"demo")])
        producer.poll(0)
    producer.flush(10)
    try:
        reader.read(count, timeout=30)  # progress: the live reader may skip some (docs/operations.md)
        fresh = fresh_read(ctx.kafka_bootstrap, cfg.output_topic, count + 1, settings=ctx.kafka_settings)
        got = [(m.timestamp()[1] / 1000.0, m.value()) for m in fresh if not m.value().startswith(b"warmup-")]
    finally:
        stop.set()
        thread.join(30)
        reader.close()
    lags = [(ts - float(value)) * 1000 for ts, value in got]
    if not lags:
        echo("no message arrived on the output topic")
        return
    first, last = min(ts for ts, _ in got), max(ts for ts, _ in got)
    echo(f"received {len(got)}/{count} on the output topic: {len(got) / max(last - first, 1e-3):.0f} msg/s "
         f"over the firing window (published at {count / spread:.0f} msg/s)")
    echo("fire time minus deadline (ms; negative = early, the timing advance is "
         f"{cfg.timing_advance_ms} ms): " + ", ".join(f"{k} {v:.1f}" for k, v in percentiles(lags).items()))
    with Database(ctx.dsn, max_size=1) as db:
        row = db.query(sql.DELAY_QUEUE.select())[0]
    echo(f"left in the database: {row['waiting']} waiting, {row['ready']} ready (psql: {sql.DELAY_QUEUE.select()};)")
