"""Flow control for tasks: what limits, rate limits and dependencies cost, and whether they
hold, on a migrated scratch database (docs/benchmarks.md, "Flow control").

    python -m pyscheduler.bench.tasks_flow keys|rate|join|workflow "$DSN"

The modes (MODES, each its function's docstring): keys_mode fails the run when a key ever had
two tasks running; rate_mode, join_mode and workflow_mode print what they measured."""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import threading
import time
from collections import defaultdict
from datetime import timedelta
from uuid import UUID

import psycopg

from ..db import Jsonb, Session
from ..tasks import Worker, sqlapi as tasks_sql
from . import sqlapi as sql


def submit(dsn: str, queue: str, n: int, keys: int | None) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        for start in range(0, n, 10_000):
            count = min(10_000, n - start)
            c.execute(sql.FLOW_SUBMIT, (queue, Jsonb([{"i": start + i} for i in range(count)]),
                       None if keys is None else [f"k{(start + i) % keys}" for i in range(count)]))


def done(dsn: str, queue: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute(sql.COMPLETED_IN_QUEUE, (queue,)).fetchone()[0]


PREFETCH: int | None = None  # the Worker's default


def run_workers(dsn: str, queue: str, n: int, workers: int, record: bool) -> tuple[float, list]:
    """Run ``workers`` Workers (threads of this process) until ``n`` tasks of ``queue`` completed;
    the seconds it took, and (record) the handlers' (begin, end, key) intervals."""
    intervals: list[tuple[float, float, str]] = []
    lock = threading.Lock()

    def handler(ctx):
        began = time.monotonic()
        key = ctx.spec["i"]
        ended = time.monotonic()
        if record:
            with lock:
                intervals.append((began, ended, key))

    started = time.monotonic()
    running = [Worker(dsn, queue, handler, capacity=4, poll_interval=0.2,
                      **({} if PREFETCH is None else {"prefetch": PREFETCH})).start()
               for _ in range(workers)]
    try:
        while done(dsn, queue) < n:
            time.sleep(0.05)
    finally:
        elapsed = time.monotonic() - started
        for r in running:
            r.stop()
    polls = sum(r.worker.polls for r in running)
    print(f"  {queue}: {polls:,} lease calls, {n / max(polls, 1):.1f} tasks a call", file=sys.stderr)
    return elapsed, intervals


def keys_mode(dsn: str, tasks: int, keys: int, workers: int) -> None:
    """``tasks`` tasks over ``keys`` keys, running_per_key 1, ``workers`` Workers (threads of this
    process), then the same tasks without limits (the baseline). Each handler records when it
    began and ended (after its lease committed, before its completion committed), and a sweep of
    those intervals per key checks that no key ever had more than one task running."""
    with psycopg.connect(dsn, autocommit=True) as c:
        Session.borrow(c).call(tasks_sql.SET_QUEUE_LIMITS, queue="flow-keys", running_per_key=1)
    submit(dsn, "flow-keys", tasks, keys)
    limited, intervals = run_workers(dsn, "flow-keys", tasks, workers, record=True)
    # the sweep: per key, the handlers' intervals never overlap (spec i -> key i % keys)
    events = sorted([(b, 1, i % keys) for b, _, i in intervals] + [(e, -1, i % keys) for _, e, i in intervals],
                    key=lambda x: (x[0], x[1]))
    running: dict[int, int] = defaultdict(int)
    worst = 0
    for _, delta, key in events:
        running[key] += delta
        worst = max(worst, running[key])
    submit(dsn, "flow-free", tasks, keys)  # the same tasks, keys and all, on a queue without limits
    free, _ = run_workers(dsn, "flow-free", tasks, workers, record=False)
    print(f"keys: {tasks:,} tasks over {keys:,} keys, running_per_key 1, {workers} workers: "
          f"{tasks / limited:,.0f} tasks/s; without limits {tasks / free:,.0f} tasks/s "
          f"({free / limited:.2f}x of it); most handlers of one key at once: {worst}")
    if worst > 1:
        sys.exit("the limit was exceeded")


def _node(dsn: str, queue: str, workers: int, seconds: float) -> None:
    running = [Worker(dsn, queue, lambda ctx: None, capacity=4, poll_interval=1.0).start() for _ in range(workers)]
    time.sleep(seconds)
    for r in running:
        r.stop()


def rate_mode(dsn: str, rate: int, seconds: float) -> None:
    """``rate`` starts/s for ``seconds``, 4 workers in 2 processes ("nodes"): the leases begun
    from the first lease on (each task's leased_at), per second over the run and per 10 s."""
    with psycopg.connect(dsn, autocommit=True) as c:
        Session.borrow(c).call(tasks_sql.SET_RATE_LIMIT, queue="flow-rate", starts=rate, per=timedelta(seconds=1))
    submit(dsn, "flow-rate", int(rate * (seconds + 15)), None)
    nodes = [multiprocessing.Process(target=_node, args=(dsn, "flow-rate", 2, seconds + 5)) for _ in range(2)]
    for p in nodes:
        p.start()
    for p in nodes:
        p.join()
    with psycopg.connect(dsn, autocommit=True) as c:
        first = c.execute(sql.FLOW_FIRST_LEASE, ("flow-rate",)).fetchone()[0]
        total = c.execute(sql.FLOW_LEASES, ("flow-rate", first, first, seconds)).fetchone()[0]
        windows = c.execute(sql.FLOW_LEASES_PER_10S, (first, "flow-rate", first, first, seconds)).fetchall()
    per = total / seconds
    print(f"rate: limit {rate}/s (a bucket of {rate}), 4 workers in 2 processes, {seconds:.0f} s: {total:,} leases, "
          f"{per:,.1f}/s ({(per / rate - 1) * 100:+.1f} %); per 10 s: "
          + ", ".join(f"{n / 10:,.0f}/s" for _, n in windows))


def join_mode(dsn: str, children: int, workers: int) -> None:
    """``children`` tasks, then one join after them all: the time from the last child's
    completion (its commit) to the join's lease."""
    with psycopg.connect(dsn, autocommit=True) as c:
        session = Session.borrow(c)
        rns = [UUID(r["task"]["rn"]) for r in session.call(tasks_sql.SUBMIT_TASKS, queue="flow-join",
                                                           specs=Jsonb([{"i": i} for i in range(children)]))]
        join = UUID(session.call_value(tasks_sql.SUBMIT_TASK, queue="flow-join", spec=Jsonb({"join": True}),
                                       after=rns)["rn"])
    seen = threading.Event()

    def handler(ctx):
        if ctx.spec.get("join"):
            seen.set()

    running = [Worker(dsn, "flow-join", handler, capacity=4).start() for _ in range(workers)]
    try:
        if not seen.wait(300):
            sys.exit("the join never ran")
    finally:
        for r in running:
            r.stop()
    with psycopg.connect(dsn, autocommit=True) as c:
        last, leased = c.execute(sql.FLOW_JOIN_TIMES, (rns, join)).fetchone()
    print(f"join: {children:,} children, {workers} workers: the join was leased "
          f"{(leased - last).total_seconds() * 1000:.1f} ms after the last child's completion")


def workflow_mode(dsn: str, sizes: list[int], rounds: int) -> None:
    """Per size: submit_tasks of that many specs, and submit_workflow of a chain (each node after
    the one before) and of a fan-out (one root, every other node after it) of that many nodes,
    one call each, median of ``rounds``, timed at the client twice: the call with its answer
    received and parsed, and the call alone (the answer reduced to a count or a size in the
    server: the backend's time). The ratio is workflow / submit_tasks."""
    calls = {"submit_tasks": (sql.FLOW_SUBMIT_TASKS, sql.FLOW_SUBMIT_TASKS_COUNT),
             "workflow": (sql.FLOW_SUBMIT_WORKFLOW, sql.FLOW_SUBMIT_WORKFLOW_SIZE)}
    shapes = {"chain": lambda i: [f"n{i - 1}"] if i else [], "fan-out": lambda i: ["n0"] if i else []}

    def timed(c: psycopg.Connection, statement: str, *params: object) -> float:
        started = time.perf_counter()
        c.execute(statement, params).fetchall()
        return time.perf_counter() - started

    print(f"workflow: one call each, median of {rounds}; x = submit_workflow / submit_tasks of as many specs")
    with psycopg.connect(dsn, autocommit=True) as c:
        for n in sizes:
            times: dict[tuple[str, int], list[float]] = defaultdict(list)
            for _ in range(rounds):
                for k in (0, 1):  # answer received, backend only
                    times["submit_tasks", k].append(timed(c, calls["submit_tasks"][k], "flow-wf",
                                                          Jsonb([{"i": i} for i in range(n)])))
                    for shape, after in shapes.items():
                        nodes = [{"name": f"n{i}", "queue": "flow-wf", "spec": {"i": i}, "after": after(i)}
                                 for i in range(n)]
                        times[shape, k].append(timed(c, calls["workflow"][k], Jsonb(nodes)))
            for k, what in ((0, "with the answer"), (1, "backend only")):
                base = statistics.median(times["submit_tasks", k])
                print(f"  {n:>6,} nodes, {what:15}: submit_tasks {base:.3f} s; "
                      + "; ".join(f"{shape} {statistics.median(times[shape, k]):.3f} s "
                                  f"({statistics.median(times[shape, k]) / base:.2f}x)" for shape in shapes),
                      flush=True)


MODES = {
    "keys": "--tasks tasks over --keys keys, running_per_key 1, --workers workers, then without limits",
    "rate": "--rate starts/s for --seconds, 4 workers in 2 processes",
    "join": "10,000 children, then one join after them all, 4 workers",
    "workflow": "submit_workflow of --sizes nodes against submit_tasks, --rounds calls each",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="modes: " + "; ".join(f"{k}: {v}" for k, v in MODES.items()))
    parser.add_argument("mode", choices=list(MODES))
    parser.add_argument("dsn")
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--workers", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=int, default=500)
    parser.add_argument("--sizes", default="1000,2000,4000,10000", help="workflow mode: node counts, comma-separated")
    parser.add_argument("--rounds", type=int, default=3, help="workflow mode: calls per size and shape (the median)")
    parser.add_argument("--prefetch", type=int, default=None,
                        help="each Worker's prefetch (keys mode; default the Worker's)")
    args = parser.parse_args()
    global PREFETCH
    PREFETCH = args.prefetch
    if args.mode == "keys":
        keys_mode(args.dsn, args.tasks, args.keys, args.workers)
    elif args.mode == "rate":
        rate_mode(args.dsn, args.rate, args.seconds)
    elif args.mode == "workflow":
        workflow_mode(args.dsn, [int(n) for n in args.sizes.split(",")], args.rounds)
    else:
        join_mode(args.dsn, 10_000, 4)


if __name__ == "__main__":
    main()
