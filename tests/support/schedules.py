"""Helpers of the schedule daemon tests (real Postgres, Redis, broker, HTTP server)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

from pyscheduler.db import Database, Jsonb
from pyscheduler.schedules.demo import Receiver  # noqa: F401  (the local HTTP target)
from pyscheduler.schedules.executor import Executor, ExecutorConfig
from pyscheduler.schedules.relay import IndexRelay

# fast settings: tests wait for events, these only bound how long that takes
FAST = dict(poll_ms=50, stuck_after_ms=1500, check_every_ms=300, fire_timeout_ms=3000)


def create(db: Database, name: str, *, every: float | None = None, cron: str | None = None, soon: bool = False,
           **fields) -> dict:
    """create_schedule with seconds for the intervals; payload dicts wrapped in Jsonb;
    ``soon``: first run in half a second (else interval schedules align to the epoch)."""
    args = dict(fields)
    if soon:
        args["start_at"] = datetime.now(timezone.utc) + timedelta(seconds=0.5)
    if every is not None:
        args["every"] = timedelta(seconds=every)
    if cron is not None:
        args["cron"] = cron
    for key in ("retry_base", "retry_jitter", "catchup_window"):
        if isinstance(args.get(key), (int, float)):
            args[key] = timedelta(seconds=args[key])
    if isinstance(args.get("payload"), (dict, list)):
        args["payload"] = Jsonb(args["payload"])
    args.setdefault("retry_attempts", 0)
    return db.call_value("create_schedule", name=name, **args)


def clone(conn, template_id: int, prefix: str, n: int, *, critical: str = "false", paused: str = "false",
          failures: str = "0", next_run: str = "now() + interval '1 day'") -> None:
    """n copies of a schedule named prefix0000.. (columns as given: SQL expressions of i)."""
    cols = ("every, cron, cron_spec, tz, start_at, end_at, max_runs, target_kind, target, priority, payload, "
            "retry_attempts, retry_base, retry_jitter, catchup_window, overlap, created, updated, owner")
    conn.execute(
        f"INSERT INTO pyscheduler.schedules (name, {cols}, critical, paused, consecutive_failures, next_run_at) "
        f"SELECT %s || lpad(i::text, 4, '0'), {', '.join('t.' + c.strip() for c in cols.split(','))}, "
        f"{critical}, {paused}, {failures}, {next_run} "
        "FROM pyscheduler.schedules t, generate_series(1, %s) i WHERE t.id = %s", (prefix, n, template_id))


def allow_loopback(db: Database) -> None:
    """Let HTTP targets reach 127.0.0.0/8 (the local test servers): the egress policy refuses
    loopback addresses unless an admin allows them (set_http_allow)."""
    db.call("set_http_allow", allow=["127.0.0.0/8"])


def executions(db: Database, name: str) -> list[dict]:
    return db.query("SELECT e.* FROM pyscheduler.schedule_executions e JOIN pyscheduler.schedules s "
                    "ON s.id = e.schedule_id WHERE s.name = %s ORDER BY e.expected_at", (name,))


def count(db: Database, name: str, outcome: str = "fired") -> int:
    return db.call_value("execution_count", name=name, outcome=outcome)


class Running:
    """Daemons in threads of the test process; ``stop()`` stops them and re-raises a crash."""

    def __init__(self, *daemons):
        self.daemons = list(daemons)
        self.stop_event = threading.Event()
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run, args=(d,), name=d.name, daemon=True) for d in daemons]
        for t in self.threads:
            t.start()

    def _run(self, d) -> None:
        try:
            d.run(self.stop_event)
        except BaseException as exc:
            self.errors.append(exc)

    def stop(self, timeout: float = 30) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout)
            assert not t.is_alive(), f"{t.name} did not stop"
        if self.errors:
            raise self.errors[0]

    def __enter__(self) -> "Running":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def executor(dsn: str, redis_url: str, kafka: str | None = None, prefix: str = "t:schedules", **overrides) -> Executor:
    return Executor(ExecutorConfig(dsn=dsn, redis_url=redis_url, kafka_bootstrap=kafka, prefix=prefix,
                                   **{**FAST, **overrides}))


def relay(dsn: str, redis_url: str, prefix: str = "t:schedules", **overrides) -> IndexRelay:
    return IndexRelay(dsn, redis_url, prefix=prefix, **{"reconcile_interval": 30.0, **overrides})


def executor_process(dsn: str, redis_url: str, log: Path, *extra: str, prefix: str = "t:schedules") -> subprocess.Popen:
    """``python -m pyscheduler.schedules run`` (one executor and the relay) in a subprocess."""
    cmd = [sys.executable, "-m", "pyscheduler.schedules", "run", "--dsn", dsn, "--redis-url", redis_url,
           "--prefix", prefix, "--executors", "1", "--poll-ms", "50", *extra]
    out = open(log, "wb")
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


class Probe:
    """A local HTTP server that records every connection it accepts and every request
    (method, path, headers) and answers ``status`` (with ``Location`` for a 3xx)."""

    def __init__(self, status: int = 200, location: str = "/elsewhere"):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.requests: list[tuple[str, str, dict]] = []
        self.connections = 0
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with outer.lock:
                    outer.requests.append((self.command, self.path, dict(self.headers)))
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_POST = do_GET = _any  # noqa: N815

            def log_message(self, *args) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def get_request(self):
                got = super().get_request()
                with outer.lock:
                    outer.connections += 1
                return got

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def received(self) -> list[tuple[str, str, dict]]:
        with self.lock:
            return list(self.requests)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Blackhole:
    """A TCP server that accepts every connection and never answers (nor closes it)."""

    def __init__(self):
        import socket

        self.sock = socket.create_server(("127.0.0.1", 0), backlog=512)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/never"
        self.held: list = []
        self.closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.closed.set()
        self.sock.close()
        for conn in self.held:
            conn.close()
