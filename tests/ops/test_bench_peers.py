"""``pyscheduler bench peers``: the command works and its output is complete (not its speed).

A run of ``--quick`` per part (job queues, delay relays, enqueue and end to end; three
tests that run side by side) against the test servers checks every system and every
column of the markdown it writes (the no-op runs, the failure and delay runs), the
two charts, and that a rerun replaces the section in place instead of adding
another. The percentiles of its tables are every bench's (bench/stats.py).
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from pyscheduler.bench.peers import flow, report
from pyscheduler.bench.peers.tasks import SCENARIOS, SYSTEMS
from pyscheduler.bench.stats import percentile, percentiles

PNG = b"\x89PNG\r\n\x1a\n"
PEERS = ["procrastinate", "graphile-worker", "pg-boss"]
OURS = ["pyscheduler Worker", "pyscheduler Worker (async)", "pyscheduler batch SQL"]
RELAYS = ["pyscheduler relay", "naive relay (consume, sleep, publish)"]


def test_percentiles_are_nearest_rank():
    """The smallest value that p % of the values are at or below: a value measured, never
    between two; p99.9 of 1..1000 is 999 (99.9 % of 1,000 is 999 exactly, not 999.0000001)."""
    assert percentile([4, 1, 3, 2], 50) == 2
    assert percentile([4, 1, 3, 2], 51) == 3
    assert percentile([5.0], 99) == 5.0
    assert percentiles(range(1, 1001)) == {"p50": 500, "p99": 990, "p99.9": 999, "max": 1000}
    assert percentiles([]) == {}


def _tables(section: str) -> list[list[list[str]]]:
    """Each markdown table of the section as rows of cells (header first, separator left out)."""
    tables, current = [], []
    for line in section.splitlines() + [""]:
        if line.startswith("|"):
            if not set(line) <= set("|-"):
                current.append([c.strip() for c in line.strip("|").split("|")])
        elif current:
            tables.append(current)
            current = []
    return tables


def _section(text: str) -> str:
    start, end = text.index(report.BEGIN), text.index(report.END)
    return text[start:end]


HEAD = "# Benchmarks\n\n## Before\n\nkept\n"


def _quick(pg, kafka, tmp_path, *part: str) -> str:
    """``pyscheduler bench peers --quick`` with one part's flags (smaller sizes than --quick's:
    the test checks the output, not the speed) into a document that has a section of its own;
    the document, which keeps what came before the section and names the command without the
    servers' addresses."""
    doc = tmp_path / "benchmarks.md"
    doc.write_text(HEAD)
    out = subprocess.run(
        [sys.executable, "-m", "pyscheduler", "--log-level", "WARNING", "bench", "peers", "--quick", *part,
         "--dsn", pg.base_dsn, "--bootstrap-servers", kafka, "--markdown", str(doc),
         "--img-dir", str(tmp_path / "img")],
        capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    text = doc.read_text()
    assert text.startswith(HEAD)  # the rest of the document is kept
    assert "`pyscheduler bench peers --quick" in text
    assert pg.base_dsn not in text and kafka not in text
    assert "wrote" in out.stdout
    return text


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_quick_job_queue_part_reports_every_system_and_column(pg, kafka, tmp_path):
    text = _quick(pg, kafka, tmp_path, "--no-flow", "--no-delay", "--jobs", "500", "--samples", "3")
    assert text.count(report.BEGIN) == 1 and text.count(report.END) == 1
    section = _section(text)
    tasks, ratios, scenarios = _tables(section)
    assert "**Delay queue.**" not in section and flow.BEGIN not in text  # the parts not run: nothing

    assert tasks[0] == report.TASKS_HEADER
    assert [r[0] for r in tasks[1:]] == OURS + PEERS
    for row in tasks[1:]:
        assert len(row) == len(report.TASKS_HEADER) and all(row), row
        assert re.fullmatch(r"[\d,]+", row[5].split(" ")[0]), row  # a completion rate, not capped away
        assert row[6].endswith(" ms") and row[7].endswith(" ms"), row
    versions = {r[0]: r[1] for r in tasks[1:]}
    assert versions["graphile-worker"] == "0.17.3"  # the lockfile's peers
    assert versions["pg-boss"].startswith("10.")
    assert not next(s for s in SYSTEMS if s.key == "worker-async").missing()  # the asyncio Worker runs

    assert ratios[0] == ["pyscheduler"] + PEERS
    assert [r[0] for r in ratios[1:]] == OURS
    assert all(re.fullmatch(r"\d+\.\d\dx", cell) for r in ratios[1:] for cell in r[1:]), ratios

    # failures and delays: pyscheduler and graphile-worker, each run against graphile-worker's
    assert scenarios[0] == report.SCENARIO_HEADER
    runs = [r[:2] for r in scenarios[1:]]
    assert runs == [[SCENARIOS[sc], name] for sc in ("fail", "delay") for name in OURS + ["graphile-worker"]]
    for row in scenarios[1:]:
        assert re.fullmatch(r"[\d,]+", row[3].split(" ")[0]), row  # a completion rate, not capped away
        assert re.fullmatch(r"\d+\.\d\dx", row[4]) if row[1] in OURS else row[4] == "—", row

    assert (tmp_path / "img" / report.TASKS_CHART).read_bytes().startswith(PNG)
    assert f"(img/{report.TASKS_CHART})" in section and report.JITTER_CHART not in section


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_quick_delay_part_reports_both_relays_lost_nothing(pg, kafka, tmp_path):
    text = _quick(pg, kafka, tmp_path, "--no-flow", "--no-tasks", "--delay-duration", "2",
                     "--min-delay", "0.2", "--max-delay", "0.6")
    section = _section(text)
    [delay] = _tables(section)  # the job-queue part, not run, has no paragraph nor table
    assert "**Job queues.**" not in section and flow.BEGIN not in text
    assert delay[0] == report.DELAY_HEADER
    assert sorted(r[0] for r in delay[1:]) == sorted(RELAYS)
    for row in delay[1:]:
        assert len(row) == len(report.DELAY_HEADER) and all(row), row
        assert row[7] == "0 / 0", row  # nothing lost, no duplicates, for either relay
        # a delivered rate for each relay, the naive one (late, in bursts) included
        assert re.fullmatch(r"[\d,]+( \([\d,]+–[\d,]+\))?", row[2]), row
        assert re.fullmatch(r"meets|misses|meets in \d+ of \d+ rounds", row[8]), row
    assert (tmp_path / "img" / report.JITTER_CHART).read_bytes().startswith(PNG)
    assert f"(img/{report.JITTER_CHART})" in section and report.TASKS_CHART not in section


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_quick_enqueue_and_end_to_end_part_reports_every_system(pg, kafka, tmp_path):
    """Enqueue, capacity and end to end (issue 31): every system, a rate in each, our variants, and
    the section's chart."""
    text = _quick(pg, kafka, tmp_path, "--no-tasks", "--no-delay", "--single-jobs", "50",
                     "--enqueue-jobs", "1000", "--e2e-backlog", "1000")
    assert report.BEGIN not in text  # the job-queue and delay parts, not run, write no section
    section = text[text.index(flow.BEGIN):text.index(flow.END)]
    assert f"![enqueue and end to end](img/{flow.CHART})" in section  # the chart, drawn
    assert (tmp_path / "img" / flow.CHART).read_bytes().startswith(b"\x89PNG")
    enqueue, capacity, e2e = _tables(section)
    systems = ["pyscheduler", "pgqueuer", "graphile-worker"]
    assert [r[0].rsplit(" ", 1)[0] for r in enqueue[1:4]] == systems
    assert [r[0] for r in enqueue[4:]] == ["pyscheduler, `run_at=timedelta(hours=1)`",
                                           "pyscheduler, a new unique key each"]
    assert all(re.fullmatch(r"[\d,]+", r[1]) and re.fullmatch(r"[\d,]+", r[3]) for r in enqueue[1:4]), enqueue
    assert f"in {flow.SLICES} slices the systems take in turn" in section  # single: runners alive together
    assert [r[0] for r in capacity[1:]] == systems + [v.label for v in flow.VARIANTS]
    assert all(re.fullmatch(r"[\d,]+", r[1]) and r[2] == "yes" for r in capacity[1:]), capacity
    assert "On a queue that keeps no completed tasks" in section and "With the spec search index off" in section
    assert [r[1] for r in e2e[1:]] == systems and all("50% of pyscheduler's capacity" in r[0] for r in e2e[1:])
    assert all(re.fullmatch(r"[\d,]+", r[2]) and r[4] for r in e2e[1:]), e2e


def test_rerun_replaces_the_section_in_place(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nintro\n")
    report.write_markdown(doc, f"{report.BEGIN}\nfirst\n{report.END}")
    doc.write_text(doc.read_text() + "\n## Later section\n\nafter\n")
    report.write_markdown(doc, f"{report.BEGIN}\nsecond\n{report.END}")
    text = doc.read_text()
    assert "first" not in text and text.count("second") == 1
    assert text.index("intro") < text.index("second") < text.index("after")
    assert text.count("## Side by side with peers") == 1


def test_delay_rows_summarise_the_rounds_per_relay_and_load():
    """Several rounds per load: one row per relay and load, medians with min–max, lost and
    duplicates summed over the rounds, and the SLA judged round by round."""
    def run(relay, rate, rnd, steady, p999, lost=0, dup=0):
        return {"relay": relay, "name": RELAYS[0] if relay == "pyscheduler" else RELAYS[1], "rate": rate,
                "round": rnd, "steady": steady, "p50": 1.0 * rnd, "p99": 10.0 * rnd, "p99.9": p999,
                "max": p999 + 1, "lost": lost, "duplicates": dup, "sla": lost == 0 and p999 <= 500,
                "lags": [1.0, 2.0]}
    runs = [run("naive", 10000, 1, 9000, 900), run("pyscheduler", 10000, 1, 10000, 50),
            run("pyscheduler", 1000, 1, 1000, 5), run("naive", 1000, 1, 1000, 7),
            run("pyscheduler", 10000, 2, 9800, 60, dup=2), run("naive", 10000, 2, 8000, 400, lost=1),
            run("pyscheduler", 1000, 2, 1001, 6), run("naive", 1000, 2, 999, 8),
            run("pyscheduler", 10000, 3, 10100, 40), run("naive", 10000, 3, 8500, 300),
            run("pyscheduler", 1000, 3, 1002, 4), run("naive", 1000, 3, 1000, 9)]
    rows = report.delay_rows(runs)
    assert [(r[0], r[1]) for r in rows] == [(RELAYS[0], "1,000"), (RELAYS[1], "1,000"),
                                           (RELAYS[0], "10,000"), (RELAYS[1], "10,000")]
    ours_10k, naive_10k = rows[2], rows[3]
    assert ours_10k[2] == "10,000 (9,800–10,100)"
    assert ours_10k[5] == "50.0 (40.0–60.0) ms"
    assert ours_10k[7] == "0 / 2" and ours_10k[8] == "meets"
    # too late in round 1, lost one in round 2
    assert naive_10k[7] == "1 / 0" and naive_10k[8] == "meets in 1 of 3 rounds"
    assert rows[1][8] == "meets"
    for r in runs:
        if r["relay"] == "naive" and r["rate"] == 10000:
            r["sla"] = False
    assert report.delay_rows(runs)[3][8] == "misses"


def test_capacity_rounds_set_the_rate_of_a_share_and_the_ratio_to_the_best_peer(monkeypatch):
    """The end-to-end section (flow.py): capacity runs in each round; a rate given as a share
    ("50%") runs at that share of pyscheduler's median capacity, rounded to 100 jobs/s, and is
    labelled so; the capacity table gives pyscheduler / each system and names the best peer."""
    capacity = {"pyscheduler": [20_000, 16_000, 18_000], "pgqueuer": [8_000, 9_000, 7_000],
                "graphile-worker": [12_000, 15_000, 10_000], flow.VARIANTS[0].system.key: [24_000, 20_000, 22_000],
                flow.VARIANTS[1].system.key: [21_000, 19_000, 20_000]}
    calls = []

    def run_one(dsn, system, mode, a, b, concurrency):
        calls.append((system.key, mode, a))
        n = len([c for c in calls if c[:2] == (system.key, mode)]) - 1
        rate = capacity[system.key][n % 3] if mode == "capacity" else a
        return {"window_rate": rate, "submitted": 100, "total_s": 100 / rate, "latency_ms": [1.0, 2.0],
                "every_p99_ms": 3.0, "exactly_once": True, "duplicates": 0, "missing": 0, "settings": "s",
                "version": "v"}

    monkeypatch.setattr(flow, "run_one", run_one)
    assert flow.parse_rates("1000, 50%") == [1000, 0.5]
    out = flow.run_rounds("dsn", flow.SYSTEMS, 3, lambda _: None, bulk_jobs=0, single_jobs=0,
                          rates=flow.parse_rates("1000,50%"), seconds=1, concurrency=10, backlog=5000, enqueue=False)
    assert out["capacity_rate"] == 18_000 and out["shares"] == {9_000: 0.5}
    assert list(out["e2e"]) == [1000, 9000]
    assert [c for c in calls if c[1] == "e2e" and c[2] == 9000][0] == ("pyscheduler", "e2e", 9000)
    assert calls.index(("pyscheduler", "e2e", 9000)) > max(i for i, c in enumerate(calls) if c[1] == "capacity")
    section = flow.markdown(out, command="c", context="x", bulk_jobs=0, single_jobs=0, seconds=1, concurrency=10,
                            rounds=3, elapsed=60, backlog=5000)
    cap, e2e = _tables(section)
    assert cap[1:] == [["pyscheduler", "18,000 (16,000–20,000)", "yes", "-"],
                       ["pgqueuer", "8,000 (7,000–9,000)", "yes", "**2.50x** (1.78–2.57)"],
                       ["graphile-worker", "12,000 (10,000–15,000)", "yes", "**1.67x** (1.07–1.80)"],
                       [flow.VARIANTS[0].label, "22,000 (20,000–24,000)", "yes", "**0.82x** (0.80–0.83)"],
                       [flow.VARIANTS[1].label, "20,000 (19,000–21,000)", "yes", "**0.90x** (0.84–0.95)"]]
    assert "against the best peer (graphile-worker): **1.67x** (1.07–1.80)" in section
    # pyscheduler's capacity on a queue that keeps no completed tasks: against the best peer too,
    # and it is not a peer (the rate of a share is pyscheduler's own, kept, capacity)
    assert "keeps no completed tasks (`set_queue_keep_completed`): **22,000 jobs/s**, against graphile-worker: " \
           "**2.00x** (1.33–2.20)" in section
    assert "With the spec search index off (`pyscheduler tasks spec-index off`): **20,000 jobs/s**, against " \
           "graphile-worker: **1.75x** (1.27–2.00)" in section
    assert [r[0] for r in e2e[1:]] == ["1,000"] * 3 + ["9,000 (50% of pyscheduler's capacity)"] * 3


def test_a_round_that_did_not_run_every_job_once_is_said_and_left_out_of_the_ratio():
    """A peer that stalled in two rounds of three (jobs not run 60 s after the producer's end, as
    graphile-worker did at 15,700/s on 2026-11-28) is no throughput to compare: its cell says in
    how many rounds and what, and the ratio is of the clean round only, saying what it left out."""
    def run(rate: float, once: bool = True, missing: int = 0) -> dict:
        return {"submitted": 1000, "total_s": 1000 / rate, "latency_ms": [1.0, 2.0], "every_p99_ms": 9.0,
                "exactly_once": once,
                "duplicates": 0, "missing": missing, "settings": "s", "version": "v"}

    results = {"enqueue": {}, "capacity": {}, "shares": {},
               "e2e": {15_700: {"pyscheduler": [run(15_700), run(15_700), run(15_700)],
                                "graphile-worker": [run(1_900, False, 86_000), run(15_600), run(1_900, False, 800)]}}}
    section = flow.markdown(results, command="c", context="x", bulk_jobs=0, single_jobs=0, seconds=8,
                            concurrency=10, rounds=3, elapsed=60)
    (e2e,) = _tables(section)
    assert e2e[2][5:] == ["9.0 (9.0–9.0)", "no in 2 of 3 rounds: 0 twice, 86,800 not run within 60 s of the end",
                          "**1.01x**; 2 of 3 rounds left out (not exactly once)"]
    assert e2e[1][5:] == ["9.0 (9.0–9.0)", "yes", "-"]


def test_a_round_with_a_rate_of_zero_is_left_out_of_the_ratio_not_divided_by():
    """A capacity run whose counting window held no start (graphile-worker's, with --e2e-seconds
    at 1 and the window starting 1 s in: a ZeroDivisionError ended the whole command) is said
    and left out of the ratio; --e2e-seconds now starts at 2."""
    def run(rate: float) -> dict:
        return {"window_rate": rate, "exactly_once": True, "settings": "s", "version": "v"}

    capacity = {"pyscheduler": [run(600.0), run(600.0)], "graphile-worker": [run(0.0), run(300.0)]}
    section = flow.markdown({"enqueue": {}, "capacity": capacity, "shares": {}, "e2e": {}}, command="c",
                            context="x", bulk_jobs=0, single_jobs=0, seconds=2, concurrency=10, rounds=2,
                            elapsed=9, backlog=1000)
    (cap,) = _tables(section)
    assert cap[2][3] == "**2.00x**; 1 of 2 rounds left out (a rate of 0)"
    out = subprocess.run([sys.executable, "-m", "pyscheduler", "bench", "peers", "--e2e-seconds", "1"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "--e2e-seconds" in out.stderr


def test_start_latencies_are_of_the_steady_window_and_every_jobs_p99_is_kept():
    """The end-to-end runners (flow_runner._done; graphile_flow.js the same): the start percentiles
    are of the jobs submitted from WARM_SECONDS after the first submit, as capacity counts starts
    in that window (the issue's steady state); the cold start's jobs are in every_p99_ms only."""
    from pyscheduler.bench.peers import flow_runner

    warm = flow_runner.WARM_SECONDS
    # (submitted, latency ms): three cold-start jobs, slow; 200 steady ones of 1-2 ms
    jobs = [(0.0, 40.0), (0.1, 30.0), (warm - 0.001, 20.0)]
    jobs += [(warm + 0.005 + i / 100, 1.0 + i % 2) for i in range(200)]
    starts = [t + ms / 1000 for t, ms in jobs]
    made = {"submitted": len(jobs), "started": 0.0, "ended": warm + 2.0}
    out = flow_runner._done(list(range(len(jobs))), made, [max(starts)], [ms for _, ms in jobs], starts)
    assert out["latency_ms"] == [ms for t, ms in jobs[3:]]
    assert percentile(out["latency_ms"], 99) == 2.0
    assert out["every_p99_ms"] == 20.0  # the 201st smallest of 203: the cold start's fastest
    # capacity counts starts in the window: the last cold job started in it
    assert out["exactly_once"] and out["window_rate"] == 201 / 2.0


def test_a_system_that_started_no_job_of_the_steady_window_is_shown_unbounded(tmp_path):
    """A system that stalled after the first second started no job the start percentiles count
    (and a runner with no job at all has no p99 of every job): its cells say inf, the chart
    leaves it out of the start p99's panel, and the section and the chart are still written."""
    def run(latency_ms: list[float], every: float | None) -> dict:
        return {"submitted": 1000, "total_s": 10.0, "latency_ms": latency_ms, "every_p99_ms": every,
                "exactly_once": False, "duplicates": 0, "missing": 900, "settings": "s", "version": "v"}

    results = {"enqueue": {}, "capacity": {}, "shares": {},
               "e2e": {1000: {"pyscheduler": [run([1.0, 2.0], 2.0)], "pgqueuer": [run([], 900.0)],
                              "graphile-worker": [run([], None)]}}}
    (e2e,) = _tables(flow.markdown(results, command="c", context="x", bulk_jobs=0, single_jobs=0, seconds=8,
                                   concurrency=10, rounds=1, elapsed=60))
    assert [r[3:6] for r in e2e[1:]] == [["1.0", "2.0", "2.0"], ["inf", "inf", "900.0"], ["inf", "inf", "inf"]]
    assert flow.chart(tmp_path / "flow.png", results, bulk_jobs=0).read_bytes().startswith(PNG)
