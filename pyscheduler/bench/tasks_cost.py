"""What a task costs the database: per-task CPU of the server's backends (and of the worker's
Python), from /proc, so the figures hold on a loaded machine where rates do not.

    python -m pyscheduler.bench.tasks_cost MODE "$DSN" [--tasks 50000] [--batch 500] [--finished 0]

On the database server's machine, a migrated scratch database of a server of its own (the
whole server's CPU is reported too). The modes (MODES) add their tasks to queue 'cost' (graphile:
table cost_gjobs). docs/benchmarks.md, "What a task costs the database"."""

from __future__ import annotations

import argparse
import os
import threading
import time

import psycopg

from . import sqlapi as sql, stats
from .stats import process_cpu

COST = {"queue": "cost", "worker": "cost-1"}  # the measured runs' queue and worker


def server_cpu(backend_pid: int) -> float:
    """CPU seconds of the whole server of a backend (its postmaster's stats.server_cpu)."""
    return stats.server_cpu(stats.parent(backend_pid))


def finish_ahead(dsn: str, n: int) -> None:
    """n finished tasks in queue 'cost-done' (unmeasured): the retention period's tasks."""
    if not n:
        return
    with psycopg.connect(dsn, autocommit=True) as c:
        done = {"queue": "cost-done", "worker": "cost-0"}
        c.execute(sql.SUBMIT_SERIES, {"n": n, **done})
        while rows := c.execute(sql.LEASE_LEAN, {"b": 5000, **done}).fetchall():
            c.execute(sql.COMPLETE_LEASED_BINARY, {"rns": [r[0] for r in rows], "tokens": [r[1] for r in rows]})
        c.execute("VACUUM ANALYZE")


GJOBS = """DROP TABLE IF EXISTS cost_gjobs;
CREATE TABLE cost_gjobs (id bigserial PRIMARY KEY, queue text NOT NULL, payload jsonb NOT NULL,
    priority int NOT NULL DEFAULT 0, run_at timestamptz NOT NULL DEFAULT now(), attempts int NOT NULL DEFAULT 0,
    locked_at timestamptz, locked_by text, created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    is_available boolean GENERATED ALWAYS AS (locked_at IS NULL AND attempts < 25) STORED);
CREATE INDEX ON cost_gjobs (priority, run_at) INCLUDE (id, queue) WHERE is_available"""

STATEMENTS = {
    "sql": (sql.SUBMIT_SERIES, sql.LEASE_LEAN, sql.COMPLETE_LEASED_BINARY),  # with COST
    "graphile": ("INSERT INTO cost_gjobs (queue, payload) SELECT 'cost', jsonb_build_object('i', i)"
                 " FROM generate_series(1, %(n)s) i",
                 "UPDATE cost_gjobs SET attempts = cost_gjobs.attempts + 1, locked_by = 'cost-1', locked_at = now()"
                 " WHERE id = ANY (ARRAY(SELECT id FROM cost_gjobs WHERE is_available AND run_at <= now()"
                 " ORDER BY priority, run_at LIMIT %(b)s FOR UPDATE SKIP LOCKED)) RETURNING id, locked_by",
                 "DELETE FROM cost_gjobs WHERE id = ANY (%(rns)b)"),
}


def sql_cost(dsn: str, mode: str, tasks: int, batch: int, finished: int = 0) -> str:
    fill, lease, complete = STATEMENTS[mode]
    if mode == "sql":
        finish_ahead(dsn, finished)
    with psycopg.connect(dsn, autocommit=True) as a, psycopg.connect(dsn, autocommit=True) as c:
        for conn in (a, c):
            conn.execute("SET synchronous_commit = off")  # backend CPU, not the WAL flush wait
        if mode == "graphile":
            a.execute(GJOBS)
        a.execute(fill, {"n": tasks, **COST})
        a.execute("VACUUM ANALYZE")
        lease_cpu = complete_cpu = 0.0
        done, started, server0 = 0, time.perf_counter(), server_cpu(a.info.backend_pid)
        while True:
            before = process_cpu(a.info.backend_pid)
            rows = a.execute(lease, {"b": batch, **COST}).fetchall()
            lease_cpu += process_cpu(a.info.backend_pid) - before
            if not rows:
                break
            before = process_cpu(c.info.backend_pid)
            c.execute(complete, {"rns": [r[0] for r in rows], "tokens": [r[1] for r in rows]})
            complete_cpu += process_cpu(c.info.backend_pid) - before
            done += len(rows)
        wall, server = time.perf_counter() - started, server_cpu(a.info.backend_pid) - server0
    return (f"{mode}: {done:,} tasks in batches of {batch}: backend CPU lease {lease_cpu / done * 1e6:.1f} us/task,"
            f" complete {complete_cpu / done * 1e6:.1f} us/task, total {(lease_cpu + complete_cpu) / done * 1e6:.1f}"
            f" us/task, server {server / done * 1e6:.1f} us/task ({done / wall:,.0f} tasks/s)")


def single_cost(dsn: str, tasks: int, finished: int = 0) -> str:
    """The single-task path: lease_task, then complete_task, one call each, one connection."""
    finish_ahead(dsn, finished)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(sql.SUBMIT_SERIES, {"n": tasks, **COST})
        c.execute("VACUUM ANALYZE")
        pid, lease_cpu, complete_cpu = c.info.backend_pid, 0.0, 0.0
        for _ in range(tasks):
            before = process_cpu(pid)
            task = c.execute(sql.LEASE_ONE, (COST["queue"], COST["worker"])).fetchone()[0]
            lease_cpu += process_cpu(pid) - before
            before = process_cpu(pid)
            c.execute(sql.COMPLETE_ONE, (task["rn"], task["token"]))
            complete_cpu += process_cpu(pid) - before
    return (f"single: {tasks:,} tasks: backend CPU lease_task {lease_cpu / tasks * 1e6:.0f} us,"
            f" complete_task {complete_cpu / tasks * 1e6:.0f} us per call")


def delayed_cost(dsn: str, tasks: int, batch: int) -> str:
    """Submitting tasks for later: submit_tasks(run_in => 1 hour) in batches, one connection (the
    index entries a scheduled task writes)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(sql.SUBMIT_LATER, ("cost-delayed", 1))  # plans cached before the measure
        pid = c.info.backend_pid
        before = process_cpu(pid)
        for _ in range(tasks // batch):
            c.execute(sql.SUBMIT_LATER, ("cost-delayed", batch))
        spent = process_cpu(pid) - before
    return (f"delayed: {tasks // batch * batch:,} tasks in batches of {batch}: "
            f"backend CPU submit {spent / tasks * 1e6:.1f} us/task")


def submit_cost(dsn: str, tasks: int) -> str:
    """Submitting: one submit_task a call (3,000 at most), submit_tasks of 1,000 specs built in
    Python, then submit_tasks_lean of as many: one spec a call, 1,000 a call, delayed (run_in
    1 hour), with a new unique key each. One connection, the queue emptied after."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(sql.SUBMIT_ONE, ("cost-submit", "{}"))  # plans cached
        c.execute(sql.SUBMIT_LEAN, ("cost-submit", "[{}]", None, None))
        pid = c.info.backend_pid
        single = min(tasks, 3000)

        def cpu(n: int, statement, args) -> float:
            before = process_cpu(pid)
            for k in range(n):
                c.execute(statement, args(k))
            return process_cpu(pid) - before

        one = cpu(single, sql.SUBMIT_ONE, lambda i: ("cost-submit", f'{{"i": {i}}}')) / single
        lean_one = cpu(single, sql.SUBMIT_LEAN, lambda i: ("cost-submit", f'[{{"i": {i}}}]', None, None)) / single
        specs = "[" + ",".join(f'{{"i": {i}}}' for i in range(1000)) + "]"
        calls = tasks // 1000
        per_task = {
            "submit_tasks": cpu(calls, sql.SUBMIT_MANY, lambda _: ("cost-submit", specs)),
            "lean": cpu(calls, sql.SUBMIT_LEAN, lambda _: ("cost-submit", specs, None, None)),
            "lean delayed": cpu(calls, sql.SUBMIT_LEAN, lambda _: ("cost-submit", specs, "1 hour", None)),
            "lean unique keys": cpu(calls, sql.SUBMIT_LEAN, lambda k: (
                "cost-submit", specs, None, [f"k{k}-{i}" for i in range(1000)])),
        }
        c.execute(sql.DELETE_QUEUE, ("cost-submit",))
        c.execute(sql.TASK_COUNT_ALL)
    many = ", ".join(f"{name} {spent / (calls * 1000) * 1e6:.1f}" for name, spent in per_task.items())
    return (f"submit: backend CPU per call of one: submit_task {one * 1e6:.1f} us, submit_tasks_lean "
            f"{lean_one * 1e6:.1f} us ({single:,} calls each); per task in calls of 1,000 ({calls * 1000:,} "
            f"tasks each): {many} us")


def vacuum_cost(dsn: str, finished: int) -> str:
    """What a VACUUM of the tasks table costs after 2,000 leases and completions (autovacuum's
    threshold), with a retention period's finished tasks kept (--finished), three times."""
    finish_ahead(dsn, finished)
    fill, lease, complete = STATEMENTS["sql"]
    passes = []
    with psycopg.connect(dsn, autocommit=True) as c:
        for _ in range(3):
            c.execute(fill, {"n": 2000, **COST})
            rows = c.execute(lease, {"b": 2000, **COST}).fetchall()
            c.execute(complete, {"rns": [r[0] for r in rows], "tokens": [r[1] for r in rows]})
            before = process_cpu(c.info.backend_pid)
            c.execute("VACUUM pyscheduler.tasks")
            passes.append(f"{(process_cpu(c.info.backend_pid) - before) * 1000:.0f} ms")
    return f"vacuum: VACUUM pyscheduler.tasks after 2,000 tasks, {finished:,} finished kept: {', '.join(passes)} CPU"


def worker_cost(dsn: str, tasks: int, finished: int = 0, mode: str = "worker") -> str:
    """One Worker, capacity 10, on a no-op handler; ``spec``: the handler reads its spec, as a
    handler unpacking its arguments does; ``app``: the same Worker through a task function
    (TaskApp.worker dispatching the spec {"task", "args"} by name)."""
    from ..db import Database
    from ..tasks import Worker
    from .tasks import submit_bulk

    finish_ahead(dsn, finished)
    lock, finished, count = threading.Lock(), threading.Event(), [0]

    def handle(ctx) -> None:
        with lock:
            count[0] += 1
            if count[0] == tasks:
                finished.set()

    def reading(ctx) -> None:
        ctx.spec["i"]
        handle(ctx)

    if mode == "app":
        from ..tasks import TaskApp

        task_app = TaskApp(dsn)

        @task_app.task(queue="cost", name="cost.noop")
        def noop(i: int) -> None:
            handle(None)

    with Database(dsn) as db:  # closed before the run: its backends are not counted
        if mode == "app":
            for start in range(0, tasks, 5000):
                noop.options(conn=db).submit_many([{"i": i} for i in range(start, min(tasks, start + 5000))])
        else:
            submit_bulk(db, "cost", tasks)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("VACUUM ANALYZE pyscheduler.tasks")
    with psycopg.connect(dsn) as c:
        server0 = server_cpu(c.info.backend_pid)
    started, py0 = time.perf_counter(), time.process_time()
    if mode == "app":
        running = task_app.worker(["cost"], capacity=10, poll_interval=0.5).start()
    else:
        running = Worker(dsn, "cost", reading if mode == "spec" else handle, capacity=10, poll_interval=0.5).start()
    finished.wait(600)
    wall, py = time.perf_counter() - started, time.process_time() - py0
    with psycopg.connect(dsn, autocommit=True) as c:  # the worker's backends, still connected
        pids = [r[0] for r in c.execute("SELECT pid FROM pg_stat_activity"
                                        " WHERE datname = current_database() AND pid <> pg_backend_pid()")]
        backends = sum(process_cpu(pid) for pid in pids)
        server = server_cpu(c.info.backend_pid) - server0
    running.stop()
    return (f"{mode}: {count[0]:,} tasks, {count[0] / wall:,.0f} tasks/s; CPU per task: "
            f"Python {py / tasks * 1e6:.1f} us, its {len(pids)} backends {backends / tasks * 1e6:.1f} us, "
            f"server {server / tasks * 1e6:.1f} us")


MODES = {
    "sql": "lease_tasks_lean n=--batch + complete_tasks, two connections",
    "graphile": "the same work in graphile-worker's shape (its own table)",
    "worker": "one Worker, capacity 10, no-op handler",
    "spec": "the same, the handler reading its spec (ctx.spec['i'])",
    "app": "the same through a task function: app.worker(capacity=10)",
    "single": "lease_task + complete_task, one call each (3,000 tasks at most)",
    "delayed": "submit_tasks(run_in => 1 hour), batches of 1,000",
    "submit": "submit_task and submit_tasks_lean one a call, submit_tasks and submit_tasks_lean (plain, "
              "delayed, unique keys) of 1,000",
    "vacuum": "VACUUM of the tasks table per 2,000 tasks (with --finished kept)",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="modes: " + "; ".join(f"{k}: {v}" for k, v in MODES.items()))
    parser.add_argument("mode", choices=list(MODES))
    parser.add_argument("dsn")
    parser.add_argument("--tasks", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--finished", type=int, default=0,
                        help="first submit, lease and complete that many tasks of queue 'cost-done', unmeasured "
                             "(the sql, worker, single and vacuum modes)")
    a = parser.parse_args()
    stats.require_local(a.dsn)
    if a.mode in ("worker", "spec", "app"):
        line = worker_cost(a.dsn, a.tasks, a.finished, a.mode)
    elif a.mode == "single":
        line = single_cost(a.dsn, min(a.tasks, 3000), a.finished)
    elif a.mode == "delayed":
        line = delayed_cost(a.dsn, a.tasks, 1000)
    elif a.mode == "submit":
        line = submit_cost(a.dsn, a.tasks)
    elif a.mode == "vacuum":
        line = vacuum_cost(a.dsn, a.finished)
    else:
        line = sql_cost(a.dsn, a.mode, a.tasks, a.batch, a.finished)
    print(f"{line}; load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
