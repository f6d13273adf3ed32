"""Configuration: flags, each mirrored by an environment variable (flags win).

Every command that talks to a server takes its address from the same options,
so ``--dsn`` / ``PYSCHEDULER_DSN`` mean the same thing everywhere. Values are
checked by click, so a bad flag or environment value is a usage error naming it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import timedelta, timezone
from typing import Any

import click

ENV_PREFIX = "PYSCHEDULER_"


def env(name: str) -> str:
    return ENV_PREFIX + name.upper().replace("-", "_")


def option(*decls: str, **kwargs: Any) -> Callable:
    """A click option whose environment variable is PYSCHEDULER_<NAME>."""
    long = next(d for d in decls if d.startswith("--"))
    kwargs.setdefault("envvar", env(long[2:]))
    kwargs.setdefault("show_envvar", True)
    return click.option(*decls, **kwargs)


class OneLineUsageError(click.BadParameter):
    """A usage error shown as one line (``error: ...``), exit code 2."""

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


def _check_dsn(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A DSN libpq cannot parse is a usage error (one line, exit 2), before anything connects."""
    if value is None or value == "":
        return value or None
    from psycopg.conninfo import conninfo_to_dict

    try:
        conninfo_to_dict(value)
    except Exception as exc:  # psycopg.ProgrammingError: what libpq says is wrong with it
        raise OneLineUsageError(f"not a PostgreSQL connection string ({str(exc).strip()}); expected a URI "
                                "such as postgresql://user@host:5432/db or key=value pairs such as "
                                "'host=db dbname=app'", ctx=ctx, param=param) from None
    return value


_dsn_option = option("--dsn", default=None, metavar="DSN", callback=_check_dsn,
                     help="PostgreSQL connection string (libpq URI or key=value).")


def _set_connection(ctx: click.Context, param: click.Parameter, value: int | None) -> None:
    if value is not None:
        from . import db

        db.configure(**{param.name.removeprefix("db_"): value})


# Every daemon's database connections (pyscheduler.db.ConnectionSettings; a value the DSN
# sets itself wins): a silent network partition fails a call instead of hanging a node.
CONNECTION_OPTIONS = [
    option(f"--db-{name}", type=click.IntRange(min=low), default=None, expose_value=False,
           callback=_set_connection, help=f"{text} [default: {default}].")
    for name, low, default, text in (
        ("connect-timeout", 1, 10, "Seconds to wait for a database connection"),
        ("statement-timeout", 0, 60000, "Milliseconds a statement may run, 0 = no limit"),
        ("keepalives-idle", 1, 30, "Seconds of silence before TCP keepalive probes"),
        ("keepalives-interval", 1, 10, "Seconds between TCP keepalive probes"),
        ("keepalives-count", 1, 3, "Unanswered probes before a connection is dead"),
        ("tcp-user-timeout", 0, 60000, "Milliseconds a write may stay unacknowledged"),
    )
]


def dsn_option(f: Callable) -> Callable:
    """--dsn and the --db-* connection settings."""
    for deco in reversed(CONNECTION_OPTIONS):
        f = deco(f)
    return _dsn_option(f)
bootstrap_option = option("--bootstrap-servers", "kafka_bootstrap", default=None, metavar="HOST:PORT",
                          envvar=env("kafka_bootstrap"),
                          help="Kafka bootstrap servers.")
redis_option = option("--redis-url", default=None, metavar="URL", help="Redis URL (redis://host:port/db).")


def kafka_settings_option(f: Callable) -> Callable:
    """``-X key=value`` (repeatable): extra librdkafka settings, e.g. security."""
    return option("-X", "--kafka-setting", "kafka_settings", multiple=True, metavar="KEY=VALUE",
                  envvar=env("kafka_settings"), callback=_parse_settings,
                  help="Extra librdkafka setting (repeatable), e.g. -X security.protocol=SASL_SSL. "
                       "In the environment: space-separated KEY=VALUE pairs.")(f)


def _parse_settings(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", ctx=ctx, param=param)
        out[key.strip()] = value
    return out


def servers_options(f: Callable) -> Callable:
    """--dsn, --bootstrap-servers, --redis-url."""
    for deco in (redis_option, bootstrap_option, dsn_option):
        f = deco(f)
    return f


def require_dsn(dsn: str | None, reach: bool = True) -> str:
    """The DSN of a command that cannot start its own database; with ``reach``, checked by
    connecting once (reachable_or_fail), so an unreachable database is one line within seconds."""
    if not dsn:
        raise click.UsageError("no database: pass --dsn or set PYSCHEDULER_DSN")
    if reach:
        reachable_or_fail(dsn)
    return dsn


REACH_TIMEOUT = 5  # s: the longest a command waits to learn that the database is unreachable


def reachable_or_fail(dsn: str) -> None:
    """Connect once and close: DatabaseUnavailable naming the server (host, port) and the
    server's or the network's answer when that fails, within REACH_TIMEOUT seconds (or the
    DSN's own connect_timeout), instead of a pool retrying for 30 s."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    from . import db
    from .errors import DatabaseUnavailable, is_retryable

    extra = db.settings().kwargs(dsn)
    if "connect_timeout" in extra:
        extra["connect_timeout"] = min(REACH_TIMEOUT, int(extra["connect_timeout"]))
    try:
        psycopg.connect(dsn, **extra).close()
    except psycopg.OperationalError as exc:
        given = conninfo_to_dict(dsn)
        where = f"{given.get('host') or 'the default host'}:{given.get('port') or 5432}"
        why = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        why = why.removeprefix("connection failed: ")
        error = DatabaseUnavailable(f"cannot connect to PostgreSQL at {where}: {why}")
        # no answer, starting up, out of connections; not the server refusing this login
        error.outage = is_retryable(exc) and not _REFUSED.search(why)
        raise error from None


# What a server that answers says to a login it refuses (libpq gives no SQLSTATE for a failed
# connection): waiting would not help. Anything else (no answer, starting up, shutting down,
# too many clients) is an outage.
_REFUSED = re.compile(r"authentication failed|no pg_hba\.conf entry|(role|database) \"[^\"]*\" does not exist|"
                      r"password is required|permission denied for database", re.IGNORECASE)


def wait_for_database(dsn: str, http_host: str = "127.0.0.1", http_port: int | None = None,
                      stop: Any = None) -> str:
    """What a daemon command does before it starts its daemons (docs/operations.md, "Outages"):
    PostgreSQL down is an outage, at start as later: it waits for it (a warning, then one line a
    minute, a try at most every 5 s), with the HTTP endpoint (when ``http_port`` is given)
    answering /readyz 503 naming postgresql meanwhile. An answer that is a refusal (a wrong
    password, a database that does not exist) is one line and exit 1 at once. ``stop`` (a
    threading.Event) set while it waits: exit 0."""
    import logging

    from .errors import DatabaseUnavailable

    log = logging.getLogger("pyscheduler")
    dsn = require_dsn(dsn, reach=False)
    endpoint = None
    delay, told = 0.5, 0.0
    try:
        while True:
            try:
                reachable_or_fail(dsn)
                if endpoint is not None or told:
                    log.info("PostgreSQL answers: starting")
                return dsn
            except DatabaseUnavailable as exc:
                if not getattr(exc, "outage", False):
                    raise
                if time.monotonic() - told > 60:
                    log.warning("%s; waiting for it (the daemons start once it answers)", exc)
                    told = time.monotonic()
                if endpoint is None and http_port is not None:
                    from .web.endpoint import serve

                    endpoint = serve(http_host, http_port, [], dsn=dsn)
            if stop is not None and stop.wait(delay):
                raise SystemExit(0)
            if stop is None:
                time.sleep(delay)
            delay = min(delay * 2, 5.0)
    finally:
        if endpoint is not None:
            endpoint.close()


# -- parameter types the command groups share ---------------------------------------------------

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


class Duration(click.ParamType):
    """Seconds, or a number with a unit: 500ms, 10s, 5m, 2h, 7d."""

    name = "duration"

    def convert(self, value, param, ctx):
        if isinstance(value, timedelta):
            return value
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*", str(value))
        if not m:
            self.fail(f"expected a duration such as 30s, 5m, 2h or 7d, got {value!r}", param, ctx)
        try:
            return timedelta(seconds=float(m.group(1)) * _UNITS[m.group(2) or "s"])
        except OverflowError:
            self.fail(f"{value!r} is longer than any duration pyscheduler keeps", param, ctx)


DURATION = Duration()


class PositiveDuration(Duration):
    """A duration longer than zero (an interval of 0 would spin)."""

    name = "duration"

    def convert(self, value, param, ctx):
        out = super().convert(value, param, ctx)
        if out <= timedelta(0):
            self.fail(f"must be longer than 0, got {value!r}", param, ctx)
        return out


POSITIVE_DURATION = PositiveDuration()


def http_options(*alias_envvars: str) -> Callable[[Callable], Callable]:
    """--http-port / --http-host: the process's HTTP endpoint (/metrics, /healthz, /readyz;
    pyscheduler.web.endpoint). ``--metrics-port`` is an alias of ``--http-port``, and the
    ``alias_envvars`` (e.g. PYSCHEDULER_DELAY_METRICS_PORT) of PYSCHEDULER_HTTP_PORT."""

    def decorate(f: Callable) -> Callable:
        f = option("--http-host", default="127.0.0.1", show_default=True, metavar="HOST",
                   help="Address of the HTTP endpoint (0.0.0.0: every interface).")(f)
        f = option("--http-port", "--metrics-port", "http_port", type=click.IntRange(0, 65535), default=None,
                   envvar=[env("http_port"), *alias_envvars], metavar="PORT",
                   help="Serve /metrics, /healthz and /readyz on this port (0: any free port; default: no "
                        "HTTP). --metrics-port is the former name.")(f)
        return f

    return decorate


class Instant(click.DateTime):
    """An ISO 8601 date and time; without a UTC offset it is UTC (never the session's PGTZ)."""

    name = "instant"

    def __init__(self) -> None:
        super().__init__(["%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%dT%H:%M:%S.%f%z", "%Y-%m-%dT%H:%M:%S",
                          "%Y-%m-%dT%H:%M:%S.%f"])

    def convert(self, value, param, ctx):
        at = super().convert(value, param, ctx)
        return at.replace(tzinfo=timezone.utc) if at.tzinfo is None else at


INSTANT = Instant()


def require_text(value: str | None, hint: str) -> None:
    """A clear usage error for text PostgreSQL cannot store (not UTF-8, a NUL character)."""
    if value is None:
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise click.BadParameter("not valid UTF-8", param_hint=hint) from None
    if "\x00" in value:
        raise click.BadParameter("contains a NUL character", param_hint=hint)
