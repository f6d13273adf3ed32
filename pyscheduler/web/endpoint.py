"""The one HTTP endpoint of a process: ``/metrics`` (Prometheus text of what the process runs),
``/healthz`` (liveness), ``/readyz`` (200 when every daemon runs, none degraded, and every
server it uses answers; else 503, a JSON body naming what is wrong) and anything else to the
``app`` given (the dashboard under ``pyscheduler run``). ``serve``/``run_serving`` serve it
for the daemon commands' ``--http-port``, on ``web.server.BoundedServer``. ``Health`` probes
each server in the background (``Probe``: PostgreSQL, Kafka, Redis; every ``PROBE_INTERVAL``
within ``PROBE_TIMEOUT``), so ``/readyz`` answers at once: docs/operations.md, "Metrics and
health".
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client import make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ..errors import ConfigError
from ..metrics import Reads, process_registry, series_of
from .server import BoundedServer

log = logging.getLogger(__name__)

PROBE_TIMEOUT = 2.0  # s: a server that does not answer a probe within this is not ready
PROBE_INTERVAL = 0.5
QUICK_PATHS = ("/healthz", "/readyz", "/metrics")  # never queued behind the dashboard's pages


# -- probes -------------------------------------------------------------------------------------

class Probe:
    """Checks one server; ``check()`` raises when it does not answer."""

    name = "server"

    def check(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class PostgresProbe(Probe):
    name = "postgresql"

    def __init__(self, dsn: str):
        self.dsn = dsn
        self.conn: Any = None

    def check(self) -> None:
        import psycopg

        try:
            if self.conn is None or self.conn.closed:
                timeout = int(PROBE_TIMEOUT * 1000)
                self.conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=max(2, int(PROBE_TIMEOUT)),
                                            application_name="pyscheduler-readyz",
                                            options=f"-c statement_timeout={timeout}",
                                            keepalives=1, keepalives_idle=2, keepalives_interval=1,
                                            keepalives_count=2, tcp_user_timeout=timeout)
            self.conn.execute("SELECT 1")
        except Exception:
            self.close()
            raise

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:  # noqa: BLE001 - closing a broken client: nothing left to do
                pass
            self.conn = None


class KafkaProbe(Probe):
    name = "kafka"

    def __init__(self, bootstrap: str, settings: dict[str, str] | None = None):
        self.config = {"bootstrap.servers": bootstrap, **(settings or {}), "log_level": 0,
                       "reconnect.backoff.max.ms": 500, "socket.connection.setup.timeout.ms": 2000}
        self.admin: Any = None

    def check(self) -> None:
        from confluent_kafka.admin import AdminClient

        if self.admin is None:
            self.admin = AdminClient(self.config)
        try:
            self.admin.list_topics(timeout=PROBE_TIMEOUT)
        except Exception:
            self.admin = None  # a fresh client next time: no reconnect backoff to wait out
            raise


class RedisProbe(Probe):
    name = "redis"

    def __init__(self, url: str):
        self.url = url
        self.client: Any = None

    def check(self) -> None:
        from ..redisconn import CLUSTER_CLIENTS, connect  # redis:// and redis+cluster:// alike

        if self.client is None:
            self.client = connect(self.url, timeout=PROBE_TIMEOUT)
        try:
            if isinstance(self.client, CLUSTER_CLIENTS):
                self.client.ping(target_nodes="primaries")  # every master: each serves shards of the index
            else:
                self.client.ping()
        except Exception:
            self.close()
            raise

    def close(self) -> None:
        if self.client is not None:
            try:
                self.client.close()
            except Exception:  # noqa: BLE001 - closing a broken client: nothing left to do
                pass
            self.client = None


def probes_for(dsn: str | None = None, kafka_bootstrap: str | None = None, kafka_settings: dict | None = None,
               redis_url: str | None = None) -> list[Probe]:
    """A probe for each server the process uses."""
    out: list[Probe] = []
    if dsn:
        out.append(PostgresProbe(dsn))
    if kafka_bootstrap:
        out.append(KafkaProbe(kafka_bootstrap, kafka_settings))
    if redis_url:
        out.append(RedisProbe(redis_url))
    return out


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


# -- health ---------------------------------------------------------------------------------------

@dataclass
class _Result:
    ok: bool = False
    error: str | None = "not probed yet"
    started: float | None = None  # monotonic start of the probe in flight


class Health(Collector):
    """Readiness of a process: its daemons (told by run_daemons) and its servers (probed)."""

    def __init__(self, probes: Iterable[Probe] = (), interval: float = PROBE_INTERVAL):
        self.probes = list(probes)
        self.interval = interval
        self.results = {p.name: _Result() for p in self.probes}
        self.daemons: dict[str, str | None] = {}  # name -> None while running, else why not
        self.running_now: dict[str, Any] = {}  # name -> the instance running (asked for degraded_reason())
        self.crashes: dict[str, int] = {}
        self.labels: dict[str, str] = {}  # name -> its /metrics label (the same in every process)
        self.probed = threading.Condition()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # daemons (run_daemons calls these)
    def expect(self, name: str, label: str | None = None) -> None:
        """``label``: the daemon's ``daemon`` label in /metrics (its ``label``: no random part,
        so a series lives across restarts; default its name)."""
        self.daemons.setdefault(name, "starting")
        self.labels.setdefault(name, label or name)

    def running(self, name: str, daemon: Any = None) -> None:
        self.daemons[name] = None
        self.running_now[name] = daemon

    def _state(self, name: str, why: str | None) -> str | None:
        """None when the daemon runs and does all of its job; else what is wrong."""
        if why is not None:
            return why
        degraded = getattr(self.running_now.get(name), "degraded_reason", None)
        reason = degraded() if degraded is not None else None
        return None if reason is None else f"degraded: {reason}"

    def down(self, name: str, why: str, crashed: bool = True) -> None:
        self.daemons[name] = why
        if crashed:
            self.crashes[name] = self.crashes.get(name, 0) + 1

    # servers
    def start(self) -> "Health":
        for probe in self.probes:
            t = threading.Thread(target=self._loop, args=(probe,), name=f"readyz-{probe.name}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def _loop(self, probe: Probe) -> None:
        result = self.results[probe.name]
        while not self._stop.is_set():
            result.started = time.monotonic()
            try:
                probe.check()
                ok, error = True, None
            except Exception as exc:  # noqa: BLE001 - any failure is "does not answer"
                ok, error = False, _reason(exc)
            with self.probed:
                if ok and not result.ok:
                    log.debug("readyz: %s answers", probe.name)
                result.ok, result.error, result.started = ok, error, None
                self.probed.notify_all()
            self._stop.wait(self.interval)
        probe.close()

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(PROBE_TIMEOUT + 1)

    def servers(self) -> dict[str, str | None]:
        """Server -> None when it answers, else why not."""
        now = time.monotonic()
        out: dict[str, str | None] = {}
        for name, r in self.results.items():
            if r.started is not None and now - r.started > PROBE_TIMEOUT + 0.5:
                out[name] = f"no answer for {now - r.started:.1f}s"
            else:
                out[name] = None if r.ok else r.error
        return out

    def report(self) -> tuple[bool, dict[str, Any]]:
        servers = self.servers()
        daemons = {k: self._state(k, v) for k, v in list(self.daemons.items())}
        ready = all(v is None for v in servers.values()) and all(v is None for v in daemons.values())
        body: dict[str, Any] = {
            "ready": ready,
            "daemons": {k: "running" if v is None else v for k, v in daemons.items()},
            "servers": {k: "ok" if v is None else v for k, v in servers.items()},
        }
        if not ready:
            body["not_ready"] = sorted([f"daemon {k}" for k, v in daemons.items() if v is not None] +
                                       [k for k, v in servers.items() if v is not None])
        return ready, body

    # Prometheus
    def collect(self):
        ready, _ = self.report()
        yield GaugeMetricFamily("pyscheduler_ready", "1 when /readyz answers 200", value=int(ready))
        up = GaugeMetricFamily("pyscheduler_server_up", "1 while the server answers the readiness probe",
                               labels=["server"])
        for name, why in self.servers().items():
            up.add_metric([name], int(why is None))
        yield up
        running = GaugeMetricFamily("pyscheduler_daemon_running", "Daemons of the kind running (0: crashed, "
                                                                  "waiting to restart)", labels=["daemon"])
        crashes = CounterMetricFamily("pyscheduler_daemon_crashes", "Crashes of the daemons of the kind (each "
                                                                    "restarted after a backoff)", labels=["daemon"])
        up: dict[str, int] = {}
        crashed: dict[str, int] = {}
        for name, why in list(self.daemons.items()):
            label = self.labels.get(name, name)
            up[label] = up.get(label, 0) + int(why is None)
            crashed[label] = crashed.get(label, 0) + self.crashes.get(name, 0)
        for label in sorted(up):
            running.add_metric([label], up[label])
            crashes.add_metric([label], crashed[label])
        yield running
        yield crashes


# -- the server -----------------------------------------------------------------------------------

def _json(start_response: Callable, status: str, body: dict[str, Any]) -> list[bytes]:
    data = json.dumps(body, indent=2).encode() + b"\n"
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data))),
                            ("Cache-Control", "no-store")])
    return [data]


class Endpoint:
    """The WSGI application and the thread that serves it."""

    def __init__(self, registry: Any, health: Health, app: Callable | None = None, reads: Iterable[Reads] = ()):
        self.registry, self.health, self.app = registry, health, app
        self.reads = list(reads)  # closed with the endpoint
        self.metrics = make_wsgi_app(registry)
        self.server: BoundedServer | None = None

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if path == "/metrics":
            return self.metrics(environ, start_response)
        if path == "/healthz":
            return _json(start_response, "200 OK", {"alive": True})
        if path == "/readyz":
            ready, body = self.health.report()
            return _json(start_response, "200 OK" if ready else "503 Service Unavailable", body)
        if self.app is not None:
            return self.app(environ, start_response)
        return _json(start_response, "404 Not Found", {"error": f"no page {path}",
                                                       "pages": ["/metrics", "/healthz", "/readyz"]})

    def serve(self, host: str, port: int) -> "Endpoint":
        try:
            self.server = BoundedServer(host, port, self, quick_paths=QUICK_PATHS).start()
        except OSError as exc:  # socket.gaierror too
            raise ConfigError(f"cannot serve HTTP on {host}:{port}: {exc.strerror or exc}") from None
        return self

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.port

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        self.health.close()
        for r in self.reads:
            r.close()


def serve(host: str, port: int | None, daemons: Iterable[Any], *, dsn: str | None = None,
          kafka_bootstrap: str | None = None, kafka_settings: dict | None = None, redis_url: str | None = None,
          app: Callable | None = None, registry: Any = None,
          ready: Callable[[str, int], None] | None = None) -> Endpoint | None:
    """Serve the process's endpoint on ``host:port`` (None: serve nothing). ``daemons`` are those
    the process runs (their series are exported, added to ``registry`` when given); the servers
    named are probed for /readyz; ``ready(host, port)`` is called once it listens (the
    dashboard's ``announce``)."""
    if port is None:
        return None
    from prometheus_client import disable_created_metrics

    disable_created_metrics()  # no <name>_created series beside every counter: this process's own output
    daemons = list(daemons)
    health = Health(probes_for(dsn, kafka_bootstrap, kafka_settings, redis_url))
    for d in daemons:
        health.expect(d.name, getattr(d, "label", None))
    if app is not None and hasattr(app, "health"):
        app.health = health.report  # the dashboard shows what /readyz knows on every page
    reads = [c for c in series_of(daemons) if isinstance(c, Reads)]
    endpoint = Endpoint(process_registry(daemons, health, registry=registry), health, app, reads).serve(host, port)
    health.start()
    shown = f"[{host}]" if ":" in host else host
    log.info("HTTP on http://%s:%d/ (/metrics, /healthz, /readyz)", shown, endpoint.port)
    if ready is not None:
        ready(host, endpoint.port)
    return endpoint


def run_serving(daemons: Iterable[Any], stop: threading.Event, host: str, port: int | None,
                **servers: Any) -> int:
    """``run_daemons(daemons, stop)`` with the process's HTTP endpoint served meanwhile (when
    ``port`` is not None); its exit code. ``servers``: as for ``serve``."""
    from ..daemon import run_daemons

    daemons = list(daemons)
    endpoint = serve(host, port, daemons, **servers)
    try:
        return run_daemons(daemons, stop, health=endpoint.health if endpoint else None)
    finally:
        if endpoint is not None:
            endpoint.close()
