"""What a handler gets: ``TaskContext``, the task it works (rn, token, spec, priority, queue,
attempt), its progress reporter, its stop signals (``cancelled``, ``stopping``) and its durable
steps, sleeps and waits for events (``step``, ``sleep``, ``await_event``; ``Suspended``)."""

from __future__ import annotations

import asyncio
import inspect
import math
import threading
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import psycopg

from ...calls import json_value
from ...db import AsyncSession, Session, UuidArray, load_json
from ...errors import InvalidArgument
from .. import sqlapi as sql

_EVENTS = threading.Lock()  # makes TaskContext events once, in step with _stop
_UNPARSED = object()


class Suspended(BaseException):
    """Raised by ``ctx.sleep`` and ``ctx.await_event`` once the task's lease has ended in the
    database (``sleep_task``, ``await_event``): the task runs again when it wakes, and the worker
    records nothing for this run. A BaseException, as GeneratorExit: a handler's ``except
    Exception`` does not swallow it."""


class TaskContext:
    """What a handler gets: the task, a progress reporter and stop signals.

    ``task`` is what the worker leased (``lease_tasks_lean``): rn, token, spec,
    priority, queue and attempt (1 for the first lease, 2 for the first retry...);
    ``TaskClient.get(rn)`` has the whole task."""

    # Per-task state with its defaults on the class: a worker makes a context per task and
    # most keep them (the per-task Python is the Worker's cost). Instances override what changes.
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
    _steps: dict[str, Any] | None = None  # step_results, read by this run's first ``step``
    _sleeps = 0  # this run's unnamed sleeps so far: the next one's name

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
            Session.borrow(conn).call_binary(sql.COMPLETE_TASK, rn=uuid.UUID(self.rn),
                                             token=uuid.UUID(str(self.token)),
                                             result=None if result is None else json_value("result", result))
            self.completed_outside = True

    def parents(self) -> list[dict[str, Any]]:
        """The task's parents (submitted ``after`` them), in order: ``[{"rn", "status",
        "result"}]`` (``parent_results``); [] for a task without parents."""
        if self._db is None:
            raise InvalidArgument("parents() needs a context made by a worker")
        raw = self._db.call_value(sql.PARENT_RESULTS, rn=self.rn, token=self.token)
        return list(raw or [])

    # -- durable steps, sleeps and events (docs/python-api.md, "Durable task functions")

    def _worker_db(self) -> Any:
        if self._db is None:
            raise InvalidArgument("durable sleeps and events need a context made by a worker")
        return self._db

    def _recorded(self) -> dict[str, Any]:
        """The results of the steps the task recorded (by any run), read once per run."""
        if self._steps is None:
            self._steps = dict(self._worker_db().call_value(sql.STEP_RESULTS, rn=self.rn, token=self.token) or {})
        return self._steps

    def _record(self, name: str, result: Any, conn: Any) -> None:
        value = json_value(f"step {name!r}'s result", result)
        if conn is not None:  # in the application's transaction: not known done until it commits
            Session.borrow(conn).call_binary(sql.RECORD_STEP, rn=uuid.UUID(self.rn), token=uuid.UUID(str(self.token)),
                                             step=name, result=value)
            return
        self._worker_db().call_value(sql.RECORD_STEP, rn=self.rn, token=self.token, step=name, result=value)
        self._recorded()[name] = result

    def step(self, name: str, fn: Callable[..., Any], *args: Any, conn: Any = None, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` as the durable step ``name`` and checkpoint its result (JSON)
        once per task: a re-run of the task (a retry, another worker after a crash, the wake-up
        after a sleep) answers the stored result without calling ``fn``. ``conn``: record the
        checkpoint inside the application's transaction on its psycopg connection or cursor, so
        the step's writes and its checkpoint commit together (a rollback records nothing: the
        step runs again). Code outside steps runs again on every re-run. Without a worker
        (``testing("inline")``), ``fn`` is simply called, with or without ``conn``."""
        if self._db is None:  # no worker, no lease (testing("inline")): nothing to record
            return fn(*args, **kwargs)
        done = self._recorded()
        if name in done:
            return done[name]
        result = fn(*args, **kwargs)
        self._record(name, result, conn)
        return result

    def sleep(self, duration: timedelta | datetime, *, name: str | None = None) -> None:
        """Sleep for ``duration`` (a timedelta, 0..365 days) or until an aware datetime, without
        holding the worker: the lease ends, the task is scheduled until then and runs again from
        the start (its steps answered from their checkpoints). The sleep is recorded under
        ``name`` (default: its number in this run), so the re-run passes it without sleeping
        again. Returns at once when that time has passed; else raises ``Suspended``."""
        self._sleeps += 1
        when = {"until": duration} if isinstance(duration, datetime) else {"duration": duration}
        answer = self._worker_db().call_value(sql.SLEEP_TASK, rn=self.rn, token=self.token,
                                              step=name or f"sleep-{self._sleeps}", **when)
        if answer["asleep"]:
            self._suspend(f"sleeping until {answer['until']}")

    def await_event(self, name: str, timeout: timedelta | None = None) -> Any:
        """The payload of the event ``name`` (``app.emit_event``): one emitted already (before
        the wait, by a role that may act on the task's) is answered at once; else the lease
        ends (``Suspended``) and the task runs again when the event comes, or after ``timeout``
        (default and at most 365 days) when this answers None. Answered once per task: a
        re-run gets the same payload."""
        answer = self._worker_db().call_value(sql.AWAIT_EVENT, rn=self.rn, token=self.token, name=name,
                                              **({} if timeout is None else {"timeout": timeout}))
        if answer["status"] == "suspended":
            self._suspend(f"waiting for event {name!r} until {answer['until']}")
        return answer.get("payload")

    def _suspend(self, why: str) -> None:
        self._stop("suspended")  # the lease is over: heartbeats leave it alone
        raise Suspended(f"{why}; the lease ended")

    async def step_async(self, name: str, fn: Callable[..., Any], *args: Any, conn: Any = None,
                         **kwargs: Any) -> Any:
        """``step`` in an ``async def`` task: ``fn`` may be a coroutine function; ``conn`` the
        application's psycopg ``AsyncConnection`` (or a sync one)."""
        if self._db is None:  # no worker, no lease (testing("inline")): nothing to record
            result = fn(*args, **kwargs)
            return await result if inspect.isawaitable(result) else result
        done = await asyncio.to_thread(self._recorded)
        if name in done:
            return done[name]
        result = fn(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        if isinstance(conn, (psycopg.AsyncConnection, psycopg.AsyncCursor)):
            await AsyncSession.borrow(conn).call_binary(
                sql.RECORD_STEP, rn=uuid.UUID(self.rn), token=uuid.UUID(str(self.token)), step=name,
                result=json_value(f"step {name!r}'s result", result))
        else:
            await asyncio.to_thread(self._record, name, result, conn)
        return result

    async def sleep_async(self, duration: timedelta | datetime, *, name: str | None = None) -> None:
        """``sleep`` in an ``async def`` task."""
        await asyncio.to_thread(self.sleep, duration, name=name)

    async def await_event_async(self, name: str, timeout: timedelta | None = None) -> Any:
        """``await_event`` in an ``async def`` task."""
        return await asyncio.to_thread(self.await_event, name, timeout)

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


def leases(contexts: list[TaskContext]) -> tuple[UuidArray, UuidArray]:
    """The (rns, tokens) arrays of a batch write, sent in binary (UuidArray)."""
    return UuidArray([c.rn for c in contexts]), UuidArray([c.token for c in contexts])  # type: ignore[misc]
