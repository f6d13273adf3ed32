"""The dashboard's 7 d and 1 h reads with and without the per-minute rollups (docs/benchmarks.md).

    python -m pyscheduler.bench.activity_ranges [--tasks 200000] [--hour-tasks 40000] [--executions 0] [--calls 20]

Starts an embedded PostgreSQL, stores --tasks finished tasks over the last 7 days and
--hour-tasks more over the last hour (20 queues), --executions schedule executions over the
last hour, then times activity(), activity_latency() and queue_activity() over 7 days and the
overview's 1 h reads: first with nothing folded (they read the tasks and executions, as
before the rollups), then after _fold_task_minutes and _fold_schedule_minutes (the rollups,
and the indexes only since the fold). Prints p50/p95/max ms per read and the fold's time.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import psycopg

from .. import migrate
from ..embedded import Postgres
from . import sqlapi as sql
from .stats import percentile


def _time(c: psycopg.Connection, calls: int) -> None:
    for span, reads in (("7d", sql.ACTIVITY_WEEK), ("1h", sql.ACTIVITY_HOUR)):
        for name, query in reads.items():
            times = []
            for _ in range(calls):
                t0 = time.perf_counter()
                c.execute(query).fetchall()
                times.append((time.perf_counter() - t0) * 1000)
            print(f"  {span} {name:18} {percentile(times, 50):8.1f} {percentile(times, 95):8.1f} {max(times):8.1f}",
                  flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=200_000)
    ap.add_argument("--hour-tasks", type=int, default=40_000)
    ap.add_argument("--executions", type=int, default=0)
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="activity-bench-") as tmp:
        pg = Postgres(Path(tmp) / "postgres").start()
        try:
            migrate.migrate(pg.dsn())
            with psycopg.connect(pg.dsn(), autocommit=True) as c:
                c.execute(sql.ACTIVITY_TASKS, {"n": args.tasks, "span": "7 days"})
                c.execute(sql.ACTIVITY_TASKS, {"n": args.hour_tasks, "span": "1 hour"})
                if args.executions:
                    c.execute(sql.ACTIVITY_EXECUTIONS, {"n": args.executions, "span": "1 hour"})
                c.execute(sql.TASK_COUNT_ALL)
                c.execute("VACUUM ANALYZE")
                c.execute(sql.ACTIVITY_UNFOLD)
                print(f"{args.tasks} tasks finished over 7 days, {args.hour_tasks} more in the last hour, "
                      f"{args.executions} schedule executions in the last hour")
                print(f"  {'read':21} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}")
                print("nothing folded (the tasks and executions read):")
                _time(c, args.calls)
                for what in ("first fold (8 days)", "a fold with nothing new"):
                    t0 = time.perf_counter()
                    c.execute(sql.ACTIVITY_FOLD)
                    print(f"{what}: {(time.perf_counter() - t0) * 1000:.0f} ms")
                print("folded (the minutes, and the index since the fold):")
                _time(c, args.calls)
        finally:
            pg.stop()


if __name__ == "__main__":
    main()
