"""The one egress policy for network destinations a client names (HTTP targets).

SQL checks what a URL says when a schedule is created (``_http_target_refusal`` in
sql/egress.sql, the literal host); this module checks, before every request, the addresses the
host name resolves to *now* and connects to exactly the address it checked, so DNS rebinding
cannot bypass it. ``BLOCKED`` is the list of SQL's ``_egress_blocked()`` (a test compares them).
A refused address is refused before any connection, in the same words whatever listens there.
The policy: docs/operations.md, "Egress policy for HTTP targets".
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

BLOCKED: tuple[Network, ...] = tuple(ipaddress.ip_network(n) for n in (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
    "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16", "198.18.0.0/15",
    "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
    "::/127", "::ffff:0:0/96", "64:ff9b::/96", "64:ff9b:1::/48", "100::/64", "2001::/23", "2001:db8::/32",
    "2002::/16", "3fff::/20", "5f00::/16", "fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8"))


class EgressRefused(Exception):
    """The destination is not allowed by the egress policy (never retried as an outage:
    the same URL is refused again until an admin widens the allow-list)."""


def allow_list(values: Iterable[str | Network] | None) -> tuple[Network, ...]:
    """Networks from ``http_allow()`` (cidr values as text or networks)."""
    return tuple(ipaddress.ip_network(v, strict=False) if isinstance(v, str) else v for v in values or ())


def address_refusal(address: Address | str, allow: Iterable[Network] = ()) -> str | None:
    """Why ``address`` may not be reached (None: it may)."""
    ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id:
        ip = ipaddress.ip_address(str(ip).split("%")[0])
    if any(ip.version == n.version and ip in n for n in allow):
        return None
    if any(ip.version == n.version and ip in n for n in BLOCKED):
        return (f"{ip} is not a public address (loopback, private, link-local and the like are refused "
                f"unless an admin allows them with set_http_allow)")
    return None


@dataclass(frozen=True)
class Target:
    """An HTTP URL split for a pinned connection."""

    scheme: str
    host: str  # as in the URL (brackets stripped), for TLS and the Host header
    port: int
    path: str  # path and query, at least "/"

    @classmethod
    def parse(cls, url: str) -> "Target":
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise EgressRefused("the URL must start with http:// or https://")
        if parts.username is not None or parts.password is not None:
            raise EgressRefused("the URL must not carry credentials (user:password@)")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as exc:
            raise EgressRefused(f"bad port: {exc}") from None
        if not parts.hostname:
            raise EgressRefused("the URL has no host")
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        return cls(parts.scheme, parts.hostname, port, path)


def resolve(host: str, port: int, allow: Iterable[Network] = ()) -> list[tuple]:
    """The socket addresses ``host`` resolves to that the policy allows, in resolver order;
    EgressRefused when none is (naming the first refused address, never a port's state)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as exc:
        raise OSError(f"cannot resolve {host}: {exc}") from None
    allowed, refused = [], None
    for family, _, _, _, sockaddr in infos:
        why = address_refusal(sockaddr[0], allow)
        if why is None:
            allowed.append((family, sockaddr))
        elif refused is None:
            refused = why
    if not allowed:
        raise EgressRefused(f"{host} resolves to {refused}" if refused else f"{host} has no address")
    return allowed


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """Connects to one checked socket address, whatever the host name resolves to now."""

    def __init__(self, host: str, port: int, sockaddr: tuple, family: int, timeout: float):
        super().__init__(host, port, timeout=timeout)
        self._sockaddr, self._family = sockaddr, family

    def connect(self) -> None:
        sock = socket.socket(self._family, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._sockaddr)
        except BaseException:
            sock.close()
            raise
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock


class _PinnedHTTPSConnection(_PinnedHTTPConnection):
    def __init__(self, host: str, port: int, sockaddr: tuple, family: int, timeout: float,
                 context: ssl.SSLContext):
        super().__init__(host, port, sockaddr, family, timeout)
        self._context = context

    def connect(self) -> None:
        super().connect()
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self.host)


_TLS = ssl.create_default_context()


def post(url: str, body: bytes, headers: Mapping[str, str], *, timeout: float,
         allow: Iterable[Network] = ()) -> int:
    """POST ``body`` to ``url`` through the egress policy; the response status. Redirects
    are not followed (the caller decides what a 3xx means). Raises EgressRefused for a
    destination the policy refuses, OSError (or http.client.HTTPException) when the
    request fails; a message never tells a closed port from a filtered one."""
    target = Target.parse(url)
    allow = tuple(allow)
    for family, sockaddr in resolve(target.host, target.port, allow):
        if target.scheme == "https":
            conn: http.client.HTTPConnection = _PinnedHTTPSConnection(target.host, target.port, sockaddr, family,
                                                                      timeout, _TLS)
        else:
            conn = _PinnedHTTPConnection(target.host, target.port, sockaddr, family, timeout)
        try:
            try:
                conn.connect()
            except ssl.SSLError:
                raise
            except OSError:  # refused, unreachable, timed out: try the next address
                continue
            conn.request("POST", target.path, body=body, headers=dict(headers))
            resp = conn.getresponse()
            resp.read()
            return resp.status
        finally:
            conn.close()
    raise OSError(f"could not connect to {target.host} port {target.port}") from None


__all__ = ["BLOCKED", "EgressRefused", "Target", "address_refusal", "allow_list", "post", "resolve"]
