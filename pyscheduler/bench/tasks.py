"""``pyscheduler bench tasks``: throughput and latency of leased tasks, each measured on a queue of
its own (removed afterwards, so it is safe on a database with real tasks), through the SQL API:

1. batch lease+complete: lease_tasks_lean(n => batch) + complete_tasks on W connections;
2. single lease+complete: lease_task + complete_task, and complete_and_lease (one task a
   transaction), on W connections;
3. the worker library: one Worker, then one AsyncWorker, with a no-op handler;
4. submit-to-lease latency: idle Workers woken by NOTIFY, tasks submitted one at a time."""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import click

from ..config import dsn_option
from ..daemon import wait_for
from ..db import Database, Jsonb, Session
from ..tasks import sqlapi as sql
from . import sqlapi as bench_sql
from ..tasks.worker import TaskContext, Worker
from .stats import percentile

TARGETS = {"batch": 25_000, "single": 2_500, "p99_ms": 20.0}


def _drop_queue(db: Database, queue: str) -> None:
    # The bench's own rows only; nothing else in the database is touched.
    with db.connection() as conn:
        conn.execute(bench_sql.DELETE_QUEUE, (queue,))


def _vacuum(db: Database) -> None:
    """Between runs, as pgbench does: one run's dead rows must not slow the next one."""
    with db.connection() as conn:
        conn.execute("VACUUM (ANALYZE) pyscheduler.tasks")


def submit_bulk(db: Database, queue: str, total: int, chunk: int = 5000) -> float:
    """Submit ``total`` tasks in chunks; seconds taken."""
    started = time.perf_counter()
    left = total
    while left:
        n = min(chunk, left)
        db.call(sql.SUBMIT_TASKS, queue=queue, specs=Jsonb([{"i": i} for i in range(n)]))
        left -= n
    return time.perf_counter() - started


def run_threads(workers: int, target) -> float:
    barrier = threading.Barrier(workers + 1)
    threads = [threading.Thread(target=target, args=(k, barrier)) for k in range(workers)]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - started


def lease_and_complete(s: Session, queue: str, worker: str, n: int, timeout: timedelta,
                       on_task: Callable[[dict], object] | None = None, retry_in: timedelta | None = None) -> int:
    """One batch: lease_tasks_lean(n) on ``s`` (what a worker needs: rn, token, spec, priority,
    seq), ``on_task(row)`` for each task, then complete_tasks for all of them with the rns and
    tokens as binary uuid arrays (one durable commit); the tasks for which ``on_task`` returned
    True failed instead: one fail_tasks call retries them after ``retry_in`` (None: the
    backoff). The number of tasks leased."""
    rows = s.call(sql.LEASE_TASKS_LEAN, queue=queue, worker=worker, n=n, timeout=timeout)
    if rows:
        outcomes = [on_task(r) is True for r in rows] if on_task is not None else [False] * len(rows)
        failed = [r for r, f in zip(rows, outcomes) if f]
        done = [r for r, f in zip(rows, outcomes) if not f] if failed else rows
        if done:
            refused = s.call_binary(sql.COMPLETE_TASKS, rns=[r["rn"] for r in done], tokens=[r["token"] for r in done])
            assert not refused, refused
        if failed:
            refused = s.call_binary(sql.FAIL_TASKS, rns=[r["rn"] for r in failed], tokens=[r["token"] for r in failed],
                                    errors=Jsonb([{"code": "bench"}] * len(failed)),
                                    retry_in=[retry_in] * len(failed) if retry_in is not None else None)
            assert not refused, refused
    return len(rows)


def lease_complete(db: Database, queue: str, workers: int, batch: int | None,
                   seconds: float = float("inf")) -> tuple[int, float]:
    """W connections lease and complete until the queue is empty or ``seconds`` pass:
    batch None: lease_task + complete_task per task; else lease_tasks(n => batch) + complete_tasks."""
    done = [0] * workers
    lease = timedelta(seconds=60)

    def cycle(s, worker: str) -> int:
        if batch is None:
            task = s.call_value(sql.LEASE_TASK, queue=queue, worker=worker, timeout=lease)
            if task is not None:
                s.call(sql.COMPLETE_TASK, rn=task["rn"], token=task["token"])
            return task is not None
        return lease_and_complete(s, queue, worker, batch, lease)

    def work(k: int, barrier: threading.Barrier) -> None:
        with db.session() as s:
            barrier.wait()
            until = time.perf_counter() + seconds
            while time.perf_counter() < until and (n := cycle(s, f"bench-{k}")):
                done[k] += n

    elapsed = run_threads(workers, work)
    return sum(done), elapsed


def lease_complete_chained(db: Database, queue: str, workers: int,
                           seconds: float = float("inf")) -> tuple[int, float]:
    """W connections loop complete_and_lease until the queue is empty or ``seconds`` pass: one
    transaction per task (complete the held task, lease the next); the last held task is completed
    with complete_task. Counts completed tasks."""
    done = [0] * workers
    lease = timedelta(seconds=60)

    def work(k: int, barrier: threading.Barrier) -> None:
        worker = f"bench-{k}"
        with db.session() as s:
            barrier.wait()
            until = time.perf_counter() + seconds
            task = s.call_value(sql.COMPLETE_AND_LEASE, worker=worker, queue=queue, timeout=lease)
            while task is not None:
                if time.perf_counter() >= until:
                    s.call(sql.COMPLETE_TASK, rn=task["rn"], token=task["token"])
                    done[k] += 1
                    break
                task = s.call_value(sql.COMPLETE_AND_LEASE, worker=worker, queue=queue, rn=task["rn"],
                                    token=task["token"], timeout=lease)
                done[k] += 1

    elapsed = run_threads(workers, work)
    return sum(done), elapsed


def library_throughput(dsn: str, db: Database, queue: str, total: int, capacity: int,
                       flavour: str = "sync") -> tuple[int, float]:
    """One Worker (the library: a local queue leased ahead, handler threads or coroutines,
    batched heartbeats and completions) works ``total`` submitted no-op tasks; time from its
    start to the last durable completion. Completions are counted by the worker itself
    (``Worker.completed``, after each complete_tasks commit), checked once at the end (a count
    of the table: polling it every 10 ms cost milliseconds of server CPU per poll at 20,000 rows)."""
    from ..tasks.aio import AsyncWorker

    async def nothing(ctx: TaskContext) -> None:
        return None

    if flavour == "async":
        worker: Worker = AsyncWorker(dsn, queue, nothing, capacity=capacity, poll_interval=0.5)
    else:
        worker = Worker(dsn, queue, lambda ctx: None, capacity=capacity, poll_interval=0.5)
    started = time.perf_counter()
    running = worker.start()
    try:
        wait_for(lambda: worker.completed >= total, timeout=600, interval=0.005)
        elapsed = time.perf_counter() - started
    finally:
        running.stop()
    # counted in the table itself (the bench owns it)
    rows = db.query(bench_sql.COMPLETED_IN_QUEUE, (queue,))
    assert rows and rows[0]["n"] == total, f"{rows} completed, expected {total}"
    return total, elapsed


def submit_to_lease_latency(dsn: str, db: Database, queue: str, samples: int, workers: int,
                            gap: float) -> list[float]:
    """Milliseconds from each submit call to its handler starting, with idle workers."""
    latencies: list[float] = []
    got = threading.Event()

    def handler(ctx: TaskContext) -> None:
        latencies.append((time.perf_counter() - ctx.spec["t"]) * 1000)
        got.set()

    running = [Worker(dsn, queue, handler, capacity=1, poll_interval=5.0).start() for _ in range(workers)]
    try:
        for r in running:
            r.wait_idle(timeout=30)
        for _ in range(samples):
            got.clear()
            db.call(sql.SUBMIT_TASK, queue=queue, spec=Jsonb({"t": time.perf_counter()}))
            got.wait(10)
            time.sleep(gap)
    finally:
        for r in running:
            r.stop()
    return latencies


def _verdict(value: float, target: float, higher_is_better: bool = True) -> str:
    ok = value >= target if higher_is_better else value <= target
    return f"{'meets' if ok else 'MISSES'} target {target:,.0f}" if higher_is_better else (
        f"{'meets' if ok else 'MISSES'} target {target:.0f} ms")


@click.command("tasks")
@dsn_option
@click.option("--tasks", "total", type=click.IntRange(1), default=100_000, show_default=True,
              help="Tasks for the batch lease+complete run.")
@click.option("--batch", type=click.IntRange(1), default=1000, show_default=True, help="Tasks per lease.")
@click.option("--workers", type=click.IntRange(1), default=2, show_default=True,
              help="Concurrent connections leasing (2 cores: 2).")
@click.option("--single-seconds", type=float, default=10.0, show_default=True,
              help="Duration of the single lease+complete run.")
@click.option("--samples", type=click.IntRange(1), default=300, show_default=True,
              help="Submit-to-lease latency samples.")
@click.option("--gap", type=float, default=0.02, show_default=True, help="Seconds between latency samples.")
@click.option("--capacity", type=click.IntRange(1), default=10, show_default=True,
              help="Capacity of the Worker in the library run.")
@click.option("--library-tasks", type=click.IntRange(1), default=20_000, show_default=True,
              help="Tasks of each library run (Worker, then AsyncWorker).")
def bench(dsn, total, batch, workers, single_seconds, samples, gap, capacity, library_tasks) -> None:
    """Leased tasks: batch and single lease+complete tasks/s (lease_task + complete_task, and
    complete_and_lease), the worker library, submit-to-lease latency. Side by side with other
    job queues: ``pyscheduler bench peers``."""
    from .. import migrate as migrations

    server = None
    if not dsn:
        from ..embedded import Postgres
        import tempfile

        click.echo("no --dsn: starting the embedded PostgreSQL ...")
        server = Postgres(Path(tempfile.mkdtemp(prefix="pyscheduler-bench-"))).start()
        dsn = server.dsn()
    try:
        migrations.migrate(dsn)
        tag = f"bench-{os.getpid()}"
        with Database(dsn, min_size=workers + 1, max_size=workers + 2) as db:
            try:
                q = f"{tag}-batch"
                _vacuum(db)
                secs = submit_bulk(db, q, total)
                click.echo(f"submit (submit_tasks, 5000 per call): {total:,} tasks in {secs:.2f}s = "
                           f"{total / secs:,.0f} tasks/s")
                n, secs = lease_complete(db, q, workers, batch)
                rate = n / secs
                click.echo(f"batch lease+complete (lease_tasks_lean n={batch} + complete_tasks, {workers} workers): "
                           f"{n:,} tasks in {secs:.2f}s = {rate:,.0f} tasks/s "
                           f"({_verdict(rate, TARGETS['batch'])})")
                _drop_queue(db, q)
                _vacuum(db)

                q = f"{tag}-single"
                expected = int(single_seconds * 6000) + 1000
                submit_bulk(db, q, expected)
                _vacuum(db)
                n, secs = lease_complete(db, q, workers, None, single_seconds)
                rate = n / secs
                click.echo(f"single lease+complete (lease_task + complete_task, {workers} workers): "
                           f"{n:,} tasks in {secs:.2f}s = {rate:,.0f} tasks/s "
                           f"({_verdict(rate, TARGETS['single'])})")
                _drop_queue(db, q)
                _vacuum(db)

                q = f"{tag}-chained"
                submit_bulk(db, q, expected)
                _vacuum(db)
                n, secs = lease_complete_chained(db, q, workers, single_seconds)
                rate = n / secs
                click.echo(f"single complete_and_lease (one transaction per task: complete the held task, "
                           f"lease the next; {workers} workers): {n:,} tasks in {secs:.2f}s = {rate:,.0f} tasks/s "
                           f"({_verdict(rate, TARGETS['single'])})")
                _drop_queue(db, q)

                for flavour in ("sync", "async"):
                    q = f"{tag}-library"
                    submit_bulk(db, q, library_tasks)
                    _vacuum(db)
                    n, secs = library_throughput(dsn, db, q, library_tasks, capacity, flavour)
                    kind = "Worker" if flavour == "sync" else "AsyncWorker"
                    click.echo(f"worker library ({flavour}: one {kind}, capacity {capacity}, no-op handler, "
                               f"local queue, batched completions): {n:,} tasks in {secs:.2f}s = "
                               f"{n / secs:,.0f} tasks/s")
                    _drop_queue(db, q)

                q = f"{tag}-latency"
                lat = submit_to_lease_latency(dsn, db, q, samples, workers, gap)
                p50, p99 = percentile(lat, 50), percentile(lat, 99)
                click.echo(f"submit-to-lease latency ({len(lat)} samples, {workers} idle workers, NOTIFY): "
                           f"p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {max(lat):.2f} ms, "
                           f"mean {statistics.mean(lat):.2f} ms ({_verdict(p99, TARGETS['p99_ms'], False)})")
                _drop_queue(db, q)

            finally:
                for suffix in ("batch", "single", "chained", "library", "latency"):
                    _drop_queue(db, f"{tag}-{suffix}")
    finally:
        if server is not None:
            server.stop()

