"""The future-check runner: wakes at each slot boundary and runs that slot's checks.

Per batch, in ONE transaction (the row locks taken by the take are the runner's
proof that it took the checks; ``finish_checks`` accepts no others):

1. ``run_due_checks(slot, shard, shards, max => batch, after)`` (slot NULL: the
   catch-up pass), ONE statement under ``statement_timeout = timeout``: takes
   and locks up to ``batch`` checks (FOR UPDATE SKIP LOCKED), runs their SQL
   jobs (the checks of one job as one set in one subtransaction, one
   subtransaction per check only if one raises) and records them, hands task
   jobs to task queues, and returns the Python-job checks. If it times out (or
   a value cannot be loaded), the transaction is rolled back and the batch is
   taken again and run carefully: ``due_checks``, then each SQL check by
   ``run_check_jobs`` in its own savepoint and statement under the timeout, so
   only the slow one ends as ``timeout``;
2. Python jobs: the registered handler, one after another in a handler thread
   watched against a per-check deadline (a handler past it is abandoned and
   recorded as ``timeout``), then ``finish_checks`` records their results. The
   transaction holds its row locks while handlers run, so it is bounded: no
   handler starts once the batch's handlers have run for ``timeout`` in all,
   after an abandoned one, or once the runner is asked to stop; the checks not
   started are not recorded and wait at their slot (the pass takes them again).
   A batch's handlers thus keep its transaction open for at most about twice
   the timeout, and a stop waits for the running handler only. While
   ``max_abandoned`` abandoned handlers are still running no handler starts
   (a warning, and the gauge ``pyscheduler_checks_abandoned_handlers``). Every
   second of handler time the runner asks ``end_deleted_checks`` which of the
   checks not yet started a client deleted meanwhile, and skips them;
3. COMMIT (asynchronous: a commit lost in a database crash leaves the checks at
   their slot, so the catch-up pass runs them again, the same at-least-once as
   after a runner crash).

A statement that runs SQL jobs is watched: a job that catches the statement
timeout's cancel and goes on would hold the runner (and its batch's locks)
forever, so past ``timeout`` plus a grace a watchdog terminates the backend from
a connection of its own. The batch is then run carefully; the check whose
statement had to be terminated is remembered and, when the batch is taken again,
recorded as ``timeout`` without running it again.

On start (and after any gap) the runner runs the catch-up pass for its shard
(slots before the current one), then the current slot, then each next slot as
its boundary passes (the database clock decides; slot arithmetic in UTC).
Within a slot each batch starts after the last id the previous one took; a last
batch from the start of the slot picks up anything another runner held
meanwhile. Every ``purge_interval`` it deletes history past its retention.

A stored value never stops it (design.md): a job's or a handler's bad result,
a payload a task cannot carry, a job that hangs, are each recorded against
their own check; a lost database connection is waited out; anything else
crashes the runner, and ``pyscheduler run`` restarts it (``fresh()``).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg

from .. import metrics
from ..db import Database, Outage, Session, connect
from ..errors import SlotNotOnBoundary, SlotNotStarted, is_retryable, rejects_arguments

log = logging.getLogger(__name__)

UTC = timezone.utc
ERROR_CHARS = 2000  # an error text is kept to this many characters (as in check_history)


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
    text = str(text)[:ERROR_CHARS].replace("\x00", "\\x00")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")[:ERROR_CHARS]


def _failure(exc: BaseException) -> str:
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
        return Result(error=_failure(exc), took=time.monotonic() - started)
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


def _or_none(values: list) -> list | None:
    """NULL for an array of NULLs (finish_checks reads it as all NULL): less to send and unnest."""
    return values if any(v is not None for v in values) else None


def _array(items: Iterable) -> str:
    """A PostgreSQL array literal of numbers (ids, or seconds for interval[])."""
    return "{" + ",".join(map(str, items)) + "}"


def _seconds(took: timedelta | None) -> float:
    return took.total_seconds() if took is not None else 0.0


def next_step(last_slot: datetime | None, slot: datetime, clock: datetime,
              resolution: timedelta) -> tuple[str, Any]:
    """What the runner does next, from check_slots() (any time zone: the arithmetic is in UTC, so a
    DST change in the session's zone never stretches or skips a slot):
    ("catch_up", slot) at start or after more than one slot missed (the catch-up pass, then slot),
    ("wait", seconds) until the next slot begins, or ("run", next slot)."""
    slot, clock = slot.astimezone(UTC), clock.astimezone(UTC)
    if last_slot is None or last_slot.astimezone(UTC) + resolution < slot:
        return "catch_up", slot
    target = last_slot.astimezone(UTC) + resolution
    if target > clock:
        return "wait", (target - clock).total_seconds()
    return "run", target


class _Clock:
    """Adds the time since the previous lap to ``seconds[name]``."""

    def __init__(self, seconds: dict[str, float]):
        self.seconds, self.last = seconds, time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self.last
        self.last = now


class _Watch:
    """One watched statement: its backend, its deadline, and whether the watchdog ended it."""

    __slots__ = ("pid", "deadline", "fired")

    def __init__(self, pid: int, deadline: float):
        self.pid, self.deadline, self.fired = pid, deadline, False


class _Watchdog:
    """Ends a statement that outlives its deadline: terminates its backend from a connection of its
    own (a job that catches the statement timeout's cancel would otherwise run forever, holding the
    runner and its batch's locks). One thread per runner, started on first use."""

    def __init__(self, dsn: str, name: str):
        self.dsn, self.name = dsn, name
        self._cond = threading.Condition()
        self._watch: _Watch | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    @contextlib.contextmanager
    def watch(self, conn: psycopg.Connection, seconds: float):
        w = _Watch(conn.info.backend_pid, time.monotonic() + seconds)
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"{self.name}-watchdog", daemon=True)
                self._thread.start()
            self._watch = w
            self._cond.notify()
        try:
            yield w
        finally:
            with self._cond:
                if self._watch is w:
                    self._watch = None

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                w = self._watch
                if w is None:
                    self._cond.wait()
                    continue
                remaining = w.deadline - time.monotonic()
                if remaining > 0:
                    self._cond.wait(remaining)
                    continue
                self._watch, w.fired = None, True
                self._cond.release()
                try:
                    self._terminate(w.pid)
                finally:
                    self._cond.acquire()

    def _terminate(self, pid: int) -> None:
        log.warning("%s: a statement ran past its deadline (a job that ignores its timeout); "
                    "terminating backend %s", self.name, pid)
        try:
            with contextlib.closing(connect(self.dsn, connect_timeout=5)) as conn:
                conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        except Exception as exc:  # noqa: BLE001 - the database is down: so is the statement
            log.warning("%s: could not terminate backend %s: %s", self.name, pid, exc)


class _Rerun(Exception):
    """The batch's transaction is lost (the watchdog ended a statement): run the batch again, carefully."""


OUTCOMES = metrics.counter("pyscheduler_checks_outcomes", "Checks this runner ran or ended, by job and outcome "
                           "(done, rescheduled, max_checks, horizon, past, timeout, error, deleted, task: "
                           "handed to a task worker)", ["job", "outcome"])
# The job label: a SQL job's function (it must exist), a Python job's handler registered with the
# runner, a task job's queue. Python and task jobs are names a client chooses, so the set is
# bounded here: a Python job without a handler in this process counts as UNREGISTERED, and past
# MAX_JOB_LABELS distinct jobs in a process the rest count as OTHER_JOBS.
MAX_JOB_LABELS = 100
UNREGISTERED = "(unregistered)"
OTHER_JOBS = "(other)"
_job_labels: set[str] = set()
_job_labels_lock = threading.Lock()


def job_label(job: Any) -> str:
    """The ``job`` label of a check's job: itself, or OTHER_JOBS past MAX_JOB_LABELS jobs in this process."""
    if not isinstance(job, str):
        return OTHER_JOBS
    if job in _job_labels:
        return job
    with _job_labels_lock:
        if job in _job_labels or len(_job_labels) < MAX_JOB_LABELS:
            _job_labels.add(job)
            return job
    return OTHER_JOBS

SLOT_LAG = metrics.gauge("pyscheduler_checks_slot_lag_seconds", "How late the runner began its last slot (database "
                         "clock minus the slot's start)")
SLOTS = metrics.counter("pyscheduler_checks_slots", "Slots the runner ran (its shard of each)")
CAUGHT_UP = metrics.counter("pyscheduler_checks_caught_up", "Checks of missed slots run by the catch-up pass")
BATCH_SECONDS = metrics.histogram("pyscheduler_checks_batch_seconds", "Wall time of one batch (take, run, record)")
ABANDONED = metrics.gauge("pyscheduler_checks_abandoned_handlers", "Python handlers past their deadline whose threads "
                          "are still running (a runner with max_abandoned of them runs no more handlers)")
RUNNER_SERIES = (OUTCOMES, SLOT_LAG, SLOTS, CAUGHT_UP, BATCH_SECONDS, ABANDONED)


class CheckRunner:
    """Runs the checks of its shard slot by slot (a daemon: ``run(stop)``)."""

    series = RUNNER_SERIES
    wake_every = 1.0  # s: the longest sleep between two looks at check_slots (a changed resolution)

    def __init__(self, dsn: str, handlers: dict[str, Handler] | None = None, *, shard: int = 0, shards: int = 1,
                 batch: int = 1000, timeout: float = 10.0, name: str | None = None,
                 purge_interval: float = 60.0, grace: float | None = None, max_abandoned: int = 10):
        self.dsn = dsn
        self.handlers = dict(HANDLERS if handlers is None else handlers)
        self.shard, self.shards, self.batch, self.timeout = shard, shards, batch, timeout
        self.purge_interval = purge_interval  # s between history purges (0: never)
        # how long past its timeout a statement may run before the watchdog ends it
        self.grace = max(2.0, timeout / 2) if grace is None else grace
        # with this many abandoned handlers still running, the runner starts no more handlers
        self.max_abandoned = max_abandoned
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
        self._verdicts: dict[int, Result] = {}  # checks whose statement the watchdog ended: not run again
        self._last_purge = 0.0
        self._stop = threading.Event()
        self._clock: _Clock | None = None
        self._watchdog = _Watchdog(dsn, self.name)
        self._outcomes: dict[tuple[str, str], Any] = {}  # (job label, outcome) -> its OUTCOMES child
        self._resolution: timedelta | None = None  # the slot length the runner follows
        self._abandoned: list[threading.Thread] = []  # threads of handlers past their deadline (still running?)
        self._left = 0  # Python checks the last batch did not start: they wait at their slot
        self._held_back = False  # ... because max_abandoned handlers are still running
        self._bound_logged = False  # the warning that max_abandoned is reached was logged

    def fresh(self) -> "CheckRunner":
        """A new runner with this one's settings (``run_daemons`` restarts a crashed runner with it)."""
        again = CheckRunner(self.dsn, self.handlers, shard=self.shard, shards=self.shards, batch=self.batch,
                            timeout=self.timeout, name=self.name, purge_interval=self.purge_interval,
                            grace=self.grace, max_abandoned=self.max_abandoned)
        again._abandoned = self._abandoned  # the crashed runner's abandoned handlers still count
        return again

    # -- one transaction: take, run, finish -----------------------------------------------------
    def run_batch(self, db: Database, slot: datetime | None, after: int | None = None) -> int:
        """Take one batch of ``slot`` (None: the catch-up pass; ``after``: only ids above it) and
        run it in one transaction; how many checks were taken."""
        while True:
            careful, self._careful = self._careful, False
            started = time.perf_counter()
            try:
                n = self._transaction(db, slot, after, careful)
            except _Rerun:
                n = None
            if n is None:  # too slow, unloadable or ended by the watchdog: the batch again, carefully
                self._careful = True
                if self._stop.is_set():  # unless stopping: its checks wait at their slot
                    return 0
                continue
            took = time.perf_counter() - started
            self.batch_seconds.append(took)
            BATCH_SECONDS.observe(took)
            return n

    def _transaction(self, db: Database, slot: datetime | None, after: int | None, careful: bool) -> int | None:
        self._left, self._held_back = 0, False
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
        return n

    def _watched(self, conn: psycopg.Connection, call: Callable[[], Any]) -> Any:
        """``call()``, a statement that runs SQL jobs, under the watchdog; _Rerun if it had to end it."""
        with self._watchdog.watch(conn, self.timeout + self.grace) as w:
            try:
                return call()
            except Exception as exc:
                if w.fired:
                    raise _Rerun() from exc
                raise

    def _work(self, conn: psycopg.Connection, slot: datetime | None, after: int | None) -> int | None:
        """The fast path: one statement takes the batch, runs and records its SQL jobs and hands its
        task jobs over (run_due_checks); the Python ones come back to run here. None: run the batch
        carefully instead."""
        session = Session(conn)
        self._clock = _Clock(self.seconds)
        try:
            row = self._watched(conn, lambda: session.call_one("run_due_checks", slot=slot, shard=self.shard,
                                                               shards=self.shards, max=self.batch, after=after))
        except psycopg.errors.QueryCanceled:
            return None
        except Exception as exc:
            if not rejects_arguments(exc):
                raise
            log.warning("%s: a batch could not be loaded (%s); running it check by check", self.name, exc)
            return None
        self._clock_lap("take + in-database jobs")
        self.last_id = row["last_id"]
        if "job_outcomes" in row:
            for job, by_outcome in (row["job_outcomes"] or {}).items():
                for outcome, n in by_outcome.items():
                    self._count(outcome, n, job_label(job))
        else:  # a database not migrated yet
            for outcome, n in (row["outcomes"] or {}).items():
                self._count(outcome, n, OTHER_JOBS)
        results: dict[int, Result] = {}
        jobs: dict[int, str] = {}  # id -> job label, of the Python checks
        checks = []
        for values in row["checks"] or ():
            try:
                checks.append(Check.from_values(values))
            except Exception as exc:  # noqa: BLE001 - a check this runner cannot load ends alone
                results[values[0]] = Result(error=_failure(exc))
                jobs[values[0]] = self._python_job(values[3] if len(values) > 3 else None)
        results.update(self._run_python(session, checks, jobs))
        self._finish(session, results, "python jobs", jobs)
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
        jobs = {c.id: self._python_job(c.job) if c.kind == "python" else job_label(c.job) for c in checks}
        results = {c.id: self._verdicts.pop(c.id) for c in checks if c.id in self._verdicts}
        results.update(self._run_sql_one_by_one(conn, session, [c.id for c in checks
                                                                if c.kind == "sql" and c.id not in results], jobs))
        task_ids = [c.id for c in checks if c.kind == "task" and c.id not in results]
        if task_ids:
            for r in session.call("submit_check_tasks", ids=task_ids):
                self._count("task" if r["task_rn"] is not None else "error", 1, jobs.get(r["id"], OTHER_JOBS))
        self._clock_lap("in-database jobs")
        results.update(self._run_python(session, [c for c in checks if c.kind == "python" and c.id not in results],
                                        jobs))
        self._finish(session, results, "python jobs", jobs)
        return len(rows)

    def _python_job(self, job: Any) -> str:
        """The job label of a Python check: UNREGISTERED when this runner has no handler for it."""
        return job_label(job) if isinstance(job, str) and job in self.handlers else UNREGISTERED

    def _run_python(self, session: Session, checks: list[Check], jobs: dict[int, str]) -> dict[int, Result]:
        """The Python checks' handlers, skipping those a client deletes meanwhile (``jobs``: id -> job
        label, filled in for these checks). Handlers run until the runner is asked to stop or they
        have run for ``timeout`` in all (run_handlers): the checks not started (``_left``) wait at
        their slot, so the batch's transaction stays open for at most about twice the timeout.
        None runs while ``max_abandoned`` abandoned handlers are still running (``_held_back``)."""
        if not checks:
            return {}
        if not self._may_run_handlers():
            self._left, self._held_back = len(checks), True
            return {}
        for c in checks:
            if c.id not in jobs:
                jobs[c.id] = self._python_job(c.job)
        ended: list[int] = []

        def deleted(ids: list[int]) -> list[int]:
            gone = [next(iter(r.values())) for r in session.call("end_deleted_checks", ids=_array(ids))]
            for check_id in gone:
                self._count("deleted", 1, jobs.get(check_id, OTHER_JOBS))
            ended.extend(gone)
            return gone

        results = run_handlers(checks, self.handlers, self.timeout, deleted, stop=self._stop,
                               abandoned=self._abandoned)
        self._left = len(checks) - len(results) - len(ended)
        if self.record_ids:
            self.ran.extend(results)
        return results

    def _may_run_handlers(self) -> bool:
        """False while ``max_abandoned`` handlers past their deadline are still running (logged
        once each time the bound is reached)."""
        self._abandoned[:] = [t for t in self._abandoned if t.is_alive()]
        if len(self._abandoned) < self.max_abandoned:
            self._bound_logged = False
            return True
        if not self._bound_logged:
            log.warning("%s: %d Python handlers past their deadline are still running (max_abandoned); no more "
                        "handlers run until one returns: Python checks wait at their slot", self.name,
                        len(self._abandoned))
            self._bound_logged = True
        return False

    def _finish(self, session: Session, results: dict[int, Result], lap: str, jobs: dict[int, str]) -> None:
        """Record results with one finish_checks (``jobs``: id -> job label)."""
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
            self._count(row["outcome"], 1, jobs.get(row["id"], OTHER_JOBS))
            if row["outcome"] == "not_taken":
                log.warning("check %s was not recorded: not taken by this transaction", row["id"])
        self._clock_lap("finish")

    def _run_sql_one_by_one(self, conn: psycopg.Connection, session: Session, ids: list[int],
                            jobs: dict[int, str]) -> dict[int, Result]:
        """Each SQL check in its own statement and savepoint: only the slow one times out, only the one
        whose result cannot be loaded fails; one the watchdog had to end is remembered (_Rerun). None
        starts once the runner is asked to stop: the rest waits at its slot."""
        results: dict[int, Result] = {}
        for check_id in ids:
            if self._stop.is_set():
                break
            try:
                with conn.transaction():
                    rows = self._watched(conn, lambda: session.call("run_check_jobs", ids=[check_id]))
            except psycopg.errors.QueryCanceled:
                results[check_id] = Result(timed_out=True, took=self.timeout,
                                           error=f"the job exceeded its statement timeout of {self.timeout:g} s")
                continue
            except _Rerun:
                limit = self.timeout + self.grace
                self._verdicts[check_id] = Result(
                    timed_out=True, took=limit,
                    error=f"the job did not stop at its statement timeout of {self.timeout:g} s; its connection "
                          f"was terminated after {limit:g} s")
                if len(self._verdicts) > 10_000:  # never taken again by this runner: forget the oldest
                    del self._verdicts[next(iter(self._verdicts))]
                raise
            except Exception as exc:
                if not rejects_arguments(exc):
                    raise
                results[check_id] = Result(error=f"its result could not be loaded: {_failure(exc)}")
                continue
            if not rows:
                self._count("deleted", 1, jobs.get(check_id, OTHER_JOBS))  # deleted meanwhile: ended without running
            for r in rows:
                results[check_id] = Result(next_check_at=r["next_check_at"], error=r["error"],
                                           took=_seconds(r["took"]))
        return results

    def _clock_lap(self, name: str) -> None:
        if self._clock is not None:
            self._clock.lap(name)

    def _count(self, key: str, n: int, job: str) -> None:
        """Count ``n`` checks of ``job`` (a job label) that ended with outcome ``key``."""
        self.counts[key] = self.counts.get(key, 0) + n
        if n:
            child = self._outcomes.get((job, key))
            if child is None:
                child = self._outcomes[(job, key)] = OUTCOMES.labels(job, key)
            child.inc(n)

    # -- passes ---------------------------------------------------------------------------------
    def run_slot(self, db: Database, slot: datetime) -> int:
        """The '=' pass: every check of ``slot`` in this shard, batch by batch. Each batch starts
        after the last id the previous one took (the front of the slot is dead index entries until
        VACUUM); the pass ends with a batch from the start of the slot, which takes any check
        another runner held while this one went past it."""
        total, after, held = 0, None, False
        while True:
            n = self.run_batch(db, slot, after)
            total += n
            held = held or self._held_back
            if self._stop.is_set():  # stopping: the rest waits for the catch-up pass
                return total
            if n == self.batch:
                after = self.last_id
            elif (after is None and not self._left) or held:
                # done; or handlers are held back: the Python checks wait for the catch-up pass, not
                # taken again and again from the start of the slot
                return total
            else:  # from the start of the slot: what other runners held, what this one left unstarted
                after = None

    def catch_up(self, db: Database) -> int:
        """The '<' pass: checks of this shard from slots before the current one."""
        total = 0
        while True:
            n = self.run_batch(db, None)
            total += n
            if (n < self.batch and not self._left) or self._stop.is_set() or self._held_back:
                if total:
                    log.info("%s: caught up %d checks from missed slots", self.name, total)
                    CAUGHT_UP.inc(total)
                return total

    def purge(self, db: Database) -> int:
        """Delete history past its retention (at most 10 batches of 10,000 a call)."""
        self._last_purge = time.monotonic()
        total = 0
        for _ in range(10):
            n = db.call_value("purge_check_history", batch=10_000)
            total += n
            if n < 10_000:
                break
        if total:
            log.info("%s: purged %d ended checks from the history", self.name, total)
        return total

    # -- the daemon -----------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        self._stop = stop
        outage = Outage(f"{self.name}: database", log)
        db = Database.for_daemon(self.dsn, name=self.name, max_size=1)
        try:
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
        finally:
            self._watchdog.close()
            db.close()

    def _step(self, db: Database, stop: threading.Event) -> None:
        info = db.call_one("check_slots")
        if info["resolution"] != self._resolution:
            if self._resolution is not None:  # set_check_settings changed it: follow the new slots now
                log.info("%s: check resolution changed from %s to %s", self.name, self._resolution,
                         info["resolution"])
                self.last_slot = None
            self._resolution = info["resolution"]
        action, arg = next_step(self.last_slot, info["slot"], info["clock"], info["resolution"])
        if action == "wait":
            # never past wake_every: a changed resolution takes effect at the next look, not at the
            # old slot's end (up to the old resolution later)
            stop.wait(min(arg, self.wake_every))
            return
        SLOT_LAG.set(max(0.0, (info["clock"] - arg).total_seconds()))
        SLOTS.inc()
        if action == "catch_up":  # start, or more than one slot missed: the catch-up pass, then the current slot
            self.catch_up(db)
            self.run_slot(db, arg)
        else:
            self.run_slot(db, arg)
            self.catch_up(db)  # periodically: also expires task jobs that never reported
        self.last_slot = arg
        if self.purge_interval and time.monotonic() - self._last_purge >= self.purge_interval:
            self.purge(db)
        self.slots_done.set()
