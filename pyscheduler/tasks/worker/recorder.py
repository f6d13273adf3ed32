"""The recorder: a handler's outcome, written to the database. Completions and failures wait in
one batch buffer for the recorder thread, which writes everything finished meanwhile with one
``complete_tasks`` and one ``fail_tasks`` call on a connection of its own, durably; only then
does a task count as done (it leaves ``Worker.held``). Aborts and yields, and any write the
database refuses as data, go one at a time, so one poison outcome never holds back the others."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg

from ...db import HeldConnection, Jsonb, Outage, UuidArray
from ...errors import LEASE_GONE, SchedulerError, TaskCancelled, is_retryable, rejects_arguments
from .. import sqlapi as sql
from .context import TaskContext, leases
from .outcomes import error_entry

if TYPE_CHECKING:
    from .lifecycle import Worker

log = logging.getLogger(__package__)

MAX_UNRECORDED = 1000  # completions (or failures) waiting to be recorded before handlers wait (one call)


class _Discard(SchedulerError):
    """Internal: the lease this outcome belongs to is gone (the task was leased again)."""


class Recorder:
    """Records the outcomes of one Worker's handlers (see the module doc). Its buffers and
    ``held`` are guarded by the worker's lock; ``run(stop)`` is the recorder thread."""

    def __init__(self, worker: Worker):
        self.worker = worker
        self.db, self.lock, self.held, self.halt = worker.db, worker._lock, worker.held, worker._halt
        self.counted = worker._counted
        self.completions: list[TaskContext] = []  # for the next complete_tasks call
        self.failures: list[TaskContext] = []  # (ctx.failure) for the next fail_tasks call
        self.recordable = threading.Condition(self.lock)  # a buffer got an entry
        self.room = threading.Condition(self.lock)  # the recorder took them (back-pressure)
        self.completed = 0  # completions recorded (durably)
        self.failed = 0  # failed attempts recorded (retried, or aborted after their last attempt)

    # -- from the handlers

    def queue_completion(self, ctx: TaskContext, block: bool) -> bool:
        """(Under the lock.) Queue the completion of ``ctx`` for the next batch; False, queuing
        nothing, when MAX_UNRECORDED wait and not ``block`` (``block`` waits instead)."""
        while len(self.completions) >= MAX_UNRECORDED:
            if not block:
                return False
            self.room.wait()  # the recorder takes the list and leaves a new one
        ctx.finishing = True
        completions = self.completions
        completions.append(ctx)
        if len(completions) == 1:
            self.recordable.notify()
        return True

    def queue(self, ctx: TaskContext, function: str, args: dict[str, Any], block: bool) -> bool:
        """(Under the lock.) Queue a completion or a failure for the next batch; False, queuing
        nothing, when MAX_UNRECORDED wait and not ``block`` (``block`` waits instead)."""
        if function is sql.COMPLETE_TASK:
            return self.queue_completion(ctx, block)
        while len(self.failures) >= MAX_UNRECORDED:
            if not block:
                return False
            self.room.wait()
        ctx.failure = args
        self.failures.append(ctx)
        self.recordable.notify()
        return True

    def settle(self, ctx: TaskContext, function: str) -> str | None:
        """What to record for a handler's outcome: ``function``, yield_task, or None (nothing:
        yielded on shutdown, lease lost, cancelled). From here heartbeats leave the task alone."""
        with self.lock:
            ctx.finishing = True
            reason = ctx.reason
            superseded = self.held.get(ctx.rn) is not ctx
        if reason == "yielded":
            return None  # handed back on shutdown: another worker's now
        if reason == "lost" or superseded:
            log.info("task %s: lease lost; the outcome of this execution is discarded", ctx.rn)
            return None
        if function is sql.COMPLETE_TASK and reason is not None and not ctx.completed:
            # Told to stop and returned without saying it finished: not completed.
            if reason == "cancelled":
                log.info("task %s was cancelled; it stays cancelled", ctx.rn)
                return None
            log.info("task %s: handler returned after being told to stop (%s); yielding it unfinished",
                     ctx.rn, reason)
            return sql.YIELD_TASK
        return function

    def outcome(self, ctx: TaskContext, function: str, args: dict[str, Any]) -> None:
        """Record a handler's outcome the careful way (aborts, failures, stops, lost leases)."""
        queued = False
        try:
            settled = self.settle(ctx, function)
            if settled is sql.COMPLETE_TASK or settled is sql.FAIL_TASK:
                with self.lock:
                    queued = self.queue(ctx, settled, args, block=True)
            elif settled is not None:
                self.record(ctx, settled, args)
        except Exception:  # never silently, and never kill the handler thread
            log.exception("task %s: recording the outcome failed", ctx.rn)
        finally:
            if not queued:
                self.release(ctx)

    def record(self, ctx: TaskContext, function: str, args: dict[str, Any]) -> None:
        """Record an abort or a yield now (in the calling thread)."""
        if function is sql.ABORT_TASK or function is sql.FAIL_TASK:
            self._record_error(ctx, function, args)
        else:
            self._finish(ctx, function, **args)

    def release(self, ctx: TaskContext) -> None:
        with self.lock:
            if self.held.get(ctx.rn) is ctx:  # not a newer lease of the same task
                del self.held[ctx.rn]

    def wake(self) -> None:
        """Have the recorder thread look now (its stop was set): it looks every 0.1 s otherwise."""
        with self.recordable:
            self.recordable.notify_all()

    # -- the recorder thread: one complete_tasks call for all that finished meanwhile, one
    # fail_tasks call for the failures; a task counts as done once that call committed

    def run(self, stop: threading.Event) -> None:
        conn = HeldConnection(self.db)
        counted = self.counted
        try:
            while True:
                with self.recordable:
                    if not self.completions and not self.failures:
                        if stop.is_set():
                            return
                        self.recordable.wait(0.1)
                        continue
                    batch, self.completions = self.completions, []
                    failures, self.failures = self.failures, []
                    self.room.notify_all()
                try:
                    if batch:
                        self._complete(batch, conn)
                    if failures:
                        self._fail(failures, conn)
                    if counted is not None:
                        counted.drain()
                except Exception:  # never let the recorder die: it frees the leases
                    log.exception("recording %d completions and %d failures failed", len(batch), len(failures))
                    for ctx in batch + failures:
                        self.release(ctx)
        finally:
            conn.close()

    def _complete(self, batch: list[TaskContext], conn: HeldConnection) -> None:
        """Record completions with one complete_tasks call (durably), with the handlers' results;
        then they count as done. A result the database refuses (larger than
        task_max_result_bytes) is recorded alone: that task is aborted with the error, the
        others complete."""

        def call(live: list[TaskContext], rns: UuidArray, tokens: UuidArray) -> list[dict[str, Any]]:
            results = [c.result for c in live]
            if all(r is None for r in results):
                return conn.call_binary(sql.COMPLETE_TASKS, rns=rns, tokens=tokens)
            return conn.call_binary(sql.COMPLETE_TASKS, rns=rns, tokens=tokens,
                                    results=Jsonb([None if r is None else r.obj for r in results]))

        try:
            live, refused = self._write_batch(batch, "completions", call)
        except SchedulerError as exc:
            if rejects_arguments(exc) and any(c.result is not None for c in batch):
                log.error("recording %d completions together was refused (%s); recording them one by one",
                          len(batch), exc)
                self._complete_alone(batch)
                return
            log.error("could not record %d completions (%s); the monitor will reset them", len(batch), exc)
            for ctx in batch:
                self.release(ctx)
            return
        recorded = self._written(batch, live, refused, "finished")
        with self.lock:
            self.completed += recorded
        if self.counted is not None and recorded:
            self.counted.completed.inc(recorded)

    def _complete_alone(self, batch: list[TaskContext]) -> None:
        """Each completion of ``batch`` on its own; a result refused aborts its task."""
        for ctx in batch:
            if self.held.get(ctx.rn) is ctx:
                refused = self._finish(ctx, sql.COMPLETE_TASK, result=ctx.result)
                if refused is not None:
                    log.error("task %s: the database refused its result (%s); aborting it", ctx.rn, refused)
                    self._finish(ctx, sql.ABORT_TASK, errors=Jsonb([error_entry("ResultRefused", refused)]))
                else:
                    with self.lock:
                        self.completed += 1
            self.release(ctx)

    def _fail(self, batch: list[TaskContext], conn: HeldConnection) -> None:
        """Record failed attempts with one fail_tasks call, as _complete records completions. If
        the database refuses the call's data (one error it cannot store), each is recorded on its
        own (_record_error), so one poison error never holds back the others."""

        def call(live: list[TaskContext], rns: UuidArray, tokens: UuidArray) -> list[dict[str, Any]]:
            delays = [c.failure["retry_in"] for c in live]  # type: ignore[index]
            return conn.call_binary(sql.FAIL_TASKS, rns=rns, tokens=tokens,
                                    errors=Jsonb([c.failure["error"] for c in live]),  # type: ignore[index]
                                    retry_in=delays if any(d is not None for d in delays) else None)

        try:
            live, refused = self._write_batch(batch, "failures", call)
        except Exception as exc:  # noqa: BLE001 - refused as data, or not adaptable at all
            poison = rejects_arguments(exc) or not isinstance(exc, (SchedulerError, psycopg.Error))
            if not poison:
                log.error("could not record %d failures (%s); the monitor will reset them", len(batch), exc)
                for ctx in batch:
                    self.release(ctx)
                return
            log.error("recording %d failures together was refused (%s); recording them one by one", len(batch), exc)
            for ctx in batch:
                if self.held.get(ctx.rn) is ctx:
                    self._record_error(ctx, sql.FAIL_TASK, ctx.failure or {})
                self.release(ctx)
            return
        recorded = self._written(batch, live, refused, "failed")
        with self.lock:
            self.failed += recorded
        if self.counted is not None and recorded:
            self.counted.failed.inc(recorded)

    def _write_batch(self, batch: list[TaskContext], what: str,
                     write: Callable[[list[TaskContext], UuidArray, UuidArray], list[dict[str, Any]]]
                     ) -> tuple[list[TaskContext], list[dict[str, Any]]]:
        """``write(live, rns, tokens)`` for the leases of ``batch`` still ours, retried through
        database trouble (_retry): (those leases, the rows it refused). Not the outcome of a
        lease lost meanwhile (the task leased again)."""
        live = batch

        def call() -> list[dict[str, Any]]:
            nonlocal live
            with self.lock:
                live = [c for c in batch if self.held.get(c.rn) is c]
            if not live:
                return []
            rns, tokens = leases(live)
            return write(live, rns, tokens)

        _, refused = self._retry(f"{what} of {self.worker.worker_id}", call)
        return live, refused or []

    def _written(self, batch: list[TaskContext], live: list[TaskContext], refused: list[dict[str, Any]],
                 done: str) -> int:
        """After a batch write: say why a task's outcome was not recorded (its lease was lost, or
        it was cancelled), and release every lease of the batch. How many were recorded."""
        if len(live) != len(batch):
            kept = {id(c) for c in live}
            for ctx in batch:
                if id(ctx) not in kept:
                    log.info("task %s: lease lost; the outcome of this execution is discarded", ctx.rn)
        if refused:
            why = {str(r["rn"]): r["sqlstate"] for r in refused}
            for ctx in batch:
                code = why.get(ctx.rn)
                if code == "PS203":
                    log.info("task %s was cancelled before it %s; it stays cancelled", ctx.rn, done)
                elif code:
                    log.warning("task %s: lease lost before it %s (SQLSTATE %s)", ctx.rn, done, code)
        with self.lock:
            held = self.held
            for ctx in batch:
                if held.get(ctx.rn) is ctx:
                    del held[ctx.rn]
        return len(live) - len(refused)

    # -- one outcome at a time

    def _retry(self, what: str, call: Callable[[], Any]) -> tuple[bool, Any]:
        """(True, call()) once it succeeds. An outage (errors.is_retryable) is retried with
        backoff until the worker stops, then for at most one lease length (the lease is gone
        after that anyway): (False, None), logged. Anything else propagates: a deliberate
        answer, data the database refuses, a missing privilege, a bug."""
        outage = Outage(what, log)
        give_up_at: float | None = None
        while True:
            try:
                result = call()
                outage.ok()
                return True, result
            except Exception as exc:
                if not is_retryable(exc):
                    raise  # an answer, data the database refuses or a bug: the same call cannot succeed
                delay = outage.failed(exc)
            if self.halt.is_set():
                now = time.monotonic()
                if give_up_at is None:
                    give_up_at = now + self.worker.timeout.total_seconds()
                if now >= give_up_at:
                    log.error("%s: giving up, the worker is stopping and the database still fails; "
                              "the monitor resets the lease when it expires", what)
                    return False, None
                time.sleep(min(delay, give_up_at - now))
            else:
                self.halt.wait(delay)

    def _record_error(self, ctx: TaskContext, function: str, args: dict[str, Any]) -> None:
        """Record an abort (``errors``) or a failure (``error``, ``retry_in``) on its own. Errors the
        database refuses as data (too many, too large, a value it cannot store) are replaced by
        one short sanitised error (a failure then takes the default backoff); if even that is
        refused, the task is yielded, so it never stays running with its slot taken."""
        if function is sql.ABORT_TASK:
            errors = args["errors"]
            refused = self._finish(ctx, function, errors=Jsonb(errors))
        else:
            errors = [args["error"]]
            refused = self._finish(ctx, function, error=Jsonb(errors[0]), retry_in=args.get("retry_in"))
        if refused is not None:
            log.error("task %s: the database refused the %s's error (%s); recording a short error instead",
                      ctx.rn, "abort" if function is sql.ABORT_TASK else "failure", refused)
            first = errors[0] if errors else {}
            short = error_entry(str(first.get("code", "error"))[:100], str(first.get("description", ""))[:100],
                                {"refused": str(refused)[:100]})
            if function is sql.ABORT_TASK:
                refused = self._finish(ctx, function, errors=Jsonb([short]))
            else:
                refused = self._finish(ctx, function, error=Jsonb(short))
            if refused is not None:
                log.error("task %s: the short error was refused too; yielding the task", ctx.rn)
                self._finish(ctx, sql.YIELD_TASK)
                return
        if function is sql.FAIL_TASK:
            with self.lock:
                self.failed += 1
            if self.counted is not None:
                self.counted.failed.inc()

    def _finish(self, ctx: TaskContext, function: str, **args: Any) -> Exception | None:
        """Record ``function`` (complete_task, abort_task, fail_task, yield_task) for ``ctx``,
        retried through database trouble. Returns the error when the database refused the call's
        data (the caller may record something else), else None (recorded, or the lease is gone,
        or given up)."""

        def call() -> None:
            if self.held.get(ctx.rn) is not ctx:
                raise _Discard("leased again")
            self.db.call(function, rn=ctx.rn, token=ctx.token, **args)

        try:
            done, _ = self._retry(f"{function} of task {ctx.rn}", call)
            if done and function is sql.YIELD_TASK:
                log.info("yielded task %s", ctx.rn)
        except _Discard:
            log.info("task %s: lease lost; the outcome of this execution is discarded", ctx.rn)
        except TaskCancelled:
            log.info("task %s was cancelled before it finished; it stays cancelled", ctx.rn)
        except LEASE_GONE as exc:
            log.warning("task %s: lease lost before it finished (%s)", ctx.rn, exc)
        except Exception as exc:  # noqa: BLE001 - refused as data, or not adaptable at all
            if rejects_arguments(exc) or not isinstance(exc, (SchedulerError, psycopg.Error)):
                return exc
            log.error("task %s: could not record the outcome (%s); the monitor will reset it", ctx.rn, exc)
        return None

    # -- handing leases back (a stopping worker)

    def yield_back(self, contexts: list[TaskContext], what: str) -> None:
        """Yield ``contexts`` (``what``: "queued" or "running") in one yield_tasks call; queued
        ones leave ``held`` (running ones when their handler returns)."""
        try:
            rns, tokens = leases(contexts)
            refused = self.db.call_binary(sql.YIELD_TASKS, rns=rns, tokens=tokens)
            gone = {str(r["rn"]): r["sqlstate"] for r in refused}
            for ctx in contexts:
                if ctx.rn in gone:
                    log.warning("could not yield %s task %s (SQLSTATE %s)", what, ctx.rn, gone[ctx.rn])
                elif what == "running":
                    log.info("yielded task %s", ctx.rn)
            if what == "queued":
                log.info("handed back %d queued tasks", len(contexts) - len(gone))
        except (SchedulerError, psycopg.Error) as exc:
            log.warning("could not yield %d %s tasks: %s", len(contexts), what, exc)
        if what == "queued":
            with self.lock:
                for ctx in contexts:
                    if self.held.get(ctx.rn) is ctx:
                        del self.held[ctx.rn]
