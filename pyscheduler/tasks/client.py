"""The client side of leased tasks: submit (now, later, once per unique key, after other tasks,
as a workflow), view, cancel, requeue, pause and resume a queue, set its concurrency and rate
limits, and a handle that waits for a task's result (``submit(...).result(timeout)``, by LISTEN).

``TaskClient(db)`` runs on pyscheduler's pool; ``TaskClient(conn)`` on the application's own
psycopg connection or cursor, inside its transaction: a task submitted there exists only if the
application commits (``AsyncTaskClient(conn)`` for asyncio). Results are :class:`Task` objects.
A task belongs to the role that submitted it: any client may view it; cancel, requeue, delete and
run now are for that role (or a member of it) and admin. Over 600 lines: one client, sync and async, each call once."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import Any, Literal, get_args
from uuid import UUID

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row

from ..calls import (AsyncClient, Call, SyncClient, asynchronous, aware, choice, duration, each, instant, integer,
                     interval, json_object, json_objects, only_object, plain_object, required_instant, sync, text,
                     texts)
from ..db import AsyncSession, Database, Jsonb, Session, TextArray, connect, settings
from ..errors import InvalidArgument, SchedulerError
from . import sqlapi as sql
from .sqlapi import MAX_PRIORITY

__all__ = ["MAX_PRIORITY", "STATUSES", "AsyncTaskClient", "AsyncTaskHandle", "HistoryEntry", "QueueLimits",
           "QueueState", "Task", "TaskClient", "TaskError", "TaskFailed", "TaskHandle", "TaskStatus", "Workflow"]

TaskStatus = Literal["waiting", "scheduled", "ready", "running", "completed", "aborted", "cancelled"]
STATUSES: tuple[TaskStatus, ...] = get_args(TaskStatus)


@dataclass(frozen=True, slots=True)
class TaskError:
    """An entry of a task's ``errors``: a failed attempt (a handler's exception, ``Retry``), what
    aborted it (``Abort(code, description, args)``), or ``TaskMaxAttempts`` after the last attempt."""

    code: str
    description: str
    args: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)  # any other key of the entry

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> TaskError:
        rest = {k: v for k, v in obj.items() if k not in ("code", "description", "args")}
        return cls(obj.get("code", ""), obj.get("description", ""), dict(obj.get("args") or {}), rest)


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """An entry of a task's ``history``: ``type`` is the seed's ``_typ`` (``TaskAssignment``,
    ``TaskTimeout``, ``TaskYield``, ``TaskRetry``, ``TaskRequeued``, ...), ``worker`` the lease's
    worker, ``time`` when it happened, ``progress`` the progress reported before a timeout or a
    yield."""

    type: str
    time: datetime
    worker: str | None = None
    progress: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # any other key of the entry

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> HistoryEntry:
        rest = {k: v for k, v in obj.items() if k not in ("_typ", "time", "worker", "progress")}
        progress = obj.get("progress")
        return cls(obj["_typ"], required_instant(obj["time"]), obj.get("worker"),
                   None if progress is None else float(progress), rest)


@dataclass(frozen=True, slots=True)
class Task:
    """A task: its id ``rn``, ``spec`` (the submitted JSON object), ``queue``, ``priority``
    (higher first), ``status``, ``progress`` (0..1, from heartbeats), ``created`` and
    ``updated`` (UTC), ``errors`` (its failed attempts, and why it was aborted), ``owner`` (the
    worker holding or that last held it), ``deadline`` (of the current lease, UTC), ``history``;
    the job queue's extensions: ``run_at`` (a ``scheduled`` task is not leased before it),
    ``attempts`` (leases not yielded), ``max_attempts`` (None: the setting ``task_max_attempts``),
    ``unique_key``, ``submitted_by`` (the role it belongs to) and ``deduplicated`` (a submit
    answered with the live task that holds its unique key, instead of a new task); issue 20's:
    ``concurrency_key``, ``output`` (the result it was completed with: ``result`` in the JSON;
    a handler's return value), ``after`` (the tasks it waits for) and ``on_parent_failure``.

    ``awaiting``: a task suspended waiting for an event (``ctx.await_event``; its status is
    ``scheduled``), the event's name, from ``get`` only (None in lists).

    ``redacted``: the task belongs to a role the caller is not (docs/sql-api.md, "Ownership"):
    its metadata only, ``spec`` is ``{}``, ``errors`` and ``history`` are empty, ``output``,
    ``unique_key`` and ``concurrency_key`` are None.

    ``json`` is the task in the seed's JSON shape, as the SQL functions return it, and
    ``task["rn"]`` reads it (``task["created"]`` is the text ``2021-10-09T12:13:21.000000Z``,
    ``task["history"]`` the entries with their ``_typ``)."""

    rn: UUID
    queue: str
    spec: dict[str, Any]
    priority: int
    status: TaskStatus
    progress: float
    created: datetime
    updated: datetime
    errors: list[TaskError]
    owner: str | None
    deadline: datetime | None
    history: list[HistoryEntry]
    run_at: datetime | None = None
    attempts: int = 0
    max_attempts: int | None = None
    unique_key: str | None = None
    submitted_by: str | None = None
    deduplicated: bool = False
    concurrency_key: str | None = None
    output: Any = None
    after: list[UUID] | None = None
    on_parent_failure: str = "cancel"
    redacted: bool = False
    awaiting: str | None = None
    json: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Task:
        """From the jsonb the SQL functions return (keys they add later are ignored)."""
        return cls(rn=UUID(obj["rn"]), queue=obj["queue"], spec=obj["spec"] or {}, priority=int(obj["priority"]),
                   status=obj["status"], progress=float(obj["progress"]), created=required_instant(obj["created"]),
                   updated=required_instant(obj["updated"]),
                   errors=[TaskError.from_json(e) for e in obj.get("errors") or ()], owner=obj.get("owner"),
                   deadline=instant(obj.get("deadline")),
                   history=[HistoryEntry.from_json(h) for h in obj.get("history") or ()],
                   run_at=instant(obj.get("run_at")), attempts=int(obj.get("attempts") or 0),
                   max_attempts=obj.get("max_attempts"), unique_key=obj.get("unique_key"),
                   submitted_by=obj.get("submitted_by"), deduplicated=bool(obj.get("deduplicated")),
                   concurrency_key=obj.get("concurrency_key"), output=obj.get("result"),
                   after=None if obj.get("after") is None else [UUID(a) for a in obj["after"]],
                   on_parent_failure=obj.get("on_parent_failure") or "cancel", redacted=bool(obj.get("redacted")),
                   awaiting=(obj.get("awaiting") or {}).get("event"), json=obj)

    def __getitem__(self, key: str) -> Any:
        """A key of the seed's JSON shape (``json``)."""
        return self.json[key]


_TASK_FIELDS = tuple(f.name for f in fields(Task))  # what a handle copies from its task


@dataclass(frozen=True, slots=True)
class QueueState:
    """Whether a queue is paused (``pause_queue``), why (``note``), by which role, since when;
    whether it keeps its completed tasks (``set_queue_keep_completed``)."""

    queue: str
    paused: bool
    note: str | None
    paused_by: str | None
    updated: datetime | None
    keep_completed: bool = True

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> QueueState:
        return cls(obj["queue"], bool(obj["paused"]), obj.get("note"), obj.get("paused_by"),
                   instant(obj.get("updated")), bool(obj.get("keep_completed", True)))


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """A queue's limits (``set_queue_limits``, ``set_rate_limit``; None: no limit):
    ``running_per_key``, ``running_total``, ``rate_starts`` per ``rate_per`` (for the queue, or
    per concurrency key with ``rate_by_key``), the role that set them and when."""

    queue: str
    running_per_key: int | None
    running_total: int | None
    rate_starts: int | None
    rate_per: timedelta | None
    rate_by_key: bool
    limits_by: str | None
    limits_updated: datetime | None

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> QueueLimits:
        per = obj.get("rate_per")
        return cls(obj["queue"], obj.get("running_per_key"), obj.get("running_total"), obj.get("rate_starts"),
                   None if per is None else timedelta(seconds=float(per)), bool(obj.get("rate_by_key")),
                   obj.get("limits_by"), instant(obj.get("limits_updated")))

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> QueueLimits:
        """From a row of the view queue_limits."""
        return cls(row["queue"], row["running_per_key"], row["running_total"], row["rate_starts"],
                   interval(row["rate_per"]), bool(row["rate_by_key"]), row["limits_by"],
                   instant(row["limits_updated"]))


class TaskFailed(SchedulerError):
    """``result()`` of a task that ended aborted or cancelled: ``task`` is how it ended (its
    ``errors``, its ``history``)."""

    def __init__(self, task: Task):
        super().__init__(f"task {task.rn} was {task.status}")
        self.task = task


FINISHED = ("completed", "aborted", "cancelled")


def _dsn_of(db: Any) -> str:
    """A DSN for a connection of our own next to ``db`` (a pool, a session, or the
    application's connection): the handle listens on it, outside any transaction."""
    if isinstance(db, Database):
        return db.dsn
    conn = db.conn
    return make_conninfo(conn.info.dsn, password=conn.info.password or None)


def _finished(raw: Any) -> Task | None:
    task = Task.from_json(raw)
    return task if task.status in FINISHED else None


def _outcome(task: Task) -> Any:
    if task.status != "completed":
        raise TaskFailed(task)
    return task.output


@dataclass(frozen=True, slots=True, eq=False)
class TaskHandle(Task):
    """A submitted task (every field of :class:`Task`, as submitted) that can wait for its end:
    ``result(timeout)`` returns the result it was completed with (a handler's return value),
    raises :class:`TaskFailed` when it was aborted or cancelled and ``TimeoutError`` when it
    has not finished in ``timeout`` seconds. It waits by LISTEN on the task's channel (the
    task is watched: ``watch_task``), on a connection of its own; call it after the
    transaction that submitted the task has committed."""

    client: Any = field(default=None, repr=False, compare=False)

    def __eq__(self, other: object) -> bool:
        """Equal to the :class:`Task` with the same fields (a handle is that task)."""
        if not isinstance(other, Task):
            return NotImplemented
        return all(getattr(self, f.name) == getattr(other, f.name) for f in fields(Task) if f.compare)

    def __hash__(self) -> int:
        return Task.__hash__(self)

    def wait(self, timeout: float | None = None) -> Task:
        """The task once it finished (completed, aborted or cancelled)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with connect(_dsn_of(self.client.db)) as conn:
            conn.execute(f'LISTEN "{sql.watch_channel(self.rn)}"')
            session = Session(conn)
            done = _finished(session.call_value(sql.WATCH_TASK, rn=self.rn))
            while done is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"task {self.rn} has not finished in {timeout} s")
                for _ in conn.notifies(timeout=left, stop_after=1):
                    pass
                done = _finished(session.call_value(sql.GET_TASK, rn=self.rn))
            return done

    def result(self, timeout: float | None = None) -> Any:
        """The task's result once it completed (see the class)."""
        return _outcome(self.wait(timeout))


@dataclass(frozen=True, slots=True, eq=False)
class AsyncTaskHandle(Task):
    """:class:`TaskHandle` for asyncio: ``await handle.result(timeout)``."""

    client: Any = field(default=None, repr=False, compare=False)

    def __eq__(self, other: object) -> bool:
        """Equal to the :class:`Task` with the same fields (a handle is that task)."""
        if not isinstance(other, Task):
            return NotImplemented
        return all(getattr(self, f.name) == getattr(other, f.name) for f in fields(Task) if f.compare)

    def __hash__(self) -> int:
        return Task.__hash__(self)

    async def wait(self, timeout: float | None = None) -> Task:
        """The task once it finished (completed, aborted or cancelled)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        dsn = _dsn_of(self.client.db)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True, **settings().kwargs(dsn)) as conn:
            await conn.execute(f'LISTEN "{sql.watch_channel(self.rn)}"')
            session = AsyncSession(conn)
            done = _finished(await session.call_value(sql.WATCH_TASK, rn=self.rn))
            while done is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"task {self.rn} has not finished in {timeout} s")
                async for _ in conn.notifies(timeout=left, stop_after=1):
                    pass
                done = _finished(await session.call_value(sql.GET_TASK, rn=self.rn))
            return done

    async def result(self, timeout: float | None = None) -> Any:
        """The task's result once it completed (see :class:`TaskHandle`)."""
        return _outcome(await self.wait(timeout))


def _handle(task: Task, client: Any, cls: type[TaskHandle] | type[AsyncTaskHandle] = TaskHandle) -> Any:
    return cls(**{name: getattr(task, name) for name in _TASK_FIELDS}, client=client)


class Workflow:
    """A graph of tasks to submit in one call (``submit_workflow``): ``add`` each node with a
    local name and the names it runs ``after``; ``TaskClient.submit_workflow(flow)`` submits
    them all or none (a cycle or an unknown name is refused) and answers name -> handle::

        flow = Workflow()
        flow.add("fetch", "etl", {"url": u})
        flow.add("parse", "etl", {}, after=["fetch"])
        tasks = client.submit_workflow(flow)
        tasks["parse"].result(timeout=60)
    """

    def __init__(self) -> None:
        self.nodes: list[dict[str, Any]] = []

    def add(self, name: str, queue: str, spec: Mapping[str, Any], *, after: Sequence[str] = (), priority: int = 50,
            unique_key: str | None = None, max_attempts: int | None = None, concurrency_key: str | None = None,
            run_in: timedelta | None = None,
            on_parent_failure: Literal["cancel", "run"] = "cancel") -> Workflow:
        """Add a node; returns the workflow (calls chain)."""
        node: dict[str, Any] = {"name": text("name", name), "queue": _queue(queue),
                                "spec": json_object("spec", spec).obj, "priority": _priority(priority),
                                "after": [text(f"after[{i}]", a) for i, a in enumerate(after)],
                                "on_parent_failure": choice("on_parent_failure", on_parent_failure, ("cancel", "run"))}
        if unique_key is not None:
            node["unique_key"] = text("unique_key", unique_key)
        if max_attempts is not None:
            node["max_attempts"] = _max_attempts(max_attempts)
        if concurrency_key is not None:
            node["concurrency_key"] = text("concurrency_key", concurrency_key)
        if run_in is not None:
            node["run_in"] = f"{duration('run_in', run_in).total_seconds()} seconds"
        self.nodes.append(node)
        return self


def task_id(rn: str | UUID) -> UUID:
    """A task id from a UUID or its text, else InvalidArgument naming ``rn``."""
    try:
        return rn if isinstance(rn, UUID) else UUID(str(rn))
    except ValueError as exc:
        raise InvalidArgument(f"rn must be a task id (a UUID), got {rn!r}") from exc


def _priority(priority: int) -> int:
    return int(integer("priority", priority, 0, MAX_PRIORITY))


def _queue(queue: str) -> str:
    return str(text("queue", queue))


# -- the calls: one function each, a method of both clients ----------------------------------

def _when(run_at: datetime | timedelta | None) -> dict[str, Any]:
    """``run_at`` as submit_task takes it: an instant, or a delay from now by the database clock."""
    if isinstance(run_at, timedelta):
        return {"run_in": duration("run_at", run_at)}
    return {"run_at": aware("run_at", run_at, optional=True)}


def _max_attempts(max_attempts: int | None) -> int | None:
    return None if max_attempts is None else int(integer("max_attempts", max_attempts, 1, sql.MAX_ATTEMPTS))


def _after(after: Iterable[str | UUID] | None) -> list[UUID] | None:
    return None if after is None else [task_id(a) for a in after]


def _submit(queue: str, spec: Mapping[str, Any], priority: int = 50, *, run_at: datetime | timedelta | None = None,
            unique_key: str | None = None, max_attempts: int | None = None, concurrency_key: str | None = None,
            after: Iterable[str | UUID] | None = None,
            on_parent_failure: Literal["cancel", "run"] = "cancel") -> Call[Task]:
    """Submit one task to ``queue``; idle workers of the queue are woken at once. ``run_at``: not
    leased before this instant, or this long from now (a timedelta, up to 365 days, by the
    database clock): the task is ``scheduled`` until then. ``unique_key``: while a task of the
    queue with this key is waiting, scheduled, ready or running, that task is returned instead
    (``deduplicated``). ``max_attempts``: 1..1000 (None: the setting ``task_max_attempts``).
    ``concurrency_key``: tasks of one key share the queue's ``running_per_key`` limit.
    ``after``: task ids (of this role): the task is ``waiting`` until they all finished;
    ``on_parent_failure``: ``cancel`` it (default) or ``run`` it anyway when one of them is
    aborted or cancelled."""
    # the task as a scalar (below psycopg's cursor), its spec serialised once (plain_object), and
    # only the arguments that differ from submit_task's defaults (as the single submit_ids)
    args = {"queue": _queue(queue), "spec": plain_object(spec) or json_object("spec", spec),
            "priority": _priority(priority), **_when(run_at),
            "unique_key": text("unique_key", unique_key, optional=True), "max_attempts": _max_attempts(max_attempts),
            "concurrency_key": text("concurrency_key", concurrency_key, optional=True), "after": _after(after),
            "on_parent_failure": choice("on_parent_failure", on_parent_failure, ("cancel", "run"))}
    given = {name: v for name, v in args.items() if v is not None and sql.SUBMIT_DEFAULTS.get(name) != v}
    return Call(sql.SUBMIT_TASK, given, Task.from_json, scalar=True)


def _many_args(queue: str, specs: Iterable[Mapping[str, Any]], priority: int, run_at: datetime | timedelta | None,
               unique_keys: Iterable[str | None] | None, max_attempts: int | None,
               concurrency_keys: Iterable[str | None] | None, after: Iterable[str | UUID] | None,
               on_parent_failure: Literal["cancel", "run"]) -> dict[str, Any]:
    """The arguments of submit_tasks and submit_tasks_lean, checked."""
    objects = json_objects("specs", specs)
    keys = None if unique_keys is None else texts("unique_keys", unique_keys)
    if keys is not None and len(keys) != len(objects.obj):
        raise InvalidArgument(f"unique_keys must have one key per spec: "
                              f"{len(keys)} keys for {len(objects.obj)} specs")
    ckeys = None if concurrency_keys is None else texts("concurrency_keys", concurrency_keys)
    if ckeys is not None and len(ckeys) != len(objects.obj):
        raise InvalidArgument(f"concurrency_keys must have one key per spec: "
                              f"{len(ckeys)} keys for {len(objects.obj)} specs")
    args = {"queue": _queue(queue), "specs": objects, "priority": _priority(priority), **_when(run_at),
            "unique_keys": keys, "max_attempts": _max_attempts(max_attempts), "concurrency_keys": ckeys,
            "after": _after(after), "on_parent_failure": choice("on_parent_failure", on_parent_failure,
                                                                ("cancel", "run"))}
    return {name: value for name, value in args.items() if value is not None}


def _submit_many(queue: str, specs: Iterable[Mapping[str, Any]], priority: int = 50, *,
                 run_at: datetime | timedelta | None = None, unique_keys: Iterable[str | None] | None = None,
                 max_attempts: int | None = None, concurrency_keys: Iterable[str | None] | None = None,
                 after: Iterable[str | UUID] | None = None,
                 on_parent_failure: Literal["cancel", "run"] = "cancel") -> Call[list[Task]]:
    """Submit many tasks of one queue, priority, ``run_at``, ``max_attempts`` and ``after`` in one
    statement; they lease in this order. ``unique_keys``: one per spec (None: no key); a spec
    whose key a live task holds (or an earlier spec) is answered with that task
    (``deduplicated``). ``concurrency_keys``: one per spec (None: no key). ``submit_ids``: the
    same, answering only the ids."""
    return Call(sql.SUBMIT_TASKS, _many_args(queue, specs, priority, run_at, unique_keys, max_attempts,
                                             concurrency_keys, after, on_parent_failure), each(Task.from_json, "task"))


def _submit_ids(queue: str, specs: Iterable[Mapping[str, Any]], priority: int = 50, *,
                run_at: datetime | timedelta | None = None, unique_keys: Iterable[str | None] | None = None,
                max_attempts: int | None = None, concurrency_keys: Iterable[str | None] | None = None,
                after: Iterable[str | UUID] | None = None,
                on_parent_failure: Literal["cancel", "run"] = "cancel") -> Call[list[UUID]]:
    """``submit_many`` answering only the tasks' ids, one per spec in the order of specs (a
    deduplicated spec: the id of the live task holding its key): no task is built, on the server
    or here, so a batch goes in about twice as fast (submit_tasks_lean). One spec is the fastest
    single submit (submit_task_lean: a scalar, no set)."""
    if (type(specs) is list and len(specs) == 1 and unique_keys is None and concurrency_keys is None
            and after is None and on_parent_failure == sql.SUBMIT_DEFAULTS["on_parent_failure"]
            and (spec := plain_object(specs[0])) is not None):
        # the hot single submit: one plain spec, serialised once, and only the arguments that
        # differ from submit_task_lean's defaults (~10 us less a call than the general path)
        one: dict[str, Any] = {"queue": _queue(queue), "spec": spec}
        if not (type(priority) is int and priority == sql.SUBMIT_DEFAULTS["priority"]):
            one["priority"] = _priority(priority)
        if run_at is not None:
            one.update(_when(run_at))
        if max_attempts is not None:
            one["max_attempts"] = _max_attempts(max_attempts)
        return Call(sql.SUBMIT_TASK_LEAN, one, _one_id, scalar=True)
    args = _many_args(queue, specs, priority, run_at, unique_keys, max_attempts, concurrency_keys, after,
                      on_parent_failure)
    if len(args["specs"].obj) == 1:
        one = {_SINGULAR.get(name, name): value for name, value in args.items()}
        one["spec"] = only_object(one["spec"])
        for name in ("unique_key", "concurrency_key"):
            if name in one:
                one[name] = one[name][0]
        return Call(sql.SUBMIT_TASK_LEAN, one, _one_id, scalar=True)
    for name in ("unique_keys", "concurrency_keys"):  # checked by texts(): sent in one go
        if name in args:
            args[name] = TextArray(args[name])
    return Call(sql.SUBMIT_TASKS_LEAN, args, each(task_id), column="rn")


def _one_id(rn: Any) -> list[UUID]:
    return [task_id(rn)]


# submit_tasks_lean's arguments that submit_task_lean takes one of
_SINGULAR = {"specs": "spec", "unique_keys": "unique_key", "concurrency_keys": "concurrency_key"}


def _submit_workflow_call(workflow: Workflow) -> Call[dict[str, Task]]:
    if not isinstance(workflow, Workflow):
        raise InvalidArgument(f"workflow must be a Workflow, got {type(workflow).__name__}")
    return Call(sql.SUBMIT_WORKFLOW, {"workflow": Jsonb(workflow.nodes)},
                lambda raw: {name: Task.from_json(t) for name, t in raw.items()}, scalar=True)


def _set_queue_limits(queue: str, *, running_per_key: int | None = None,
                      running_total: int | None = None) -> Call[QueueLimits]:
    """At most ``running_per_key`` tasks of one concurrency key and ``running_total`` of the
    queue run at once, across every worker (None: no limit; both None: none). The limits
    belong to this role."""
    return Call(sql.SET_QUEUE_LIMITS,
                {"queue": _queue(queue),
                 "running_per_key": integer("running_per_key", running_per_key, 1, sql.MAX_QUEUE_LIMIT, optional=True),
                 "running_total": integer("running_total", running_total, 1, sql.MAX_QUEUE_LIMIT, optional=True)},
                QueueLimits.from_json, scalar=True)


def _set_rate_limit(queue: str, starts: int | None, per: timedelta = timedelta(seconds=1), *,
                    by_key: bool = False) -> Call[QueueLimits]:
    """At most ``starts`` leases begin per ``per`` (a token bucket: bursts up to ``starts``), for
    the queue or each concurrency key (``by_key``); ``starts`` None removes the rate limit."""
    return Call(sql.SET_RATE_LIMIT, {"queue": _queue(queue),
                                   "starts": integer("starts", starts, 1, sql.MAX_QUEUE_LIMIT, optional=True),
                                   "per": duration("per", per), "by_key": bool(by_key)},
                QueueLimits.from_json, scalar=True)


def _get(rn: str | UUID) -> Call[Task]:
    """The task; TaskNotFound (PS200) when there is none."""
    return Call(sql.GET_TASK, {"rn": task_id(rn)}, Task.from_json, scalar=True)


def _list(queue: str | None = None, status: TaskStatus | None = None, owner: str | None = None,
          limit: int = 100, before: str | UUID | None = None) -> Call[list[Task]]:
    """Tasks matching every filter given (None: any), newest first, at most ``limit``. The next
    page: ``before`` = the last ``rn`` of this one (keyset)."""
    if status is not None and status not in STATUSES:
        raise InvalidArgument(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
    return Call(sql.LIST_TASKS, {"queue": text("queue", queue, optional=True), "status": status,
                               "owner": text("owner", owner, optional=True),
                               "max_tasks": integer("limit", limit, 1, 2**31 - 1),
                               "before_rn": None if before is None else task_id(before)},
                each(Task.from_json, "task"))


def _cancel(rn: str | UUID) -> Call[Task]:
    """Cancel a scheduled, ready or running task; its worker is told at once. TaskFinished
    (PS209) when it is already completed or aborted."""
    return Call(sql.CANCEL_TASK, {"rn": task_id(rn)}, Task.from_json, scalar=True)


def _retry(rn: str | UUID) -> Call[Task]:
    """Requeue an aborted or cancelled task: ready again with its attempts reset and its errors
    kept (waiting, with parents not all finished, for the live ones). TaskNotRequeueable (PS211)
    for any other status or when a parent is aborted or cancelled; UniqueKeyTaken (PS214) when
    another live task holds its unique key."""
    return Call(sql.RETRY_TASK, {"rn": task_id(rn)}, Task.from_json, scalar=True)


def _retry_many(queue: str, status: Literal["aborted", "cancelled"] = "aborted", limit: int = 100) -> Call[list[Task]]:
    """Requeue up to ``limit`` (1..10000) tasks of ``queue`` in ``status`` that this role may act
    on, those finished longest ago first; call again while it returns ``limit`` tasks."""
    return Call(sql.RETRY_TASKS, {"queue": _queue(queue), "status": choice("status", status, ("aborted", "cancelled")),
                                "max_tasks": integer("limit", limit, 1, sql.MAX_REQUEUE)}, each(Task.from_json, "task"))


def _bulk(function: str, rns: Iterable[str | UUID]) -> Call[list[str]]:
    ids = [task_id(rn) for rn in rns]
    if len(ids) > sql.MAX_BULK:
        raise InvalidArgument(f"at most {sql.MAX_BULK} task ids at a time, got {len(ids)}")
    return Call(function, {"rns": ids}, each(str, "rn"))


def _delete_many(rns: Iterable[str | UUID]) -> Call[list[str]]:
    """Delete the finished ones of ``rns`` (at most 1000) this role may act on; their ids."""
    return _bulk(sql.DELETE_TASKS, rns)


def _run_now(rns: Iterable[str | UUID]) -> Call[list[str]]:
    """Make the scheduled ones of ``rns`` (at most 1000) this role may act on due now; their ids."""
    return _bulk(sql.RUN_TASKS_NOW, rns)


def _pause_queue(queue: str, note: str | None = None) -> Call[QueueState]:
    """Pause ``queue``: its workers lease nothing from their next lease on (running tasks
    finish; submits go on). The pause belongs to this role."""
    return Call(sql.PAUSE_QUEUE, {"queue": _queue(queue), "note": text("note", note, optional=True)},
                QueueState.from_json, scalar=True)


def _resume_queue(queue: str) -> Call[QueueState]:
    """Resume ``queue`` (paused by this role, or as admin) and wake its workers."""
    return Call(sql.RESUME_QUEUE, {"queue": _queue(queue)}, QueueState.from_json, scalar=True)


def _set_queue_keep_completed(queue: str, keep: bool) -> Call[QueueState]:
    """``keep`` False: from the next completion on, a task of ``queue`` that completes is deleted
    (unless watched or a parent), not kept as completed; the completion is then cheaper
    (docs/sql-api.md, set_queue_keep_completed). True (the default) keeps them."""
    if not isinstance(keep, bool):
        raise InvalidArgument(f"keep must be True or False, got {keep!r}")
    return Call(sql.SET_QUEUE_KEEP_COMPLETED, {"queue": _queue(queue), "keep": keep}, QueueState.from_json, scalar=True)


class TaskClient(SyncClient):
    """Submit, view, cancel and requeue tasks, pause and resume queues (role pyscheduler_client):
    ``TaskClient(db)`` on a ``Database``, or ``TaskClient(conn)`` on the application's psycopg
    connection or cursor, in its transaction (the task exists only if the application commits).
    ``submit`` answers a :class:`TaskHandle`: the task, and ``result(timeout)`` to wait for its end."""

    def submit(self, queue: str, spec: Mapping[str, Any], priority: int = 50, *,
               run_at: datetime | timedelta | None = None, unique_key: str | None = None,
               max_attempts: int | None = None, concurrency_key: str | None = None,
               after: Iterable[str | UUID] | None = None,
               on_parent_failure: Literal["cancel", "run"] = "cancel") -> TaskHandle:
        task = self._run(_submit(queue, spec, priority, run_at=run_at, unique_key=unique_key,
                                 max_attempts=max_attempts, concurrency_key=concurrency_key, after=after,
                                 on_parent_failure=on_parent_failure))
        handle: TaskHandle = _handle(task, self)
        return handle

    submit.__doc__ = _submit.__doc__

    def submit_workflow(self, workflow: Workflow) -> dict[str, TaskHandle]:
        """Submit a :class:`Workflow` in one transaction (all or nothing; InvalidArgument,
        PS220, for a cycle, an unknown or a repeated name); name -> handle."""
        tasks = self._run(_submit_workflow_call(workflow))
        return {name: _handle(t, self) for name, t in tasks.items()}

    def handle(self, rn: str | UUID) -> TaskHandle:
        """A handle of an existing task, to wait for its result."""
        handle: TaskHandle = _handle(self._run(_get(rn)), self)
        return handle

    def queue_limits(self) -> list[QueueLimits]:
        """Every queue with limits (the view queue_limits)."""
        query = sql.QUEUE_LIMITS.select("ORDER BY queue")
        if isinstance(self.db, Database):
            rows = self.db.query(query)
        else:
            with psycopg.Cursor(self.db.conn, row_factory=dict_row) as cur:
                rows = cur.execute(query, binary=True).fetchall()
        return [QueueLimits.from_row(r) for r in rows]

    submit_many = sync(_submit_many)
    submit_ids = sync(_submit_ids)
    set_queue_limits = sync(_set_queue_limits)
    set_rate_limit = sync(_set_rate_limit)
    set_queue_keep_completed = sync(_set_queue_keep_completed)
    get = sync(_get)
    list = sync(_list)
    cancel = sync(_cancel)
    retry = sync(_retry)
    retry_many = sync(_retry_many)
    delete_many = sync(_delete_many)
    run_now = sync(_run_now)
    pause_queue = sync(_pause_queue)
    resume_queue = sync(_resume_queue)


class AsyncTaskClient(AsyncClient):
    """``TaskClient`` for asyncio, on the application's psycopg ``AsyncConnection`` or
    ``AsyncCursor``, in its transaction: ``await AsyncTaskClient(conn).submit(...)``."""

    async def submit(self, queue: str, spec: Mapping[str, Any], priority: int = 50, *,
                     run_at: datetime | timedelta | None = None, unique_key: str | None = None,
                     max_attempts: int | None = None, concurrency_key: str | None = None,
                     after: Iterable[str | UUID] | None = None,
                     on_parent_failure: Literal["cancel", "run"] = "cancel") -> AsyncTaskHandle:
        task = await self._run(_submit(queue, spec, priority, run_at=run_at, unique_key=unique_key,
                                       max_attempts=max_attempts, concurrency_key=concurrency_key, after=after,
                                       on_parent_failure=on_parent_failure))
        handle: AsyncTaskHandle = _handle(task, self, AsyncTaskHandle)
        return handle

    submit.__doc__ = _submit.__doc__

    async def submit_workflow(self, workflow: Workflow) -> dict[str, AsyncTaskHandle]:
        """``TaskClient.submit_workflow``."""
        tasks = await self._run(_submit_workflow_call(workflow))
        return {name: _handle(t, self, AsyncTaskHandle) for name, t in tasks.items()}

    submit_many = asynchronous(_submit_many)
    submit_ids = asynchronous(_submit_ids)
    set_queue_limits = asynchronous(_set_queue_limits)
    set_rate_limit = asynchronous(_set_rate_limit)
    set_queue_keep_completed = asynchronous(_set_queue_keep_completed)
    get = asynchronous(_get)
    list = asynchronous(_list)
    cancel = asynchronous(_cancel)
    retry = asynchronous(_retry)
    retry_many = asynchronous(_retry_many)
    delete_many = asynchronous(_delete_many)
    run_now = asynchronous(_run_now)
    pause_queue = asynchronous(_pause_queue)
    resume_queue = asynchronous(_resume_queue)
