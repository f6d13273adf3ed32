"""The spec search index (``tasks_spec_idx``: find_tasks(spec => ...), the dashboard's search) turned
off and on. It costs every task two sets of entries, as submitted and as finished, and the
monitor's merge of them: 10-18 % of a Worker's capacity on 2 cores (docs/benchmarks.md, issue 31).
Off, find_tasks(spec) looks in the newest 100,000 tasks only. DDL run CONCURRENTLY (no write
waits for it), which no SQL function may run: by the role that owns the schema."""

from __future__ import annotations

from ..db import connect, translating

NAME = "pyscheduler.tasks_spec_idx"
# as migrations 0048 and 0051 leave it (tests/tasks/test_spec_index.py compares the two)
CREATE = ("CREATE INDEX CONCURRENTLY tasks_spec_idx ON pyscheduler.tasks USING gin (spec jsonb_path_ops) "
          "WITH (gin_pending_list_limit = 4096) WHERE status <> 'running'")
STATE = ("SELECT CASE WHEN i.indexrelid IS NULL THEN 'off' WHEN i.indisvalid THEN 'on' ELSE 'invalid' END AS state "
         "FROM (SELECT pg_catalog.to_regclass(%s) AS oid) r LEFT JOIN pg_catalog.pg_index i ON i.indexrelid = r.oid")


def spec_index(dsn: str) -> str:
    """'on', 'off', or 'invalid' (a build that failed or is under way: find_tasks reads as if off)."""
    with translating(), connect(dsn) as conn:
        return conn.execute(STATE, (NAME,)).fetchone()["state"]


def set_spec_index(dsn: str, on: bool) -> str:
    """Build the index (``on``; an invalid one is dropped first) or drop it; the state after."""
    with translating(), connect(dsn) as conn:
        conn.execute("SET statement_timeout = 0")  # a build at 10 million tasks takes minutes
        state = conn.execute(STATE, (NAME,)).fetchone()["state"]
        if state == "invalid" or (state == "on" and not on):
            conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {NAME}")
        if on and state != "on":
            conn.execute(CREATE)
        return conn.execute(STATE, (NAME,)).fetchone()["state"]
