"""A/B: what the Redis firing path costs the database in two versions of the schema (e.g. before
and after a migration that changes the schedules' indexes): ``pyscheduler bench flatness``'s
path, fire_details + record_executions of 10,000 schedules, on databases A and B migrated by
the two versions and filled with the flatness bench's schedules when empty; A, B, B, A four
times; medians of wall time and backend CPU per firing, and each database's indexes.

    python -m pyscheduler.bench.schedules_firing_ab DSN_A DSN_B [--n 10000]
"""
from __future__ import annotations

import argparse
import statistics

from . import sqlapi as sql
from .flatness_sections import Backend, Result, Schedules, time_measure


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dsn_a")
    ap.add_argument("dsn_b")
    ap.add_argument("--n", type=int, default=10_000, help="stored schedules besides the fired ones")
    a = ap.parse_args()
    backends = {"A": Backend(a.dsn_a), "B": Backend(a.dsn_b)}
    for b in backends.values():
        if not b.one(sql.COUNT_SCHEDULES)["n"]:
            Schedules(a.n).build(b, print)
            b.q("VACUUM ANALYZE")
    m = next(x for x in Schedules(a.n).measures() if x.name.startswith("via Redis"))
    m.reps = 1
    res = {k: Result() for k in backends}
    for k in ["A", "B", "B", "A"] * 4:
        b = backends[k]
        b.q("VACUUM pyscheduler.schedules")
        time_measure(b, m, res[k])
    for k, r in res.items():
        indexes = [x["i"] for x in backends[k].q(
            "SELECT pg_get_indexdef(indexrelid) AS i FROM pg_index WHERE indrelid = 'pyscheduler.schedules'::regclass "
            "ORDER BY indexrelid::regclass::text")]
        cpu = f"{statistics.median(r.cpu) * 1e6:.1f} us backend CPU" if r.cpu else "backend CPU not readable"
        print(f"{k}: median {statistics.median(r.wall) * 1e6:.1f} us/firing wall, {cpu}  (n={len(r.wall)})")
        for i in indexes:
            print(f"   {i.replace('CREATE INDEX ', '').replace('CREATE UNIQUE INDEX ', 'unique ')}")
    for b in backends.values():
        b.close()


if __name__ == "__main__":
    main()
