"""The client side of leased tasks (seeds/scylla.md, and the job queue's
extensions): submit (now, later, once per unique key), view, cancel, requeue,
pause and resume a queue.

``TaskClient(db)`` runs on pyscheduler's pool; ``TaskClient(conn)`` on the
application's own psycopg connection or cursor, inside its transaction: a task
submitted there exists only if the application commits (``AsyncTaskClient(conn)``
for asyncio). Results are :class:`Task` objects. A task belongs to the role that
submitted it: any client may view it; cancel and requeue are for that role (or
a member of it) and admin.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, get_args
from uuid import UUID

from ..calls import (AsyncClient, Call, SyncClient, asynchronous, aware, choice, duration, each, instant, integer,
                     json_object, required_instant, sync, text, value)
from ..db import Jsonb
from ..errors import InvalidArgument

__all__ = ["MAX_PRIORITY", "STATUSES", "AsyncTaskClient", "HistoryEntry", "QueueState", "Task", "TaskClient",
           "TaskError", "TaskStatus"]

MAX_PRIORITY = 4_294_967_295
TaskStatus = Literal["scheduled", "ready", "running", "completed", "aborted", "cancelled"]
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
    ``TaskTimeout``, ``TaskYield``, ``TaskRetry``, ``TaskRequeued``, ...), ``worker`` the lease's worker, ``time`` when it happened,
    ``progress`` the progress reported before a timeout or a yield."""

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
    answered with the live task that holds its unique key, instead of a new task).

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
    json: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Task:
        """From the jsonb the SQL functions return (keys they add later are ignored)."""
        return cls(rn=UUID(obj["rn"]), queue=obj["queue"], spec=obj["spec"], priority=int(obj["priority"]),
                   status=obj["status"], progress=float(obj["progress"]), created=required_instant(obj["created"]),
                   updated=required_instant(obj["updated"]),
                   errors=[TaskError.from_json(e) for e in obj.get("errors") or ()], owner=obj.get("owner"),
                   deadline=instant(obj.get("deadline")),
                   history=[HistoryEntry.from_json(h) for h in obj.get("history") or ()],
                   run_at=instant(obj.get("run_at")), attempts=int(obj.get("attempts") or 0),
                   max_attempts=obj.get("max_attempts"), unique_key=obj.get("unique_key"),
                   submitted_by=obj.get("submitted_by"), deduplicated=bool(obj.get("deduplicated")), json=obj)

    def __getitem__(self, key: str) -> Any:
        """A key of the seed's JSON shape (``json``)."""
        return self.json[key]


@dataclass(frozen=True, slots=True)
class QueueState:
    """Whether a queue is paused (``pause_queue``), why (``note``), by which role, since when."""

    queue: str
    paused: bool
    note: str | None
    paused_by: str | None
    updated: datetime | None

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> QueueState:
        return cls(obj["queue"], bool(obj["paused"]), obj.get("note"), obj.get("paused_by"), instant(obj.get("updated")))


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
    return None if max_attempts is None else int(integer("max_attempts", max_attempts, 1, 1000))


def _submit(queue: str, spec: Mapping[str, Any], priority: int = 50, *, run_at: datetime | timedelta | None = None,
            unique_key: str | None = None, max_attempts: int | None = None) -> Call[Task]:
    """Submit one task to ``queue``; idle workers of the queue are woken at once. ``run_at``: not
    leased before this instant, or this long from now (a timedelta, up to 365 days, by the
    database clock): the task is ``scheduled`` until then. ``unique_key``: while a task of the
    queue with this key is scheduled, ready or running, that task is returned instead
    (``deduplicated``). ``max_attempts``: 1..1000 (None: the setting ``task_max_attempts``)."""
    return Call("submit_task", {"queue": _queue(queue), "spec": json_object("spec", spec),
                                "priority": _priority(priority), **_when(run_at),
                                "unique_key": text("unique_key", unique_key, optional=True),
                                "max_attempts": _max_attempts(max_attempts)}, value(Task.from_json))


def _submit_many(queue: str, specs: Iterable[Mapping[str, Any]], priority: int = 50, *,
                 run_at: datetime | timedelta | None = None, unique_keys: Iterable[str | None] | None = None,
                 max_attempts: int | None = None) -> Call[list[Task]]:
    """Submit many tasks of one queue, priority, ``run_at`` and ``max_attempts`` in one statement;
    they lease in this order. ``unique_keys``: one per spec (None: no key); a spec whose key a
    live task holds (or an earlier spec) is answered with that task (``deduplicated``)."""
    objects = [json_object(f"specs[{i}]", s).obj for i, s in enumerate(specs)]
    keys = None if unique_keys is None else [text(f"unique_keys[{i}]", k, optional=True)
                                             for i, k in enumerate(unique_keys)]
    if keys is not None and len(keys) != len(objects):
        raise InvalidArgument(f"unique_keys must have one key per spec: {len(keys)} keys for {len(objects)} specs")
    return Call("submit_tasks", {"queue": _queue(queue), "specs": Jsonb(objects), "priority": _priority(priority),
                                 **_when(run_at), "unique_keys": keys, "max_attempts": _max_attempts(max_attempts)},
                each(Task.from_json, "task"))


def _get(rn: str | UUID) -> Call[Task]:
    """The task; TaskNotFound (PS200) when there is none."""
    return Call("get_task", {"rn": task_id(rn)}, value(Task.from_json))


def _list(queue: str | None = None, status: TaskStatus | None = None, owner: str | None = None,
          limit: int = 100) -> Call[list[Task]]:
    """Tasks matching every filter given (None: any), newest first, at most ``limit``."""
    if status is not None and status not in STATUSES:
        raise InvalidArgument(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
    return Call("list_tasks", {"queue": text("queue", queue, optional=True), "status": status,
                               "owner": text("owner", owner, optional=True),
                               "max_tasks": integer("limit", limit, 1, 2**31 - 1)}, each(Task.from_json, "task"))


def _cancel(rn: str | UUID) -> Call[Task]:
    """Cancel a scheduled, ready or running task; its worker is told at once. TaskFinished
    (PS209) when it is already completed or aborted."""
    return Call("cancel_task", {"rn": task_id(rn)}, value(Task.from_json))


def _retry(rn: str | UUID) -> Call[Task]:
    """Requeue an aborted or cancelled task: ready again with its attempts reset and its errors
    kept. TaskNotRequeueable (PS211) for any other status; UniqueKeyTaken (PS214) when another
    live task holds its unique key."""
    return Call("retry_task", {"rn": task_id(rn)}, value(Task.from_json))


def _retry_many(queue: str, status: Literal["aborted", "cancelled"] = "aborted", limit: int = 100) -> Call[list[Task]]:
    """Requeue up to ``limit`` (1..10000) tasks of ``queue`` in ``status`` that this role may act
    on, those finished longest ago first; call again while it returns ``limit`` tasks."""
    return Call("retry_tasks", {"queue": _queue(queue), "status": choice("status", status, ("aborted", "cancelled")),
                                "max_tasks": integer("limit", limit, 1, 10_000)}, each(Task.from_json, "task"))


def _pause_queue(queue: str, note: str | None = None) -> Call[QueueState]:
    """Pause ``queue``: its workers lease nothing from their next lease on (running tasks
    finish; submits go on). The pause belongs to this role."""
    return Call("pause_queue", {"queue": _queue(queue), "note": text("note", note, optional=True)},
                value(QueueState.from_json))


def _resume_queue(queue: str) -> Call[QueueState]:
    """Resume ``queue`` (paused by this role, or as admin) and wake its workers."""
    return Call("resume_queue", {"queue": _queue(queue)}, value(QueueState.from_json))


class TaskClient(SyncClient):
    """Submit, view, cancel and requeue tasks, pause and resume queues (role pyscheduler_client): ``TaskClient(db)`` on a
    ``Database``, or ``TaskClient(conn)`` on the application's psycopg connection or cursor,
    in its transaction (the task exists only if the application commits)."""

    submit = sync(_submit)
    submit_many = sync(_submit_many)
    get = sync(_get)
    list = sync(_list)
    cancel = sync(_cancel)
    retry = sync(_retry)
    retry_many = sync(_retry_many)
    pause_queue = sync(_pause_queue)
    resume_queue = sync(_resume_queue)


class AsyncTaskClient(AsyncClient):
    """``TaskClient`` for asyncio, on the application's psycopg ``AsyncConnection`` or
    ``AsyncCursor``, in its transaction: ``await AsyncTaskClient(conn).submit(...)``."""

    submit = asynchronous(_submit)
    submit_many = asynchronous(_submit_many)
    get = asynchronous(_get)
    list = asynchronous(_list)
    cancel = asynchronous(_cancel)
    retry = asynchronous(_retry)
    retry_many = asynchronous(_retry_many)
    pause_queue = asynchronous(_pause_queue)
    resume_queue = asynchronous(_resume_queue)
