"""A/B of two checkouts of pyscheduler on the end-to-end runner, the order alternating by round
(A B, then B A: in a fixed order the run second in each pair took 6-11 % of credit, issue 31;
docs/contributing.md, "Measuring a change"). Each run on a fresh database, importing and
migrating with its tree (a directory holding the ``pyscheduler`` package, e.g. a worktree).

    python -m pyscheduler.bench.trees_ab DSN A_TREE B_TREE [--rounds 6] [--mode capacity|e2e:RATE|enqueue|single]

Prints each run, each tree's median, B / A (the rounds' geometric mean: over an even number of
rounds the order cancels out) and what running second was worth. Modes: the runner's
(``pyscheduler.bench.peers.flow_runner``) as ``pyscheduler bench peers`` runs them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from .peers.tasks import scratch_database
from .stats import percentile

# mode: (the runner's arguments after the database, what is compared, its unit, higher is better)
MODES = {
    "capacity": (["5000", "8", "10"], "capacity", "jobs/s", True),
    "e2e": (["10", "10"], "start p99", "ms", False),
    "enqueue": (["50000", "2000", "10"], "bulk", "jobs/s", True),
    "single": (["50000", "2000", "10"], "single p50", "us", False),  # the enqueue runner's single submits
}


def order(r: int) -> tuple[str, str]:
    """The trees' order in round r: A B, then B A, by turns."""
    return ("A", "B") if r % 2 == 0 else ("B", "A")


def measure(mode: str, result: dict) -> tuple[float, str]:
    """The figure compared and a note for the run's line."""
    if mode == "capacity":
        return result["window_rate"], f"start p99 {percentile(result['latency_ms'], 99):.1f} ms"
    if mode == "e2e":
        return percentile(result["latency_ms"], 99), f"{result['window_rate']:,.0f} jobs/s"
    bulk, single = int(MODES["enqueue"][0][0]) / result["bulk_s"], percentile(result["single_ms"], 50) * 1000
    if mode == "single":
        return single, f"bulk {bulk:,.0f} jobs/s"
    return bulk, f"single p50 {single:.0f} us"


def summary(runs: list[tuple[int, str, float]]) -> dict:
    """From (round, tree, value) in the order run: each tree's median; B / A and the second run
    / the first, by round, and the geometric mean of each over the rounds. Over an even number
    of rounds the order cancels out of B / A's mean, and the trees out of the position's."""
    by_round: dict[int, list[tuple[str, float]]] = {}
    for r, tree, value in runs:
        by_round.setdefault(r, []).append((tree, value))
    pairs = [p for p in by_round.values() if len(p) == 2]
    b_over_a = [dict(p)["B"] / dict(p)["A"] for p in pairs]
    second = [p[1][1] / p[0][1] for p in pairs]
    return {
        "A": statistics.median(v for _, t, v in runs if t == "A"),
        "B": statistics.median(v for _, t, v in runs if t == "B"),
        "b_over_a": b_over_a, "ratio": statistics.geometric_mean(b_over_a),
        "second_over_first": second, "position": statistics.geometric_mean(second),
    }


def run(tree: Path, dsn: str, mode: str, rate: str | None, name: str) -> dict:
    """One run of the runner with ``tree``'s pyscheduler, on a fresh database."""
    args = ([rate] if rate else []) + MODES[mode][0]
    with tempfile.TemporaryDirectory() as tmp, scratch_database(dsn, name) as uri:
        result = Path(tmp) / "result.json"
        runner = "enqueue" if mode == "single" else mode
        out = subprocess.run([sys.executable, "-m", "pyscheduler.bench.peers.flow_runner", "pyscheduler", runner, uri,
                              *args], capture_output=True, text=True, timeout=900, cwd=tree,
                             env={**os.environ, "PYTHONPATH": str(tree), "PYTHONWARNINGS": "ignore",
                                  "PYSCHEDULER_FLOW_RESULT": str(result)})
        if out.returncode != 0:
            raise SystemExit(f"{tree} {mode} failed: {out.stderr.strip()[-2000:]}")
        return json.loads(result.read_text())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dsn")
    ap.add_argument("a", type=Path, help="tree A (the base)")
    ap.add_argument("b", type=Path, help="tree B (the change)")
    ap.add_argument("--rounds", type=int, default=6, help="rounds of two runs (even: each tree first as often)")
    ap.add_argument("--mode", default="capacity",
                    help="capacity (jobs/s while a producer submits as fast as it goes), e2e:RATE (start p99 ms at "
                         "RATE jobs/s), enqueue (bulk jobs/s) or single (single submit p50 us)")
    a = ap.parse_args(argv)
    mode, _, rate = a.mode.partition(":")
    if mode not in MODES or (mode == "e2e") != bool(rate):
        ap.error(f"--mode must be capacity, e2e:RATE, enqueue or single, got {a.mode!r}")
    trees = {"A": a.a.resolve(), "B": a.b.resolve()}
    for key, tree in trees.items():
        if not (tree / "pyscheduler" / "__init__.py").exists():
            ap.error(f"tree {key} ({tree}) holds no pyscheduler package")
    _, what, unit, higher = MODES[mode]
    runs: list[tuple[int, str, float]] = []
    for r in range(a.rounds):
        for key in order(r):
            value, note = measure(mode, run(trees[key], a.dsn, mode, rate or None, f"trees_ab_{key.lower()}"))
            runs.append((r, key, value))
            print(f"round {r + 1}/{a.rounds} {key}: {what} {value:,.1f} {unit}, {note}", flush=True)
    s = summary(runs)
    fmt = ", ".join
    print(f"A {trees['A']}: median {what} {s['A']:,.1f} {unit}")
    print(f"B {trees['B']}: median {what} {s['B']:,.1f} {unit}")
    print(f"B / A: {s['ratio']:.3f} ({'higher' if higher else 'lower'} is better; by round "
          f"{fmt(f'{x:.3f}' for x in s['b_over_a'])})")
    print(f"second / first: {s['position']:.3f}, what running second was worth (by round "
          f"{fmt(f'{x:.3f}' for x in s['second_over_first'])})")


if __name__ == "__main__":
    main()
