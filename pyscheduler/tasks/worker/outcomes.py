"""What a handler's end means: a return completes its task (its value the result), ``Abort``
aborts it, ``Retry`` and any other exception fail the attempt, ``Snooze`` puts it back for later,
``Suspended`` (a durable sleep or wait) records nothing; as the SQL call that records it
(``returned``, ``raised``), with errors PostgreSQL can store."""

from __future__ import annotations

import logging
import math
from datetime import timedelta
from typing import Any

from ...calls import json_value
from ...errors import InvalidArgument
from .. import sqlapi as sql
from ..sqlapi import MAX_RETRY_IN
from .context import Suspended, TaskContext
from .counted import Counted

log = logging.getLogger(__package__)  # one logger for the package: pyscheduler.tasks.worker

MAX_DESCRIPTION = 4000  # characters of an error description the worker records
Outcome = tuple[str | None, dict[str, Any]]  # (the SQL function that records it, its arguments); None: nothing


def _delay(in_: timedelta | float) -> timedelta:
    """``in_`` (a timedelta or seconds) as a timedelta in 0..MAX_RETRY_IN, else InvalidArgument."""
    if not isinstance(in_, timedelta):
        if isinstance(in_, bool) or not isinstance(in_, (int, float)) or not math.isfinite(in_):
            raise InvalidArgument(f"in_ must be a timedelta or a number of seconds, got {in_!r}")
        in_ = timedelta(seconds=in_)
    if not timedelta(0) <= in_ <= MAX_RETRY_IN:
        raise InvalidArgument(f"in_ must be between 0 and {MAX_RETRY_IN.days} days, got {in_!r}")
    return in_


class Abort(Exception):
    """Raise from a handler to abort the task with these errors (never retried)."""

    def __init__(self, code: str, description: str = "", args: dict[str, Any] | None = None):
        super().__init__(description or code)
        self.error = {"code": code, "args": args or {}, "description": description}


class Retry(Exception):
    """Raise from a handler to fail this attempt and try the task again after ``in_`` (a
    timedelta or seconds; 0: at once; None: the default backoff). The attempt counts: after
    its last one (``max_attempts``) the task is aborted. The error recorded is
    ``{"code": code, "args": args, "description": description}``."""

    def __init__(self, in_: timedelta | float | None = None, description: str = "", *, code: str = "Retry",
                 args: dict[str, Any] | None = None):
        in_ = None if in_ is None else _delay(in_)
        super().__init__(description or code)
        self.in_ = in_
        self.error = {"code": code, "args": args or {}, "description": description}


class Snooze(Exception):
    """Raise from a handler to put the task back for ``in_`` (a timedelta or seconds, 0..365
    days) without using an attempt (``yield_task(..., run_in)``): e.g. a resource that is not
    ready yet. Unlike ``Retry`` it records no error and never aborts the task."""

    def __init__(self, in_: timedelta | float):
        in_ = _delay(in_)
        super().__init__(f"snooze {in_}")
        self.in_ = in_


def json_safe(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON that PostgreSQL's jsonb accepts: NaN and infinities become strings,
    NUL characters and unencodable surrogates are replaced, keys become strings, anything
    else (a datetime, an object) becomes its str(); nesting deeper than 50 is cut."""
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")
    if depth >= 50:
        return json_safe(repr(value))
    if isinstance(value, dict):
        return {json_safe(str(k)): json_safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v, depth + 1) for v in value]
    try:
        text = str(value)
    except Exception:  # noqa: BLE001 - a broken __str__ must not lose the outcome
        text = object.__repr__(value)
    return json_safe(text)


def error_entry(code: Any, description: Any = "", args: Any = None) -> dict[str, Any]:
    """One entry of abort_task's errors, always recordable (see json_safe)."""
    args = json_safe(args if isinstance(args, dict) else ({} if args is None else {"value": args}))
    return {"code": json_safe(str(code))[:200] or "error", "args": args,
            "description": json_safe(str(description))[:MAX_DESCRIPTION]}


def returned(ctx: TaskContext, value: Any, counted: Counted | None) -> Outcome:
    """What to record for a handler that returned ``value``: a completion with ``value`` as
    its result (checked as JSON, as specs are: a value that is not JSON fails the attempt),
    or nothing when ``ctx.complete(conn=...)`` completed it in the application's transaction."""
    if ctx.completed_outside:
        return None, {}
    if value is not None:
        try:
            ctx.result = json_value("the handler's result", value)
        except InvalidArgument as exc:
            return raised(ctx, exc, counted)
    return sql.COMPLETE_TASK, {}


def raised(ctx: TaskContext, exc: BaseException, counted: Counted | None) -> Outcome:
    """What to record for a handler that raised ``exc``: ``Abort``: an abort with errors (never
    retried); ``Snooze``: a yield until later; ``Retry``: a failure retried after its delay;
    anything else (a BaseException too: it must not end the worker) a failure retried after the
    default backoff."""
    if isinstance(exc, Abort):
        if counted is not None:
            counted.aborted.inc()
        error = exc.error
        return sql.ABORT_TASK, {"errors": [error_entry(error.get("code"), error.get("description"),
                                                       error.get("args"))]}
    if isinstance(exc, Suspended):
        log.info("task %s: %s", ctx.rn, exc)
        return None, {}  # the lease ended with the sleep or the wait: nothing to record
    if isinstance(exc, Snooze):
        log.info("task %s: the handler snoozed it for %s", ctx.rn, exc.in_)
        return sql.YIELD_TASK, {"run_in": exc.in_}
    if isinstance(exc, Retry):
        log.info("task %s: the handler asked for a retry in %s", ctx.rn, exc.in_ or "the default backoff")
        if counted is not None:
            counted.retried.inc()
        error = exc.error
        return sql.FAIL_TASK, {"error": error_entry(error.get("code"), error.get("description"), error.get("args")),
                               "retry_in": exc.in_}
    if ctx.reason != "yielded":  # the handler failed: retried after the backoff, or aborted after its last attempt
        log.warning("task %s failed; it is retried after a backoff unless that was its last attempt", ctx.rn,
                    exc_info=exc)
    return sql.FAIL_TASK, {"error": error_entry(type(exc).__name__, exc), "retry_in": None}
