"""The schedules' due views with many schedules that fire more often than hourly: N schedules
every minute, all due within the next minute and none late, then the median of 5 calls of
each view (docs/benchmarks.md, "The due views' index").

    python -m pyscheduler.bench.schedules_due_views SERVER_DSN [--n 200000]

A database ``due_views`` is made anew on that server and migrated by the pyscheduler on
PYTHONPATH (run it from two checkouts to compare); it is dropped at the end.
"""
from __future__ import annotations

import argparse
import statistics
import time
from datetime import timedelta

import psycopg
from psycopg.conninfo import make_conninfo

from .. import migrate
from ..db import Session
from ..schedules import sqlapi as schedules_sql
from . import sqlapi as sql

READS = {"schedules_late LIMIT 100": lambda c: c.execute(schedules_sql.SCHEDULES_LATE.select("LIMIT 100")).fetchall(),
         "schedules_late_count()": lambda c: Session.borrow(c).call(schedules_sql.SCHEDULES_LATE_COUNT),
         "schedules_due_soon LIMIT 100": lambda c: c.execute(
             schedules_sql.SCHEDULES_DUE_SOON.select("LIMIT 100")).fetchall()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("server_dsn")
    ap.add_argument("--n", type=int, default=200_000)
    a = ap.parse_args()
    dsn = make_conninfo(a.server_dsn, dbname="due_views")
    with psycopg.connect(make_conninfo(a.server_dsn, dbname="postgres"), autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS due_views WITH (FORCE)")
        admin.execute("CREATE DATABASE due_views")
    try:
        migrate.migrate(dsn)
        with psycopg.connect(dsn, autocommit=True) as c:
            first = Session.borrow(c).call_value(schedules_sql.CREATE_SCHEDULE, name="t", every=timedelta(minutes=1),
                                                 target_kind="kafka", target="x")["id"]
            c.execute(sql.DUE_VIEWS_CLONE, (a.n, first))
            c.execute(sql.DELETE_SCHEDULE_ROW, (first,))
            c.execute("VACUUM ANALYZE pyscheduler.schedules")
            for q, read in READS.items():
                took = []
                for _ in range(5):
                    t0 = time.perf_counter()
                    read(c)
                    took.append(time.perf_counter() - t0)
                late = c.execute(sql.SCHEDULES_LATE_BY_10S).fetchone()[0]
                print(f"{a.n:,} schedules every minute, {late} late: {q}: "
                      f"median {statistics.median(took) * 1e3:.2f} ms")
    finally:
        with psycopg.connect(make_conninfo(a.server_dsn, dbname="postgres"), autocommit=True) as admin:
            admin.execute("DROP DATABASE IF EXISTS due_views WITH (FORCE)")


if __name__ == "__main__":
    main()
