"""The dashboard: a WSGI application over the monitor role's views and functions.

``make_app(dsn, allow_actions=False, token=None, action_dsn=None)`` returns a WSGI
callable; ``pyscheduler dashboard`` serves it (``serve``). Pages are rendered on the
server (jinja2, autoescaped); a few lines of inline JavaScript refresh them.

Safety (issue 17): reads only through ``data.Reader``, as a login in
``pyscheduler_monitor`` (metadata and counts, never another role's work's contents),
or with actions on as the action login (what that role may see and do); actions only
with ``allow_actions``, each a GET that shows
a confirmation and a POST that acts, protected against cross-site requests (a
per-session CSRF token in the form, ``Origin``/``Referer`` and ``Sec-Fetch-Site``
must be this site, POST only, SameSite=Strict cookies); an optional access token
(``Authorization: Bearer`` or a cookie set by ``/login``); no secrets shown
(HTTP target URLs and spec/payload keys that look like credentials are masked).
Mounted under a prefix, URLs follow ``SCRIPT_NAME``.

Against DNS rebinding (issue 27): a request is answered only when its ``Host`` is an
allowed one (``allowed_host``): a loopback name with the port the server listens on, or a
name configured with ``allowed_hosts``; anything else gets 421 before any page or action
runs, and the origin a POST must come from is built from that allowed host.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import ipaddress
import json
import logging
import re
import secrets
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta, timezone
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from ..db import Database
from ..errors import DatabaseUnavailable, InvalidArgument, SchedulerError
from ..masking import mask_url
from . import charts
from .data import CHECK_OUTCOMES, PAGE, RUN_OUTCOMES, TASK_STATUSES, Actions, Reader

log = logging.getLogger(__name__)

SESSION_COOKIE = "pyscheduler_dash_session"
TOKEN_COOKIE = "pyscheduler_dash_token"
REFRESH_S = 10
LATE_AFTER = timedelta(seconds=10)  # schedules_late: due more than 10 seconds ago

# ------------------------------------------------------------------ masking (URLs: pyscheduler.masking)


_SECRET_KEY = re.compile(r"pass|secret|token|auth|credential|api[-_]?key|private|signature|cookie|session",
                         re.IGNORECASE)


def mask_json(value: Any) -> Any:
    """A JSON value with the values of credential-like keys replaced by ``***``."""
    if isinstance(value, dict):
        return {k: ("***" if _SECRET_KEY.search(str(k)) else mask_json(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [mask_json(v) for v in value]
    return value


def mask_target(kind: str | None, target: str | None) -> str | None:
    return mask_url(target) if kind == "http" else target


# ------------------------------------------------------------------ formatting


def _parse_time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    return None


def fmt_time(value: Any) -> str:
    t = _parse_time(value)
    if t is None:
        return "" if value is None else str(value)
    return t.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S") + "Z"


def fmt_duration(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, timedelta):
        s = value.total_seconds()
    elif isinstance(value, (int, float)):
        s = float(value)
    else:
        return str(value)
    sign = "-" if s < 0 else ""
    s = abs(s)
    if s < 1:
        return f"{sign}{s * 1000:.0f} ms"
    if s < 90:
        return f"{sign}{s:.1f} s"
    if s < 5400:
        return f"{sign}{s / 60:.0f} min"
    if s < 172800:
        return f"{sign}{s / 3600:.1f} h"
    return f"{sign}{s / 86400:.1f} d"


def fmt_relative(value: Any, now: datetime) -> str:
    t = _parse_time(value)
    if t is None:
        return ""
    d = (t - now).total_seconds()
    return f"in {fmt_duration(d)}" if d >= 0 else f"{fmt_duration(-d)} ago"


# ------------------------------------------------------------------ hosts

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
_HOST = re.compile(r"^(?P<name>[a-z0-9_](?:[a-z0-9_.-]*[a-z0-9_])?|\[[0-9a-f:.]+\])(?::(?P<port>[0-9]{1,5}))?$")


def parse_hosts(values: str | Iterable[str] | None) -> tuple[str, ...]:
    """The hosts configured (``--allowed-host``, ``PYSCHEDULER_DASHBOARD_ALLOWED_HOSTS``):
    names, each ``NAME`` (any port) or ``NAME:PORT``, separated by commas or spaces, as
    lower case; ValueError for one that is not a host name or an address."""
    items = [values] if isinstance(values, str) else list(values or ())
    out = []
    for item in items:
        for value in re.split(r"[\s,]+", item.strip().lower()):
            if value and not _HOST.match(value):
                raise ValueError(f"not a host name or address (NAME or NAME:PORT): {value!r}")
            if value:
                out.append(value)
    return tuple(out)


def is_loopback(host: str) -> bool:
    """The listening address ``host`` is loopback only (not 0.0.0.0, an interface, a name)."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# ------------------------------------------------------------------ requests


class HTTPError(Exception):
    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class Request:
    def __init__(self, environ: dict[str, Any], host: str = ""):
        self.environ = environ
        self.host = host  # the allowed host this request came to (Dashboard.allowed_host)
        self.method = environ.get("REQUEST_METHOD", "GET").upper()
        self.root = environ.get("SCRIPT_NAME", "").rstrip("/")
        self.path = environ.get("PATH_INFO", "") or "/"
        self.query = {k: v for k, v in urllib.parse.parse_qsl(environ.get("QUERY_STRING", ""))}
        cookie = SimpleCookie()
        try:
            cookie.load(environ.get("HTTP_COOKIE", ""))
        except Exception:  # noqa: BLE001  (a malformed cookie header: no cookies)
            pass
        self.cookies = {k: m.value for k, m in cookie.items()}
        self._form: dict[str, str] | None = None
        self.nonce = ""  # the CSP nonce of this response's inline script and style
        self.session = ""  # the session cookie's value (the CSRF token is derived from it)

    @property
    def form(self) -> dict[str, str]:
        if self._form is None:
            try:
                length = int(self.environ.get("CONTENT_LENGTH") or 0)
            except ValueError:
                length = 0
            if length > 65536:
                raise HTTPError("413 Content Too Large", "form too large")
            body = self.environ["wsgi.input"].read(length) if length else b""
            self._form = dict(urllib.parse.parse_qsl(body.decode("utf-8", "replace")))
        return self._form

    def arg(self, name: str) -> str | None:
        value = self.query.get(name, "").strip()
        return value or None

    def url(self, path: str, **params: Any) -> str:
        q = urllib.parse.urlencode({k: v for k, v in params.items() if v not in (None, "")})
        return f"{self.root}{path}" + (f"?{q}" if q else "")

    @property
    def own_origin(self) -> str:
        """This site's origin: built from the allowed host, never echoed from the request."""
        return f"{self.environ.get('wsgi.url_scheme', 'http')}://{self.host}"


# ------------------------------------------------------------------ the application


class Dashboard:
    """The WSGI application (``make_app`` builds one)."""

    def __init__(self, dsn: str, *, allow_actions: bool = False, token: str | None = None,
                 action_dsn: str | None = None, redis_url: str | None = None,
                 redis_prefix: str = "pyscheduler:schedules", refresh_s: int = REFRESH_S,
                 allowed_hosts: str | Iterable[str] | None = None):
        self.dsn = dsn
        self.allowed_hosts = parse_hosts(allowed_hosts)
        self.allow_actions = allow_actions
        self.token = token or None
        self.action_dsn = action_dsn or dsn
        self.redis_url = redis_url
        self.redis_prefix = redis_prefix
        self.refresh_s = refresh_s
        self.secret = secrets.token_bytes(32)  # signs CSRF tokens and flashes; new per process
        self._db: Database | None = None
        self._open_lock = threading.Lock()
        self.reader: Reader | None = None
        self._redis_state: tuple[float, dict[str, Any]] | None = None
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
            autoescape=True, trim_blocks=True, lstrip_blocks=True, undefined=jinja2.ChainableUndefined)
        self.env.filters.update(time=fmt_time, dur=fmt_duration, mask_url=mask_url,
                                json=lambda v: json.dumps(mask_json(v), indent=2, sort_keys=True, default=str))
        self.routes: list[tuple[str, re.Pattern[str], Callable[..., Any]]] = [
            ("GET", re.compile(r"^/$"), self.overview),
            ("GET", re.compile(r"^/tasks$"), self.tasks_page),
            ("GET", re.compile(r"^/tasks/(?P<rn>[0-9a-fA-F-]{36})$"), self.task_page),
            ("GET", re.compile(r"^/delay$"), self.delay_page),
            ("GET", re.compile(r"^/schedules$"), self.schedules_page),
            ("GET", re.compile(r"^/schedule$"), self.schedule_page),
            ("GET", re.compile(r"^/checks$"), self.checks_page),
            ("GET", re.compile(r"^/confirm/(?P<action>[a-z_]+)$"), self.confirm_page),
            ("POST", re.compile(r"^/actions/(?P<action>[a-z_]+)$"), self.act),
            ("GET", re.compile(r"^/login$"), self.login_page),
            ("POST", re.compile(r"^/login$"), self.login),
        ]

    # -- resources ------------------------------------------------------------------

    def _open(self) -> Reader:
        """The pages read as the login that acts when actions are on (the operator sees what
        that role may see: docs/sql-api.md, "Ownership"), else as the read-only login."""
        with self._open_lock:
            if self.reader is None:
                db = Database(self.action_dsn if self.allow_actions else self.dsn, min_size=1, max_size=4,
                              name="dashboard", timeout=10.0)
                db.open(wait=True, timeout=10.0)
                self._db, self.reader = db, Reader(db)
            return self.reader

    def _actions(self) -> Actions:
        self._open()
        assert self._db is not None
        return Actions(self._db)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()

    def redis_state(self) -> dict[str, Any]:
        """Degraded mode as the executors see it: Redis unreachable, or its index incomplete
        (marker gone: a resync runs). Cached 5 s; unknown without --redis-url."""
        if not self.redis_url:
            return {"known": False}
        now = time.monotonic()
        if self._redis_state and now - self._redis_state[0] < 5:
            return self._redis_state[1]
        from ..schedules.index import Shards

        state: dict[str, Any] = {"known": True}
        try:
            index = Shards.from_url(self.redis_url, self.redis_prefix, timeout=0.5)  # redis:// or redis+cluster://
            try:
                state.update(index_complete=index.marker() is not None, reachable=True)
            finally:
                index.close()
        except Exception as exc:  # noqa: BLE001  (any failure to reach Redis is what we report)
            state.update(reachable=False, error=type(exc).__name__)
        self._redis_state = (now, state)
        return state

    def announce(self, host: str, port: int) -> None:
        """Log where the dashboard listens and whether it needs a token, after a warning when
        it listens beyond loopback without one (the servers call it once they listen)."""
        if not self.token and not is_loopback(host):
            log.warning("the dashboard listens on %s, beyond loopback, without an access token: whoever reaches "
                        "port %d reads every page%s. Set PYSCHEDULER_DASHBOARD_TOKEN (--token), or listen on "
                        "127.0.0.1 behind a proxy", host or "every interface", port,
                        " and acts" if self.allow_actions else "")
        shown = f"[{host}]" if ":" in host else host
        names = [f"{n}:{port}" for n in LOOPBACK_NAMES] + list(self.allowed_hosts)
        log.info("dashboard on http://%s:%d/ (%s, %s; answers to Host %s)", shown, port,
                 "actions allowed" if self.allow_actions else "read-only",
                 "access token required" if self.token else "no access token", ", ".join(names))

    # -- WSGI -------------------------------------------------------------------------

    def allowed_host(self, environ: dict[str, Any]) -> str | None:
        """The host of this request if it is allowed, else None: a loopback name with the port
        the server listens on, or a configured ``NAME`` (any port) or ``NAME:PORT``: that name
        and the port as ``Host`` gave it (digits only; none for the scheme's default port, as
        browsers write ``Origin``)."""
        m = _HOST.match((environ.get("HTTP_HOST") or "").strip().lower())
        if m is None:
            return None
        name, port = m["name"], m["port"] or {"https": "443"}.get(environ.get("wsgi.url_scheme", ""), "80")
        if (name in LOOPBACK_NAMES and port == environ.get("SERVER_PORT")) or name in self.allowed_hosts \
                or f"{name}:{port}" in self.allowed_hosts:
            return f"{name}:{m['port']}" if m["port"] else name
        return None

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        host = self.allowed_host(environ)
        if host is None:  # DNS rebinding: a page of another name that resolves to this address
            data = (b"421 Misdirected Request: this dashboard does not answer to that Host "
                    b"(allowed: loopback names, and --allowed-host)\n")
            start_response("421 Misdirected Request", [("Content-Type", "text/plain; charset=utf-8"),
                                                       ("Content-Length", str(len(data))),
                                                       ("Cache-Control", "no-store")])
            return [data]
        req = Request(environ, host)
        headers: list[tuple[str, str]] = []
        nonce = secrets.token_urlsafe(16)
        req.nonce = nonce
        session = req.cookies.get(SESSION_COOKIE)
        if not session or not re.fullmatch(r"[A-Za-z0-9_-]{32,64}", session):
            session = secrets.token_urlsafe(32)
            headers.append(("Set-Cookie", self._cookie(req, SESSION_COOKIE, session)))
        req.session = session
        started = time.perf_counter()
        try:
            status, body, extra = self._dispatch(req)
        except HTTPError as exc:
            status, body, extra = exc.status, self._render(req, "error.html", title=exc.status,
                                                             message=exc.message), []
        except DatabaseUnavailable as exc:
            status, body, extra = "503 Service Unavailable", self._render(
                req, "error.html", title="database unavailable", message=str(exc)), []
        except InvalidArgument as exc:  # a filter the database refuses (a name that is not a label)
            status, body, extra = "400 Bad Request", self._render(
                req, "error.html", title="400 Bad Request", message=str(exc)), []
        except Exception:  # noqa: BLE001
            log.exception("dashboard: %s %s", req.method, req.path)
            status, body, extra = "500 Internal Server Error", self._render(
                req, "error.html", title="error", message="internal error (see the dashboard's log)"), []
        headers += extra
        headers += [
            ("Content-Type", "text/html; charset=utf-8"),
            ("Cache-Control", "no-store"),
            ("X-Content-Type-Options", "nosniff"),
            ("X-Frame-Options", "DENY"),
            ("Referrer-Policy", "same-origin"),
            ("Content-Security-Policy",
             f"default-src 'none'; style-src 'nonce-{nonce}'; script-src 'nonce-{nonce}'; img-src 'self' data:; "
             "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
            ("Server-Timing", f"app;dur={(time.perf_counter() - started) * 1000:.1f}"),
        ]
        data = body.encode() if isinstance(body, str) else body
        headers.append(("Content-Length", str(len(data))))
        start_response(status, headers)
        return [data]

    def _cookie(self, req: Request, name: str, value: str, max_age: int | None = None) -> str:
        path = req.root or "/"
        secure = "; Secure" if req.environ.get("wsgi.url_scheme") == "https" else ""
        age = f"; Max-Age={max_age}" if max_age is not None else ""
        return f"{name}={value}; Path={path}; HttpOnly; SameSite=Strict{secure}{age}"

    def _dispatch(self, req: Request) -> tuple[str, str, list[tuple[str, str]]]:
        if self.token and req.path != "/login" and not self._authorized(req):
            if req.method == "POST":
                raise HTTPError("401 Unauthorized", "an access token is required")
            return "401 Unauthorized", self._render(req, "login.html", title="access token", failed=False,
                                                     next=req.path), []
        allowed = False
        for method, pattern, handler in self.routes:
            m = pattern.match(req.path)
            if m and method == req.method:
                result = handler(req, **m.groupdict())
                if isinstance(result, tuple):
                    return result
                return "200 OK", result, []
            allowed = allowed or m is not None
        if allowed:
            raise HTTPError("405 Method Not Allowed", f"{req.method} is not allowed here")
        raise HTTPError("404 Not Found", f"no page {req.path}")

    # -- access token -------------------------------------------------------------------

    def _token_digest(self) -> str:
        assert self.token is not None
        return hmac.new(self.secret, b"token:" + self.token.encode(), hashlib.sha256).hexdigest()

    def _authorized(self, req: Request) -> bool:
        assert self.token is not None
        auth = req.environ.get("HTTP_AUTHORIZATION", "")
        if auth.startswith("Bearer ") and hmac.compare_digest(auth[7:].strip().encode(), self.token.encode()):
            return True
        cookie = req.cookies.get(TOKEN_COOKIE, "")
        return bool(cookie) and hmac.compare_digest(cookie.encode(), self._token_digest().encode())

    def login_page(self, req: Request) -> str:
        return self._render(req, "login.html", title="access token", failed=False, next=req.arg("next") or "/")

    def login(self, req: Request):
        self._check_same_origin(req)
        given = req.form.get("token", "")
        nxt = req.form.get("next", "/")
        if not nxt.startswith("/") or nxt.startswith("//"):
            nxt = "/"
        if not self.token or not hmac.compare_digest(given.encode(), self.token.encode()):
            return "401 Unauthorized", self._render(req, "login.html", title="access token", failed=True,
                                                     next=nxt), []
        return "303 See Other", "", [("Location", req.root + nxt),
                                     ("Set-Cookie", self._cookie(req, TOKEN_COOKIE, self._token_digest(), 86400))]

    # -- cross-site protection -----------------------------------------------------------

    def csrf_token(self, req: Request) -> str:
        return hmac.new(self.secret, b"csrf:" + req.session.encode(), hashlib.sha256).hexdigest()

    def _check_same_origin(self, req: Request) -> None:
        """A POST must come from a page of this site: Sec-Fetch-Site (when sent) says so,
        Origin (when sent, else Referer) is this host."""
        site = req.environ.get("HTTP_SEC_FETCH_SITE")
        if site and site not in ("same-origin", "none"):
            raise HTTPError("403 Forbidden", f"cross-site request refused (Sec-Fetch-Site: {site})")
        origin = req.environ.get("HTTP_ORIGIN")
        if origin is None:
            referer = req.environ.get("HTTP_REFERER")
            if referer:
                p = urllib.parse.urlsplit(referer)
                origin = f"{p.scheme}://{p.netloc}"
        if origin is None or origin == "null" or origin != req.own_origin:
            raise HTTPError("403 Forbidden", f"cross-site request refused (origin {origin or 'missing'})")

    def _check_csrf(self, req: Request) -> None:
        self._check_same_origin(req)
        given = req.form.get("csrf", "")
        if not given or not hmac.compare_digest(given.encode(), self.csrf_token(req).encode()):
            raise HTTPError("403 Forbidden", "missing or wrong CSRF token: reload the page and try again")

    # -- flash messages (signed, so a link cannot put words in the page) ----------------------

    def _flash(self, ok: bool, text: str) -> str:
        raw = json.dumps([ok, text[:500]]).encode()
        sig = hmac.new(self.secret, b"flash:" + raw, hashlib.sha256).hexdigest()[:32]
        return urllib.parse.quote(raw.decode()) + "." + sig

    def _read_flash(self, req: Request) -> tuple[bool, str] | None:
        value = req.query.get("flash")
        if not value or "." not in value:
            return None
        raw_q, sig = value.rsplit(".", 1)
        raw = raw_q.encode()
        want = hmac.new(self.secret, b"flash:" + raw, hashlib.sha256).hexdigest()[:32]
        if not hmac.compare_digest(sig.encode(), want.encode()):
            return None
        ok, text = json.loads(raw)
        return bool(ok), str(text)

    # -- rendering ------------------------------------------------------------------------

    def _render(self, req: Request, template: str, **ctx: Any) -> str:
        now = ctx.pop("now", None) or datetime.now(timezone.utc)
        flash = None
        try:
            flash = self._read_flash(req)
        except (ValueError, TypeError):
            pass

        def url(path: str, **params: Any) -> str:
            return req.url(path, **params)

        def here(**changes: Any) -> str:
            q = dict(req.query)
            q.pop("flash", None)
            q.update(changes)
            return req.url(req.path, **q)

        def action(name: str, label: str, /, danger: bool = False, **args: Any) -> Markup:
            if not self.allow_actions:
                return Markup("")
            href = req.url(f"/confirm/{name}", next=_here_plain(req), **args)
            cls = "act danger" if danger else "act"
            return Markup(f'<a class="{cls}" href="{html.escape(href)}">{html.escape(label)}</a>')

        return self.env.get_template(template).render(
            req=req, url=url, here=here, action=action, now=now, nonce=req.nonce,
            rel=lambda v: fmt_relative(v, now), allow_actions=self.allow_actions, flash=flash,
            refresh_s=self.refresh_s, PAGE=PAGE, mask_target=mask_target, **ctx)

    # -- pages ----------------------------------------------------------------------------

    def overview(self, req: Request) -> str:
        r = self._open()
        now = r.clock()
        queues = r.queues()
        activity = r.activity()
        delay = r.delay()
        late = r.db.query("SELECT pyscheduler.schedules_late_count(up_to => 1000) AS n")[0]["n"]
        failing = r.db.query(
            "SELECT count(*) AS n FROM (SELECT 1 FROM pyscheduler.schedules_failing LIMIT 1000) x")[0]["n"]
        paused = r.db.query(
            "SELECT count(*) AS n FROM (SELECT 1 FROM pyscheduler.schedules_paused LIMIT 1000) x")[0]["n"]
        overdue = r.db.query("SELECT count(*) AS n FROM (SELECT 1 FROM pyscheduler.overdue_checks LIMIT 1000) x")[0]["n"]
        expired = len(r.expired_leases(1000))
        slots = r.check_slots()
        per_slot = r.checks_per_slot(4)
        hour = charts.summarise(activity, now)
        return self._render(
            req, "overview.html", title="overview", now=now, queues=queues,
            tasks_total={k: sum(q[k] for q in queues) for k in ("ready", "delayed", "running")},
            paused_queues=sum(1 for q in queues if q["paused"]),
            oldest_ready=max((q["oldest_ready_age"] for q in queues if q["oldest_ready_age"]), default=None),
            expired=expired, delay=delay, late=late, failing=failing, paused=paused, overdue=overdue,
            slots=slots, per_slot=per_slot, hour=hour, redis=self.redis_state(),
            charts={cap: Markup(charts.bars(hour[cap]["buckets"], hour["edges"])) for cap in ("tasks", "schedules",
                                                                                           "checks")},
            delay_chart=Markup(charts.samples([(t, s) for _, t, s in r.delay_samples], now)))

    def tasks_page(self, req: Request) -> str:
        r = self._open()
        queue, owner = req.arg("queue"), req.arg("owner")
        status = req.arg("status") or "running"
        if status not in TASK_STATUSES + ("all",):
            raise HTTPError("400 Bad Request", f"unknown status {status!r}")
        page = r.tasks(queue=queue, status=None if status == "all" else status, owner=owner,
                       cursor=req.arg("cursor"))
        return self._render(req, "tasks.html", title="tasks", now=r.clock(), queues=r.queues(),
                            expired=r.expired_leases(20), page=page, queue=queue, owner=owner, status=status,
                            statuses=TASK_STATUSES)

    def task_page(self, req: Request, rn: str) -> str:
        r = self._open()
        try:
            task = r.task(rn)
        except SchedulerError as exc:
            raise HTTPError("404 Not Found", f"task {rn}: {exc}") from None
        if task is None:
            raise HTTPError("404 Not Found", f"no task {rn}")
        return self._render(req, "task.html", title=f"task {rn}", now=r.clock(), task=task)

    def delay_page(self, req: Request) -> str:
        r = self._open()
        d = r.delay()
        now = d["queue"]["now"]
        return self._render(req, "delay.html", title="delay queue", now=now, d=d,
                            chart=Markup(charts.samples([(t, s) for _, t, s in r.delay_samples], now)))

    def schedules_page(self, req: Request) -> str:
        r = self._open()
        kind = req.arg("target_kind")
        if kind not in (None, "kafka", "http", "task"):
            raise HTTPError("400 Bad Request", f"unknown target kind {kind!r}")
        flags = {k: {"yes": True, "no": False}.get(req.arg(k) or "") for k in ("paused", "critical")}
        page = r.schedules(name_like=req.arg("name_like"), target_kind=kind, cursor=req.arg("cursor"), **flags)
        # One read for both cards: schedules_due_soon lists the late schedules first, in the order of
        # schedules_late (both by due time), so its first 20 rows hold the first 20 late ones.
        soon = r.schedule_view("schedules_due_soon", 20)
        late = [dict(s, late_by=-s["due_in"]) for s in soon if s["due_in"] < -LATE_AFTER]
        return self._render(req, "schedules.html", title="schedules", now=r.clock(), page=page,
                            late=late, failing=r.schedule_view("schedules_failing"),
                            paused=r.schedule_view("schedules_paused"), redis=self.redis_state(),
                            due_soon=soon[:10])

    def schedule_page(self, req: Request) -> str:
        r = self._open()
        name = req.query.get("name") or ""
        outcome = req.arg("outcome")
        if outcome not in (None,) + RUN_OUTCOMES:
            raise HTTPError("400 Bad Request", f"unknown outcome {outcome!r}")
        try:
            schedule = r.schedule(name)
        except SchedulerError as exc:
            raise HTTPError("404 Not Found", str(exc)) from None
        return self._render(req, "schedule.html", title=f"schedule {name}", now=r.clock(), s=schedule,
                            upcoming=r.upcoming(name), runs=r.runs(name, outcome=outcome, cursor=req.arg("cursor")),
                            outcome=outcome, outcomes=RUN_OUTCOMES)

    def checks_page(self, req: Request) -> str:
        r = self._open()
        filters = {k: req.arg(k) for k in ("entity_name", "entity_key", "job")}
        outcome = req.arg("outcome")
        if outcome not in (None,) + CHECK_OUTCOMES:
            raise HTTPError("400 Bad Request", f"unknown outcome {outcome!r}")
        pending = r.checks(**filters, cursor=req.arg("cursor"))
        history = r.history(**filters, outcome=outcome, cursor=req.arg("hcursor"))
        return self._render(req, "checks.html", title="checks", now=r.clock(), slots=r.check_slots(),
                            per_slot=r.checks_per_slot(12), overdue=r.overdue_checks(20),
                            outcomes=r.check_outcomes(), pending=pending, history=history, filters=filters,
                            outcome=outcome, check_outcomes=CHECK_OUTCOMES)

    # -- actions ----------------------------------------------------------------------------

    ACTIONS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
        # name: (what it does, required arguments, optional arguments)
        "cancel_task": ("Cancel task {rn}", ("rn",), ()),
        "retry_task": ("Requeue task {rn} (a fresh round of attempts)", ("rn",), ()),
        "pause_queue": ("Pause queue {queue}: its workers lease nothing until it is resumed", ("queue",), ("note",)),
        "resume_queue": ("Resume queue {queue}", ("queue",), ()),
        "pause_schedule": ("Pause schedule {name}", ("name",), ("note",)),
        "resume_schedule": ("Resume schedule {name} (from the first occurrence at or after now)", ("name",), ()),
        "trigger_schedule": ("Fire schedule {name} once now", ("name",), ()),
        "delete_checks": ("Delete the pending checks of {entity_name} {entity_key} (job {job})",
                          ("entity_name", "entity_key"), ("job",)),
    }

    def _action_args(self, action: str, source: dict[str, str]) -> dict[str, str | None]:
        if not self.allow_actions:
            raise HTTPError("403 Forbidden", "actions are disabled (start the dashboard with --allow-actions)")
        if action not in self.ACTIONS:
            raise HTTPError("404 Not Found", f"no action {action}")
        _, required, optional = self.ACTIONS[action]
        args: dict[str, str | None] = {}
        for name in required:
            value = (source.get(name) or "").strip()
            if not value:
                raise HTTPError("400 Bad Request", f"{action} needs {name}")
            args[name] = value
        for name in optional:
            args[name] = (source.get(name) or "").strip() or None
        if "rn" in args:
            try:
                args["rn"] = str(uuid.UUID(args["rn"] or ""))
            except ValueError:
                raise HTTPError("400 Bad Request", "rn is not a UUID") from None
        return args

    def confirm_page(self, req: Request, action: str) -> str:
        args = self._action_args(action, req.query)
        what = self.ACTIONS[action][0].format(**{k: v if v is not None else "any" for k, v in args.items()})
        return self._render(req, "confirm.html", title="confirm", act_name=action, args=args, what=what,
                            back=_safe_next(req.query.get("next")), csrf=self.csrf_token(req))

    def act(self, req: Request, action: str):
        self._check_csrf(req)
        args = self._action_args(action, req.form)
        back = _safe_next(req.form.get("next"))
        what = self.ACTIONS[action][0].format(**{k: v if v is not None else "any" for k, v in args.items()})
        try:
            result = getattr(self._actions(), action)(**args)
            ok, text = True, f"done: {what}" + (f" ({result} checks)" if action == "delete_checks" else "")
            log.info("dashboard action %s %s", action, args)
        except SchedulerError as exc:
            ok, text = False, f"refused: {what}: {exc}" + (f" ({exc.sqlstate})" if exc.sqlstate else "")
        sep = "&" if "?" in back else "?"
        return "303 See Other", "", [("Location", req.root + back + sep + "flash=" + self._flash(ok, text))]


def _here_plain(req: Request) -> str:
    q = {k: v for k, v in req.query.items() if k != "flash"}
    return req.path + ("?" + urllib.parse.urlencode(q) if q else "")


def _safe_next(value: str | None) -> str:
    """Only a path of this site (no scheme, no //host)."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    return value


def make_app(dsn: str, allow_actions: bool = False, token: str | None = None, action_dsn: str | None = None,
             **options: Any) -> Dashboard:
    """The dashboard as a WSGI callable. ``dsn``: a login in pyscheduler_monitor, the pages'
    when actions are off; ``action_dsn``: the login the pages and actions use when they are on
    (default ``dsn``; an admin login sees and acts on every role's work); options: ``redis_url``, ``redis_prefix``, ``refresh_s``,
    ``allowed_hosts`` (names it answers to besides loopback: ``parse_hosts``)."""
    return Dashboard(dsn, allow_actions=allow_actions, token=token, action_dsn=action_dsn, **options)
