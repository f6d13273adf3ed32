"""The dashboard's HTTP and security: ``Site``, a WSGI application of server-rendered pages
that answers only a ``Host`` it allows (a loopback name with the server's port, or one of
``allowed_hosts``: 421 otherwise, against DNS rebinding), gives each browser a session
cookie, sends a Content Security Policy with a per-response nonce, requires the access
token when one is set (``Authorization: Bearer`` or the cookie ``/login`` sets), routes
each request to its handler, and protects every POST (same origin, a per-session CSRF
token; SameSite=Strict cookies). ``Request`` is one request; ``HTTPError`` an error page.
Why each: docs/operations.md, "Dashboard".
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import re
import secrets
import time
import urllib.parse
from collections.abc import Callable, Iterable
from http.cookies import SimpleCookie
from typing import Any

from ...errors import DatabaseUnavailable, InvalidArgument

log = logging.getLogger("pyscheduler.dashboard")

SESSION_COOKIE = "pyscheduler_dash_session"
TOKEN_COOKIE = "pyscheduler_dash_token"

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
        self.host = host  # the allowed host this request came to (Site.allowed_host)
        self.method = environ.get("REQUEST_METHOD", "GET").upper()
        self.root = environ.get("SCRIPT_NAME", "").rstrip("/")
        self.path = environ.get("PATH_INFO", "") or "/"
        self.query_pairs = urllib.parse.parse_qsl(environ.get("QUERY_STRING", ""))
        self.query = dict(self.query_pairs)  # the last value of a name given twice
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

    def arg_list(self, name: str) -> list[str]:
        """Every value of ``name`` in the query (checkboxes of one name), in order."""
        return [v for k, v in self.query_pairs if k == name]

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


# ------------------------------------------------------------------ the site


class Site:
    """The HTTP side of the dashboard (``pages.Dashboard`` adds the pages): ``routes`` are
    (method, path pattern, handler), a handler returns the page's body or (status, body,
    headers); ``_render(req, template, **ctx)`` renders a template."""

    routes: list[tuple[str, re.Pattern[str], Callable[..., Any]]]

    def __init__(self, *, allow_actions: bool, token: str | None, allowed_hosts: str | Iterable[str] | None):
        self.allowed_hosts = parse_hosts(allowed_hosts)
        self.allow_actions = allow_actions
        self.token = token or None
        self.secret = secrets.token_bytes(32)  # signs CSRF tokens and flashes; new per process

    def _render(self, req: Request, template: str, **ctx: Any) -> str:
        raise NotImplementedError

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
        except Exception:  # noqa: BLE001 - any other failure is a logged 500
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

