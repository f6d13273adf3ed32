"""A/B (issue 21): what an index on schedules.due_at would cost the Redis firing path
(fire_details + record_executions of 10,000 non-critical schedules, as in ``pyscheduler bench
flatness``): every firing changes due_at, so with the index its UPDATE is no longer HOT.
Interleaved none / index / index / none, four times; medians of wall and backend CPU per firing.

    python bench/schedules_due_index_ab.py DSN_OF_A_FLATNESS_DATABASE

DSN: a database built by ``pyscheduler bench flatness --keep`` (e.g. ``..._flat_small``); the
index is created and dropped by the script (it is not part of the schema).
"""
from __future__ import annotations

import statistics
import sys

from pyscheduler.flatness import Backend, Result, Schedules, _time


def main(dsn: str) -> None:
    b = Backend(dsn)
    m = next(x for x in Schedules(10_000).measures() if x.name.startswith("via Redis"))
    m.reps = 1
    res = {"none": Result(), "due_at index": Result()}
    for k in ["none", "due_at index", "due_at index", "none"] * 4:
        b.q("DROP INDEX IF EXISTS pyscheduler.schedules_due_at_ab")
        if k != "none":
            b.q("CREATE INDEX schedules_due_at_ab ON pyscheduler.schedules (due_at)")
        b.q("VACUUM pyscheduler.schedules")
        _time(b, m, res[k])
    b.q("DROP INDEX IF EXISTS pyscheduler.schedules_due_at_ab")
    for k, r in res.items():
        cpu = f"{statistics.median(r.cpu) * 1e6:.1f} us backend CPU" if r.cpu else "backend CPU not readable"
        print(f"{k:>14}: median {statistics.median(r.wall) * 1e6:.1f} us/firing wall, {cpu}  (n={len(r.wall)})")
    b.close()


if __name__ == "__main__":
    main(sys.argv[1])
