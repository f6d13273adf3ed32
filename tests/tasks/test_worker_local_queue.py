"""The Worker's local queue: prefetch, priority order, expiry, hand-back on stop."""

from __future__ import annotations

import threading
import time

import pytest

from pyscheduler.db import Jsonb
from pyscheduler.tasks import TaskClient, TaskContext, Worker

from tests.support import wait_for
from tests.support.tasks import logged, status, types_of

pytestmark = pytest.mark.slow  # every test here: daemons, processes or servers of its own, on the real clock


def test_fast_tasks_are_leased_ahead_but_never_run_beyond_capacity(dsn, db):
    client = TaskClient(db)
    active, peak, most_held, lock = [0], [0], [0], threading.Lock()
    ran: list[str] = []
    worker: list[Worker] = []

    def handler(ctx: TaskContext) -> None:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
            most_held[0] = max(most_held[0], len(worker[0].held))
            ran.append(ctx.rn)
        time.sleep(0.0005)
        with lock:
            active[0] -= 1

    total = 3000
    db.call("submit_tasks", queue="fast", specs=Jsonb([{"i": i} for i in range(total)]))
    running = Worker(dsn, "fast", handler, capacity=3, lookahead=0.5).start()
    worker.append(running.worker)
    try:
        wait_for(lambda: running.worker.completed == total, timeout=120)
    finally:
        running.stop()
    assert peak[0] <= 3
    assert most_held[0] > 3, "the worker never leased ahead of its capacity"
    assert len(ran) == len(set(ran)) == total  # each exactly once
    assert {t["status"] for t in client.list("fast", limit=total)} == {"completed"}


def test_the_local_queue_starts_tasks_by_priority_then_age(dsn, db):
    order: list[tuple[int, int]] = []
    specs = [{"p": p, "i": i} for i in range(100) for p in (1, 5, 9)]
    for p in (1, 5, 9):
        db.call("submit_tasks", queue="prio", specs=Jsonb([s for s in specs if s["p"] == p]), priority=p)
    running = Worker(dsn, "prio", lambda ctx: order.append((ctx.spec["p"], ctx.spec["i"])), capacity=1).start()
    try:
        wait_for(lambda: running.worker.completed == 300)
    finally:
        running.stop()
    assert order == sorted(order, key=lambda x: (-x[0], x[1]))


def _leased_into_queue(db, worker: Worker, queue: str, n: int, until: float) -> list[str]:
    """Lease n tasks for ``worker`` and put them in its local queue as if its lease thread had."""
    db.call("submit_tasks", queue=queue, specs=Jsonb([{"i": i} for i in range(n)]))
    with db.session() as s:  # the rows as the lease thread gets them (rn, token, spec as text)
        rows = s.call_tuples("lease_tasks_lean", as_text=("uuid", "jsonb"), queue=queue, worker="w-test", n=n)
    worker.local.put(rows, until)
    return [r[0] for r in rows]


def test_a_queued_task_whose_lease_could_have_expired_is_not_started(db, dsn):
    worker = Worker(dsn, "exp", lambda ctx: None)
    [old] = _leased_into_queue(db, worker, "exp", 1, until=time.monotonic() - 0.001)
    assert worker.held and worker.local.take(None, block=False) is None  # dropped, not started
    assert not worker.held
    [fresh] = _leased_into_queue(db, worker, "exp2", 1, until=time.monotonic() + 60)
    ctx = worker.local.take(None, block=False)
    assert ctx is not None and ctx.rn == fresh and ctx.started


def test_a_cancelled_queued_task_is_dropped_by_the_next_heartbeat_and_never_started(dsn, db):
    client = TaskClient(db)
    started: list[str] = []
    release = threading.Event()

    def handler(ctx: TaskContext) -> None:
        started.append(ctx.rn)
        release.wait(30)

    worker = Worker(dsn, "cq", handler, capacity=1, timeout=30)
    running = worker.start()
    try:
        blocker = client.submit("cq", {})["rn"]
        wait_for(lambda: started == [blocker])
        queued = _leased_into_queue(db, worker, "cq", 2, until=time.monotonic() + 30)
        client.cancel(queued[0])
        worker.heartbeats.wake.poke()  # (the cancel NOTIFY goes to the lease's owner label, w-test)
        wait_for(lambda: queued[0] not in worker.held)
        release.set()
        wait_for(lambda: worker.completed == 2)
        assert started == [blocker, queued[1]]
        assert status(client, queued[0]) == "cancelled"
    finally:
        release.set()
        running.stop()


def test_on_stop_queued_tasks_go_back_in_one_call_and_run_elsewhere(dsn, db, monitor, caplog):
    client = TaskClient(db)
    gate = threading.Event()
    first: list[str] = []

    def handler(ctx: TaskContext) -> None:
        first.append(ctx.rn)
        ctx.stopping.wait(30)

    worker = Worker(dsn, "back", handler, capacity=1, timeout=60)
    running = worker.start()
    blocker = client.submit("back", {})["rn"]
    wait_for(lambda: first == [blocker])
    queued = _leased_into_queue(db, worker, "back", 5, until=time.monotonic() + 60)
    running.stop()
    assert not running.thread.is_alive() and not worker.held
    assert logged(caplog, "handed back 5 queued tasks")
    for rn in queued + [blocker]:
        assert "TaskYield" in types_of(client.get(rn))
    second = Worker(dsn, "back", lambda ctx: gate.set()).start()
    try:
        wait_for(lambda: all(status(client, rn) == "completed" for rn in queued + [blocker]))
        assert all(types_of(client.get(rn)) == ["TaskAssignment", "TaskYield", "TaskAssignment"]
                   for rn in queued)
        assert first == [blocker]  # the queued ones never started on the stopped worker
    finally:
        second.stop()


def test_prefetch_and_lookahead_are_checked(dsn):
    from pyscheduler import errors
    from pyscheduler.tasks import AsyncWorker

    for kind in (Worker, AsyncWorker):
        with pytest.raises(errors.InvalidArgument, match="prefetch"):
            kind("dsn", "q", lambda ctx: None, prefetch=-1)
        with pytest.raises(errors.InvalidArgument, match="lookahead"):
            kind("dsn", "q", lambda ctx: None, lookahead=-0.1)
    assert Worker(dsn, "q", lambda ctx: None, prefetch=0).prefetch == 0  # lease only for free handlers


def test_handlers_wait_for_a_recorder_that_is_behind_then_go_on(dsn, db, monkeypatch):
    """Back-pressure: with at most 5 completions waiting for the recorder, the handlers wait
    while it records (a round trip, thousands of no-op tasks long) and go on once it took them;
    every task completes once."""
    from pyscheduler.tasks import AsyncWorker
    from pyscheduler.tasks.worker import recorder

    async def nothing(ctx: TaskContext) -> None:
        return None

    monkeypatch.setattr(recorder, "MAX_UNRECORDED", 5)
    for queue, worker in (("bp", Worker(dsn, "bp", lambda ctx: None, capacity=4)),
                          ("bp-async", AsyncWorker(dsn, "bp-async", nothing, capacity=4))):
        db.call("submit_tasks", queue=queue, specs=Jsonb([{"i": i} for i in range(300)]))
        running = worker.start()
        try:
            wait_for(lambda: running.worker.completed == 300, timeout=60)
        finally:
            running.stop()
        assert {t["status"] for t in TaskClient(db).list(queue, limit=300)} == {"completed"}
