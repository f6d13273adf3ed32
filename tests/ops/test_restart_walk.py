"""The restart walk (design.md, convention E): ``pyscheduler run`` with schedules of every
target kind (Kafka, HTTP, task) and a future check firing every second, while Kafka, then
Redis, then PostgreSQL restart under it. Every daemon keeps running (the process exits 0
on SIGTERM: run_daemons returns 1 once any daemon crashed), every schedule and the check
fire again within a bounded time after each restart, and nothing is recorded twice.

Private servers (this test restarts them); tansu keeps topics in memory, so after its
restart the test creates them again, as they would still exist on a real Kafka."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import timedelta

import psycopg
import pytest

from pyscheduler import embedded, migrate
from pyscheduler.db import Database

from tests.support import wait_for
from tests.support.ops import WALK_JOB
from tests.support.schedules import Receiver, create

pytestmark = pytest.mark.slow  # every test here: daemons, processes or servers of its own, on the real clock

TOPICS = ["walk.schedules", "pyscheduler.delay.input", "pyscheduler.delay.output"]
SCHEDULES = ("walk-kafka", "walk-http", "walk-task")
BOUND = 60  # s: each kind fires again within this after a restart

def progress(dsn: str) -> dict[str, int] | None:
    """Fired executions per schedule, tasks submitted, check runs; None while PostgreSQL is away."""
    try:
        with psycopg.connect(dsn, connect_timeout=2) as c:
            row = c.execute(
                "SELECT (SELECT count(*) FROM pyscheduler.schedule_executions e JOIN pyscheduler.schedules s "
                "        ON s.id = e.schedule_id WHERE s.name = 'walk-kafka' AND e.outcome = 'fired'), "
                "       (SELECT count(*) FROM pyscheduler.schedule_executions e JOIN pyscheduler.schedules s "
                "        ON s.id = e.schedule_id WHERE s.name = 'walk-http' AND e.outcome = 'fired'), "
                "       (SELECT count(*) FROM pyscheduler.tasks WHERE queue = 'walk-queue'), "
                "       (SELECT count(*) FROM public.walk_runs)").fetchone()
    except psycopg.OperationalError:
        return None
    return dict(zip(("kafka", "http", "task", "check"), row))


def advanced(dsn: str, before: dict[str, int], by: int = 2):
    now = progress(dsn)
    return now if now and all(now[k] >= before[k] + by for k in before) else None


@pytest.fixture
def servers(tmp_path):
    started = []
    try:
        for cls in (embedded.Postgres, embedded.Kafka, embedded.Redis):
            started.append(cls(tmp_path / cls.name).start())
        yield started
    finally:
        for server in reversed(started):
            server.stop()


def test_pyscheduler_run_survives_kafka_then_redis_then_postgres_restarting(servers, tmp_path):
    pg, kafka, rds = servers
    dsn = pg.dsn()
    migrate.migrate(dsn)
    embedded.create_topics(kafka.bootstrap, TOPICS)
    receiver = Receiver()
    with Database(dsn, max_size=1) as db:
        db.query("SELECT pyscheduler.set_http_allow(ARRAY['127.0.0.0/8']::cidr[])")
        create(db, "walk-kafka", every=1, target_kind="kafka", target=TOPICS[0], soon=True)
        create(db, "walk-http", every=1, target_kind="http", target=receiver.url, soon=True)
        create(db, "walk-task", every=1, target_kind="task", target="walk-queue", soon=True)
        with db.connection() as c:
            c.execute(WALK_JOB)
        db.call("set_check_settings", resolution=timedelta(seconds=1))
        db.call("add_check", entity_name="walk", entity_key="1", job="public.walk_job",
                check_after=timedelta(seconds=1), max_checks=1_000_000, horizon=timedelta(days=1))
    log = tmp_path / "run.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYSCHEDULER_SCHEDULES_STUCK_AFTER_MS": "3000",
           "PYSCHEDULER_SCHEDULES_CHECK_EVERY_MS": "500", "PYSCHEDULER_SCHEDULES_POLL_MS": "50",
           "PYSCHEDULER_SCHEDULES_FIRE_TIMEOUT_MS": "3000", "PYSCHEDULER_CHECKS_TIMEOUT": "5s"}
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "pyscheduler", "run", "--no-migrate", "--dsn", dsn,
                                 "--bootstrap-servers", kafka.bootstrap, "--redis-url", rds.url],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    try:
        def running(condition):
            def check():
                assert proc.poll() is None, f"pyscheduler run exited:\n{log.read_text()[-5000:]}"
                return condition()
            return check

        wait_for(running(lambda: advanced(dsn, dict.fromkeys(("kafka", "http", "task", "check"), 0))), BOUND,
                 "every schedule and the check to fire")
        for server in (kafka, rds, pg):
            server.stop()
            server.start()  # same port and data directory
            if server is kafka:
                embedded.create_topics(kafka.bootstrap, TOPICS)
            # counted from now: what was in flight at the restart and lands now is not "again"
            before = wait_for(running(lambda: progress(dsn)), BOUND, "PostgreSQL")
            try:
                wait_for(running(lambda: advanced(dsn, before, by=5)), BOUND,
                         f"every schedule and the check to fire again after {server.name} restarted")
            except TimeoutError as exc:
                raise AssertionError(f"{exc}: {before} -> {progress(dsn)}\n{log.read_text()[-6000:]}") from None
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
        receiver.close()
    text = log.read_text()
    assert code == 0 and " crashed" not in text, text[-5000:]
    with psycopg.connect(dsn) as c:
        # recorded once: each schedule's counters agree with its execution rows, and no slot of
        # the check ran twice
        for name in SCHEDULES:
            fired, rows = c.execute(
                "SELECT s.fired_count, (SELECT count(*) FROM pyscheduler.schedule_executions e "
                "WHERE e.schedule_id = s.id AND e.outcome = 'fired') FROM pyscheduler.schedules s "
                "WHERE s.name = %s", (name,)).fetchone()
            assert fired == rows > 0, name
        twice = c.execute("SELECT slot, count(*) FROM public.walk_runs GROUP BY slot HAVING count(*) > 1").fetchall()
        assert twice == []
        assert c.execute("SELECT count(*) FROM pyscheduler.tasks WHERE queue = 'walk-queue'").fetchone()[0] == \
            c.execute("SELECT fired_count FROM pyscheduler.schedules WHERE name = 'walk-task'").fetchone()[0]
