"""The output of ``pyscheduler bench peers``: markdown tables written between two marker
comments of docs/benchmarks.md (a rerun replaces them), and PNG charts (matplotlib)."""

from __future__ import annotations

import os
import re
import statistics
from pathlib import Path

from ..stats import percentiles
from .delay import SLA_P999_MS, SLA_RATE, by_relay_and_load
from .runner import DELAY_SECONDS, FAIL_EVERY, MAX_ATTEMPTS, RETRY_SECONDS
from .tasks import SCENARIOS, SYSTEMS, System

BEGIN = ("<!-- bench-peers:begin (written by `pyscheduler bench peers`; "
         "a rerun replaces everything down to the end marker) -->")
END = "<!-- bench-peers:end -->"
TASKS_CHART = "peers-tasks.png"
JITTER_CHART = "peers-delay-jitter.png"


def _spread(values: list[float], fmt: str = "{:,.0f}") -> str:
    """median (min–max), or the value alone when there is one."""
    med = fmt.format(statistics.median(values))
    if len(values) == 1:
        return med
    return f"{med} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def tasks_rows(systems: list[System], results: dict[str, list[dict]]) -> list[list[str]]:
    rows = []
    for s in systems:
        runs = results[s.key]
        lat = percentiles([x for r in runs for x in r["latency_ms"]], (50, 99))
        capped = sum(r["capped"] for r in runs)
        rows.append([s.name, runs[0]["version"], runs[0]["settings"], f"{runs[0]['jobs']:,}",
                     _spread([r["enqueue_rate"] for r in runs]),
                     _spread([r["rate"] for r in runs]) + (f" ({capped} capped)" if capped else ""),
                     f"{lat['p50']:.1f} ms", f"{lat['p99']:.1f} ms"])
    return rows


def ratio_rows(systems: list[System], results: dict[str, list[dict]]) -> tuple[list[str], list[list[str]]]:
    """Completion rate of each pyscheduler system / each peer, computed per round."""
    ours = [s for s in systems if s.ours]
    peers = [s for s in systems if not s.ours]
    rows = []
    for o in ours:
        row = [o.name]
        for p in peers:
            ratios = [a["rate"] / b["rate"] for a, b in zip(results[o.key], results[p.key])]
            row.append(_spread(ratios, "{:.2f}x"))
        rows.append(row)
    return [p.name for p in peers], rows


REFERENCE = "graphile-worker"  # the peer each failure and delay run is compared with


def scenario_rows(results: dict[str, dict[str, list[dict]]]) -> list[list[str]]:
    """One row per run other than no-op jobs and system: completion rate, and pyscheduler's rate /
    graphile-worker's computed per round."""
    rows = []
    for scenario, by_system in results.items():
        if scenario == "noop":
            continue
        reference = by_system.get(REFERENCE)
        for s in SYSTEMS:
            runs = by_system.get(s.key)
            if not runs:
                continue
            capped = sum(r["capped"] for r in runs)
            ratio = (_spread([a["rate"] / b["rate"] for a, b in zip(runs, reference)], "{:.2f}x")
                     if s.ours and reference else "—")
            rows.append([SCENARIOS[scenario], s.name, f"{runs[0]['jobs']:,}",
                         _spread([r["rate"] for r in runs]) + (f" ({capped} capped)" if capped else ""), ratio])
    return rows


def _sla(runs: list[dict]) -> str:
    met = sum(1 for r in runs if r["sla"])
    return "meets" if met == len(runs) else "misses" if met == 0 else f"meets in {met} of {len(runs)} rounds"


def delay_rows(delay: list[dict]) -> list[list[str]]:
    """One row per relay and load: medians over the rounds (min–max in brackets), lost and
    duplicates summed over the rounds, the SLA met in every round or not."""
    rows = []
    for runs in by_relay_and_load(delay):
        first = runs[0]
        ms = {k: _spread([r[k] for r in runs], "{:,.1f}") + " ms" for k in ("p50", "p99", "p99.9", "max")}
        rows.append([first["name"], f"{first['rate']:,}", _spread([r["steady"] for r in runs]), ms["p50"],
                     ms["p99"], ms["p99.9"], ms["max"],
                     f"{sum(r['lost'] for r in runs)} / {sum(r['duplicates'] for r in runs)}", _sla(runs)])
    return rows


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |"
                                                                          for r in rows]


TASKS_HEADER = ["system", "version", "settings", "jobs", "enqueue (jobs/s)", "completion (jobs/s)",
                "enqueue-to-start p50", "p99"]
SCENARIO_HEADER = ["run", "system", "jobs", "completion (jobs/s)", f"/ {REFERENCE} (per round)"]
DELAY_HEADER = ["relay", "offered (msg/s)", "delivered, steady (msg/s)", "p50", "p99", "p99.9", "max",
                "lost / dup", f"SLA (p99.9 <= {SLA_P999_MS:.0f} ms, all delivered)"]


def markdown(*, command: str, context: str, systems: list[System], skipped: dict[str, str],
             results: dict[str, list[dict]], delay: list[dict], jobs: int, concurrency: int, rounds: int,
             max_seconds: float, samples: int, delay_note: str, charts: Path, doc: Path,
             scenarios: dict[str, dict[str, list[dict]]] | None = None) -> str:
    """``results``: the no-op runs {system key: rounds}; ``scenarios``: every run {scenario:
    {system key: rounds}} (the failure and delay runs get a table of their own)."""
    rel = Path(os.path.relpath(charts, doc.parent)).as_posix()
    out = [BEGIN, "", f"`{command}` — {context}"]
    others = scenario_rows(scenarios or {})
    if systems or others:  # the job-queue part ran (not --no-tasks)
        out += ["", f"**Job queues.** {jobs:,} no-op jobs per system and round (procrastinate a twentieth: it "
                f"completes a few hundred a second), the same concurrency ({concurrency}), a fresh database per "
                f"system per round, {rounds} round{'s' if rounds != 1 else ''}, systems in a rotating order. "
                "Medians over the rounds, min–max in brackets; "
                f"the work is capped at {max_seconds:g} s (a capped run counts what was done by then). "
                f"Enqueue-to-start latency: {samples} jobs per round enqueued one at a time to idle workers, "
                "percentiles over all rounds' samples."]
    if systems:
        out += [""] + _table(TASKS_HEADER, tasks_rows(systems, results))
    for name, why in skipped.items():
        out.append(f"\n{name}: {why}.")
    peers, rows = ratio_rows(systems, results)
    if peers and rows:
        out += ["", "Completion rate, pyscheduler / peer (computed per round; median, min–max):", ""]
        out += _table(["pyscheduler"] + peers, rows)
    if others:
        out += ["", f"**Failures and delays.** The same protocol and settings, each system against {REFERENCE} "
                    f"in the same rounds. *{SCENARIOS['fail']}*: every {FAIL_EVERY}th job fails its first attempt "
                    f"and succeeds when retried {RETRY_SECONDS:.2f} s later ({REFERENCE}'s fixed first backoff, "
                    f"exp(1) s; pyscheduler's handler raises `Retry(in_=e s)`), jobs submitted with max_attempts "
                    f"{MAX_ATTEMPTS}; completion counts each job once, when its retry is durably done, so the "
                    f"time includes the last failures' {RETRY_SECONDS:.2f} s wait. *{SCENARIOS['delay']}*: every "
                    f"other job is submitted with run_at = its enqueue time + {DELAY_SECONDS:g} s; the workers "
                    "start right after the enqueue, so the last delayed jobs come due while they work.", ""]
        out += _table(SCENARIO_HEADER, others)
    if delay:  # the delay part ran (not --no-delay)
        out += ["", f"**Delay queue.** {delay_note} The seed's SLA: {SLA_RATE:,} msg/s with p99.9 jitter "
                    f"<= {SLA_P999_MS:.0f} ms; the SLA column applies the same bound at every load.", ""]
        out += _table(DELAY_HEADER, delay_rows(delay))
    out.append("")
    if systems:
        out += [f"![completion rates]({rel}/{TASKS_CHART})", ""]
    if delay:
        out += [f"![jitter distribution]({rel}/{JITTER_CHART})", ""]
    out.append(END)
    return "\n".join(out)


def write_markdown(doc: Path, section: str) -> None:
    """Replace the text between the markers (inclusive) of ``doc``, or append it with a heading."""
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(BEGIN.split(" (")[0]) + r".*?" + re.escape(END), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n## Side by side with peers: `pyscheduler bench peers`\n\n" + section + "\n"
    doc.write_text(text)


def charts(out_dir: Path, systems: list[System], results: dict[str, list[dict]], delay: list[dict]) -> list[Path]:
    """The two PNG charts; their paths."""
    import matplotlib

    matplotlib.use("Agg")
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / TASKS_CHART, out_dir / JITTER_CHART]
    if not systems:
        return charts_delay(paths[1], delay)
    charts_tasks(paths[0], systems, results)
    return paths[:1] + charts_delay(paths[1], delay)


def charts_tasks(path: Path, systems: list[System], results: dict[str, list[dict]]) -> None:
    import matplotlib.pyplot as plt

    names = [s.name for s in systems][::-1]
    rates = [[r["rate"] for r in results[s.key]] for s in systems][::-1]
    med = [statistics.median(r) for r in rates]
    err = [[m - min(r) for m, r in zip(med, rates)], [max(r) - m for m, r in zip(med, rates)]]
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(names) + 1.5))
    ax.barh(names, med, xerr=err, color=["#1f77b4" if s.ours else "#999999" for s in systems][::-1], capsize=4)
    for y, (m, r) in enumerate(zip(med, rates)):
        ax.text(max(r), y, f"  {m:,.0f}", va="center")  # past the error bar
    ax.set_xscale("log")
    ax.set_xlim(left=min(min(r) for r in rates) / 3, right=max(max(r) for r in rates) * 4)
    ax.set_xlabel("completion rate, no-op jobs/s (median, min–max over rounds; log scale)")
    ax.set_title("Job queues on one PostgreSQL: completion rate")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def charts_delay(path: Path, delay: list[dict]) -> list[Path]:
    """The jitter chart ([] without delay runs)."""
    import matplotlib.pyplot as plt

    loads = sorted({d["rate"] for d in delay})
    if not loads:
        return []
    fig, axes = plt.subplots(1, len(loads), figsize=(6 * len(loads), 4), squeeze=False)
    for ax, load in zip(axes[0], loads):
        for runs in (g for g in by_relay_and_load(delay) if g[0]["rate"] == load):
            d = runs[0]
            lags = sorted(x for r in runs for x in r["lags"])  # every round's messages; one colour per relay
            ax.plot(lags, [(i + 1) / len(lags) for i in range(len(lags))], label=d["name"],
                    color="#1f77b4" if d["relay"] == "pyscheduler" else "#ff7f0e")
        ax.axvline(SLA_P999_MS, color="red", linestyle="--", linewidth=1, label=f"SLA bound {SLA_P999_MS:.0f} ms")
        ax.set_xscale("symlog", linthresh=10)
        ax.set_xlabel("fire time - deadline, ms (symlog)")
        ax.set_ylabel("fraction of messages")
        ax.set_title(f"delay queue at {load:,} msg/s")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]
