"""``pyscheduler bench peers``: the command works and its output is complete (not its speed).

One run of ``--quick`` against the test servers checks every system and every
column of the markdown it writes, the two charts, and that a rerun replaces the
section in place instead of adding another.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from pyscheduler.benchpeers import report
from pyscheduler.benchpeers.tasks import SYSTEMS

PNG = b"\x89PNG\r\n\x1a\n"
PEERS = ["procrastinate", "graphile-worker", "pg-boss"]
OURS = ["pyscheduler Worker", "pyscheduler Worker (async)", "pyscheduler batch SQL"]
RELAYS = ["pyscheduler relay", "naive relay (consume, sleep, publish)"]


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


@pytest.mark.timeout(420)
def test_quick_run_reports_every_system_and_column(pg, kafka, tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n## Before\n\nkept\n")
    img = tmp_path / "img"
    out = subprocess.run(
        [sys.executable, "-m", "pyscheduler", "--log-level", "WARNING", "bench", "peers", "--quick",
         "--dsn", pg.base_dsn, "--bootstrap-servers", kafka, "--markdown", str(doc), "--img-dir", str(img)],
        capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]

    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\n## Before\n\nkept\n")  # the rest of the document is kept
    assert text.count(report.BEGIN) == 1 and text.count(report.END) == 1
    section = _section(text)
    assert "`pyscheduler bench peers --quick`" in section  # the command, without server addresses
    assert pg.base_dsn not in section and kafka not in section
    tasks, ratios, delay = _tables(section)

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

    assert delay[0] == report.DELAY_HEADER
    assert sorted(r[0] for r in delay[1:]) == sorted(RELAYS)
    for row in delay[1:]:
        assert len(row) == len(report.DELAY_HEADER) and all(row), row
        assert row[7] == "0 / 0", row  # nothing lost, no duplicates, for either relay
        assert row[8] in ("meets", "misses")

    for name in (report.TASKS_CHART, report.JITTER_CHART):
        assert (img / name).read_bytes().startswith(PNG)
        assert f"(img/{name})" in section
    assert "wrote" in out.stdout


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
