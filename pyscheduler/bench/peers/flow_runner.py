"""The runners of ``pyscheduler bench peers``' enqueue and end-to-end sections (flow.py) for
pyscheduler and pgqueuer (graphile-worker's: bench/peers/graphile_flow.js). Given an EMPTY
database, each prints one line of JSON:

    python -m pyscheduler.bench.peers.flow_runner SYSTEM enqueue DSN BULK_JOBS SINGLE_JOBS CONCURRENCY
    python -m pyscheduler.bench.peers.flow_runner SYSTEM e2e DSN RATE SECONDS CONCURRENCY

Each system as its users call it: pyscheduler ``TaskClient(Database).submit_ids`` and ``Worker``;
pgqueuer ``Queries.enqueue`` on asyncpg and ``QueueManager`` with its documented settings."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time

BULK = 1000
TICK = 0.01
QUEUE = "flow"
DRAIN_SECONDS = 60  # after producing, the cap on waiting for the backlog (a run past it: not exactly once)


def _done(seen: list[int], submitted: int, started: float, last: list[float], latencies: list[float]) -> dict:
    return dict(submitted=submitted, completed=len(seen), distinct=len(set(seen)),
                exactly_once=len(seen) == len(set(seen)) == submitted and set(seen) == set(range(submitted)),
                total_s=(last[0] if last else time.perf_counter()) - started, latency_ms=latencies)


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
        t0 = time.perf_counter()
        for first in range(0, bulk_jobs, BULK):
            t = time.perf_counter()
            client.submit_ids(QUEUE, [{"i": i} for i in range(first, min(first + BULK, bulk_jobs))])
            bulk_ms.append((time.perf_counter() - t) * 1000)
        bulk_s = time.perf_counter() - t0
        for i in range(single_jobs):
            t = time.perf_counter()
            client.submit_ids(QUEUE, [{"i": i}])
            single_ms.append((time.perf_counter() - t) * 1000)
    from ... import __version__
    return dict(system="pyscheduler", version=__version__, bulk_s=bulk_s, bulk_ms=bulk_ms, single_ms=single_ms,
                settings="TaskClient(Database(dsn)).submit_ids (submit_tasks_lean), pool of 2")


def pyscheduler_e2e(dsn: str, rate: float, seconds: float, concurrency: int) -> dict:
    from ... import __version__, migrate
    from ...db import Database
    from ...tasks import TaskClient, Worker

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
        with Database(dsn, min_size=1, max_size=2) as db:
            client = TaskClient(db)
            submitted, started = produce(lambda batch: client.submit_ids(QUEUE, batch), rate, seconds)
        drain(lambda: len(seen), submitted)
    finally:
        running.stop()
    return dict(system="pyscheduler", version=__version__, **_done(seen, submitted, started, last, latencies),
                settings=f"Worker capacity {concurrency}, poll 0.5 s; producer TaskClient.submit_ids")


def produce(submit, rate: float, seconds: float) -> tuple[int, float]:
    """Submit rate jobs/s for seconds, a call every TICK with the jobs due by then; (jobs, start)."""
    started = time.perf_counter()
    sent = 0
    while (elapsed := time.perf_counter() - started) < seconds:
        due = int(rate * elapsed) - sent
        if due > 0:
            t = time.perf_counter()
            submit([{"i": i, "t": t} for i in range(sent, sent + due)])
            sent += due
        time.sleep(max(0.0, TICK - (time.perf_counter() - started - elapsed)))
    return sent, started


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
        import asyncpg
        from pgqueuer import AsyncpgDriver, Queries, QueueManager

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
        pconn = await asyncpg.connect(dsn)
        producer = Queries(AsyncpgDriver(pconn))
        started = time.perf_counter()
        sent = 0
        while (elapsed := time.perf_counter() - started) < seconds:
            due = int(rate * elapsed) - sent
            if due > 0:
                t = time.perf_counter()
                await producer.enqueue(["flow"] * due, [json.dumps({"i": i, "t": t}).encode()
                                                        for i in range(sent, sent + due)], [0] * due)
                sent += due
            await asyncio.sleep(max(0.0, TICK - (time.perf_counter() - started - elapsed)))
        cap = time.perf_counter() + DRAIN_SECONDS
        while len(seen) < sent and time.perf_counter() < cap:
            await asyncio.sleep(0.005)
        qm.shutdown.set()
        await asyncio.wait_for(worker, 30)
        await pconn.close()
        await conn.close()
        return _done(seen, sent, started, last, latencies)

    import pgqueuer
    return dict(system="pgqueuer", version=getattr(pgqueuer, "__version__", "?"), **asyncio.run(run()),
                settings=f"QueueManager.run(batch_size={PGQ_BATCH}), concurrency_limit {concurrency}, "
                         "pgq autovac; producer Queries.enqueue")


RUNNERS = {("pyscheduler", "enqueue"): pyscheduler_enqueue, ("pyscheduler", "e2e"): pyscheduler_e2e,
           ("pgqueuer", "enqueue"): pgqueuer_enqueue, ("pgqueuer", "e2e"): pgqueuer_e2e}


def main(argv: list[str]) -> int:
    system, mode, dsn, a, b, concurrency = argv[:6]
    print(json.dumps(RUNNERS[system, mode](dsn, float(a) if mode == "e2e" else int(a),
                                           float(b) if mode == "e2e" else int(b), int(concurrency))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
