"""Python check jobs: ``Check`` (a pending check as its job sees it), the handler registry
(``@handler``, ``import_handlers``), and running handlers one after another under a deadline each
(``run_handlers``; a handler past it is abandoned and its check recorded as timeout)."""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from typing import Any

from .. import metrics
from . import sqlapi as sql

log = logging.getLogger("pyscheduler.checks.runner")

UTC = timezone.utc
ABANDONED = metrics.gauge("pyscheduler_checks_abandoned_handlers", "Python handlers past their deadline whose threads "
                          "are still running (a runner with max_abandoned of them runs no more handlers)")


@dataclass
class Check:
    """A pending check as its job sees it (pyscheduler.future_check)."""

    id: int
    entity_name: str
    entity_key: str
    job: str
    kind: str
    payload: Any
    first_check_at: datetime
    next_check_at: datetime
    check_count: int
    max_checks: int
    created: datetime
    owner: str | None = None  # the role that added it

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "Check":
        return cls(*[row.get(name) for name in _FIELDS])

    @classmethod
    def from_values(cls, values: list[Any]) -> "Check":
        """From the array run_due_checks returns per Python check (the fields in order; times as ISO text)."""
        check = cls(*values)
        check.first_check_at = datetime.fromisoformat(check.first_check_at)
        check.next_check_at = datetime.fromisoformat(check.next_check_at)
        check.created = datetime.fromisoformat(check.created)
        return check

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "Check":
        """From a future_check as jsonb (run_due_checks, a task job's spec): times are ISO strings."""
        row = dict(obj)
        for key in _TIMES:
            if isinstance(row.get(key), str):
                row[key] = datetime.fromisoformat(row[key])
        return cls.from_row(row)


_FIELDS = tuple(f.name for f in fields(Check))
_TIMES = ("first_check_at", "next_check_at", "created")


Handler = Callable[[Check], "datetime | None"]

# Python handlers registered with @handler("name"); `pyscheduler checks run
# --handlers mymodule` imports mymodule, whose decorators fill this.
HANDLERS: dict[str, Handler] = {}


def handler(name: str | None = None) -> Callable[[Handler], Handler]:
    """Register a Python check handler: ``@handler("order_alert")``. It gets a
    :class:`Check` and returns the next check time (an aware datetime) or None."""

    def register(fn: Handler) -> Handler:
        HANDLERS[name or fn.__name__] = fn
        return fn

    return register


def import_handlers(modules: Iterable[str]) -> dict[str, Handler]:
    """Import modules that register handlers; the registry afterwards."""
    for module in modules:
        if module.strip():
            importlib.import_module(module.strip())
    return dict(HANDLERS)


@dataclass
class Result:
    next_check_at: datetime | None = None
    error: str | None = None
    timed_out: bool = False
    took: float = 0.0


def error_text(text: str) -> str:
    """An error as check_history can keep it: no NUL, valid UTF-8, at most ERROR_CHARS characters."""
    text = str(text)[:sql.ERROR_CHARS].replace("\x00", "\\x00")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")[:sql.ERROR_CHARS]


def failure(exc: BaseException) -> str:
    return error_text(f"{type(exc).__name__}: {exc}")


def run_handler(fn: Handler | None, check: Check) -> Result:
    """Call one handler; a raise (any: a handler's ``CancelledError`` or ``SystemExit`` too) or a
    bad return becomes an error result. A next check time comes back in UTC."""
    started = time.monotonic()
    if fn is None:
        return Result(error=f"no Python handler named {check.job!r} is registered with this runner")
    try:
        nxt = fn(check)
    except BaseException as exc:  # noqa: BLE001 - the job's failure, whatever it raised, is recorded as 'error'
        return Result(error=failure(exc), took=time.monotonic() - started)
    took = time.monotonic() - started
    if nxt is None:
        return Result(took=took)
    try:
        if not isinstance(nxt, datetime) or nxt.utcoffset() is None:
            raise TypeError("not None or a timezone-aware datetime")
        return Result(next_check_at=nxt.astimezone(UTC), took=took)
    except BaseException as exc:  # noqa: BLE001 - e.g. OverflowError in UTC, a tzinfo that raises
        return Result(error=error_text(f"handler returned {_shown(nxt)}: {type(exc).__name__}: {exc}"), took=took)


def _shown(value: Any) -> str:
    try:
        return repr(value)[:200]
    except BaseException:  # noqa: BLE001 - a __repr__ that raises
        return f"a {type(value).__name__}"


class _Lane(threading.Thread):
    """Runs handlers one after another; the runner watches the current one's deadline. It starts
    none once ``stop`` is set, nor once its handlers have run for ``budget`` seconds in all (the
    first one always starts): the checks it did not start wait at their slot."""

    def __init__(self, checks: list[Check], handlers: dict[str, Handler], results: dict[int, Result],
                 skip: set[int], budget: float, stop: threading.Event | None):
        super().__init__(name="checks-handlers", daemon=True)
        self.checks, self.handlers, self.results, self.skip = checks, handlers, results, skip
        self.budget, self.stop = budget, stop
        self.lock = threading.Lock()
        self.current: tuple[int, float] | None = None  # (check id, started)
        self.abandoned = False
        self.done = threading.Event()

    def run(self) -> None:
        until = None
        try:
            for check in self.checks:
                with self.lock:
                    if self.abandoned or (self.stop is not None and self.stop.is_set()):
                        return
                    if check.id in self.skip:
                        continue
                    now = time.monotonic()
                    if until is None:
                        until = now + self.budget
                    elif now >= until:
                        return
                    self.current = (check.id, now)
                result = run_handler(self.handlers.get(check.job), check)
                with self.lock:
                    if self.abandoned:
                        return  # finished after its deadline: already recorded as timeout
                    self.results[check.id] = result
        finally:
            with self.lock:
                if self.abandoned:
                    ABANDONED.dec()
            self.done.set()


def run_handlers(checks: list[Check], handlers: dict[str, Handler], timeout: float,
                 deleted: Callable[[list[int]], Iterable[int]] | None = None,
                 poll: float = 1.0, stop: threading.Event | None = None,
                 abandoned: list[threading.Thread] | None = None) -> dict[int, Result]:
    """Run the checks' handlers one after another in a thread, each under a deadline of
    ``timeout`` seconds, until ``stop`` is set or they have run for ``timeout`` seconds in all;
    one result per check run, none for the checks not started (they wait at their slot). A
    handler past its deadline is abandoned (its thread, added to ``abandoned``, cannot be
    killed) and recorded as timeout; none starts after it. ``deleted(ids)``, asked every ``poll``
    seconds with the checks not started yet, names those to skip (deleted meanwhile: they get no
    result)."""
    results: dict[int, Result] = {}
    skip: set[int] = set()
    next_poll = time.monotonic() + poll
    lane = _Lane(checks, handlers, results, skip, timeout, stop)
    lane.start()
    while not lane.done.is_set():
        now = time.monotonic()
        if deleted is not None and now >= next_poll:
            with lane.lock:  # the lane starts no check meanwhile
                running = lane.current[0] if lane.current else None
                waiting = [c.id for c in checks if c.id not in results and c.id not in skip and c.id != running]
                if waiting:
                    skip.update(deleted(waiting))
            next_poll = time.monotonic() + poll
        current = lane.current
        if current is None:
            lane.done.wait(0.001)
            continue
        remaining = current[1] + timeout - time.monotonic()
        if remaining > 0:
            lane.done.wait(remaining if deleted is None else min(remaining, max(0.0, next_poll - now)))
            continue
        with lane.lock:
            if lane.current is current and current[0] not in results:
                lane.abandoned = True
                ABANDONED.inc()
                results[current[0]] = Result(error=f"the handler exceeded its timeout of {timeout:g} s",
                                             timed_out=True, took=timeout)
        if lane.abandoned:
            log.warning("check %s: handler still running after its %g s deadline; abandoned", current[0], timeout)
            if abandoned is not None:
                abandoned.append(lane)
            break
    return results
