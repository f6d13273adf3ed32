"""The future-check runner: wakes at each slot boundary and runs that slot's checks.

Per batch, in ONE transaction (the row locks taken by the take are the runner's
proof that it took the checks; ``finish_checks`` accepts no others):

1. ``run_due_checks(slot, shard, shards, max => batch, after)`` (slot NULL: the
   catch-up pass), ONE statement under ``statement_timeout = timeout``: takes
   and locks up to ``batch`` checks (FOR UPDATE SKIP LOCKED), runs their SQL
   jobs (the checks of one job as one set in one subtransaction, one
   subtransaction per check only if one raises) and records them, hands task
   jobs to task queues, and returns the Python-job checks. If it times out,
   the transaction is rolled back and the batch is taken again and run
   carefully: ``due_checks``, then each SQL check by ``run_check_jobs`` in its
   own savepoint and statement under the timeout, so only the slow one ends as
   ``timeout``;
2. Python jobs: the registered handler, one after another in a handler thread
   watched against a per-check deadline (a handler past it is abandoned and
   recorded as ``timeout``; the rest continue in a fresh thread), then
   ``finish_checks`` records their results;
3. COMMIT (asynchronous: a commit lost in a database crash leaves the checks at
   their slot, so the catch-up pass runs them again, the same at-least-once as
   after a runner crash).

On start (and after any gap) the runner runs the catch-up pass for its shard
(slots before the current one), then the current slot, then each next slot as
its boundary passes (the database clock decides). Within a slot each batch
starts after the last id the previous one took; a last batch from the start of
the slot picks up anything another runner held meanwhile.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any

import psycopg

from ..db import Database, Outage, Session
from ..errors import SlotNotStarted, SlotNotOnBoundary, is_retryable

log = logging.getLogger(__name__)


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


def run_handler(fn: Handler | None, check: Check) -> Result:
    """Call one handler; a raise or a bad return becomes an error result."""
    started = time.monotonic()
    if fn is None:
        return Result(error=f"no Python handler named {check.job!r} is registered with this runner")
    try:
        nxt = fn(check)
    except Exception as exc:  # the job's failure, recorded as 'error'
        return Result(error=f"{type(exc).__name__}: {exc}", took=time.monotonic() - started)
    took = time.monotonic() - started
    if nxt is not None and (not isinstance(nxt, datetime) or nxt.tzinfo is None):
        return Result(error=f"handler returned {nxt!r}, not None or a timezone-aware datetime", took=took)
    return Result(next_check_at=nxt, took=took)


class _Lane(threading.Thread):
    """Runs handlers one after another; the runner watches the current one's deadline."""

    def __init__(self, checks: list[Check], handlers: dict[str, Handler], results: dict[int, Result]):
        super().__init__(name="checks-handlers", daemon=True)
        self.checks, self.handlers, self.results = checks, handlers, results
        self.lock = threading.Lock()
        self.current: tuple[int, float] | None = None  # (check id, started)
        self.abandoned = False
        self.done = threading.Event()

    def run(self) -> None:
        try:
            for check in self.checks:
                with self.lock:
                    if self.abandoned:
                        return
                    self.current = (check.id, time.monotonic())
                result = run_handler(self.handlers.get(check.job), check)
                with self.lock:
                    if self.abandoned:
                        return  # finished after its deadline: already recorded as timeout
                    self.results[check.id] = result
        finally:
            self.done.set()


def run_handlers(checks: list[Check], handlers: dict[str, Handler], timeout: float) -> dict[int, Result]:
    """Run each check's handler under a deadline of ``timeout`` seconds; one result per check."""
    results: dict[int, Result] = {}
    todo = checks
    while todo:
        lane = _Lane(todo, handlers, results)
        lane.start()
        while not lane.done.is_set():
            current = lane.current
            if current is None:
                lane.done.wait(0.001)
                continue
            remaining = current[1] + timeout - time.monotonic()
            if remaining > 0:
                lane.done.wait(remaining)
                continue
            with lane.lock:
                if lane.current is current and current[0] not in results:
                    lane.abandoned = True
                    results[current[0]] = Result(error=f"the handler exceeded its timeout of {timeout:g} s",
                                                 timed_out=True, took=timeout)
            if lane.abandoned:
                log.warning("check %s: handler still running after its %g s deadline; abandoned", current[0],
                            timeout)
                break
        todo = [c for c in todo if c.id not in results] if lane.abandoned else []
    return results


def _or_none(values: list) -> list | None:
    """NULL for an array of NULLs (finish_checks reads it as all NULL): less to send and unnest."""
    return values if any(v is not None for v in values) else None


def _array(items: Iterable) -> str:
    """A PostgreSQL array literal of numbers (ids, or seconds for interval[])."""
    return "{" + ",".join(map(str, items)) + "}"


def _seconds(took: timedelta | None) -> float:
    return took.total_seconds() if took is not None else 0.0


class _Clock:
    """Adds the time since the previous lap to ``seconds[name]``."""

    def __init__(self, seconds: dict[str, float]):
        self.seconds, self.last = seconds, time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self.last
        self.last = now


class CheckRunner:
    """Runs the checks of its shard slot by slot (a daemon: ``run(stop)``)."""

    def __init__(self, dsn: str, handlers: dict[str, Handler] | None = None, *, shard: int = 0, shards: int = 1,
                 batch: int = 1000, timeout: float = 10.0, name: str | None = None):
        self.dsn = dsn
        self.handlers = dict(HANDLERS if handlers is None else handlers)
        self.shard, self.shards, self.batch, self.timeout = shard, shards, batch, timeout
        self.name = name or f"checks-runner-{shard}of{shards}"
        self.counts: dict[str, int] = {}
        self.seconds: dict[str, float] = {}  # where the time goes, per phase of a batch (bench)
        self.ran: list[int] = []  # ids of Python checks this runner ran (tests, demo)
        self.batch_seconds: list[float] = []  # wall time of each batch (bench)
        self.last_id: int | None = None  # the largest id the last batch took (the next one's after)
        self.record_ids = False
        self.slots_done = threading.Event()  # set after each slot pass (tests wait on it)
        self.last_slot: datetime | None = None
        self._careful = False  # run the next batch's SQL jobs one statement each (after a timeout)
        self._stop = threading.Event()
        self._clock: _Clock | None = None

    # -- one transaction: take, run, finish -----------------------------------------------------
    def run_batch(self, db: Database, slot: datetime | None, after: int | None = None) -> int:
        """Take one batch of ``slot`` (None: the catch-up pass; ``after``: only ids above it) and
        run it in one transaction; how many checks were taken."""
        careful, self._careful = self._careful, False
        started = time.perf_counter()
        with db.connection() as conn:
            # One round trip to begin. Asynchronous commit: a commit lost in a database crash leaves
            # the checks at their slot and the catch-up pass runs them again (at least once, as after
            # a runner crash). The statement timeout bounds every statement of the batch; it is
            # the SQL jobs' per-check timeout.
            conn.execute(f"BEGIN; SET LOCAL synchronous_commit = off; "
                         f"SET LOCAL statement_timeout = {max(1, int(self.timeout * 1000))}")
            try:
                n = self._work_carefully(conn, slot) if careful else self._work(conn, slot, after)
                conn.execute("COMMIT")
            except BaseException:
                if not conn.closed:
                    with contextlib.suppress(psycopg.Error):
                        conn.execute("ROLLBACK")
                raise
            finally:
                self._clock_lap("commit")
        if n < 0:  # a SQL job was too slow for the set-based run: the same batch again, carefully
            return self.run_batch(db, slot, after)
        self.batch_seconds.append(time.perf_counter() - started)
        return n

    def _work(self, conn: psycopg.Connection, slot: datetime | None, after: int | None) -> int:
        """The fast path: one statement takes the batch, runs and records its SQL jobs and hands its
        task jobs over (run_due_checks); the Python ones come back to run here."""
        session = Session(conn)
        self._clock = _Clock(self.seconds)
        try:
            row = session.call_one("run_due_checks", slot=slot, shard=self.shard, shards=self.shards,
                                   max=self.batch, after=after)
        except psycopg.errors.QueryCanceled:
            self._careful = True
            return -1
        self._clock_lap("take + in-database jobs")
        self.last_id = row["last_id"]
        for outcome, n in (row["outcomes"] or {}).items():
            self._count(outcome, n)
        checks = [Check.from_values(c) for c in row["checks"] or ()]
        if checks:
            self._finish(session, run_handlers(checks, self.handlers, self.timeout), "python jobs")
            if self.record_ids:
                self.ran.extend(c.id for c in checks)
        return row["taken"]

    def _work_carefully(self, conn: psycopg.Connection, slot: datetime | None) -> int:
        """After a timeout: take the batch again and run each SQL job in its own statement."""
        session = Session(conn)
        self._clock = _Clock(self.seconds)
        self.last_id = None
        if slot is None:
            rows = session.call("catch_up_checks", shard=self.shard, shards=self.shards, max=self.batch)
        else:
            rows = session.call("due_checks", slot=slot, shard=self.shard, shards=self.shards, max=self.batch)
        self._clock_lap("take")
        checks = [Check.from_row(r) for r in rows]
        results = {r["id"]: Result(next_check_at=r["next_check_at"], error=r["error"],
                                   timed_out=r.get("timed_out", False), took=_seconds(r["took"]))
                   for r in self._run_sql_one_by_one(conn, session, [c.id for c in checks if c.kind == "sql"])}
        task_ids = [c.id for c in checks if c.kind == "task"]
        if task_ids:
            self._count("task", len(session.call("submit_check_tasks", ids=task_ids)))
        self._clock_lap("in-database jobs")
        results.update(run_handlers([c for c in checks if c.kind == "python"], self.handlers, self.timeout))
        self._finish(session, results, "python jobs")
        if self.record_ids:
            self.ran.extend(c.id for c in checks if c.kind == "python")
        return len(rows)

    def _finish(self, session: Session, results: dict[int, Result], lap: str) -> None:
        """Record results with one finish_checks."""
        self._clock_lap(lap)
        if not results:
            return
        ids = list(results)
        rs = list(results.values())
        # ids and times taken as array literals: one str.join instead of a dumper call per element
        out = session.call("finish_checks", ids=_array(ids), next_check_ats=_or_none([r.next_check_at for r in rs]),
                           errors=_or_none([r.error for r in rs]),
                           timed_out=_or_none([r.timed_out or None for r in rs]),
                           took=_array(f"{r.took:.6f}" for r in rs))
        for row in out:
            self._count(row["outcome"])
            if row["outcome"] == "not_taken":
                log.warning("check %s was not recorded: not taken by this transaction", row["id"])
        self._clock_lap("finish")

    def _run_sql_one_by_one(self, conn: psycopg.Connection, session: Session, ids: list[int]) -> list[dict]:
        """Each SQL check in its own statement and savepoint: only the slow one times out."""
        rows: list[dict] = []
        for check_id in ids:
            try:
                with conn.transaction():
                    rows += session.call("run_check_jobs", ids=[check_id])
            except psycopg.errors.QueryCanceled:
                rows.append({"id": check_id, "next_check_at": None, "timed_out": True,
                             "error": f"the job exceeded its statement timeout of {self.timeout:g} s",
                             "took": timedelta(seconds=self.timeout)})
        return rows

    def _clock_lap(self, name: str) -> None:
        if self._clock is not None:
            self._clock.lap(name)

    def _count(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    # -- passes ---------------------------------------------------------------------------------
    def run_slot(self, db: Database, slot: datetime) -> int:
        """The '=' pass: every check of ``slot`` in this shard, batch by batch. Each batch starts
        after the last id the previous one took (the front of the slot is dead index entries until
        VACUUM); the pass ends with a batch from the start of the slot, which takes any check
        another runner held while this one went past it."""
        total, after = 0, None
        while True:
            n = self.run_batch(db, slot, after)
            total += n
            if self._stop.is_set():  # stopping: the rest waits for the catch-up pass
                return total
            if n < self.batch and after is None:
                return total
            after = self.last_id if n == self.batch else None

    def catch_up(self, db: Database) -> int:
        """The '<' pass: checks of this shard from slots before the current one."""
        total = 0
        while True:
            n = self.run_batch(db, None)
            total += n
            if n < self.batch or self._stop.is_set():
                if total:
                    log.info("%s: caught up %d checks from missed slots", self.name, total)
                return total

    # -- the daemon -----------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        self._stop = stop
        outage = Outage(f"{self.name}: database", log)
        with Database(self.dsn, max_size=1, name=self.name) as db:
            while not stop.is_set():
                try:
                    self._step(db, stop)
                    outage.ok()
                except SlotNotOnBoundary:
                    self.last_slot = None  # the resolution changed: catch up, then follow the new slots
                except SlotNotStarted:
                    stop.wait(0.01)  # woke a hair early by the database clock
                except Exception as exc:
                    if not is_retryable(exc):
                        raise
                    stop.wait(outage.failed(exc))

    def _step(self, db: Database, stop: threading.Event) -> None:
        info = db.call_one("check_slots")
        resolution: timedelta = info["resolution"]
        if self.last_slot is None or self.last_slot + resolution < info["slot"]:
            # start, or more than one slot missed: the catch-up pass, then the current slot
            self.catch_up(db)
            self.run_slot(db, info["slot"])
            self.last_slot = info["slot"]
            self.slots_done.set()
            return
        target = self.last_slot + resolution
        if target > info["clock"]:
            stop.wait((target - info["clock"]).total_seconds())
            return
        self.run_slot(db, target)
        self.last_slot = target
        self.catch_up(db)  # periodically: also expires task jobs that never reported
        self.slots_done.set()
