"""The HTTP endpoint of every daemon process: /readyz follows the servers
under ``pyscheduler run``; each process exports only the series of what it runs; the Worker,
the tasks monitor and the checks runner count into their registries."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from pyscheduler import embedded, migrate
from pyscheduler.checks.runner import OUTCOMES, CheckRunner
from pyscheduler.db import Jsonb
from pyscheduler.tasks import Abort, Worker
from pyscheduler.web.endpoint import Endpoint, Health
from pyscheduler.web.server import MAX_CONNECTIONS, MAX_HEAD, WORKERS, BoundedServer
from tests.support import wait_for
from tests.support.ops import Process, get, samples


@pytest.fixture
def servers():
    """Private PostgreSQL, broker and Redis: this test stops and starts them. Not under pytest's
    base temp (see conftest.pg: as root, PostgreSQL runs as another user, and a pytest session
    starting elsewhere on the machine makes that directory private)."""
    workdir = Path(tempfile.mkdtemp(prefix="pyscheduler-test-readyz-"))
    started = []
    try:
        for cls in (embedded.Postgres, embedded.Kafka, embedded.Redis):
            started.append(cls(workdir / cls.name).start())
        yield started
    finally:
        for server in reversed(started):
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.mark.slow
def test_readyz_turns_503_within_5s_of_each_server_stopping_and_200_after(servers, tmp_path):
    pg, kafka, rds = servers
    migrate.migrate(pg.dsn())
    run = Process(tmp_path / "run.log", "run", "--no-migrate", "--dsn", pg.dsn(), "--bootstrap-servers",
                  kafka.bootstrap, "--redis-url", rds.url)
    try:
        def ready(want: int, naming: str | None = None):
            def check():
                assert run.proc.poll() is None, run.text()[-3000:]
                status, body = run.get("/readyz")
                found = json.loads(body) if status == want else None
                return found if found and (naming is None or naming in found["not_ready"]) else None
            return check

        body = wait_for(ready(200), timeout=60, interval=0.1)
        assert set(body["servers"]) == {"postgresql", "kafka", "redis"}
        assert any(name.startswith("checks-runner") for name in body["daemons"])
        assert run.get("/healthz")[0] == 200
        status, page = run.get("/")  # the dashboard, at / of the same endpoint
        assert status == 200 and "<html" in page.lower(), page[:500]
        for server, name in ((kafka, "kafka"), (rds, "redis"), (pg, "postgresql")):
            server.stop()
            stopped = time.monotonic()
            body = wait_for(ready(503, naming=name), timeout=10, interval=0.1)
            took = time.monotonic() - stopped
            assert took < 5, f"{name}: 503 after {took:.1f}s"
            # the server, and only an executor running degraded without Redis beside it
            assert [x for x in body["not_ready"] if not x.startswith("daemon ")] == [name], body
            assert all(body["daemons"][x.removeprefix("daemon ")].startswith("degraded") and name == "redis"
                       for x in body["not_ready"] if x.startswith("daemon ")), body
            assert run.get("/healthz")[0] == 200  # alive all the same
            server.start()  # same port and data directory
            if server is kafka:  # tansu keeps topics in memory
                embedded.create_topics(kafka.bootstrap, ["pyscheduler.delay.input", "pyscheduler.delay.output"])
            wait_for(ready(200), timeout=30, interval=0.1)
            print(f"{name}: 503 {took:.1f}s after it stopped")
        series = samples(run.get("/metrics")[1])
        assert series['pyscheduler_server_up{server="postgresql"}'] == 1 and series["pyscheduler_ready"] == 1
        # every capability's series, as this process runs all of them
        for prefix in ("pyscheduler_delay_", "pyscheduler_tasks_", "pyscheduler_schedules_", "pyscheduler_checks_"):
            assert any(k.startswith(prefix) for k in series), prefix
    finally:
        code = run.stop()
    assert code == 0, run.text()[-3000:]


@pytest.mark.slow
def test_each_process_exports_the_series_of_what_it_runs_only(dsn, kafka, redis_url, topic, tmp_path):
    topics = [topic("in"), topic("out")]
    procs = {
        "delay": Process(tmp_path / "delay.log", "delay", "run", "--dsn", dsn, "--bootstrap-servers", kafka,
                         "--input-topic", topics[0], "--output-topic", topics[1], "--group-id", topics[0]),
        "schedules": Process(tmp_path / "schedules.log", "schedules", "run", "--dsn", dsn, "--redis-url", redis_url,
                             "--prefix", f"t:{topics[0]}"),
        "tasks": Process(tmp_path / "tasks.log", "tasks", "monitor", "--dsn", dsn),
        "checks": Process(tmp_path / "checks.log", "checks", "run", "--dsn", dsn),
        "worker": Process(tmp_path / "worker.log", "tasks", "work", "--dsn", dsn, "--queue", "ops"),
    }
    own = {"delay": "pyscheduler_delay_", "schedules": "pyscheduler_schedules_", "tasks": "pyscheduler_tasks_",
           "checks": "pyscheduler_checks_", "worker": "pyscheduler_worker_"}
    try:
        for name, proc in procs.items():
            wait_for(lambda: proc.get("/readyz")[0] == 200, timeout=60, interval=0.1)
            names = {k.split("{")[0] for k in samples(proc.get("/metrics")[1])}
            mine = {n for n in names if n.startswith(own[name])}
            others = {n for n in names if n.startswith(tuple(v for k, v in own.items() if k != name))}
            assert mine and not others, (name, sorted(others))
            assert {"pyscheduler_ready", "process_cpu_seconds_total"} <= names
        assert "pyscheduler_delay_dropped_total" in samples(procs["delay"].get("/metrics")[1])
        assert "pyscheduler_schedules_degraded" in samples(procs["schedules"].get("/metrics")[1])
    finally:
        codes = {name: proc.stop() for name, proc in procs.items()}
    assert set(codes.values()) == {0}, {n: procs[n].text()[-2000:] for n, c in codes.items() if c}


@pytest.mark.slow
def test_worker_counts_leases_outcomes_and_latencies_into_its_registry(dsn, db):
    for i in range(20):
        db.call("submit_task", queue="m", spec=Jsonb({"i": i}))
    db.call("submit_task", queue="m", spec=Jsonb({"fail": True}), max_attempts=5)
    db.call("submit_task", queue="m", spec=Jsonb({"abort": True}))

    def handle(ctx):
        if ctx.spec.get("fail"):
            raise RuntimeError("boom")
        if ctx.spec.get("abort"):
            raise Abort("nope")

    registry = CollectorRegistry()
    worker = Worker(dsn, "m", handle, capacity=2, registry=registry)
    running = worker.start()
    try:
        wait_for(lambda: worker.completed == 20 and worker.failed == 1 and db.query(
            "SELECT count(*) AS n FROM pyscheduler.tasks WHERE status = 'aborted'")[0]["n"] == 1, timeout=30)
    finally:
        running.stop()
    got = samples(generate_latest(registry).decode())
    q = '{queue="m"}'
    assert got["pyscheduler_worker_leased_total" + q] >= 22
    assert got["pyscheduler_worker_completed_total" + q] == 20
    assert got["pyscheduler_worker_failed_total" + q] == 1
    assert got["pyscheduler_worker_aborted_total" + q] == 1
    assert got["pyscheduler_worker_handler_seconds_count" + q] >= 22
    assert got["pyscheduler_worker_lease_seconds_count" + q] >= 1
    # a second worker on the same registry shares the series (no duplicate registration)
    Worker(dsn, "n", handle, registry=registry)


@pytest.mark.slow
def test_a_changed_check_resolution_takes_effect_at_the_runners_next_wake_up(db, dsn):
    db.call("set_check_settings", resolution=timedelta(hours=1))
    runner = CheckRunner(dsn, {"note": lambda check: None})
    before = OUTCOMES.labels("note", "done")._value.get()
    stop = threading.Event()
    thread = threading.Thread(target=runner.run, args=(stop,), daemon=True)
    thread.start()
    try:
        assert runner.slots_done.wait(30)  # started: it sleeps toward the next hourly slot
        runner.slots_done.clear()
        db.call("set_check_settings", resolution=timedelta(seconds=1))
        db.call("add_check", entity_name="order", entity_key="1", job="note", kind="python",
                check_after=timedelta(seconds=1))
        changed = time.monotonic()
        wait_for(lambda: db.query("SELECT count(*) AS n FROM pyscheduler.check_history")[0]["n"] == 1, timeout=15)
        assert time.monotonic() - changed < 6  # not at the old slot's end, up to an hour later
    finally:
        stop.set()
        thread.join(15)
    assert OUTCOMES.labels("note", "done")._value.get() == before + 1


def _threads_and_files(pid: int) -> tuple[int, int]:
    threads = int(re.search(r"Threads:\s+(\d+)", Path(f"/proc/{pid}/status").read_text()).group(1))
    return threads, len(os.listdir(f"/proc/{pid}/fd"))


def _answer(sock: socket.socket) -> bytes:
    """All a server sends on ``sock`` until it closes it."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


@pytest.mark.slow
def test_idle_connections_under_a_low_descriptor_limit_leave_every_path_answering(dsn, tmp_path):
    """Issue 32, item 1: ``checks run`` with 256 descriptors at most, and twice as many idle
    connections to its endpoint: it keeps no thread per connection and at most
    MAX_CONNECTIONS of them open (the oldest idle ones are closed), so /healthz and /readyz
    answer at once; a head of 98 headers of 60 KB is refused (431). With a thread per
    connection the process ran out of descriptors and /healthz timed out."""
    limit = 256
    proc = Process(tmp_path / "checks.log", "checks", "run", "--dsn", dsn, max_files=limit)
    host, port = urllib.parse.urlsplit(proc.url).hostname, urllib.parse.urlsplit(proc.url).port
    idle: list[socket.socket] = []
    try:
        wait_for(lambda: proc.get("/readyz")[0] == 200, timeout=60, interval=0.1)
        threads, files = _threads_and_files(proc.proc.pid)
        for _ in range(2 * limit):
            try:
                idle.append(socket.create_connection((host, port), timeout=2))
            except OSError:  # a server out of descriptors accepts nothing more
                break
        started = time.monotonic()
        assert get(proc.url + "/healthz", timeout=3)[0] == 200
        assert get(proc.url + "/readyz", timeout=3)[0] == 200
        took = time.monotonic() - started
        after_threads, after_files = _threads_and_files(proc.proc.pid)
        print(f"{len(idle)} idle connections: /healthz and /readyz in {took * 1000:.0f} ms; threads "
              f"{threads} -> {after_threads}, descriptors {files} -> {after_files}")
        assert len(idle) == 2 * limit and took < 2
        assert after_threads <= threads + 1  # the probe threads may reconnect; no thread per connection
        assert after_files <= files + MAX_CONNECTIONS + 2
        with socket.create_connection((host, port), timeout=10) as big:
            big.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"".join(
                b"X-H%d: %s\r\n" % (i, b"a" * 60_000) for i in range(98)) + b"\r\n")
            assert _answer(big).startswith(b"HTTP/1.0 431 ")
        assert proc.proc.poll() is None
    finally:
        for sock in idle:
            sock.close()
        code = proc.stop()
    assert code == 0, proc.text()[-3000:]


def _hello(environ, start_response):
    body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0)) or b"hello"
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


def test_a_request_must_arrive_whole_within_the_read_timeout_however_slowly_it_trickles():
    server = BoundedServer("127.0.0.1", 0, _hello, read_timeout=1.0).start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as slow:
            started = time.monotonic()
            for byte in b"GET / HTTP/1.1\r\nHost: x\r\n":  # a byte every 0.1 s: slower than the timeout
                try:
                    slow.send(bytes([byte]))
                except OSError:
                    break
                time.sleep(0.1)
            assert _answer(slow).startswith(b"HTTP/1.0 408 ")
            assert 1.0 <= time.monotonic() - started < 3.5
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as ok:
            ok.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nbody")
            answer = _answer(ok)
            assert answer.startswith(b"HTTP/1.0 200 ") and answer.endswith(b"\r\n\r\nbody")
        for head, status in ((b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n", b"414"),
                             (b"GET / HTTP/1.1\r\nX: " + b"a" * MAX_HEAD + b"\r\n\r\n", b"431"),
                             (b"POST / HTTP/1.1\r\nContent-Length: 1000000\r\n\r\n", b"413"),
                             (b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * 101 + b"\r\n", b"431")):
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as c:
                c.sendall(head)
                assert _answer(c).startswith(b"HTTP/1.0 " + status), status
    finally:
        server.close()


def test_health_paths_answer_while_every_worker_is_busy_with_a_slow_page():
    """The dashboard's pages run on the endpoint's workers; /healthz, /readyz and /metrics
    have a thread of their own, so pages stuck on a database never fail a liveness probe."""
    release = threading.Event()

    def slow_page(environ, start_response):
        release.wait(30)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"page"]

    endpoint = Endpoint(CollectorRegistry(), Health(), slow_page).serve("127.0.0.1", 0)
    base = f"http://127.0.0.1:{endpoint.port}"
    pages = [threading.Thread(target=get, args=(base + "/",), kwargs={"timeout": 30}) for _ in range(WORKERS + 2)]
    try:
        for page in pages:
            page.start()
        # every worker holds a page and two more wait for one
        wait_for(lambda: endpoint.server._answering == WORKERS + 2, timeout=10, interval=0.01)
        for path in ("/healthz", "/readyz", "/metrics"):
            started = time.monotonic()
            assert get(base + path, timeout=2)[0] == 200, path
            assert time.monotonic() - started < 1, path
    finally:
        release.set()
        for page in pages:
            page.join(30)
        endpoint.close()


def _daemons(dsn: str, kafka: str, redis_url: str, out_topic: str) -> list:
    """One daemon of each capability, new instances (a restarted process: new relay node and
    executor owner ids)."""
    from pyscheduler.delay.relay import Relay, RelayConfig
    from pyscheduler.schedules.executor import Executor, ExecutorConfig
    from pyscheduler.tasks.monitor import Monitor

    return [Monitor(dsn), CheckRunner(dsn), Executor(ExecutorConfig(dsn=dsn, redis_url=redis_url)),
            Relay(RelayConfig(dsn=dsn, bootstrap_servers=kafka, input_topic="in", output_topic=out_topic))]


def test_metrics_operators_alert_on_with_labels_stable_across_restarts(dsn, conn, kafka, redis_url):
    """/metrics of a process serving each capability's daemon: per-queue ready, running and oldest
    ready age; the delay queue's waiting and overdue by output topic; schedules late; checks
    overdue, each read at the scrape; the daemon label has no per-instance id."""
    from pyscheduler.web.endpoint import serve
    from tests.support.dashboard import populate

    populate(conn)  # emails: 1 ready, 1 running; delay: 3 waiting, 1 of them overdue; 1 check overdue
    conn.execute("UPDATE pyscheduler.tasks SET updated = now() - interval '90 seconds' WHERE queue = 'emails' "
                 "AND status = 'ready'")
    conn.execute("UPDATE pyscheduler.schedules SET trigger_at = NULL, next_run_at = CASE WHEN name IN "
                 "('cleanup', 'billing-report') THEN now() - interval '1 minute' ELSE now() + interval '1 hour' END")
    scraped = []
    for _ in range(2):  # the process, then the same process restarted
        endpoint = serve("127.0.0.1", 0, _daemons(dsn, kafka, redis_url, "orders.out"), dsn=dsn)
        try:
            scraped.append(samples(get(f"http://127.0.0.1:{endpoint.port}/metrics")[1]))
        finally:
            endpoint.close()
    first, again = scraped
    assert first['pyscheduler_queue_ready{queue="emails"}'] == 1
    assert first['pyscheduler_queue_running{queue="emails"}'] == 1
    assert 90 <= first['pyscheduler_queue_oldest_ready_age_seconds{queue="emails"}'] < 120
    assert first['pyscheduler_queue_oldest_ready_age_seconds{queue="reports"}'] == 0  # none ready (1 delayed)
    assert first['pyscheduler_delay_waiting{topic="orders.out"}'] == 3
    assert first['pyscheduler_delay_overdue{topic="orders.out"}'] == 1
    assert first["pyscheduler_schedules_late"] == 2
    assert first["pyscheduler_checks_overdue"] == 1
    daemons = sorted(k for k in first if k.startswith("pyscheduler_daemon_running"))
    assert daemons == sorted(k for k in again if k.startswith("pyscheduler_daemon_running"))
    assert daemons == ['pyscheduler_daemon_running{daemon="checks-runner-0of1"}',
                       'pyscheduler_daemon_running{daemon="delay-relay"}',
                       'pyscheduler_daemon_running{daemon="schedules-executor"}',
                       'pyscheduler_daemon_running{daemon="tasks-monitor"}'], daemons


def test_failure_counters_have_the_labels_of_their_success_counters():
    from pyscheduler.delay import relay
    from pyscheduler.schedules import series
    from pyscheduler.tasks.worker import counted

    pairs = [(series.FIRED, series.FAILED), (counted.COMPLETED, counted.FAILED), (counted.COMPLETED, counted.ABORTED),
             (relay.FIRED, relay.DEAD_LETTERED), (relay.FIRED, relay.DROPPED)]
    for ok, failed in pairs:
        assert ok._labelnames == failed._labelnames, (ok._name, failed._name)
