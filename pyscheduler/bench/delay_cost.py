"""What a delay message costs the database on the relay's path: backend CPU per message of
enqueue_messages, then ready_and_claim + delete_fired, read from /proc (so the figures hold on a
loaded machine where rates do not).

    python -m pyscheduler.bench.delay_cost "$DSN_A" "$DSN_B" --messages 20000 --rounds 4

On the database server's machine, on migrated scratch databases; with two or more the runs
alternate A/B/B/A. A run enqueues its messages due now (batches of 1,000, store_late), then
claims and fires them in batches of 1,000 with a node of its own; none is left.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid

import psycopg

from . import sqlapi as sql
from .stats import TICK, process_cpu, require_local


def run(dsn: str, n: int, value_bytes: int) -> tuple[float, float]:
    """(enqueue, claim + fire) backend CPU in us per message."""
    with psycopg.connect(dsn, autocommit=True) as c:
        pid, tag = c.info.backend_pid, uuid.uuid4().hex[:8]
        before = process_cpu(pid)
        for k in range(0, n, 1000):
            c.execute(sql.ENQUEUE_DUE_NOW, ([f"cost-{tag}-{k + i}" for i in range(1000)], b"v" * value_bytes))
        enqueued, node, fired = process_cpu(pid), uuid.uuid4(), 0
        while rows := c.execute(sql.CLAIM_READY, (node, None)).fetchall():
            c.execute(sql.DELETE_FIRED, ([r[0] for r in rows], node))
            fired += len(rows)
        done = process_cpu(pid)
    return (enqueued - before) / n * 1e6, (done - enqueued) / max(fired, 1) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dsns", nargs="+")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--value-bytes", type=int, default=1, help="each message's value (the flatness bench: 1)")
    a = parser.parse_args()
    for dsn in a.dsns:
        require_local(dsn)
    order = a.dsns if len(a.dsns) == 1 else a.dsns + a.dsns[::-1]
    runs: dict[str, list[tuple[float, float]]] = {d: [] for d in a.dsns}
    started = time.monotonic()
    for _ in range(a.rounds):
        for dsn in order:
            runs[dsn].append(run(dsn, a.messages, a.value_bytes))
    for i, dsn in enumerate(a.dsns):
        enq = [r[0] for r in runs[dsn]]
        fire = [r[1] for r in runs[dsn]]
        print(f"{chr(65 + i)} {dsn.rsplit('/', 1)[-1]}: enqueue {statistics.median(enq):.1f} us/msg "
              f"({', '.join(f'{x:.1f}' for x in enq)}), claim + fire {statistics.median(fire):.1f} us/msg "
              f"({', '.join(f'{x:.1f}' for x in fire)})")
    print(f"{a.messages:,} messages of {a.value_bytes} bytes a run, {len(order) * a.rounds} runs "
          f"in {time.monotonic() - started:.0f} s; load average {os.getloadavg()[0]:.2f} "
          f"(CPU in {1e6 / TICK / a.messages:.1f} us steps)")


if __name__ == "__main__":
    main()
