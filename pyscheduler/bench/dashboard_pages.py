"""Page times of the dashboard (issue 17: <= 200 ms p95 with 1,000,000 tasks, 100,000
schedules and 1,000,000 checks stored).

    python bench/dashboard_pages.py [--tasks 1000000 --schedules 100000 --checks 1000000] [--requests 30]

Starts an embedded PostgreSQL (or uses --dsn: a database it may fill), migrates, stores
the work with set-based SQL (tasks: 1 % ready, 1 % scheduled, 0.1 % running, 2 % aborted,
the rest completed over the last day, ids time-ordered as submit_task makes them; checks pending over the next 30 days; schedules
with executions), VACUUM ANALYZE, then serves the dashboard on a monitor login and times
each page over HTTP (wall time per request, p50/p95/max)."""

from __future__ import annotations

import argparse
import re
import time
import urllib.request
from pathlib import Path

import psycopg

from .. import migrate
from ..dashboard import make_app
from ..web.server import BoundedServer
from .stats import percentile


def fill(dsn: str, tasks: int, schedules: int, checks: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        t0 = time.monotonic()
        c.execute("SET synchronous_commit = off")
        c.execute("""
            INSERT INTO pyscheduler.tasks (rn, queue, spec, priority, status, progress, created, updated, errors,
                                           owner, deadline, history, attempts, run_at, submitted_by)
            SELECT pyscheduler._task_rn(pyscheduler._rn_prefix(now() - (i %% 86400) * interval '1 second'), i),
                   'q' || (i %% 20), jsonb_build_object('i', i), 50,
                   s::pyscheduler.task_status, CASE s WHEN 'running' THEN 0.5 ELSE 0 END,
                   now() - (i %% 86400) * interval '1 second', now() - (i %% 86400) * interval '1 second',
                   CASE s WHEN 'aborted' THEN '[{"code": "boom", "args": {}, "description": "failed"}]'::jsonb
                          ELSE '[]'::jsonb END,
                   CASE s WHEN 'running' THEN 'worker-1' END,
                   CASE s WHEN 'running' THEN now() + interval '1 hour' END, '[]'::jsonb,
                   CASE WHEN s IN ('running', 'completed', 'aborted') THEN 1 ELSE 0 END,
                   CASE s WHEN 'scheduled' THEN now() + interval '1 hour' END, 'pyscheduler_client'
              FROM (SELECT i, CASE WHEN i %% 100 = 0 THEN 'ready' WHEN i %% 100 = 1 THEN 'scheduled'
                                   WHEN i %% 1000 = 2 THEN 'running' WHEN i %% 50 = 3 THEN 'aborted'
                                   ELSE 'completed' END AS s
                      FROM generate_series(1, %s) i) x""", (tasks,))
        c.execute("SELECT pyscheduler._task_count_all()")  # rows written by hand are counted again
        print(f"tasks: {tasks} in {time.monotonic() - t0:.0f}s", flush=True)
        t0 = time.monotonic()
        for start in range(0, schedules, 10000):
            c.execute("SELECT pyscheduler.create_schedule(name => 's-' || lpad(i::text, 7, '0'), "
                      "every => ((i %% 60) + 1) * interval '1 minute', target => 'ticks', retry_attempts => 0) "
                      "FROM generate_series(%s::int, %s::int) i", (start + 1, min(start + 10000, schedules)))
        c.execute("""
            INSERT INTO pyscheduler.schedule_executions (schedule_id, expected_at, outcome, triggered, attempts,
                                                         fired_at, lateness)
            SELECT s.id, date_trunc('minute', now()) - k * interval '1 minute',
                   CASE WHEN k % 50 = 0 THEN 'failed' ELSE 'fired' END, false, 1,
                   date_trunc('minute', now()) - k * interval '1 minute' + interval '20 milliseconds',
                   interval '20 milliseconds'
              FROM pyscheduler.schedules s, generate_series(1, 10) k WHERE s.id % 10 = 0""")
        print(f"schedules: {schedules} in {time.monotonic() - t0:.0f}s", flush=True)
        t0 = time.monotonic()
        for start in range(0, checks, 100000):
            c.execute("SELECT pyscheduler.add_check(entity_name => 'order', entity_key => i::text, job => 'sms', "
                      "kind => 'python', check_after => (i %% 2592000) * interval '1 second') "
                      "FROM generate_series(%s::int, %s::int) i", (start + 1, min(start + 100000, checks)))
        print(f"checks: {checks} in {time.monotonic() - t0:.0f}s", flush=True)
        c.execute("VACUUM ANALYZE")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn")
    ap.add_argument("--tasks", type=int, default=1_000_000)
    ap.add_argument("--schedules", type=int, default=100_000)
    ap.add_argument("--checks", type=int, default=1_000_000)
    ap.add_argument("--requests", type=int, default=30)
    ap.add_argument("--reuse", action="store_true",
                    help="with --dsn: skip the fill when the database holds tasks already (a run before filled it)")
    args = ap.parse_args()

    pg, tmp = None, None
    dsn = args.dsn
    if dsn is None:
        import tempfile
        from ..embedded import Postgres
        tmp = tempfile.TemporaryDirectory(prefix="dashboard-bench-")
        pg = Postgres(Path(tmp.name) / "postgres").start()
        dsn = pg.dsn()
    migrate.migrate(dsn)
    with psycopg.connect(dsn) as c:
        filled = c.execute("SELECT EXISTS (SELECT 1 FROM pyscheduler.tasks)").fetchone()[0]
    if not (args.reuse and filled):
        fill(dsn, args.tasks, args.schedules, args.checks)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP ROLE IF EXISTS bench_monitor")
        c.execute("CREATE ROLE bench_monitor LOGIN IN ROLE pyscheduler_monitor")
    monitor = psycopg.conninfo.make_conninfo(dsn, user="bench_monitor")
    app = make_app(monitor)
    pages = ["/", "/tasks", "/tasks?status=ready&queue=q0", "/tasks?status=scheduled", "/tasks?status=aborted",
             "/tasks?status=aborted&queue=q3", "/tasks?status=completed", "/delay", "/schedules",
             "/schedules?name_like=s-00999%25", "/schedule?name=s-0000010", "/checks",
             "/checks?entity_name=order&entity_key=4242"]
    server = BoundedServer("127.0.0.1", 0, app).start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        with urllib.request.urlopen(base + "/tasks?status=aborted") as r:
            rn = re.search(r'href="/tasks/([0-9a-f-]{36})"', r.read().decode()).group(1)
        pages.append(f"/tasks/{rn}")
        print(f"{'page':45} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}")
        for page in pages:
            times = []
            for _ in range(args.requests):
                t0 = time.perf_counter()
                with urllib.request.urlopen(base + page) as r:
                    r.read()
                times.append((time.perf_counter() - t0) * 1000)
            print(f"{page:45} {percentile(times, 50):8.1f} {percentile(times, 95):8.1f} {max(times):8.1f}",
                  flush=True)
    finally:
        server.close()
    app.close()
    if pg is not None:
        pg.stop()
        tmp.cleanup()


if __name__ == "__main__":
    main()
