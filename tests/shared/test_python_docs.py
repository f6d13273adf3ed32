"""docs/python-api.md and README's Python examples cannot drift: every ```python block runs."""

from __future__ import annotations

import re

import psycopg
import pytest

from tests.support import REPO
from pyscheduler import embedded

PAGE = REPO / "docs" / "python-api.md"
FENCE = re.compile(r"^```python[ \t]*\n(?P<body>.*?)^```", re.S | re.M)


def sections() -> dict[str, list[str]]:
    """'## title' -> its python blocks, in page order."""
    out: dict[str, list[str]] = {}
    for chunk in re.split(r"^## ", PAGE.read_text(), flags=re.M)[1:]:
        title, _, body = chunk.partition("\n")
        blocks = [m["body"] for m in FENCE.finditer(body)]
        if blocks:
            out[title.strip()] = blocks
    return out


def run_blocks(blocks: list[str], where: str, **names) -> None:
    namespace = dict(names)
    for number, body in enumerate(blocks, 1):
        try:
            exec(compile(body, f"{where}, example {number}", "exec"), namespace)
        except Exception as exc:
            pytest.fail(f"{where}, example {number}:\n{body}\nfailed: {type(exc).__name__}: {exc}")


def test_the_page_has_an_example_per_client():
    assert {"Connecting", "Leased tasks", "Recurring schedules", "Future checks", "Delay queue",
            "Errors"} <= set(sections())


@pytest.mark.parametrize("section", sorted(sections()))
def test_examples_run(section, dsn, kafka):
    embedded.create_topics(kafka, ["pyscheduler.delay.input"])
    run_blocks(sections()[section], f"docs/python-api.md, {section}", dsn=dsn, bootstrap=kafka)


def test_the_readme_python_examples_run(dsn, conn):
    conn.execute("CREATE TABLE orders (id int PRIMARY KEY)")
    blocks = [m["body"] for m in FENCE.finditer((REPO / "README.md").read_text())]
    assert blocks, "README shows Python usage"
    run_blocks(blocks, "README.md", dsn=dsn)
    with psycopg.connect(dsn) as check:
        assert check.execute("SELECT count(*) FROM pyscheduler.list_tasks(queue => 'invoices')").fetchone()[0] == 1
