"""The local queue: the tasks a Worker leased ahead, waiting for a free handler, and the lease
loop that fills it (one ``lease_tasks_lean`` call in flight, on a connection of its own with
asynchronous commits: a lease lost in a crash is a lease that expired). Its modes and a queued
task's states are documented on :class:`LocalQueue`."""

from __future__ import annotations

import enum
import heapq
import itertools
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from ...db import HeldConnection, Outage, Wakeup, load_json
from ...errors import RETRYABLE
from .. import sqlapi as sql
from .context import TaskContext

if TYPE_CHECKING:
    from .lifecycle import Worker

log = logging.getLogger(__package__)

MAX_PREFETCH = 10_000  # leased tasks a worker may hold in its local queue, at most
SEEN_EVERY = 10.0  # seconds between a worker's worker_seen reports (the workers view)
# s after a wake-up that the lease loop looks again: past the NOTIFY throttle (5 ms) and the
# commit of a submit it throttled (a WAL flush, longer on a loaded server), doubling: a commit c s
# late is leased by 2c s at most, up to 0.32 s (then the poll). With (0.02, 0.1), a commit later
# than 100 ms waited for the poll: a p99 of 0.6-0.8 s at 10,000 tasks/s (docs/benchmarks.md, issue 31).
RECHECKS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32)


class Taken(enum.Enum):
    """What ``LocalQueue.take(finished, complete=True)`` answers instead of the next task."""

    SETTLE = "settle"  # nothing done: the finished task's lease is not plainly ours; settle it the careful way
    FULL = "full"  # nothing done: the recorder is MAX_UNRECORDED behind and the caller may not block


class LocalQueue:
    """The tasks one Worker leased ahead (a heap: highest priority, then oldest), and the lease
    loop that fills it (``run(stop)``, the lease thread). Guarded by the worker's lock.

    The lease loop is in one of these modes:

    LEASING     the queue is at or below its low watermark (half its target): it leases
                ``wanted()`` tasks (free handlers + target - queued), again at once while a
                call returns all it asked for. The target is what the handlers start in
                ``lookahead`` s at their measured rate, at most ``prefetch``; 0 while that is
                less than ``capacity`` (slow tasks are leased only for free handlers, so a
                worker never hoards them while another idles).
    RECHECKING  a call after a wake-up returned some tasks but fewer than asked: the NOTIFY
                that woke it may stand for submits committed later (it is throttled per queue,
                5 ms), so leases start after each of RECHECKS (5 ms doubling to 320 ms)
                before it sleeps long.
    SLEEPING    nothing more is ready: until a NOTIFY of the queue, a handler's poke (the
                queue fell to its low watermark), the queue's next delayed task or retry is
                due (next_task_due), or ``poll_interval`` (with jitter) passed.
    FULL        above the low watermark: until a handler's poke.
    CLOSED      the worker stops (``close()``): take() hands out nothing more; the queued tasks
                are handed back, and so is what a lease call in flight returns.

    A task in it is in one of these states:

    QUEUED      leased, in the heap and in ``Worker.held``; heartbeats renew its lease.
    DROPPED     take() pops it and does not start it: its lease is gone (a heartbeat said it
                was cancelled or lost) or could have expired (not renewed within the lease
                timeout, ``ctx.lease_until``); it leaves ``held``.
    STARTED     handed to a handler (``ctx.started``), whose slot is busy until its next take().
    FINISHING   its handler returned: ``take(finished, complete=True)`` queues the completion
                with the recorder and hands out the next task in one lock round, or answers
                Taken.SETTLE (the lease is not plainly ours: cancelled, lost, told to stop) or
                Taken.FULL (the recorder is behind and the caller may not block).
    YIELDED     still queued when the queue closed: handed back in one yield_tasks call.
    """

    def __init__(self, worker: Worker):
        self.worker = worker
        self.db, self.lock, self.held, self.recorder = worker.db, worker._lock, worker.held, worker.recorder
        self.capacity, self.prefetch, self.lookahead = worker.capacity, worker.prefetch, worker.lookahead
        self.ready = threading.Condition(self.lock)  # tasks were queued, or the queue closed
        self.wake = Wakeup()  # the lease loop: a NOTIFY, a free handler, stopping
        self.closed = False  # hands out nothing more (stopping)
        self.polls = 0  # lease calls made
        self.leased = threading.Event()  # set after the first lease call (RunningWorker.wait_idle)
        self._heap: list[tuple[int, int, int, TaskContext]] = []  # (-priority, seq, n, ctx)
        self._pushed = itertools.count()
        self._busy = 0  # handlers running
        self._started = 0  # tasks handed to handlers, ever (the start rate sizes the target)
        self._rate = 0.0  # tasks started per second, last measured
        self._rate_at, self._rate_count = time.monotonic(), 0
        self._low = 0  # low watermark: lease again at or below it

    # -- the lease thread

    def run(self, stop: threading.Event) -> None:
        worker, wake = self.worker, self.wake
        queue, timeout, aging, poll_interval = worker.queue, worker.timeout, worker.aging, worker.poll_interval
        counted = worker._counted
        # undone before the connection goes back to the pool
        conn = HeldConnection(self.db, setup="SET synchronous_commit = off", teardown="RESET synchronous_commit")
        outage = Outage(f"worker on queue {queue}", log)
        # After a wake-up, leases must start after each time in rechecks (monotonic) before the
        # loop sleeps long (RECHECKING). Pokes (a handler took a task) may wake it sooner; they
        # do not count as those leases.
        rechecks: list[float] = []
        seen_due = 0.0  # when to report worker_seen next (the dashboard's workers, issue 30)
        try:
            while not stop.is_set():
                if time.monotonic() >= seen_due:
                    try:
                        conn.call(sql.WORKER_SEEN, worker=worker.worker_id, queue=queue)
                        outage.ok()
                    except RETRYABLE as exc:
                        stop.wait(outage.failed(exc))
                        continue
                    seen_due = time.monotonic() + SEEN_EVERY
                n = self.wanted()
                got = 0
                if n > 0:
                    sent = time.monotonic()
                    try:
                        # rows (rn, token, spec, priority, seq, attempt); rn, token and spec as text
                        rows = conn.call_tuples(sql.LEASE_TASKS_LEAN, as_text=("uuid", "jsonb"), queue=queue,
                                                worker=worker.worker_id, n=n, timeout=timeout, **aging)
                        outage.ok()
                    except RETRYABLE as exc:
                        stop.wait(outage.failed(exc))
                        continue
                    self.polls += 1
                    if self.polls == 1:
                        self.leased.set()
                    got = len(rows)
                    if 0 < got < n:  # a submit announced these: look again after its throttled followers
                        rechecks = _rechecks(sent)
                    else:
                        while rechecks and sent >= rechecks[0]:
                            del rechecks[0]
                    if counted is not None:
                        counted.lease.observe(time.monotonic() - sent)
                        if got:
                            counted.leased.inc(got)
                    if rows:
                        self.put(rows, sent + timeout.total_seconds())
                    if got == n:
                        continue  # maybe more ready: lease again while the local queue wants more
                if rechecks and n > 0:  # (a full local queue waits for a poke: its next lease is owed)
                    wake.wait(rechecks[0] - time.monotonic(), jitter=0)
                    continue
                if n > 0:  # nothing more ready: sleep until the next delayed task or retry is due
                    try:
                        due = self._next_due(conn)
                        outage.ok()
                    except RETRYABLE as exc:
                        stop.wait(outage.failed(exc))
                        continue
                    if due is not None and due < poll_interval:
                        if wake.wait(due, jitter=0) and got < n:
                            rechecks = _rechecks(time.monotonic())
                        continue
                if wake.wait(poll_interval) and n > 0 and got < n:
                    rechecks = _rechecks(time.monotonic())
        finally:
            conn.close()

    def _next_due(self, conn: HeldConnection) -> float | None:
        """Seconds until the queue's next scheduled task (a delayed task, a retry) is due, by the
        database clock (next_task_due), a little after it; None when none is, or the queue is
        paused. A due one the last lease could not promote (another worker was): 10 ms."""
        due = conn.call_tuples(sql.NEXT_TASK_DUE, queue=self.worker.queue)[0][0]
        if due is None:
            return None
        return max(0.01, due.total_seconds() + 0.001)

    def wanted(self) -> int:
        """How many tasks to lease now (LEASING): free handlers plus the target, when the queue
        is at or below its low watermark; else 0."""
        now = time.monotonic()
        with self.lock:
            elapsed, started = now - self._rate_at, self._started - self._rate_count
            # every 0.2 s; sooner while nothing is leased ahead (target 0: at start, after idling)
            # once the handlers have started 4 rounds of tasks, so a burst of fast tasks is not
            # leased by capacity for 0.2 s (~5 % of a 100,000-task run)
            if elapsed >= 0.2 or (elapsed >= 0.02 and started >= 4 * self.capacity
                                  and self._rate * self.lookahead < self.capacity):
                self._rate = started / elapsed
                self._rate_at, self._rate_count = now, self._started
            target = min(self.prefetch, int(self._rate * self.lookahead))
            if target < self.capacity:
                target = 0
            self._low = target // 2
            queued = len(self._heap)
            if queued > self._low or self.closed:
                return 0
            return max(0, self.capacity - self._busy + target - queued)

    def put(self, rows: list[tuple[Any, ...]], until: float) -> None:
        """Queue leased tasks: rows (rn, token, spec, priority, seq, attempt) with rn, token and
        spec as text, whose leases cannot expire before ``until`` (monotonic)."""
        worker = self.worker
        cls, queue = worker.context_class, worker.queue
        if cls.__init__ is TaskContext.__init__:
            make = cls._leased
        else:  # a subclass with its own __init__: made the documented way
            def make(rn: str, token: str, spec: str, priority: int, queue: str, until: float,
                     attempt: int) -> TaskContext:
                ctx = cls({"rn": rn, "token": token, "spec": load_json(spec), "priority": priority, "queue": queue,
                           "attempt": attempt})
                ctx.lease_until = until
                return ctx
        entries = [(-priority, seq, make(rn, token, spec, priority, queue, until, attempt))
                   for rn, token, spec, priority, seq, attempt in rows]
        late: list[TaskContext] = []
        with self.lock:
            held, pushed, closed = self.held, self._pushed, self.closed
            for priority, seq, ctx in entries:
                old = held.get(ctx.rn)
                if old is not None:
                    # Its lease expired and we got the task again: the old execution
                    # must not finish (or release) this new lease.
                    log.warning("task %s leased again while an earlier execution holds it: "
                                "that lease was lost, its outcome will be discarded", ctx.rn)
                    old._stop("lost")
                held[ctx.rn] = ctx
                if closed:
                    late.append(ctx)
                else:
                    heapq.heappush(self._heap, (priority, seq, next(pushed), ctx))
            if not closed:
                self.ready.notify(len(entries))
        if late:  # leased while the worker was stopping: hand back at once
            self.recorder.yield_back(late, "queued")
        else:
            worker.on_queued()

    def take(self, finished: TaskContext | None, block: bool, complete: bool = False) -> Any:
        """The next task to start (highest priority, then oldest), marking the handler busy;
        None when the queue is closed (or empty and not ``block``). ``finished``: the task the
        calling handler just finished (its slot is free). ``complete``: ``finished`` returned
        normally; queue its completion with the recorder in the same step, or answer
        Taken.SETTLE or Taken.FULL (FINISHING; ``block`` waits for the recorder instead of FULL)."""
        with self.lock:  # the lock of ready (the Condition's own __enter__ is a Python call)
            if complete:
                assert finished is not None
                if finished.reason is not None or self.held.get(finished.rn) is not finished:
                    return Taken.SETTLE
                if not self.recorder.queue_completion(finished, block):
                    return Taken.FULL
            if finished is not None:
                self._busy -= 1
                if len(self._heap) <= self._low:
                    self.wake.poke()  # a free handler: the lease loop may want more (before we wait)
            try:
                while not self.closed:
                    if not self._heap:
                        if not block:
                            return None
                        self.ready.wait()
                        continue
                    ctx = heapq.heappop(self._heap)[3]
                    if self.held.get(ctx.rn) is not ctx or ctx.reason is not None:
                        self._drop(ctx, "its lease ended while it was queued")
                        continue
                    if time.monotonic() >= ctx.lease_until:
                        self._drop(ctx, "its lease may have expired while it was queued; not started")
                        continue
                    ctx.started = True
                    ctx._db = self.db
                    self._busy += 1
                    self._started += 1
                    return ctx
                return None
            finally:
                if len(self._heap) <= self._low:
                    self.wake.poke()

    def _drop(self, ctx: TaskContext, why: str) -> None:
        """(Under the lock.) Forget a queued task that must not start (DROPPED)."""
        if self.held.get(ctx.rn) is ctx:
            del self.held[ctx.rn]
        log.info("task %s: %s", ctx.rn, why)

    def close(self) -> list[TaskContext]:
        """(Under the lock.) CLOSED: wake every waiting handler; the queued tasks still ours, to
        hand back."""
        self.closed = True
        self.ready.notify_all()
        held = self.held
        queued = [e[3] for e in self._heap if held.get(e[3].rn) is e[3] and e[3].reason is None]
        self._heap.clear()
        return queued


def _rechecks(at: float) -> list[float]:
    """The (monotonic) times after ``at`` that leases must start after (RECHECKS)."""
    return [at + after for after in RECHECKS]
