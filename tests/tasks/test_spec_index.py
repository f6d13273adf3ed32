"""The spec search index turned off and on (`pyscheduler tasks spec-index`, issue 31): off, no task
pays for its entries, find_tasks(spec) looks in the newest 100,000 tasks and the monitor merges
nothing; on, the index is the one the migrations build; an index a failed build left invalid reads
as off until built again; only the schema's owner may do either."""

from __future__ import annotations

import threading

import pytest
from click.testing import CliRunner
from psycopg.types.json import Jsonb

from pyscheduler import errors
from pyscheduler.cli import main
from pyscheduler.migrate import set_spec_index, spec_index
from pyscheduler.db import Database
from pyscheduler.tasks import TaskClient, Worker
from tests.support import wait_for

DEF = "SELECT pg_get_indexdef(to_regclass('pyscheduler.tasks_spec_idx')) AS d"


def _found(db: Database, spec: dict) -> list:
    return [r["task"]["spec"] for r in db.call("find_tasks", spec=Jsonb(spec))]


def test_off_then_on_again_is_the_migrations_index_and_the_monitor_merges_nothing_meanwhile(dsn, db):
    built = db.query(DEF)[0]["d"]
    assert built and spec_index(dsn) == "on"
    assert set_spec_index(dsn, False) == "off" and db.query(DEF)[0]["d"] is None
    assert set_spec_index(dsn, False) == "off"  # again: nothing to do
    TaskClient(db).submit_ids("si", [{"to": "a@example.com"}, {"to": "b@example.com"}])
    assert db.call_value("merge_task_search_index") == 0
    assert _found(db, {"to": "b@example.com"}) == [{"to": "b@example.com"}]
    assert set_spec_index(dsn, True) == "on" and db.query(DEF)[0]["d"] == built
    assert _found(db, {"to": "a@example.com"}) == [{"to": "a@example.com"}]


def test_off_a_fragment_is_looked_for_in_the_newest_100000_tasks_and_only_among_the_callers(dsn, db, login):
    mine, theirs = {"old": True}, {"old": True, "theirs": True}
    client = TaskClient(db)
    client.submit_ids("si", [mine])
    _, other = login("pyscheduler_client")
    with Database(other, max_size=1) as their_db:
        TaskClient(their_db).submit_ids("si", [theirs])
        db.query("SELECT count(*) FROM pyscheduler.submit_tasks_lean('si', "
                 "(SELECT jsonb_agg(jsonb_build_object('i', i)) FROM generate_series(1, 99998) i))")
        set_spec_index(dsn, False)
        assert _found(db, {"old": True}) == [theirs, mine]  # mine: the 100,000th newest task
        assert _found(their_db, {"old": True}) == [theirs]  # a fragment matches the caller's own tasks
    client.submit_ids("si", [{"new": True}])
    assert _found(db, {"old": True}) == [theirs] and _found(db, {"new": True}) == [{"new": True}]
    set_spec_index(dsn, True)  # the index finds every task again
    assert _found(db, {"old": True}) == [theirs, mine]


def test_an_index_left_invalid_reads_as_off_until_built_again(dsn, db, conn):
    """What a CREATE INDEX CONCURRENTLY that failed (or is under way) leaves: an invalid index,
    which the planner does not read; the search and the monitor act as if it were off."""
    TaskClient(db).submit_ids("si", [{"to": "c@example.com"}])
    conn.execute("UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'pyscheduler.tasks_spec_idx'::regclass")
    assert spec_index(dsn) == "invalid"
    assert db.call_value("merge_task_search_index") == 0
    assert _found(db, {"to": "c@example.com"}) == [{"to": "c@example.com"}]
    assert set_spec_index(dsn, True) == "on"
    assert _found(db, {"to": "c@example.com"}) == [{"to": "c@example.com"}]


def test_a_build_is_not_cut_short_by_a_statement_timeout_the_database_sets(dsn, db, conn):
    """Building the index at 10 million tasks takes minutes; a statement timeout the role or the
    database sets (here 100 ms, on 50,000 tasks) does not cancel it."""
    TaskClient(db).submit_ids("si", [{"to": f"u{i}@example.com", "n": i} for i in range(50000)])
    set_spec_index(dsn, False)
    dbname = conn.execute("SELECT current_database() AS d").fetchone()["d"]
    conn.execute(f'ALTER DATABASE "{dbname}" SET statement_timeout = 100')
    assert set_spec_index(dsn, True) == "on"


def test_switched_while_a_worker_runs_and_a_producer_submits_every_task_runs_once(dsn, db):
    """Both switches run CONCURRENTLY beside the hot path, a producer submitting until both are
    done: the Worker's prepared lease and completion are planned again, nothing is lost or run
    twice, and the rebuilt index finds the tasks submitted while it was off."""
    seen, lock, made = [], threading.Lock(), [0]

    def handle(ctx) -> None:
        with lock:
            seen.append(ctx.spec["i"])
    client, stop = TaskClient(db), threading.Event()

    def produce() -> None:
        while not stop.wait(0.01):
            client.submit_ids("live", [{"i": i} for i in range(made[0], made[0] + 50)])
            made[0] += 50
    running = Worker(dsn, "live", handle, capacity=4).start()
    producer = threading.Thread(target=produce)
    try:
        producer.start()
        wait_for(lambda: len(seen) > 200, what="the first tasks run")
        assert set_spec_index(dsn, False) == "off"
        off = made[0]
        wait_for(lambda: made[0] > off + 200, what="tasks submitted with the index off")
        assert set_spec_index(dsn, True) == "on"
        stop.set()
        producer.join(30)
        wait_for(lambda: len(seen) >= made[0], timeout=60, what="every task run")
    finally:
        stop.set()
        running.stop()
    assert sorted(seen) == list(range(made[0])) and running.worker.fatal is None
    assert _found(db, {"i": off + 100}) == [{"i": off + 100}]


def test_only_the_schemas_owner_turns_it_off_or_on(dsn, login):
    _, admin = login("pyscheduler_admin")
    with pytest.raises(errors.PermissionDenied):
        set_spec_index(admin, False)
    assert spec_index(dsn) == "on"


def test_the_command_prints_the_state_and_refuses_another_one(dsn):
    def run(*args):
        return CliRunner().invoke(main, ["tasks", "spec-index", "--dsn", dsn, *args])
    assert [run(*a).output for a in ((), ("off",), (), ("on",))] == ["on\n", "off\n", "off\n", "on\n"]
    result = run("maybe")
    assert result.exit_code == 2 and "'maybe' is not one of 'on', 'off'" in result.output
