"""Task jobs: a check whose job kind is ``task`` runs on the leased-task workers.

``submit_check_tasks`` submits a task whose spec is ``{"check": {...}, "claim":
uuid}``; :func:`task_handler` turns a check handler into a task handler that
runs it and reports with ``finish_check(id, claim => ...)`` (the claim is the
worker's proof). Use it with the tasks ``Worker``::

    Worker(dsn, "slow-checks", task_handler(db, my_check), timeout=60).run(stop)
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from ..db import Database
from ..errors import CheckNotTaken
from . import sqlapi as sql
from .handlers import Check, Handler, run_handler

log = logging.getLogger(__name__)

def check_of(spec: dict[str, Any]) -> Check:
    """The Check carried by a task job's spec."""
    row = dict(spec["check"])
    row.setdefault("kind", "task")
    return Check.from_json(row)


def task_handler(db: Database, fn: Handler):
    """A tasks-Worker handler that runs ``fn(check)`` and records its result."""

    def handle(ctx) -> None:
        check = check_of(ctx.spec)
        result = run_handler(fn, check)
        try:
            db.call(sql.FINISH_CHECK, id=check.id, next_check_at=result.next_check_at, error=result.error,
                    took=timedelta(seconds=result.took), claim=ctx.spec["claim"])
        except CheckNotTaken:
            log.warning("check %s ended meanwhile (deleted, or its task timed out); result dropped", check.id)

    return handle
