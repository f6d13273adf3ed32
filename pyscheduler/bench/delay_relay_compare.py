"""Compare the delay relay of two checkouts, interleaved, on the same servers.

    python -m pyscheduler.bench.delay_relay_compare --base /tmp/relay-base --rates 1000,10000,20000 --rounds 2

One embedded PostgreSQL and broker, a database per checkout; for each round and rate, each
checkout's ``pyscheduler bench delay`` in turn (PYTHONPATH selects it), while a Sampler reads
the CPU of its relays, of the server's processes and of the broker from /proc. One line per
run: steady msg/s, jitter percentiles, lost / duplicates, CPU per message, load average.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from .. import embedded
from .stats import children, command_line, process_cpu, tree

HERE = Path(__file__).resolve().parents[2]  # this checkout


class Sampler(threading.Thread):
    """Last seen CPU seconds per pid of the relays (children of the bench running
    pyscheduler.delay) and of the server trees."""

    def __init__(self, bench_pid: int, servers: dict[str, int]):
        super().__init__(daemon=True)
        self.bench_pid, self.servers = bench_pid, servers
        self.relay: dict[int, float] = {}
        self.server: dict[str, dict[int, float]] = {name: {} for name in servers}
        self.start_server: dict[str, dict[int, float]] | None = None
        self.done = threading.Event()

    def sample(self) -> None:
        for pid in children(self.bench_pid):
            if "pyscheduler.delay" in (command_line(pid) or ()):
                self.relay[pid] = max(self.relay.get(pid, 0.0), process_cpu(pid))
        for name, root in self.servers.items():
            for pid in tree(root):
                self.server[name][pid] = max(self.server[name].get(pid, 0.0), process_cpu(pid))
        if self.start_server is None:
            self.start_server = {n: dict(d) for n, d in self.server.items()}

    def run(self) -> None:
        n = 0
        while not self.done.wait(0.2):
            self.sample()
            n += 1
            if self.dsn and n % 5 == 0:
                self.slow_queries()

    dsn: str | None = None
    slow: dict[str, int] = {}

    def slow_queries(self) -> None:
        """Statements running for over half a second (a sign of a bad plan or a lock)."""
        import psycopg

        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                for (query,) in conn.execute(
                        "SELECT left(query, 70) FROM pg_stat_activity WHERE state = 'active' "
                        "AND pid <> pg_backend_pid() AND now() - query_start > interval '0.5 s'"):
                    self.slow[query] = self.slow.get(query, 0) + 1
        except psycopg.Error:
            pass

    def server_cpu(self, name: str) -> float:
        start = self.start_server[name] if self.start_server else {}
        return sum(v - start.get(pid, 0.0) for pid, v in self.server[name].items())


def one_run(checkout: Path, dsn: str, bootstrap: str, rate: int, duration: float, servers: dict[str, int],
            extra: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    argv = [sys.executable, "-m", "pyscheduler", "--log-level", "WARNING", "bench", "delay", "--dsn", dsn,
            "--bootstrap-servers", bootstrap, "--rate", str(rate), "--duration", str(duration), *extra]
    proc = subprocess.Popen(argv, env=env, cwd=tempfile.gettempdir(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    sampler = Sampler(proc.pid, servers)
    sampler.dsn, sampler.slow = dsn, {}
    sampler.start()
    lines = []
    at_start: dict[int, float] = {}
    for line in proc.stdout:
        lines.append(line)
        if "producing" in line and not at_start:  # the relays' start-up and warm-up are left out
            sampler.sample()
            at_start = dict(sampler.relay) or {0: 0.0}
            sampler.start_server = {n: dict(d) for n, d in sampler.server.items()}
    proc.wait()
    out = "".join(lines)
    sampler.done.set()
    sampler.join()
    load = os.getloadavg()[0]
    res: dict = {"out": out, "rc": proc.returncode, "load": load}
    if m := re.search(r"received (\d+) \((\d+) duplicates\), lost (\d+)", out):
        res.update(received=int(m[1]), dup=int(m[2]), lost=int(m[3]))
    if m := re.search(r"throughput: (\S+) msg/s in steady state", out):
        res["steady"] = float(m[1])
    if m := re.search(r"\(ms\): p50 (\S+), p99 (\S+), p99.9 (\S+), max (\S+),", out):
        res.update(p50=float(m[1]), p99=float(m[2]), p999=float(m[3]), max=float(m[4]))
    if m := re.search(r"produced (\d+)", out):
        res["total"] = int(m[1])
    res["slow"] = sampler.slow
    res["relay_cpu"] = sum(v - at_start.get(pid, 0.0) for pid, v in sampler.relay.items())
    res["pg_cpu"] = sampler.server_cpu("pg")
    res["kafka_cpu"] = sampler.server_cpu("kafka")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=Path, required=True, help="checkout of the baseline (e.g. main)")
    ap.add_argument("--new", type=Path, default=HERE, help="checkout under test (default: this one)")
    ap.add_argument("--rates", default="1000,10000,20000")
    ap.add_argument("--duration", type=float, default=15)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--side", action="append", default=[], metavar="NAME=PATH",
                    help="a further checkout to run in every round (e.g. orig=/tmp/relay-orig)")
    ap.add_argument("--only", choices=["base", "new"], default=None, help="run one side only")
    ap.add_argument("--bench-arg", action="append", default=[], help="extra flag for pyscheduler bench delay")
    args = ap.parse_args()
    sides = {"base": args.base.resolve(), "new": args.new.resolve()}
    if args.only:
        sides = {args.only: sides[args.only]}
    for extra in args.side:
        name, _, path = extra.partition("=")
        sides[name] = Path(path).resolve()
    with tempfile.TemporaryDirectory(prefix="relay-compare-") as tmp:
        pg = embedded.Postgres(Path(tmp) / "pg").start()
        broker = embedded.Kafka(Path(tmp) / "kafka").start()
        try:
            import psycopg

            with psycopg.connect(pg.dsn(), autocommit=True) as conn:
                for name in sides:
                    conn.execute(f"CREATE DATABASE relay_{name}")
            servers = {"pg": pg.pid, "kafka": broker.pid}
            print("side  rate    round  steady  p50     p99     p99.9   max     lost/dup  relay-cpu-s  "
                  "relay-us/msg  pg-us/msg  kafka-us/msg  load1", flush=True)
            for rnd in range(args.rounds):
                for rate in [int(r) for r in args.rates.split(",")]:
                    order = list(sides)[rnd % len(sides):] + list(sides)[:rnd % len(sides)]
                    for name in order:
                        r = one_run(sides[name], pg.dsn(f"relay_{name}"), broker.bootstrap, rate, args.duration,
                                    servers, args.bench_arg)
                        if "p50" not in r:
                            print(f"{name} {rate} failed rc={r['rc']}:\n{r['out'][-3000:]}", flush=True)
                            continue
                        n = r.get("total") or r["received"]
                        print(f"{name:5} {rate:<7} {rnd + 1:<6} {r['steady']:<7.0f} {r['p50']:<7.1f} {r['p99']:<7.1f} "
                              f"{r['p999']:<7.1f} {r['max']:<7.1f} {r['lost']}/{r['dup']:<7} {r['relay_cpu']:<12.2f} "
                              f"{r['relay_cpu'] / n * 1e6:<13.1f} {r['pg_cpu'] / n * 1e6:<10.1f} "
                              f"{r['kafka_cpu'] / n * 1e6:<13.1f} {r['load']:.2f}", flush=True)
                        for query, count in sorted(r["slow"].items(), key=lambda kv: -kv[1])[:3]:
                            print(f"      seen running > 0.5 s {count}x: {query}", flush=True)
        finally:
            broker.stop()
            pg.stop()


if __name__ == "__main__":
    main()
