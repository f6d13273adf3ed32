"""The schedules demo: interval and cron schedules, one of each target, fired and counted."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ..daemon import RunContext
from ..db import Database, Jsonb
from ..masking import mask_url
from ..sqlapi import HTTP_ALLOW, SET_HTTP_ALLOW
from . import sqlapi as sql
from .executor import Executor, ExecutorConfig
from .relay import IndexRelay


class Receiver:
    """A local HTTP server (stdlib) that records each POST's Idempotency-Key."""

    def __init__(self, status: int = 200, delay: float = 0.0):
        self.keys: list[str] = []
        self.status = status
        self.delay = delay
        self.lock = threading.Lock()
        self.event = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - BaseHTTPRequestHandler's method name
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if outer.delay:
                    time.sleep(outer.delay)
                with outer.lock:
                    outer.keys.append(self.headers.get("Idempotency-Key"))
                    status = outer.status
                outer.event.set()
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        ThreadingHTTPServer.request_queue_size = 256  # executors send up to 16 requests at once each
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def received(self) -> list[str]:
        with self.lock:
            return list(self.keys)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def _loopback_allowed(db: Database):
    """The receiver listens on loopback, which the egress policy refuses by default: allowed
    for the demo's run only (the admin's allow-list comes back afterwards)."""
    allowed = db.call_value(HTTP_ALLOW) or []
    db.call(SET_HTTP_ALLOW, allow=[*allowed, "127.0.0.1/32"])
    try:
        yield
    finally:
        db.call(SET_HTTP_ALLOW, allow=allowed)


def demo(ctx: RunContext, echo) -> None:
    """Three schedules (Kafka every 1 s, HTTP cron every second, task every 2 s) fired for ~6 s."""
    if not ctx.redis_url:
        echo("no Redis configured: schedules demo skipped")
        return
    from ..delay.output import fresh_read
    from ..embedded import create_topics

    suffix = uuid.uuid4().hex[:6]
    topic, queue = f"demo.schedules.{suffix}", f"demo-schedules-{suffix}"
    receiver = Receiver()
    stop = threading.Event()
    threads = []
    with Database(ctx.dsn, max_size=2) as db, _loopback_allowed(db):
        names = {"kafka": f"demo-kafka-{suffix}", "http": f"demo-http-{suffix}", "task": f"demo-task-{suffix}"}
        if ctx.kafka_bootstrap:
            create_topics(ctx.kafka_bootstrap, [topic], settings=ctx.kafka_settings)
            db.call(sql.CREATE_SCHEDULE, name=names["kafka"], every=timedelta(seconds=1), target_kind="kafka",
                    target=topic, payload=Jsonb({"report": "daily"}), retry_attempts=0)
            echo(f"{names['kafka']}: every 1s -> Kafka topic {topic}")
        db.call(sql.CREATE_SCHEDULE, name=names["http"], cron="* * * * * *", tz="Europe/Berlin", target_kind="http",
                target=receiver.url, payload=Jsonb({"ping": True}), retry_attempts=2,
                retry_base=timedelta(milliseconds=100), retry_jitter=timedelta(milliseconds=100))  # worst case 0.5 s
        echo(f"{names['http']}: cron '* * * * * *' (Europe/Berlin) -> POST {mask_url(receiver.url)}")
        db.call(sql.CREATE_SCHEDULE, name=names["task"], every=timedelta(seconds=2), target_kind="task", target=queue,
                priority=10, payload=Jsonb({"job": "cleanup"}), overlap="allow", retry_attempts=0)
        echo(f"{names['task']}: every 2s -> leased task on queue {queue}")
        nxt = db.call(sql.UPCOMING_RUNS, name=names["http"], n=3)
        echo("next runs of the cron schedule: " + ", ".join(r["run_at"].isoformat() for r in nxt))
        prefix = f"pyscheduler:demo:{suffix}"
        daemons = [IndexRelay(ctx.dsn, ctx.redis_url, prefix=prefix)] + [
            Executor(ExecutorConfig(dsn=ctx.dsn, redis_url=ctx.redis_url, kafka_bootstrap=ctx.kafka_bootstrap,
                                    kafka_settings=ctx.kafka_settings, prefix=prefix)) for _ in range(2)]
        for d in daemons:
            t = threading.Thread(target=d.run, args=(stop,), name=d.name, daemon=True)
            t.start()
            threads.append(t)
        echo("running the index relay and two executors for 6 s ...")
        time.sleep(6)
        stop.set()
        for t in threads:
            t.join(30)
        echo("execution counts (execution_count):")
        executions = {}
        for kind, name in names.items():
            if kind == "kafka" and not ctx.kafka_bootstrap:
                continue
            executions[kind] = db.call_value(sql.EXECUTION_COUNT, name=name)
            echo(f"  {name}: {executions[kind]}")
        if ctx.kafka_bootstrap:
            # every execution's message, then 0.5 s more for any duplicate (it waited 3 s for 1,000)
            got = fresh_read(ctx.kafka_bootstrap, topic, executions["kafka"], idle=0.5, timeout=10,
                             settings=ctx.kafka_settings)
            keys = {dict(m.headers())["pyscheduler-idempotency-key"] for m in got}
            echo(f"Kafka topic {topic}: {len(got)} messages, {len(keys)} distinct idempotency keys")
        keys = receiver.received()
        echo(f"HTTP receiver: {len(keys)} POSTs, {len(set(keys))} distinct Idempotency-Key values")
        counts = db.query(sql.TASK_COUNTS.select("WHERE queue = %s", "status, tasks"), (queue,))
        echo(f"task queue {queue}: " + (", ".join(f"{r['status']}={r['tasks']}" for r in counts) or "empty"))
        existing = {r["schedule"]["name"] for r in db.call(sql.LIST_SCHEDULES, name_like=f"demo-%-{suffix}")}
        for name in names.values():
            if name in existing:
                db.call(sql.DELETE_SCHEDULE, name=name)
    receiver.close()
