"""delete_tasks and run_tasks_now (the dashboard's bulk delete and "run now", issue 30), as
TaskClient.delete_many and .run_now: bounded batches of ids, each acting only on the tasks in a
status it applies to that the caller's role may act on; the tallies follow; run now wakes the
queue (a throttled hint, as a submit's) and is recorded in the history."""

from __future__ import annotations

import pytest

from pyscheduler.db import Database, Jsonb
from pyscheduler.errors import InvalidArgument
from pyscheduler.tasks import TaskClient


def _tasks(db, queue: str, n: int, **kw) -> list[str]:
    return [db.call_value("submit_task", queue=queue, spec=Jsonb({"i": i}), **kw)["rn"] for i in range(n)]


def _status(db, rn: str) -> str | None:
    rows = db.query("SELECT status::text AS s FROM pyscheduler.tasks WHERE rn = %s", (rn,))
    return rows[0]["s"] if rows else None


def test_delete_many_deletes_the_finished_tasks_of_its_role_only(db, login):
    name_a, dsn_a = login("pyscheduler_client")
    _, dsn_b = login("pyscheduler_client")
    with Database(dsn_a, max_size=1) as a, Database(dsn_b, max_size=1) as b:
        mine, theirs = _tasks(a, "bulk", 3), _tasks(b, "bulk", 1)
        for rn in mine[:2] + theirs:
            db.call("cancel_task", rn=rn)
        live = mine[2]
        assert sorted(TaskClient(a).delete_many(mine + theirs)) == sorted(mine[:2])
        assert [_status(db, rn) for rn in mine + theirs] == [None, None, "ready", "cancelled"]
        assert TaskClient(a).delete_many([live]) == []
        queue = db.query("SELECT ready FROM pyscheduler.queue_status WHERE queue = 'bulk'")[0]
        assert queue["ready"] == 1  # the tallies: only the live one left counted
        with pytest.raises(InvalidArgument):
            TaskClient(a).delete_many([live] * 1001)
        assert TaskClient(b).delete_many(theirs) == theirs


def test_run_now_makes_scheduled_tasks_due_and_records_it(db, conn, login):
    name, dsn = login("pyscheduler_client")
    with Database(dsn, max_size=1) as a:
        later = _tasks(a, "later", 2, run_in="1 hour")
        ready = _tasks(a, "later", 1)
        other = _tasks(db, "later", 1, run_in="1 hour")  # the admin's (this login may not act on it)
        assert sorted(TaskClient(a).run_now(later + ready + other)) == sorted(later)
    assert conn.execute("SELECT count(*) AS n FROM pyscheduler.tasks WHERE rn = ANY(%s::uuid[]) "
                        "AND run_at <= now()", (later,)).fetchone()["n"] == 2
    history = db.call_value("get_task", rn=later[0])["history"]
    assert history[-1]["_typ"] == "TaskRunNow" and history[-1]["by"] == name
    assert db.call_value("get_task", rn=other[0])["run_at"] is not None and _status(db, other[0]) == "scheduled"
    worker = db.call_value("register_worker")
    leased = {db.call_value("lease_task", queue="later", worker=worker)["rn"] for _ in range(3)}
    assert set(later) | set(ready) == leased


def test_a_cancel_is_recorded_in_the_history_with_its_role(db, login):
    """A bulk cancel (one cancel_task a task) is recorded as the retry and the run now are: the
    history ends with TaskCancelled and the role that cancelled; cancelling again adds nothing."""
    name, dsn = login("pyscheduler_client")
    with Database(dsn, max_size=1) as a:
        rn = _tasks(a, "cx", 1)[0]
        TaskClient(a).cancel(rn)
        TaskClient(a).cancel(rn)
    history = db.call_value("get_task", rn=rn)["history"]
    assert [(h["_typ"], h.get("by")) for h in history] == [("TaskCancelled", name)]
