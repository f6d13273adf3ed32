"""PostgreSQL failover under load, nothing acknowledged lost (docs/operations.md, "PostgreSQL
failover"). A primary and a synchronous standby, all four capabilities running on the multi-host
DSN (``pyscheduler run``, a Worker, a submitter, a DelayProducer, schedules and a check); the
primary SIGKILLed and the standby promoted; then ``verdict`` checks every acknowledged task,
message, firing and check slot on the new primary, and each capability's gap is timed.
``--async-replication`` counts what an asynchronous standby loses; exit status 1 when a
synchronous round lost anything or a check failed:

    python -m pyscheduler.bench.failover --rounds 5 [--async-replication]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg

from .. import embedded, migrate
from ..checks import sqlapi as checks_sql
from ..db import Database
from ..delay.output import fresh_read
from ..schedules import sqlapi as schedules_sql
from ..tasks import TaskClient, TaskContext, Worker
from . import sqlapi as sql

INPUT, OUTPUT, SCHEDULE_TOPIC = "pyscheduler.delay.input", "pyscheduler.delay.output", "fo.schedules"
JOB = """
CREATE TABLE public.fo_runs (slot timestamptz NOT NULL, ran timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION public.fo_job(c pyscheduler.future_check) RETURNS timestamptz
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    INSERT INTO public.fo_runs (slot) VALUES (c.next_check_at);
    -- the next second; a catch-up run (late by more than a second): the next one from now
    RETURN CASE WHEN c.next_check_at + interval '1 second' > now() THEN c.next_check_at + interval '1 second'
                ELSE now() + interval '1 second' END;
END $$;
"""


class Acked:
    """What the database or the broker acknowledged, with when."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: dict[str, float] = {}
        self.errors = 0

    def add(self, key: str) -> None:
        with self.lock:
            self.items[key] = time.time()


def submitter(dsn: str, stop: threading.Event, acked: Acked, every: float = 0.005) -> None:
    """Submit a task every ``every`` s; a submit that raised is not acknowledged (its task may
    or may not exist: a commit whose answer was lost), and the next one goes on."""
    with Database(dsn, max_size=1) as db:
        client = TaskClient(db)
        while not stop.is_set():
            try:
                acked.add(str(client.submit("fo", {"at": time.time()}).rn))
            except Exception:  # noqa: BLE001 - the outage: counted, retried by the next submit
                acked.errors += 1
                stop.wait(0.05)
                continue
            stop.wait(every)


def producer_loop(bootstrap: str, stop: threading.Event, acked: Acked, every: float = 0.005) -> None:
    """A delayed message every ``every`` s, due 1-3 s later; acknowledged by its delivery report."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})

    def reporter(ident: str):
        def report(err, msg) -> None:
            if err is None:
                acked.add(ident)
            else:
                acked.errors += 1
        return report

    from ..delay.message import delayed_headers

    i = 0
    while not stop.is_set():
        ident = f"fo-{uuid.uuid4().hex[:12]}-{i}"
        deadline = datetime.now(timezone.utc) + timedelta(seconds=1 + 2 * (i % 100) / 100)
        producer.produce(INPUT, value=ident.encode(), headers=delayed_headers(ident, deadline),
                         on_delivery=reporter(ident))
        producer.poll(0)
        i += 1
        stop.wait(every)
    producer.flush(30)


def progress(dsn: str) -> dict[str, int] | None:
    """Counters that grow while each capability works; None while no primary answers."""
    try:
        with psycopg.connect(dsn, connect_timeout=1) as c:
            row = c.execute(sql.FAILOVER_PROGRESS).fetchone() + c.execute(
                "SELECT (SELECT count(*) FROM public.fo_runs), (SELECT fired FROM public.fo_delay_fired)").fetchone()
    except psycopg.Error:
        return None
    return dict(zip(("tasks", "schedules", "checks", "delay"), row))


def wait(condition, timeout: float, what: str, poll: float = 0.1):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def one_round(workdir: Path, synchronous: bool, before: float, after: float) -> dict:
    primary = embedded.Postgres(workdir / "primary", settings={"wal_keep_size": "256MB"}).start()
    kafka = embedded.Kafka(workdir / "kafka").start()
    redis = embedded.Redis(workdir / "redis").start()
    standby = None
    run = None
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        migrate.migrate(primary.dsn())
        embedded.create_topics(kafka.bootstrap, [INPUT, OUTPUT, SCHEDULE_TOPIC])
        with Database(primary.dsn(), max_size=1) as db:
            for name, kind, target in (("fo-kafka", "kafka", SCHEDULE_TOPIC), ("fo-task", "task", "fo-sched")):
                db.call(schedules_sql.CREATE_SCHEDULE, name=name, every=timedelta(seconds=1), target_kind=kind,
                        target=target, retry_attempts=0,
                        start_at=datetime.now(timezone.utc) + timedelta(seconds=0.5))
            with db.connection() as c:
                c.execute(JOB)
                # the delay relay deletes what it fired: count firings with a statement trigger's twin,
                # a counter the test reads (the relay's own code is untouched)
                c.execute("CREATE TABLE public.fo_delay_fired (fired bigint NOT NULL)")
                c.execute("INSERT INTO public.fo_delay_fired VALUES (0)")
                c.execute("""CREATE FUNCTION public.fo_count() RETURNS trigger LANGUAGE plpgsql AS $$
                             BEGIN UPDATE public.fo_delay_fired SET fired = fired + (SELECT count(*) FROM gone);
                                   RETURN NULL; END $$""")
                c.execute("CREATE TRIGGER fo_count AFTER DELETE ON pyscheduler.delay_messages "
                          "REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION public.fo_count()")
            db.call(checks_sql.SET_CHECK_SETTINGS, resolution=timedelta(seconds=1))
            db.call(checks_sql.ADD_CHECK, entity_name="fo", entity_key="1", job="public.fo_job",
                    check_after=timedelta(seconds=1), max_checks=1_000_000, horizon=timedelta(days=1))
        standby = embedded.Standby(workdir / "standby", primary).start()
        with psycopg.connect(primary.dsn(), autocommit=True) as c:
            if synchronous:
                c.execute("ALTER SYSTEM SET synchronous_standby_names = 'standby1'")
                c.execute("SELECT pg_reload_conf()")
            wait(lambda: c.execute("SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND "
                                   "sync_state = %s", ("sync" if synchronous else "async",)).fetchone()[0],
                 30, "the standby to stream")
        dsn = (f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/postgres"
               "?target_session_attrs=read-write&connect_timeout=2")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYSCHEDULER_SCHEDULES_STUCK_AFTER_MS": "3000",
               "PYSCHEDULER_SCHEDULES_CHECK_EVERY_MS": "500", "PYSCHEDULER_SCHEDULES_POLL_MS": "50",
               "PYSCHEDULER_SCHEDULES_FIRE_TIMEOUT_MS": "3000", "PYSCHEDULER_CHECKS_TIMEOUT": "5s"}
        log = open(workdir / "run.log", "wb")
        run = subprocess.Popen([sys.executable, "-m", "pyscheduler", "run", "--no-migrate", "--dsn", dsn,
                                "--bootstrap-servers", kafka.bootstrap, "--redis-url", redis.url,
                                "-X", "session.timeout.ms=6000"],  # tansu: a group join takes half of it
                               stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        ran: dict[str, int] = {}
        ran_lock = threading.Lock()

        def handle(ctx: TaskContext) -> None:
            with ran_lock:
                ran[ctx.rn] = ran.get(ctx.rn, 0) + 1

        worker = Worker(dsn, "fo", handle, capacity=4, timeout=10).start()
        tasks_acked, delay_acked = Acked(), Acked()
        threads = [threading.Thread(target=submitter, args=(dsn, stop, tasks_acked), daemon=True),
                   threading.Thread(target=producer_loop, args=(kafka.bootstrap, stop, delay_acked), daemon=True)]
        for t in threads:
            t.start()
        try:
            wait(lambda: (p := progress(primary.dsn())) and all(v > 0 for v in p.values()), 60,
                 "every capability to make progress")
        except AssertionError as exc:
            counts = progress(primary.dsn())
            raise AssertionError(f"{exc}: {counts}") from None
        time.sleep(before)  # load before the failover (measured, not synchronisation)
        base = progress(dsn)
        killed = time.time()
        primary.kill()
        standby.promote()
        promoted = time.time()
        gaps: dict[str, float] = {}
        while len(gaps) < 4 and time.time() - killed < 120:
            now = progress(dsn)
            if now:
                for k, v in now.items():
                    if k not in gaps and v > base[k]:
                        gaps[k] = time.time() - killed
            time.sleep(0.05)
        recovered = time.time()
        time.sleep(after)  # load after the failover
        stop.set()
        for t in threads:
            t.join(60)
        # drain: every acknowledged task completed, every acknowledged message fired
        with Database(dsn, max_size=1) as db:
            def tasks_done():
                rns = list(tasks_acked.items)
                rows = db.query(sql.TASK_STATUSES, (rns,))
                counts = {r["status"]: r["n"] for r in rows}
                return counts if sum(counts.values()) == len(rns) and counts.get("completed") == len(rns) or \
                    time.time() - recovered > after + 60 else None
            task_counts = wait(tasks_done, after + 90, "the acknowledged tasks to complete", poll=0.5)
            worker.stop()
            out = fresh_read(kafka.bootstrap, OUTPUT, len(delay_acked.items), idle=2, timeout=60)
            fired_ids = {m.value().decode() for m in out}  # the value is the message's id
            lost_messages = [i for i in delay_acked.items if i not in fired_ids]
            missing_tasks = len(tasks_acked.items) - sum(task_counts.values())
            # schedules: recorded once; every second from the recovery on fired
            checks = {}
            for name in ("fo-kafka", "fo-task"):
                fired, rows, first, last, slots = db.query(
                    sql.FAILOVER_FIRINGS, (datetime.fromtimestamp(recovered + 2, timezone.utc), name))[0].values()
                all_fired = db.query(sql.FAILOVER_FIRED, (name,))[0]["n"]
                span = round((last - first).total_seconds()) + 1 if first else 0
                checks[name] = {"fired_count": fired, "rows": all_fired, "after_recovery": rows,
                                "missing_seconds": span - slots}
            sched_tasks = db.query(sql.TASKS_IN_QUEUE, ("fo-sched",))[0]["n"]
            twice = db.query("SELECT count(*) AS n FROM (SELECT slot FROM public.fo_runs GROUP BY slot "
                             "HAVING count(*) > 1) d")[0]["n"]
            check_span = db.query("SELECT min(slot) AS a, max(slot) AS b, count(DISTINCT slot) AS n FROM "
                                  "public.fo_runs WHERE slot >= %s",
                                  (datetime.fromtimestamp(recovered + 2, timezone.utc),))[0]
            check_missing = (round((check_span["b"] - check_span["a"]).total_seconds()) + 1 - check_span["n"]
                             if check_span["a"] else None)
        run.send_signal(signal.SIGTERM)
        code = run.wait(60)
        return {"synchronous": synchronous, "promote_s": round(promoted - killed, 2), "gaps_s": {
                    k: round(v, 2) for k, v in gaps.items()},
                "tasks": {"acked": len(tasks_acked.items), "missing": missing_tasks, "statuses": task_counts,
                          "ran_twice": sum(1 for n in ran.values() if n > 1), "submit_errors": tasks_acked.errors},
                "delay": {"acked": len(delay_acked.items), "lost": len(lost_messages)},
                "schedules": checks, "schedule_tasks": sched_tasks,
                "checks": {"twice": twice, "missing_seconds_after_recovery": check_missing},
                "run_exit": code}
    finally:
        stop.set()
        if run is not None and run.poll() is None:
            run.kill()
        for server in (standby, redis, kafka, primary):
            if server is not None:
                try:
                    server.stop()
                except Exception:  # noqa: BLE001 - killed already
                    pass


def verdict(r: dict) -> list[str]:
    """What went wrong in a round (empty: nothing)."""
    bad = []
    if r["synchronous"] and r["tasks"]["missing"]:
        bad.append(f"{r['tasks']['missing']} acknowledged tasks missing")
    if r["synchronous"] and r["delay"]["lost"]:
        bad.append(f"{r['delay']['lost']} acknowledged delayed messages never fired")
    if r["tasks"]["statuses"].get("completed", 0) != r["tasks"]["acked"] - r["tasks"]["missing"]:
        bad.append(f"not every acknowledged task completed: {r['tasks']['statuses']}")
    for name, s in r["schedules"].items():
        if s["fired_count"] != s["rows"]:
            bad.append(f"{name}: fired_count {s['fired_count']} != {s['rows']} execution rows")
        if s["missing_seconds"]:
            bad.append(f"{name}: {s['missing_seconds']} seconds after the recovery without a firing")
    if r["schedule_tasks"] != r["schedules"]["fo-task"]["rows"]:
        bad.append(f"fo-task made {r['schedule_tasks']} tasks for {r['schedules']['fo-task']['rows']} firings")
    if r["checks"]["twice"] or r["checks"]["missing_seconds_after_recovery"] != 0:  # None: none ran after
        bad.append(f"checks: {r['checks']}")
    if len(r["gaps_s"]) < 4:
        bad.append(f"some capability never resumed: {r['gaps_s']}")
    if r["run_exit"] != 0:
        bad.append(f"pyscheduler run exited {r['run_exit']}")
    return bad


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--async-replication", action="store_true",
                        help="synchronous_standby_names empty: count what an asynchronous standby loses")
    parser.add_argument("--before", type=float, default=8.0, help="seconds of load before the kill")
    parser.add_argument("--after", type=float, default=10.0, help="seconds of load after the recovery")
    parser.add_argument("--keep", action="store_true", help="keep each round's directory (logs)")
    args = parser.parse_args()
    failed = 0
    for i in range(1, args.rounds + 1):
        workdir = Path(tempfile.mkdtemp(prefix="pyscheduler-failover-"))
        try:
            result = one_round(workdir, not args.async_replication, args.before, args.after)
        finally:
            if not args.keep:
                shutil.rmtree(workdir, ignore_errors=True)
        bad = verdict(result)
        print(f"round {i}/{args.rounds}: {result}")
        print(f"round {i}/{args.rounds}: " + ("OK" if not bad else "FAILED: " + "; ".join(bad)), flush=True)
        failed += bool(bad) and not args.async_replication
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
