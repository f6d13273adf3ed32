"""Start-up costs: embedded servers and migrate (fresh install, step by step, up to date); the
median of each over the rounds.

    python -m pyscheduler.bench.startup [--rounds 5]
"""

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import psycopg

from .. import embedded, migrate

warnings.filterwarnings("ignore", module="platformdirs")


def timed(fn):
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    rounds = parser.parse_args().rounds
    starts: dict[str, list[float]] = {}
    servers = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for i in range(rounds):
                for cls in (embedded.Postgres, embedded.Kafka, embedded.Redis):
                    seconds, server = timed(cls(Path(tmp) / f"{cls.name}{i}").start)
                    starts.setdefault(server.name, []).append(seconds)
                    servers.append(server)
            pg = servers[0]
            fresh, stepped, noop = [], [], []
            with psycopg.connect(pg.dsn(), autocommit=True) as conn:
                for i in range(rounds):
                    conn.execute(f"CREATE DATABASE fresh{i}")
                    conn.execute(f"CREATE DATABASE stepped{i}")
            for i in range(rounds):
                fresh.append(timed(lambda i=i: migrate.migrate(pg.dsn(f"fresh{i}")))[0])
                stepped.append(timed(lambda i=i: migrate.migrate(pg.dsn(f"stepped{i}"), step_by_step=True))[0])
                noop.append(timed(lambda i=i: migrate.migrate(pg.dsn(f"fresh{i}")))[0])
        finally:
            for server in servers:
                server.stop()
    for name, values in starts.items():
        print(f"embedded {name:8s} start (median of {rounds}): {statistics.median(values):6.2f} s")
    for name, values in (("fresh install", fresh), ("step by step", stepped), ("up to date", noop)):
        print(f"migrate {name:14s} (median of {rounds}): {statistics.median(values) * 1000:6.0f} ms")


if __name__ == "__main__":
    main()
