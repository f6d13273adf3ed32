"""pyscheduler.bench.upgrade_walk: what its fingerprint of a schema tells apart (the walk itself,
worktrees of earlier commits migrated and upgraded, takes minutes: docs/contributing.md)."""

import psycopg

from pyscheduler.bench.upgrade_walk import fingerprint


def test_the_fingerprint_tells_what_an_upgraded_database_lacks_or_kept(dsn):
    """The differences the walk of 2026-11-30 met: an index an edited migration added, a table's
    storage options, a stale signature; and a grant, and a column's collation (0059's)."""
    fresh = fingerprint(dsn)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP INDEX pyscheduler.tasks_after_idx")
        c.execute("ALTER TABLE pyscheduler.tasks SET (autovacuum_vacuum_threshold = 5000)")
        c.execute("CREATE FUNCTION pyscheduler._live_task(p_queue text, p_key text) RETURNS jsonb "
                  "LANGUAGE sql AS 'SELECT NULL::jsonb'")
        c.execute("REVOKE EXECUTE ON FUNCTION pyscheduler.version() FROM pyscheduler_client")
        c.execute('ALTER TABLE pyscheduler.tasks ALTER COLUMN unique_key TYPE text COLLATE "default"')
    upgraded = fingerprint(dsn)
    missing, extra = sorted(fresh - upgraded), sorted(upgraded - fresh)
    assert [m.split(" ")[0] for m in missing] == ["column", "index", "relation", "relation", "routine"], missing
    assert missing[0] == 'column tasks.unique_key text collate "C"'
    assert "tasks_after_idx" in missing[1] and "tasks_after_idx" in missing[2]
    assert "autovacuum_vacuum_threshold=2000" in missing[3] and missing[4].startswith("routine version(")
    assert [e.split(" ")[0] for e in extra] == ["column", "relation", "routine", "routine"], extra
    assert extra[0] == "column tasks.unique_key text"
    assert "autovacuum_vacuum_threshold=5000" in extra[1]
    assert extra[2].startswith("routine _live_task(p_queue text, p_key text) jsonb")
    assert extra[3].startswith("routine version(") and "pyscheduler_client" not in extra[3]
    assert "pyscheduler_client=X" in missing[4]
