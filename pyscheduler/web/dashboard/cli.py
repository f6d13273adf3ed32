"""``pyscheduler dashboard``: the web dashboard on its own."""

from __future__ import annotations

import click

from ...config import dsn_option, option, redis_option, require_dsn


def _hosts(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    from .http import parse_hosts

    try:
        return parse_hosts(values)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command("dashboard")
@dsn_option
@redis_option
@option("--host", envvar="PYSCHEDULER_DASHBOARD_HOST", default="127.0.0.1", show_default=True,
        help="Address to listen on (loopback by default: put a reverse proxy with TLS in front to expose it).")
@option("--port", envvar="PYSCHEDULER_DASHBOARD_PORT", default=8080, show_default=True, type=click.IntRange(0, 65535),
        help="Port (0: any free port).")
@option("--allow-actions", envvar="PYSCHEDULER_DASHBOARD_ALLOW_ACTIONS", is_flag=True, default=False,
        help="Offer actions (cancel, retry, pause, resume, trigger, delete), each behind a confirmation.")
@option("--action-dsn", envvar="PYSCHEDULER_DASHBOARD_ACTION_DSN", default=None, metavar="DSN",
        help="The login actions use (default --dsn): e.g. an admin login; reads stay on --dsn (monitor).")
@option("--token", envvar="PYSCHEDULER_DASHBOARD_TOKEN", default=None, metavar="TOKEN",
        help="Require this access token (Authorization: Bearer, or a cookie set by /login).")
@option("--allowed-host", "allowed_hosts", envvar="PYSCHEDULER_DASHBOARD_ALLOWED_HOSTS", multiple=True,
        metavar="NAME[:PORT]", callback=_hosts,
        help="Also answer requests to this Host (repeatable; the variable: comma-separated), e.g. the name a "
             "reverse proxy serves it as. Loopback names with the port are always allowed; any other Host gets 421.")
@option("--refresh", "refresh_s", envvar="PYSCHEDULER_DASHBOARD_REFRESH", default=10, show_default=True,
        type=click.IntRange(1, 3600), help="Seconds between page refreshes in the browser.")
def dashboard_cmd(dsn, redis_url, host, port, allow_actions, action_dsn, token, allowed_hosts, refresh_s) -> None:
    """Serve the web dashboard: tasks, delay queue, schedules and checks.

    Reads through the monitor role (--dsn: a login that is a member of
    pyscheduler_monitor)."""
    from . import make_app, serve

    dsn = require_dsn(dsn)
    app = make_app(dsn, allow_actions=allow_actions, token=token, action_dsn=action_dsn, redis_url=redis_url,
                   refresh_s=refresh_s, allowed_hosts=allowed_hosts)
    try:
        serve(app, host, port, ready=app.announce)
    except KeyboardInterrupt:
        pass
    finally:
        app.close()
