"""The runners of ``pyscheduler bench peers``' enqueue and end-to-end sections (flow.py) for
pyscheduler and pgqueuer (graphile-worker's: bench/peers/graphile_flow.js). Given an EMPTY
database, each prints one line of JSON:

    python -m pyscheduler.bench.peers.flow_runner SYSTEM enqueue|e2e DSN BULK_JOBS|RATE SINGLE_JOBS|SECONDS N
    python -m pyscheduler.bench.peers.flow_runner SYSTEM produce DSN RATE SECONDS  (e2e's producer process)

Each system as its users call it: pyscheduler ``TaskClient(Database).submit_ids`` and ``Worker``;
pgqueuer ``Queries.enqueue`` on asyncpg and ``QueueManager`` with its documented settings."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from datetime import timedelta

BULK = 1000
TICK = 0.01
QUEUE = "flow"
DRAIN_SECONDS = 60  # after producing, the cap on waiting for the backlog (a run past it: not exactly once)


def _done(seen: list[int], produced: dict, last: list[float], latencies: list[float]) -> dict:
    """The e2e result: throughput's parts, exactly once (every index ran once: none missing after
    the drain cap, none twice), the enqueue-to-start latencies."""
    submitted, distinct = produced["submitted"], set(seen)
    return dict(submitted=submitted, completed=len(seen), duplicates=len(seen) - len(distinct),
                missing=len(set(range(submitted)) - distinct),
                exactly_once=len(seen) == len(distinct) == submitted and distinct == set(range(submitted)),
                total_s=(last[0] if last else time.perf_counter()) - produced["started"], latency_ms=latencies)


def producer(system: str, dsn: str, rate: float, seconds: float) -> subprocess.Popen[str]:
    """The e2e producer, a process of its own (as an application's is): ``SYSTEM produce``."""
    return subprocess.Popen([sys.executable, "-m", __spec__.name, system, "produce", dsn, f"{rate:g}", f"{seconds:g}"],
                            stdout=subprocess.PIPE, text=True)


def produced(proc: subprocess.Popen[str]) -> dict:
    out, _ = proc.communicate(timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"the producer failed (exit {proc.returncode})")
    return json.loads(out.strip().splitlines()[-1])


# -- pyscheduler ----------------------------------------------------------------------------------

def pyscheduler_enqueue(dsn: str, bulk_jobs: int, single_jobs: int, concurrency: int) -> dict:
    from ... import migrate
    from ...db import Database
    from ...tasks import TaskClient

    migrate.migrate(dsn)
    with Database(dsn, min_size=1, max_size=2) as db:
        client = TaskClient(db)
        client.submit_ids(QUEUE, [{"i": -1}])  # warm: the pool, the plans
        bulk_ms, single_ms = [], []
        variants = {"": {}, "delayed": {"run_at": timedelta(hours=1)}, "unique": {}}  # plain first: bulk_ms's
        seconds = {}
        for name, options in variants.items():
            t0 = time.perf_counter()
            for first in range(0, bulk_jobs, BULK):
                ids = range(first, min(first + BULK, bulk_jobs))
                keys = {"unique_keys": [f"k{i}" for i in ids]} if name == "unique" else {}
                t = time.perf_counter()
                client.submit_ids(QUEUE, [{"i": i} for i in ids], **options, **keys)
                if not name:
                    bulk_ms.append((time.perf_counter() - t) * 1000)
            seconds[name] = time.perf_counter() - t0
        bulk_s = seconds.pop("")
        for i in range(single_jobs):
            t = time.perf_counter()
            client.submit_ids(QUEUE, [{"i": i}])
            single_ms.append((time.perf_counter() - t) * 1000)
    from ... import __version__
    return dict(system="pyscheduler", version=__version__, bulk_s=bulk_s, bulk_ms=bulk_ms, single_ms=single_ms,
                variants_s=seconds,
                settings="TaskClient(Database(dsn)).submit_ids (submit_tasks_lean), pool of 2")


def pyscheduler_e2e(dsn: str, rate: float, seconds: float, concurrency: int) -> dict:
    from ... import __version__, migrate
    from ...tasks import Worker

    migrate.migrate(dsn)
    seen: list[int] = []
    latencies: list[float] = []
    last: list[float] = []
    lock = threading.Lock()

    def handle(ctx) -> None:
        now = time.perf_counter()
        with lock:
            seen.append(ctx.spec["i"])
            latencies.append((now - ctx.spec["t"]) * 1000)
            last[:] = [now]

    running = Worker(dsn, QUEUE, handle, capacity=concurrency, poll_interval=0.5).start()
    running.wait_idle(timeout=30)
    try:
        made = produced(producer("pyscheduler", dsn, rate, seconds))
        drain(lambda: len(seen), made["submitted"])
    finally:
        running.stop()
    return dict(system="pyscheduler", version=__version__, **_done(seen, made, last, latencies),
                settings=f"Worker capacity {concurrency}, poll 0.5 s; producer TaskClient.submit_ids")


def pyscheduler_produce(dsn: str, rate: float, seconds: float, _: int = 0) -> dict:
    from ...db import Database
    from ...tasks import TaskClient

    with Database(dsn, min_size=1, max_size=2) as db:
        client = TaskClient(db)
        client.submit_ids("warm", [{}])
        return produce(lambda batch: client.submit_ids(QUEUE, batch), rate, seconds)


def produce(submit, rate: float, seconds: float) -> dict:
    """Submit rate jobs/s for seconds, a call every TICK with the jobs due by then, each job with
    its index i and t = perf_counter() (CLOCK_MONOTONIC: the same clock in every process)."""
    started = time.perf_counter()
    sent = 0
    while (elapsed := time.perf_counter() - started) < seconds:
        due = int(rate * elapsed) - sent
        if due > 0:
            t = time.perf_counter()
            submit([{"i": i, "t": t} for i in range(sent, sent + due)])
            sent += due
        time.sleep(max(0.0, TICK - (time.perf_counter() - started - elapsed)))
    return dict(submitted=sent, started=started)


def drain(count, submitted: int) -> None:
    cap = time.perf_counter() + DRAIN_SECONDS
    while count() < submitted and time.perf_counter() < cap:
        time.sleep(0.005)


# -- pgqueuer -------------------------------------------------------------------------------------

PGQ_BATCH = 10  # QueueManager.run's batch_size (its default, the documented benchmark's)


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
    return dict(system="pgqueuer", version=getattr(pgqueuer, "__version__", "?"), **asyncio.run(run()),
                settings="Queries(AsyncpgDriver(conn)).enqueue, one asyncpg connection")


def pgqueuer_e2e(dsn: str, rate: float, seconds: float, concurrency: int) -> dict:
    async def run() -> dict:
        from pgqueuer import QueueManager

        conn, queries = await _pgq(dsn)
        seen: list[int] = []
        latencies: list[float] = []
        last: list[float] = []
        qm = QueueManager(queries)

        @qm.entrypoint("flow", concurrency_limit=concurrency)
        async def flow(job) -> None:
            now = time.perf_counter()
            spec = json.loads(job.payload)
            seen.append(spec["i"])
            latencies.append((now - spec["t"]) * 1000)
            last[:] = [now]

        worker = asyncio.create_task(qm.run(batch_size=PGQ_BATCH))
        await asyncio.sleep(1.0)  # listening
        proc = producer("pgqueuer", dsn, rate, seconds)
        made = await asyncio.to_thread(produced, proc)
        cap = time.perf_counter() + DRAIN_SECONDS
        while len(seen) < made["submitted"] and time.perf_counter() < cap:
            await asyncio.sleep(0.005)
        qm.shutdown.set()
        await asyncio.wait_for(worker, 30)
        await conn.close()
        return _done(seen, made, last, latencies)

    import pgqueuer
    return dict(system="pgqueuer", version=getattr(pgqueuer, "__version__", "?"), **asyncio.run(run()),
                settings=f"QueueManager.run(batch_size={PGQ_BATCH}), concurrency_limit {concurrency}, "
                         "pgq autovac; producer Queries.enqueue")


def pgqueuer_produce(dsn: str, rate: float, seconds: float, _: int = 0) -> dict:
    async def run() -> dict:
        import asyncpg
        from pgqueuer import AsyncpgDriver, Queries

        conn = await asyncpg.connect(dsn)
        queries = Queries(AsyncpgDriver(conn))
        started = time.perf_counter()
        sent = 0
        while (elapsed := time.perf_counter() - started) < seconds:
            due = int(rate * elapsed) - sent
            if due > 0:
                t = time.perf_counter()
                await queries.enqueue(["flow"] * due, [json.dumps({"i": i, "t": t}).encode()
                                                       for i in range(sent, sent + due)], [0] * due)
                sent += due
            await asyncio.sleep(max(0.0, TICK - (time.perf_counter() - started - elapsed)))
        await conn.close()
        return dict(submitted=sent, started=started)

    return asyncio.run(run())


RUNNERS = {("pyscheduler", "enqueue"): pyscheduler_enqueue, ("pyscheduler", "e2e"): pyscheduler_e2e,
           ("pyscheduler", "produce"): pyscheduler_produce, ("pgqueuer", "enqueue"): pgqueuer_enqueue,
           ("pgqueuer", "e2e"): pgqueuer_e2e, ("pgqueuer", "produce"): pgqueuer_produce}


def main(argv: list[str]) -> int:
    system, mode, dsn, a, b = argv[:5]
    concurrency = int(argv[5]) if len(argv) > 5 else 0
    timed = mode in ("e2e", "produce")
    print(json.dumps(RUNNERS[system, mode](dsn, float(a) if timed else int(a), float(b) if timed else int(b),
                                           concurrency)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
