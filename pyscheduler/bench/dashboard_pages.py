"""Page times of the dashboard with much stored work (docs/benchmarks.md, "Dashboard page times").

    python -m pyscheduler.bench.dashboard_pages [--tasks 1000000 --schedules 100000 --checks 1000000 ...]

Starts an embedded PostgreSQL (or uses --dsn: a database it may fill), stores the work with
set-based SQL (fill: tasks over the last day, time-ordered ids, a few ready, scheduled,
running and aborted; schedules with executions; checks over the next 30 days; delay messages
waiting 1 hour to 30 days), then serves the dashboard on a monitor login (actions on, as the
same login: the schedule editor's pages show) and times each page over HTTP (p50/p95/max),
the overview also before the per-minute folds (the tasks monitor and schedules cleanup's).
"""

from __future__ import annotations

import argparse
import html
import re
import time
import urllib.request
from pathlib import Path

import psycopg

from .. import migrate
from ..dashboard import make_app
from ..web.server import BoundedServer
from . import sqlapi as sql
from .stats import percentile


def fill(dsn: str, tasks: int, schedules: int, checks: int, messages: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        t0 = time.monotonic()
        c.execute("SET synchronous_commit = off")
        c.execute(sql.PAGES_TASKS, (tasks,))
        c.execute(sql.TASK_COUNT_ALL)  # rows written by hand are counted again
        print(f"tasks: {tasks} in {time.monotonic() - t0:.0f}s", flush=True)
        t0 = time.monotonic()
        for start in range(0, schedules, 10000):
            c.execute(sql.PAGES_SCHEDULES, (start + 1, min(start + 10000, schedules)))
        c.execute(sql.PAGES_EXECUTIONS, ())
        print(f"schedules: {schedules} in {time.monotonic() - t0:.0f}s", flush=True)
        t0 = time.monotonic()
        for start in range(0, checks, 100000):
            c.execute(sql.PAGES_CHECKS, (start + 1, min(start + 100000, checks)))
        print(f"checks: {checks} in {time.monotonic() - t0:.0f}s", flush=True)
        t0 = time.monotonic()
        c.execute(sql.FLAT_DELAY_MESSAGES, (1, messages))
        c.execute(sql.DELAY_COUNT_ALL)
        print(f"delay messages: {messages} in {time.monotonic() - t0:.0f}s", flush=True)
        c.execute("VACUUM ANALYZE")


def _time(base: str, page: str, requests: int, label: str = "") -> None:
    times = []
    for _ in range(requests):
        t0 = time.perf_counter()
        with urllib.request.urlopen(base + page) as r:
            r.read()
        times.append((time.perf_counter() - t0) * 1000)
    label = label or (page if len(page) <= 45 else page[:44] + "…")
    print(f"{label:45} {percentile(times, 50):8.1f} {percentile(times, 95):8.1f} {max(times):8.1f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn")
    ap.add_argument("--tasks", type=int, default=1_000_000)
    ap.add_argument("--schedules", type=int, default=100_000)
    ap.add_argument("--checks", type=int, default=1_000_000)
    ap.add_argument("--messages", type=int, default=1_000_000, help="waiting delay messages")
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
        filled = c.execute(sql.ANY_TASK).fetchone()[0]
    if not (args.reuse and filled):
        fill(dsn, args.tasks, args.schedules, args.checks, args.messages)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP ROLE IF EXISTS bench_monitor")
        c.execute("CREATE ROLE bench_monitor LOGIN IN ROLE pyscheduler_monitor")
    monitor = psycopg.conninfo.make_conninfo(dsn, user="bench_monitor")
    app = make_app(monitor, allow_actions=True)  # reads as the monitor; the editor's pages show
    pages = ["/", "/tasks", "/tasks?status=ready&queue=q0", "/tasks?status=scheduled", "/tasks?status=aborted",
             "/tasks?status=aborted&queue=q3", "/tasks?status=completed", "/delay", "/schedules",
             "/schedules?name_like=s-00999%25", "/schedule?name=s-0000010", "/checks",
             "/checks?entity_name=order&entity_key=4242",
             # the search box (issue 30): a spec fragment, a schedule's name, an entity key, a message id
             "/search?q=i:4242", "/search?q=s-0000010", "/search?q=4242", "/search?q=order-1", "/workers",
             # the schedule editor and the delay queue's waiting messages (issue 30)
             "/schedule/new", "/schedule/edit?name=s-0000010", "/delay/messages", "/delay/messages?id=cold-4242"]
    server = BoundedServer("127.0.0.1", 0, app).start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        with urllib.request.urlopen(base + "/tasks?status=aborted") as r:
            rn = re.search(r'href="/tasks/([0-9a-f-]{36})"', r.read().decode()).group(1)
        pages += [f"/tasks/{rn}", f"/search?q={rn[:13]}"]  # and the search for an id prefix
        with urllib.request.urlopen(base + "/delay/messages") as r:
            nxt = re.search(r'<a href="([^"]+)" rel="next">', r.read().decode())
        pages += [html.unescape(nxt.group(1))] if nxt else []  # the second page of waiting messages
        print(f"{'page':45} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}")
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(sql.ACTIVITY_UNFOLD)
            _time(base, "/", args.requests, "/ (nothing folded)")
            c.execute(sql.ACTIVITY_FOLD)
        for page in pages:
            _time(base, page, args.requests)
    finally:
        server.close()
    app.close()
    if pg is not None:
        pg.stop()
        tmp.cleanup()


if __name__ == "__main__":
    main()
