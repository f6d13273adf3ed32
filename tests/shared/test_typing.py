"""The public API is typed: mypy --strict passes on the clients and on an application's use of
them (tests/shared/typing/usage.py, and the examples of docs/python-api.md's "Task functions"), and
reports the mistakes in tests/shared/typing/misuse.py."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from tests.support import REPO

TYPING = REPO / "tests" / "shared" / "typing"
DOCS_SECTION = "Task functions"  # docs/python-api.md: its examples, in order, as one module


def docs_examples(directory: Path) -> Path:
    """The python blocks of docs/python-api.md's DOCS_SECTION as a module (``dsn`` is given)."""
    page = (REPO / "docs" / "python-api.md").read_text()
    body = page.split(f"\n## {DOCS_SECTION}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```python[ \t]*\n(.*?)^```", body, re.S | re.M)
    assert blocks, f"no examples in {DOCS_SECTION}"
    module = directory / "docs_task_functions.py"
    module.write_text("dsn = str()\n" + "\n".join(blocks))
    return module


def test_mypy_strict_passes_on_the_public_api_and_catches_misuse(tmp_path):
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]
    cache = Path(tempfile.gettempdir()) / "pyscheduler-mypy-cache"
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"), "--cache-dir", str(cache),
         "--no-error-summary", "--show-error-codes", *config["files"], str(TYPING / "usage.py"),
         str(TYPING / "misuse.py"), str(docs_examples(tmp_path))],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    misuse = TYPING / "misuse.py"
    flagged = {int(m[1]) for line in errors if (m := re.match(rf"{re.escape(str(misuse.relative_to(REPO)))}:(\d+):",
                                                             line))}
    marked = {i for i, line in enumerate(misuse.read_text().splitlines(), 1) if line.endswith("# error")}
    others = [line for line in errors if not line.startswith(str(misuse.relative_to(REPO)))]
    assert others == [], "mypy --strict errors in the public API or its usage:\n" + "\n".join(others)
    assert flagged == marked, f"misuse lines flagged {sorted(flagged)}, marked {sorted(marked)}:\n{result.stdout}"
