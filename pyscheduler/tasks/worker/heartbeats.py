"""Heartbeats: every ``heartbeat_interval`` (and at once on a cancel's NOTIFY) one
``heartbeat_tasks`` call renews every lease the worker holds, queued ones included, with their
progress; it answers only the leases it refused, whose handlers are told to stop (a queued one
is dropped). A lease renewed at t cannot expire before t + timeout (``ctx.lease_until``)."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from ...db import Outage, Wakeup
from ...errors import LEASE_GONE, TaskCancelled, is_retryable
from .. import sqlapi as sql
from .context import TaskContext, leases

if TYPE_CHECKING:
    from .lifecycle import Worker

log = logging.getLogger(__package__)


class Heartbeats:
    """The heartbeats of one Worker's leases; ``run(stop)`` is the heartbeat thread, ``wake``
    sends the next beat at once."""

    def __init__(self, worker: Worker):
        self.worker = worker
        self.db, self.lock, self.held = worker.db, worker._lock, worker.held
        self.wake = Wakeup()

    def run(self, stop: threading.Event) -> None:
        outage = Outage(f"heartbeats of {self.worker.worker_id}", log)
        while not stop.is_set():
            self.wake.wait(self.worker.heartbeat_interval, jitter=0.1)
            if stop.is_set():
                return
            try:
                self._beat_once(stop, outage)
            except Exception as exc:  # never let the heartbeat thread die: leases would expire
                log.error("heartbeats failed unexpectedly", exc_info=True)
                stop.wait(outage.failed(exc))

    def _beat_once(self, stop: threading.Event, outage: Outage) -> None:
        with self.lock:
            # Leases still ours: queued, running, draining on a stop without yield, or an
            # outcome still being recorded (retries must not outlive the lease).
            held = [c for c in self.held.values() if c.reason not in ("cancelled", "lost", "yielded", "suspended")]
        if not held:
            return
        timeout = self.worker.timeout
        sent = time.monotonic()
        progress = [None if c._progress is None else float(c._progress) for c in held]  # float8[] in binary
        try:
            rns, tokens = leases(held)
            refused = self.db.call_binary(sql.HEARTBEAT_TASKS, rns=rns, tokens=tokens,
                                          progress=progress if any(p is not None for p in progress) else None,
                                          timeout=timeout)
            outage.ok()
        except Exception as exc:
            if is_retryable(exc):
                stop.wait(outage.failed(exc))
                return
            # a deliberate error about one of them (a progress the database refuses):
            # beat one by one, so the others keep their leases
            log.error("heartbeats of %d tasks refused (%s); sending them one by one", len(held), exc)
            self._beat_each(held, stop, outage)
            return
        until = sent + timeout.total_seconds()
        gone = {str(r["rn"]): r["sqlstate"] for r in refused}
        for ctx in held:
            code = gone.get(ctx.rn)
            if code is None:
                ctx.lease_until = until
            else:
                self._lease_gone(ctx, TaskCancelled if code == "PS203" else None, code)

    def _beat_each(self, held: list[TaskContext], stop: threading.Event, outage: Outage) -> None:
        timeout = self.worker.timeout
        for ctx in held:
            sent = time.monotonic()
            try:
                self.db.call(sql.HEARTBEAT_TASK, rn=ctx.rn, token=ctx.token, progress=ctx._progress, timeout=timeout)
                ctx.lease_until = sent + timeout.total_seconds()
                outage.ok()
            except LEASE_GONE as exc:  # any answer meaning "this lease is gone" stops the handler
                self._lease_gone(ctx, type(exc), str(exc))
            except Exception as exc:
                if not is_retryable(exc):  # a deliberate error about this task: the others go on
                    log.error("heartbeat of task %s failed: %s", ctx.rn, exc)
                    continue
                stop.wait(outage.failed(exc))
                break

    def _lease_gone(self, ctx: TaskContext, kind: type | None, why: str) -> None:
        """A heartbeat's answer: this lease is gone. Tell the handler; a queued task is dropped."""
        with self.lock:
            if ctx.finishing:
                return  # finished meanwhile: the outcome's recording reports it
            cancelled = kind is not None and issubclass(kind, TaskCancelled)
            if cancelled:
                log.info("task %s was cancelled: telling its handler", ctx.rn)
            else:
                log.warning("task %s: lease lost (%s): telling its handler", ctx.rn, why)
            ctx._stop("cancelled" if cancelled else "lost")
            if not ctx.started and self.held.get(ctx.rn) is ctx:
                del self.held[ctx.rn]  # never started: nothing more to do for it
