"""A/B (issue 21): what schedules.due_hour (due_at binned to the hour, stored, indexed by
schedules_due_hour_idx: what schedules_due_soon and schedules_late read) costs the Redis firing
path: fire_details + record_executions of 10,000 non-critical schedules every 1 s, as in
``pyscheduler bench flatness`` (their next run stays in the hour: the update stays HOT). Two
databases, A migrated without the column (e.g. by the checkout before migration 0021) and B with
it, each filled with the flatness bench's schedules; interleaved A, B, B, A, four times;
medians of wall time and backend CPU per firing.

    python bench/schedules_due_hour_ab.py DSN_A DSN_B [--n 10000]
"""
from __future__ import annotations

import argparse
import statistics

from pyscheduler.flatness import Backend, Result, Schedules, _time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dsn_a")
    ap.add_argument("dsn_b")
    ap.add_argument("--n", type=int, default=10_000, help="stored schedules besides the fired ones")
    a = ap.parse_args()
    backends = {"A": Backend(a.dsn_a), "B": Backend(a.dsn_b)}
    for b in backends.values():
        if not b.one("SELECT count(*) AS n FROM pyscheduler.schedules")["n"]:
            Schedules(a.n).build(b, print)
            b.q("VACUUM ANALYZE")
    m = next(x for x in Schedules(a.n).measures() if x.name.startswith("via Redis"))
    m.reps = 1
    res = {k: Result() for k in backends}
    for k in ["A", "B", "B", "A"] * 4:
        b = backends[k]
        b.q("VACUUM pyscheduler.schedules")
        _time(b, m, res[k])
    for k, r in res.items():
        col = backends[k].one("SELECT count(*) AS n FROM pg_attribute WHERE attrelid = 'pyscheduler.schedules'::regclass "
                              "AND attname = 'due_hour'")["n"]
        cpu = f"{statistics.median(r.cpu) * 1e6:.1f} us backend CPU" if r.cpu else "backend CPU not readable"
        print(f"{k} ({'with' if col else 'without'} due_hour): median {statistics.median(r.wall) * 1e6:.1f} us/firing "
              f"wall, {cpu}  (n={len(r.wall)})")
    for b in backends.values():
        b.close()


if __name__ == "__main__":
    main()
