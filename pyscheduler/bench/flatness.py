"""``pyscheduler bench flatness``: what each hot path and each read path costs with little and
with much stored work (docs/benchmarks.md, "Flatness"). Owns the command: the two databases
(SMALL and LARGE stored items a capability, made or reused, ``--keep``), the measuring rounds
(sizes interleaved), and the report of the ratios large/small against the targets (a read
path <= READ_MS and <= READ_RATIO, a hot path <= HOT_RATIO). What each capability stores and
measures: flatness_sections.py."""

from __future__ import annotations

import os
import statistics
import time
from contextlib import ExitStack

import click
import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ..config import dsn_option
from .flatness_sections import SECTIONS, SHAPES, Backend, Result, Section, time_measure

SMALL = {"delay": 10_000, "schedules": 10_000, "checks": 10_000, "tasks": 10_000}
LARGE = {"delay": 10_000_000, "schedules": 5_000_000, "checks": 10_000_000, "tasks": 10_000_000}
READ_MS, READ_RATIO, HOT_RATIO = 50.0, 1.5, 1.2


# ---------------------------------------------------------------- databases

def _admin_dsn(dsn: str) -> str:
    return make_conninfo(dsn, dbname="postgres")


def _ensure_database(echo, server_dsn: str, name: str, sizes: dict[str, int], sections: list[str],
                     migrate_it: bool) -> tuple[str, bool]:
    """The database for one size: reused when its build marker says it holds these sizes, else
    made anew. Returns its DSN and whether it must be built."""
    from .. import migrate

    dsn = make_conninfo(server_dsn, dbname=name)
    with psycopg.connect(_admin_dsn(server_dsn), autocommit=True) as admin:
        exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
    if exists:
        with psycopg.connect(dsn, autocommit=True) as c:
            built = c.execute("SELECT to_regclass('public.flat_bench_build') IS NOT NULL").fetchone()[0] and dict(
                c.execute("SELECT section, n FROM public.flat_bench_build").fetchall())
        if built and all(built.get(s) == sizes[s] for s in sections):
            if migrate_it:
                migrate.migrate(dsn)
            echo(f"{name}: reusing the database built before ({', '.join(f'{s} {sizes[s]:,}' for s in sections)})")
            return dsn, False
        with psycopg.connect(_admin_dsn(server_dsn), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    with psycopg.connect(_admin_dsn(server_dsn), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    if migrate_it:
        migrate.migrate(dsn)
    return dsn, True


def _build(echo, dsn: str, sections: list[Section]) -> None:
    b = Backend(dsn)
    try:
        b.q("CREATE TABLE IF NOT EXISTS public.flat_bench_build (section text PRIMARY KEY, n bigint NOT NULL)")
        for s in sections:
            started = time.perf_counter()
            s.build(b, echo)
            built = time.perf_counter() - started
            b.q("VACUUM (ANALYZE)")
            echo(f"  {s.name}: {s.n:,} stored, written in {built:.0f} s, VACUUM ANALYZE "
                 f"{time.perf_counter() - started - built:.0f} s")
            b.q("INSERT INTO public.flat_bench_build VALUES (%s, %s) ON CONFLICT (section) DO UPDATE SET n = "
                "excluded.n", (s.name, s.n))
    finally:
        b.close()


def _fmt(seconds: float | None, kind: str) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e6:,.1f} us" if kind == "hot" else f"{seconds * 1e3:,.2f} ms"


@click.command("flatness")
@dsn_option
@click.option("--scale", type=click.FloatRange(min=0.0001), default=1.0, show_default=True,
              help="Multiply the large sizes (10M delay messages, 5M schedules, 10M checks, 10M tasks) by this.")
@click.option("--sections", default=",".join(n for n in SECTIONS if n not in SHAPES), show_default=True,
              help="Comma-separated capabilities to build and measure, or shapes of issue 34 (one a capability: "
                   + ", ".join(SHAPES) + ").")
@click.option("--sizes", type=click.Choice(["both", "small", "large"]), default="both", show_default=True)
@click.option("--rounds", type=click.IntRange(1), default=3, show_default=True,
              help="Measuring rounds; each measures every path at each size, sizes interleaved.")
@click.option("--only", type=click.Choice(["all", "hot", "read"]), default="all", show_default=True)
@click.option("--keep", is_flag=True, help="Keep the databases (a later run with the same sizes reuses them).")
@click.option("--no-migrate", is_flag=True,
              help="Use the functions the databases have (e.g. migrated by another version); hot paths only.")
def bench(dsn, scale, sections, sizes, rounds, only, keep, no_migrate) -> None:
    """The cost of each hot path and read path at a small and a large stored size, and the ratios."""
    from ..embedded import Postgres

    echo = click.echo
    names = [s.strip() for s in sections.split(",") if s.strip()]
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        raise click.BadParameter(f"unknown section(s) {', '.join(unknown)}; known: {', '.join(SECTIONS)}",
                                 param_hint="--sections")
    if len({n.split("-")[0] for n in names}) < len(names):  # one tasks table per database
        raise click.BadParameter("one section per capability a run (a shape stores its capability's tables)",
                                 param_hint="--sections")
    if no_migrate and only == "all":
        only = "hot"
    wanted = {"both": ["small", "large"], "small": ["small"], "large": ["large"]}[sizes]
    # a shape (tasks-quiet, ...) has its capability's sizes
    size_of = {"small": {n: SMALL[n.split("-")[0]] for n in names},
               "large": {n: max(SMALL[n.split("-")[0]], int(LARGE[n.split("-")[0]] * scale)) for n in names}}
    with ExitStack() as stack:
        if not dsn:
            import tempfile
            from pathlib import Path

            workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="pyscheduler-flat-"))
            echo("starting an embedded PostgreSQL (pass --dsn to use a server of your own) ...")
            pg = Postgres(Path(workdir) / "postgres").start()
            stack.callback(pg.stop)
            dsn = pg.dsn()
        base = conninfo_to_dict(dsn).get("dbname") or "postgres"
        dbs: dict[str, str] = {}
        for size in wanted:
            name = f"{base}_flat_{size}"
            db_dsn, build = _ensure_database(echo, dsn, name, size_of[size], names, not no_migrate)
            if build:
                echo(f"{name}: building ...")
                _build(echo, db_dsn, [SECTIONS[n](size_of[size][n]) for n in names])
            if not keep:
                stack.callback(_drop, dsn, name)
            dbs[size] = db_dsn
        backends = {size: Backend(d) for size, d in dbs.items()}
        for b in backends.values():
            stack.callback(b.close)
        parts = {size: [SECTIONS[n](size_of[size][n]) for n in names] for size in wanted}
        for size in wanted:
            for s in parts[size]:
                s.prepare(backends[size])
        results: dict[tuple[str, str, str], Result] = {}
        kinds: dict[tuple[str, str], str] = {}
        load0 = os.getloadavg()[0]
        started = time.perf_counter()
        for r in range(rounds):
            echo(f"round {r + 1} of {rounds} ...")
            for size in (wanted if r % 2 == 0 else list(reversed(wanted))):
                for s in parts[size]:
                    for m in s.measures():
                        if only != "all" and m.kind != only:
                            continue
                        kinds[(s.name, m.name)] = m.kind
                        time_measure(backends[size], m, results.setdefault((s.name, m.name, size), Result()))
        load1 = os.getloadavg()[0]
        echo(f"\nmeasured in {time.perf_counter() - started:.0f} s, load average {load0:.2f} at the start, "
             f"{load1:.2f} at the end ({os.cpu_count()} cores)")
        sizes_line = "; ".join(f"{size}: " + ", ".join(f"{n} {size_of[size][n]:,}" for n in names) for size in wanted)
        echo(f"stored: {sizes_line}\n")
        _report(echo, results, kinds, wanted)


def _drop(server_dsn: str, name: str) -> None:
    with psycopg.connect(_admin_dsn(server_dsn), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _report(echo, results: dict, kinds: dict, wanted: list[str]) -> None:
    """One line per path: median wall time (and backend CPU) per call or item at each size, the
    ratio large/small of the wall times and of the CPU, and the verdict against the targets."""
    head = f"{'path':<78} {'small':>12} {'large':>12} {'ratio':>6} {'cpu ratio':>9}  verdict"
    echo(head)
    echo("-" * len(head))
    section = None
    for (sec, name), kind in kinds.items():
        if sec != section:
            echo(f"[{sec}]")
            section = sec
        med = {size: statistics.median(results[(sec, name, size)].wall) if results.get((sec, name, size)) and
               results[(sec, name, size)].wall else None for size in wanted}
        cpu = {size: statistics.median(results[(sec, name, size)].cpu) if results.get((sec, name, size)) and
               results[(sec, name, size)].cpu else None for size in wanted}
        small, large = med.get("small"), med.get("large")
        ratio = large / small if small and large else None
        cpu_ratio = cpu["large"] / cpu["small"] if cpu.get("small") and cpu.get("large") else None
        verdict = ""
        if kind == "read" and large is not None:
            ok = large * 1000 <= READ_MS and (ratio is None or ratio <= READ_RATIO)
            verdict = f"{'ok' if ok else 'MISSED'} (<= {READ_MS:.0f} ms, <= {READ_RATIO}x)"
        elif kind == "hot" and ratio is not None:
            verdict = f"{'ok' if ratio <= HOT_RATIO else 'MISSED'} (<= {HOT_RATIO}x)"
        echo(f"{kind + ' ' + name:<78} {_fmt(small, kind):>12} {_fmt(large, kind):>12} "
             f"{(f'{ratio:.2f}' if ratio else '-'):>6} {(f'{cpu_ratio:.2f}' if cpu_ratio else '-'):>9}  {verdict}")
