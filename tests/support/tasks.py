"""Helpers of the leased tasks' tests: the SQL functions called on a fixed clock, and what a
test reads of a task."""

from __future__ import annotations

from datetime import datetime, timedelta

from pyscheduler.db import Jsonb

T0 = datetime.fromisoformat("2030-01-01T00:00:00+00:00")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def call(db, fn, now=None, **kw):
    """A tasks function; with ``now``, its private twin ``_fn(..., p_now)``: public
    functions take no clock, the private ones are granted to no role (tests only)."""
    if now is not None:
        return db.call(f"_{fn}", p_now=now, **kw)
    return db.call(fn, **kw)


def value(db, fn, now=None, **kw):
    rows = call(db, fn, now, **kw)
    return next(iter(rows[0].values())) if rows else None


def submit(db, queue="q", spec=None, now=None, **kw):
    return value(db, "submit_task", now, queue=queue, spec=Jsonb(spec or {"n": 1}), **kw)


def lease(db, queue="q", worker="w1", now=None, **kw):
    return value(db, "lease_task", now, queue=queue, worker=worker, **kw)


def held(task):
    """rn and token of a leased task: what the lease holder's writes need."""
    return {"rn": task["rn"], "token": task["token"]}


def code_of(exc_info) -> str:
    return exc_info.value.sqlstate


def types_of(task):
    """The kinds of a task's history entries, oldest first."""
    return [h["_typ"] for h in task["history"]]


def status(client, rn):
    return client.get(rn)["status"]


def logged(caplog, text: str) -> bool:
    return any(text in r.getMessage() for r in list(caplog.records))
