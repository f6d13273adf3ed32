"""The client of future checks: add, delete, list, history (docs/sql-api.md, "Future checks").

``CheckClient(db)`` runs on pyscheduler's pool; ``CheckClient(conn)`` on the
application's own psycopg connection or cursor, inside its transaction: a check added
there exists only if the application commits, e.g. in the transaction that inserts the
order it watches (``AsyncCheckClient(conn)`` for asyncio). Pending checks are the
runner's :class:`~pyscheduler.checks.handlers.Check`; ended ones :class:`EndedCheck`.

A check belongs to the role that added it: another role sees it with ``payload`` (and,
in the history, ``error``) None.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, get_args

from ..calls import (INT32, AsyncClient, Call, SyncClient, asynchronous, aware, choice, duration, each, instant,
                     integer, interval, json_value, one, required_instant, required_interval, sync, text)
from ..errors import InvalidArgument
from . import sqlapi as sql
from .handlers import Check

__all__ = ["AddedCheck", "AsyncCheckClient", "Check", "CheckClient", "CheckKind", "CheckOutcome", "EndedCheck"]

CheckKind = Literal["sql", "python", "task"]
CheckOutcome = Literal["done", "max_checks", "horizon", "past", "timeout", "error", "deleted"]
KINDS: tuple[str, ...] = get_args(CheckKind)


@dataclass(frozen=True, slots=True)
class AddedCheck:
    """What ``add`` did: the check's ``id`` and slot (``next_check_at``, UTC); ``added`` True for
    a new check, False when the same (entity, job) was already pending (unchanged), None when a
    runner holds the pending one right now (the add becomes a new check if that run ends it)."""

    id: int
    next_check_at: datetime
    added: bool | None


@dataclass(frozen=True, slots=True)
class EndedCheck:
    """A check that left (``check_history``), newest first: its ``outcome``, the first and last
    check slot, how many runs, the time its last run and all runs took. ``payload`` and
    ``error`` are None for a caller that may not see another role's check's details."""

    id: int
    entity_name: str
    entity_key: str
    job: str
    kind: CheckKind
    payload: Any
    first_check_at: datetime
    last_check_at: datetime | None
    check_count: int
    outcome: CheckOutcome
    error: str | None
    last_took: timedelta | None
    total_took: timedelta
    created: datetime
    ended: datetime
    owner: str

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> EndedCheck:
        return cls(id=row["id"], entity_name=row["entity_name"], entity_key=row["entity_key"], job=row["job"],
                   kind=row["kind"], payload=row["payload"], first_check_at=required_instant(row["first_check_at"]),
                   last_check_at=instant(row["last_check_at"]), check_count=row["check_count"],
                   outcome=row["outcome"], error=row["error"], last_took=interval(row["last_took"]),
                   total_took=required_interval(row["total_took"]), created=required_instant(row["created"]),
                   ended=required_instant(row["ended"]), owner=row["owner"])


def pending(row: Mapping[str, Any]) -> Check:
    """A pending check from a ``future_check`` row, its times in UTC."""
    return Check.from_row({**row, **{k: required_instant(row[k]) for k in ("first_check_at", "next_check_at",
                                                                            "created")}})


def _added(row: Mapping[str, Any]) -> AddedCheck:
    return AddedCheck(row["id"], required_instant(row["next_check_at"]), row["added"])


def _filters(entity_name: str | None, entity_key: str | None, job: str | None, limit: int) -> dict[str, Any]:
    if entity_key is not None and entity_name is None:
        raise InvalidArgument("entity_key needs entity_name (a key names an entity of one kind)")
    return {"entity_name": text("entity_name", entity_name, optional=True),
            "entity_key": text("entity_key", entity_key, optional=True), "job": text("job", job, optional=True),
            "max": integer("limit", limit, 1, INT32)}


# -- the calls: one function each, a method of both clients ----------------------------------

def _add(entity_name: str, entity_key: str, job: str, *, check_at: datetime | None = None,
         check_after: timedelta | None = None, payload: Any = None, kind: CheckKind = "sql",
         max_checks: int | None = None, horizon: timedelta | None = None) -> Call[AddedCheck]:
    """Check ``entity_name``/``entity_key`` with ``job`` at ``check_at`` or after ``check_after``
    (exactly one), rounded up to a slot. ``job``: a SQL function ``schema.job(pyscheduler.future_check)
    RETURNS timestamptz`` (kind "sql"), a handler name registered with the runner ("python") or a
    task queue ("task"). Idempotent per (entity, job) while pending; ``max_checks`` and
    ``horizon`` default to the settings. The check belongs to the calling role."""
    if (check_at is None) == (check_after is None):
        raise InvalidArgument("give exactly one of check_at and check_after")
    return Call(sql.ADD_CHECK, {
        "entity_name": text("entity_name", entity_name), "entity_key": text("entity_key", entity_key),
        "job": text("job", job), "check_at": aware("check_at", check_at, optional=True),
        "check_after": duration("check_after", check_after, optional=True),
        "payload": None if payload is None else json_value("payload", payload), "kind": choice("kind", kind, KINDS),
        "max_checks": integer("max_checks", max_checks, -INT32, INT32, optional=True),
        "horizon": duration("horizon", horizon, optional=True)}, one(_added))


def _delete(entity_name: str, entity_key: str, job: str | None = None) -> Call[int]:
    """Delete the entity's pending checks (of ``job``, or all) that the caller may act on; how many.
    A check a runner holds right now is ended by that runner (never waited for)."""
    return Call(sql.DELETE_CHECKS, {"entity_name": text("entity_name", entity_name),
                                    "entity_key": text("entity_key", entity_key),
                                    "job": text("job", job, optional=True)}, int, scalar=True)


def _cursor(name: str, row: Check | EndedCheck | None) -> tuple[datetime | None, int | None]:
    """A page's last row as the keyset cursor of the next page (list_checks: next_check_at and id;
    check_history: ended and id)."""
    if row is None:
        return None, None
    if isinstance(row, Check):
        return row.next_check_at, row.id
    if isinstance(row, EndedCheck):
        return row.ended, row.id
    raise InvalidArgument(f"{name} must be the last row of a page, got {type(row).__name__}")


def _list(entity_name: str | None = None, entity_key: str | None = None, job: str | None = None,
          limit: int = 100, after: Check | None = None) -> Call[list[Check]]:
    """Pending checks matching every filter given (None: any), soonest first. The next page:
    ``after`` = the last check of this one (keyset on next_check_at and id)."""
    at, id_ = _cursor("after", after)
    return Call(sql.LIST_CHECKS, {**_filters(entity_name, entity_key, job, limit), "after_at": at, "after_id": id_},
                each(pending))


def _history(entity_name: str | None = None, entity_key: str | None = None, job: str | None = None,
             limit: int = 100, before: EndedCheck | None = None) -> Call[list[EndedCheck]]:
    """Checks that ended, matching every filter given (None: any), newest first. The next page:
    ``before`` = the last row of this one (keyset on ended and id)."""
    at, id_ = _cursor("before", before)
    return Call(sql.CHECK_HISTORY, {**_filters(entity_name, entity_key, job, limit), "before_at": at, "before_id": id_},
                each(EndedCheck.from_row))


class CheckClient(SyncClient):
    """Future checks (role pyscheduler_client): ``CheckClient(db)`` on a ``Database``, or
    ``CheckClient(conn)`` on the application's psycopg connection or cursor, in its transaction."""

    add = sync(_add)
    delete = sync(_delete)
    list = sync(_list)
    history = sync(_history)


class AsyncCheckClient(AsyncClient):
    """``CheckClient`` for asyncio, on the application's psycopg ``AsyncConnection`` or ``AsyncCursor``."""

    add = asynchronous(_add)
    delete = asynchronous(_delete)
    list = asynchronous(_list)
    history = asynchronous(_history)
