"""The schedules' due views with many schedules that fire more often than hourly (issue 21,
migration 0023): N schedules every minute, all due within the next minute and none late (a
healthy deployment of the seed's workload), then the median of 5 calls of each view.

    python bench/schedules_due_views.py SERVER_DSN [--n 200000]

A database ``due_views`` is made anew on that server and migrated by the pyscheduler on
PYTHONPATH (run it from two checkouts to compare); it is dropped at the end.
"""
from __future__ import annotations

import argparse
import statistics
import time

import psycopg
from psycopg.conninfo import make_conninfo

from .. import migrate

READS = ["SELECT * FROM pyscheduler.schedules_late LIMIT 100", "SELECT pyscheduler.schedules_late_count()",
         "SELECT * FROM pyscheduler.schedules_due_soon LIMIT 100"]


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
            first = c.execute("SELECT (pyscheduler.create_schedule(name => 't', every => '1 minute', target_kind => "
                              "'kafka', target => 'x') ->> 'id')::bigint").fetchone()[0]
            cols = [r[0] for r in c.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = 'pyscheduler.schedules'::regclass AND attnum > 0 "
                "AND NOT attisdropped AND attgenerated = '' AND attidentity = '' "
                "AND attname NOT IN ('name', 'next_run_at')").fetchall()]
            c.execute(f"INSERT INTO pyscheduler.schedules (name, next_run_at, {', '.join(cols)}) "
                      f"SELECT 'f-' || i, now() + interval '15 seconds' + (i %% 45) * interval '1 second', "
                      f"{', '.join('t.' + x for x in cols)} FROM pyscheduler.schedules t, "
                      "generate_series(1, %s) i WHERE t.id = %s", (a.n, first))
            c.execute("DELETE FROM pyscheduler.schedules WHERE id = %s", (first,))
            c.execute("VACUUM ANALYZE pyscheduler.schedules")
            for q in READS:
                took = []
                for _ in range(5):
                    t0 = time.perf_counter()
                    c.execute(q).fetchall()
                    took.append(time.perf_counter() - t0)
                late = c.execute("SELECT count(*) FROM pyscheduler.schedules "
                                 "WHERE due_at < now() - interval '10 seconds'").fetchone()[0]
                print(f"{a.n:,} schedules every minute, {late} late: {q}: median {statistics.median(took) * 1e3:.2f} ms")
    finally:
        with psycopg.connect(make_conninfo(a.server_dsn, dbname="postgres"), autocommit=True) as admin:
            admin.execute("DROP DATABASE IF EXISTS due_views WITH (FORCE)")


if __name__ == "__main__":
    main()
