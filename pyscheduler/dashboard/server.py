"""Serving the dashboard on its own (``pyscheduler dashboard``), on pyscheduler's bounded
HTTP server (``pyscheduler.http_server``)."""

from __future__ import annotations

import threading
from typing import Any, Callable

from ..http_server import BoundedServer


def serve(app: Callable[..., Any], host: str = "127.0.0.1", port: int = 8080,
          ready: Callable[[str, int], None] | None = None, stop: threading.Event | None = None) -> None:
    """Serve ``app`` until ``stop`` is set (or forever). ``port`` 0 picks a free port;
    ``ready(host, port)`` is called once it listens."""
    server = BoundedServer(host, port, app).start()
    try:
        if ready:
            ready(str(server.server_address[0]), server.port)
        (stop or threading.Event()).wait()
    finally:
        server.close()
