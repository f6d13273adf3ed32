"""``pyscheduler checks ...``: the runner, add/delete/list/history and the demo (the
capability contract of pyscheduler/daemon.py)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from datetime import timedelta

import click

from ..clihints import HintedGroup
from ..config import (DURATION, POSITIVE_DURATION, dsn_option, env, http_options, option,
                      require_dsn, wait_for_database)
from ..daemon import RunContext, install_signal_handlers
from ..db import Database, Jsonb
from . import sqlapi as sql
from .client import CheckClient
from .handlers import import_handlers
from .runner import CheckRunner


def _runner_options(f):
    f = option("--handlers", default="", envvar=env("checks_handlers"), show_default=True,
               help="Comma-separated modules to import: their @pyscheduler.checks.handler functions "
                    "are the Python jobs this runner runs.")(f)
    f = option("--timeout", type=POSITIVE_DURATION, default="10s", show_default=True, envvar=env("checks_timeout"),
               help="Per-check time limit: statement timeout of a SQL job, deadline of a Python handler.")(f)
    f = option("--batch", type=click.IntRange(1), default=1000, show_default=True, envvar=env("checks_batch"),
               help="Checks taken per transaction.")(f)
    f = option("--shards", type=click.IntRange(1), default=1, show_default=True, envvar=env("checks_shards"),
               help="How many runners split each slot (by check id modulo shards).")(f)
    f = option("--shard", type=click.IntRange(0), default=0, show_default=True, envvar=env("checks_shard"),
               help="This runner's share of each slot: 0..shards-1.")(f)
    f = option("--purge-interval", type=DURATION, default="60s", show_default=True,
               envvar=env("checks_purge_interval"),
               help="How often ended checks older than the history_retention setting are deleted "
                    "(0: never).")(f)
    return f


def _runner(dsn: str, shard: int, shards: int, batch: int, timeout: timedelta, handlers: str,
            purge_interval: timedelta) -> CheckRunner:
    if shard >= shards:
        raise click.BadParameter(f"shard must be in 0..{shards - 1}, got {shard}", param_hint="--shard")
    return CheckRunner(dsn, import_handlers(handlers.split(",")), shard=shard, shards=shards, batch=batch,
                       timeout=timeout.total_seconds(), purge_interval=purge_interval.total_seconds())


class _Checks(HintedGroup):
    hints = {
        "delete_checks first to change its kind.":
            "Delete it first to change its kind: pyscheduler checks delete ENTITY_NAME ENTITY_KEY --job JOB.",
        "e.g. check_after => '3 hours'": "e.g. --after 3h",
        "Pass a larger horizon or check earlier.": "Pass a larger --horizon or check earlier.",
    }


@click.group("checks", cls=_Checks)
def group() -> None:
    """Future checks: "do this when that hasn't happened for X", in time slots."""


@group.command("run")
@dsn_option
@_runner_options
@http_options()
def run_cmd(dsn, shard, shards, batch, timeout, handlers, purge_interval, http_port, http_host) -> None:
    """Run the check runner: each slot's checks of this shard, at the slot boundary."""
    from ..web.endpoint import run_serving

    runner = _runner(require_dsn(dsn, reach=False), shard, shards, batch, timeout, handlers, purge_interval)
    wait_for_database(dsn, http_host, http_port)
    stop = threading.Event()
    install_signal_handlers(stop)
    sys.exit(run_serving([runner], stop, http_host, http_port, dsn=dsn))


def _db(dsn: str | None) -> Database:
    return Database(require_dsn(dsn), max_size=1)


def _text(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A name or key as PostgreSQL can take it: UTF-8 (an argument in another encoding reaches
    Python as lone surrogates) and without NUL."""
    if value is None:
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise click.BadParameter("is not valid UTF-8") from None
    if "\x00" in value:
        raise click.BadParameter("must not contain NUL")
    return value


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _payload(ctx: click.Context, param: click.Parameter, value: str | None):
    """--payload: JSON (strict: NaN and Infinity are not JSON and cannot be stored)."""
    value = _text(ctx, param, value)
    if value is None:
        return None
    try:
        return json.loads(value, parse_constant=_no_constant)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}") from None


def _client(dsn: str | None, action):
    """``action(CheckClient)`` on a short-lived pool; its result."""
    with _db(dsn) as db:
        return action(CheckClient(db))


@group.command("add")
@dsn_option
@click.argument("entity_name", callback=_text)
@click.argument("entity_key", callback=_text)
@click.option("--job", required=True, callback=_text,
              help="SQL function (schema.name), Python handler name or task queue.")
@click.option("--kind", type=click.Choice(["sql", "python", "task"]), default="sql", show_default=True)
@click.option("--after", "check_after", type=DURATION, default=None, help="Check after this long, e.g. 3h.")
@click.option("--at", "check_at", type=click.DateTime(["%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%d %H:%M:%S%z"]),
              default=None, help="Check at this time (with an offset, e.g. 2030-01-01T10:00:00+00:00).")
@click.option("--payload", default=None, callback=_payload, help="JSON given to the job.")
@click.option("--max-checks", type=click.IntRange(1), default=None,
              help="Runs at most (default: the max_checks setting, 5).")
@click.option("--horizon", type=DURATION, default=None,
              help="Furthest a next check may be (default: the horizon setting, 30d).")
def add_cmd(dsn, entity_name, entity_key, job, kind, check_after, check_at, payload, max_checks, horizon) -> None:
    """Add a check of ENTITY_NAME ENTITY_KEY (rounded up to a slot; idempotent per job)."""
    if (check_after is None) == (check_at is None):
        raise click.UsageError("give exactly one of --after and --at")
    added = _client(dsn, lambda client: client.add(entity_name, entity_key, job, check_at=check_at,
                                                   check_after=check_after, payload=payload, kind=kind,
                                                   max_checks=max_checks, horizon=horizon))
    note = {True: "", False: " (already pending: unchanged; pyscheduler checks delete first to replace it)",
            None: " (the pending check is running: added again if that run ends it)"}[added.added]
    click.echo(f"check {added.id} at {added.next_check_at.isoformat()}{note}")


@group.command("delete")
@dsn_option
@click.argument("entity_name", callback=_text)
@click.argument("entity_key", callback=_text)
@click.option("--job", default=None, callback=_text, help="Only this job's check.")
def delete_cmd(dsn, entity_name, entity_key, job) -> None:
    """Delete the pending checks of ENTITY_NAME ENTITY_KEY (history: deleted)."""
    n = _client(dsn, lambda client: client.delete(entity_name, entity_key, job))
    click.echo(f"deleted {n} check(s)")


def _need_name(entity_name: str | None, entity_key: str | None) -> None:
    if entity_key is not None and entity_name is None:
        raise click.UsageError("--entity-key needs --entity-name")


def _filters(f):
    f = click.option("--limit", type=click.IntRange(1), default=20, show_default=True)(f)
    f = click.option("--job", default=None, callback=_text, help="Only this job's checks.")(f)
    f = click.option("--entity-key", default=None, callback=_text, help="Only this entity key's checks.")(f)
    return click.option("--entity-name", default=None, callback=_text, help="Only this entity's checks.")(f)


@group.command("list")
@dsn_option
@_filters
def list_cmd(dsn, entity_name, entity_key, job, limit) -> None:
    """Pending checks, soonest first."""
    _need_name(entity_name, entity_key)
    for c in _client(dsn, lambda client: client.list(entity_name, entity_key, job, limit)):
        click.echo(f"{c.id:>8}  {c.next_check_at.isoformat()}  {c.entity_name}:{c.entity_key}  "
                   f"{c.kind}:{c.job}  runs={c.check_count}/{c.max_checks}")


@group.command("history")
@dsn_option
@_filters
def history_cmd(dsn, entity_name, entity_key, job, limit) -> None:
    """Ended checks, newest first: outcome, runs, time taken."""
    _need_name(entity_name, entity_key)
    for h in _client(dsn, lambda client: client.history(entity_name, entity_key, job, limit)):
        error = f"  {h.error}" if h.error else ""
        click.echo(f"{h.id:>8}  {h.ended.isoformat()}  {h.entity_name}:{h.entity_key}  "
                   f"{h.kind}:{h.job}  {h.outcome:<10} runs={h.check_count} "
                   f"took={h.total_took.total_seconds():.3f}s{error}")


def daemons(ctx: RunContext) -> list:
    """One runner, configured from the same environment variables as ``checks run``."""
    values = {}
    for p in run_cmd.params:
        if p.name in ("shard", "shards", "batch", "timeout", "handlers", "purge_interval"):
            raw = os.environ.get(p.envvar) or p.default
            values[p.name] = p.type.convert(raw, p, None)
    return [_runner(ctx.dsn, **values)]


DEMO_SQL = """
CREATE SCHEMA IF NOT EXISTS pyscheduler_demo;
CREATE TABLE IF NOT EXISTS pyscheduler_demo.orders (
    id text PRIMARY KEY, placed timestamptz NOT NULL, status text NOT NULL);
CREATE TABLE IF NOT EXISTS pyscheduler_demo.alerts (
    order_id text NOT NULL, level text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
-- The seed's job_exec: primary alert after x, escalation after y, nothing once shipped.
CREATE OR REPLACE FUNCTION pyscheduler_demo.order_alert(c pyscheduler.future_check)
RETURNS timestamptz LANGUAGE plpgsql SECURITY DEFINER SET search_path = pyscheduler_demo, pg_temp AS $$
DECLARE
    o orders;
BEGIN
    SELECT * INTO o FROM orders WHERE id = c.entity_key;
    IF o IS NULL OR o.status <> 'UNSHIPPED' THEN
        RETURN NULL;
    END IF;
    IF c.check_count = 0 THEN
        INSERT INTO alerts (order_id, level) VALUES (o.id, 'primary');
        RETURN o.placed + (c.payload ->> 'escalate_after')::interval;
    END IF;
    INSERT INTO alerts (order_id, level) VALUES (o.id, 'escalation');
    RETURN NULL;
END
$$;
"""


def demo(ctx: RunContext, echo) -> None:
    """The seed's order example on 1-second slots: alert after 2 s, escalate after 4 s."""
    from ..daemon import wait_for

    with Database(ctx.dsn, max_size=2) as db:
        with db.connection() as conn:
            conn.execute(DEMO_SQL)
        old = db.call_one(sql.SET_CHECK_SETTINGS)["resolution"]
        db.call(sql.SET_CHECK_SETTINGS, resolution=timedelta(seconds=1))
        stop = threading.Event()
        runner = CheckRunner(ctx.dsn, {}, timeout=5.0)
        thread = threading.Thread(target=runner.run, args=(stop,), daemon=True)
        try:
            tag = f"demo-{os.getpid()}-{int(time.time())}"
            orders = {f"{tag}-A": "never ships", f"{tag}-B": "ships at once", f"{tag}-C": "ships after its alert"}
            with db.connection() as conn:
                for oid in orders:
                    conn.execute("INSERT INTO pyscheduler_demo.orders VALUES (%s, clock_timestamp(), 'UNSHIPPED')",
                                 (oid,))
            for oid in orders:
                db.call(sql.ADD_CHECK, entity_name="order", entity_key=oid, job="pyscheduler_demo.order_alert",
                        check_after=timedelta(seconds=2), payload=Jsonb({"escalate_after": "4 seconds"}))
            echo("slots of 1 s; three orders placed, each with a check after 2 s (primary alert, "
                 "escalation 4 s after placing): " + ", ".join(f"{k[-1]} {v}" for k, v in orders.items()))
            thread.start()

            def ship(oid: str) -> None:
                with db.connection() as conn:
                    conn.execute("UPDATE pyscheduler_demo.orders SET status = 'SHIPPED' WHERE id = %s", (oid,))

            ship(f"{tag}-B")

            def alerts() -> list[dict]:
                return db.query("SELECT a.order_id, a.level, extract(epoch FROM a.at - o.placed)::float AS after "
                                "FROM pyscheduler_demo.alerts a JOIN pyscheduler_demo.orders o ON o.id = a.order_id "
                                "WHERE a.order_id LIKE %s ORDER BY a.at", (f"{tag}-%",))

            wait_for(lambda: any(a["order_id"] == f"{tag}-C" for a in alerts()), timeout=30)
            ship(f"{tag}-C")
            wait_for(lambda: all(not db.call(sql.LIST_CHECKS, entity_name="order", entity_key=oid) for oid in orders),
                     timeout=30)
            for a in alerts():
                echo(f"  {a['level']:<10} alert for order {a['order_id'][-1]}, "
                     f"{a['after']:.1f} s after it was placed")
            echo("check_history:")
            for oid in orders:
                for h in db.call(sql.CHECK_HISTORY, entity_name="order", entity_key=oid):
                    echo(f"  order {oid[-1]}: {h['outcome']:<5} after {h['check_count']} run(s)  "
                         f"({orders[oid]})")
        finally:
            stop.set()
            if thread.is_alive():
                thread.join(10)
            db.call(sql.SET_CHECK_SETTINGS, resolution=old)
