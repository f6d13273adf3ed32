"""The client side of leased tasks: submit, view, cancel (seeds/scylla.md).

``TaskClient(db)`` runs on pyscheduler's pool; ``TaskClient(conn)`` on the
application's own psycopg connection or cursor, inside its transaction: a task
submitted there exists only if the application commits (``AsyncTaskClient(conn)``
for asyncio). Results are :class:`Task` objects. Clients have no identity: any
client may view or cancel any task.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, get_args
from uuid import UUID

from ..calls import (AsyncClient, Call, SyncClient, asynchronous, each, instant, integer, json_object,
                     required_instant, sync, text, value)
from ..db import Jsonb
from ..errors import InvalidArgument

__all__ = ["MAX_PRIORITY", "STATUSES", "AsyncTaskClient", "HistoryEntry", "Task", "TaskClient", "TaskError",
           "TaskStatus"]

MAX_PRIORITY = 4_294_967_295
TaskStatus = Literal["ready", "running", "completed", "aborted", "cancelled"]
STATUSES: tuple[TaskStatus, ...] = get_args(TaskStatus)


@dataclass(frozen=True, slots=True)
class TaskError:
    """An entry of a task's ``errors``: what aborted it (``Abort(code, description, args)``)."""

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
    ``TaskTimeout``, ``TaskYield``, ...), ``worker`` the lease's worker, ``time`` when it happened,
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
    ``updated`` (UTC), ``errors`` (why it was aborted), ``owner`` (the worker holding or that
    last held it), ``deadline`` (of the current lease, UTC) and ``history``.

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
    json: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Task:
        """From the jsonb the SQL functions return (keys they add later are ignored)."""
        return cls(rn=UUID(obj["rn"]), queue=obj["queue"], spec=obj["spec"], priority=int(obj["priority"]),
                   status=obj["status"], progress=float(obj["progress"]), created=required_instant(obj["created"]),
                   updated=required_instant(obj["updated"]),
                   errors=[TaskError.from_json(e) for e in obj.get("errors") or ()], owner=obj.get("owner"),
                   deadline=instant(obj.get("deadline")),
                   history=[HistoryEntry.from_json(h) for h in obj.get("history") or ()], json=obj)

    def __getitem__(self, key: str) -> Any:
        """A key of the seed's JSON shape (``json``)."""
        return self.json[key]


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

def _submit(queue: str, spec: Mapping[str, Any], priority: int = 50) -> Call[Task]:
    """Submit one ready task to ``queue``; idle workers of the queue are woken at once."""
    return Call("submit_task", {"queue": _queue(queue), "spec": json_object("spec", spec),
                                "priority": _priority(priority)}, value(Task.from_json))


def _submit_many(queue: str, specs: Iterable[Mapping[str, Any]], priority: int = 50) -> Call[list[Task]]:
    """Submit many tasks of one queue and priority in one statement; they lease in this order."""
    objects = [json_object(f"specs[{i}]", s).obj for i, s in enumerate(specs)]
    return Call("submit_tasks", {"queue": _queue(queue), "specs": Jsonb(objects), "priority": _priority(priority)},
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
    """Cancel a ready or running task (terminal); its worker is told at once. TaskFinished
    (PS209) when it is already completed or aborted."""
    return Call("cancel_task", {"rn": task_id(rn)}, value(Task.from_json))


class TaskClient(SyncClient):
    """Submit, view and cancel tasks (role pyscheduler_client): ``TaskClient(db)`` on a
    ``Database``, or ``TaskClient(conn)`` on the application's psycopg connection or cursor,
    in its transaction (the task exists only if the application commits)."""

    submit = sync(_submit)
    submit_many = sync(_submit_many)
    get = sync(_get)
    list = sync(_list)
    cancel = sync(_cancel)


class AsyncTaskClient(AsyncClient):
    """``TaskClient`` for asyncio, on the application's psycopg ``AsyncConnection`` or
    ``AsyncCursor``, in its transaction: ``await AsyncTaskClient(conn).submit(...)``."""

    submit = asynchronous(_submit)
    submit_many = asynchronous(_submit_many)
    get = asynchronous(_get)
    list = asynchronous(_list)
    cancel = asynchronous(_cancel)
