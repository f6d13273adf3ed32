"""The runners of ``pyscheduler bench peers``' enqueue and end-to-end sections (flow.py) for
pyscheduler and pgqueuer (graphile-worker's: bench/peers/graphile_flow.js). Given an EMPTY
database, each prints one line of JSON (the producer: its process, SYSTEM produce DSN RATE SECONDS [BACKLOG]):

    python -m pyscheduler.bench.peers.flow_runner SYSTEM enqueue|e2e|capacity|single DSN A B N

A B: BULK_JOBS SINGLE_JOBS, RATE SECONDS, BACKLOG SECONDS, 0 0. e2e: the producer submits RATE jobs/s;
capacity: as fast as it goes while at most BACKLOG jobs wait (``Started``); single: "ready", then per
line of stdin that many single submits and a line of their times (``slices``). Each system as its
users call it (``TaskClient.submit_ids`` and ``Worker``; pgqueuer's ``Queries.enqueue`` and ``QueueManager``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta

from ..stats import percentile

BULK = 1000
TICK = 0.01
QUEUE = "flow"
DRAIN_SECONDS = 60  # after producing, the cap on waiting for the backlog (a run past it: not exactly once)
WARM_SECONDS = 1.0  # the steady window (window_rate, latency_ms) starts this long after the first submit
FEED = 0.002  # capacity: seconds between the runner's lines of jobs started to the producer


def _done(seen: list[int], produced: dict, last: list[float], latencies: list[float], starts: list[float]) -> dict:
    """The e2e result: throughput's parts, exactly once (every index ran once: none missing after
    the drain cap, none twice), the enqueue-to-start latencies of the jobs submitted in the steady
    window (from WARM_SECONDS after the first submit: not the cold start of fresh processes and a
    fresh database) and every job's p99, and the jobs started per second in that window
    (``starts``: each job's start, perf_counter, in the order of ``latencies``)."""
    submitted, distinct = produced["submitted"], set(seen)
    begin, end = produced["started"] + WARM_SECONDS, produced["ended"]
    steady = [ms for ms, t in zip(latencies, starts) if t - ms / 1000 >= begin]  # submitted at t - ms
    return dict(submitted=submitted, completed=len(seen), duplicates=len(seen) - len(distinct),
                missing=len(set(range(submitted)) - distinct),
                exactly_once=len(seen) == len(distinct) == submitted and distinct == set(range(submitted)),
                total_s=(last[0] if last else time.perf_counter()) - produced["started"], latency_ms=steady,
                every_p99_ms=percentile(latencies, 99) if latencies else None,
                window_rate=sum(begin <= t < end for t in starts) / (end - begin) if end > begin else 0.0)


def producer(system: str, dsn: str, rate: float, seconds: float, backlog: int,
             count: Callable[[], int]) -> tuple[subprocess.Popen[str], threading.Thread | None]:
    """The e2e producer, a process of its own (as an application's is): ``SYSTEM produce``; with
    a backlog, a thread feeding it ``count()`` (the jobs started) until it exits."""
    proc = subprocess.Popen([sys.executable, "-m", __spec__.name, system, "produce", dsn, f"{rate:g}", f"{seconds:g}",
                             str(backlog)], stdout=subprocess.PIPE, stdin=subprocess.PIPE if backlog else None,
                            text=True, env={k: v for k, v in os.environ.items() if k != "PYSCHEDULER_FLOW_RESULT"})
    if not backlog:
        return proc, None

    def feed() -> None:
        try:
            while proc.poll() is None:
                proc.stdin.write(f"{count()}\n")
                proc.stdin.flush()
                time.sleep(FEED)
        except (BrokenPipeError, OSError):  # the producer exited meanwhile
            pass
    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    return proc, feeder


def produced(running: tuple[subprocess.Popen[str], threading.Thread | None]) -> dict:
    proc, feeder = running
    out = proc.stdout.read()
    proc.wait(timeout=600)
    if feeder is not None:
        feeder.join()
    if proc.returncode != 0:
        raise RuntimeError(f"the producer failed (exit {proc.returncode})")
    return json.loads(out.strip().splitlines()[-1])


class Started:
    """The capacity producer's view of the jobs started, read from stdin by a thread (the runner
    writes a count a line)."""

    def __init__(self):
        self.value = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in sys.stdin:
            self.value = int(line)


# -- pyscheduler ----------------------------------------------------------------------------------

@contextlib.contextmanager
def monitored(dsn: str):
    """The tasks monitor beside the run, with its defaults, as pyscheduler is deployed (`pyscheduler
    run`, `pyscheduler tasks monitor`): among its jobs it merges the spec search index's pending
    list, which the writes merge themselves when no monitor runs."""
    from ...tasks import Monitor

    stop = threading.Event()
    thread = threading.Thread(target=Monitor(dsn).run, args=(stop,), daemon=True, name="tasks-monitor")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(30)


def pyscheduler_enqueue(dsn: str, bulk_jobs: int, single_jobs: int, concurrency: int) -> dict:
    from ... import migrate
    from ...db import Database
    from ...tasks import TaskClient

    migrate.migrate(dsn)
    with Database(dsn, min_size=1, max_size=2) as db, monitored(dsn):
        client = TaskClient(db)
        client.submit_ids(QUEUE, [{"i": -1}])  # warm: the pool, the plans
        bulk_ms, single_ms = [], []
        t0 = time.perf_counter()
        for first in range(0, bulk_jobs, BULK):  # the plain bulk, into the empty table as the peers'
            t = time.perf_counter()
            client.submit_ids(QUEUE, [{"i": i} for i in range(first, min(first + BULK, bulk_jobs))])
            bulk_ms.append((time.perf_counter() - t) * 1000)
        bulk_s = time.perf_counter() - t0
        # single calls (trees_ab --mode single; bench peers makes them with run_single), after the
        # plain bulk: after the variants' rows they measured 28 % slower
        for i in range(single_jobs):
            t = time.perf_counter()
            client.submit_ids(QUEUE, [{"i": i}])
            single_ms.append((time.perf_counter() - t) * 1000)
        # The variants against the plain bulk again, their calls interleaved and the order turning
        # every call, so each meets the same table and the same merges of the spec index: run one
        # after the other, a later one met 50,000 more rows, and its time over the plain one's moved
        # 0.75x-1.86x from run to run.
        variants = {"": {}, "delayed": {"run_at": timedelta(hours=1)}, "unique": {}}
        names, seconds = list(variants), dict.fromkeys(variants, 0.0)
        for b, first in enumerate(range(0, bulk_jobs, BULK)):
            ids = range(first, min(first + BULK, bulk_jobs))
            for name in names[b % len(names):] + names[:b % len(names)]:
                keys = {"unique_keys": [f"k{i}" for i in ids]} if name == "unique" else {}
                t = time.perf_counter()
                client.submit_ids(QUEUE, [{"i": i} for i in ids], **variants[name], **keys)
                seconds[name] += time.perf_counter() - t
        mixed_plain_s = seconds.pop("")
    from ... import __version__
    return dict(system="pyscheduler", version=__version__, bulk_s=bulk_s, bulk_ms=bulk_ms, single_ms=single_ms,
                variants_s=seconds, mixed_plain_s=mixed_plain_s,
                settings="TaskClient(Database(dsn)).submit_ids (submit_tasks_lean; one spec: submit_task_lean), "
                         "pool of 2; a tasks Monitor")


async def slices(one: Callable[[int], Awaitable[object]]) -> None:
    """The single mode's protocol (module docstring) around ``await one(i)``, one call of job i."""
    loop = asyncio.get_running_loop()
    print("ready", flush=True)
    i = 0
    while line := await loop.run_in_executor(None, sys.stdin.readline):  # between slices: not timed
        ms = []
        for _ in range(int(line)):
            t = time.perf_counter()
            await one(i)
            ms.append((time.perf_counter() - t) * 1000)
            i += 1
        print(json.dumps(ms), flush=True)


def pyscheduler_single(dsn: str, a: int, b: int, concurrency: int) -> dict:
    from ... import migrate
    from ...db import Database
    from ...tasks import TaskClient

    migrate.migrate(dsn)
    with Database(dsn, min_size=1, max_size=2) as db, monitored(dsn):
        client = TaskClient(db)
        client.submit_ids(QUEUE, [{"i": -1}])  # warm: the pool, the plans

        async def one(i: int) -> None:  # the client's blocking call, as an application makes it
            client.submit_ids(QUEUE, [{"i": i}])
        asyncio.run(slices(one))
    return dict(system="pyscheduler")


def pyscheduler_e2e(dsn: str, rate: float, seconds: float, concurrency: int, backlog: int = 0,
                    keep_completed: bool = True, spec_index: bool = True) -> dict:
    from ... import __version__, migrate
    from ...db import Database
    from ...tasks import TaskClient, Worker

    migrate.migrate(dsn)
    if not spec_index:
        migrate.set_spec_index(dsn, False)
    if not keep_completed:
        with Database(dsn, min_size=1, max_size=1) as db:
            TaskClient(db).set_queue_keep_completed(QUEUE, False)
    seen: list[int] = []
    latencies: list[float] = []
    starts: list[float] = []
    last: list[float] = []
    lock = threading.Lock()

    def handle(ctx) -> None:
        now = time.perf_counter()
        with lock:
            seen.append(ctx.spec["i"])
            latencies.append((now - ctx.spec["t"]) * 1000)
            starts.append(now)
            last[:] = [now]

    running = Worker(dsn, QUEUE, handle, capacity=concurrency, poll_interval=0.5).start()
    running.wait_idle(timeout=30)
    try:
        with monitored(dsn):
            made = produced(producer("pyscheduler", dsn, rate, seconds, backlog, lambda: len(seen)))
            drain(lambda: len(seen), made["submitted"])
    finally:
        running.stop()
    return dict(system="pyscheduler", version=__version__, **_done(seen, made, last, latencies, starts),
                settings=f"Worker capacity {concurrency}, poll 0.5 s; a tasks Monitor; producer "
                         "TaskClient.submit_ids")  # a variant's (flow.VARIANTS) says what it changes


def pyscheduler_produce(dsn: str, rate: float, seconds: float, backlog: int = 0) -> dict:
    from ...db import Database
    from ...tasks import TaskClient

    with Database(dsn, min_size=1, max_size=2) as db:
        client = TaskClient(db)
        client.submit_ids("warm", [{}])
        return produce(lambda batch: client.submit_ids(QUEUE, batch), rate, seconds, backlog)


def produce(submit, rate: float, seconds: float, backlog: int = 0) -> dict:
    """Submit for seconds: rate jobs/s, a call every TICK with the jobs due by then; or, with a
    backlog, calls of up to BULK while fewer than backlog jobs wait (``Started``). Each job with
    its index i and t = perf_counter() (CLOCK_MONOTONIC: the same clock in every process)."""
    ran = Started() if backlog else None
    started = time.perf_counter()
    sent = 0
    while (elapsed := time.perf_counter() - started) < seconds:
        due = min(BULK, backlog - (sent - ran.value)) if ran else int(rate * elapsed) - sent
        if due > 0:
            t = time.perf_counter()
            submit([{"i": i, "t": t} for i in range(sent, sent + due)])
            sent += due
        if ran:
            time.sleep(0 if due > 0 else FEED / 2)
        else:
            time.sleep(max(0.0, TICK - (time.perf_counter() - started - elapsed)))
    return dict(submitted=sent, started=started, ended=time.perf_counter())


def drain(count, submitted: int) -> None:
    cap = time.perf_counter() + DRAIN_SECONDS
    while count() < submitted and time.perf_counter() < cap:
        time.sleep(0.005)


# -- pgqueuer -------------------------------------------------------------------------------------

# QueueManager.run's batch_size: pgqueuer's performance guide says to raise it for short jobs; of
# 10 (its default), 50, 100, 200 and 500, and of 1 to 5 QueueManagers, one manager with 100 was
# fastest here (docs/benchmarks.md, issue 31). No entrypoint concurrency_limit: the guide's tool
# for a scarce resource, enforced in the database across the fleet (with one of 10 and completions
# logged in batches, a worker ran about 10 jobs a NOTIFY, ~1,000 jobs/s); max_concurrent_tasks
# (the per-process ceiling) left unlimited, its default, as in pgqueuer's own benchmark.
PGQ_BATCH = 100


async def _pgq(dsn: str):
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries
    from pgqueuer.adapters.persistence.qb import QueryBuilderEnvironment
    from pgqueuer.domain.settings import DBSettings

    conn = await asyncpg.connect(dsn)
    queries = Queries(AsyncpgDriver(conn))
    await queries.install()
    await conn.execute(QueryBuilderEnvironment(DBSettings()).build_optimize_autovacuum_query())  # pgq autovac
    return conn, queries


def pgqueuer_enqueue(dsn: str, bulk_jobs: int, single_jobs: int, concurrency: int) -> dict:
    async def run() -> dict:
        conn, queries = await _pgq(dsn)
        await queries.enqueue("flow", b"{}")
        bulk_ms, single_ms = [], []
        t0 = time.perf_counter()
        for first in range(0, bulk_jobs, BULK):
            n = min(BULK, bulk_jobs - first)
            t = time.perf_counter()
            await queries.enqueue(["flow"] * n, [json.dumps({"i": i}).encode() for i in range(first, first + n)],
                                  [0] * n)
            bulk_ms.append((time.perf_counter() - t) * 1000)
        bulk_s = time.perf_counter() - t0
        for i in range(single_jobs):
            t = time.perf_counter()
            await queries.enqueue("flow", json.dumps({"i": i}).encode())
            single_ms.append((time.perf_counter() - t) * 1000)
        await conn.close()
        return dict(bulk_s=bulk_s, bulk_ms=bulk_ms, single_ms=single_ms)

    import pgqueuer
    import uvloop  # as its end to end below: its dependency, and its own benchmark's loop
    return dict(system="pgqueuer", version=getattr(pgqueuer, "__version__", "?"), **uvloop.run(run()),
                settings="Queries(AsyncpgDriver(conn)).enqueue, one asyncpg connection, uvloop")


def pgqueuer_single(dsn: str, a: int, b: int, concurrency: int) -> dict:
    async def run() -> None:
        conn, queries = await _pgq(dsn)
        await queries.enqueue("flow", b"{}")
        await slices(lambda i: queries.enqueue("flow", json.dumps({"i": i}).encode()))
        await conn.close()

    import uvloop
    uvloop.run(run())
    return dict(system="pgqueuer")


def pgqueuer_e2e(dsn: str, rate: float, seconds: float, concurrency: int, backlog: int = 0) -> dict:
    async def run() -> dict:
        import asyncpg
        from pgqueuer import AsyncpgDriver, Queries, QueueManager

        conn, _ = await _pgq(dsn)
        seen: list[int] = []
        latencies: list[float] = []
        starts: list[float] = []
        last: list[float] = []
        qm = QueueManager(Queries(AsyncpgDriver(await asyncpg.connect(dsn))))  # a connection of its own

        @qm.entrypoint("flow")
        async def flow(job) -> None:
            now = time.perf_counter()
            spec = json.loads(job.payload)
            seen.append(spec["i"])
            latencies.append((now - spec["t"]) * 1000)
            starts.append(now)
            last[:] = [now]

        worker = asyncio.create_task(qm.run(batch_size=PGQ_BATCH))
        await asyncio.sleep(1.0)  # listening
        made = await asyncio.to_thread(produced, producer("pgqueuer", dsn, rate, seconds, backlog, lambda: len(seen)))
        cap = time.perf_counter() + DRAIN_SECONDS
        while len(seen) < made["submitted"] and time.perf_counter() < cap:
            await asyncio.sleep(0.005)
        qm.shutdown.set()
        await asyncio.wait_for(worker, 30)
        await conn.close()
        return _done(seen, made, last, latencies, starts)

    import pgqueuer
    import uvloop
    return dict(system="pgqueuer", version=getattr(pgqueuer, "__version__", "?"), **uvloop.run(run()),
                settings=f"QueueManager.run(batch_size={PGQ_BATCH}) on a connection of its own, no concurrency "
                         "limits, pgq autovac, uvloop; producer Queries.enqueue")


def pgqueuer_produce(dsn: str, rate: float, seconds: float, backlog: int = 0) -> dict:
    async def run() -> dict:
        import asyncpg
        from pgqueuer import AsyncpgDriver, Queries

        conn = await asyncpg.connect(dsn)
        queries = Queries(AsyncpgDriver(conn))
        ran = Started() if backlog else None
        started = time.perf_counter()
        sent = 0
        while (elapsed := time.perf_counter() - started) < seconds:
            due = min(BULK, backlog - (sent - ran.value)) if ran else int(rate * elapsed) - sent
            if due > 0:
                t = time.perf_counter()
                await queries.enqueue(["flow"] * due, [json.dumps({"i": i, "t": t}).encode()
                                                       for i in range(sent, sent + due)], [0] * due)
                sent += due
            if ran:
                await asyncio.sleep(0 if due > 0 else FEED / 2)
            else:
                await asyncio.sleep(max(0.0, TICK - (time.perf_counter() - started - elapsed)))
        await conn.close()
        return dict(submitted=sent, started=started, ended=time.perf_counter())

    import uvloop
    return uvloop.run(run())


RUNNERS = {("pyscheduler", "enqueue"): pyscheduler_enqueue, ("pyscheduler", "e2e"): pyscheduler_e2e,
           ("pyscheduler-nokeep", "e2e"): lambda *a: pyscheduler_e2e(*a, keep_completed=False),
           ("pyscheduler-nosearch", "e2e"): lambda *a: pyscheduler_e2e(*a, spec_index=False),
           ("pyscheduler", "produce"): pyscheduler_produce, ("pgqueuer", "enqueue"): pgqueuer_enqueue,
           ("pgqueuer", "e2e"): pgqueuer_e2e, ("pgqueuer", "produce"): pgqueuer_produce,
           ("pyscheduler", "single"): pyscheduler_single, ("pgqueuer", "single"): pgqueuer_single}


def main(argv: list[str]) -> int:
    system, mode, dsn, a, b = argv[:5]
    extra = int(argv[5]) if len(argv) > 5 else 0  # N, or produce's BACKLOG
    if mode == "capacity":
        result = RUNNERS[system, "e2e"](dsn, 0.0, float(b), extra, int(a))
    elif mode in ("e2e", "produce"):
        result = RUNNERS[system, mode](dsn, float(a), float(b), extra)
    else:
        result = RUNNERS[system, mode](dsn, int(a), int(b), extra)
    text = json.dumps(result)
    if os.environ.get("PYSCHEDULER_FLOW_RESULT"):  # flow.run_one's file (see there)
        with open(os.environ["PYSCHEDULER_FLOW_RESULT"], "w") as f:
            f.write(text)
    else:
        print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
