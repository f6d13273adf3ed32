"""Credentials out of whatever pyscheduler shows: the one helper every log line, error
message, ``/readyz`` body, CLI line and dashboard page that prints a URL or a DSN goes
through (design.md, "Guarantees by construction": secrets; tests/shared/test_masking.py checks
the code for calls that print one without it)."""

from __future__ import annotations

import re
import urllib.parse

# a path segment that looks like a key: 16+ characters mixing letters and digits (a webhook's secret path)
_SECRETISH = re.compile(r"^(?=.*\d)(?=.*[A-Za-z])[A-Za-z0-9_\-=+/.~]{16,}$")
# the value of a password-like key in a libpq key=value DSN (password, sslpassword): quoted or not
_DSN_PASSWORD = re.compile(r"(\b\w*password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s']\S*)", re.IGNORECASE)


def mask_url(url: str | None) -> str | None:
    """``url`` without what may be a credential.

    A URL (``scheme://...``): its password becomes ``***``, and so do a user name, path
    segments that look like keys (16+ characters mixing letters and digits: a token, a
    webhook's secret path), query values and the fragment; the scheme, every host and port
    (``redis+cluster://u:p@h1:1,h2:2``, ``postgresql://u:p@h1,h2/db``), a plain user name and
    plain path segments stay. A libpq key=value DSN (``host=db user=app password=x``): the
    values of password-like keys become ``***``. Anything else (``host:port``) is returned as
    it is."""
    if not url:
        return url
    if "://" not in url:
        return _DSN_PASSWORD.sub(r"\1***", url)
    try:
        p = urllib.parse.urlsplit(url)
    except ValueError:
        return "***"
    auth, at, hosts = p.netloc.rpartition("@")
    user, colon, _ = auth.partition(":")
    netloc = f"{_plain(user)}{':***' if colon else ''}@{hosts}" if at else hosts
    path = "/".join(_plain(seg) for seg in p.path.split("/"))
    query = "&".join(f"{k}=***" for k, _ in urllib.parse.parse_qsl(p.query, keep_blank_values=True))
    return urllib.parse.urlunsplit((p.scheme, netloc, path, query, "***" if p.fragment else ""))


def _plain(part: str) -> str:
    return "***" if _SECRETISH.match(urllib.parse.unquote(part)) else part
