"""The dashboard's 7 d reads with and without the tasks' per-minute rollup (docs/benchmarks.md,
"Dashboard page times", issue 30).

    python -m pyscheduler.bench.activity_ranges [--tasks 200000] [--calls 20]

Starts an embedded PostgreSQL, stores --tasks finished tasks over the last 7 days (20 queues),
then times activity(), activity_latency() and queue_activity() over 7 days: first with nothing
folded (they read the tasks, as before the rollup), then after _fold_task_minutes (the
rollup, and the index only since the fold). Prints p50/p95/max ms per read and the fold's time.
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
    for name, query in sql.ACTIVITY_WEEK.items():
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            c.execute(query).fetchall()
            times.append((time.perf_counter() - t0) * 1000)
        print(f"  {name:18} {percentile(times, 50):8.1f} {percentile(times, 95):8.1f} {max(times):8.1f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=200_000)
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="activity-bench-") as tmp:
        pg = Postgres(Path(tmp) / "postgres").start()
        try:
            migrate.migrate(pg.dsn())
            with psycopg.connect(pg.dsn(), autocommit=True) as c:
                c.execute(sql.ACTIVITY_TASKS, {"n": args.tasks})
                c.execute(sql.TASK_COUNT_ALL)
                c.execute("VACUUM ANALYZE")
                c.execute(sql.ACTIVITY_UNFOLD)
                print(f"{args.tasks} tasks finished over 7 days; {'read':18} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}")
                print("nothing folded (the tasks read):")
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
