"""The Worker: registers, starts its local queue's lease thread, its recorder and its heartbeats
(each supervised: one that dies stops the worker loudly), runs ``capacity`` handler threads on
the local queue, and on stop hands back what it holds. ``RunningWorker``: one run in a thread."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Self

from ... import metrics
from ...db import Database, Listener, Outage, poke_on
from ...errors import RETRYABLE, InvalidArgument
from .. import sqlapi as sql
from .context import Handler, TaskContext
from .counted import WORKER_SERIES, Counted
from .heartbeats import Heartbeats
from .localqueue import MAX_PREFETCH, LocalQueue, Taken
from .outcomes import raised, returned
from .recorder import Recorder

log = logging.getLogger(__package__)


class Worker:
    """Leases and works tasks of one queue; a daemon (``name``, ``run(stop)``).

    ``capacity`` handler threads take tasks from a local queue that the lease
    thread fills ahead (``prefetch``: at most that many leased tasks wait
    locally; the queue holds about ``lookahead`` seconds of work at the rate the
    handlers start tasks, none while tasks take longer than that)."""

    context_class: type[TaskContext] = TaskContext

    def __init__(self, dsn: str, queue: str, handler: Handler, *, capacity: int = 1, timeout: float = 10.0,
                 heartbeat_interval: float | None = None, poll_interval: float = 1.0,
                 aging_rate: float = 0.0, aging_cap: int = sql.MAX_PRIORITY, yield_on_stop: bool = True,
                 prefetch: int = 1000, lookahead: float = 0.1, db: Database | None = None, registry: Any = None):
        if not 1 <= len(queue.encode()) <= sql.MAX_QUEUE_BYTES:
            raise InvalidArgument(f"queue must be 1 to {sql.MAX_QUEUE_BYTES} bytes long, got {queue!r}")
        if capacity < 1:
            raise InvalidArgument(f"capacity must be at least 1, got {capacity}")
        if not 0 < timeout <= sql.MAX_LEASE.total_seconds():
            raise InvalidArgument(f"timeout must be more than 0 and at most {sql.MAX_LEASE.total_seconds():.0f} "
                                  f"seconds, got {timeout!r}")
        if heartbeat_interval is not None and not 0 < heartbeat_interval < timeout:
            raise InvalidArgument(f"heartbeat_interval must be more than 0 and shorter than the lease timeout "
                                  f"({timeout} s), got {heartbeat_interval!r}")
        if not poll_interval > 0:
            raise InvalidArgument(f"poll_interval must be more than 0 seconds, got {poll_interval!r}")
        if not 0 <= prefetch <= MAX_PREFETCH:
            raise InvalidArgument(f"prefetch must be in 0..{MAX_PREFETCH}, got {prefetch!r}")
        if not 0 <= lookahead <= 60:
            raise InvalidArgument(f"lookahead must be in 0..60 seconds, got {lookahead!r}")
        self.dsn, self.queue, self.handler = dsn, queue, handler
        self.capacity = capacity
        self.timeout = timedelta(seconds=timeout)
        self.heartbeat_interval = heartbeat_interval if heartbeat_interval is not None else timeout / 3
        self.poll_interval = poll_interval
        self.aging = {"aging_rate": aging_rate, "aging_cap": aging_cap}
        self.yield_on_stop = yield_on_stop
        self.prefetch, self.lookahead = prefetch, lookahead
        self._own_db = db is None
        # a lease connection, a recorder connection, heartbeats, aborts and yields; every call
        # is retried, so a connection used within the last 2 s is not checked on checkout
        self.db = db or Database(dsn, min_size=1, max_size=3 + min(capacity, 8), name="pyscheduler-worker",
                                 fresh=2.0)
        self.worker_id: str | None = None
        self.name = f"tasks-worker:{queue}"
        self.held: dict[str, TaskContext] = {}  # every lease held: queued, running, or being recorded
        self._lock = threading.Lock()  # guards held, the local queue and the recorder's buffers
        self._halt = threading.Event()  # stop was asked for, or a worker thread died
        self.registered = threading.Event()
        self.listener: Listener | None = None
        self.fatal: str | None = None  # why the worker stopped itself (a thread died)
        self._threads: dict[str, tuple[threading.Thread, threading.Event]] = {}
        # registry (a prometheus_client CollectorRegistry): count leases, outcomes and latencies there
        self._counted: Counted | None = None
        if registry is not None:
            metrics.register(registry, WORKER_SERIES)
            self._counted = Counted(queue)
        self.recorder = Recorder(self)
        self.local = LocalQueue(self)
        self.heartbeats = Heartbeats(self)

    @property
    def completed(self) -> int:
        """Completions recorded (durably) by this worker."""
        return self.recorder.completed

    @property
    def failed(self) -> int:
        """Failed attempts recorded by this worker (retried, or aborted after their last attempt)."""
        return self.recorder.failed

    @property
    def polls(self) -> int:
        """Lease calls made."""
        return self.local.polls

    def on_queued(self) -> None:
        """Hook, called in the lease thread after tasks were put in the local queue (the handler
        threads are woken already; ``AsyncWorker`` wakes its event loop)."""

    # -- the daemon

    def run(self, stop: threading.Event) -> None:
        if not self._begin(stop):
            return
        try:
            threads = [threading.Thread(target=self._handler_thread, name=f"task:{self.worker_id}:{k}", daemon=True)
                       for k in range(self.capacity)]
            for thread in threads:
                thread.start()
            self._halt.wait()
            self._give_back()
            if not self.yield_on_stop:
                for thread in threads:  # let the handlers finish (told to stop: ctx.stopping)
                    thread.join()
        finally:
            self._end()

    def _begin(self, stop: threading.Event) -> bool:
        """Register, then start the listener and the lease, heartbeat and recorder threads.
        False when stopped before registering."""
        if self._own_db:
            self.db.open(wait=False)  # a database down at start: register_worker below waits it out
        outage = Outage(f"worker on queue {self.queue}", log)
        while self.worker_id is None and not stop.is_set():
            try:
                self.worker_id = self.db.call_value(sql.REGISTER_WORKER)
                outage.ok()
            except RETRYABLE as exc:
                stop.wait(outage.failed(exc))
        if self.worker_id is None:
            if self._own_db:
                self.db.close()
            return False
        self.name = f"tasks-worker:{self.queue}:{self.worker_id}"
        log.info("%s registered for queue %s (capacity %d)", self.worker_id, self.queue, self.capacity)
        self.listener = Listener(
            self.dsn, [sql.task_channel(self.queue), sql.cancel_channel(self.worker_id)],
            self._notified, on_reconnect=self._poke_all, logger=log).start()
        poke_on(stop, self._halt.set)  # halt: stop, or a thread below died
        poke_on(self._halt, self.local.wake.poke)
        for name, target in (("heartbeat", self.heartbeats.run), ("complete", self.recorder.run),
                             ("lease", self.local.run)):
            thread_stop = self._halt if name == "lease" else threading.Event()
            if name == "heartbeat":  # heartbeats outlive the lease loop while handlers drain
                poke_on(thread_stop, self.heartbeats.wake.poke)
            self._threads[name] = (self._supervised(target, thread_stop, name=f"{name}:{self.worker_id}"),
                                   thread_stop)
        self.registered.set()
        return True

    def _end(self) -> None:
        """After the handlers: record what is queued, stop the threads, close."""
        try:
            for name, wait in (("lease", 10), ("complete", 30), ("heartbeat", 5)):
                thread, thread_stop = self._threads[name]
                thread_stop.set()  # the recorder records what is queued, then returns
                if name == "complete":
                    self.recorder.wake()
                thread.join(wait)
            if self.listener is not None:
                self.listener.stop()
        finally:
            if self._own_db:
                self.db.close()
        if self.fatal:
            raise RuntimeError(f"{self.name} stopped itself: {self.fatal}")

    def _supervised(self, target: Callable[[threading.Event], None], stop: threading.Event, *,
                    name: str) -> threading.Thread:
        """Run ``target(stop)`` in a thread; if it dies before ``stop``, stop the worker
        loudly (its held tasks are yielded) rather than run on wedged."""

        def run() -> None:
            try:
                target(stop)
            except BaseException as exc:
                self.fatal = f"thread {name} died: {exc!r}"
                log.critical("%s: thread %s died; stopping the worker", self.name, name, exc_info=True)
                self._halt.set()
                self.local.wake.poke()
                return
            if not stop.is_set():
                self.fatal = f"thread {name} returned unexpectedly"
                log.critical("%s: thread %s returned unexpectedly; stopping the worker", self.name, name)
                self._halt.set()
                self.local.wake.poke()

        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        return thread

    def _notified(self, channel: str, _payload: str) -> None:
        if channel == sql.cancel_channel(str(self.worker_id)):
            self.heartbeats.wake.poke()
        else:
            self.local.wake.poke()

    def _poke_all(self) -> None:
        self.local.wake.poke()
        self.heartbeats.wake.poke()

    # -- a handler slot: run a task, record its outcome, take the next

    def _handler_thread(self) -> None:
        take, recorder, counted, clock = self.local.take, self.recorder, self._counted, time.perf_counter
        handler, complete, settle = self.handler, sql.COMPLETE_TASK, Taken.SETTLE
        ctx = take(None, True)
        while ctx is not None:
            began = clock() if counted is not None else 0.0
            try:
                function, args = returned(ctx, handler(ctx), counted)
            except BaseException as exc:  # noqa: BLE001 - any exception a handler raises is its failure
                function, args = raised(ctx, exc, counted)
            if counted is not None:
                counted.took.append(clock() - began)
            if function is None:  # completed in the application's transaction: nothing to record
                recorder.release(ctx)
                ctx = take(ctx, True)
                continue
            if function is complete:
                following = take(ctx, True, True)
                if following is not settle:
                    ctx = following
                    continue
            recorder.outcome(ctx, function, args)
            ctx = take(ctx, True)

    # -- stopping: the seed's K8s rebalancing hook

    def _give_back(self) -> None:
        """Close the local queue; hand back in one call the queued tasks (never started) and,
        with ``yield_on_stop``, the running ones; tell every handler to stop."""
        with self._lock:
            queued = self.local.close()
            running = [c for c in self.held.values()
                       if c.started and self.yield_on_stop and not c.finishing and c.reason is None]
            for ctx in queued + running:
                ctx._stop("yielded")
        self.on_queued()  # wake handlers waiting on the local queue (asyncio)
        if queued:
            self.recorder.yield_back(queued, "queued")
        if running:
            self.recorder.yield_back(running, "running")
        with self._lock:
            for ctx in list(self.held.values()):
                ctx._stop("stopping")

    # -- running in the background (tests, embedding)

    def start(self) -> RunningWorker:
        return RunningWorker.started(self)


class RunningWorker:
    """A worker running in a thread: ``stop()`` it (yields held tasks)."""

    def __init__(self, worker: Worker, stop: threading.Event, thread: threading.Thread):
        self.worker, self.stop_event, self.thread = worker, stop, thread

    @classmethod
    def started(cls, daemon: Any) -> Self:
        """``daemon.run(stop)`` started in a daemon thread named as it, held by a ``cls``."""
        stop = threading.Event()
        thread = threading.Thread(target=daemon.run, args=(stop,), name=daemon.name, daemon=True)
        thread.start()
        return cls(daemon, stop, thread)

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Until the worker listens for NOTIFY and has made its first lease call; TimeoutError
        after ``timeout`` seconds."""
        worker, deadline = self.worker, time.monotonic() + timeout
        for ready in (lambda: worker.registered, lambda: worker.listener.ready,  # type: ignore[union-attr]
                      lambda: worker.local.leased):
            if not ready().wait(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"{worker.name} not idle within {timeout} s")

    def stop(self, timeout: float = 10.0) -> None:
        self.stop_event.set()
        self.thread.join(timeout)
