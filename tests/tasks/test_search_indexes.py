"""The search's indexes on tasks (find_tasks, issue 30) and what they cost the task's life (issue
31). The spec index's pending list (tasks_spec_idx, GIN, migration 0045_e2e): the write that fills
it merges it into the index, so its size bounds the pause one submit, lease or completion can
take for it; it is merged at 256 kB, not PostgreSQL's 4 MB (at 11,400 tasks/s end to end the
4 MB list filled every ~3 s and its merge held one call ~85-100 ms: the start p99). Running
tasks are in neither search index (0048, 0049): a lease is never a HOT update."""

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


def test_a_lease_writes_no_spec_entries_and_a_running_task_is_still_found_by_its_spec(tx):
    """Running tasks are outside the spec index (migration 0048): a lease is never a HOT update,
    so indexing them wrote each task's spec entries once more (the end-to-end capacity, issue
    31). The search reads them from the running tasks instead; a completion is indexed again."""
    clean = "SELECT gin_clean_pending_list('pyscheduler.tasks_spec_idx'::regclass) AS pages"
    tx.execute(clean)
    tx.execute("SELECT count(*) FROM pyscheduler.submit_tasks_lean(queue => 'spec-live', specs => "
               "(SELECT jsonb_agg(jsonb_build_object('i', i, 'to', 'user' || i || '@example.com')) "
               "FROM generate_series(1, 2000) i))")
    assert tx.execute(clean).fetchone()["pages"] > 0  # the submits' entries
    leased = tx.execute("SELECT rn, token FROM pyscheduler.lease_tasks_lean('spec-live', 'w1', n => 2000, "
                        "timeout => '1 hour')").fetchall()
    assert len(leased) == 2000
    assert tx.execute(clean).fetchone()["pages"] == 0  # the leases wrote none

    def found() -> list[str]:
        rows = tx.execute("SELECT task FROM pyscheduler.find_tasks(spec => '{\"to\": \"user7@example.com\"}')")
        return [r["task"]["status"] for r in rows if r["task"]["queue"] == "spec-live"]

    assert found() == ["running"]
    tx.execute("SELECT count(*) FROM pyscheduler.complete_tasks(%s, %s)",
               ([r["rn"] for r in leased], [r["token"] for r in leased]))
    assert tx.execute(clean).fetchone()["pages"] > 0  # completions are searchable again
    assert found() == ["completed"]


def test_a_unique_key_finds_its_tasks_in_every_status_and_queue(tx):
    """Live tasks of a key come from submit's arbiter (tasks_unique_idx leads with the key,
    0049), finished ones from tasks_unique_key_idx: both, newest first, across queues."""
    def submit(queue: str) -> str:
        return tx.execute("SELECT rn FROM pyscheduler.submit_tasks_lean(queue => %s, specs => '[{}]', "
                          "unique_keys => ARRAY['inv-77'])", (queue,)).fetchone()["rn"]

    def lease(queue: str) -> dict:
        return tx.execute("SELECT rn, token FROM pyscheduler.lease_tasks_lean(%s, 'w1', n => 1)",
                          (queue,)).fetchone()

    first = submit("uk-a")
    done = lease("uk-a")
    tx.execute("SELECT count(*) FROM pyscheduler.complete_tasks(ARRAY[%s]::uuid[], ARRAY[%s]::uuid[])",
               (done["rn"], done["token"]))
    again = submit("uk-a")  # the key is free again once its task finished
    other = submit("uk-b")
    assert lease("uk-b")["rn"] == other
    rows = tx.execute("SELECT task FROM pyscheduler.find_tasks(unique_key => 'inv-77')").fetchall()
    assert [(r["task"]["rn"], r["task"]["status"]) for r in rows] == [
        (str(other), "running"), (str(again), "ready"), (str(first), "completed")]
