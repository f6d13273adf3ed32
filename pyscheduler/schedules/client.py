"""The client of recurring schedules: create, update, pause, resume, trigger, delete,
get, list, runs, next (docs/sql-api.md, "Recurring schedules").

``ScheduleClient(db)`` runs on pyscheduler's pool; ``ScheduleClient(conn)`` on the
application's own psycopg connection or cursor, inside its transaction (a schedule
created there exists only if the application commits; ``AsyncScheduleClient(conn)``
for asyncio). Results are :class:`Schedule` and :class:`ScheduleRun` objects. A schedule
belongs to the role that created it: another role sees it without its ``target``,
``payload``, ``task_options`` and ``last_error`` (None), and its runs without ``error`` and ``task_rn``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, get_args
from uuid import UUID

from ..calls import (INT32, INT64, AsyncClient, Call, SyncClient, asynchronous, aware, boolean, choice, duration,
                     each, instant, integer, interval, json_value, required_instant, required_interval, sync, text,
                     uuid_or_none)
from ..db import Untyped
from . import sqlapi as sql

__all__ = ["UNBOUNDED", "AsyncScheduleClient", "Overlap", "RunOutcome", "Schedule", "ScheduleClient", "ScheduleRun",
           "TargetKind"]

TargetKind = Literal["kafka", "http", "task"]
Overlap = Literal["allow", "skip", "buffer_one"]
RunOutcome = Literal["fired", "failed", "skipped_overlap", "missed"]
TARGET_KINDS: tuple[str, ...] = get_args(TargetKind)
OVERLAPS: tuple[str, ...] = get_args(Overlap)
OUTCOMES: tuple[str, ...] = get_args(RunOutcome)


class Unbounded(enum.Enum):
    """``update(..., start_at=UNBOUNDED, end_at=UNBOUNDED, max_runs=UNBOUNDED)`` removes the bound."""

    UNBOUNDED = "unbounded"


UNBOUNDED = Unbounded.UNBOUNDED


@dataclass(frozen=True, slots=True)
class Schedule:
    """A schedule as ``get_schedule`` returns it: instants as datetimes in UTC, intervals as
    timedeltas. ``next_run_at`` None: the schedule has ended (``ended_note`` says why).

    ``task_options``: the ``submit_task`` options of the tasks a task target submits
    (``max_attempts``, ``concurrency_key``; None: none).

    ``target``, ``payload``, ``task_options`` and ``last_error`` are None for a caller that may not see the
    schedule's details (not its owner, a member of the owner, or admin); ``target`` is None
    exactly then (``details_hidden``)."""

    id: int
    name: str
    owner: str
    every: timedelta | None
    cron: str | None
    tz: str
    start_at: datetime | None
    end_at: datetime | None
    max_runs: int | None
    target_kind: TargetKind
    target: str | None
    priority: int
    payload: Any
    task_options: dict[str, Any] | None
    retry_attempts: int
    retry_base: timedelta
    retry_jitter: timedelta
    critical: bool
    catchup_window: timedelta
    overlap: Overlap
    paused: bool
    paused_note: str | None
    next_run_at: datetime | None
    trigger_at: datetime | None
    due_at: datetime | None
    ended_note: str | None
    runs_count: int
    fired_count: int
    failed_count: int
    skipped_count: int
    missed_count: int
    consecutive_failures: int
    last_expected_at: datetime | None
    last_outcome: RunOutcome | None
    last_error: str | None
    created: datetime
    updated: datetime

    @property
    def details_hidden(self) -> bool:
        """True when the caller may not see the target, payload and errors (another role's schedule)."""
        return self.target is None

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Schedule:
        """From the jsonb the SQL functions return, whatever the session's TimeZone and
        IntervalStyle (keys they add later are ignored)."""
        return cls(
            id=int(obj["id"]), name=obj["name"], owner=obj["owner"], every=interval(obj.get("every")),
            cron=obj.get("cron"), tz=obj["tz"], start_at=instant(obj.get("start_at")),
            end_at=instant(obj.get("end_at")), max_runs=obj.get("max_runs"), target_kind=obj["target_kind"],
            target=obj.get("target"), priority=int(obj["priority"]), payload=obj.get("payload"),
            task_options=obj.get("task_options"),
            retry_attempts=int(obj["retry_attempts"]), retry_base=required_interval(obj["retry_base"]),
            retry_jitter=required_interval(obj["retry_jitter"]), critical=bool(obj["critical"]),
            catchup_window=required_interval(obj["catchup_window"]), overlap=obj["overlap"],
            paused=bool(obj["paused"]), paused_note=obj.get("paused_note"), next_run_at=instant(obj.get("next_run_at")),
            trigger_at=instant(obj.get("trigger_at")), due_at=instant(obj.get("due_at")),
            ended_note=obj.get("ended_note"), runs_count=int(obj["runs_count"]), fired_count=int(obj["fired_count"]),
            failed_count=int(obj["failed_count"]), skipped_count=int(obj["skipped_count"]),
            missed_count=int(obj["missed_count"]), consecutive_failures=int(obj["consecutive_failures"]),
            last_expected_at=instant(obj.get("last_expected_at")), last_outcome=obj.get("last_outcome"),
            last_error=obj.get("last_error"), created=required_instant(obj["created"]),
            updated=required_instant(obj["updated"]))


@dataclass(frozen=True, slots=True)
class ScheduleRun:
    """A recorded execution (``schedule_runs``): ``lateness`` = ``fired_at - expected_at``;
    ``missed_count`` on a ``missed`` row: how many occurrences it stands for. ``error`` and
    ``task_rn`` are None for a caller that may not see the schedule's details."""

    expected_at: datetime
    outcome: RunOutcome
    triggered: bool
    attempts: int
    fired_at: datetime
    lateness: timedelta | None
    missed_count: int | None
    error: str | None
    task_rn: UUID | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ScheduleRun:
        return cls(expected_at=required_instant(row["expected_at"]), outcome=row["outcome"],
                   triggered=row["triggered"], attempts=row["attempts"], fired_at=required_instant(row["fired_at"]),
                   lateness=interval(row["lateness"]), missed_count=row["missed_count"], error=row["error"],
                   task_rn=uuid_or_none(row["task_rn"]))


def _name(name: str) -> str:
    return str(text("name", name))


def _bound(name: str, at: datetime | Unbounded | None, unbounded: str) -> Any:
    return Untyped(unbounded) if at is UNBOUNDED else aware(name, at, optional=True)


def _fields(*, target: str | None, every: timedelta | None, cron: str | None, tz: str | None,
            target_kind: TargetKind | None, payload: Any, priority: int | None, retry_attempts: int | None,
            retry_base: timedelta | None, retry_jitter: timedelta | None, critical: bool | None,
            catchup_window: timedelta | None, overlap: Overlap | None,
            task_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The arguments create and update share, checked (None: not given)."""
    args = {
        "target": text("target", target, optional=True), "every": duration("every", every, optional=True),
        "cron": text("cron", cron, optional=True), "tz": text("tz", tz, optional=True),
        "target_kind": choice("target_kind", target_kind, TARGET_KINDS, optional=True),
        "payload": None if payload is None else json_value("payload", payload),
        "priority": integer("priority", priority, -INT64, INT64, optional=True),
        "retry_attempts": integer("retry_attempts", retry_attempts, -INT32, INT32, optional=True),
        "retry_base": duration("retry_base", retry_base, optional=True),
        "retry_jitter": duration("retry_jitter", retry_jitter, optional=True),
        "critical": boolean("critical", critical, optional=True),
        "catchup_window": duration("catchup_window", catchup_window, optional=True),
        "overlap": choice("overlap", overlap, OVERLAPS, optional=True),
        "task_options": None if task_options is None else json_value("task_options", task_options)}
    return args


def _given(args: dict[str, Any]) -> dict[str, Any]:
    """Only the arguments given: the others keep the SQL function's default."""
    return {k: v for k, v in args.items() if v is not None}


# -- the calls: one function each, a method of both clients ----------------------------------

def _create(name: str, target: str, *, every: timedelta | None = None, cron: str | None = None,
            tz: str | None = None, target_kind: TargetKind | None = None, payload: Any = None,
            priority: int | None = None, start_at: datetime | None = None, end_at: datetime | None = None,
            max_runs: int | None = None, retry_attempts: int | None = None, retry_base: timedelta | None = None,
            retry_jitter: timedelta | None = None, critical: bool | None = None,
            catchup_window: timedelta | None = None, overlap: Overlap | None = None, paused: bool | None = None,
            paused_note: str | None = None, task_options: Mapping[str, Any] | None = None) -> Call[Schedule]:
    """Create a schedule owned by the calling role: exactly one of ``every`` and ``cron`` (in
    ``tz``, an IANA name, default UTC); ``target`` is a Kafka topic (``target_kind`` "kafka", the
    default), an HTTP URL ("http") or a task queue ("task"). Arguments left None take
    ``create_schedule``'s defaults (docs/sql-api.md): payload {}, priority 50, retry 3 tries of
    200 ms base and 500 ms jitter, catchup_window 1 minute, overlap "allow", no task_options (a task
    target's ``{"max_attempts": n, "concurrency_key": "..."}`` for the tasks it submits). Its first run is the
    first occurrence at or after now (and ``start_at``). InvalidSchedule (PS301-PS314) names
    what is wrong; ScheduleExists (PS311) when the name is taken."""
    args = {"name": _name(name), **_fields(
        target=target, every=every, cron=cron, tz=tz, target_kind=target_kind, payload=payload, priority=priority,
        retry_attempts=retry_attempts, retry_base=retry_base, retry_jitter=retry_jitter, critical=critical,
        catchup_window=catchup_window, overlap=overlap, task_options=task_options),
        "start_at": aware("start_at", start_at, optional=True), "end_at": aware("end_at", end_at, optional=True),
        "max_runs": integer("max_runs", max_runs, -INT64, INT64, optional=True),
        "paused": boolean("paused", paused, optional=True),
        "paused_note": text("paused_note", paused_note, optional=True)}
    return Call(sql.CREATE_SCHEDULE, _given(args), Schedule.from_json, scalar=True)


def _update(name: str, *, target: str | None = None, every: timedelta | None = None, cron: str | None = None,
            tz: str | None = None, target_kind: TargetKind | None = None, payload: Any = None,
            priority: int | None = None, start_at: datetime | Unbounded | None = None,
            end_at: datetime | Unbounded | None = None, max_runs: int | Unbounded | None = None,
            retry_attempts: int | None = None, retry_base: timedelta | None = None,
            retry_jitter: timedelta | None = None, critical: bool | None = None,
            catchup_window: timedelta | None = None, overlap: Overlap | None = None,
            task_options: Mapping[str, Any] | None = None) -> Call[Schedule]:
    """Change the arguments given (None: unchanged); ``every`` replaces ``cron`` and vice versa;
    ``UNBOUNDED`` removes ``start_at``, ``end_at`` or ``max_runs``; ``task_options={}`` removes the
    task options. A timing change recomputes the
    next run from now. Only the owner, its members and admin (PermissionDenied otherwise)."""
    args = {"name": _name(name), **_fields(
        target=target, every=every, cron=cron, tz=tz, target_kind=target_kind, payload=payload, priority=priority,
        retry_attempts=retry_attempts, retry_base=retry_base, retry_jitter=retry_jitter, critical=critical,
        catchup_window=catchup_window, overlap=overlap, task_options=task_options),
        "start_at": _bound("start_at", start_at, "-infinity"), "end_at": _bound("end_at", end_at, "infinity"),
        "max_runs": 0 if max_runs is UNBOUNDED else integer("max_runs", max_runs, 1, INT64, optional=True)}
    return Call(sql.UPDATE_SCHEDULE, _given(args), Schedule.from_json, scalar=True)


def _pause(name: str, note: str | None = None) -> Call[Schedule]:
    """Stop regular firing until ``resume`` (a pending trigger still fires); ``note`` says why."""
    return Call(sql.PAUSE_SCHEDULE, {"name": _name(name), "note": text("note", note, optional=True)},
                Schedule.from_json, scalar=True)


def _resume(name: str) -> Call[Schedule]:
    """Fire again from the first occurrence at or after now (the paused ones are skipped)."""
    return Call(sql.RESUME_SCHEDULE, {"name": _name(name)}, Schedule.from_json, scalar=True)


def _trigger(name: str) -> Call[Schedule]:
    """Fire once now, out of band (also while paused or ended); the regular next run stays."""
    return Call(sql.TRIGGER_SCHEDULE, {"name": _name(name)}, Schedule.from_json, scalar=True)


def _delete(name: str) -> Call[bool]:
    """Delete the schedule and its executions; False when there was none."""
    return Call(sql.DELETE_SCHEDULE, {"name": _name(name)}, bool, scalar=True)


def _get(name: str) -> Call[Schedule]:
    """The schedule; ScheduleNotFound (PS300) when there is none."""
    return Call(sql.GET_SCHEDULE, {"name": _name(name)}, Schedule.from_json, scalar=True)


def _list(name_like: str | None = None, target_kind: TargetKind | None = None, paused: bool | None = None,
          critical: bool | None = None, limit: int = 100, after_name: str | None = None) -> Call[list[Schedule]]:
    """Schedules matching every filter given (None: any; ``name_like`` a LIKE pattern), by name.
    The next page: ``after_name`` = the last name of this one (keyset)."""
    return Call(sql.LIST_SCHEDULES, {
        "name_like": text("name_like", name_like, optional=True),
        "target_kind": choice("target_kind", target_kind, TARGET_KINDS, optional=True),
        "paused": boolean("paused", paused, optional=True), "critical": boolean("critical", critical, optional=True),
        "max_schedules": integer("limit", limit, 1, INT32),
        "after_name": text("after_name", after_name, optional=True)}, each(Schedule.from_json, "schedule"))


def _runs(name: str, outcome: RunOutcome | None = None, since: datetime | None = None,
          limit: int = 100, before: datetime | None = None) -> Call[list[ScheduleRun]]:
    """Recorded executions, newest expected time first (only ``outcome``, only expected at or
    after ``since``). The next page: ``before`` = the last ``expected_at`` of this one (keyset)."""
    return Call(sql.SCHEDULE_RUNS, {"name": _name(name),
                                    "with_outcome": choice("outcome", outcome, OUTCOMES, optional=True),
                                    "since": aware("since", since, optional=True),
                                    "max_runs": integer("limit", limit, 1, INT32),
                                    "before": aware("before", before, optional=True)}, each(ScheduleRun.from_row))


def _next(name: str, n: int = 10) -> Call[list[datetime]]:
    """The next ``n`` fire times (honouring ``end_at`` and ``max_runs``; none while paused)."""
    return Call(sql.UPCOMING_RUNS, {"name": _name(name), "n": integer("n", n, 1, INT32)},
                each(required_instant, "run_at"))


def _count(name: str, outcome: RunOutcome | Literal["runs"] = "fired") -> Call[int]:
    """How many occurrences ended with ``outcome`` (``runs``: what ``max_runs`` counts); kept
    when old executions are purged."""
    return Call(sql.EXECUTION_COUNT, {"name": _name(name), "outcome": choice("outcome", outcome, (*OUTCOMES, "runs"))},
                int, scalar=True)


class ScheduleClient(SyncClient):
    """Recurring schedules (role pyscheduler_client): ``ScheduleClient(db)`` on a ``Database``,
    or ``ScheduleClient(conn)`` on the application's psycopg connection or cursor, in its
    transaction."""

    create = sync(_create)
    update = sync(_update)
    pause = sync(_pause)
    resume = sync(_resume)
    trigger = sync(_trigger)
    delete = sync(_delete)
    get = sync(_get)
    list = sync(_list)
    runs = sync(_runs)
    next = sync(_next)
    count = sync(_count)


class AsyncScheduleClient(AsyncClient):
    """``ScheduleClient`` for asyncio, on the application's psycopg ``AsyncConnection`` or
    ``AsyncCursor``."""

    create = asynchronous(_create)
    update = asynchronous(_update)
    pause = asynchronous(_pause)
    resume = asynchronous(_resume)
    trigger = asynchronous(_trigger)
    delete = asynchronous(_delete)
    get = asynchronous(_get)
    list = asynchronous(_list)
    runs = asynchronous(_runs)
    next = asynchronous(_next)
    count = asynchronous(_count)
