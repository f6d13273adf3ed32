"""The worker library of leased tasks (seeds/scylla.md).

A ``Worker`` registers (a unique id from a database sequence), then leases
tasks of one queue into a local queue, and ``capacity`` long-lived handler
threads take them from it, highest priority first, then oldest (the
asyncio flavour, ``AsyncWorker`` in ``aio.py``, runs ``async def`` handlers
instead). A handler that returns completes its task; one that raises
``Abort`` aborts it for good with errors; any other exception fails this
attempt (``fail_task``: the error is recorded and the task retried after the
default backoff, or aborted once it used its ``max_attempts``), and
``Retry(in_=timedelta(...))`` chooses the delay. Cancellation reaches the
handler through ``ctx.cancelled``: at once by NOTIFY, at the latest on the
next heartbeat. On stop (SIGTERM in ``pyscheduler run`` or your own shutdown
hook) the worker yields the tasks it still holds so the monitor hands them to
another worker at once.

The speed comes from doing the database work off the handlers' path, in
batches (issue 10):

* The local queue is filled ahead by one lease thread (``lease_tasks_lean``:
  one lease call in flight, on its own connection with asynchronous commits),
  when it falls to its low watermark (half its target). Its target is what the
  handlers start in ``lookahead`` (0.1 s) at the rate they start tasks, at
  most ``prefetch`` (1,000), and nothing while that is less than ``capacity``:
  slow tasks are leased only for free handlers, so a worker never hoards them
  while another idles. (A lease call has a fixed cost besides its rows: at
  500 a call, a no-op run measured 25-40 % fewer tasks/s than at 1,000 on the
  2-core bench machine, docs/benchmarks.md.)
* A leased task is ``running`` in the database while it waits locally, and its
  lease is kept alive like a running one: one ``heartbeat_tasks`` call renews
  every lease the worker holds and answers only the refused ones. A queued task
  whose lease is refused (cancelled, say) is dropped; one whose lease could have
  expired (no successful heartbeat within the lease timeout) is never started.
* A handler that returns frees its slot at once; its completion goes to a
  completion thread that records everything finished meanwhile with one
  ``complete_tasks`` call on a dedicated connection, durably. Only then does
  the task count as done (``Worker.completed``, it leaves ``held``). Handlers
  wait when 1,000 completions are waiting (back-pressure). Failures go the
  same way, with one ``fail_tasks`` call (``Worker.failed``).
* On stop the queued tasks go back in one ``yield_tasks`` call.
* Per task the worker's own Python is a few microseconds: the lease's rows come
  as tuples with rn, token and spec as their text; a context keeps them so (the
  spec is parsed when the handler first reads ``ctx.spec``, with ``db.load_json``
  as every JSON value pyscheduler reads); the batch writes send rns and tokens as
  binary uuid arrays built from that text in one go (``UuidArray``).

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
jitter) is the fallback. An idle worker sleeps at most until the queue's
next delayed task or retry is due (``next_task_due``), so it is leased when
it comes due, not at the next poll.

Every lease comes with a secret token (``ctx.token``) that the worker passes
with each heartbeat and outcome: the database accepts writes only from the
current lease of a task. Any answer meaning "this lease is gone" (cancelled,
leased again, reset, yielded, deleted) stops the handler (``ctx.stopping``).
An outcome the database refuses as data (an ``Abort`` whose arguments are too
large, say) is recorded as an abort with a sanitised error; if even that is
refused the task is yielded. A task is never left running with its slot taken.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import math
import struct
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format

from ..calls import json_value
from ..db import Database, Jsonb, Listener, Outage, Session, Wakeup, load_json, translating
from .. import metrics
from ..errors import (LEASE_GONE, RETRYABLE, DatabaseUnavailable, InvalidArgument, SchedulerError, TaskCancelled,
                      is_retryable, rejects_arguments)

log = logging.getLogger(__name__)

# Series of Worker(..., registry=R): registered in R, counted per batch where there is one.
LEASED = metrics.counter("pyscheduler_worker_leased", "Tasks leased by Worker", ["queue"])
COMPLETED = metrics.counter("pyscheduler_worker_completed", "Completions recorded by Worker", ["queue"])
FAILED = metrics.counter("pyscheduler_worker_failed", "Failed attempts recorded by Worker (a handler raised: retried "
                                                      "after a backoff unless it was the task's last attempt)", ["queue"])
RETRIED = metrics.counter("pyscheduler_worker_retried", "Attempts whose handler raised Retry (retried after the delay "
                                                        "it chose)", ["queue"])
ABORTED = metrics.counter("pyscheduler_worker_aborted", "Tasks whose handler raised Abort", ["queue"])
LEASE_SECONDS = metrics.histogram("pyscheduler_worker_lease_seconds", "Round trip of one lease call (a batch of "
                                                                      "tasks)", ["queue"])
HANDLER_SECONDS = metrics.histogram("pyscheduler_worker_handler_seconds", "Time a handler took per task", ["queue"])
WORKER_SERIES = (LEASED, COMPLETED, FAILED, RETRIED, ABORTED, LEASE_SECONDS, HANDLER_SECONDS)


class _Counted:
    """A Worker's children of the series above (its queue's labels) and the handler times not yet
    observed (a deque: handler threads append, the completer drains in batches)."""

    def __init__(self, queue: str):
        self.leased, self.completed, self.failed, self.retried, self.aborted, self.lease, self.handler = (
            s.labels(queue) for s in WORKER_SERIES)
        self.took: deque[float] = deque()

    def drain(self) -> None:
        took, pop, values = self.took, self.took.popleft, []
        while took:
            values.append(pop())
        if values:
            metrics.observe_many(self.handler, values)

MAX_LEASE_SECONDS = 86_400.0  # sql/tasks/ _timeout: a lease lasts at most 1 day
MAX_DESCRIPTION = 4000  # characters of an error description the worker records
MAX_PREFETCH = 10_000  # leased tasks a worker may hold in its local queue, at most
# s after a wake-up that the lease loop looks again: past the NOTIFY throttle (10 ms) and the
# commit of a submit it throttled (a WAL flush, longer on a loaded server)
RECHECKS = (0.02, 0.1)
MAX_UNRECORDED = 1000  # completions (or failures) waiting to be recorded before handlers wait (one call)
_SLOW, _FULL = object(), object()  # answers of Worker._take (see there)
# Connection trouble: wait and retry (a server restart ends sessions with SQLSTATE 57P01 etc.).
TRANSIENT = (DatabaseUnavailable, psycopg.OperationalError)


def _rechecks(at: float) -> list[float]:
    """The (monotonic) times after ``at`` that leases must start after (RECHECKS)."""
    return [at + after for after in RECHECKS]


class _Discard(SchedulerError):
    """Internal: the lease this outcome belongs to is gone (the task was leased again)."""


class Abort(Exception):
    """Raise from a handler to abort the task with these errors (never retried)."""

    def __init__(self, code: str, description: str = "", args: dict[str, Any] | None = None):
        super().__init__(description or code)
        self.error = {"code": code, "args": args or {}, "description": description}


MAX_RETRY_IN = timedelta(days=365)  # sql/tasks/ fail_tasks: retry_in in 0..365 days


class Retry(Exception):
    """Raise from a handler to fail this attempt and try the task again after ``in_`` (a
    timedelta or seconds; 0: at once; None: the default backoff). The attempt counts: after
    its last one (``max_attempts``) the task is aborted. The error recorded is
    ``{"code": code, "args": args, "description": description}``."""

    def __init__(self, in_: timedelta | float | None = None, description: str = "", *, code: str = "Retry",
                 args: dict[str, Any] | None = None):
        if in_ is not None and not isinstance(in_, timedelta):
            if isinstance(in_, bool) or not isinstance(in_, (int, float)) or not math.isfinite(in_):
                raise InvalidArgument(f"in_ must be a timedelta or a number of seconds, got {in_!r}")
            in_ = timedelta(seconds=in_)
        if in_ is not None and not timedelta(0) <= in_ <= MAX_RETRY_IN:
            raise InvalidArgument(f"in_ must be between 0 and 365 days, got {in_!r}")
        super().__init__(description or code)
        self.in_ = in_
        self.error = {"code": code, "args": args or {}, "description": description}


class Snooze(Exception):
    """Raise from a handler to put the task back for ``in_`` (a timedelta or seconds, 0..365
    days) without using an attempt (``yield_task(..., run_in)``): e.g. a resource that is not
    ready yet. Unlike ``Retry`` it records no error and never aborts the task."""

    def __init__(self, in_: timedelta | float):
        if not isinstance(in_, timedelta):
            if isinstance(in_, bool) or not isinstance(in_, (int, float)) or not math.isfinite(in_):
                raise InvalidArgument(f"in_ must be a timedelta or a number of seconds, got {in_!r}")
            in_ = timedelta(seconds=in_)
        if not timedelta(0) <= in_ <= MAX_RETRY_IN:
            raise InvalidArgument(f"in_ must be between 0 and 365 days, got {in_!r}")
        super().__init__(f"snooze {in_}")
        self.in_ = in_


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


_EVENTS = threading.Lock()  # makes TaskContext events once, in step with _stop


_UNPARSED = object()


class TaskContext:
    """What a handler gets: the task, a progress reporter and stop signals.

    ``task`` is what the worker leased (``lease_tasks_lean``): rn, token, spec,
    priority, queue and attempt (1 for the first lease, 2 for the first retry...);
    ``TaskClient.get(rn)`` has the whole task."""

    # Per-task state with its defaults on the class: a worker makes a context per task and
    # most keep them (issue 10: the per-task Python). Instances override what changes.
    _progress: float | None = None
    _cancelled: Any = None  # events made on first use: most tasks never need them
    _stopping: Any = None
    _was_cancelled = False
    reason: str | None = None
    finishing = False  # the handler returned; its outcome is being recorded
    completed = False  # ctx.complete(): done, even if told to stop
    completed_outside = False  # ctx.complete(conn=...): completed in the application's transaction
    result: Any = None  # the handler's return value as jsonb (None: no result)
    _db: Any = None  # the worker's database, for parents()
    started = False  # a handler took it from the local queue
    failure: dict[str, Any] | None = None  # fail_task's error and retry_in, while the failure waits to be recorded
    lease_until = math.inf  # time.monotonic() before which the lease cannot have expired
    priority = 0
    queue = ""
    attempt = 1  # this lease's attempt: 1, then 2 after a failure or a timeout, ...
    _task: dict[str, Any] | None = None
    _spec: Any = _UNPARSED
    _json: str = "null"  # the spec's text as leased, parsed on first use of ``spec``

    def __init__(self, task: dict[str, Any]):
        self._task = task
        self.rn: str = task["rn"]
        self.token: str | None = task.get("token")  # the lease's secret: proves this lease on every write
        self._spec = task["spec"]
        self.priority = task.get("priority", 0)
        self.queue = task.get("queue", "")
        self.attempt = task.get("attempt", 1)

    @classmethod
    def _leased(cls, rn: str, token: str, spec: str, priority: int, queue: str, until: float,
                attempt: int) -> "TaskContext":
        """A context for a task the worker just leased: no task dict, the spec still its JSON
        text (parsed when the handler first reads ``spec``; many never do)."""
        ctx = cls.__new__(cls)
        ctx.rn, ctx.token, ctx._json, ctx.priority, ctx.queue, ctx.lease_until = rn, token, spec, priority, queue, until
        if attempt != 1:
            ctx.attempt = attempt
        return ctx

    @property
    def spec(self) -> Any:
        """The task's spec (JSON), parsed on first use."""
        spec = self._spec
        if spec is _UNPARSED:
            spec = self._spec = load_json(self._json)
        return spec

    @spec.setter
    def spec(self, value: Any) -> None:
        self._spec = value

    @property
    def task(self) -> dict[str, Any]:
        """The task as leased: rn, token, spec, priority, queue, attempt."""
        if self._task is None:
            self._task = {"rn": self.rn, "token": self.token, "spec": self.spec, "priority": self.priority,
                          "queue": self.queue, "attempt": self.attempt}
        return self._task

    def _event(self) -> Any:
        return threading.Event()

    @property
    def cancelled(self) -> threading.Event:
        """Set when a client cancelled the task."""
        return self._cancelled or self._made("_cancelled", lambda: self._was_cancelled)

    @property
    def stopping(self) -> threading.Event:
        """Set when the handler should stop: cancelled, lease lost, or the worker is stopping."""
        return self._stopping or self._made("_stopping", lambda: self.reason is not None)

    def _made(self, name: str, already: Callable[[], bool]) -> Any:
        """The event ``name``, made now (set if ``already()``), in step with _stop."""
        with _EVENTS:
            if getattr(self, name) is None:
                event = self._event()
                if already():
                    event.set()
                setattr(self, name, event)
            return getattr(self, name)

    def complete(self, conn: Any = None, *, result: Any = None) -> None:
        """Say the work is done: a return is recorded as completed even after ``stopping``
        was set (for reason "stopping"; a cancelled task stays cancelled, a lost lease is lost).

        ``conn``: complete the task now, inside the application's transaction on its psycopg
        connection or cursor (``complete_task`` with this lease's token, and ``result``), next
        to the application's writes: if the lease was lost, this raises (TaskNotOwned, PS201;
        TaskNotRunning, PS202; TaskCancelled, PS203) and the application's transaction must
        roll back, so its writes happen exactly once. The worker then records nothing for
        the task; if the application rolls back instead of committing, the task is not
        completed and runs again once its lease expires. The task's row stays locked until
        that transaction ends (the worker's heartbeats wait for it: keep it short). The
        connection's role needs pyscheduler_worker."""
        self.completed = True
        if conn is not None:
            Session.borrow(conn).call_binary("complete_task", rn=uuid.UUID(self.rn), token=uuid.UUID(str(self.token)),
                                             result=None if result is None else json_value("result", result))
            self.completed_outside = True

    def parents(self) -> list[dict[str, Any]]:
        """The task's parents (submitted ``after`` them), in order: ``[{"rn", "status",
        "result"}]`` (``parent_results``); [] for a task without parents."""
        if self._db is None:
            raise InvalidArgument("parents() needs a context made by a worker")
        raw = self._db.call_value("parent_results", rn=self.rn, token=self.token)
        return list(raw or [])

    def progress(self, value: float) -> None:
        """Report progress (0..1); sent with the next heartbeat."""
        if not 0.0 <= value <= 1.0:
            raise InvalidArgument(f"progress must be in 0..1, got {value!r}")
        self._progress = value

    def _stop(self, reason: str) -> None:
        with _EVENTS:  # an event made meanwhile sees the reason, or is set here
            if self.reason is None:
                self.reason = reason
            if reason == "cancelled":
                self._was_cancelled = True
            cancelled = self._cancelled if reason == "cancelled" else None
            stopping = self._stopping
        if cancelled is not None:
            cancelled.set()
        if stopping is not None:
            stopping.set()


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
    """The NOTIFY channel of a queue (sql/tasks/, _task_channel)."""
    return f"pyscheduler_tasks:{queue}"


class UuidArray:
    """A uuid[] parameter made from uuids in the database's text form (as the lease returns
    them), sent in binary: the array built in one go (~0.15 us a uuid, against ~2.5 us through
    uuid.UUID objects and ~7 us as a text array of strings). Other forms (no dashes, braces,
    UUID objects) take the slow, checked way."""

    __slots__ = ("data",)
    _OID = 2950  # uuid (pg_type)
    _HEADER = struct.Struct("!iiIii")  # ndim 1, no nulls, element type, length, lower bound 1

    def __init__(self, values: list[str]):
        try:
            joined, n = "".join(values), len(values)
        except TypeError:  # not all str
            joined, n = "", -1
        dashes = "-" * n
        if (len(joined) == 36 * n and set(map(len, values)) == {36} and joined.count("-") == 4 * n
                and joined[8::36] == joined[13::36] == joined[18::36] == joined[23::36] == dashes):
            # each value 36 characters with its 4 dashes where a uuid's are (fromhex checks the rest)
            text = ("00000010" + "00000010".join(values)).replace("-", "")
        else:
            text = "".join(f"00000010{uuid.UUID(str(v)).hex}" for v in values)
        self.data = self._HEADER.pack(1, 0, self._OID, len(values), 1) + bytes.fromhex(text) if values \
            else struct.pack("!iiI", 0, 0, self._OID)


class _UuidArrayDumper(Dumper):
    format = Format.BINARY
    oid = 2951  # uuid[] (pg_type)

    def dump(self, obj: UuidArray) -> bytes:
        return obj.data


psycopg.adapters.register_dumper(UuidArray, _UuidArrayDumper)


def _leases(contexts: list[TaskContext]) -> tuple[UuidArray, UuidArray]:
    """The (rns, tokens) arrays of a batch write, sent in binary (UuidArray)."""
    return UuidArray([c.rn for c in contexts]), UuidArray([c.token for c in contexts])  # type: ignore[misc]


class _Dedicated:
    """One pool connection held for a thread's stream of calls (the lease loop, the completer):
    no pool checkout per call. After database trouble it is given back (the pool drops it if it
    is broken) and the next call takes another. ``setup``/``teardown``: SQL run on taking it and
    before giving it back (session settings must not leak into the pool)."""

    def __init__(self, db: Database, setup: str | None = None, teardown: str | None = None):
        self.db, self.setup, self.teardown = db, setup, teardown
        self._stack: contextlib.ExitStack | None = None
        self._session: Session | None = None

    def call(self, function: str, /, **args: Any) -> list[dict[str, Any]]:
        return self._call("call", function, args)

    def call_binary(self, function: str, /, **args: Any) -> list[dict[str, Any]]:
        return self._call("call_binary", function, args)

    def call_tuples(self, function: str, /, **args: Any) -> list[tuple[Any, ...]]:
        return self._call("call_tuples", function, args)

    def _call(self, method: str, function: str, args: dict[str, Any]) -> list[Any]:
        """``Session.<method>(function, **args)`` on the held connection."""
        if self._session is None:
            stack = contextlib.ExitStack()
            session = stack.enter_context(self.db.session())
            self._stack, self._session = stack, session
            if self.setup:
                try:
                    with translating():
                        session.conn.execute(self.setup)
                except BaseException:
                    self.close()
                    raise
        try:
            return getattr(self._session, method)(function, **args)
        except Exception as exc:
            if is_retryable(exc):
                self.close()
            raise

    def close(self) -> None:
        session, stack = self._session, self._stack
        self._session = self._stack = None
        if session is None or stack is None:
            return
        with contextlib.suppress(Exception):
            if self.teardown and not session.conn.closed and not session.conn.broken:
                session.conn.execute(self.teardown)
        with contextlib.suppress(Exception):
            stack.close()


class Worker:
    """Leases and works tasks of one queue; a daemon (``name``, ``run(stop)``).

    ``capacity`` handler threads take tasks from a local queue that the lease
    thread fills ahead (``prefetch``: at most that many leased tasks wait
    locally; the queue holds about ``lookahead`` seconds of work at the rate the
    handlers start tasks, none while tasks take longer than that)."""

    context_class: type[TaskContext] = TaskContext

    def __init__(self, dsn: str, queue: str, handler: Handler, *, capacity: int = 1, timeout: float = 10.0,
                 heartbeat_interval: float | None = None, poll_interval: float = 1.0,
                 aging_rate: float = 0.0, aging_cap: int = 4_294_967_295, yield_on_stop: bool = True,
                 prefetch: int = 1000, lookahead: float = 0.1, db: Database | None = None, registry: Any = None):
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
        # a lease connection, a completion connection, heartbeats, aborts and yields; every call
        # is retried, so a connection used within the last 2 s is not checked on checkout
        self.db = db or Database(dsn, min_size=1, max_size=3 + min(capacity, 8), name="pyscheduler-worker",
                                 fresh=2.0)
        self.worker_id: str | None = None
        self.name = f"tasks-worker:{queue}"
        self.held: dict[str, TaskContext] = {}  # every lease held: queued, running, or being recorded
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)  # the local queue got tasks, or closed
        self._queue: list[tuple[int, int, int, TaskContext]] = []  # heap: (-priority, seq, n, ctx)
        self._pushed = itertools.count()
        self._closed = False  # the local queue hands out nothing more (stopping)
        self._busy = 0  # handlers running
        self._started = 0  # tasks handed to handlers, ever (the start rate sizes the prefetch)
        self._rate = 0.0  # tasks started per second, last measured
        self._rate_at, self._rate_count = time.monotonic(), 0
        self._low = 0  # low watermark of the local queue: lease again at or below it
        self._lease_wake = Wakeup()
        self._beat_wake = Wakeup()
        self.registered = threading.Event()
        self.listener: Listener | None = None
        self.polls = 0  # lease calls made (tests and benches wait for the first one)
        self.completed = 0  # completions recorded (durably) by this worker
        self.failed = 0  # failed attempts handed to fail_task(s) (retried, or aborted after their last attempt)
        self._unrecorded: list[TaskContext] = []  # completions for the completer's next batch
        self._unfailed: list[TaskContext] = []  # failures (ctx.failure) for the completer's next batch
        self._recordable = threading.Condition(self._lock)  # _unrecorded or _unfailed got an entry
        self._room = threading.Condition(self._lock)  # the completer took them (back-pressure)
        self._halt = threading.Event()  # stop was asked for, or a worker thread died
        self.fatal: str | None = None  # why the worker stopped itself (a thread died)
        self._threads: dict[str, tuple[threading.Thread, threading.Event]] = {}
        # registry (a prometheus_client CollectorRegistry): count leases, outcomes and latencies there
        self._counted: _Counted | None = None
        if registry is not None:
            metrics.register(registry, WORKER_SERIES)
            self._counted = _Counted(queue)

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
        """Register, then start the listener and the lease, heartbeat and completion threads.
        False when stopped before registering."""
        if self._own_db:
            self.db.open(wait=False)  # a database down at start: register_worker below waits it out
        outage = Outage(f"worker on queue {self.queue}", log)
        while self.worker_id is None and not stop.is_set():
            try:
                self.worker_id = self.db.call_value("register_worker")
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
            self.dsn, [task_channel(self.queue), f"pyscheduler_cancel:{self.worker_id}"],
            self._notified, on_reconnect=self._poke_all, logger=log).start()
        poke_on(stop, _Setter(self._halt))  # halt: stop, or a thread below died
        poke_on(self._halt, self._lease_wake)
        for name, target in (("heartbeat", self._heartbeats), ("complete", self._completer),
                             ("lease", self._lease_loop)):
            thread_stop = self._halt if name == "lease" else threading.Event()
            if name == "heartbeat":
                poke_on(thread_stop, self._beat_wake)  # heartbeats outlive the lease loop while handlers drain
            self._threads[name] = (self._supervised(target, thread_stop, name=f"{name}:{self.worker_id}"),
                                   thread_stop)
        self.registered.set()
        return True

    def _end(self) -> None:
        """After the handlers: record what is queued, stop the threads, close."""
        try:
            for name, wait in (("lease", 10), ("complete", 30), ("heartbeat", 5)):
                thread, thread_stop = self._threads[name]
                thread_stop.set()  # the completer records what is queued, then returns
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

    # -- leasing into the local queue

    def _lease_loop(self, stop: threading.Event) -> None:
        # This connection only leases: its commits need not wait for the WAL flush (a lease
        # lost in a crash is a lease that expired). Set here, for this connection only, and
        # undone before it goes back to the pool.
        conn = _Dedicated(self.db, setup="SET synchronous_commit = off", teardown="RESET synchronous_commit")
        outage = Outage(f"worker on queue {self.queue}", log)
        # A NOTIFY is throttled per queue (10 ms): the one that woke us may stand for later
        # submits, committed up to some ms after it; so after a wake-up, leases must start
        # after each time in rechecks (monotonic) before the loop sleeps long. Pokes (a handler
        # took a task) may wake it sooner; they do not count as those leases.
        rechecks: list[float] = []
        try:
            while not stop.is_set():
                n = self._wanted()
                got = 0
                if n > 0:
                    sent = time.monotonic()
                    try:
                        # rows (rn, token, spec, priority, seq, attempt); rn, token and spec as text
                        rows = conn.call_tuples("lease_tasks_lean", as_text=("uuid", "jsonb"), queue=self.queue,
                                               worker=self.worker_id, n=n, timeout=self.timeout, **self.aging)
                        outage.ok()
                    except RETRYABLE as exc:
                        stop.wait(outage.failed(exc))
                        continue
                    self.polls += 1
                    got = len(rows)
                    if 0 < got < n:  # a submit announced these: look again after its throttled followers
                        rechecks = _rechecks(sent)
                    else:
                        while rechecks and sent >= rechecks[0]:
                            del rechecks[0]
                    if self._counted is not None:
                        self._counted.lease.observe(time.monotonic() - sent)
                        if got:
                            self._counted.leased.inc(got)
                    if rows:
                        self._enqueue(rows, sent + self.timeout.total_seconds())
                    if got == n:
                        continue  # maybe more ready: lease again while the local queue wants more
                if rechecks and n > 0:  # (a full local queue waits for a poke: its next lease is owed)
                    self._lease_wake.wait(rechecks[0] - time.monotonic(), jitter=0)
                    continue
                if n > 0:  # nothing more ready: sleep until the next delayed task or retry is due
                    try:
                        due = self._next_due(conn)
                        outage.ok()
                    except RETRYABLE as exc:
                        stop.wait(outage.failed(exc))
                        continue
                    if due is not None and due < self.poll_interval:
                        if self._lease_wake.wait(due, jitter=0) and got < n:
                            rechecks = _rechecks(time.monotonic())
                        continue
                if self._lease_wake.wait(self.poll_interval) and n > 0 and got < n:
                    rechecks = _rechecks(time.monotonic())
        finally:
            conn.close()

    def _next_due(self, conn: "_Dedicated") -> float | None:
        """Seconds until the queue's next scheduled task (a delayed task, a retry) is due, by the
        database clock (next_task_due), a little after it; None when none is, or the queue is
        paused. A due one the last lease could not promote (another worker was): 10 ms."""
        due = conn.call_tuples("next_task_due", queue=self.queue)[0][0]
        if due is None:
            return None
        return max(0.01, due.total_seconds() + 0.001)

    def _wanted(self) -> int:
        """How many tasks to lease now: free handlers plus the local queue's target, when the
        queue is at or below its low watermark. The target is what the handlers start in
        ``lookahead`` seconds at their measured rate, up to ``prefetch``; 0 while that is less
        than ``capacity`` (slow tasks: nothing waits locally while another worker may idle)."""
        now = time.monotonic()
        with self._lock:
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
            queued = len(self._queue)
            if queued > self._low or self._closed:
                return 0
            return max(0, self.capacity - self._busy + target - queued)

    def _enqueue(self, rows: list[tuple[Any, ...]], until: float) -> None:
        """Put leased tasks, rows (rn, token, spec, priority, seq, attempt) with rn, token and spec as
        text, into the local queue."""
        cls, queue = self.context_class, self.queue
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
        with self._lock:
            held, pushed, closed = self.held, self._pushed, self._closed
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
                    heapq.heappush(self._queue, (priority, seq, next(pushed), ctx))
            if not closed:
                self._ready.notify(len(entries))
        if late:  # leased while the worker was stopping: hand back at once
            self._yield_back(late, "queued")
        else:
            self._queued()

    def _queued(self) -> None:
        """Hook: tasks were added to the local queue (the asyncio flavour wakes its loop)."""

    def _take(self, finished: TaskContext | None, block: bool, complete: bool = False) -> Any:
        """The next task to start (highest priority, then oldest), marking the handler busy;
        None when the local queue is closed (or empty and not ``block``). ``finished``: the task
        the calling handler just finished (its slot is free). Tasks whose lease is gone (cancelled,
        lost while queued) or could have expired are dropped, never started.

        ``complete``: ``finished`` returned normally; queue its completion for the completer in
        the same step (the common path: one lock round per task). Answers _SLOW (nothing done)
        when its lease is no longer plainly ours (see _settle), and, when not ``block``, _FULL
        while the completer is MAX_UNRECORDED behind (back-pressure; ``block`` waits instead)."""
        with self._lock:  # the lock of _ready (the Condition's own __enter__ is a Python call)
            if complete:
                assert finished is not None
                if finished.reason is not None or self.held.get(finished.rn) is not finished:
                    return _SLOW
                if not self._room_for_one(block):
                    return _FULL
                finished.finishing = True
                self._unrecorded.append(finished)
                if len(self._unrecorded) == 1:
                    self._recordable.notify()
            if finished is not None:
                self._busy -= 1
                if len(self._queue) <= self._low:
                    self._lease_wake.poke()  # a free handler: the lease loop may want more (before we wait)
            try:
                while not self._closed:
                    if not self._queue:
                        if not block:
                            return None
                        self._ready.wait()
                        continue
                    ctx = heapq.heappop(self._queue)[3]
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
                if len(self._queue) <= self._low:
                    self._lease_wake.poke()

    def _room_for_one(self, block: bool) -> bool:
        """(Under the lock.) Whether one more completion may wait for the completer; ``block``:
        wait until it may (back-pressure)."""
        while len(self._unrecorded) >= MAX_UNRECORDED:
            if not block:
                return False
            self._room.wait()
        return True

    def _drop(self, ctx: TaskContext, why: str) -> None:
        """(Under the lock.) Forget a queued task that must not start."""
        if self.held.get(ctx.rn) is ctx:
            del self.held[ctx.rn]
        log.info("task %s: %s", ctx.rn, why)

    # -- running handlers

    def _returned(self, ctx: TaskContext, value: Any) -> tuple[str | None, dict[str, Any]]:
        """What to record for a handler that returned ``value``: a completion with ``value`` as
        its result (checked as JSON, as specs are: a value that is not JSON fails the attempt),
        or None when ``ctx.complete(conn=...)`` completed it in the application's transaction."""
        if ctx.completed_outside:
            return None, {}
        if value is not None:
            try:
                ctx.result = json_value("the handler's result", value)
            except InvalidArgument as exc:
                return self._failed(ctx, exc)
        return "complete_task", {}

    def _handler_thread(self) -> None:
        ctx = self._take(None, block=True)
        counted, clock = self._counted, time.perf_counter
        while ctx is not None:
            began = clock() if counted is not None else 0.0
            try:
                function, args = self._returned(ctx, self.handler(ctx))
            except BaseException as exc:  # noqa: BLE001 - any exception a handler raises is its failure
                function, args = self._failed(ctx, exc)
            if counted is not None:
                counted.took.append(clock() - began)
            if function is None:  # completed in the application's transaction: nothing to record
                self._release(ctx)
                ctx = self._take(ctx, block=True)
                continue
            if function == "complete_task":
                following = self._take(ctx, block=True, complete=True)
                if following is not _SLOW:
                    ctx = following
                    continue
            self._outcome(ctx, function, args)
            ctx = self._take(ctx, block=True)

    def _outcome(self, ctx: TaskContext, function: str, args: dict[str, Any]) -> None:
        """Record a handler's outcome the careful way (aborts, failures, stops, lost leases)."""
        queued = False
        try:
            settled = self._settle(ctx, function)
            if settled in ("complete_task", "fail_task"):
                with self._lock:
                    queued = self._batch(ctx, settled, args, block=True)
            elif settled is not None:
                self._record(ctx, settled, args)
        except Exception:  # never silently, and never kill the handler thread
            log.exception("task %s: recording the outcome failed", ctx.rn)
        finally:
            if not queued:
                self._release(ctx)

    def _batch(self, ctx: TaskContext, function: str, args: dict[str, Any], block: bool) -> bool:
        """(Under the lock.) Queue a completion or a failure for the completer's next batch;
        False, queuing nothing, when the completer is MAX_UNRECORDED behind and not ``block``
        (``block`` waits instead)."""
        if function == "complete_task":
            if not self._room_for_one(block):
                return False
            self._unrecorded.append(ctx)
        else:
            while len(self._unfailed) >= MAX_UNRECORDED:
                if not block:
                    return False
                self._room.wait()
            ctx.failure = args
            self._unfailed.append(ctx)
        self._recordable.notify()
        return True

    def _failed(self, ctx: TaskContext, exc: BaseException) -> tuple[str, dict[str, Any]]:
        """The SQL call that records a handler's exception: ``Abort``: an abort with errors (never
        retried); ``Retry``: a failure retried after its delay; anything else (a BaseException
        too: it must not end the worker) a failure retried after the default backoff."""
        if isinstance(exc, Abort):
            if self._counted is not None:
                self._counted.aborted.inc()
            error = exc.error
            return "abort_task", {"errors": [error_entry(error.get("code"), error.get("description"),
                                                         error.get("args"))]}
        if isinstance(exc, Snooze):
            log.info("task %s: the handler snoozed it for %s", ctx.rn, exc.in_)
            return "yield_task", {"run_in": exc.in_}
        if isinstance(exc, Retry):
            log.info("task %s: the handler asked for a retry in %s", ctx.rn, exc.in_ or "the default backoff")
            if self._counted is not None:
                self._counted.retried.inc()
            error = exc.error
            return "fail_task", {"error": error_entry(error.get("code"), error.get("description"), error.get("args")),
                                 "retry_in": exc.in_}
        if ctx.reason != "yielded":  # the handler failed: retried after the backoff, or aborted after its last attempt
            log.warning("task %s failed; it is retried after a backoff unless that was its last attempt", ctx.rn,
                        exc_info=exc)
        return "fail_task", {"error": error_entry(type(exc).__name__, exc), "retry_in": None}

    def _settle(self, ctx: TaskContext, function: str) -> str | None:
        """What to record for a handler's outcome: ``function``, "yield_task", or None (nothing:
        yielded on shutdown, lease lost, cancelled). From here heartbeats leave the task alone."""
        with self._lock:
            ctx.finishing = True
            reason = ctx.reason
            superseded = self.held.get(ctx.rn) is not ctx
        if reason == "yielded":
            return None  # handed back on shutdown: another worker's now
        if reason == "lost" or superseded:
            log.info("task %s: lease lost; the outcome of this execution is discarded", ctx.rn)
            return None
        if function == "complete_task" and reason is not None and not ctx.completed:
            # Told to stop and returned without saying it finished: not completed.
            if reason == "cancelled":
                log.info("task %s was cancelled; it stays cancelled", ctx.rn)
                return None
            log.info("task %s: handler returned after being told to stop (%s); yielding it unfinished",
                     ctx.rn, reason)
            return "yield_task"
        return function

    def _record(self, ctx: TaskContext, function: str, args: dict[str, Any]) -> None:
        if function in ("abort_task", "fail_task"):
            self._record_error(ctx, function, args)
        else:
            self._finish(ctx, function, **args)

    def _release(self, ctx: TaskContext) -> None:
        with self._lock:
            if self.held.get(ctx.rn) is ctx:  # not a newer lease of the same task
                del self.held[ctx.rn]

    def _retry(self, what: str, call: Callable[[], Any]) -> tuple[bool, Any]:
        """(True, call()) once it succeeds. An outage (errors.is_retryable) is retried with
        backoff until the worker stops, then for at most one lease length (the lease is gone
        after that anyway): (False, None), logged. Anything else propagates: a deliberate
        answer, data the database refuses, a missing privilege, a bug."""
        outage = Outage(what, log)
        give_up_at: float | None = None
        while True:
            try:
                result = call()
                outage.ok()
                return True, result
            except Exception as exc:
                if not is_retryable(exc):
                    raise  # an answer, data the database refuses or a bug: the same call cannot succeed
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

    def _record_error(self, ctx: TaskContext, function: str, args: dict[str, Any]) -> None:
        """Record an abort (``errors``) or a failure (``error``, ``retry_in``) on its own. Errors the
        database refuses as data (too many, too large, a value it cannot store) are replaced by
        one short sanitised error (a failure then takes the default backoff); if even that is
        refused, the task is yielded, so it never stays running with its slot taken."""
        if function == "abort_task":
            errors = args["errors"]
            refused = self._finish(ctx, function, errors=Jsonb(errors))
        else:
            errors = [args["error"]]
            refused = self._finish(ctx, function, error=Jsonb(errors[0]), retry_in=args.get("retry_in"))
        if refused is not None:
            log.error("task %s: the database refused the %s's error (%s); recording a short error instead",
                      ctx.rn, "abort" if function == "abort_task" else "failure", refused)
            first = errors[0] if errors else {}
            short = error_entry(str(first.get("code", "error"))[:100], str(first.get("description", ""))[:100],
                                {"refused": str(refused)[:100]})
            if function == "abort_task":
                refused = self._finish(ctx, function, errors=Jsonb([short]))
            else:
                refused = self._finish(ctx, function, error=Jsonb(short))
            if refused is not None:
                log.error("task %s: the short error was refused too; yielding the task", ctx.rn)
                self._finish(ctx, "yield_task")
                return
        if function == "fail_task":
            with self._lock:
                self.failed += 1
            if self._counted is not None:
                self._counted.failed.inc()

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

    # -- completions, batched on their own connection: one complete_tasks call for all that
    # finished meanwhile; a task counts as done (leaves ``held``) once that call committed.

    def _completer(self, stop: threading.Event) -> None:
        conn = _Dedicated(self.db)
        try:
            while True:
                with self._recordable:
                    if not self._unrecorded and not self._unfailed:
                        if stop.is_set():
                            return
                        self._recordable.wait(0.1)
                        continue
                    batch, self._unrecorded = self._unrecorded, []
                    failures, self._unfailed = self._unfailed, []
                    self._room.notify_all()
                try:
                    if batch:
                        self._complete(batch, conn)
                    if failures:
                        self._fail(failures, conn)
                    if self._counted is not None:
                        self._counted.drain()
                except Exception:  # never let the completer die: it frees the leases
                    log.exception("recording %d completions and %d failures failed", len(batch), len(failures))
                    for ctx in batch + failures:
                        self._release(ctx)
        finally:
            conn.close()

    def _complete(self, batch: list[TaskContext], conn: _Dedicated) -> None:
        """Record completions with one complete_tasks call (durably), with the handlers' results;
        then they count as done. A result the database refuses (larger than
        task_max_result_bytes) is recorded alone: that task is aborted with the error, the
        others complete."""

        def call(live: list[TaskContext], rns: UuidArray, tokens: UuidArray) -> list[dict[str, Any]]:
            results = [c.result for c in live]
            if all(r is None for r in results):
                return conn.call_binary("complete_tasks", rns=rns, tokens=tokens)
            return conn.call_binary("complete_tasks", rns=rns, tokens=tokens,
                                    results=Jsonb([None if r is None else r.obj for r in results]))

        try:
            live, refused = self._write_batch(batch, "completions", call)
        except SchedulerError as exc:
            if rejects_arguments(exc) and any(c.result is not None for c in batch):
                log.error("recording %d completions together was refused (%s); recording them one by one",
                          len(batch), exc)
                self._complete_alone(batch)
                return
            log.error("could not record %d completions (%s); the monitor will reset them", len(batch), exc)
            for ctx in batch:
                self._release(ctx)
            return
        recorded = self._written(batch, live, refused, "finished")
        with self._lock:
            self.completed += recorded
        if self._counted is not None and recorded:
            self._counted.completed.inc(recorded)

    def _complete_alone(self, batch: list[TaskContext]) -> None:
        """Each completion of ``batch`` on its own; a result refused aborts its task."""
        for ctx in batch:
            if self.held.get(ctx.rn) is ctx:
                refused = self._finish(ctx, "complete_task", result=ctx.result)
                if refused is not None:
                    log.error("task %s: the database refused its result (%s); aborting it", ctx.rn, refused)
                    self._finish(ctx, "abort_task", errors=Jsonb([error_entry("ResultRefused", refused)]))
                else:
                    with self._lock:
                        self.completed += 1
            self._release(ctx)

    def _fail(self, batch: list[TaskContext], conn: _Dedicated) -> None:
        """Record failed attempts with one fail_tasks call, as _complete records completions. If
        the database refuses the call's data (one error it cannot store), each is recorded on its
        own (_record_error), so one poison error never holds back the others."""

        def call(live: list[TaskContext], rns: UuidArray, tokens: UuidArray) -> list[dict[str, Any]]:
            delays = [c.failure["retry_in"] for c in live]  # type: ignore[index]
            return conn.call_binary("fail_tasks", rns=rns, tokens=tokens,
                                    errors=Jsonb([c.failure["error"] for c in live]),  # type: ignore[index]
                                    retry_in=delays if any(d is not None for d in delays) else None)

        try:
            live, refused = self._write_batch(batch, "failures", call)
        except Exception as exc:  # noqa: BLE001 - refused as data, or not adaptable at all
            poison = rejects_arguments(exc) or not isinstance(exc, (SchedulerError, psycopg.Error))
            if not poison:
                log.error("could not record %d failures (%s); the monitor will reset them", len(batch), exc)
                for ctx in batch:
                    self._release(ctx)
                return
            log.error("recording %d failures together was refused (%s); recording them one by one", len(batch), exc)
            for ctx in batch:
                if self.held.get(ctx.rn) is ctx:
                    self._record_error(ctx, "fail_task", ctx.failure or {})
                self._release(ctx)
            return
        recorded = self._written(batch, live, refused, "failed")
        with self._lock:
            self.failed += recorded
        if self._counted is not None and recorded:
            self._counted.failed.inc(recorded)

    def _write_batch(self, batch: list[TaskContext], what: str,
                     write: Callable[[list[TaskContext], UuidArray, UuidArray], list[dict[str, Any]]]
                     ) -> tuple[list[TaskContext], list[dict[str, Any]]]:
        """``write(live, rns, tokens)`` for the leases of ``batch`` still ours, retried through
        database trouble (_retry): (those leases, the rows it refused). Not the outcome of a
        lease lost meanwhile (the task leased again)."""
        live = batch

        def call() -> list[dict[str, Any]]:
            nonlocal live
            with self._lock:
                live = [c for c in batch if self.held.get(c.rn) is c]
            if not live:
                return []
            rns, tokens = _leases(live)
            return write(live, rns, tokens)

        _, refused = self._retry(f"{what} of {self.worker_id}", call)
        return live, refused or []

    def _written(self, batch: list[TaskContext], live: list[TaskContext], refused: list[dict[str, Any]],
                 done: str) -> int:
        """After a batch write: say why a task's outcome was not recorded (its lease was lost, or
        it was cancelled), and release every lease of the batch. How many were recorded."""
        if len(live) != len(batch):
            kept = {id(c) for c in live}
            for ctx in batch:
                if id(ctx) not in kept:
                    log.info("task %s: lease lost; the outcome of this execution is discarded", ctx.rn)
        if refused:
            why = {str(r["rn"]): r["sqlstate"] for r in refused}
            for ctx in batch:
                code = why.get(ctx.rn)
                if code == "PS203":
                    log.info("task %s was cancelled before it %s; it stays cancelled", ctx.rn, done)
                elif code:
                    log.warning("task %s: lease lost before it %s (SQLSTATE %s)", ctx.rn, done, code)
        with self._lock:
            held = self.held
            for ctx in batch:
                if held.get(ctx.rn) is ctx:
                    del held[ctx.rn]
        return len(live) - len(refused)

    # -- heartbeats: one heartbeat_tasks call for every lease held, queued ones included

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
            # Leases still ours: queued, running, draining on a stop without yield, or an
            # outcome still being recorded (retries must not outlive the lease).
            held = [c for c in self.held.values() if c.reason not in ("cancelled", "lost", "yielded")]
        if not held:
            return
        sent = time.monotonic()
        progress = [None if c._progress is None else float(c._progress) for c in held]  # float8[] in binary
        try:
            rns, tokens = _leases(held)
            refused = self.db.call_binary("heartbeat_tasks", rns=rns, tokens=tokens,
                                          progress=progress if any(p is not None for p in progress) else None,
                                          timeout=self.timeout)
            outage.ok()
        except Exception as exc:
            if is_retryable(exc):
                stop.wait(outage.failed(exc))
                return
            # a deliberate error about one of them (a progress the database refuses):
            # beat one by one, so the others keep their leases
            log.error("heartbeats of %d tasks refused (%s); sending them one by one", len(held), exc)
            self._beat_each(held, stop, outage)
            return
        until = sent + self.timeout.total_seconds()
        gone = {str(r["rn"]): r["sqlstate"] for r in refused}
        for ctx in held:
            code = gone.get(ctx.rn)
            if code is None:
                ctx.lease_until = until
            else:
                self._lease_gone(ctx, TaskCancelled if code == "PS203" else None, code)

    def _beat_each(self, held: list[TaskContext], stop: threading.Event, outage: Outage) -> None:
        for ctx in held:
            sent = time.monotonic()
            try:
                self.db.call("heartbeat_task", rn=ctx.rn, token=ctx.token, progress=ctx._progress,
                             timeout=self.timeout)
                ctx.lease_until = sent + self.timeout.total_seconds()
                outage.ok()
            except LEASE_GONE as exc:  # any answer meaning "this lease is gone" stops the handler
                self._lease_gone(ctx, type(exc), str(exc))
            except Exception as exc:
                if not is_retryable(exc):  # a deliberate error about this task: the others go on
                    log.error("heartbeat of task %s failed: %s", ctx.rn, exc)
                    continue
                stop.wait(outage.failed(exc))
                break

    def _lease_gone(self, ctx: TaskContext, kind: type | None, why: str) -> None:
        """A heartbeat's answer: this lease is gone. Tell the handler; a queued task is dropped."""
        with self._lock:
            if ctx.finishing:
                return  # finished meanwhile: the outcome's recording reports it
            cancelled = kind is not None and issubclass(kind, TaskCancelled)
            if cancelled:
                log.info("task %s was cancelled: telling its handler", ctx.rn)
            else:
                log.warning("task %s: lease lost (%s): telling its handler", ctx.rn, why)
            ctx._stop("cancelled" if cancelled else "lost")
            if not ctx.started and self.held.get(ctx.rn) is ctx:
                del self.held[ctx.rn]  # never started: nothing more to do for it

    # -- shutdown: the seed's K8s rebalancing hook

    def _give_back(self) -> None:
        """Close the local queue; hand back in one call the queued tasks (never started) and,
        with ``yield_on_stop``, the running ones; tell every handler to stop."""
        with self._lock:
            self._closed = True
            self._ready.notify_all()
            queued = [e[3] for e in self._queue if self.held.get(e[3].rn) is e[3] and e[3].reason is None]
            self._queue.clear()
            running = [c for c in self.held.values()
                       if c.started and self.yield_on_stop and not c.finishing and c.reason is None]
            for ctx in queued + running:
                ctx._stop("yielded")
        self._queued()  # wake handlers waiting on the local queue (asyncio)
        if queued:
            self._yield_back(queued, "queued")
        if running:
            self._yield_back(running, "running")
        with self._lock:
            for ctx in list(self.held.values()):
                ctx._stop("stopping")

    def _yield_back(self, contexts: list[TaskContext], what: str) -> None:
        try:
            rns, tokens = _leases(contexts)
            refused = self.db.call_binary("yield_tasks", rns=rns, tokens=tokens)
            gone = {str(r["rn"]): r["sqlstate"] for r in refused}
            for ctx in contexts:
                if ctx.rn in gone:
                    log.warning("could not yield %s task %s (SQLSTATE %s)", what, ctx.rn, gone[ctx.rn])
                elif what == "running":
                    log.info("yielded task %s", ctx.rn)
            if what == "queued":
                log.info("handed back %d queued tasks", len(contexts) - len(gone))
        except (SchedulerError, psycopg.Error) as exc:
            log.warning("could not yield %d %s tasks: %s", len(contexts), what, exc)
        if what == "queued":
            with self._lock:
                for ctx in contexts:
                    if self.held.get(ctx.rn) is ctx:
                        del self.held[ctx.rn]

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
