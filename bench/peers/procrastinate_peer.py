"""Peer runner of ``pyscheduler bench peers``: procrastinate (PyPI), no-op jobs.

Follows the runner protocol of pyscheduler/bench/peers/runner.py (its helpers
are imported from there; procrastinate is in the ``bench`` extra):

    python bench/peers/procrastinate_peer.py DSN JOBS CONCURRENCY SAMPLES GAP_MS MAX_SECONDS

Settings: one worker, ``concurrency`` = CONCURRENCY, LISTEN/NOTIFY on
(procrastinate's default), jobs deferred 5,000 per ``batch_defer_async``.
The worker runs in an asyncio loop of its own thread; the protocol's steps
drive it from the main thread.
"""

import asyncio
import contextlib
import sys
import threading

import procrastinate

from pyscheduler.bench.peers.runner import Args, Counter, report, run_phases


def main(a: Args) -> None:
    counter = Counter()
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=a.dsn))

    @app.task(queue="bench", name="noop", pass_context=False)
    async def noop(**payload) -> None:
        counter.handled(payload)

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    def run(coro, timeout: float = 600):
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)

    async def open_app() -> None:
        await app.open_async()
        await app.schema_manager.apply_schema_async()

    def start(ready: bool) -> asyncio.Task:
        async def begin() -> asyncio.Task:
            return asyncio.ensure_future(app.run_worker_async(
                queues=["bench"], concurrency=a.concurrency, wait=True, install_signal_handlers=False))
        worker = run(begin())
        if ready:  # let it start listening (the protocol's warm-up jobs absorb the rest)
            run(asyncio.sleep(0.5))
        return worker

    def stop(worker: asyncio.Task) -> None:
        async def halt() -> None:
            worker.cancel()  # procrastinate's way to stop a worker gracefully
            with contextlib.suppress(asyncio.CancelledError):
                await worker
        run(halt())

    async def enqueue_all() -> float:
        started = loop.time()
        for done in range(0, a.jobs, 5000):
            await noop.batch_defer_async(*[{} for _ in range(min(5000, a.jobs - done))])
        seconds = loop.time() - started
        await app.connector.execute_query_async("ANALYZE")
        return seconds

    async def durable() -> int:
        row = await app.connector.execute_query_one_async(
            "SELECT count(*) AS n FROM procrastinate_jobs WHERE status = 'succeeded'")
        return row["n"]

    run(open_app())
    try:
        result = run_phases(a, counter, start, stop, lambda payload: run(noop.defer_async(**payload)),
                            lambda: run(enqueue_all()), lambda: run(durable()))
    finally:
        run(app.close_async())
    report(system="procrastinate", version=procrastinate.__version__, **result,
           settings=f"concurrency {a.concurrency}, LISTEN/NOTIFY, batch_defer 5,000")


if __name__ == "__main__":
    main(Args.parse(sys.argv[1:]))
