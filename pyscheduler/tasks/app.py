"""``TaskApp``: the registry of task functions (``@app.task``, functions.py) and periodic tasks
(``@app.periodic``, periodic.py), and what runs them: ``worker()`` (a ``Worker`` or
``AsyncWorker`` per queue, dispatching by the spec's task name), ``drain()`` and
``testing("inline")`` for tests, ``sync_schedules()``. docs/python-api.md, "Task functions"."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, Literal, ParamSpec, TypeVar, overload

from ..calls import Connectable, json_value
from ..db import Database, Outage, Session, poke_on
from ..errors import InvalidArgument, is_retryable
from ..schedules.client import Overlap, ScheduleClient
from . import sqlapi as sql
from . import tracing
from .aio import AsyncTaskContext, AsyncWorker
from .functions import KeyOption, Options, TaskFunction, run, run_async
from .periodic import Periodic, SyncReport, declare, sync
from .worker import Abort, Retry, RunningWorker, TaskContext, Worker
from .worker.drain import Drained, drain

__all__ = ["Dispatcher", "TaskApp", "TaskAppWorker"]

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

NO_ARGS: dict[str, Any] = {}  # a spec without "args" (never changed: only ever passed as **)
DRAIN_LEASE = 300.0  # s: a drained task's lease (no heartbeats while it runs in the caller's thread)


class TaskApp:
    """Task functions on one database: ``TaskApp(dsn)`` (a pool of its own, opened on first use;
    ``close()`` it, or use ``with``) or ``TaskApp(db)`` on a ``Database``. ``tracer_provider``:
    an OpenTelemetry tracer provider for its spans (default: the global one, once set)."""

    def __init__(self, db: str | Database, *, tracer_provider: Any = None):
        self._db: Database | None
        if isinstance(db, Database):
            self.dsn, self._db, self._own_db = db.dsn, db, False
        elif isinstance(db, str):
            self.dsn, self._db, self._own_db = db, None, True
        else:
            raise InvalidArgument(f"TaskApp takes a DSN or a Database, got {type(db).__name__}")
        self.functions: dict[str, TaskFunction[Any, Any]] = {}  # name -> task function
        self.periodics: dict[str, Periodic] = {}  # schedule name -> declaration
        self.inline = False  # testing("inline"): submit runs the function at once, here
        self._lock = threading.Lock()
        self._tracer = tracing.tracer(tracer_provider) if tracer_provider is not None else None

    @property
    def tracer(self) -> Any:
        """The OpenTelemetry tracer of submits and runs (tracing.py); None: no spans."""
        return self._tracer if self._tracer is not None else tracing.tracer()

    @property
    def db(self) -> Database:
        """The pool submits go through (opened on first use)."""
        if self._db is None:
            with self._lock:
                if self._db is None:
                    self._db = Database(self.dsn, max_size=4, name="pyscheduler-app").open()
        return self._db

    def close(self) -> None:
        """Close the app's own pool (a ``Database`` given to it stays open)."""
        with self._lock:
            if self._own_db and self._db is not None:
                self._db.close()
                self._db = None

    def __enter__(self) -> TaskApp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def queues(self) -> list[str]:
        """The queues of the declared task functions, in declaration order."""
        return list(dict.fromkeys(f.queue for f in self.functions.values()))

    # -- declaring

    @overload
    def task(self, fn: Callable[P, R], /) -> TaskFunction[P, R]: ...

    @overload
    def task(self, fn: None = None, /, *, name: str | None = None, queue: str = "default", priority: int = 50,
             max_attempts: int | None = None, unique_key: KeyOption = None,
             concurrency_key: KeyOption = None) -> Callable[[Callable[P, R]], TaskFunction[P, R]]: ...

    def task(self, fn: Callable[P, R] | None = None, /, *, name: str | None = None, queue: str = "default",
             priority: int = 50, max_attempts: int | None = None, unique_key: KeyOption = None,
             concurrency_key: KeyOption = None) -> TaskFunction[P, R] | Callable[[Callable[P, R]], TaskFunction[P, R]]:
        """Declare a task function (``@app.task`` or ``@app.task(...)``) under ``name`` (default:
        ``module.qualname``), submitted to ``queue`` with these defaults (``options()`` changes
        them per call). ``unique_key``, ``concurrency_key``: a text, or a function of the
        task's arguments answering one (None: no key)."""
        options = Options(queue, priority, max_attempts, unique_key, concurrency_key)

        def declare_task(f: Callable[P, R]) -> TaskFunction[P, R]:
            module = getattr(f, "__module__", None)
            qualname = getattr(f, "__qualname__", getattr(f, "__name__", repr(f)))
            task_name = name or (f"{module}.{qualname}" if module else qualname)
            if task_name in self.functions:
                raise InvalidArgument(f"a task named {task_name!r} is declared already; give one of them name=")
            function = TaskFunction(self, f, task_name, options)
            self.functions[task_name] = function
            return function

        return declare_task if fn is None else declare_task(fn)

    def periodic(self, *, cron: str | None = None, every: timedelta | None = None, timezone: str = "UTC",
                 name: str | None = None, args: dict[str, Any] | None = None,
                 overlap: Overlap = "allow") -> Callable[[TaskFunction[P, R]], TaskFunction[P, R]]:
        """Declare a recurring schedule (``name``, default the task's name) that submits the
        task function below it with ``args``: exactly one of ``cron`` (5 or 6 fields, in
        ``timezone``) and ``every``; ``overlap`` as the schedules' ("skip": not while an
        earlier one is ready or running). ``sync_schedules()`` writes it."""

        def declare_periodic(function: TaskFunction[P, R]) -> TaskFunction[P, R]:
            if not isinstance(function, TaskFunction) or function.app is not self:
                raise InvalidArgument("@app.periodic goes above @app.task of the same app")
            p = declare(function, name=name, cron=cron, every=every, timezone=timezone, args=args, overlap=overlap)
            if p.name in self.periodics:
                raise InvalidArgument(f"a periodic task named {p.name!r} is declared already; give one of them name=")
            self.periodics[p.name] = p
            return function

        return declare_periodic

    def emit_event(self, name: str, payload: Any = None, conn: Connectable | None = None) -> int:
        """Emit the event ``name`` with ``payload`` (JSON; ``emit_event``): the tasks waiting for
        it in ``ctx.await_event`` (those of roles this app's role may act on) become ready with
        it, and it is stored for tasks that wait for it later (until ``cleanup_tasks`` purges
        it). ``conn``: in the application's transaction on its psycopg connection or cursor.
        How many waiting tasks it woke."""
        target = conn if isinstance(conn, (Database, Session)) else self.db if conn is None else Session.borrow(conn)
        given = {} if payload is None else {"payload": json_value("payload", payload)}
        woken: int = target.call_value(sql.EMIT_EVENT, name=name, **given)
        return woken

    def sync_schedules(self) -> SyncReport:
        """Create or update the declared periodic tasks' schedules (a second run changes
        nothing) and report them; schedules of task functions no longer declared are reported
        (``removed``), never deleted."""
        return sync(ScheduleClient(self.db), self.periodics.values())

    # -- running

    def worker(self, queues: list[str] | None = None, *, capacity: int = 1, **options: Any) -> TaskAppWorker:
        """A daemon working ``queues`` (default: every queue of the declared functions), each
        with a ``Worker`` of ``capacity`` (per queue) and ``options`` (timeout, poll_interval,
        registry, ...; see Worker); an ``AsyncWorker`` for a queue whose declared task
        functions are all ``async def``. ``run(stop)``, or ``start()`` in a thread."""
        queues = list(queues) if queues is not None else self.queues
        if not queues:
            raise InvalidArgument("no queue to work: declare a task function, or name the queues")
        workers: list[Worker] = []
        for queue in queues:
            declared = [f for f in self.functions.values() if f.queue == queue]
            dispatcher = Dispatcher(self, queue)
            if declared and all(f.is_async for f in declared):
                workers.append(AsyncWorker(self.dsn, queue, dispatcher.run_async, capacity=capacity, **options))
            else:
                workers.append(Worker(self.dsn, queue, dispatcher, capacity=capacity, **options))
        return TaskAppWorker(self, workers)

    def drain(self, queue: str | None = None, max_tasks: int | None = None) -> list[Drained]:
        """Work every ready task of ``queue`` (default: every queue of the declared functions) in
        this thread, on the database, until none is ready (at most ``max_tasks``); what each
        one's run did (``Drained``: ``outcome``, ``result``, ``error``, ``ctx``), in order."""
        queues = [queue] if queue is not None else self.queues
        workers = [Worker(self.dsn, q, Dispatcher(self, q), db=self.db, timeout=DRAIN_LEASE) for q in queues]
        done: list[Drained] = []
        while True:
            before = len(done)
            for w in workers:
                if max_tasks is not None and len(done) >= max_tasks:
                    return done
                done += drain(w, None if max_tasks is None else max_tasks - len(done))
            if len(done) == before:  # a round found nothing: tasks may submit tasks to other queues
                return done

    @contextlib.contextmanager
    def testing(self, mode: Literal["inline"] = "inline") -> Iterator[TaskApp]:
        """``with app.testing("inline"):`` ``submit`` runs the function at once in this thread,
        without a database: the handle's ``result()`` is its return value (through JSON, as a
        worker's), its exception is raised from ``submit``."""
        if mode != "inline":
            raise InvalidArgument(f"testing mode must be 'inline', got {mode!r}")
        previous, self.inline = self.inline, True
        try:
            yield self
        finally:
            self.inline = previous


class Dispatcher:
    """A worker's handler for task functions: runs the function the spec names with its
    arguments. A name the app does not know fails the attempt (``UnknownTask``, retried after
    the backoff: another worker may know it), said once per name in the log; a spec not of the
    shape ``{"task": name, "args": {...}}`` aborts the task (``InvalidSpec``)."""

    def __init__(self, app: TaskApp, queue: str):
        self.functions, self.queue = app.functions, queue
        self.tracer = app.tracer  # the global tracer provider as set when the worker is built
        self._unknown: set[str] = set()

    def function(self, ctx: TaskContext) -> tuple[TaskFunction[Any, Any], Any]:
        """The task function of ``ctx``'s spec and its arguments (else the refusal, raised)."""
        spec = ctx.spec
        try:
            return self.functions[spec["task"]], spec.get("args", NO_ARGS)
        except (KeyError, TypeError):  # after spec["task"] worked, spec is a dict
            raise self._refusal(spec) from None

    def _refusal(self, spec: Any) -> Exception:
        name = spec.get("task") if isinstance(spec, dict) else None
        if not isinstance(name, str):
            return Abort("InvalidSpec", 'a task function\'s spec is {"task": "<name>", "args": {...}}')
        if name not in self._unknown:
            self._unknown.add(name)
            log.error("queue %s: no task function named %r here (known: %s); its tasks fail and are retried, "
                      "for a worker that knows it", self.queue, name, ", ".join(sorted(self.functions)) or "none")
        return Retry(None, f"no task function named {name!r} on this worker of queue {self.queue!r}",
                     code="UnknownTask", args={"task": name})

    def __call__(self, ctx: TaskContext) -> Any:
        spec = ctx.spec  # function(), inlined: this is the Worker's per-task path
        try:
            function = self.functions[spec["task"]]
        except (KeyError, TypeError):
            raise self._refusal(spec) from None
        if self.tracer is not None:
            with tracing.running(self.tracer, ctx, function.name):
                return run(ctx, function, spec.get("args", NO_ARGS))
        return run(ctx, function, spec.get("args", NO_ARGS))

    async def run_async(self, ctx: AsyncTaskContext) -> Any:
        function, args = self.function(ctx)
        tracer = self.tracer
        with tracing.running(tracer, ctx, function.name) if tracer is not None else contextlib.nullcontext():
            return await run_async(ctx, function, args)


class TaskAppWorker:
    """What ``TaskApp.worker()`` builds: one ``Worker`` (or ``AsyncWorker``) per queue in
    ``workers``; a daemon (``name``, ``run(stop)``) that first syncs the app's periodic
    tasks' schedules, then runs them all until ``stop`` (one that dies stops the others, and
    ``run`` raises)."""

    def __init__(self, app: TaskApp, workers: list[Worker]):
        self.app, self.workers = app, workers
        self.name = "tasks-app:" + ",".join(w.queue for w in workers)

    @property
    def completed(self) -> int:
        return sum(w.completed for w in self.workers)

    @property
    def failed(self) -> int:
        return sum(w.failed for w in self.workers)

    def run(self, stop: threading.Event) -> None:
        if self.app.periodics:
            self._sync(stop)
        halt = threading.Event()
        poke_on(stop, halt.set)
        died: list[BaseException] = []

        def serve(worker: Worker) -> None:
            try:
                worker.run(halt)
            except BaseException as exc:  # noqa: BLE001 - stop the others, raised below
                died.append(exc)
            finally:
                halt.set()  # a worker returns only once halted: the others follow

        threads = [threading.Thread(target=serve, args=(w,), name=w.name, daemon=True) for w in self.workers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if died:
            raise died[0]

    def _sync(self, stop: threading.Event) -> None:
        """sync_schedules, through outages; another refusal is logged and the workers start."""
        outage = Outage("syncing the periodic tasks' schedules", log)
        while not stop.is_set():
            try:
                report = self.app.sync_schedules()
                outage.ok()
                log.info("periodic tasks: created %s, updated %s, unchanged %s", report.created or "none",
                         report.updated or "none", report.unchanged or "none")
                return
            except Exception as exc:
                if not is_retryable(exc):
                    log.error("could not sync the periodic tasks' schedules (%s); the workers start anyway", exc)
                    return
                stop.wait(outage.failed(exc))

    def start(self) -> RunningTaskAppWorker:
        return RunningTaskAppWorker.started(self)


class RunningTaskAppWorker(RunningWorker):
    """A ``TaskAppWorker`` running in a thread: ``wait_idle()``, ``stop()``."""

    def __init__(self, app_worker: TaskAppWorker, stop: threading.Event, thread: threading.Thread):
        self.app_worker, self.stop_event, self.thread = app_worker, stop, thread

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Until every worker listens and made its first lease call; TimeoutError after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        for worker in self.app_worker.workers:
            RunningWorker(worker, self.stop_event, self.thread).wait_idle(max(0.0, deadline - time.monotonic()))
