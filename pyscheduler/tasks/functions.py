"""Task functions: a Python function declared with ``@app.task`` (``TaskApp``, app.py), submitted
by name as the spec ``{"task": "<name>", "args": {...}}`` (docs/python-api.md, "Task functions").

``TaskFunction`` checks the arguments against the function's signature before anything is
written, builds the spec and submits it through ``TaskClient``; ``options(...)`` gives a copy
with per-call options; ``current_context()`` is the running task's ``TaskContext``."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import json
import uuid
from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Generic, Literal, ParamSpec, TypeVar

from ..calls import Connectable, json_problem
from ..db import load_json
from ..errors import InvalidArgument
from . import tracing
from .client import Task, TaskClient, TaskHandle, _handle
from .worker import Abort, TaskContext

if TYPE_CHECKING:
    from .app import TaskApp

__all__ = ["KeyOption", "TaskFunction", "current_context"]

P = ParamSpec("P")
R = TypeVar("R")

# a unique or concurrency key: a text, or a function of the task's arguments answering one (None: no key)
KeyOption = str | Callable[..., str | None] | None
SUBMIT_KEYWORDS = frozenset({"conn"})  # what submit() takes besides the function's own arguments

_current: ContextVar[TaskContext] = ContextVar("pyscheduler_task_context")


def current_context() -> TaskContext:
    """The ``TaskContext`` of the task function running in this thread or coroutine: ``rn``,
    ``attempt``, ``progress(x)``, ``stopping``, ``cancelled``, ``complete(conn=...)``."""
    try:
        return _current.get()
    except LookupError:
        raise RuntimeError("current_context() is only available inside a running task function") from None


@dataclass(frozen=True, slots=True)
class Options:
    """How a task function's tasks are submitted (the arguments of ``submit_task``)."""

    queue: str
    priority: int = 50
    max_attempts: int | None = None
    unique_key: KeyOption = None
    concurrency_key: KeyOption = None
    run_at: datetime | timedelta | None = None
    after: tuple[str | uuid.UUID, ...] | None = None
    on_parent_failure: Literal["cancel", "run"] = "cancel"
    conn: Connectable | None = None


class TaskFunction(Generic[P, R]):
    """A function declared with ``@app.task``: call it to run it here, ``submit(...)`` (its own
    arguments, by name or position) to run it on a worker (a :class:`TaskHandle`),
    ``submit_many([{...}, ...])``, ``options(...)`` for per-call options. ``name`` is its stable
    name in the spec, ``queue`` its queue."""

    def __init__(self, app: TaskApp, fn: Callable[P, R], name: str, options: Options):
        self.app, self.fn, self.name, self._options = app, fn, name, options
        self.signature = inspect.signature(fn)
        for p in self.signature.parameters.values():
            if p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL):
                raise InvalidArgument(f"task {name}: parameter {p.name!r} cannot be passed by name; a task's "
                                      f"arguments are stored as a JSON object of names")
            if p.name in SUBMIT_KEYWORDS:
                raise InvalidArgument(f"task {name}: parameter {p.name!r} is taken by submit(conn=...); rename it")
        self.is_async = inspect.iscoroutinefunction(fn)
        functools.update_wrapper(self, fn)

    @property
    def queue(self) -> str:
        return self._options.queue

    @property
    def priority(self) -> int:
        return self._options.priority

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the function here, as a plain call."""
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<task function {self.name} on queue {self.queue!r}>"

    # -- arguments and specs

    def arguments(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The arguments given, by name, as stored (defaults are left to the function), else
        InvalidArgument naming the missing, unknown or not JSON-storable one."""
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise InvalidArgument(f"task {self.name}: {exc}") from None
        given: dict[str, Any] = {}
        for key, value in bound.arguments.items():
            if self.signature.parameters[key].kind is inspect.Parameter.VAR_KEYWORD:
                given.update(value)
            else:
                given[key] = value
        why = json_problem(given, "args")
        if why:
            raise InvalidArgument(f"task {self.name}: {why} (a task's arguments are stored as JSON)")
        return given

    def spec(self, *args: P.args, **kwargs: P.kwargs) -> dict[str, Any]:
        """The spec submit writes: ``{"task": name, "args": {...}}`` (checked as ``submit``)."""
        return {"task": self.name, "args": self.arguments(args, kwargs)}

    def _key(self, option: KeyOption, what: str, given: dict[str, Any]) -> str | None:
        if option is None or isinstance(option, str):
            return option
        bound = self.signature.bind_partial(**given)
        bound.apply_defaults()
        key = option(**bound.arguments)
        if key is not None and not isinstance(key, str):
            raise InvalidArgument(f"task {self.name}: {what} must answer a str or None, got {type(key).__name__}")
        return key

    def problem(self, args: Any) -> str | None:
        """Why ``args`` (a spec's) cannot be passed to the function, or None."""
        if not isinstance(args, dict):
            return f"task {self.name}: the spec's args must be a JSON object, got {type(args).__name__}"
        try:
            self.signature.bind(**args)
        except TypeError as exc:
            return f"task {self.name}: {exc}"
        return None

    # -- submitting

    def options(self, *, queue: str | None = None, priority: int | None = None, max_attempts: int | None = None,
                unique_key: KeyOption = None, concurrency_key: KeyOption = None,
                run_at: datetime | timedelta | None = None, after: Iterable[Task | str | uuid.UUID] | None = None,
                on_parent_failure: Literal["cancel", "run"] | None = None,
                conn: Connectable | None = None) -> TaskFunction[P, R]:
        """A copy whose submits use these options (None: as declared): ``run_at`` (an aware
        datetime, or a timedelta from now), ``unique_key``, ``concurrency_key`` (a text, or a
        function of the arguments), ``after`` (tasks or their ids), ``conn`` (the application's
        psycopg connection or cursor: submit in its transaction)."""
        given = (("queue", queue), ("priority", priority), ("max_attempts", max_attempts),
                 ("unique_key", unique_key), ("concurrency_key", concurrency_key),
                 ("run_at", run_at), ("on_parent_failure", on_parent_failure), ("conn", conn))
        changes: dict[str, Any] = {k: v for k, v in given if v is not None}
        if after is not None:
            changes["after"] = tuple(a.rn if isinstance(a, Task) else a for a in after)
        copy: TaskFunction[P, R] = object.__new__(TaskFunction)
        copy.__dict__.update(self.__dict__)
        copy._options = dataclasses.replace(self._options, **changes)
        return copy

    def submit(self, *args: P.args, **kwargs: P.kwargs) -> TaskHandle:
        """Submit a task that runs the function with these arguments; its handle (``rn``,
        ``wait()``, ``result(timeout)``). ``conn=`` (not typed: ``options(conn=...)`` is):
        inside the application's transaction. Nothing is written when an argument is missing,
        unknown or not JSON (InvalidArgument naming it)."""
        conn: Any = kwargs.pop("conn", None)
        me = self if conn is None else self.options(conn=conn)
        given = me.arguments(args, kwargs)
        if me.app.inline:
            return me._inline(given)
        o = me._options
        spec = {"task": me.name, "args": given}
        with tracing.submitting(me.app.tracer, me.name, o.queue, [spec]) as span:
            handle = me._client().submit(o.queue, spec, o.priority, run_at=o.run_at,
                                         unique_key=me._key(o.unique_key, "unique_key", given),
                                         max_attempts=o.max_attempts,
                                         concurrency_key=me._key(o.concurrency_key, "concurrency_key", given),
                                         after=o.after, on_parent_failure=o.on_parent_failure)
            tracing.submitted(span, [handle.rn])
        return handle

    def submit_many(self, calls: Iterable[Mapping[str, Any]]) -> list[TaskHandle]:
        """Submit one task per mapping of arguments (by name), in one statement; every mapping is
        checked before anything is written. Their handles, in order."""
        given = [self.arguments((), c) for c in calls]
        if self.app.inline:
            return [self._inline(g) for g in given]
        o = self._options
        client = self._client()
        specs = [{"task": self.name, "args": g} for g in given]
        with tracing.submitting(self.app.tracer, self.name, o.queue, specs) as span:
            tasks = client.submit_many(o.queue, specs, o.priority, run_at=o.run_at,
                                       unique_keys=[self._key(o.unique_key, "unique_key", g) for g in given],
                                       max_attempts=o.max_attempts,
                                       concurrency_keys=[self._key(o.concurrency_key, "concurrency_key", g)
                                                         for g in given],
                                       after=o.after, on_parent_failure=o.on_parent_failure)
            tracing.submitted(span, [t.rn for t in tasks])
        return [_handle(t, client) for t in tasks]

    def schedule_options(self, args: dict[str, Any]) -> dict[str, Any]:
        """The options a periodic schedule's firings submit with (its ``task_options``): those of
        ``max_attempts`` and ``concurrency_key`` (computed from ``args``) that are set."""
        o = self._options
        given = {"max_attempts": o.max_attempts,
                 "concurrency_key": self._key(o.concurrency_key, "concurrency_key", args)}
        return {k: v for k, v in given.items() if v is not None}

    def _client(self) -> TaskClient:
        conn = self._options.conn
        return TaskClient(self.app.db if conn is None else conn)

    def _inline(self, given: dict[str, Any]) -> TaskHandle:
        """testing("inline"): run now, with the arguments as a worker would get them (through JSON)."""
        args = load_json(json.dumps(given))
        spec = {"task": self.name, "args": args}
        rn = uuid.uuid4()
        ctx = TaskContext({"rn": str(rn), "token": None, "spec": spec, "priority": self.priority,
                           "queue": self.queue, "attempt": 1})
        result = run(ctx, self, args)
        why = json_problem(result, "the result")
        if why:
            raise InvalidArgument(f"task {self.name}: {why}")
        now = datetime.now(timezone.utc)
        return _InlineHandle(rn=rn, queue=self.queue, spec=spec, priority=self.priority, status="completed",
                             progress=1.0, created=now, updated=now, errors=[], owner=None, deadline=None,
                             history=[], attempts=1, max_attempts=self._options.max_attempts,
                             output=load_json(json.dumps(result)))


def run(ctx: TaskContext, function: TaskFunction[Any, Any], args: Any) -> Any:
    """``function.fn(**args)`` in this thread with ``ctx`` as current_context() (an ``async def``
    one to its end, in an event loop of its own). Arguments that cannot be passed (a spec
    written elsewhere, by psql say) abort the task: ``Abort("InvalidArguments")``, never retried."""
    token = _current.set(ctx)
    try:
        result = function.fn(**args)
        return asyncio.run(result) if function.is_async else result
    except TypeError:
        _refuse(function, args)
        raise
    finally:
        _current.reset(token)


async def run_async(ctx: TaskContext, function: TaskFunction[Any, Any], args: Any) -> Any:
    """``run`` in an event loop: an ``async def`` function awaited, another in a thread."""
    token = _current.set(ctx)
    try:
        if function.is_async:
            return await function.fn(**args)
        return await asyncio.to_thread(function.fn, **args)  # the thread gets a copy of the context
    except TypeError:
        _refuse(function, args)
        raise
    finally:
        _current.reset(token)


def _refuse(function: TaskFunction[Any, Any], args: Any) -> None:
    """After a TypeError: Abort when ``args`` do not bind (else it was the function's own)."""
    why = function.problem(args)
    if why is not None:
        raise Abort("InvalidArguments", why, {"task": function.name}) from None


@dataclass(frozen=True, slots=True, eq=False)
class _InlineHandle(TaskHandle):
    """A task run by testing("inline"): finished already."""

    def wait(self, timeout: float | None = None) -> Task:
        return self
