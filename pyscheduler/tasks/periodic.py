"""Periodic task functions: ``@app.periodic(cron=... | every=...)`` declares a recurring schedule
whose target submits the task (a schedule with target kind ``task``: queue = the task's queue,
payload = the spec ``{"task": name, "args": {...}}``, task_options = the function's
``max_attempts`` and ``concurrency_key``), and ``sync`` creates or updates the
declared schedules and reports what changed; it deletes nothing."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from ..errors import InvalidArgument, ScheduleExists, ScheduleNotFound
from ..schedules.client import Overlap, Schedule, ScheduleClient
from .functions import TaskFunction

log = logging.getLogger(__name__)

Change = Literal["created", "updated", "unchanged"]


@dataclass(frozen=True, slots=True)
class Periodic:
    """A declared schedule of a task function (``@app.periodic``)."""

    name: str
    function: TaskFunction[Any, Any]
    cron: str | None
    every: timedelta | None
    timezone: str
    args: dict[str, Any]
    overlap: Overlap

    @property
    def payload(self) -> dict[str, Any]:
        return {"task": self.function.name, "args": self.args}

    def matches(self, s: Schedule, task_options: dict[str, Any]) -> bool:
        """Whether schedule ``s`` is this declaration already (a time zone in any case), with
        these task options."""
        return (s.target_kind == "task" and s.target == self.function.queue and s.cron == self.cron
                and s.every == self.every and s.tz.lower() == self.timezone.lower() and s.payload == self.payload
                and s.priority == self.function.priority and s.overlap == self.overlap
                and (s.task_options or {}) == task_options)


def declare(function: TaskFunction[Any, Any], *, name: str | None, cron: str | None, every: timedelta | None,
            timezone: str, args: dict[str, Any] | None, overlap: Overlap) -> Periodic:
    """A declaration, checked as far as Python can (the schedule's own checks run at sync)."""
    if (cron is None) == (every is None):
        raise InvalidArgument(f"periodic task {function.name}: give exactly one of cron and every")
    given = function.arguments((), args or {})
    return Periodic(name or function.name, function, cron, every, timezone, given, overlap)


@dataclass(frozen=True, slots=True)
class SyncReport:
    """What ``TaskApp.sync_schedules()`` did, by schedule name: ``created``, ``updated``,
    ``unchanged``; ``removed``: schedules of task functions (a task target whose payload names
    a ``task``) of the app's role (an admin role sees every role's) that no declaration of
    the app names, left as they are (``ScheduleClient.delete``, ``pyscheduler schedules
    delete``)."""

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated)


def sync(client: ScheduleClient, declared: Iterable[Periodic]) -> SyncReport:
    """Create or update each declared schedule (idempotent: a second run changes nothing), then
    find the removed ones (see SyncReport)."""
    report = SyncReport()
    names = set()
    for p in declared:
        names.add(p.name)
        getattr(report, _one(client, p)).append(p.name)
    after: str | None = None
    while True:
        page = client.list(target_kind="task", limit=500, after_name=after)
        for s in page:
            # another role's schedule shows no payload
            if s.name not in names and isinstance(s.payload, dict) and isinstance(s.payload.get("task"), str):
                report.removed.append(s.name)
        if len(page) < 500:
            break
        after = page[-1].name
    if report.removed:
        log.warning("schedules no longer declared, left in place: %s", ", ".join(report.removed))
    return report


def _one(client: ScheduleClient, p: Periodic) -> Change:
    options = p.function.schedule_options(p.args)  # {}: none (update clears them)
    fields: dict[str, Any] = {"target_kind": "task", "tz": p.timezone, "payload": p.payload,
                              "priority": p.function.priority, "overlap": p.overlap, "task_options": options}
    timing: dict[str, Any] = {"cron": p.cron} if p.cron is not None else {"every": p.every}
    try:
        current = client.get(p.name)
    except ScheduleNotFound:
        try:
            client.create(p.name, p.function.queue, **timing, **fields)
            log.info("periodic task %s: created schedule %s", p.function.name, p.name)
            return "created"
        except ScheduleExists:  # another process created it meanwhile
            current = client.get(p.name)
    if p.matches(current, options):
        return "unchanged"
    client.update(p.name, target=p.function.queue, **timing, **fields)
    log.info("periodic task %s: updated schedule %s", p.function.name, p.name)
    return "updated"
