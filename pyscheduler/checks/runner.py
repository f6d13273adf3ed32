"""The future-check runner, a daemon: at each slot boundary (the database clock decides; slot
arithmetic in UTC) it runs its shard of the slot batch by batch, after the catch-up pass for the
slots missed. A batch is one transaction: ``run_due_checks`` takes the checks and runs their SQL
and task jobs in one statement, the Python ones run here (handlers.py), ``finish_checks`` records
them; a batch that timed out runs again one SQL job per statement, and a statement that ignores
its timeout is ended (watchdog.py). docs/operations.md, "Future checks".
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta, timezone
from functools import partial
from typing import Any

import psycopg
from prometheus_client.core import GaugeMetricFamily

from .. import metrics
from ..db import Database, Outage, Session
from ..errors import SlotNotOnBoundary, SlotNotStarted, is_retryable, rejects_arguments
from . import sqlapi as sql
from .handlers import ABANDONED, HANDLERS, Check, Handler, Result, failure, run_handlers
from .watchdog import Watchdog

log = logging.getLogger(__name__)

UTC = timezone.utc


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
RUNNER_SERIES = (OUTCOMES, SLOT_LAG, SLOTS, CAUGHT_UP, BATCH_SECONDS, ABANDONED)


def overdue_gauge(db: Database):
    """Checks past their slot and not yet run (overdue_checks, counted up to COUNT_UP_TO)."""
    n = db.query(sql.OVERDUE_CHECKS_COUNT, (metrics.COUNT_UP_TO,))[0]["n"]
    return (GaugeMetricFamily("pyscheduler_checks_overdue", "Checks past their slot and not yet run (counted up "
                                                            f"to {metrics.COUNT_UP_TO})", value=n),)


class CheckRunner:
    """Runs the checks of its shard slot by slot (a daemon: ``run(stop)``)."""

    series = RUNNER_SERIES  # the class's; an instance adds its Reads (overdue checks)
    wake_every = 1.0  # s: the longest sleep between two looks at check_slots (a changed resolution)

    def __init__(self, dsn: str, handlers: dict[str, Handler] | None = None, *, shard: int = 0, shards: int = 1,
                 batch: int = 1000, timeout: float = 10.0, name: str | None = None,
                 purge_interval: float = 60.0, grace: float | None = None, max_abandoned: int = 10):
        self.dsn = dsn
        self.series = (*RUNNER_SERIES, metrics.Reads(dsn, "checks", overdue_gauge))  # what its process exports
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
        self._watchdog = Watchdog(dsn, self.name)
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
            row = self._watched(conn, lambda: session.call_one(sql.RUN_DUE_CHECKS, slot=slot, shard=self.shard,
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
                    if outcome in ("error", "timeout") and n:  # in-database jobs: their errors are in the history
                        log.warning("%s: %d check%s of job %s ended with %s (pyscheduler checks history shows why)",
                                    self.name, n, "" if n == 1 else "s", job, outcome)
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
                results[values[0]] = Result(error=failure(exc))
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
            rows = session.call(sql.CATCH_UP_CHECKS, shard=self.shard, shards=self.shards, max=self.batch)
        else:
            rows = session.call(sql.DUE_CHECKS, slot=slot, shard=self.shard, shards=self.shards, max=self.batch)
        self._clock_lap("take")
        checks = [Check.from_row(r) for r in rows]
        jobs = {c.id: self._python_job(c.job) if c.kind == "python" else job_label(c.job) for c in checks}
        results = {c.id: self._verdicts.pop(c.id) for c in checks if c.id in self._verdicts}
        results.update(self._run_sql_one_by_one(conn, session, [c.id for c in checks
                                                                if c.kind == "sql" and c.id not in results], jobs))
        task_ids = [c.id for c in checks if c.kind == "task" and c.id not in results]
        if task_ids:
            for r in session.call(sql.SUBMIT_CHECK_TASKS, ids=task_ids):
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
            gone = [next(iter(r.values())) for r in session.call(sql.END_DELETED_CHECKS, ids=_array(ids))]
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
        out = session.call(sql.FINISH_CHECKS, ids=_array(ids), next_check_ats=_or_none([r.next_check_at for r in rs]),
                           errors=_or_none([r.error for r in rs]),
                           timed_out=_or_none([r.timed_out or None for r in rs]),
                           took=_array(f"{r.took:.6f}" for r in rs))
        for row in out:
            self._count(row["outcome"], 1, jobs.get(row["id"], OTHER_JOBS))
            if row["outcome"] == "not_taken":
                log.warning("check %s was not recorded: not taken by this transaction", row["id"])
            elif row["outcome"] in ("error", "timeout"):
                log.warning("check %s (job %s) ended with %s: %s", row["id"], jobs.get(row["id"], OTHER_JOBS),
                            row["outcome"], results[row["id"]].error)
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
                    rows = self._watched(conn, partial(session.call, sql.RUN_CHECK_JOBS, ids=[check_id]))
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
                results[check_id] = Result(error=f"its result could not be loaded: {failure(exc)}")
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
            n = db.call_value(sql.PURGE_CHECK_HISTORY, batch=10_000)
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
        info = db.call_one(sql.CHECK_SLOTS)
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
