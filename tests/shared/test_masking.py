"""Secrets (design.md "Guarantees by construction"): every URL or DSN a log line,
an error message, /readyz or the CLI prints goes through one masking helper,
``pyscheduler.masking.mask_url``. Its rules here; the code walk below finds a call that prints
one without it (tests/ops/test_outages.py runs the daemons with passwords in their DSN and Redis
URL and checks their logs and /readyz)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from pyscheduler.masking import mask_url

PACKAGE = Path(__file__).resolve().parents[2] / "pyscheduler"


@pytest.mark.parametrize("given, shown", [
    ("redis+cluster://admin:S3cret@10.0.0.1:7000,10.0.0.2:7001", "redis+cluster://admin:***@10.0.0.1:7000,10.0.0.2:7001"),
    ("rediss+cluster://:S3cret@h1:7000", "rediss+cluster://:***@h1:7000"),
    ("redis://:S3cret@cache:6379/0", "redis://:***@cache:6379/0"),
    ("postgresql://app:S3cret@db1:5432,db2:5433/app?sslmode=require&password=S3cret",
     "postgresql://app:***@db1:5432,db2:5433/app?sslmode=***&password=***"),
    ("postgres://app:p%40ss%3AS3cret@db/app", "postgres://app:***@db/app"),
    ("host=db port=5432 user=app password=S3cret dbname=app", "host=db port=5432 user=app password=*** dbname=app"),
    ("host=db password = 'S3 cr\\'et' sslpassword=S3cret", "host=db password = *** sslpassword=***"),
    ("https://Zx81secretToken9f3k2LmQ@hooks.example.com/a/Zx81secretPath9f3k2LmQ?key=S3cret#S3cret",
     "https://***@hooks.example.com/a/***?key=***#***"),
    # nothing to hide: as given
    ("postgresql://postgres@127.0.0.1:5432/app", "postgresql://postgres@127.0.0.1:5432/app"),
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ("host=db dbname=app", "host=db dbname=app"),
    ("kafka1:9092,kafka2:9092", "kafka1:9092,kafka2:9092"),
    (None, None),
])
def test_mask_url(given, shown):
    assert mask_url(given) == shown
    assert "S3cret" not in (mask_url(given) or "")


# calls that print their arguments: logging, click.echo, and exceptions (their text is logged or echoed)
PRINTS = {"debug", "info", "warning", "error", "exception", "critical", "log", "echo", "secho"}
SECRET_BEARING = re.compile(r"url|dsn|conninfo", re.IGNORECASE)


def unmasked(node: ast.AST) -> list[str]:
    """Names and attributes in ``node`` that hold a URL or DSN and are not inside mask_url(...)."""
    if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "mask_url":
        return []
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    if name and SECRET_BEARING.search(name):
        return [name]
    return [found for child in ast.iter_child_nodes(node) for found in unmasked(child)]


def test_every_url_or_dsn_printed_goes_through_mask_url():
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in PRINTS or re.search(r"(Error|Exception)$", name):
                for arg in [*node.args, *(k.value for k in node.keywords)]:
                    bad += [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {found}" for found in unmasked(arg)]
    assert bad == [], "print these through pyscheduler.masking.mask_url:\n" + "\n".join(bad)
