"""Durable task functions against their peers, on one PostgreSQL in one run (docs/benchmarks.md,
"Durable task functions"): ``python -m pyscheduler.bench.durable [DSN] [--tasks 2000] ...``

A task of three no-op durable steps, end to end, through ``@app.task`` + ``ctx.step``, DBOS
Transact (a queued workflow of three ``@DBOS.step``) and Absurd's Python SDK (its schema from
absurdctl; peers: ``pip install 'pyscheduler[durable-peers]'``, skipped with a message when
missing), each on a fresh database of the same server (DSN's, else an embedded one), as many
handler threads each: tasks/s and the overhead of a step (the same tasks without steps, the
difference per step). Then the Worker's rate on a queue with and without ``--sleepers`` tasks
asleep (``--no-peers``: that part alone)."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
from psycopg import sql as pgsql

from ..migrate import migrate
from ..tasks import TaskApp, Worker, current_context
from . import sqlapi as sql

QUEUE = "durable-bench"
Run = Callable[[str, int, int, int], float]  # (dsn, tasks, steps, concurrency) -> seconds end to end


def fresh_database(admin_dsn: str, name: str) -> str:
    """A new empty database ``name`` on the server of ``admin_dsn`` (dropped first); its DSN."""
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        c.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))
        c.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    return psycopg.conninfo.make_conninfo(admin_dsn, dbname=name)


def wait_count(dsn: str, query: str, n: int, params: tuple = (), timeout: float = 600.0) -> None:
    """Until ``query`` (a count) answers at least ``n``."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as c:
        while c.execute(query, params).fetchone()[0] < n:  # type: ignore[index]
            if time.monotonic() > deadline:
                raise TimeoutError(f"fewer than {n} tasks done after {timeout:g} s")
            time.sleep(0.01)


# -- pyscheduler ------------------------------------------------------------------------------


def run_pyscheduler(dsn: str, tasks: int, steps: int, concurrency: int) -> float:
    app = TaskApp(dsn)

    @app.task(name="bench.durable", queue=QUEUE)
    def durable(steps: int) -> None:
        ctx = current_context()
        for s in range(steps):
            ctx.step(f"s{s}", noop)

    running = app.worker(capacity=concurrency).start()
    try:
        running.wait_idle()
        began = time.monotonic()
        for start in range(0, tasks, 1000):
            durable.submit_many([{"steps": steps}] * min(1000, tasks - start))
        wait_count(dsn, sql.COMPLETED_IN_QUEUE, tasks, (QUEUE,))
        elapsed = time.monotonic() - began
    finally:
        running.stop()
        app.close()
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(sql.DELETE_QUEUE, (QUEUE,))
    return elapsed


def noop() -> None:
    return None


# -- DBOS Transact ------------------------------------------------------------------------------


def url(dsn: str) -> str:
    """A libpq DSN as the URL DBOS takes (SQLAlchemy's, psycopg 3)."""
    from urllib.parse import quote

    p = psycopg.conninfo.conninfo_to_dict(dsn)
    auth = quote(str(p.get("user", "postgres"))) + (f":{quote(str(p['password']))}" if p.get("password") else "")
    return f"postgresql+psycopg://{auth}@{p.get('host', 'localhost')}:{p.get('port', 5432)}/{p['dbname']}"


def run_dbos(dsn: str, tasks: int, steps: int, concurrency: int) -> float:
    from dbos import DBOS

    DBOS(config={"name": "pyscheduler-bench", "system_database_url": url(dsn), "log_level": "WARNING"})

    @DBOS.step()
    def dbos_noop() -> None:
        return None

    @DBOS.workflow()
    def durable(n: int) -> None:
        for _ in range(n):
            dbos_noop()

    DBOS.launch()
    queue = DBOS.register_queue("bench", worker_concurrency=concurrency, polling_interval_sec=0.01)
    try:
        began = time.monotonic()
        for _ in range(tasks):
            queue.enqueue(durable, steps)
        wait_count(dsn, "SELECT count(*) FROM dbos.workflow_status WHERE status = 'SUCCESS'", tasks)
        elapsed = time.monotonic() - began
    finally:
        DBOS.destroy(destroy_registry=True)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DELETE FROM dbos.workflow_status")
    return elapsed


# -- Absurd -----------------------------------------------------------------------------------


def run_absurd(dsn: str, tasks: int, steps: int, concurrency: int) -> float:
    import threading

    from absurd_sdk import Absurd
    from absurdctl import BUNDLED_SCHEMA_SQL

    with psycopg.connect(dsn, autocommit=True) as c:
        if c.execute("SELECT to_regnamespace('absurd') IS NULL").fetchone()[0]:  # type: ignore[index]
            c.execute(BUNDLED_SCHEMA_SQL)  # type: ignore[arg-type]
    client = Absurd(dsn, queue_name="bench")
    client.create_queue("bench")

    @client.register_task(name="durable")
    def durable(params: dict, ctx) -> None:  # type: ignore[no-untyped-def]
        for s in range(params["steps"]):
            ctx.step(f"s{s}", noop)

    spawner = Absurd(dsn, queue_name="bench")
    spawner._registry = client._registry
    thread = threading.Thread(target=client.start_worker,
                              kwargs={"concurrency": concurrency, "poll_interval": 0.01}, daemon=True)
    thread.start()
    try:
        began = time.monotonic()
        for _ in range(tasks):
            spawner.spawn("durable", {"steps": steps})
        wait_count(dsn, "SELECT count(*) FROM absurd.t_bench WHERE state = 'completed'", tasks)
        elapsed = time.monotonic() - began
    finally:
        client.stop_worker()
        thread.join(30)
        client.close()
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT absurd.drop_queue('bench')")
    spawner.close()
    return elapsed


PEERS: dict[str, tuple[str, Run]] = {  # name -> (the module it needs, its run)
    "pyscheduler": ("pyscheduler", run_pyscheduler),
    "DBOS Transact": ("dbos", run_dbos),
    "Absurd": ("absurdctl", run_absurd),
}


def installed(module: str) -> bool:
    try:
        __import__(module)
        return True
    except ImportError:
        return False


def compare(admin_dsn: str, tasks: int, concurrency: int, rounds: int) -> dict[str, tuple[float, float]]:
    """Each system's (tasks/s with three steps, overhead of a step in ms): the medians of
    ``rounds`` rounds, the systems taking turns in each."""
    runs: dict[str, list[tuple[float, float]]] = {}
    dsns = {}
    for name, (module, _) in PEERS.items():
        if not installed(module):
            print(f"{name}: skipped, not installed (pip install 'pyscheduler[durable-peers]')", file=sys.stderr)
            continue
        dsns[name] = fresh_database(admin_dsn, "bench_durable_" + module)
        if module == "pyscheduler":
            migrate(dsns[name])
    for round_ in range(rounds):
        for name, dsn in dsns.items():
            run = PEERS[name][1]
            three = run(dsn, tasks, 3, concurrency)
            none = run(dsn, tasks, 0, concurrency)
            runs.setdefault(name, []).append((tasks / three, max(0.0, (three - none) / (3 * tasks)) * 1000))
            print(f"  round {round_ + 1}, {name}: {tasks / three:,.0f} tasks/s with 3 steps, "
                  f"{tasks / none:,.0f} with none", file=sys.stderr)
    return {name: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs))
            for name, rs in runs.items()}


# -- sleeping tasks and the Worker's rate ----------------------------------------------------------


def worker_rate(dsn: str, queue: str, tasks: int) -> float:
    """Plain no-op tasks/s of one Worker (capacity 4) on ``queue``, submitted ahead (then deleted
    and the table vacuumed, so every run starts alike)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(sql.SUBMIT_SERIES, {"queue": queue, "n": tasks})
    began = time.monotonic()
    running = Worker(dsn, queue, lambda ctx: None, capacity=4).start()
    try:
        wait_count(dsn, sql.COMPLETED_IN_QUEUE, tasks, (queue,))
        elapsed = time.monotonic() - began
    finally:
        running.stop()
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(sql.DELETE_COMPLETED, (queue,))
        c.execute("VACUUM (ANALYZE) pyscheduler.tasks")
    return tasks / elapsed


def sleepers_effect(dsn: str, tasks: int, sleepers: int, rounds: int) -> tuple[list[float], list[float]]:
    """The Worker's rate (tasks/s per round) on a queue without sleeping tasks and on one with
    ``sleepers`` tasks asleep for a day (sleep_task: scheduled, behind the scheduled index's one
    probe), the two queues taking turns on one table."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(sql.SUBMIT_SERIES, {"queue": QUEUE, "n": sleepers})
        c.execute(sql.SLEEP_ALL, {"queue": QUEUE, "n": sleepers})
        c.execute("VACUUM (ANALYZE) pyscheduler.tasks")
    without, with_ = [], []
    for _ in range(rounds):
        without.append(worker_rate(dsn, QUEUE + "-plain", tasks))
        with_.append(worker_rate(dsn, QUEUE, tasks))
        print(f"  Worker rate: {without[-1]:,.0f} tasks/s without, {with_[-1]:,.0f} with sleepers", file=sys.stderr)
    return without, with_


def peers_section(admin: str, args: argparse.Namespace) -> None:
    print(f"{args.tasks} tasks of 3 no-op steps, end to end, {args.concurrency} handler threads each, "
          f"median of {args.rounds} rounds:")
    results = compare(admin, args.tasks, args.concurrency, args.rounds)
    for name, (rate, per_step) in results.items():
        print(f"  {name:<14} {rate:>8,.0f} tasks/s   {per_step:.3f} ms a step")
    peers = [rate for name, (rate, _) in results.items() if name != "pyscheduler"]
    if peers and "pyscheduler" in results:
        print(f"  pyscheduler / the faster peer: {results['pyscheduler'][0] / max(peers):.2f}x (target >= 2x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dsn", nargs="?", help="a PostgreSQL server's DSN (a superuser's); default: an embedded one")
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sleepers", type=int, default=10_000)
    parser.add_argument("--no-peers", action="store_true", help="only the Worker's rate with sleeping tasks")
    args = parser.parse_args()
    server = None
    admin = args.dsn
    if admin is None:
        from ..embedded import Postgres

        server = Postgres(Path(tempfile.mkdtemp(prefix="pyscheduler-bench-durable-"))).start()
        admin = server.dsn()
    try:
        if not args.no_peers:
            peers_section(admin, args)
        ours = fresh_database(admin, "bench_durable_sleepers")
        migrate(ours)
        runs = sleepers_effect(ours, args.tasks * 5, args.sleepers, args.rounds)
        without, with_ = (statistics.median(r) for r in runs)
        print(f"Worker rate, plain tasks, median of {args.rounds}: {without:,.0f} tasks/s in a queue without "
              f"sleeping tasks ({min(runs[0]):,.0f}-{max(runs[0]):,.0f}), {with_:,.0f} in one with "
              f"{args.sleepers:,} asleep ({min(runs[1]):,.0f}-{max(runs[1]):,.0f}): "
              f"{(with_ / without - 1) * 100:+.1f} %")
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
