"""The ``pyscheduler`` command line."""

from __future__ import annotations

import importlib
import logging
import signal
import sys
import threading
import time
from types import ModuleType

import click

from . import migrate as migrations, sqlapi
from pathlib import Path

from .cliroot import LazyGroup, root
from .config import (http_options, kafka_settings_option, option, reachable_or_fail, require_dsn, servers_options,
                     wait_for_database)
from .daemon import RunContext, install_signal_handlers
from .errors import ConfigError
from .masking import mask_url

log = logging.getLogger("pyscheduler")

# Capabilities in the order run and demo take them. Each is a package
# pyscheduler/<name>/ whose cli.py follows the contract in daemon.py.
CAPABILITIES = {
    "delay": "delay queue",
    "tasks": "leased tasks",
    "schedules": "recurring schedules",
    "checks": "future checks",
}


def capability(name: str) -> ModuleType | None:
    """The capability's cli module, or None while it is not built."""
    try:
        return importlib.import_module(f"pyscheduler.{name}.cli")
    except ModuleNotFoundError as exc:
        if exc.name in (f"pyscheduler.{name}", f"pyscheduler.{name}.cli"):
            return None
        raise


main = root("Time-based work on PostgreSQL: delay queue, leased tasks, schedules, checks.")


def _role_options(fn):
    """--client-role, --worker-role, ... : one option per audience in migrate.AUDIENCES."""
    for audience in reversed(migrations.AUDIENCES):
        fn = option(f"--{audience}-role", f"{audience}_role", default=None,
                    help=f"Name of the {audience} role (default pyscheduler_{audience}).")(fn)
    return fn


@main.command("migrate")
@servers_options
@click.option("--list", "list_", is_flag=True, help="Show applied and pending migrations; change nothing.")
@click.option("--dry-run", is_flag=True, help="Show what would run; change nothing.")
@_role_options
def migrate_cmd(dsn, kafka_bootstrap, redis_url, list_, dry_run, **role_names) -> None:
    """Create or upgrade the schema and reload every SQL function."""
    dsn = require_dsn(dsn)
    if list_ or dry_run:
        report = migrations.status(dsn)
        for mid in report.applied:
            click.echo(f"applied  {mid}")
        for mid in report.pending:
            click.echo(f"pending  {mid}")
        if dry_run:
            how = "fresh install of the current schema" if report.fresh_install else (
                f"{len(report.pending)} pending migration(s)")
            click.echo(f"would run: {how}; then reload {', '.join(report.functions)}")
        return
    roles = {key: value for key, value in role_names.items() if value}
    started = time.monotonic()
    report = migrations.migrate(dsn, roles=roles)
    what = ("fresh install" if report.fresh_install else
            f"applied {', '.join(report.applied)}" if report.applied else "schema up to date")
    click.echo(f"migrated: {what}; functions reloaded from {len(report.functions)} files "
               f"in {time.monotonic() - started:.2f}s")


def _stack(dsn, kafka_bootstrap, redis_url, data_dir: Path | None = None, wait: tuple | None = None):
    """The servers: the configured ones (PostgreSQL reached first: with ``wait``, the (host,
    port) of the HTTP endpoint, waited for as a daemon command does), else the embedded ones."""
    from .embedded import Stack

    if dsn:  # configured servers only; a capability whose server is missing is skipped
        if wait is not None:
            wait_for_database(dsn, *wait)
        else:
            reachable_or_fail(dsn)
        return Stack(dsn=dsn, kafka_bootstrap=kafka_bootstrap, redis_url=redis_url)
    if data_dir is None:
        click.echo("no database configured: starting the embedded PostgreSQL, Kafka broker and Redis in a "
                   "temporary directory, removed at exit (--data-dir DIR keeps their data) ...")
    else:
        click.echo(f"no database configured: starting the embedded PostgreSQL, Kafka broker and Redis with their "
                   f"data in {data_dir} (kept across restarts; the broker keeps topics in memory only) ...")
    return Stack(kafka_bootstrap=kafka_bootstrap, redis_url=redis_url, data_dir=data_dir).start()


def _dashboard(stack):
    """The dashboard ``run`` serves at ``/`` of its HTTP endpoint, with the variables of
    ``pyscheduler dashboard`` (PYSCHEDULER_DASHBOARD_TOKEN, _ALLOW_ACTIONS, _ACTION_DSN,
    _REFRESH, _ALLOWED_HOSTS); read-only unless PYSCHEDULER_DASHBOARD_ALLOW_ACTIONS is set."""
    import os

    from .web.dashboard import make_app
    from .web.dashboard.http import parse_hosts

    env = os.environ.get
    refresh = env("PYSCHEDULER_DASHBOARD_REFRESH") or "10"
    if not refresh.isdigit() or not 1 <= int(refresh) <= 3600:
        raise click.BadParameter(f"expected 1..3600 seconds, got {refresh!r}",
                                 param_hint="PYSCHEDULER_DASHBOARD_REFRESH")
    allow = (env("PYSCHEDULER_DASHBOARD_ALLOW_ACTIONS") or "").strip().lower() in ("1", "true", "yes", "on")
    try:
        hosts = parse_hosts(env("PYSCHEDULER_DASHBOARD_ALLOWED_HOSTS"))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="PYSCHEDULER_DASHBOARD_ALLOWED_HOSTS") from None
    return make_app(_as_role(stack.dsn, "monitor"), allow_actions=allow,
                    token=env("PYSCHEDULER_DASHBOARD_TOKEN") or None,
                    action_dsn=env("PYSCHEDULER_DASHBOARD_ACTION_DSN") or _as_role(stack.dsn, "admin"),
                    redis_url=stack.redis_url, refresh_s=int(refresh), allowed_hosts=hosts)


def _as_role(dsn: str, audience: str) -> str:
    """``dsn`` acting as an audience's role (libpq ``options=-c role=...``): ``run``'s own login
    is often a superuser, and the dashboard reads through the monitor role's views and
    functions only (issue 17), or with actions on acts (and reads) as the admin role. The
    login must be a member of it, as an admin or the owner of the schema is; a login that is
    not keeps its own role (and its own privileges)."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    try:
        with psycopg.connect(dsn, connect_timeout=10) as conn:
            role, member = conn.execute(sqlapi.AUDIENCE_ROLE, (f"{audience}_role",)).fetchone() or (None, False)
    except psycopg.Error:
        return dsn  # the dashboard's own connections say what is wrong
    if not member:
        return dsn
    options = conninfo_to_dict(dsn).get("options") or ""
    return make_conninfo(dsn, options=f"{options} -c role={role}".strip())


def _print_connect(stack) -> None:
    click.echo("connect with:")
    click.echo(f"  psql '{mask_url(stack.dsn)}'")
    if stack.kafka_bootstrap:
        click.echo(f"  Kafka bootstrap: {stack.kafka_bootstrap}")
    if stack.redis_url:
        click.echo(f"  Redis: {mask_url(stack.redis_url)}")


@main.command("run")
@servers_options
@kafka_settings_option
@click.option("--no-migrate", is_flag=True, help="Do not migrate before starting.")
@option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
        help="Keep the embedded servers' data here across restarts (default: a temporary directory removed "
             "at exit). Only without --dsn.")
@http_options()
def run_cmd(dsn, kafka_bootstrap, redis_url, kafka_settings, no_migrate, data_dir, http_port, http_host) -> None:
    """Run the daemons of every capability (embedded servers when no DSN is configured)."""
    from .web.endpoint import run_serving

    if dsn and data_dir is not None:
        raise click.UsageError("--data-dir is for the embedded servers: give it or --dsn, not both")
    stop = threading.Event()
    install_signal_handlers(stop)
    stack = _stack(dsn, kafka_bootstrap, redis_url, data_dir, wait=(http_host, http_port, stop))
    try:
        if not no_migrate:
            migrations.migrate(stack.dsn)
        ctx = RunContext(dsn=stack.dsn, kafka_bootstrap=stack.kafka_bootstrap, redis_url=stack.redis_url,
                         kafka_settings=kafka_settings, stop=stop)
        daemons = []
        for name, title in CAPABILITIES.items():
            module = capability(name)
            if module is None:
                log.info("%s: not built yet", title)
                continue
            try:
                daemons += module.daemons(ctx)
            except ConfigError as exc:  # a PYSCHEDULER_<CAPABILITY>_* value the daemon refuses
                raise click.UsageError(str(exc)) from None
        _print_connect(stack)
        click.echo(f"running {', '.join(d.name for d in daemons) or 'no daemons'}; Ctrl-C or SIGTERM stops")
        sys.stdout.flush()
        dashboard = _dashboard(stack) if http_port is not None else None
        try:
            code = run_serving(daemons, stop, http_host, http_port, dsn=stack.dsn,
                               kafka_bootstrap=stack.kafka_bootstrap, kafka_settings=kafka_settings,
                               redis_url=stack.redis_url, app=dashboard,
                               ready=dashboard.announce if dashboard is not None else None)
        finally:
            if dashboard is not None:
                dashboard.close()
    finally:
        stack.stop()
    click.echo("stopped")
    sys.exit(code)


@main.command("demo")
@servers_options
@kafka_settings_option
def demo_cmd(dsn, kafka_bootstrap, redis_url, kafka_settings) -> None:
    """Bring up the stack, drive sample work through every capability, print what happened."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the embedded servers on the way out
    stack = _stack(dsn, kafka_bootstrap, redis_url)
    try:
        started = time.monotonic()
        report = migrations.migrate(stack.dsn)
        click.echo(f"migrated ({'fresh install' if report.fresh_install else 'upgrade'}) "
                   f"in {time.monotonic() - started:.2f}s")
        _print_connect(stack)
        ctx = RunContext(dsn=stack.dsn, kafka_bootstrap=stack.kafka_bootstrap, redis_url=stack.redis_url,
                         kafka_settings=kafka_settings)
        for name, title in CAPABILITIES.items():
            module = capability(name)
            click.echo(f"\n== {title} ==")
            if module is None:
                click.echo("not built yet")
                continue
            module.demo(ctx, click.echo)
    finally:
        stack.stop()
    click.echo("\ndemo finished")


@main.group("bench", cls=LazyGroup)
def bench_group() -> None:
    """Benchmarks (throughput and latency percentiles) against real servers."""


# Each capability's commands, the benches and the dashboard load when run (LazyGroup).
for _name in CAPABILITIES:
    main.lazy(_name, f"pyscheduler.{_name}.cli:group")
for _name in ("delay", "tasks", "schedules", "checks", "flatness"):
    bench_group.lazy(_name, f"pyscheduler.bench.{_name}:bench")
bench_group.lazy("peers", "pyscheduler.bench.peers.cli:bench")
main.lazy("dashboard", "pyscheduler.web.dashboard.cli:dashboard_cmd")
