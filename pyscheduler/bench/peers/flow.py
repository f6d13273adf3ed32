"""The enqueue and end-to-end sections of ``pyscheduler bench peers`` (issue 31): each system's
runner (flow_runner.py, bench/peers/graphile_flow.js) in a fresh database of the same server,
the systems' order rotated each round.

Enqueue: bulk (1,000 jobs per call) and single (one job per call) with each system's own client,
per-call p50/p99. Capacity: workers run while a producer submits as fast as it goes with at most a
backlog waiting; jobs started per second after a warm-up. End to end: workers run while a producer
submits at a fixed offered rate (or a share of pyscheduler's measured capacity, "50%"); throughput
(jobs / time until every job has run), enqueue-to-start p50/p99 in the steady window (every job's
p99 beside them); exactly once checked in both."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from statistics import median

import click

from ..stats import percentile
from . import flow_runner
from .tasks import PEERS_DIR, scratch_database

BEGIN, END = "<!-- flow:begin -->", "<!-- flow:end -->"
CHART = "peers-flow.png"


@dataclass(frozen=True)
class FlowSystem:
    key: str
    argv: Callable[[], list[str]]
    missing: Callable[[], str | None] = lambda: None


def _python(key: str) -> Callable[[], list[str]]:
    return lambda: [sys.executable, "-m", "pyscheduler.bench.peers.flow_runner", key]


@dataclass(frozen=True)
class Variant:
    """pyscheduler's capacity again with one setting changed: a row of its own in the capacity
    table, run in each capacity round beside pyscheduler's, and a sentence against the best peer."""
    system: FlowSystem
    label: str  # the row's
    when: str  # the sentence's: "On a queue that ..."
    setting: str  # the settings line's


VARIANTS = [
    Variant(FlowSystem("pyscheduler-nokeep", _python("pyscheduler-nokeep")), "pyscheduler, completed tasks not kept",
            "On a queue that keeps no completed tasks (`set_queue_keep_completed`)",
            "set_queue_keep_completed(queue, False)"),
    Variant(FlowSystem("pyscheduler-nosearch", _python("pyscheduler-nosearch")), "pyscheduler, spec index off",
            "With the spec search index off (`pyscheduler tasks spec-index off`)", "pyscheduler tasks spec-index off"),
]

SYSTEMS = [
    FlowSystem("pyscheduler", _python("pyscheduler")),
    FlowSystem("pgqueuer", _python("pgqueuer"),
               lambda: None if importlib.util.find_spec("pgqueuer") and importlib.util.find_spec("asyncpg")
               else "pgqueuer is not installed: pip install 'pyscheduler[bench]'"),
    FlowSystem("graphile-worker", lambda: ["node", str(PEERS_DIR / "graphile_flow.js")],
               lambda: None if shutil.which("node") else "Node.js (node) is not on PATH"),
]


def run_one(dsn: str, system: FlowSystem, mode: str, a: float, b: float, concurrency: int) -> dict:
    """One run of a system's runner; its result is the JSON it writes to the file named by
    PYSCHEDULER_FLOW_RESULT (the Python runner: its stdout came back corrupted at a 32 KiB
    boundary twice in CI, 2026-11-28, cause not found), or the last line of its stdout."""
    with tempfile.TemporaryDirectory() as tmp, \
            scratch_database(dsn, f"pyscheduler_flow_{system.key.replace('-', '_')}_{os.getpid()}") as uri:
        result = Path(tmp) / "result.json"
        out = subprocess.run(system.argv() + [mode, uri, f"{a:g}", f"{b:g}", str(concurrency)], capture_output=True,
                             text=True, timeout=600, cwd=PEERS_DIR,
                             env={**os.environ, "PYTHONWARNINGS": "ignore", "PYSCHEDULER_FLOW_RESULT": str(result)})
        if out.returncode != 0:
            raise click.ClickException(f"{system.key} {mode} failed: {out.stderr.strip()[-2000:]}")
        text = result.read_text() if result.exists() else out.stdout.strip().splitlines()[-1]
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise click.ClickException(f"{system.key} {mode}: its result is not JSON ({e}; {len(text)} characters, "
                                   f"around the error: {text[max(0, e.pos - 80):e.pos + 80]!r})") from None


SLICES = 4  # the single calls of a round: each system's in this many slices, the systems taking turns


def run_single(dsn: str, systems: list[FlowSystem], calls: int, concurrency: int) -> dict[str, list[float]]:
    """Each system's ``calls`` single submits (ms each), in SLICES slices taken in turn, the order
    reversed every slice: a runner process per system (``single`` mode, flow_runner.py), each in a
    fresh database of its own and alive throughout, so a slow stretch of the machine falls on every
    system alike (2,000 calls of one system after another's moved a round's ratio 0.5x-1.4x)."""
    sizes = [calls // SLICES + (j < calls % SLICES) for j in range(SLICES)]
    ms: dict[str, list[float]] = {s.key: [] for s in systems}
    with contextlib.ExitStack() as stack:
        procs = {}
        for s in systems:
            uri = stack.enter_context(
                scratch_database(dsn, f"pyscheduler_single_{s.key.replace('-', '_')}_{os.getpid()}"))
            err = stack.enter_context(tempfile.TemporaryFile("w+"))
            proc = subprocess.Popen(s.argv() + ["single", uri, "0", "0", str(concurrency)], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=err, text=True, cwd=PEERS_DIR,
                                    env={**os.environ, "PYTHONWARNINGS": "ignore"})
            stack.callback(_ended, proc)
            procs[s.key] = (proc, err)

        def line(key: str) -> str:
            proc, err = procs[key]
            text = proc.stdout.readline()
            if not text:
                err.seek(0)
                raise click.ClickException(f"{key} single failed: {err.read().strip()[-2000:]}")
            return text

        for key in procs:
            if line(key).strip() != "ready":
                raise click.ClickException(f"{key} single: its first line is not 'ready'")
        for j, size in enumerate(sizes):
            for key in (list(procs) if j % 2 == 0 else list(procs)[::-1]):
                procs[key][0].stdin.write(f"{size}\n")
                procs[key][0].stdin.flush()
                ms[key] += json.loads(line(key))
    return ms


def _ended(proc: subprocess.Popen[str]) -> None:
    """A single runner's end: stdin closed (its cue to stop), then waited for; killed if it hangs."""
    with contextlib.suppress(OSError):
        proc.stdin.close()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _load() -> str:
    """The machine's load averages (1, 5, 15 min), as uptime says them."""
    return " ".join(open("/proc/loadavg").read().split()[:3])


def parse_rates(text: str) -> list[int | float]:
    """``--e2e-rates``: jobs/s (1000) or shares of pyscheduler's measured capacity (50%: 0.5)."""
    return [float(x.strip()[:-1]) / 100 if x.strip().endswith("%") else int(x) for x in text.split(",") if x.strip()]


def run_rounds(dsn: str, systems: list[FlowSystem], rounds: int, echo, *, bulk_jobs: int, single_jobs: int,
               rates: list[int | float], seconds: float, concurrency: int, backlog: int, enqueue: bool = True) -> dict:
    """{"enqueue": {key: [result per round]}, "capacity": {key: [...]}, "e2e": {rate: {key: [...]}},
    "shares": {rate: share of capacity}, "capacity_rate": pyscheduler's median}; the orders rotated
    per round. The rates given as shares (floats) run after every capacity round, at that share
    of pyscheduler's median capacity (rounded to 100 jobs/s)."""
    out: dict = {"enqueue": {}, "capacity": {}, "e2e": {}, "shares": {}}

    def order(r: int) -> list[FlowSystem]:
        return systems[r % len(systems):] + systems[:r % len(systems)]

    def e2e(r: int, rate: int) -> None:
        for s in order(r):
            res = run_one(dsn, s, "e2e", rate, seconds, concurrency)
            out["e2e"].setdefault(rate, {}).setdefault(s.key, []).append(res)
            echo(f"round {r + 1}/{rounds} end to end {rate:,}/s, {s.key}: {res['submitted'] / res['total_s']:,.0f}"
                 f" jobs/s, start p50 {_start(res, 50):.1f} ms p99 "
                 f"{_start(res, 99):.1f} ms (every job's {_start(res, 99, every=True):.1f}), exactly once "
                 f"{res['exactly_once']}, load {_load()}")

    for r in range(rounds):
        for s in order(r) if enqueue else []:
            res = run_one(dsn, s, "enqueue", bulk_jobs, 0, concurrency)
            out["enqueue"].setdefault(s.key, []).append(res)
            echo(f"round {r + 1}/{rounds} enqueue, {s.key}: bulk {bulk_jobs / res['bulk_s']:,.0f} jobs/s, "
                 f"load {_load()}")
        if enqueue:
            for key, ms in run_single(dsn, order(r), single_jobs, concurrency).items():
                out["enqueue"][key][-1]["single_ms"] = ms
                echo(f"round {r + 1}/{rounds} single, {key}: {_calls_per_s(ms):,.0f} calls/s (the ratio's "
                     f"measure), p50 {percentile(ms, 50):.2f} ms, load {_load()}")
        ours_too = [v.system for v in VARIANTS] if any(s.key == "pyscheduler" for s in systems) else []
        for s in (order(r) + ours_too if r % 2 else ours_too + order(r)) if backlog else []:
            res = run_one(dsn, s, "capacity", backlog, seconds, concurrency)
            out["capacity"].setdefault(s.key, []).append(res)
            echo(f"round {r + 1}/{rounds} capacity, {s.key}: {res['window_rate']:,.0f} jobs/s, exactly once "
                 f"{res['exactly_once']}, load {_load()}")
        for rate in rates:
            if isinstance(rate, int):
                e2e(r, rate)
    ours = [res["window_rate"] for res in out["capacity"].get("pyscheduler", [])]
    shares = [x for x in rates if isinstance(x, float)]
    if shares and not ours:
        raise click.ClickException("--e2e-rates in % need pyscheduler's capacity runs (--e2e-backlog > 0)")
    if ours:
        out["capacity_rate"] = median(ours)
    for share in shares:
        rate = max(100, round(share * out["capacity_rate"] / 100) * 100)
        out["shares"][rate] = share
        for r in range(rounds):
            e2e(r, rate)
    return out


def _cell(values: list[float], fmt: str = "{:,.0f}") -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(median(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def _ratio(ours: list[float], theirs: list[float], higher_better: bool = True, ok: list[bool] | None = None) -> str:
    """Median (range) of ours / theirs per round; with ``ok`` (per round: did both run every job
    exactly once), only those rounds: a run that lost or stalled jobs is no rate to compare."""
    if not ours or not theirs:
        return "-"
    rounds = list(zip(ours, theirs, ok or [True] * len(ours)))
    good = [(o, t) for o, t, once in rounds if once]
    pairs = [(o / t if higher_better else t / o) for o, t in good if (t if higher_better else o)]
    said = [f"**{median(pairs):.2f}x**" + (f" ({min(pairs):.2f}–{max(pairs):.2f})" if len(pairs) > 1 else "")] \
        if pairs else []
    if len(good) < len(rounds):
        said.append(f"{len(rounds) - len(good)} of {len(rounds)} rounds left out (not exactly once)")
    if len(pairs) < len(good):
        said.append(f"{len(good) - len(pairs)} of {len(rounds)} rounds left out (a rate of 0)")
    return "; ".join(said) or "-"


def _both_once(ours: list[dict], theirs: list[dict]) -> list[bool]:
    return [a["exactly_once"] and b["exactly_once"] for a, b in zip(ours, theirs)]


def markdown(results: dict, *, command: str, context: str, bulk_jobs: int, single_jobs: int, seconds: float,
             concurrency: int, rounds: int, elapsed: float, backlog: int = 0, chart: str | None = None) -> str:
    """The section; ``chart``: the chart's path from the document (``chart()`` draws it)."""
    lines = [BEGIN, "", f"Command: `{command}` ({elapsed / 60:.0f} min). {context}", ""]
    if chart:
        lines += [f"![enqueue and end to end]({chart})", ""]
    if results["enqueue"]:
        lines += _enqueue_lines(results["enqueue"], bulk_jobs=bulk_jobs, rounds=rounds, single_jobs=single_jobs)
    if results["capacity"]:
        lines += _capacity_lines(results, backlog=backlog, seconds=seconds, concurrency=concurrency)
    if results["e2e"]:
        lines += _e2e_lines(results, seconds=seconds, concurrency=concurrency)
    return "\n".join(lines + [END])


def _calls_per_s(ms: list[float]) -> float:
    """A single-submit round's calls a second (one after the other): the single ratio's measure."""
    return 1000 * len(ms) / sum(ms)


def _enqueue_lines(enq: dict, *, bulk_jobs: int, rounds: int, single_jobs: int) -> list[str]:
    keys = list(enq)
    bulk = {k: [bulk_jobs / r["bulk_s"] for r in enq[k]] for k in keys}
    single = {k: [_calls_per_s(r["single_ms"]) for r in enq[k]] for k in keys}
    lines = [f"**Enqueue**, each system's own client as its users call it, {rounds} rounds (order rotated): bulk "
             f"{bulk_jobs:,} jobs in calls of 1,000; single: {single_jobs:,} calls of one job a system, in "
             f"{SLICES} slices the systems take in turn (each in a fresh database, the order reversed every "
             "slice), so that a slow stretch of the machine falls on all alike. Ratios are pyscheduler / peer "
             "per round (median, range); per-call times are medians over rounds of each round's p50 and p99.", "",
             "| system | bulk jobs/s | bulk call p50 / p99 ms | single calls/s | single call p50 / p99 ms "
             "| bulk ratio | single ratio |", "|---|---|---|---|---|---|---|"]
    for k in keys:
        p = {q: {m: median(percentile(r[f"{m}_ms"], q) for r in enq[k]) for m in ("bulk", "single")} for q in (50, 99)}
        lines.append(f"| {k} {enq[k][0]['version']} | {_cell(bulk[k])} | {p[50]['bulk']:.1f} / {p[99]['bulk']:.1f} | "
                     f"{_cell(single[k])} | {p[50]['single']:.2f} / {p[99]['single']:.2f} | "
                     + ("-" if k == "pyscheduler" else _ratio(bulk["pyscheduler"], bulk[k])) + " | "
                     + ("-" if k == "pyscheduler" else _ratio(single["pyscheduler"], single[k])) + " |")
    ours = [r for r in enq.get("pyscheduler", []) if "variants_s" in r]
    for variant, what in (("delayed", "`run_at=timedelta(hours=1)`"), ("unique", "a new unique key each")):
        if ours:
            rates = [bulk_jobs / r["variants_s"][variant] for r in ours]
            slower = [r["variants_s"][variant] / r.get("mixed_plain_s", r["bulk_s"]) for r in ours]
            lines.append(f"| pyscheduler, {what} | {_cell(rates)} | | | | {_cell(slower, '{:.2f}')}x the plain "
                         "bulk's time, their calls interleaved | |")
    return lines + ["", "Settings: " + "; ".join(f"{k}: {enq[k][0]['settings']}" for k in keys) + ".", ""]


def _once(runs: list[dict]) -> str:
    bad = [r for r in runs if not r["exactly_once"]]
    if not bad:
        return "yes"
    dup, miss = sum(r["duplicates"] for r in bad), sum(r["missing"] for r in bad)
    return (f"no in {len(bad)} of {len(runs)} rounds: {dup:,} twice, {miss:,} not run within "
            f"{flow_runner.DRAIN_SECONDS} s of the end")


def _capacity_lines(results: dict, *, backlog: int, seconds: float, concurrency: int) -> list[str]:
    variants = [(v, results["capacity"][v.system.key], [r["window_rate"] for r in results["capacity"][v.system.key]])
                for v in VARIANTS if v.system.key in results["capacity"]]
    by = {k: v for k, v in results["capacity"].items() if k not in {v.system.key for v, _, _ in variants}}
    rates = {k: [r["window_rate"] for r in by[k]] for k in by}
    peers = [k for k in by if k != "pyscheduler"]
    best = max(peers, key=lambda k: median(rates[k])) if peers else None
    lines = [f"**Capacity** (sustained end to end): workers (concurrency {concurrency}) run while a producer (a "
             f"process of its own) submits as fast as it goes, in calls of up to {flow_runner.BULK:,}, with at most "
             f"{backlog:,} jobs submitted and not yet started (the runner tells it the count every "
             f"{flow_runner.FEED * 1000:g} ms), for {seconds:g} s; capacity = jobs started per second from "
             f"{flow_runner.WARM_SECONDS:g} s after the first submit to the producer's end; exactly once checked "
             "after the backlog drained. Ratio: pyscheduler / system per round.", "",
             "| system | capacity jobs/s | exactly once | pyscheduler / system |", "|---|---|---|---|"]
    ours = rates.get("pyscheduler", [])
    for k in by:
        lines.append(f"| {k} | {_cell(rates[k])} | {_once(by[k])} | "
                     + ("-" if k == "pyscheduler" else _ratio(ours, rates[k], ok=_both_once(by["pyscheduler"], by[k])))
                     + " |")
    for v, runs, lean in variants:
        lines.append(f"| {v.label} | {_cell(lean)} | {_once(runs)} | "
                     f"{_ratio(ours, lean, ok=_both_once(by['pyscheduler'], runs)) if ours else '-'} |")
    if best and "pyscheduler" in rates:
        lines += ["", f"pyscheduler's capacity: **{median(rates['pyscheduler']):,.0f} jobs/s**; against the best peer "
                      f"({best}): {_ratio(ours, rates[best], ok=_both_once(by['pyscheduler'], by[best]))}."]
        for v, runs, lean in variants:
            lines[-1] += (f" {v.when}: **{median(lean):,.0f} jobs/s**, against {best}: "
                          f"{_ratio(lean, rates[best], ok=_both_once(runs, by[best]))}.")
    settings = [f"{k}: {by[k][0]['settings']}" for k in by]
    settings += [f"{v.label}: as pyscheduler, with {v.setting}" for v, _, _ in variants]
    return lines + ["", "Settings: " + "; ".join(settings) + ".", ""]


def _start(result: dict, q: float, every: bool = False) -> float:
    """An e2e run's start percentile in ms: of its steady window, or every job's p99; infinite
    when no job it counts started (a system that stalled: no bound on its latency)."""
    if every:
        return result["every_p99_ms"] if result.get("every_p99_ms") is not None else math.inf
    return percentile(result["latency_ms"], q) if result["latency_ms"] else math.inf


def _e2e_lines(results: dict, *, seconds: float, concurrency: int) -> list[str]:
    lines = [f"**End to end**: workers (concurrency {concurrency}) run while a producer (a process of its own) "
             f"submits at the offered rate for {seconds:g} s, a call every 10 ms with the jobs due; throughput = "
             "jobs / time from the first submit until every job has run (the backlog drained); enqueue-to-start "
             f"in the steady state: of the jobs submitted from {flow_runner.WARM_SECONDS:g} s after the first submit "
             "(capacity's window; before it, fresh processes and a fresh database start up), and every job's p99 "
             "beside it; exactly once: every job index ran, none twice, checked each run; a ratio is of the "
             "rounds in which both systems ran every job exactly once.", "",
             "| offered jobs/s | system | throughput jobs/s | start p50 ms | start p99 ms | start p99 ms, every job "
             "| exactly once | throughput ratio |", "|---|---|---|---|---|---|---|---|"]
    for rate, by in results["e2e"].items():
        share = results["shares"].get(rate)
        offered = f"{rate:,}" + (f" ({share:.0%} of pyscheduler's capacity)" if share else "")
        rates = {k: [r["submitted"] / r["total_s"] for r in by[k]] for k in by}
        for k in by:
            p50 = [_start(r, 50) for r in by[k]]
            p99 = [_start(r, 99) for r in by[k]]
            every = [_start(r, 99, every=True) for r in by[k]]
            lines.append(f"| {offered} | {k} | {_cell(rates[k])} | {_cell(p50, '{:,.1f}')} | {_cell(p99, '{:,.1f}')} | "
                         f"{_cell(every, '{:,.1f}')} | {_once(by[k])} | "
                         + ("-" if k == "pyscheduler"
                            else _ratio(rates["pyscheduler"], rates[k], ok=_both_once(by["pyscheduler"], by[k])))
                         + " |")
    by = next(iter(results["e2e"].values()))
    return lines + ["", "Settings: " + "; ".join(f"{k}: {by[k][0]['settings']}" for k in by) + ".", ""]


def chart(path: Path, results: dict, *, bulk_jobs: int) -> Path:
    """The section's figures as one PNG, a panel each: bulk and single submits, capacity, and the
    start p99 at each offered rate, per system (medians over the rounds, min-max as error bars;
    times on a log scale: an overloaded system's seconds beside milliseconds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    enq, cap, e2e = results["enqueue"], results["capacity"], results["e2e"]
    labels = {v.system.key: v.label for v in VARIANTS}
    panels = [(f"bulk submit, jobs/s ({bulk_jobs:,} in calls of 1,000; higher is better)", False,
               {k: [bulk_jobs / r["bulk_s"] for r in v] for k, v in enq.items()}),
              ("single submit, call p50 ms (lower is better)", False,
               {k: [percentile(r["single_ms"], 50) for r in v] for k, v in enq.items()}),
              ("capacity, jobs started/s (higher is better)", False,
               {labels.get(k, k): [r["window_rate"] for r in v] for k, v in cap.items()})]
    panels += [(f"enqueue-to-start p99 ms at {rate:,} jobs/s offered (lower is better; log scale)", True,
                {k: p99 for k, v in by.items()  # the rounds with a bound (none: the system left out)
                 if (p99 := [x for x in (_start(r, 99) for r in v) if math.isfinite(x)])})
               for rate, by in e2e.items()]
    panels = [p for p in panels if p[2]]
    rows = math.ceil(len(panels) / 2)
    fig, axes = plt.subplots(rows, 2, figsize=(13, 2.4 * rows), squeeze=False)
    for ax, (title, log, values) in zip(axes.flat, panels):
        names = list(values)[::-1]
        med = [median(values[k]) for k in names]
        err = [[m - min(values[k]) for m, k in zip(med, names)], [max(values[k]) - m for m, k in zip(med, names)]]
        ax.barh(names, med, xerr=err, capsize=4,
                color=["#1f77b4" if k.startswith("pyscheduler") else "#999999" for k in names])
        for y, (m, k) in enumerate(zip(med, names)):
            label = f"{m:,.2f}" if m < 10 else f"{m:,.1f}" if m < 1000 else f"{m:,.0f}"
            ax.text(max(values[k]), y, f"  {label}", va="center", fontsize=9)
        top = max(max(v) for v in values.values())
        if log:
            ax.set_xscale("log")
            ax.set_xlim(min(min(v) for v in values.values()) / 2, top * 8)
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}"))
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        else:
            ax.set_xlim(0, top * 1.3)
        ax.set_title(title, fontsize=9)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_markdown(doc: Path, section: str) -> None:
    """Replace the flow section of ``doc`` (between its markers), or append it with a heading."""
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n## Enqueue and end to end: `pyscheduler bench peers`\n\n" + section + "\n"
    doc.write_text(text)
