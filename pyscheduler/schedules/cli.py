"""``pyscheduler schedules ...``: the schedule daemons, admin commands and demo
(the capability contract of pyscheduler/daemon.py).

``schedules run`` runs the index relay, ``--executors`` executors and the cleanup
loop; ``pyscheduler run`` runs the same from the environment
(``PYSCHEDULER_SCHEDULES_<FLAG>``). Without Redis (``--redis-url`` /
``PYSCHEDULER_REDIS_URL``) the executors run in degraded mode only (critical
schedules from PostgreSQL).
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import threading
import time
import uuid
from datetime import timedelta
from typing import get_args

import click

from ..calls import duration_text, jsonable
from ..clihints import HintedGroup
from ..config import (DURATION, INSTANT, bootstrap_option, dsn_option, env, http_options, kafka_settings_option, option,
                      redis_option, require_dsn, require_text, wait_for_database)
from ..daemon import RunContext, install_signal_handlers
from ..db import Database
from . import sqlapi as sql
from .client import UNBOUNDED, RunOutcome, ScheduleClient
from .demo import demo  # the capability's demo (`pyscheduler demo` calls it)
from .executor import Executor, ExecutorConfig
from .index import DEFAULT_PREFIX, Shards
from .relay import Cleanup, IndexRelay, mirror_entries

log = logging.getLogger("pyscheduler.schedules")

# flag -> (default, help); each has PYSCHEDULER_SCHEDULES_<FLAG>
RUN_FLAGS = {
    "executors": (1, "Executors in this process."),
    "relay": (1, "Index relays in this process (0: none; run at least one somewhere)."),
    "prefix": (DEFAULT_PREFIX, "Prefix of the Redis keys."),
    "shards": (0, "Shards of the Redis index ({PREFIX:0} .. {PREFIX:N-1}, one cluster slot each; schedule id mod N). "
                  "0: 1 on a single node, 16 on redis+cluster://. Fixed per deployment: every executor and relay "
                  "of one prefix must use the same N."),
    "batch": (1000, "Most due members claimed per Lua call."),
    "poll_ms": (100, "Longest sleep between two claims."),
    "stuck_after_ms": (30000, "A claim older than this is reset (its executor died)."),
    "check_every_ms": (5000, "Period of the global stuck-claim check."),
    "fire_timeout_ms": (10000, "Kafka delivery and HTTP request timeout."),
    "http_concurrency": (64, "HTTP requests in flight per executor."),
    "http_per_host": (4, "HTTP requests in flight per executor to one host (a slow host delays only its own "
                         "schedules)."),
    "reconcile_s": (60, "Period of the relay's full reconcile."),
    "cleanup_s": (60, "Period of the executions cleanup."),
}


def _env(name: str) -> str:
    return env("schedules_" + name)


def run_options(f):
    for name, (default, text) in reversed(RUN_FLAGS.items()):
        kind = click.IntRange(min=0 if name in ("relay", "shards") else 1,
                              max=sql.MAX_SHARDS if name == "shards" else None) if isinstance(default, int) else str
        f = option("--" + name.replace("_", "-"), name, envvar=_env(name), type=kind, default=default,
                   show_default=True, help=text)(f)
    return f


def build_daemons(dsn: str, redis_url: str | None, kafka_bootstrap: str | None, kafka_settings: dict,
                  **flags) -> list:
    values = {name: default for name, (default, _) in RUN_FLAGS.items()}
    values.update({k: v for k, v in flags.items() if v is not None})
    out: list = [Cleanup(dsn, interval=values["cleanup_s"])]
    if redis_url and values["relay"]:
        out.insert(0, IndexRelay(dsn, redis_url, prefix=values["prefix"], reconcile_interval=values["reconcile_s"],
                                 shards=values["shards"]))
    for _ in range(values["executors"]):
        out.append(Executor(ExecutorConfig(
            dsn=dsn, redis_url=redis_url or "redis://127.0.0.1:1/0", kafka_bootstrap=kafka_bootstrap,
            kafka_settings=kafka_settings, prefix=values["prefix"], shards=values["shards"], batch=values["batch"],
            poll_ms=values["poll_ms"], stuck_after_ms=values["stuck_after_ms"],
            check_every_ms=values["check_every_ms"], fire_timeout_ms=values["fire_timeout_ms"],
            http_concurrency=values["http_concurrency"], http_per_host=values["http_per_host"])))
    return out


class _Schedules(HintedGroup):
    hints = {
        "list_schedules() shows the schedules there are.": "pyscheduler schedules list shows the schedules there are.",
        "Use update_schedule() to change it, or delete_schedule() first.":
            "Change it with pyscheduler schedules update NAME, or pyscheduler schedules delete NAME first.",
        "Lengthen the recurrence or shrink retry_attempts / retry_base / retry_jitter; see retry_worst_case().":
            "Lengthen the recurrence (--every, --cron) or shrink --retry-attempts / --retry-base / --retry-jitter.",
    }


@click.group("schedules", cls=_Schedules)
def group() -> None:
    """Recurring schedules: interval and cron, PostgreSQL as truth, a Redis sorted set as hot index."""


@group.command("run")
@dsn_option
@redis_option
@bootstrap_option
@kafka_settings_option
@http_options(_env("metrics_port"))
@run_options
def run_cmd(dsn, redis_url, kafka_bootstrap, kafka_settings, http_port, http_host, **flags) -> None:
    """Run the index relay, the executors and the cleanup until SIGTERM/Ctrl-C."""
    from ..web.endpoint import run_serving

    wait_for_database(dsn, http_host, http_port)
    if not redis_url:
        log.warning("no Redis configured: degraded mode only (critical schedules fire from PostgreSQL)")
    stop = threading.Event()
    install_signal_handlers(stop)
    sys.exit(run_serving(build_daemons(dsn, redis_url, kafka_bootstrap, kafka_settings, **flags), stop,
                         http_host, http_port, dsn=dsn, redis_url=redis_url, kafka_bootstrap=kafka_bootstrap,
                         kafka_settings=kafka_settings))


def _db(dsn):
    return Database(require_dsn(dsn), max_size=1)


def _client(dsn, action):
    """``action(ScheduleClient)`` on a short-lived pool; its result."""
    with _db(dsn) as db:
        return action(ScheduleClient(db))


def _echo_json(obj) -> None:
    """A result as JSON: instants in ISO 8601, durations as the flags take them (30s, 5m)."""
    click.echo(json.dumps(jsonable(obj), indent=2, default=str))


def _payload(text: str, flag: str = "--payload"):
    """--payload (or another JSON flag): a JSON value PostgreSQL's jsonb stores (no NaN or
    Infinity, no NUL character, UTF-8), else a usage error naming the flag."""
    def constant(word: str):
        raise ValueError(f"{word} is not JSON (jsonb has no NaN or Infinity)")

    def number(word: str) -> float:
        value = float(word)
        if not math.isfinite(value):
            raise ValueError(f"{word} is out of range (jsonb has no Infinity)")
        return value

    def nul(v) -> bool:
        if isinstance(v, str):
            return "\x00" in v
        if isinstance(v, dict):
            return any(nul(k) or nul(x) for k, x in v.items())
        return isinstance(v, list) and any(nul(x) for x in v)

    try:
        value = json.loads(text, parse_constant=constant, parse_float=number)
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except (ValueError, UnicodeEncodeError, RecursionError) as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint=flag) from None
    if nul(value):
        raise click.BadParameter("jsonb cannot store a \\u0000 (NUL) character", param_hint=flag)
    return value


def _schedule_options(update: bool):
    """The options create and update share; for update each is optional (unchanged when left out)."""
    then = "" if not update else " (left out: unchanged)."

    def decorate(f):
        opts = [
            click.option("--every", type=DURATION, default=None, help="Fixed interval (e.g. 30s, 5m)" + (
                "; replaces --cron." if update else ".")),
            click.option("--cron", default=None, help="Cron expression, 5 fields or 6 with seconds" + (
                "; replaces --every." if update else ".")),
            click.option("--tz", default=None,
                         help="IANA time zone of the cron expression" + (then or " (default UTC).")),
            click.option("--kafka", "kafka_topic", default=None, metavar="TOPIC", help="Target: a Kafka topic."),
            click.option("--http", "http_url", default=None, metavar="URL", help="Target: an HTTP URL (POST)."),
            click.option("--task", "task_queue", default=None, metavar="QUEUE", help="Target: a leased-task queue."),
            click.option("--priority", type=int, default=None, help="Priority of task targets."),
            click.option("--payload", default=None, help="JSON payload."),
            click.option("--task-options", default=None, metavar="JSON",
                         help='Options of the tasks a --task target submits: {"max_attempts": N, '
                              '"concurrency_key": "..."}' + ("; {} removes them." if update else ".")),
            click.option("--retry-attempts", type=click.IntRange(0), default=None),
            click.option("--retry-base", type=DURATION, default=None),
            click.option("--retry-jitter", type=DURATION, default=None),
            click.option("--critical/--not-critical", default=None,
                         help="Fire from PostgreSQL while Redis is down" + (then or " (default: not critical).")),
            click.option("--catchup-window", type=DURATION, default=None),
            click.option("--overlap", type=click.Choice(["allow", "skip", "buffer_one"]), default=None),
            click.option("--start", "start_at", type=INSTANT, default=None,
                         help="First run not before this instant, e.g. 2030-01-01T09:00:00+02:00; without an offset: "
                              "UTC."),
            click.option("--end", "end_at", type=INSTANT, default=None,
                         help="No run after this instant (as --start; without an offset: UTC)."),
            click.option("--max-runs", type=click.IntRange(1), default=None),
        ]
        if update:
            opts += [click.option("--no-start", is_flag=True, help="Remove the --start bound."),
                     click.option("--no-end", is_flag=True, help="Remove the --end bound."),
                     click.option("--no-max-runs", is_flag=True, help="Remove the --max-runs limit.")]
        for opt in reversed(opts):
            f = opt(f)
        return f

    return decorate


def _fields(name, kafka_topic, http_url, task_queue, payload, *, required: bool, **fields) -> dict:
    """The client's keyword arguments from the shared options, checked as usage errors."""
    targets = [(k, v) for k, v in (("kafka", kafka_topic), ("http", http_url), ("task", task_queue)) if v]
    if len(targets) > 1 or (required and not targets):
        raise click.UsageError(("give exactly one target: " if required else "give at most one target: ")
                               + "--kafka TOPIC, --http URL or --task QUEUE")
    if fields.get("every") is not None and fields.get("cron") is not None:
        raise click.UsageError("give at most one of --every and --cron")
    for hint, value in (("NAME", name), ("--kafka/--http/--task", targets[0][1] if targets else None),
                        ("--cron", fields.get("cron")), ("--tz", fields.get("tz"))):
        require_text(value, hint)
    if targets:
        fields["target_kind"], fields["target"] = targets[0]
    if payload is not None:
        fields["payload"] = _payload(payload)
    if fields.get("task_options") is not None:
        fields["task_options"] = _payload(fields["task_options"], "--task-options")
    return {k: v for k, v in fields.items() if v is not None}


def _topic_check_options(f):
    """--bootstrap-servers and -X of create/update: where --kafka TOPIC is looked up."""
    return bootstrap_option(kafka_settings_option(f))


def check_topic(bootstrap: str | None, settings: dict, topic: str | None) -> str | None:
    """A warning when Kafka is configured and its metadata says ``topic`` does not exist (or
    cannot be asked); None when it exists or no Kafka is configured. Asks without
    auto-creation: a broker that creates topics on first use would create it just by being
    asked."""
    if not bootstrap or not topic:
        return None
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    try:
        admin = AdminClient({"bootstrap.servers": bootstrap, **settings, "allow.auto.create.topics": False,
                             "log_level": 0})
        found = admin.list_topics(topic=topic, timeout=5).topics.get(topic)
    except (KafkaException, ValueError) as exc:
        return f"warning: could not check that topic {topic!r} exists on {bootstrap}: {exc}"
    if found is not None and found.error is None:
        return None
    if found is not None and found.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
        return f"warning: could not check that topic {topic!r} exists on {bootstrap}: {found.error.str()}"
    return (f"warning: topic {topic!r} does not exist on {bootstrap}. Unless the broker creates topics on "
            f"first use, create it (kafka-topics.sh --create --topic {topic}): until then each try fails "
            f"with \"topic {topic!r} does not exist\" (schedules_failing)")


@group.command("create")
@dsn_option
@_topic_check_options
@click.argument("name")
@_schedule_options(update=False)
def create_cmd(dsn, kafka_bootstrap, kafka_settings, name, kafka_topic, http_url, task_queue, payload,
               **fields) -> None:
    """Create a schedule NAME (exactly one of --every/--cron, one of --kafka/--http/--task).
    Instants without a UTC offset (--start, --end) are UTC, whatever PGTZ says. With --kafka
    TOPIC and a Kafka configured (--bootstrap-servers), a warning on stderr when the broker
    says the topic does not exist (the schedule is created all the same)."""
    if (fields.get("every") is None) == (fields.get("cron") is None):
        raise click.UsageError("give exactly one of --every and --cron")
    args = _fields(name, kafka_topic, http_url, task_queue, payload, required=True, **fields)
    _echo_json(_client(dsn, lambda client: client.create(name, **args)))
    warning = check_topic(kafka_bootstrap, kafka_settings, kafka_topic)
    if warning:
        click.echo(warning, err=True)


@group.command("update")
@dsn_option
@_topic_check_options
@click.argument("name")
@_schedule_options(update=True)
def update_cmd(dsn, kafka_bootstrap, kafka_settings, name, kafka_topic, http_url, task_queue, payload, no_start,
               no_end, no_max_runs, **fields) -> None:
    """Change schedule NAME: only the options given (--every replaces --cron and vice versa;
    --no-start, --no-end and --no-max-runs remove a bound). A timing change recomputes the
    next run from now. A new --kafka TOPIC is looked up as by create."""
    for flag, removal, name_ in (("--start", no_start, "start_at"), ("--end", no_end, "end_at"),
                                 ("--max-runs", no_max_runs, "max_runs")):
        if removal:
            if fields.get(name_) is not None:
                raise click.UsageError(f"give {flag} or --no-{flag[2:]}, not both")
            fields[name_] = UNBOUNDED
    args = _fields(name, kafka_topic, http_url, task_queue, payload, required=False, **fields)
    if not args:
        raise click.UsageError("nothing to change: give at least one option (see --help)")
    _echo_json(_client(dsn, lambda client: client.update(name, **args)))
    warning = check_topic(kafka_bootstrap, kafka_settings, kafka_topic)
    if warning:
        click.echo(warning, err=True)


def _name_command(command: str, doc: str, action, extra=None):
    params = [click.Argument(["name"])] + (extra or [])

    def callback(dsn, name, **kw):
        require_text(name, "NAME")
        _echo_json(_client(dsn, lambda client: action(client, name, **kw)))

    cmd = click.Command(command, callback=callback, params=params, help=doc)
    dsn_option(cmd)
    group.add_command(cmd)


_name_command("pause", "Pause schedule NAME (it stays, nothing fires).", ScheduleClient.pause,
              [click.Option(["--note"], default=None, help="Why (shown by list and get).")])
_name_command("resume", "Resume schedule NAME from its next regular run.", ScheduleClient.resume)
_name_command("trigger", "Fire schedule NAME once now, out of band.", ScheduleClient.trigger)
_name_command("delete", "Delete schedule NAME (true; false when there was none).", ScheduleClient.delete)
_name_command("get", "Show schedule NAME.", ScheduleClient.get)


@group.command("list")
@dsn_option
@click.option("--name-like", default=None, metavar="PATTERN", help="Names LIKE this pattern (% and _ wildcards).")
@click.option("--target-kind", type=click.Choice(["kafka", "http", "task"]), default=None)
@click.option("--paused/--not-paused", default=None, help="Only paused (or only not paused) schedules.")
@click.option("--critical/--not-critical", default=None, help="Only critical (or only not critical) schedules.")
@click.option("--limit", type=click.IntRange(1), default=1000, show_default=True)
def list_cmd(dsn, name_like, target_kind, paused, critical, limit) -> None:
    """List schedules by name: recurrence, target, state, next run, runs."""
    require_text(name_like, "--name-like")
    schedules = _client(dsn, lambda client: client.list(name_like, target_kind, paused, critical, limit))
    for s in schedules:
        rec = s.cron or duration_text(s.every)
        state = "paused" if s.paused else ("ended" if s.next_run_at is None else "active")
        target = "-" if s.details_hidden else s.target  # another role's schedule: its target is not shown
        next_run = s.next_run_at.isoformat() if s.next_run_at else None
        click.echo(f"{s.name:<24} {rec:<16} {s.target_kind}:{target:<24} {state:<7} next={next_run} "
                   f"runs={s.runs_count}")
    if len(schedules) == limit:
        click.echo(f"(the first {limit}: --limit for more)")


@group.command("runs")
@dsn_option
@click.argument("name")
@click.option("--outcome", type=click.Choice(get_args(RunOutcome)), default=None,
              help="Only executions with this outcome.")
@click.option("--since", type=INSTANT, default=None, help="Only occurrences expected at or after this instant.")
@click.option("--limit", type=click.IntRange(1), default=20, show_default=True)
def runs_cmd(dsn, name, outcome, since, limit) -> None:
    """Executions of schedule NAME, newest first, and its execution counts."""
    require_text(name, "NAME")

    def show(client: ScheduleClient):
        for r in client.runs(name, outcome, since, limit):
            click.echo("  ".join(f"{k}={v}" for k, v in jsonable(r).items() if v is not None))
        return {o: client.count(name, o) for o in get_args(RunOutcome)}

    counts = _client(dsn, show)
    click.echo(f"execution count: {counts['fired']} (" + ", ".join(f"{k} {v}" for k, v in counts.items()) + ")")


@group.command("next")
@dsn_option
@click.argument("name")
@click.option("-n", "count", type=click.IntRange(1, 1000), default=5, show_default=True)
def next_cmd(dsn, name, count) -> None:
    """The next N fire times of schedule NAME (check an expression before trusting it)."""
    require_text(name, "NAME")
    for at in _client(dsn, lambda client: client.next(name, count)):
        click.echo(at.isoformat())


@group.command("resync")
@dsn_option
@redis_option
@option("--prefix", envvar=_env("prefix"), default=DEFAULT_PREFIX, show_default=True)
@option("--shards", envvar=_env("shards"), type=click.IntRange(0, sql.MAX_SHARDS), default=0, show_default=True,
        help=RUN_FLAGS["shards"][1])
@click.option("--batch", type=click.IntRange(1), default=1000, show_default=True)
@click.option("--lease", type=click.FloatRange(sql.MIN_RESYNC_LEASE_S, sql.MAX_RESYNC_LEASE_S), default=30.0,
              show_default=True,
              help="Seconds a batch stays leased to its taker (a taker that dies before writing it: "
                   "another takes it again after this).")
def resync_cmd(dsn, redis_url, prefix, shards, batch, lease) -> None:
    """Rebuild the Redis index from PostgreSQL now (critical schedules first), with a progress bar.
    Running executors join in. Every shard of a sharded index, in one pass."""
    if not redis_url:
        raise click.UsageError("no Redis: pass --redis-url or set PYSCHEDULER_REDIS_URL")
    index = Shards.from_url(redis_url, prefix, shards)
    sync_id = uuid.uuid4().hex
    for shard in index.shards:
        shard.force_resync(sync_id=sync_id)
    owner = f"cli-{uuid.uuid4().hex[:8]}"
    with _db(dsn) as db:
        total = db.call_one(sql.RESYNC_PROGRESS, sync_id=sync_id)["total"]
        tty = sys.stdout.isatty()
        with click.progressbar(length=total, label=f"resync {sync_id[:8]}", show_pos=True) as bar:
            shown = 0
            while True:
                # each take acknowledges the batch written before it (a batch taken by a
                # taker that died is taken again once its lease expires)
                rows = db.call(sql.RESYNC_TAKE, sync_id=sync_id, owner=owner, max_schedules=batch,
                               lease=timedelta(seconds=lease))
                if rows:
                    index.mirror(mirror_entries(rows))
                progress = db.call_one(sql.RESYNC_PROGRESS, sync_id=sync_id)
                done = min(total, progress["done"])
                bar.update(max(0, done - shown))
                if not tty and done > shown:  # no bar without a terminal: one line per batch
                    click.echo(f"  {done}/{total}")
                shown = max(shown, done)
                if not rows:
                    if progress["complete"]:
                        break
                    time.sleep(0.2)  # other takers' batches are still out
        finished = all([shard.finish_resync(sync_id) for shard in index.shards])
    click.echo(f"index resynced: {index.stats()['indexed']} members"
               + ("" if finished else " (a newer resync took over)"))
    index.close()


def daemons(ctx: RunContext) -> list:
    """Relay, executors and cleanup for ``pyscheduler run``, from PYSCHEDULER_SCHEDULES_* variables."""
    flags = {}
    for name, (default, _) in RUN_FLAGS.items():
        raw = os.environ.get(_env(name))
        if raw:
            flags[name] = int(raw) if isinstance(default, int) else raw
    if not ctx.redis_url:
        log.info("schedules: no Redis configured, executors run in degraded mode (critical schedules only)")
    return build_daemons(ctx.dsn, ctx.redis_url, ctx.kafka_bootstrap, ctx.kafka_settings, **flags)


__all__ = ["group", "daemons", "demo"]
