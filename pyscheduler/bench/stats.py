"""The benches' measures, defined once: percentiles, and CPU seconds from /proc (Linux): a
process's (clock ticks), a backend's (nanoseconds), a PostgreSQL server's (the postmaster, the
backends that exited and the live ones), the processes of a tree or a command line.

Run as a command, the CPU of a PostgreSQL server (found by its port) and of a command
around one run of the command, on the server's machine as a user that may read its /proc:

    python -m pyscheduler.bench.stats 5432 -- pyscheduler bench checks --dsn "$DSN" --checks 200000
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import subprocess
import sys
from collections.abc import Iterable
from decimal import Decimal

TICK = os.sysconf("SC_CLK_TCK")  # /proc/PID/stat counts CPU time in these (100 a second: 10 ms)


def percentile(values: Iterable[float], p: float) -> float:
    """The nearest-rank p-th percentile (0 < p <= 100): the smallest of the values that at
    least p % of them are at or below, i.e. the ceil(p / 100 * n)-th smallest. Always one of
    the values measured, never an interpolation; p100 is the maximum. Every bench uses it."""
    ordered = sorted(values)
    return _ranked(ordered, p)


def percentiles(values: Iterable[float], points: Iterable[float] = (50, 99, 99.9)) -> dict[str, float]:
    """{"p50": ..., "p99": ..., "p99.9": ..., "max": ...} of ``percentile``, in the values'
    unit ({} without values)."""
    ordered = sorted(values)
    if not ordered:
        return {}
    out = {f"p{p:g}": _ranked(ordered, p) for p in points}
    out["max"] = ordered[-1]
    return out


def _ranked(ordered: list[float], p: float) -> float:
    rank = math.ceil(Decimal(str(p)) * len(ordered) / 100)  # decimal: 99.9 % of 1,000 is 999, not 999.0000001
    return ordered[min(len(ordered), max(1, rank)) - 1]


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_cpu(pid: int, reaped: bool = False) -> float:
    """CPU seconds (user + system, every thread) of a process, in steps of a clock tick; with
    ``reaped``, its children that exited and were waited for too (a postmaster's: the backends
    that ended). 0 when the process is gone."""
    fields = _stat(pid)
    if fields is None:
        return 0.0
    ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if reaped else 0)
    return ticks / TICK


def precise_cpu(pid: int) -> float | None:
    """CPU seconds of a process from /proc/PID/schedstat (nanoseconds on a CPU), for work shorter
    than a clock tick (a backend's read path); None when not readable (a server on another machine)."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def parent(pid: int) -> int | None:
    """The parent's pid (a backend's: the postmaster), None when the process is gone."""
    fields = _stat(pid)
    return None if fields is None else int(fields[1])


def children(pid: int) -> list[int]:
    """The live children of a process (/proc/PID/task/*/children)."""
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def tree(pid: int) -> list[int]:
    """A process and its descendants."""
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        seen.append(p)
        todo += children(p)
    return seen


def command_line(pid: int) -> list[str] | None:
    """A process's arguments (a PostgreSQL process: its title, one string), None when it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return raw.rstrip(b"\0").decode(errors="replace").split("\0")


def find(*words: str) -> list[int]:
    """Pids whose command line contains every word (e.g. a broker by its address)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (args := command_line(int(entry))) is not None:
            line = " ".join(args)
            if all(w in line for w in words):
                out.append(int(entry))
    return out


def server_cpu(postmaster: int) -> float:
    """CPU seconds of a whole PostgreSQL server: the postmaster, the children it reaped
    (backends that exited) and its live children (backends, autovacuum, WAL writer, ...)."""
    return process_cpu(postmaster, reaped=True) + sum(process_cpu(p) for p in children(postmaster))


def postmaster_on(port: int) -> int | None:
    """The postmaster of the server listening on ``port`` (its command line names the port)."""
    for pid in find(str(port)):
        args = command_line(pid)
        if args and args[0].endswith("postgres") and str(port) in args:
            return pid
    return None


def require_local(dsn: str) -> None:
    """Exit unless the server at ``dsn`` runs on this machine, its backends' /proc readable: the
    CPU of a remote server's backends cannot be read here."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        args = command_line(conn.info.backend_pid)
    if not args or not args[0].startswith("postgres"):
        raise SystemExit("the database server's processes are not readable here: run on its machine, "
                         "as a user that may read their /proc entries")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="CPU seconds of a PostgreSQL server and of a command around one "
                                                 "run of the command.")
    parser.add_argument("port", type=int, help="the server's port (its postmaster's command line names it)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    a = parser.parse_args(argv)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    postmaster = postmaster_on(a.port)
    if postmaster is None or not command:
        parser.error(f"no PostgreSQL server on port {a.port} readable here" if command else "no command")
    s0, r0 = server_cpu(postmaster), resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(command, capture_output=True, text=True)
    s1, r1 = server_cpu(postmaster), resource.getrusage(resource.RUSAGE_CHILDREN)
    print(out.stdout[-1500:])
    print(f"server CPU {s1 - s0:.2f} s; command CPU {(r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime):.2f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
