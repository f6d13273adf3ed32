"""The search's indexes on tasks (find_tasks, issue 30) and what they cost the task's life (issue
31). The spec index's pending list (tasks_spec_idx, GIN): whoever merges it into the index pays
for all of it. The tasks monitor does, every merge_interval (merge_task_search_index, migration
0051), so no submit, lease or completion pays for it; without a monitor the write that fills
4 MB does (at 256 kB, 0045 to 0050, the submits paid every merge: ~1.4 us of a bulk submit's
~11 us a task). Running tasks are in neither search index (0048, 0049): a lease is never a HOT
update."""

from __future__ import annotations

import threading

from psycopg.types.json import Jsonb

from pyscheduler.tasks import Monitor, TaskClient
from tests.support import wait_for

PAGE = 8192
CLEAN = "SELECT gin_clean_pending_list('pyscheduler.tasks_spec_idx'::regclass) AS pages"


def _submit(cur, queue: str, n: int, leaves: int = 2) -> None:
    """n tasks of ``leaves`` values each (a spec index entry a value), in one statement."""
    cur.execute("SELECT count(*) FROM pyscheduler.submit_tasks_lean(queue => %s, specs => "
                "(SELECT jsonb_agg((SELECT jsonb_object_agg('k' || j, i * 100 + j) FROM generate_series(2, %s) j)"
                " || jsonb_build_object('to', 'user' || i || '@example.com')) FROM generate_series(1, %s) i))",
                (queue, leaves, n))


def test_a_write_merges_the_spec_index_pending_list_only_past_4_mb(tx):
    """Below 4 MB the writes leave their entries in the pending list (the monitor merges it);
    the write that fills 4 MB merges it, so a search never reads more than 4 MB of it.
    Autovacuum merges the list too, and while it does a write's merge is skipped, so the list can
    pass 4 MB (4.6 MB in a CI run): the test keeps autovacuum off the table by holding the lock
    autovacuum takes (a waiting LOCK cancels a running autovacuum)."""
    tx.execute("LOCK TABLE pyscheduler.tasks IN SHARE UPDATE EXCLUSIVE MODE")
    tx.execute(CLEAN)  # earlier tests' entries
    _submit(tx, "pending", 20000)  # about 1 MB of entries: a 256 kB list would have been merged
    assert 256 * 1024 < tx.execute(CLEAN).fetchone()["pages"] * PAGE < 4 * 1024 * 1024
    _submit(tx, "pending", 30000, leaves=8)  # about 6 MB: merged once on the way
    assert 0 < tx.execute(CLEAN).fetchone()["pages"] * PAGE <= 4 * 1024 * 1024 + PAGE


def test_the_monitor_merges_the_pending_list_and_every_task_is_still_found(dsn, db):
    db.call_value("merge_task_search_index")  # earlier tests' entries
    TaskClient(db).submit_ids("merged", [{"to": f"user{i}@example.com"} for i in range(5000)])
    stop = threading.Event()
    monitor = Monitor(dsn, reset_interval=0.2)
    thread = threading.Thread(target=monitor.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(lambda: monitor.merged > 0)  # its first pass
    finally:
        stop.set()
        thread.join(10)
    assert db.call_value("merge_task_search_index") == 0  # nothing was left for anyone else
    rows = db.call("find_tasks", spec=Jsonb({"to": "user4321@example.com"}))
    assert [(r["task"]["queue"], r["task"]["spec"]) for r in rows] == [("merged", {"to": "user4321@example.com"})]


def test_the_monitor_merges_every_merge_interval_between_its_resets(dsn, db):
    """A merge is a burst on a server core; merged once a second, a busy queue's tasks started up
    to 30 ms late behind it (issue 31). So the monitor merges every merge_interval, whatever its
    reset_interval: here the second batch is merged long before the next reset is due."""
    db.call_value("merge_task_search_index")  # earlier tests' entries
    client = TaskClient(db)
    client.submit_ids("paced", [{"to": f"first{i}@example.com"} for i in range(2000)])
    stop = threading.Event()
    monitor = Monitor(dsn, reset_interval=600, merge_interval=0.05)
    thread = threading.Thread(target=monitor.run, args=(stop,), daemon=True)
    thread.start()
    try:
        first = wait_for(lambda: monitor.merged, what="the first merge")
        client.submit_ids("paced", [{"to": f"second{i}@example.com"} for i in range(2000)])
        # (not "nothing pending" after it: a merge may run while a submit inserts, and the
        # submit's last entries wait for the next one, a merge_interval later)
        wait_for(lambda: monitor.merged > first, timeout=30, what="a merge before the next reset (600 s)")
    finally:
        stop.set()
        thread.join(10)
    rows = db.call("find_tasks", spec=Jsonb({"to": "second1999@example.com"}))
    assert [r["task"]["queue"] for r in rows] == ["paced"]


def test_a_lease_writes_no_spec_entries_and_a_running_task_is_still_found_by_its_spec(tx):
    """Running tasks are outside the spec index (migration 0048): a lease is never a HOT update,
    so indexing them wrote each task's spec entries once more (the end-to-end capacity, issue
    31). The search reads them from the running tasks instead; a completion is indexed again."""
    tx.execute(CLEAN)
    tx.execute("SELECT count(*) FROM pyscheduler.submit_tasks_lean(queue => 'spec-live', specs => "
               "(SELECT jsonb_agg(jsonb_build_object('i', i, 'to', 'user' || i || '@example.com')) "
               "FROM generate_series(1, 2000) i))")
    assert tx.execute(CLEAN).fetchone()["pages"] > 0  # the submits' entries
    leased = tx.execute("SELECT rn, token FROM pyscheduler.lease_tasks_lean('spec-live', 'w1', n => 2000, "
                        "timeout => '1 hour')").fetchall()
    assert len(leased) == 2000
    assert tx.execute(CLEAN).fetchone()["pages"] == 0  # the leases wrote none

    def found() -> list[str]:
        rows = tx.execute("SELECT task FROM pyscheduler.find_tasks(spec => '{\"to\": \"user7@example.com\"}')")
        return [r["task"]["status"] for r in rows if r["task"]["queue"] == "spec-live"]

    assert found() == ["running"]
    tx.execute("SELECT count(*) FROM pyscheduler.complete_tasks(%s, %s)",
               ([r["rn"] for r in leased], [r["token"] for r in leased]))
    assert tx.execute(CLEAN).fetchone()["pages"] > 0  # completions are searchable again
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
