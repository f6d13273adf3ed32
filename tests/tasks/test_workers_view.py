"""The workers view (issue 30): a Worker reports itself (worker_seen) from its lease loop, off
the lease path; the view lists it with what it holds, and lists a worker that does not report
while it holds tasks."""

from __future__ import annotations

import threading

from pyscheduler.db import Jsonb
from pyscheduler.tasks import Worker


def test_the_view_joins_the_reports_and_the_running_tasks(db, conn):
    reporting, silent = db.call_value("register_worker"), db.call_value("register_worker")
    db.call("worker_seen", worker=reporting, queue="emails")
    db.call("worker_seen", worker=reporting, queue="emails")  # again: one row, seen_at renewed
    for _ in range(3):
        db.call("submit_task", queue="emails", spec=Jsonb({}))
    db.call("lease_task", queue="emails", worker=reporting)
    db.call("lease_task", queue="emails", worker=silent)
    db.call("lease_task", queue="emails", worker=silent)
    rows = {r["worker"]: r for r in conn.execute("SELECT * FROM pyscheduler.workers")}
    assert rows[reporting]["holds"] == 1 and rows[reporting]["seen_at"] is not None
    assert rows[silent]["holds"] == 2 and rows[silent]["seen_at"] is None and rows[silent]["registered"] is None
    assert rows[silent]["last_seen"] == rows[silent]["last_heartbeat"] is not None
    assert rows[silent]["oldest_lease_age"].total_seconds() >= 0
    assert conn.execute("SELECT count(*) AS n FROM pyscheduler._task_workers").fetchone()["n"] == 1


def test_a_running_worker_reports_itself_before_leasing_anything(db, dsn):
    started = threading.Event()
    running = Worker(dsn, "idle-queue", lambda ctx: started.set(), poll_interval=0.2).start()
    try:
        running.wait_idle()
        rows = db.query("SELECT * FROM pyscheduler.workers WHERE queue = 'idle-queue'")
        assert [(r["worker"], r["holds"]) for r in rows] == [(running.worker.worker_id, 0)]
    finally:
        running.stop()
