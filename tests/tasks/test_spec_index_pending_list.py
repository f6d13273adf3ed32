"""The spec index's pending list (tasks_spec_idx, GIN, migration 0045_e2e): the write that fills
it merges it into the index, so its size bounds the pause one submit, lease or completion can
take for it; it is merged at 256 kB, not PostgreSQL's 4 MB (at 11,400 tasks/s end to end the
4 MB list filled every ~3 s and its merge held one call ~85-100 ms: the start p99; issue 31)."""

from __future__ import annotations

PAGE = 8192


def test_writes_leave_at_most_256_kb_in_the_spec_index_pending_list(tx):
    tx.execute("SELECT gin_clean_pending_list('pyscheduler.tasks_spec_idx'::regclass)")  # earlier tests' entries
    # 20,000 tasks of two keys: about 1 MB of pending entries, which a 4 MB list would all keep
    tx.execute("SELECT count(*) FROM pyscheduler.submit_tasks_lean(queue => 'pending', specs => "
               "(SELECT jsonb_agg(jsonb_build_object('i', i, 'to', 'user' || i || '@example.com')) "
               "FROM generate_series(1, 20000) i))")
    pending = tx.execute("SELECT gin_clean_pending_list('pyscheduler.tasks_spec_idx'::regclass) AS pages"
                         ).fetchone()["pages"]
    assert 0 < pending * PAGE <= 256 * 1024 + PAGE, pending
