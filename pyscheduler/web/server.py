"""The one HTTP server of pyscheduler, ``BoundedServer``: every process's endpoint
(``web.endpoint``) and the dashboard on its own (``serve``) run their WSGI application on it.

One thread reads every connection (a selector) until its request has arrived whole, then a
fixed pool of ``WORKERS`` threads runs the application; requests for the ``quick_paths``
given have a thread of their own. So an idle or slow connection costs a descriptor, never a
thread, and the bounds below (``MAX_CONNECTIONS``, ``READ_TIMEOUT``, ``MAX_LINE``,
``MAX_HEAD``, ``MAX_BODY``) keep the descriptors few: docs/operations.md, "Metrics and
health". One request per connection (HTTP/1.0).
"""

from __future__ import annotations

import errno
import io
import logging
import queue
import re
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 128
READ_TIMEOUT = 10.0  # s
MAX_LINE = 8 * 1024
MAX_HEAD = 32 * 1024
MAX_BODY = 64 * 1024
WORKERS = 8

_END_OF_HEAD = re.compile(rb"\r?\n\r?\n")
_CONTENT_LENGTH = re.compile(rb"\ncontent-length[ \t]*:[ \t]*([^\r\n]*)", re.IGNORECASE)


class _Connection:
    __slots__ = ("sock", "address", "deadline", "data", "size", "refused")

    def __init__(self, sock: socket.socket, address: Any, deadline: float):
        self.sock, self.address, self.deadline = sock, address, deadline
        self.data = bytearray()
        self.size: int | None = None  # bytes of the whole request, once its head has arrived
        self.refused = False  # answered with an error: what the client still sends is read and dropped


class _Writer(io.RawIOBase):
    """The answer's bytes straight to the socket (sendall: bounded by the socket's timeout)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.sock.sendall(data)
        return len(data)


class _Handler(WSGIRequestHandler):
    """wsgiref's handler on a request already read whole (``data``)."""

    def __init__(self, sock: socket.socket, address: Any, server: "BoundedServer", data: bytes):
        self.data = data
        super().__init__(sock, address, server)

    def setup(self) -> None:
        self.connection = self.request
        self.rfile = io.BytesIO(self.data)
        self.wfile = _Writer(self.request)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (wsgiref's signature)
        log.debug("http %s: " + format, self.address_string(), *args)


def _family(host: str, port: int) -> socket.AddressFamily:
    """IPv4 when the host has an IPv4 address (``localhost`` stays 127.0.0.1), else IPv6."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    families = [info[0] for info in infos]
    return socket.AF_INET if socket.AF_INET in families else families[0]


def _answer(status: str, text: str) -> bytes:
    body = text.encode() + b"\n"
    return (f"HTTP/1.0 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n").encode() + body


class BoundedServer:
    """Serves ``app`` (WSGI) on ``host:port`` (port 0: any free one) within the module's
    bounds: at most ``max_connections`` open (one arriving at the bound closes the oldest that
    has not sent a whole request yet, or itself when every open one is being answered), each
    request within ``read_timeout`` of its connection (408), line, head and body within
    ``MAX_LINE`` (414), ``MAX_HEAD`` (431) and ``MAX_BODY`` (413). ``start()`` serves in a
    thread of its own; ``close()`` stops."""

    def __init__(self, host: str, port: int, app: Callable[..., Any], *, max_connections: int = MAX_CONNECTIONS,
                 read_timeout: float = READ_TIMEOUT, workers: int = WORKERS, quick_paths: tuple[str, ...] = ()):
        self.app = app
        self.quick_paths = tuple(p.encode() for p in quick_paths)
        self.max_connections, self.read_timeout = max_connections, read_timeout
        self.socket = socket.create_server((host, port), family=_family(host, port), backlog=max_connections)
        self.socket.setblocking(False)
        self.server_address = self.socket.getsockname()
        self.base_environ = {"SERVER_NAME": host or "0.0.0.0", "GATEWAY_INTERFACE": "CGI/1.1",
                             "SERVER_PORT": str(self.server_address[1]), "REMOTE_HOST": "", "CONTENT_LENGTH": "",
                             "SCRIPT_NAME": ""}
        self._reading: dict[socket.socket, _Connection] = {}  # in the order accepted: oldest deadline first
        self._answering = 0  # handed to the workers, not closed yet
        self._lock = threading.Lock()
        self._requests: queue.SimpleQueue[_Connection | None] = queue.SimpleQueue()
        self._quick: queue.SimpleQueue[_Connection | None] = queue.SimpleQueue()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._accept_after = 0.0  # monotonic: when to accept again after running out of descriptors
        self._starved = False  # warned about it (once until a connection is accepted again)
        self._thread: threading.Thread | None = None
        self._workers = [threading.Thread(target=self._work, args=(self._requests,), name=f"http-{i}", daemon=True)
                         for i in range(workers)]
        if quick_paths:
            self._workers.append(threading.Thread(target=self._work, args=(self._quick,), name="http-quick",
                                                  daemon=True))

    # -- running -----------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def get_app(self) -> Callable[..., Any]:  # wsgiref's handler asks the server for it
        return self.app

    def start(self) -> "BoundedServer":
        self._thread = threading.Thread(target=self.serve_forever, name="http", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        for worker in self._workers:
            worker.start()
        self._selector.register(self.socket, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        try:
            while not self._stop.is_set():
                for key, _ in self._selector.select(self._wait()):
                    if key.fileobj is self.socket:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        self._wake_r.recv(64)
                    else:
                        self._read(key.data)
                self._expire()
                if self._accept_after and time.monotonic() >= self._accept_after:
                    self._accept_after = 0.0
                    self._selector.register(self.socket, selectors.EVENT_READ)
        finally:
            self._stopped.set()

    def close(self) -> None:
        """Stop serving: close the listening socket and every connection still being read."""
        self._stop.set()
        self._wake_w.send(b"x")
        if self._thread is not None:
            self._stopped.wait()
            self._thread.join()
        for conn in list(self._reading.values()):
            self._drop(conn)
        for _ in self._workers:
            self._requests.put(None)
            self._quick.put(None)
        self._selector.close()
        for sock in (self.socket, self._wake_r, self._wake_w):
            sock.close()

    # -- the reading thread ------------------------------------------------------------------

    def _wait(self) -> float:
        now = time.monotonic()
        wait = 1.0
        if self._reading:
            wait = min(wait, next(iter(self._reading.values())).deadline - now)
        if self._accept_after:
            wait = min(wait, self._accept_after - now)
        return max(wait, 0.0)

    def _accept(self) -> None:
        for _ in range(self.max_connections):
            try:
                sock, address = self.socket.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.ECONNABORTED:
                    continue
                if self._reading:  # out of descriptors: an idle connection makes room
                    self._drop(next(iter(self._reading.values())))
                    continue
                if not self._starved:
                    log.warning("http: cannot accept connections: %s", exc)
                self._starved = True
                self._selector.unregister(self.socket)  # for 0.1 s: no busy loop on a socket still readable
                self._accept_after = time.monotonic() + 0.1
                return
            self._starved = False
            with self._lock:
                full = len(self._reading) + self._answering >= self.max_connections
            if full:
                if not self._reading:
                    sock.close()  # every open connection is being answered
                    continue
                self._drop(next(iter(self._reading.values())))  # the oldest idle one makes room
            sock.setblocking(False)
            conn = _Connection(sock, address, time.monotonic() + self.read_timeout)
            self._reading[sock] = conn
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Connection) -> None:
        try:
            chunk = conn.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(conn)
            return
        if conn.refused:
            return  # read to its end (closing with unread bytes would reset the error answer)
        conn.data += chunk
        if conn.size is None:
            refusal = self._head(conn)
            if refusal is not None:
                self._refuse(conn, *refusal)
                return
        if conn.size is not None and len(conn.data) >= conn.size:
            self._selector.unregister(conn.sock)
            del self._reading[conn.sock]
            with self._lock:
                self._answering += 1
            (self._quick if self._is_quick(conn) else self._requests).put(conn)

    def _head(self, conn: _Connection) -> tuple[str, str] | None:
        """Sets ``conn.size`` once the head has arrived; the error to answer with, if any."""
        line = conn.data.find(b"\n")
        if line > MAX_LINE or (line < 0 and len(conn.data) > MAX_LINE):
            return "414 URI Too Long", f"request line over {MAX_LINE} bytes"
        end = _END_OF_HEAD.search(conn.data)
        if (end.start() if end else len(conn.data)) > MAX_HEAD:
            return "431 Request Header Fields Too Large", f"headers over {MAX_HEAD} bytes"
        if end is None:
            return None
        length = _CONTENT_LENGTH.search(conn.data, 0, end.start())
        raw = length.group(1).strip() if length else b"0"
        if not raw.isdigit():
            return "400 Bad Request", "bad Content-Length"
        if int(raw) > MAX_BODY:
            return "413 Content Too Large", f"body over {MAX_BODY} bytes"
        conn.size = end.end() + int(raw)
        return None

    def _expire(self) -> None:
        now = time.monotonic()
        while self._reading:
            conn = next(iter(self._reading.values()))
            if conn.deadline > now:
                return
            if conn.refused:
                self._drop(conn)
            else:
                self._refuse(conn, "408 Request Timeout", f"no whole request within {self.read_timeout:g} s")
                self._drop(conn)

    def _refuse(self, conn: _Connection, status: str, why: str) -> None:
        """Answer with an error; the connection closes once the client has sent all (or at
        its deadline)."""
        log.debug("http %s: %s (%s)", conn.address, status, why)
        conn.refused = True
        conn.data = bytearray()
        try:
            conn.sock.send(_answer(status, why))
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._drop(conn)

    def _drop(self, conn: _Connection) -> None:
        if self._reading.pop(conn.sock, None) is not None:
            self._selector.unregister(conn.sock)
            conn.sock.close()

    def _is_quick(self, conn: _Connection) -> bool:
        """The request's path (without its query) is one of ``quick_paths``."""
        line = bytes(conn.data[:conn.data.find(b"\n")]).split()
        return len(line) > 1 and line[1].split(b"?")[0] in self.quick_paths

    # -- the workers ---------------------------------------------------------------------------

    def _work(self, requests: queue.SimpleQueue[_Connection | None]) -> None:
        while (conn := requests.get()) is not None:
            try:
                conn.sock.settimeout(self.read_timeout)
                _Handler(conn.sock, conn.address, self, bytes(conn.data))
            except Exception as exc:  # noqa: BLE001  (a client gone or too slow to take the answer)
                log.debug("http %s: %s", conn.address, exc)
            finally:
                try:
                    conn.sock.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                conn.sock.close()
                with self._lock:
                    self._answering -= 1


def serve(app: Callable[..., Any], host: str = "127.0.0.1", port: int = 8080,
          ready: Callable[[str, int], None] | None = None, stop: threading.Event | None = None) -> None:
    """Serve ``app`` until ``stop`` is set (or forever): ``pyscheduler dashboard``. ``port`` 0
    picks a free port; ``ready(host, port)`` is called once it listens."""
    server = BoundedServer(host, port, app).start()
    try:
        if ready:
            ready(str(server.server_address[0]), server.port)
        (stop or threading.Event()).wait()
    finally:
        server.close()
