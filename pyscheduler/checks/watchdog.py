"""The checks runner's watchdog: ends a statement that outlives its deadline (a SQL job that
catches its statement timeout's cancel and goes on) by terminating its backend from a
connection of its own."""

from __future__ import annotations

import contextlib
import logging
import threading
import time

import psycopg

from ..db import connect
from . import sqlapi as sql

log = logging.getLogger("pyscheduler.checks.runner")


class Watch:
    """One watched statement: its backend, its deadline, and whether the watchdog ended it."""

    __slots__ = ("pid", "deadline", "fired")

    def __init__(self, pid: int, deadline: float):
        self.pid, self.deadline, self.fired = pid, deadline, False


class Watchdog:
    """Ends a statement that outlives its deadline: terminates its backend from a connection of its
    own (a job that catches the statement timeout's cancel would otherwise run forever, holding the
    runner and its batch's locks). One thread per runner, started on first use."""

    def __init__(self, dsn: str, name: str):
        self.dsn, self.name = dsn, name
        self._cond = threading.Condition()
        self._watch: Watch | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    @contextlib.contextmanager
    def watch(self, conn: psycopg.Connection, seconds: float):
        w = Watch(conn.info.backend_pid, time.monotonic() + seconds)
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
                conn.execute(sql.TERMINATE_BACKEND, (pid,))
        except Exception as exc:  # noqa: BLE001 - the database is down: so is the statement
            log.warning("%s: could not terminate backend %s: %s", self.name, pid, exc)

