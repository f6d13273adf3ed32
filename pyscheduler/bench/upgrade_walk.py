"""Upgrades from earlier commits, walked: a database migrated by a commit's pyscheduler (a git
worktree), then by this checkout's, must hold what this checkout's fresh install holds: the same
routines with their grants, relations, columns, indexes, constraints, triggers, types and
storage options (``SCHEMA_FINGERPRINT``). A failed upgrade or a difference is what an operator on
that version would meet (docs/contributing.md, "Upgrades, walked"); minutes, so not in the suite.

    python -m pyscheduler.bench.upgrade_walk DSN [COMMIT ...] [--every 10]

Without commits: every Nth commit that changed sql/ or migrations/. Exit 1 on a failure.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .peers.tasks import scratch_database
from .sqlapi import SCHEMA_FINGERPRINT

REPO = Path(__file__).resolve().parents[2]
MIGRATE = "import sys; from pyscheduler import migrate; migrate.migrate(sys.argv[1])"


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout


def migrate_with(tree: Path, uri: str) -> str | None:
    """Migrate ``uri`` with ``tree``'s pyscheduler in a process of its own; the error's last line."""
    out = subprocess.run([sys.executable, "-c", MIGRATE, uri], cwd=tree, capture_output=True, text=True,
                         timeout=600, env={**os.environ, "PYTHONPATH": str(tree), "PYTHONWARNINGS": "ignore"})
    return None if out.returncode == 0 else (out.stderr.strip().splitlines() or ["?"])[-1]


def fingerprint(uri: str) -> set[str]:
    import psycopg

    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("SET search_path = pg_catalog")
        return {row[0] for row in conn.execute(SCHEMA_FINGERPRINT)}


def walk(dsn: str, commit: str, fresh: set[str]) -> str | None:
    """What an upgrade from ``commit`` gets wrong; None when it holds the fresh install."""
    with tempfile.TemporaryDirectory() as tmp, scratch_database(dsn, "upgrade_walk") as uri:
        tree = Path(tmp) / "tree"
        git("worktree", "add", "--detach", "-q", str(tree), commit)
        try:
            if (error := migrate_with(tree, uri)) is not None:
                return f"skipped: its own migrate failed: {error}"
        finally:
            git("worktree", "remove", "--force", str(tree))
        if (error := migrate_with(REPO, uri)) is not None:
            return f"upgrade failed: {error}"
        got = fingerprint(uri)
    if got == fresh:
        return None
    return f"differs: missing {sorted(fresh - got)}, extra {sorted(got - fresh)}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dsn")
    ap.add_argument("commits", nargs="*", help="commits to upgrade from (default: see --every)")
    ap.add_argument("--every", type=int, default=10, help="every Nth commit that changed sql/ or migrations/")
    a = ap.parse_args(argv)
    if a.every < 1:
        ap.error(f"--every must be 1 or more, got {a.every}")
    commits = a.commits or git("rev-list", "HEAD~1", "--", "sql", "migrations").split()[::a.every]
    resolved = [subprocess.run(["git", "rev-parse", "--verify", "--quiet", "--end-of-options", f"{c}^{{commit}}"],
                               cwd=REPO, capture_output=True, text=True).stdout.strip() for c in commits]
    if unknown := [c for c, r in zip(commits, resolved) if not r]:
        ap.error(f"not a commit here: {', '.join(unknown)}")
    commits = resolved
    with scratch_database(a.dsn, "upgrade_walk_fresh") as uri:
        if (error := migrate_with(REPO, uri)) is not None:
            raise SystemExit(f"this checkout's own migrate failed: {error}")
        fresh = fingerprint(uri)
    failed = 0
    for commit in commits:
        found = walk(a.dsn, commit, fresh)
        failed += found is not None and not found.startswith("skipped")
        print(f"{git('log', '-1', '--format=%h %cs %s', commit).strip()[:90]}: {found or 'ok'}", flush=True)
    print(f"{len(commits)} commits, {failed} upgrades failed or differ")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
