"""The one outage rule (docs/operations.md, "Outages"): every daemon
``pyscheduler run`` builds (delay relay, tasks monitor, schedules relay, executor and
cleanup, checks runner), with a server it uses down when it starts, lost while it runs and
back, lives (no crash, no restart), says on /readyz which server is down (and that the
executor runs degraded), and does its job once the server answers; the critical schedules
fire from PostgreSQL while Redis (a single node or a Redis Cluster) is down.

One test per server. Each runs the daemons as ``pyscheduler run`` does: each capability's
``daemons(ctx)``, under ``run_daemons`` with the process's HTTP endpoint (``serve``), here
in this process. The server that goes away is a private one whose port is chosen first and
which starts only later (nothing listens there before); the other servers are the
session's. The daemons' logs are captured: none crashed or restarted, and no password of
a DSN or URL shows (one masking helper, pyscheduler/masking.py).

A defect's reproduction (``schedules run`` with a Redis Cluster down at
start crash-looped and never fired a critical schedule) runs the command itself."""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from psycopg.conninfo import make_conninfo

from tests.support import wait_for
from tests.support.delay import GROUP_SETTINGS, Output, Sender
from pyscheduler import embedded, migrate
from pyscheduler.cli import CAPABILITIES, capability
from pyscheduler.daemon import RunContext, run_daemons
from pyscheduler.db import Database
from pyscheduler.web.endpoint import serve
from tests.support.schedules import create
from tests.support.ops import WALK_JOB, Process, get

pytestmark = pytest.mark.slow  # every test here: daemons, processes or servers of its own, on the real clock

SECRET = "S3cretPassw0rd"
BOUND = 30  # s: the longest a daemon may take to do its job again once its server answers


def readyz(url: str) -> tuple[int, dict]:
    status, text = get(url)
    return status, json.loads(text)


class Run:
    """The daemons ``pyscheduler run`` builds for these servers, run as it runs them (run_daemons
    and the HTTP endpoint), in this process; ``close()`` stops them: run_daemons' exit code."""

    def __init__(self, dsn: str, kafka: str | None = None, redis_url: str | None = None):
        ctx = RunContext(dsn=dsn, kafka_bootstrap=kafka, redis_url=redis_url, kafka_settings=dict(GROUP_SETTINGS))
        self.daemons = [d for name in CAPABILITIES for d in capability(name).daemons(ctx)]
        self.stop = threading.Event()
        self.endpoint = serve("127.0.0.1", 0, self.daemons, dsn=dsn, kafka_bootstrap=kafka,
                              kafka_settings=ctx.kafka_settings, redis_url=redis_url, registry=CollectorRegistry())
        self.url = f"http://127.0.0.1:{self.endpoint.port}/readyz"
        self.code: int | None = None
        self.thread = threading.Thread(target=self._run, name="run_daemons")
        self.thread.start()

    def _run(self) -> None:
        self.code = run_daemons(self.daemons, self.stop, health=self.endpoint.health)

    def executor(self):
        return next(d for d in self.daemons if d.name.startswith("schedules-executor"))

    def readyz(self) -> dict:
        status, body = readyz(self.url)
        assert (status == 200) == body["ready"], (status, body)
        assert SECRET not in json.dumps(body)
        return body

    def alive(self) -> dict:
        """/readyz's body, asserting every daemon runs (none crashed, none waiting to restart)."""
        body = self.readyz()
        assert self.thread.is_alive() and self.endpoint.health.crashes == {}, body
        assert all(v == "running" or v.startswith("degraded") for v in body["daemons"].values()), body
        return body

    def down(self, server: str) -> dict:
        """Until /readyz says ``server`` is down (503, named in not_ready); every daemon alive."""
        def named():
            b = self.readyz()
            return b if b["servers"][server] != "ok" and "starting" not in b["daemons"].values() else None
        body = wait_for(named, 15, f"/readyz to name {server}")
        assert not body["ready"] and server in body["not_ready"], body
        return self.alive()

    def up(self, server: str) -> None:
        wait_for(lambda: self.readyz()["servers"][server] == "ok", 30, f"/readyz to see {server} again")

    def close(self) -> int | None:
        self.stop.set()
        self.thread.join(60)
        self.endpoint.close()
        assert not self.thread.is_alive(), "run_daemons did not stop"
        return self.code


@pytest.fixture
def fast(monkeypatch) -> str:
    """Fast settings for the daemons ``pyscheduler run`` builds (its variables), topics and keys
    of this test's own; the delay relay's topics (input, output)."""
    tag = uuid.uuid4().hex[:8]
    for name, value in {
        "SCHEDULES_POLL_MS": "50", "SCHEDULES_STUCK_AFTER_MS": "3000", "SCHEDULES_CHECK_EVERY_MS": "500",
        "SCHEDULES_FIRE_TIMEOUT_MS": "2000", "SCHEDULES_PREFIX": f"outage:{tag}", "CHECKS_TIMEOUT": "5s",
        "DELAY_HOLD_MS": "1500", "DELAY_POLL_MS": "50", "DELAY_DETECT_MS": "100",
        "DELAY_INPUT_TOPIC": f"in-{tag}", "DELAY_OUTPUT_TOPIC": f"out-{tag}", "DELAY_GROUP_ID": f"g-{tag}",
    }.items():
        monkeypatch.setenv(f"PYSCHEDULER_{name}", value)
    return tag


@pytest.fixture
def logs(caplog):
    """Every log record of the test; at the end: no daemon crashed or restarted, no password shown."""
    caplog.set_level(logging.INFO)
    yield caplog
    text = "\n".join(f"{r.name}: {r.getMessage()}" for r in caplog.records)
    assert SECRET not in text
    bad = [line for line in text.splitlines() if " crashed" in line or "restarting" in line]
    assert bad == [], "\n".join(bad)


def with_password(dsn: str) -> str:
    """The DSN with a password (the embedded server trusts loopback: it is never asked for)."""
    return make_conninfo(dsn, password=SECRET)


# -- the work each daemon does -------------------------------------------------------------------

class Work:
    """Work for every daemon in one database: schedules every 0.5 s (a critical and a plain one
    with task targets; a Kafka one when ``topic``), a future check every second, and on demand a
    leased task whose lease expires (the monitor's) and a delayed message (the relay's)."""

    def __init__(self, dsn: str, topic: str | None = None):
        self.dsn = dsn
        self.names = ["o-critical", "o-plain"] + (["o-kafka"] if topic else [])
        with Database(dsn, max_size=1) as db:
            create(db, "o-critical", every=0.5, soon=True, target_kind="task", target="o-q", critical=True)
            create(db, "o-plain", every=0.5, soon=True, target_kind="task", target="o-q")
            if topic:
                create(db, "o-kafka", every=0.5, soon=True, target_kind="kafka", target=topic)
            with db.connection() as c:
                c.execute(WALK_JOB)
            db.call("set_check_settings", resolution=timedelta(seconds=1))
            db.call("add_check", entity_name="outage", entity_key="1", job="public.walk_job",
                    check_after=timedelta(seconds=1), max_checks=1_000_000, horizon=timedelta(days=1))

    def _query(self, sql: str, params=None):
        try:
            with psycopg.connect(self.dsn, connect_timeout=2, autocommit=True) as c:
                return c.execute(sql, params).fetchall()
        except psycopg.OperationalError:
            return None

    def fired(self) -> dict[str, int] | None:
        """Fired executions per schedule and the check's runs; None while PostgreSQL is away."""
        rows = self._query("SELECT s.name, count(e.*) FILTER (WHERE e.outcome = 'fired') FROM pyscheduler.schedules s "
                           "LEFT JOIN pyscheduler.schedule_executions e ON e.schedule_id = s.id GROUP BY s.name "
                           "UNION ALL SELECT 'check', count(*) FROM public.walk_runs")
        return None if rows is None else dict(rows)

    def advanced(self, before: dict[str, int], names: list[str], by: int = 2) -> dict[str, int] | None:
        now = self.fired()
        return now if now and all(now[n] >= before.get(n, 0) + by for n in names) else None

    def now(self) -> dict[str, int]:
        return wait_for(self.fired, BOUND, "PostgreSQL")

    def wait_fired(self, names: list[str], what: str, by: int = 2, since: dict[str, int] | None = None
                   ) -> dict[str, int]:
        """Until each of ``names`` fired ``by`` more times than ``since`` (default: now, once
        PostgreSQL answers)."""
        before = since or self.now()
        return wait_for(lambda: self.advanced(before, names, by), BOUND, f"{', '.join(names)} to fire {what}")

    def lease_expires(self, what: str) -> None:
        """A task leased for a second: the monitor makes it ready again once its lease expired."""
        with psycopg.connect(self.dsn, autocommit=True) as c:
            c.execute("SELECT pyscheduler.submit_task(queue => 'o-lease', spec => '{}')")
            task = c.execute("SELECT pyscheduler.lease_task(queue => 'o-lease', worker => 'gone', "
                             "timeout => '1 second')").fetchone()[0]
        wait_for(lambda: self._query("SELECT 1 FROM pyscheduler.tasks WHERE rn = %s AND status = 'ready'",
                                     (task["rn"],)), BOUND, f"the monitor to reset an expired lease {what}")


def topics(kafka: str) -> set[str]:
    from confluent_kafka.admin import AdminClient

    return set(AdminClient({"bootstrap.servers": kafka, "log_level": 0}).list_topics(timeout=5).topics)


def relayed(kafka: str, fast: str, what: str) -> None:
    """A message delayed by half a second goes through the delay relay (its topics exist)."""
    wait_for(lambda: {f"in-{fast}", f"out-{fast}"} <= topics(kafka), BOUND, f"the delay relay's topics {what}")
    output = Output(kafka, f"out-{fast}")
    try:
        value = uuid.uuid4().hex.encode()
        sender = Sender(kafka, f"in-{fast}")
        sender.send(value.decode(), datetime.now(timezone.utc) + timedelta(seconds=0.5), value=value)
        sender.flush()
        output.wait_values([value], BOUND)
    except TimeoutError as exc:
        raise AssertionError(f"{exc} (a delayed message {what})") from None
    finally:
        output.close()


# -- PostgreSQL ---------------------------------------------------------------------------------

@pytest.fixture
def private_pg():
    """A PostgreSQL of this test's own, migrated: (server, its DSN). Not under pytest's base temp
    (see conftest.pg: a server running as another system user could lose its directory)."""
    workdir = Path(tempfile.mkdtemp(prefix="pyscheduler-test-outage-pg-"))
    server = embedded.Postgres(workdir).start()
    try:
        migrate.migrate(server.dsn())
        yield server, server.dsn()
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def test_postgresql_down_at_start_lost_and_back(private_pg, kafka, redis_url, fast, logs):
    """Every daemon uses PostgreSQL: each does its job once it answers (the delay relay relays,
    the monitor resets an expired lease, the executor fires critical and plain schedules from
    the index the relay fills, the checks runner runs its check), and again after it restarted."""
    server, dsn = private_pg
    work = Work(dsn)
    server.stop()

    def jobs(what: str) -> None:
        before = work.now()
        relayed(kafka, fast, what)
        work.lease_expires(what)
        work.wait_fired(["o-critical", "o-plain", "check"], what, since=before)
        run.up("postgresql")

    run = Run(with_password(dsn), kafka, redis_url)
    try:
        run.down("postgresql")
        server.start()  # same port and data
        jobs("once PostgreSQL answers")
        server.stop()
        run.down("postgresql")
        server.start()
        jobs("after PostgreSQL came back")
        run.alive()
    finally:
        code = run.close()
    assert code == 0


def test_daemons_started_while_postgresql_is_down_stop_at_once(fast, logs, kafka, redis_url):
    """Nothing listens at the DSN: every daemon runs (waiting the outage out, not stuck opening its
    pool for 30 s and then crashing) and a stop ends them within seconds."""
    run = Run(with_password(f"postgresql://postgres@127.0.0.1:{embedded.free_port()}/app"), kafka, redis_url)
    try:
        run.down("postgresql")
    finally:
        started = time.monotonic()
        code = run.close()
    assert code == 0 and time.monotonic() - started < 10


# -- Kafka --------------------------------------------------------------------------------------

def test_kafka_down_at_start_lost_and_back(dsn, redis_url, fast, logs, tmp_path):
    """The delay relay waits for the broker, creates its topics (as ``pyscheduler run`` promises)
    and relays; the executor's Kafka schedule fires once the broker answers; the other daemons go
    on meanwhile. The embedded broker keeps topics in memory: after its restart the test creates
    them again, as they would still exist on a real Kafka."""
    broker = embedded.Kafka(tmp_path / "kafka")  # its port is chosen: nothing listens there yet
    topic = f"sched-{fast}"
    work = Work(dsn, topic)
    run = Run(with_password(dsn), broker.bootstrap, redis_url)
    try:
        run.down("kafka")
        work.wait_fired(["o-critical", "o-plain", "check"], "while Kafka is down", by=1)
        broker.start()
        embedded.create_topics(broker.bootstrap, [topic])  # the schedule's topic (the relay makes its own)
        before = work.now()
        relayed(broker.bootstrap, fast, "once Kafka answers")
        work.wait_fired(["o-kafka"], "once Kafka answers", since=before)
        broker.stop()
        run.down("kafka")
        broker.start()
        embedded.create_topics(broker.bootstrap, [topic, f"in-{fast}", f"out-{fast}"])
        before = work.now()
        relayed(broker.bootstrap, fast, "after Kafka came back")
        work.wait_fired(["o-kafka"], "after Kafka came back", since=before)
        run.up("kafka")
        run.alive()
    finally:
        code = run.close()
        broker.stop()
    assert code == 0


# -- Redis and Redis Cluster ---------------------------------------------------------------------

class SingleNode:
    """A Redis not started yet, on a port chosen now."""

    def __init__(self, workdir: Path):
        self.server = embedded.Redis(workdir)
        self.url = self.server.url

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        self.server.stop()


class OneNodeCluster:
    """A Redis Cluster of one master serving every slot, not started yet (its port is chosen);
    restarted with its cluster config (its slots) but without its data."""

    def __init__(self, workdir: Path):
        self.cluster = embedded.RedisCluster(workdir, masters=1, replicas=0)
        self.url = self.cluster.url
        self.made = False

    def start(self) -> None:
        if not self.made:
            self.cluster.start()
            self.made = True
        else:
            self.cluster.nodes[0].start()
            self.cluster.wait_ok(30)

    def stop(self) -> None:
        self.cluster.stop()


@pytest.mark.parametrize("kind", [SingleNode, OneNodeCluster], ids=["redis", "redis-cluster"])
def test_redis_down_at_start_lost_and_back(kind, dsn, fast, logs, tmp_path):
    """Redis down: the executor runs degraded (/readyz says so) and fires the critical schedules
    from PostgreSQL, the plain ones wait; Redis answers: the relay fills the index, the plain ones
    fire too; the same when Redis is lost while they run and comes back (without its data)."""
    redis = kind(tmp_path / "redis")
    work = Work(dsn)
    run = Run(with_password(dsn), redis_url=redis.url)
    try:
        run.down("redis")
        ex = run.executor()
        wait_for(lambda: run.readyz()["daemons"][ex.name].startswith("degraded"), 15,
                 "/readyz to say the executor runs degraded")
        before = work.wait_fired(["o-critical"], "in degraded mode")
        assert before["o-plain"] == 0, before
        redis.start()
        run.up("redis")
        wait_for(lambda: run.readyz()["daemons"][ex.name] == "running", 15, "the executor to leave degraded mode")
        work.wait_fired(["o-critical", "o-plain"], "once Redis answers")
        redis.stop()
        run.down("redis")
        wait_for(lambda: run.readyz()["daemons"][ex.name].startswith("degraded"), 15,
                 "/readyz to say the executor runs degraded again")
        work.wait_fired(["o-critical"], "in degraded mode again")
        redis.start()
        run.up("redis")
        work.wait_fired(["o-critical", "o-plain"], "after Redis came back")
        run.alive()
    finally:
        code = run.close()
        redis.stop()
    assert code == 0


# -- the commands -----------------------------------------------------------------------------------

def test_schedules_run_with_a_redis_cluster_down_at_start_fires_critical_schedules(dsn, db, tmp_path):
    """Issue 27, defect 1: ``pyscheduler schedules run --redis-url redis+cluster://...`` with
    nothing listening crash-looped the executor and the relay (the cluster client connects in
    its constructor) and fired no critical schedule; with redis:// it went degraded. Now the
    same: degraded mode, critical schedules fire from PostgreSQL, no crash, no restart, and the
    URL's password is nowhere in the output nor in /readyz (issue 27, defect 11)."""
    create(db, "repro-critical", every=0.5, soon=True, target_kind="task", target="repro", critical=True)
    url = f"redis+cluster://admin:{SECRET}@127.0.0.1:{embedded.free_port()},127.0.0.1:{embedded.free_port()}"
    proc = Process(tmp_path / "schedules.log", "schedules", "run", "--dsn", with_password(dsn), "--redis-url", url,
                   "--poll-ms", "50")
    try:
        def fired():
            assert proc.proc.poll() is None, proc.text()
            return db.call_value("execution_count", name="repro-critical", outcome="fired") >= 3
        wait_for(fired, 20, "the critical schedule to fire in degraded mode")
        status, body = readyz(proc.url + "/readyz")
        assert status == 503 and body["servers"]["redis"] != "ok", body
        assert any(v.startswith("degraded") for v in body["daemons"].values()), body
        assert SECRET not in json.dumps(body)
    finally:
        code = proc.stop()
    text = proc.text()
    assert code == 0 and SECRET not in text, text
    assert " crashed" not in text and "restarting" not in text, text
    assert "degraded mode" in text and "redis+cluster://admin:***@127.0.0.1:" in text, text


def test_delay_run_with_kafka_down_at_start_serves_readyz_naming_it(dsn, tmp_path):
    """``delay run`` checked its topics before serving: with Kafka down at start it had no
    /readyz (nor /metrics) until Kafka answered. The check is the relay's first step now, under
    run_daemons: /readyz at once, naming kafka, the relay running (waiting for it)."""
    proc = Process(tmp_path / "delay.log", "delay", "run", "--dsn", with_password(dsn), "--bootstrap-servers",
                   f"127.0.0.1:{embedded.free_port()}")
    try:
        def named():
            status, body = readyz(proc.url + "/readyz")
            return body if status == 503 and "kafka" in body["not_ready"] else None
        body = wait_for(named, 15, "/readyz to name kafka")
        assert [v for v in body["daemons"].values()] == ["running"], body
    finally:
        started = time.monotonic()
        code = proc.stop()
    assert code == 0 and time.monotonic() - started < 10 and SECRET not in proc.text(), proc.text()
