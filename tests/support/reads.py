"""Shared by the reads-at-scale tests: what one statement read, from PostgreSQL's own
per-transaction counters, so a test pins a plan's shape (which index, how many entries, no scan
of the table) whatever the statistics say, without 10 million rows."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Reads:
    """Per relation (table or index, by name): scans started, tuples (tables: by sequential
    scans; indexes: index entries) returned, and blocks read (found in shared buffers or not:
    an index scan that steps over entries it does not return reads their pages)."""

    scans: dict[str, int]
    returned: dict[str, int]
    blocks: dict[str, int]

    def seq_scans(self, table: str) -> int:
        return self.scans[table]

    def entries(self, index: str) -> int:
        return self.returned[index]


def relations(conn, *tables: str) -> list[str]:
    """The tables and every index of them (schema pyscheduler)."""
    rows = conn.execute(
        "SELECT c.relname FROM pg_class c WHERE c.relnamespace = 'pyscheduler'::regnamespace "
        "AND (c.relname = ANY(%(t)s) OR c.oid IN (SELECT i.indexrelid FROM pg_index i "
        "     WHERE i.indrelid = ANY(ARRAY(SELECT ('pyscheduler.' || t)::regclass FROM unnest(%(t)s::text[]) t))))",
        {"t": list(tables)}).fetchall()
    return [r["relname"] for r in rows]


def _counters(conn, names: list[str]) -> dict[str, tuple[int, int, int]]:
    rows = conn.execute(
        "SELECT c.relname, pg_stat_get_xact_numscans(c.oid) AS scans, pg_stat_get_xact_tuples_returned(c.oid) AS ret, "
        "pg_stat_get_xact_blocks_fetched(c.oid) AS blocks "
        "FROM pg_class c WHERE c.relnamespace = 'pyscheduler'::regnamespace AND c.relname = ANY(%s)",
        (names,)).fetchall()
    return {r["relname"]: (r["scans"], r["ret"], r["blocks"]) for r in rows}


def reads(conn, sql: str, params=None, *, tables: tuple[str, ...]) -> tuple[list, Reads]:
    """Run sql (rolled back) and return its rows and what it read of the tables and their indexes."""
    names = relations(conn, *tables)
    with conn.transaction(force_rollback=True):
        before = _counters(conn, names)
        rows = conn.execute(sql, params).fetchall()
        after = _counters(conn, names)
    return rows, Reads(*({n: after[n][k] - before[n][k] for n in names} for k in range(3)))


def fill(conn, n: int, queue: str, status: str, priority: str = "50", ago: str = "1 day") -> None:
    """n tasks stored as submit_task would (time-ordered ids, one a millisecond from ``ago`` ago),
    without the calls; then counted again (_task_count_all), as rows written by hand must be."""
    conn.execute(
        "INSERT INTO pyscheduler.tasks (rn, queue, spec, priority, status, progress, created, updated, errors, owner, "
        "deadline, history, run_at, submitted_by) SELECT pyscheduler._task_rn(pyscheduler._rn_prefix(c), s), %s, "
        "'{}', " + priority + ", %s::pyscheduler.task_status, 0, c, c, '[]', CASE WHEN %s = 'running' THEN 'w' END, "
        "CASE WHEN %s = 'running' THEN now() + interval '1 hour' END, '[]', "
        "CASE WHEN %s = 'scheduled' THEN now() + interval '1 hour' END, current_user "
        "FROM generate_series(1, %s) i, LATERAL (SELECT nextval('pyscheduler.task_seq') AS s, "
        "now() - %s::interval + i * interval '1 millisecond' AS c) x", (queue, status, status, status, status, n, ago))
    conn.execute("SELECT pyscheduler._task_count_all()")


def concurrently(writer: Callable[[int], None], n: int = 4) -> None:
    """writer(0) .. writer(n - 1), each in a thread of its own; fails with what any of them raised."""
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            writer(k)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads), "a writer did not finish in 120 s"
