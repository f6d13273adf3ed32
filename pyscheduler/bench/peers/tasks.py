"""The job-queue part of ``pyscheduler bench peers``: each system in turn, over rounds.

Every system runs as a separate process (a runner, see runner.py for the
protocol) in a fresh database of the same server, one system after another,
the order rotated each round so no system always runs first or last.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import click

PEERS_DIR = Path(__file__).resolve().parents[3] / "bench" / "peers"


# The runs of the job-queue part (runner.py's SCENARIOS): what the jobs do.
SCENARIOS = {"noop": "no-op jobs", "fail": "10 % of jobs fail once and retry",
             "delay": "50 % of jobs delayed 1 s"}
ALL_SCENARIOS = frozenset(SCENARIOS)


@dataclass(frozen=True)
class System:
    key: str
    name: str
    argv: Callable[[], list[str]]  # the runner, before the protocol's arguments
    ours: bool = False  # pyscheduler (ratios are ours / peer)
    missing: Callable[[], str | None] = lambda: None  # why it cannot run here, or None
    jobs_divisor: int = 1  # runs N / jobs_divisor jobs (procrastinate: a few hundred jobs/s)
    scenarios: frozenset[str] = frozenset({"noop"})  # the runs it takes part in


def _ours(key: str) -> Callable[[], list[str]]:
    return lambda: [sys.executable, "-m", "pyscheduler.bench.peers.runner", key]


def _async_worker_missing() -> str | None:
    from ... import tasks

    return None if hasattr(tasks, "AsyncWorker") else "not built yet (issue 10, item 2)"


def _procrastinate_missing() -> str | None:
    if importlib.util.find_spec("procrastinate") is None:
        return "procrastinate is not installed: pip install 'pyscheduler[bench]'"
    return None


def _node_missing() -> str | None:
    if shutil.which("node") is None:
        return "Node.js (node) is not on PATH"
    return None


SYSTEMS = [
    System("worker", "pyscheduler Worker", _ours("worker"), ours=True, scenarios=ALL_SCENARIOS),
    # The asyncio flavour's slot: it runs as soon as pyscheduler.tasks.worker has an AsyncWorker
    # (and runner.worker_async_system drives it).
    System("worker-async", "pyscheduler Worker (async)", _ours("worker-async"), ours=True,
           missing=_async_worker_missing, scenarios=ALL_SCENARIOS),
    System("batch", "pyscheduler batch SQL", _ours("batch"), ours=True, scenarios=ALL_SCENARIOS),
    System("procrastinate", "procrastinate", lambda: [sys.executable, str(PEERS_DIR / "procrastinate_peer.py")],
           missing=_procrastinate_missing, jobs_divisor=20),
    # graphile-worker, the fastest peer, is the one each failure and delay run is compared with
    System("graphile-worker", "graphile-worker", lambda: ["node", str(PEERS_DIR / "graphile_worker.js")],
           missing=_node_missing, scenarios=ALL_SCENARIOS),
    System("pg-boss", "pg-boss", lambda: ["node", str(PEERS_DIR / "pg_boss.js")], missing=_node_missing),
]


def ensure_node_modules(echo: Callable[[str], None]) -> None:
    """``npm ci --prefix bench/peers`` when its node_modules is missing (package-lock.json pins the peers)."""
    if (PEERS_DIR / "node_modules").is_dir():
        return
    npm = shutil.which("npm")
    if npm is None:
        raise click.ClickException("npm is not on PATH: the Node.js peers cannot be installed")
    echo(f"installing the Node.js peers: npm ci --prefix {PEERS_DIR}")
    out = subprocess.run([npm, "ci", "--prefix", str(PEERS_DIR), "--no-audit", "--no-fund"],
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise click.ClickException(f"npm ci failed: {out.stderr.strip()[-2000:]}")


def database_uri(dsn: str, dbname: str) -> str:
    """A postgresql:// URI for ``dbname`` on ``dsn``'s server (node-postgres reads no key=value strings)."""
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(dsn)
    host, port = params.get("host") or "127.0.0.1", params.get("port") or "5432"
    auth = quote(params.get("user") or "", safe="") + (
        ":" + quote(params["password"], safe="") if params.get("password") else "")
    where = f"{host}:{port}/{dbname}" if not host.startswith("/") else f"/{dbname}?host={quote(host)}&port={port}"
    return f"postgresql://{auth}@{where}"


@contextlib.contextmanager
def scratch_database(dsn: str, name: str) -> Iterator[str]:
    """A new empty database on ``dsn``'s server, dropped afterwards; yields its URI. A
    CHECKPOINT first (where the role may: superuser or pg_checkpoint), so that no run starts with
    the WAL of the runs before it due for a checkpoint: one in the middle of a run (every page's
    first write after it logged whole) fell on whichever system ran then."""
    import psycopg
    from psycopg import sql

    def run(statement: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL(statement).format(sql.Identifier(name)))

    run("DROP DATABASE IF EXISTS {} WITH (FORCE)")
    run("CREATE DATABASE {}")
    try:
        run("CHECKPOINT")
    except psycopg.errors.InsufficientPrivilege:
        pass
    try:
        yield database_uri(dsn, name)
    finally:
        run("DROP DATABASE IF EXISTS {} WITH (FORCE)")


@dataclass
class Params:
    jobs: int
    concurrency: int
    samples: int
    gap_ms: float
    max_seconds: float


def run_system(dsn: str, system: System, p: Params, scenario: str = "noop") -> dict:
    """One run of one system in a fresh database; the runner's JSON plus the rates."""
    jobs = max(1, p.jobs // system.jobs_divisor)
    with scratch_database(dsn, f"pyscheduler_peers_{system.key.replace('-', '_')}_{os.getpid()}") as uri:
        argv = system.argv() + [uri, str(jobs), str(p.concurrency), str(p.samples), f"{p.gap_ms:g}",
                                f"{p.max_seconds:g}", scenario]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=p.max_seconds + 300,
                             cwd=PEERS_DIR, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if out.returncode != 0:
        raise click.ClickException(f"{system.name} failed (exit {out.returncode}): {out.stderr.strip()[-2000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["enqueue_rate"] = result["jobs"] / result["enqueue_s"]
    result["rate"] = result["completed"] / result["work_s"]
    result["capped"] = result["completed"] < result["jobs"]
    result["scenario"] = scenario
    return result


def run_rounds(dsn: str, systems: list[System], p: Params, rounds: int, echo: Callable[[str], None],
               scenarios: tuple[str, ...] = ("noop",)) -> dict[str, dict[str, list[dict]]]:
    """{scenario: {system key: [result of each round]}} for the systems that take part in each
    scenario; each round runs every scenario in turn, the systems' order rotating by one each round."""
    results: dict[str, dict[str, list[dict]]] = {
        sc: {s.key: [] for s in systems if sc in s.scenarios} for sc in scenarios}
    for r in range(rounds):
        for scenario in scenarios:
            those = [s for s in systems if scenario in s.scenarios]
            order = those[r % len(those):] + those[:r % len(those)] if those else []
            for system in order:
                res = run_system(dsn, system, p, scenario)
                results[scenario][system.key].append(res)
                echo(f"round {r + 1}/{rounds} {SCENARIOS[scenario]}, {system.name}: "
                     f"enqueue {res['enqueue_rate']:,.0f} jobs/s, {res['completed']:,} of {res['jobs']:,} jobs in "
                     f"{res['work_s']:.2f}s = {res['rate']:,.0f} jobs/s{' (capped)' if res['capped'] else ''}")
    return results
