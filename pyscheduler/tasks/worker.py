"""The worker library of leased tasks (seeds/scylla.md).

A ``Worker`` registers (a unique id from a database sequence), then leases
tasks of one queue while it has capacity, runs each in a thread with the
application's handler, and keeps every held lease alive from a heartbeat
thread that also reports the handler's progress. A handler that returns
completes its task; one that raises ``Abort`` (or any exception) aborts it
with errors. Cancellation reaches the handler through ``ctx.cancelled``: at
once by NOTIFY, at the latest on the next heartbeat. On stop (SIGTERM in
``pyscheduler run`` or your own shutdown hook) the worker yields the tasks it
still holds so the monitor hands them to another worker at once.

Once ``ctx.stopping`` is set (cancelled, lease lost, or the worker stopping),
a handler that simply returns has NOT finished its task and it is not
recorded as completed: a stopping worker hands the task back (``yield_task``)
so it runs again elsewhere; a cancelled task stays cancelled; a lost lease
belongs to someone else and the outcome is discarded. A handler that did
finish all its work anyway says so with ``ctx.complete()`` before returning.

    def handle(ctx: TaskContext) -> None:
        items = ctx.spec["items"]
        for i, item in enumerate(items):
            if ctx.stopping.is_set():
                return            # unfinished: yielded (or left cancelled / to the new owner)
            process(item)
            ctx.progress((i + 1) / len(items))

    Worker(dsn, "orders", handle, capacity=4).run(stop_event)

Leasing is woken by NOTIFY on submit; polling every ``poll_interval`` (with
jitter) is the fallback.

Every lease comes with a secret token (``ctx.token``) that the worker passes
with each heartbeat and outcome: the database accepts writes only from the
current lease of a task. Any answer meaning "this lease is gone" (cancelled,
leased again, reset, yielded, deleted) stops the handler (``ctx.stopping``).
An outcome the database refuses as data (an ``Abort`` whose arguments are too
large, say) is recorded as an abort with a sanitised error; if even that is
refused the task is yielded. A task is never left running with its slot taken.
"""

from __future__ import annotations

import json
import logging
import math
import queue as queue_mod
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import psycopg

from ..db import Database, Jsonb, Listener, Outage, Session, Wakeup
from ..errors import (LEASE_GONE, RETRYABLE, DatabaseUnavailable, InvalidArgument, SchedulerError, TaskCancelled,
                      is_retryable, rejects_arguments)

log = logging.getLogger(__name__)

MAX_LEASE_SECONDS = 86_400.0  # sql/tasks.sql _timeout: a lease lasts at most 1 day
MAX_DESCRIPTION = 4000  # characters of an error description the worker records
# Connection trouble: wait and retry (a server restart ends sessions with SQLSTATE 57P01 etc.).
TRANSIENT = (DatabaseUnavailable, psycopg.OperationalError)
class _Discard(SchedulerError):
    """Internal: the lease this outcome belongs to is gone (the task was leased again)."""


class Abort(Exception):
    """Raise from a handler to abort the task with these errors (never retried)."""

    def __init__(self, code: str, description: str = "", args: dict[str, Any] | None = None):
        super().__init__(description or code)
        self.error = {"code": code, "args": args or {}, "description": description}


def json_safe(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON that PostgreSQL's jsonb accepts: NaN and infinities become strings,
    NUL characters and unencodable surrogates are replaced, keys become strings, anything
    else (a datetime, an object) becomes its str(); nesting deeper than 50 is cut."""
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")
    if depth >= 50:
        return json_safe(repr(value))
    if isinstance(value, dict):
        return {json_safe(str(k)): json_safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v, depth + 1) for v in value]
    try:
        text = str(value)
    except Exception:  # noqa: BLE001 - a broken __str__ must not lose the outcome
        text = object.__repr__(value)
    return json_safe(text)


def error_entry(code: Any, description: Any = "", args: Any = None) -> dict[str, Any]:
    """One entry of abort_task's errors, always recordable (see json_safe)."""
    args = json_safe(args if isinstance(args, dict) else ({} if args is None else {"value": args}))
    return {"code": json_safe(str(code))[:200] or "error", "args": args,
            "description": json_safe(str(description))[:MAX_DESCRIPTION]}


class TaskContext:
    """What a handler gets: the task, a progress reporter and stop signals."""

    def __init__(self, task: dict[str, Any]):
        self.task = task
        self.rn: str = task["rn"]
        self.token: str | None = task.get("token")  # the lease's secret: proves this lease on every write
        self.spec: dict[str, Any] = task["spec"]
        self._progress: float | None = None
        self.cancelled = threading.Event()  # a client cancelled the task
        self.stopping = threading.Event()  # cancelled, lease lost, or the worker is stopping
        self.reason: str | None = None
        self.finishing = False  # the handler returned; its outcome is being recorded
        self.completed = False  # ctx.complete(): done, even if told to stop

    def complete(self) -> None:
        """Say the work is done: a return is recorded as completed even after ``stopping``
        was set (for reason "stopping"; a cancelled task stays cancelled, a lost lease is lost)."""
        self.completed = True

    def progress(self, value: float) -> None:
        """Report progress (0..1); sent with the next heartbeat."""
        if not 0.0 <= value <= 1.0:
            raise InvalidArgument(f"progress must be in 0..1, got {value!r}")
        self._progress = value

    def _stop(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        if reason == "cancelled":
            self.cancelled.set()
        self.stopping.set()


Handler = Callable[[TaskContext], Any]


def poke_on(stop: threading.Event, *wakeups: Wakeup) -> None:
    """Poke the wakeups when ``stop`` is set, so sleepers notice at once."""

    def wait() -> None:
        stop.wait()
        for w in wakeups:
            w.poke()

    threading.Thread(target=wait, name="poke-on-stop", daemon=True).start()


class _Setter:
    """Sets an event when poked (poke_on: one event following another)."""

    def __init__(self, event: threading.Event):
        self.event = event

    def poke(self) -> None:
        self.event.set()


def task_channel(queue: str) -> str:
    """The NOTIFY channel of a queue (sql/tasks.sql, _task_channel)."""
    return f"pyscheduler_tasks:{queue}"


class Worker:
    """Leases and works tasks of one queue; a daemon (``name``, ``run(stop)``)."""

    def __init__(self, dsn: str, queue: str, handler: Handler, *, capacity: int = 1, timeout: float = 10.0,
                 heartbeat_interval: float | None = None, poll_interval: float = 1.0,
                 aging_rate: float = 0.0, aging_cap: int = 4_294_967_295, yield_on_stop: bool = True,
                 db: Database | None = None):
        if not 1 <= len(queue.encode()) <= 40:
            raise InvalidArgument(f"queue must be 1 to 40 bytes long, got {queue!r}")
        if capacity < 1:
            raise InvalidArgument(f"capacity must be at least 1, got {capacity}")
        if not 0 < timeout <= MAX_LEASE_SECONDS:
            raise InvalidArgument(f"timeout must be more than 0 and at most {MAX_LEASE_SECONDS:.0f} seconds, "
                                  f"got {timeout!r}")
        if heartbeat_interval is not None and not 0 < heartbeat_interval < timeout:
            raise InvalidArgument(f"heartbeat_interval must be more than 0 and shorter than the lease timeout "
                                  f"({timeout} s), got {heartbeat_interval!r}")
        if not poll_interval > 0:
            raise InvalidArgument(f"poll_interval must be more than 0 seconds, got {poll_interval!r}")
        self.dsn, self.queue, self.handler = dsn, queue, handler
        self.capacity = capacity
        self.timeout = timedelta(seconds=timeout)
        self.heartbeat_interval = heartbeat_interval if heartbeat_interval is not None else timeout / 3
        self.poll_interval = poll_interval
        self.aging = {"aging_rate": aging_rate, "aging_cap": aging_cap}
        self.yield_on_stop = yield_on_stop
        self._own_db = db is None
        self.db = db or Database(dsn, min_size=1, max_size=2 + min(capacity, 8), name="pyscheduler-worker")
        self.worker_id: str | None = None
        self.name = f"tasks-worker:{queue}"
        self.held: dict[str, TaskContext] = {}
        self._lock = threading.Lock()
        self._lease_wake = Wakeup()
        self._beat_wake = Wakeup()
        self.registered = threading.Event()
        self.listener: Listener | None = None
        self.polls = 0  # lease calls made (tests and benches wait for the first one)
        self._done: queue_mod.SimpleQueue[TaskContext] = queue_mod.SimpleQueue()
        self._halt = threading.Event()  # stop was asked for, or a worker thread died
        self.fatal: str | None = None  # why the worker stopped itself (a thread died)

    # -- the daemon

    def run(self, stop: threading.Event) -> None:
        if self._own_db:
            self.db.open()
        outage = Outage(f"worker on queue {self.queue}", log)
        while self.worker_id is None and not stop.is_set():
            try:
                self.worker_id = self.db.call_value("register_worker")
                outage.ok()
            except RETRYABLE as exc:
                stop.wait(outage.failed(exc))
        if self.worker_id is None:
            return
        self.name = f"tasks-worker:{self.queue}:{self.worker_id}"
        log.info("%s registered for queue %s (capacity %d)", self.worker_id, self.queue, self.capacity)
        listener = self.listener = Listener(
            self.dsn, [task_channel(self.queue), f"pyscheduler_cancel:{self.worker_id}"],
            self._notified, on_reconnect=self._poke_all, logger=log).start()
        halt = self._halt
        poke_on(stop, _Setter(halt))  # halt: stop, or a thread below died
        poke_on(halt, self._lease_wake)
        beats_stop = threading.Event()  # heartbeats outlive the lease loop while handlers drain
        poke_on(beats_stop, self._beat_wake)
        beat = self._supervised(self._heartbeats, beats_stop, name=f"heartbeat:{self.worker_id}")
        completer_stop = threading.Event()
        completer = self._supervised(self._completer, completer_stop, name=f"complete:{self.worker_id}")
        pool = ThreadPoolExecutor(self.capacity, thread_name_prefix=f"task:{self.worker_id}")
        self.registered.set()
        try:
            self._lease_loop(halt, pool, outage)
        finally:
            self._shutdown(pool)
            completer_stop.set()  # it records what is queued, then returns
            completer.join(30)
            beats_stop.set()
            listener.stop()
            beat.join(5)
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
                self._lease_wake.poke()
                return
            if not stop.is_set():
                self.fatal = f"thread {name} returned unexpectedly"
                log.critical("%s: thread %s returned unexpectedly; stopping the worker", self.name, name)
                self._halt.set()
                self._lease_wake.poke()

        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        return thread

    def _notified(self, channel: str, _payload: str) -> None:
        if channel.startswith("pyscheduler_cancel:"):
            self._beat_wake.poke()
        else:
            self._lease_wake.poke()

    def _poke_all(self) -> None:
        self._lease_wake.poke()
        self._beat_wake.poke()

    def _lease_loop(self, stop: threading.Event, pool: ThreadPoolExecutor, outage: Outage) -> None:
        while not stop.is_set():
            try:
                with self.db.session() as session:  # one connection held: no pool checkout per lease
                    # This session only leases: its commits need not wait for the WAL flush (a
                    # lease lost in a crash is a lease that expired). Chosen here, for this
                    # connection, and undone before it goes back to the pool.
                    session.conn.execute("SET synchronous_commit = off")
                    try:
                        self._lease_until_stop(session, stop, pool, outage)
                    finally:
                        if not session.conn.closed:
                            session.conn.execute("RESET synchronous_commit")
            except RETRYABLE as exc:
                stop.wait(outage.failed(exc))

    def _lease_until_stop(self, session: Session, stop: threading.Event, pool: ThreadPoolExecutor,
                          outage: Outage) -> None:
        while not stop.is_set():
            free = self.capacity - len(self.held)
            got = 0
            if free > 0:
                rows = session.call("lease_tasks", queue=self.queue, worker=self.worker_id, n=free,
                                    timeout=self.timeout, **self.aging)
                outage.ok()
                got = len(rows)
                self.polls += 1
                for row in rows:
                    ctx = TaskContext(row["task"])
                    with self._lock:
                        old = self.held.get(ctx.rn)
                        if old is not None:
                            # Its lease expired and we got the task again: the old execution
                            # must not finish (or release) this new lease.
                            log.warning("task %s leased again while an earlier execution holds it: "
                                        "that lease was lost, its outcome will be discarded", ctx.rn)
                            old.reason = "lost"
                            old.stopping.set()
                        self.held[ctx.rn] = ctx
                    pool.submit(self._work, ctx)
            if got and got == free:
                continue  # maybe more ready: lease again while capacity lasts
            if self._lease_wake.wait(self.poll_interval) and not stop.is_set() and got == 0:
                # A NOTIFY is throttled per queue: one that arrived while we
                # were leasing may stand for a later submit. Look once more shortly.
                self._lease_wake.wait(0.02, jitter=0)
                self._lease_wake.poke()

    def _work(self, ctx: TaskContext) -> None:
        queued = False
        try:
            function, args = self._run_handler(ctx)
            with self._lock:
                ctx.finishing = True  # heartbeats and the shutdown yield leave it alone from here
                reason = ctx.reason
                superseded = self.held.get(ctx.rn) is not ctx
            if reason == "yielded":
                return  # handed back on shutdown: another worker's now
            if reason == "lost" or superseded:
                log.info("task %s: lease lost; the outcome of this execution is discarded", ctx.rn)
                return
            if function == "complete_task" and reason is not None and not ctx.completed:
                # Told to stop and returned without saying it finished: not completed.
                if reason == "cancelled":
                    log.info("task %s was cancelled; it stays cancelled", ctx.rn)
                    return
                log.info("task %s: handler returned after being told to stop (%s); yielding it unfinished",
                         ctx.rn, reason)
                function = "yield_task"
            if function == "complete_task":
                self._done.put(ctx)  # the completer records it (batched) and frees the slot
                queued = True
            elif function == "abort_task":
                self._abort(ctx, args["errors"])
            else:
                self._finish(ctx, function, **args)
        except Exception:  # never silently, and never in the executor's future
            log.exception("task %s: recording the outcome failed", ctx.rn)
        finally:
            if not queued:
                self._release(ctx)

    def _release(self, ctx: TaskContext) -> None:
        with self._lock:
            if self.held.get(ctx.rn) is ctx:  # not a newer lease of the same task
                del self.held[ctx.rn]
        self._lease_wake.poke()  # capacity freed

    def _run_handler(self, ctx: TaskContext) -> tuple[str, dict[str, Any]]:
        """The handler's outcome as the SQL call that records it."""
        try:
            self.handler(ctx)
        except Abort as exc:
            error = exc.error
            return "abort_task", {"errors": [error_entry(error.get("code"), error.get("description"),
                                                         error.get("args"))]}
        except Exception as exc:  # the handler failed: abort (errors are unrecoverable)
            if ctx.reason != "yielded":
                log.exception("task %s failed", ctx.rn)
            return "abort_task", {"errors": [error_entry(type(exc).__name__, exc)]}
        return "complete_task", {}

    def _retry(self, what: str, call: Callable[[], Any]) -> tuple[bool, Any]:
        """(True, call()) once it succeeds. Database trouble and unexpected errors are retried
        with backoff until the worker stops, then for at most one lease length (the lease is
        gone after that anyway): (False, None), logged. Deliberate errors propagate."""
        outage = Outage(what, log)
        give_up_at: float | None = None
        while True:
            try:
                result = call()
                outage.ok()
                return True, result
            except Exception as exc:
                if not is_retryable(exc) or rejects_arguments(exc):
                    raise  # an answer, or data the database refuses: the same call cannot succeed
                if not isinstance(exc, RETRYABLE):
                    log.error("%s failed unexpectedly; retrying", what, exc_info=True)
                delay = outage.failed(exc)
            if self._halt.is_set():
                now = time.monotonic()
                if give_up_at is None:
                    give_up_at = now + self.timeout.total_seconds()
                if now >= give_up_at:
                    log.error("%s: giving up, the worker is stopping and the database still fails; "
                              "the monitor resets the lease when it expires", what)
                    return False, None
                time.sleep(min(delay, give_up_at - now))
            else:
                self._halt.wait(delay)

    def _abort(self, ctx: TaskContext, errors: list[dict[str, Any]]) -> None:
        """Record an abort. Errors the database refuses as data (too many, too large, a value
        it cannot store) are replaced by one short sanitised error; if even that is refused,
        the task is yielded, so it never stays running with its slot taken."""
        refused = self._finish(ctx, "abort_task", errors=Jsonb(errors))
        if refused is None:
            return
        log.error("task %s: the database refused the abort's errors (%s); recording a short error instead",
                  ctx.rn, refused)
        first = errors[0] if errors else {}
        short = [error_entry(str(first.get("code", "error"))[:100], str(first.get("description", ""))[:100],
                             {"refused": str(refused)[:100]})]
        if self._finish(ctx, "abort_task", errors=Jsonb(short)) is not None:
            log.error("task %s: the short error was refused too; yielding the task", ctx.rn)
            self._finish(ctx, "yield_task")

    def _finish(self, ctx: TaskContext, function: str, **args: Any) -> Exception | None:
        """Record abort_task / yield_task, retried through database trouble. Returns the
        error when the database refused the call's data (the caller may record something
        else), else None (recorded, or the lease is gone, or given up)."""

        def call() -> None:
            if self.held.get(ctx.rn) is not ctx:
                raise _Discard("leased again")
            self.db.call(function, rn=ctx.rn, token=ctx.token, **args)

        try:
            done, _ = self._retry(f"{function} of task {ctx.rn}", call)
            if done and function == "yield_task":
                log.info("yielded task %s", ctx.rn)
        except _Discard:
            log.info("task %s: lease lost; the outcome of this execution is discarded", ctx.rn)
        except TaskCancelled:
            log.info("task %s was cancelled before it finished; it stays cancelled", ctx.rn)
        except LEASE_GONE as exc:
            log.warning("task %s: lease lost before it finished (%s)", ctx.rn, exc)
        except Exception as exc:  # noqa: BLE001 - refused as data, or not adaptable at all
            if rejects_arguments(exc) or not isinstance(exc, (SchedulerError, psycopg.Error)):
                return exc
            log.error("task %s: could not record the outcome (%s); the monitor will reset it", ctx.rn, exc)
        return None

    # -- completions, batched: one complete_tasks call for all that finished meanwhile

    def _completer(self, stop: threading.Event) -> None:
        while True:
            try:
                batch = [self._done.get(timeout=0.1)]
            except queue_mod.Empty:
                if stop.is_set():
                    return
                continue
            while len(batch) < 1000:
                try:
                    batch.append(self._done.get_nowait())
                except queue_mod.Empty:
                    break
            try:
                self._complete(batch)
            except Exception:  # never let the completer die: it frees the capacity
                log.exception("recording %d completions failed", len(batch))
                for ctx in batch:
                    self._release(ctx)

    def _complete(self, batch: list[TaskContext]) -> None:
        live = batch

        def call() -> list[dict[str, Any]]:
            nonlocal live
            with self._lock:  # not the outcome of a lease lost meanwhile (the task leased again)
                live = [c for c in batch if self.held.get(c.rn) is c]
            if not live:
                return []
            return self.db.call("complete_tasks", rns=[c.rn for c in live], tokens=[c.token for c in live])

        failed: list[dict[str, Any]] = []
        try:
            _, failed = self._retry(f"completions of {self.worker_id}", call)
            failed = failed or []
        except SchedulerError as exc:
            log.error("could not record %d completions (%s); the monitor will reset them", len(batch), exc)
        kept = {id(c) for c in live}
        for ctx in batch:
            if id(ctx) not in kept:
                log.info("task %s: lease lost; the outcome of this execution is discarded", ctx.rn)
        why = {str(r["rn"]): r["sqlstate"] for r in failed}
        for ctx in batch:
            code = why.get(ctx.rn)
            if code == "PS203":
                log.info("task %s was cancelled before it finished; it stays cancelled", ctx.rn)
            elif code:
                log.warning("task %s: lease lost before it finished (SQLSTATE %s)", ctx.rn, code)
            self._release(ctx)

    # -- heartbeats

    def _heartbeats(self, stop: threading.Event) -> None:
        outage = Outage(f"heartbeats of {self.worker_id}", log)
        while not stop.is_set():
            self._beat_wake.wait(self.heartbeat_interval, jitter=0.1)
            if stop.is_set():
                return
            try:
                self._beat_once(stop, outage)
            except Exception as exc:  # never let the heartbeat thread die: leases would expire
                log.error("heartbeats failed unexpectedly", exc_info=True)
                stop.wait(outage.failed(exc))

    def _beat_once(self, stop: threading.Event, outage: Outage) -> None:
        with self._lock:
            held = list(self.held.values())
        for ctx in held:
            # Leases still ours: running, draining on a stop without yield, or an outcome
            # still being recorded (retries must not outlive the lease).
            if ctx.reason in ("cancelled", "lost", "yielded"):
                continue
            try:
                self.db.call("heartbeat_task", rn=ctx.rn, token=ctx.token, progress=ctx._progress,
                             timeout=self.timeout)
                outage.ok()
            except LEASE_GONE as exc:  # any answer meaning "this lease is gone" stops the handler
                with self._lock:
                    if ctx.finishing:
                        continue  # finished meanwhile: _finish reports the outcome
                    if isinstance(exc, TaskCancelled):
                        log.info("task %s was cancelled: telling its handler", ctx.rn)
                        ctx._stop("cancelled")
                    else:
                        log.warning("task %s: lease lost (%s): telling its handler", ctx.rn, exc)
                        ctx._stop("lost")
            except Exception as exc:
                if not is_retryable(exc):  # a deliberate error about this task: the others go on
                    log.error("heartbeat of task %s failed: %s", ctx.rn, exc)
                    continue
                if not isinstance(exc, RETRYABLE):
                    log.error("heartbeat of task %s failed unexpectedly", ctx.rn, exc_info=True)
                stop.wait(outage.failed(exc))
                break

    # -- shutdown: the seed's K8s rebalancing hook

    def _shutdown(self, pool: ThreadPoolExecutor) -> None:
        with self._lock:
            held = list(self.held.values())
            to_yield = [c for c in held if self.yield_on_stop and not c.finishing]
            for ctx in to_yield:
                ctx._stop("yielded")
        for ctx in to_yield:
            try:
                self.db.call("yield_task", rn=ctx.rn, token=ctx.token)
                log.info("yielded task %s", ctx.rn)
            except (SchedulerError, psycopg.Error) as exc:
                log.warning("could not yield task %s: %s", ctx.rn, exc)
        with self._lock:
            for ctx in held:
                ctx._stop("stopping")
        pool.shutdown(wait=not self.yield_on_stop, cancel_futures=True)

    # -- running in the background (tests, embedding)

    def start(self) -> "RunningWorker":
        stop = threading.Event()
        thread = threading.Thread(target=self.run, args=(stop,), name=self.name, daemon=True)
        thread.start()
        return RunningWorker(self, stop, thread)


class RunningWorker:
    """A worker running in a thread: ``stop()`` it (yields held tasks)."""

    def __init__(self, worker: Worker, stop: threading.Event, thread: threading.Thread):
        self.worker, self.stop_event, self.thread = worker, stop, thread

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Until the worker listens for NOTIFY and has made its first lease call."""
        wait_for(lambda: self.worker.listener is not None and self.worker.listener.ready.is_set()
                 and self.worker.polls > 0, timeout=timeout)

    def stop(self, timeout: float = 10.0) -> None:
        self.stop_event.set()
        self.thread.join(timeout)


def wait_for(condition: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll ``condition`` until it is truthy; its value, or TimeoutError."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(interval)
