"""What a handler gets: ``TaskContext``, the task it works (rn, token, spec, priority, queue,
attempt), its progress reporter and its stop signals (``cancelled``, ``stopping``)."""

from __future__ import annotations

import math
import threading
import uuid
from collections.abc import Callable
from typing import Any

from ...calls import json_value
from ...db import Session, UuidArray, load_json
from ...errors import InvalidArgument
from .. import sqlapi as sql

_EVENTS = threading.Lock()  # makes TaskContext events once, in step with _stop
_UNPARSED = object()


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
