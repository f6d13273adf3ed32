"""Peer run for ``pyscheduler bench tasks --peer-python``: procrastinate, no-op jobs.

Runs in its own virtualenv (``python -m venv /tmp/peer && /tmp/peer/bin/pip
install 'procrastinate==3.10.*'``), against an EMPTY database it may fill:

    /tmp/peer/bin/python bench/tasks_peer_procrastinate.py DSN JOBS CONCURRENCY

Applies procrastinate's schema, defers JOBS no-op jobs in one batch, then runs
a worker (``wait=False``: it stops when the queue is empty) and prints one line
of JSON: {"peer": "procrastinate 3.10.0", "jobs": N, "seconds": S, "jobs_per_s": R}.
"""

import asyncio
import json
import sys
import time

import procrastinate


async def main(dsn: str, jobs: int, concurrency: int) -> None:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(queue="bench")
    async def noop() -> None:
        return None

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        for start in range(0, jobs, 5000):
            await noop.batch_defer_async(*[{} for _ in range(min(5000, jobs - start))])
        started = time.perf_counter()
        await app.run_worker_async(queues=["bench"], concurrency=concurrency, wait=False,
                                   install_signal_handlers=False)
        seconds = time.perf_counter() - started
    async with app.open_async():
        done = await app.connector.execute_query_one_async(
            "SELECT count(*) AS n FROM procrastinate_jobs WHERE status = 'succeeded'")
    print(json.dumps({"peer": f"procrastinate {procrastinate.__version__}", "jobs": done["n"],
                      "seconds": seconds, "jobs_per_s": done["n"] / seconds}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
