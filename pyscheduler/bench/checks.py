"""``pyscheduler bench checks``: future checks at scale (docs/benchmarks.md, "Future checks").

N checks due in one slot (default 1,000,000), run by ``--runners`` CheckRunners sharing the
slot as shards, with a trivial SQL job, then with a trivial Python handler: seconds until all
are in the history. Then the server time of ``due_checks`` on a slot of ``--slot-size`` checks
as the table grows to each of ``--sizes`` rows (target: the largest within 1.2x of the
smallest). Rows go straight into pyscheduler.checks under entity_name 'pyscheduler-bench' and
are deleted after each part: run it on a scratch database (10M rows take minutes and ~3 GB).
"""

from __future__ import annotations

import statistics
import threading
import time
from datetime import datetime

import click

from ..config import dsn_option, require_dsn
from ..db import Database
from ..checks import sqlapi as sql
from . import sqlapi as bench_sql
from ..checks.runner import CheckRunner
from .stats import percentile
from .tasks import run_threads

ENTITY = "pyscheduler-bench"
TARGETS = {"sql_s": 60.0, "python_s": 120.0, "slot_ratio": 1.2}

def _clean(db: Database) -> None:
    with db.connection() as conn:
        conn.execute(bench_sql.CHECKS_CLEAN, (ENTITY,))
        conn.execute(bench_sql.CHECKS_CLEAN_HISTORY, (ENTITY,))
        conn.execute("VACUUM (ANALYZE) pyscheduler.checks")
        conn.execute("VACUUM (ANALYZE) pyscheduler.check_history")


def _fill(db: Database, first: int, last: int, slot: datetime, job: str, kind: str, spread: bool = False,
          chunk: int = 1_000_000, freeze: bool = False) -> None:
    res = db.call_one(sql.CHECK_SLOTS)["resolution"]
    with db.connection() as conn:
        for lo in range(first, last + 1, chunk):
            conn.execute(bench_sql.CHECKS_FILL, (ENTITY, job, kind, lo, min(last, lo + chunk - 1), slot, spread, res))
        conn.execute(f"VACUUM ({'FREEZE, ' if freeze else ''}ANALYZE) pyscheduler.checks")


def run_one_slot(dsn: str, db: Database, n: int, job: str, kind: str, runners: int, batch: int,
                 handlers: dict) -> dict:
    """n checks in the current slot; runners shard it; seconds until all are in the history."""
    _clean(db)
    slot = db.call_one(sql.CHECK_SLOTS)["slot"]
    _fill(db, 1, n, slot, job, kind)
    workers = [CheckRunner(dsn, handlers, shard=k, shards=runners, batch=batch) for k in range(runners)]

    def work(k: int, barrier: threading.Barrier) -> None:
        with Database(dsn, max_size=1) as own:
            barrier.wait()
            workers[k].run_slot(own, slot)

    elapsed = run_threads(runners, work)
    ended = db.query(bench_sql.CHECKS_DONE, (ENTITY,))[0]["n"]
    times = [t for w in workers for t in w.batch_seconds]
    phases: dict[str, float] = {}
    for w in workers:
        for k, v in w.seconds.items():
            phases[k] = phases.get(k, 0.0) + v
    _clean(db)
    return {"phases": phases, "n": n, "done": ended, "seconds": elapsed, "rate": n / elapsed,
            "batch_p50_ms": 1000 * percentile(times, 50), "batch_p99_ms": 1000 * percentile(times, 99)}


def slot_selection(db: Database, sizes: list[int], slot_size: int, repeat: int, echo) -> list[dict]:
    """Time due_checks on a slot of slot_size checks as the table grows to each size."""
    _clean(db)
    slot = db.call_one(sql.CHECK_SLOTS)["slot"]
    _fill(db, 1, slot_size, slot, "pyscheduler_bench.noop", "sql", freeze=True)
    have = slot_size
    out = []
    for size in sorted(sizes):
        if size > have:
            t0 = time.perf_counter()
            _fill(db, have + 1, size, slot, "pyscheduler_bench.noop", "sql", spread=True, freeze=True)
            echo(f"  table grown to {size:,} rows in {time.perf_counter() - t0:.1f} s")
            have = size
        times = []
        with db.connection() as conn:
            for i in range(repeat + 20):  # the first 20: warm-up, not counted
                with conn.transaction(force_rollback=True):
                    plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + bench_sql.CHECKS_DUE,
                                        (slot, slot_size)).fetchone()
                if i >= 20:
                    times.append(next(iter(plan.values()))[0]["Execution Time"] / 1000)
        out.append({"rows": size, "median_ms": 1000 * statistics.median(times),
                    "p10_ms": 1000 * percentile(times, 10), "p99_ms": 1000 * percentile(times, 99)})
        echo(f"  {size:>12,} rows: due_checks of {slot_size:,} checks (server time) p10 {out[-1]['p10_ms']:.2f} ms, "
             f"median {out[-1]['median_ms']:.2f} ms, p99 {out[-1]['p99_ms']:.2f} ms")
    _clean(db)
    return out


def _phases(r: dict) -> str:
    total = sum(r["phases"].values()) or 1.0
    return "    runner time: " + ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in r["phases"].items())


@click.command("checks")
@dsn_option
@click.option("--checks", "n", type=click.IntRange(1), default=1_000_000, show_default=True,
              help="Checks due in the one slot (SQL and Python runs).")
@click.option("--runners", type=click.IntRange(1), default=2, show_default=True,
              help="Runners sharing the slot (shards), one connection each.")
@click.option("--batch", type=click.IntRange(1), default=1000, show_default=True)
@click.option("--sizes", default="10000,100000,1000000,10000000", show_default=True,
              help="Table sizes for the slot-selection measurement (comma-separated; empty: skip).")
@click.option("--slot-size", type=click.IntRange(1), default=1000, show_default=True)
@click.option("--repeat", type=click.IntRange(1), default=200, show_default=True)
@click.option("--skip", multiple=True, type=click.Choice(["sql", "python", "slots"]), help="Leave a part out.")
def bench(dsn, n, runners, batch, sizes, slot_size, repeat, skip) -> None:
    """Future checks: 1M checks of one slot (SQL job, Python handler) and slot selection vs table size."""
    dsn = require_dsn(dsn)
    with Database(dsn, max_size=2) as db:
        with db.connection() as conn:
            conn.execute(bench_sql.NOOP_CHECK_JOB)
        click.echo(f"future checks: {n:,} checks in one slot, {runners} runner(s), batch {batch}")
        if "sql" not in skip:
            r = run_one_slot(dsn, db, n, "pyscheduler_bench.noop", "sql", runners, batch, {})
            click.echo(f"  SQL job:        {r['seconds']:.1f} s ({r['rate']:,.0f} checks/s; {r['done']:,} done; "
                       f"batch p50 {r['batch_p50_ms']:.0f} ms, p99 {r['batch_p99_ms']:.0f} ms) "
                       f"target <= {TARGETS['sql_s'] * n / 1_000_000:.0f} s")
            click.echo(_phases(r))
        if "python" not in skip:
            r = run_one_slot(dsn, db, n, "noop", "python", runners, batch, {"noop": lambda check: None})
            click.echo(f"  Python handler: {r['seconds']:.1f} s ({r['rate']:,.0f} checks/s; {r['done']:,} done; "
                       f"batch p50 {r['batch_p50_ms']:.0f} ms, p99 {r['batch_p99_ms']:.0f} ms) "
                       f"target <= {TARGETS['python_s'] * n / 1_000_000:.0f} s")
            click.echo(_phases(r))
        wanted = [int(s) for s in sizes.split(",") if s.strip()]
        if "slots" not in skip and wanted:
            click.echo(f"slot selection: one slot of {slot_size:,} checks, {repeat} runs per table size")
            rows = slot_selection(db, wanted, slot_size, repeat, click.echo)
            click.echo(f"  {rows[-1]['rows']:,} rows / {rows[0]['rows']:,} rows: "
                       f"p10 {rows[-1]['p10_ms'] / rows[0]['p10_ms']:.2f}x, "
                       f"median {rows[-1]['median_ms'] / rows[0]['median_ms']:.2f}x "
                       f"(target <= {TARGETS['slot_ratio']}x)")
