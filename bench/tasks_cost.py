"""What a task costs the database: per-task CPU of the server backends (and of the worker's
Python), read from /proc, so the figures hold on a loaded machine where rates do not.
Run on the database server's machine (it reads the backends' /proc/<pid>/stat), as a user
allowed to read them, on a migrated scratch database (docs/benchmarks.md, "What a task
costs the database"):

    python bench/tasks_cost.py sql "$DSN"        # lease_tasks_lean n=500 + complete_tasks, two connections
    python bench/tasks_cost.py graphile "$DSN"   # the same work in graphile-worker's shape (its own table)
    python bench/tasks_cost.py worker "$DSN"     # one Worker, capacity 10, no-op handler
    python bench/tasks_cost.py spec "$DSN"       # the same, the handler reading its spec (ctx.spec["i"])
    python bench/tasks_cost.py app "$DSN"        # the same through a task function: app.worker(capacity=10)
    python bench/tasks_cost.py single "$DSN"     # lease_task + complete_task, one call each (3,000 tasks)
    python bench/tasks_cost.py delayed "$DSN" --tasks 20000   # submit_tasks(run_in => 1 hour), batches of 1,000
    python bench/tasks_cost.py submit "$DSN" --tasks 20000    # submit_task one a call, then submit_tasks of 1,000
    python bench/tasks_cost.py vacuum "$DSN" --finished 500000   # VACUUM of the tasks table per 2,000 tasks

Options: --tasks (50,000), --batch (500), --finished (0): first submit, lease and complete that
many tasks of queue 'cost-done' unmeasured, the finished tasks a deployment keeps for its
retention period (the sql and worker modes). Each run adds its tasks to queue 'cost' (the sql
and worker modes) or to table cost_gjobs (graphile, dropped first). Besides the backends of the
run, it reports the CPU of the whole server per task (every PostgreSQL process: autovacuum and
the other background processes included), so run it on a server of its own.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import psycopg

CLK = os.sysconf("SC_CLK_TCK")


def cpu(pid: int) -> float:
    """CPU seconds (user + system) of process pid."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def server_cpu(backend_pid: int) -> float:
    """CPU seconds of the whole server: the postmaster, its children, and the children it reaped."""
    status = open(f"/proc/{backend_pid}/status").read()
    postmaster = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
    fields = open(f"/proc/{postmaster}/stat").read().rsplit(")", 1)[1].split()
    total = sum(int(f) for f in fields[11:15]) / CLK  # utime, stime, cutime, cstime
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == postmaster:
                total += (int(stat[11]) + int(stat[12])) / CLK
    return total


def finish_ahead(dsn: str, n: int) -> None:
    """n finished tasks in queue 'cost-done' (unmeasured): the retention period's tasks."""
    if not n:
        return
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(STATEMENTS["sql"][0].replace("'cost'", "'cost-done'"), {"n": n})
        while rows := c.execute("SELECT rn, token FROM pyscheduler.lease_tasks_lean(queue => 'cost-done',"
                                " worker => 'cost-0', n => 5000)").fetchall():
            c.execute(STATEMENTS["sql"][2], {"rns": [r[0] for r in rows], "tokens": [r[1] for r in rows]})
        c.execute("VACUUM ANALYZE")


GJOBS = """DROP TABLE IF EXISTS cost_gjobs;
CREATE TABLE cost_gjobs (id bigserial PRIMARY KEY, queue text NOT NULL, payload jsonb NOT NULL,
    priority int NOT NULL DEFAULT 0, run_at timestamptz NOT NULL DEFAULT now(), attempts int NOT NULL DEFAULT 0,
    locked_at timestamptz, locked_by text, created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    is_available boolean GENERATED ALWAYS AS (locked_at IS NULL AND attempts < 25) STORED);
CREATE INDEX ON cost_gjobs (priority, run_at) INCLUDE (id, queue) WHERE is_available"""

STATEMENTS = {
    "sql": ("SELECT count(*) FROM pyscheduler.submit_tasks(queue => 'cost', specs => (SELECT jsonb_agg("
            "jsonb_build_object('i', i)) FROM generate_series(1, %(n)s) i))",
            "SELECT rn, token FROM pyscheduler.lease_tasks_lean(queue => 'cost', worker => 'cost-1', n => %(b)s)",
            "SELECT count(*) FROM pyscheduler.complete_tasks(rns => %(rns)b, tokens => %(tokens)b)"),
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
        a.execute(fill, {"n": tasks})
        a.execute("VACUUM ANALYZE")
        lease_cpu = complete_cpu = 0.0
        done, started, server0 = 0, time.perf_counter(), server_cpu(a.info.backend_pid)
        while True:
            before = cpu(a.info.backend_pid)
            rows = a.execute(lease, {"b": batch}).fetchall()
            lease_cpu += cpu(a.info.backend_pid) - before
            if not rows:
                break
            before = cpu(c.info.backend_pid)
            c.execute(complete, {"rns": [r[0] for r in rows], "tokens": [r[1] for r in rows]})
            complete_cpu += cpu(c.info.backend_pid) - before
            done += len(rows)
        wall, server = time.perf_counter() - started, server_cpu(a.info.backend_pid) - server0
    return (f"{mode}: {done:,} tasks in batches of {batch}: backend CPU lease {lease_cpu / done * 1e6:.1f} us/task,"
            f" complete {complete_cpu / done * 1e6:.1f} us/task, total {(lease_cpu + complete_cpu) / done * 1e6:.1f}"
            f" us/task, server {server / done * 1e6:.1f} us/task ({done / wall:,.0f} tasks/s)")


def single_cost(dsn: str, tasks: int, finished: int = 0) -> str:
    """The single-task path: lease_task, then complete_task, one call each, one connection."""
    finish_ahead(dsn, finished)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(STATEMENTS["sql"][0], {"n": tasks})
        c.execute("VACUUM ANALYZE")
        pid, lease_cpu, complete_cpu = c.info.backend_pid, 0.0, 0.0
        for _ in range(tasks):
            before = cpu(pid)
            task = c.execute("SELECT pyscheduler.lease_task(queue => 'cost', worker => 'cost-1')").fetchone()[0]
            lease_cpu += cpu(pid) - before
            before = cpu(pid)
            c.execute("SELECT pyscheduler.complete_task(rn => %s, token => %s)", (task["rn"], task["token"]))
            complete_cpu += cpu(pid) - before
    return (f"single: {tasks:,} tasks: backend CPU lease_task {lease_cpu / tasks * 1e6:.0f} us,"
            f" complete_task {complete_cpu / tasks * 1e6:.0f} us per call")


def delayed_cost(dsn: str, tasks: int, batch: int) -> str:
    """Submitting tasks for later: submit_tasks(run_in => 1 hour) in batches, one connection (the
    index entries a scheduled task writes)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        submit = ("SELECT count(*) FROM pyscheduler.submit_tasks(queue => 'cost-delayed', specs => (SELECT "
                  "jsonb_agg(jsonb_build_object('i', i)) FROM generate_series(1, %s) i), run_in => '1 hour')")
        c.execute(submit, (1,))  # plans cached before the measure
        pid = c.info.backend_pid
        before = cpu(pid)
        for _ in range(tasks // batch):
            c.execute(submit, (batch,))
        spent = cpu(pid) - before
    return f"delayed: {tasks // batch * batch:,} tasks in batches of {batch}: backend CPU submit {spent / tasks * 1e6:.1f} us/task"


def submit_cost(dsn: str, tasks: int) -> str:
    """Submitting: one submit_task a call (3,000 at most), then submit_tasks of 1,000 specs built
    in Python, one connection, the queue emptied after."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT pyscheduler.submit_task(queue => 'cost-submit', spec => '{}')")  # plans cached
        pid = c.info.backend_pid
        single = min(tasks, 3000)
        before = cpu(pid)
        for i in range(single):
            c.execute("SELECT pyscheduler.submit_task(queue => 'cost-submit', spec => %s::jsonb)", (f'{{"i": {i}}}',))
        one = (cpu(pid) - before) / single
        specs = "[" + ",".join(f'{{"i": {i}}}' for i in range(1000)) + "]"
        before = cpu(pid)
        for _ in range(tasks // 1000):
            c.execute("SELECT count(*) FROM pyscheduler.submit_tasks(queue => 'cost-submit', specs => %s::jsonb)",
                      (specs,))
        many = (cpu(pid) - before) / (tasks // 1000 * 1000)
        c.execute("DELETE FROM pyscheduler.tasks WHERE queue = 'cost-submit'")
        c.execute("SELECT pyscheduler._task_count_all()")
    return (f"submit: backend CPU submit_task {one * 1e6:.1f} us/call ({single:,} calls), submit_tasks of 1,000 "
            f"{many * 1e6:.1f} us/task ({tasks // 1000 * 1000:,} tasks)")


def vacuum_cost(dsn: str, finished: int) -> str:
    """What a VACUUM of the tasks table costs after 2,000 leases and completions (autovacuum's
    threshold), with a retention period's finished tasks kept (--finished), three times."""
    finish_ahead(dsn, finished)
    fill, _, complete = STATEMENTS["sql"]
    passes = []
    with psycopg.connect(dsn, autocommit=True) as c:
        for _ in range(3):
            c.execute(fill, {"n": 2000})
            rows = c.execute("SELECT rn, token FROM pyscheduler.lease_tasks_lean(queue => 'cost',"
                             " worker => 'cost-1', n => 2000)").fetchall()
            c.execute(complete, {"rns": [r[0] for r in rows], "tokens": [r[1] for r in rows]})
            before = cpu(c.info.backend_pid)
            c.execute("VACUUM pyscheduler.tasks")
            passes.append(f"{(cpu(c.info.backend_pid) - before) * 1000:.0f} ms")
    return f"vacuum: VACUUM pyscheduler.tasks after 2,000 tasks, {finished:,} finished kept: {', '.join(passes)} CPU"


def worker_cost(dsn: str, tasks: int, finished: int = 0, mode: str = "worker") -> str:
    """One Worker, capacity 10, on a no-op handler; ``spec``: the handler reads its spec, as a
    handler unpacking its arguments does; ``app``: the same Worker through a task function
    (TaskApp.worker dispatching the spec {"task", "args"} by name)."""
    from pyscheduler.db import Database
    from pyscheduler.tasks import Worker
    from pyscheduler.tasks.bench import submit_bulk

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
        from pyscheduler.tasks import TaskApp

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
        backends = sum(cpu(pid) for pid in pids)
        server = server_cpu(c.info.backend_pid) - server0
    running.stop()
    return (f"{mode}: {count[0]:,} tasks, {count[0] / wall:,.0f} tasks/s; CPU per task: "
            f"Python {py / tasks * 1e6:.1f} us, its {len(pids)} backends {backends / tasks * 1e6:.1f} us, "
            f"server {server / tasks * 1e6:.1f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["sql", "graphile", "worker", "spec", "app", "single", "delayed", "submit",
                                         "vacuum"])
    parser.add_argument("dsn")
    parser.add_argument("--tasks", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--finished", type=int, default=0)
    a = parser.parse_args()
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
