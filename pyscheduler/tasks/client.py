"""The client side of leased tasks: submit, view, cancel (seeds/scylla.md).

Clients have no identity: any client may view or cancel any task. Tasks are
dicts in the seed's JSON shape (``rn``, ``spec``, ``queue``, ``priority``,
``status``, ``progress``, ``created``, ``updated``, ``errors``, ``owner``,
``deadline``, ``history``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any
from uuid import UUID

from ..db import Database, Jsonb
from ..errors import InvalidArgument

MAX_PRIORITY = 4_294_967_295
STATUSES = ("scheduled", "ready", "running", "completed", "aborted", "cancelled")


def _bad_json(value: Any, path: str, depth: int = 0) -> str | None:
    """Why ``value`` (at ``path``) cannot be stored as jsonb, or None: NaN and infinities
    (JSON has no such numbers), NUL characters (jsonb cannot hold U+0000), unencodable
    surrogates, non-string keys, and anything json.dumps cannot write."""
    if depth > 1000:
        return f"{path} is nested too deeply"
    if value is None or isinstance(value, (bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path} is {value!r}: JSON has no NaN or infinity"
    if isinstance(value, str):
        if "\x00" in value:
            return f"{path} contains a NUL character (\\u0000), which PostgreSQL cannot store"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return f"{path} is not valid Unicode (a lone surrogate)"
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path} has a key that is not a string: {key!r}"
            why = _bad_json(key, f"{path} key {key!r}", depth + 1) or _bad_json(item, f"{path}[{key!r}]", depth + 1)
            if why:
                return why
        return None
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            why = _bad_json(item, f"{path}[{i}]", depth + 1)
            if why:
                return why
        return None
    return f"{path} is a {type(value).__name__}, which is not JSON"


def check_spec(spec: Any, what: str = "spec") -> Jsonb:
    """A spec as the SQL functions take it; InvalidArgument naming ``what`` (and the bad
    field inside it) otherwise. Never retryable: the same spec would fail again."""
    if not isinstance(spec, Mapping):
        raise InvalidArgument(f"{what} must be a JSON object (a dict), got {type(spec).__name__}")
    why = _bad_json(spec, what)
    if why:
        raise InvalidArgument(f"{what} is not storable JSON: {why}")
    try:
        json.dumps(spec, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidArgument(f"{what} is not JSON-serialisable: {exc}") from exc
    return Jsonb(dict(spec))


def check_priority(priority: Any) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= MAX_PRIORITY:
        raise InvalidArgument(f"priority must be an integer in 0..{MAX_PRIORITY}, got {priority!r}")
    return priority


class TaskClient:
    """Submit, view and cancel tasks through the SQL API (role pyscheduler_client)."""

    def __init__(self, db: Database):
        self.db = db

    def submit(self, queue: str, spec: Mapping[str, Any], priority: int = 50) -> dict[str, Any]:
        """Submit one ready task; idle workers of ``queue`` are woken at once."""
        return self.db.call_value("submit_task", queue=queue, spec=check_spec(spec),
                                  priority=check_priority(priority))

    def submit_many(self, queue: str, specs: Iterable[Mapping[str, Any]], priority: int = 50) -> list[dict[str, Any]]:
        """Submit many tasks of one queue and priority in one statement."""
        specs = [check_spec(s, f"specs[{i}]").obj for i, s in enumerate(specs)]
        rows = self.db.call("submit_tasks", queue=queue, specs=Jsonb(specs), priority=check_priority(priority))
        return [r["task"] for r in rows]

    def get(self, rn: str | UUID) -> dict[str, Any]:
        """The task; TaskNotFound (PS200) when there is none."""
        return self.db.call_value("get_task", rn=_rn(rn))

    def list(self, queue: str | None = None, status: str | None = None, owner: str | None = None,
             limit: int = 100) -> list[dict[str, Any]]:
        """Tasks matching every filter given, newest first."""
        if status is not None and status not in STATUSES:
            raise InvalidArgument(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
        rows = self.db.call("list_tasks", queue=queue, status=status, owner=owner, max_tasks=limit)
        return [r["task"] for r in rows]

    def cancel(self, rn: str | UUID) -> dict[str, Any]:
        """Cancel a ready or running task (terminal); its worker is told at once."""
        return self.db.call_value("cancel_task", rn=_rn(rn))


def _rn(rn: str | UUID) -> UUID:
    try:
        return rn if isinstance(rn, UUID) else UUID(str(rn))
    except ValueError as exc:
        raise InvalidArgument(f"rn must be a task id (a UUID), got {rn!r}") from exc
