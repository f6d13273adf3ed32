"""A threading wsgiref server for the dashboard (one thread per request)."""

from __future__ import annotations

import logging
import socketserver
import threading
from typing import Any, Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

log = logging.getLogger(__name__)


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (wsgiref's signature)
        log.debug("%s " + format, self.address_string(), *args)


def serve(app: Callable[..., Any], host: str = "127.0.0.1", port: int = 8080,
          ready: Callable[[str, int], None] | None = None, stop: threading.Event | None = None) -> None:
    """Serve ``app`` until ``stop`` is set (or forever). ``port`` 0 picks a free port;
    ``ready(host, port)`` is called once it listens."""
    server = make_server(host, port, app, server_class=_ThreadingServer, handler_class=_QuietHandler)
    try:
        bound_host, bound_port = server.server_address[:2]
        if ready:
            ready(str(bound_host), int(bound_port))
        if stop is None:
            server.serve_forever(poll_interval=0.5)
        else:
            thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
            thread.start()
            stop.wait()
            server.shutdown()
            thread.join()
    finally:
        server.server_close()
