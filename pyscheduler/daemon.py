"""Running daemons: threads, signals, clean shutdown.

A daemon is any object with a ``name`` and a ``run(stop)`` method that works until the
``threading.Event`` ``stop`` is set, then returns after finishing its in-flight work; it may
offer ``fresh()`` (a new instance with its settings, for a restart) and ``degraded_reason()``
(why it does only part of its job now, None: all of it; ``/readyz`` shows it). ``run_daemons``
runs several in threads and restarts one that crashes (backoff, its siblings go on); SIGTERM
and Ctrl-C set ``stop`` (``install_signal_handlers``). The outage rule every daemon follows:
docs/operations.md, "Outages"; how a capability plugs in: docs/contributing.md, "Layout".
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .errors import ConfigError

log = logging.getLogger(__name__)


class Daemon(Protocol):
    name: str

    def run(self, stop: threading.Event) -> None: ...


@dataclass
class RunContext:
    """What a capability needs to build its daemons or run its demo."""

    dsn: str
    kafka_bootstrap: str | None = None
    redis_url: str | None = None
    kafka_settings: dict[str, str] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)


def install_signal_handlers(stop: threading.Event) -> None:
    """SIGTERM and SIGINT set ``stop`` (a second Ctrl-C is left to the default)."""

    def handler(signum: int, _frame: object) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        # Not stop.set() here: the handler runs in the main thread between two bytecodes,
        # possibly while that thread holds stop's own (non-reentrant) lock inside
        # stop.wait(), and set() would then wait for it forever (seen: a worker that
        # ignored SIGTERM). Another thread sets it once the main thread lets go.
        threading.Thread(target=stop.set, name="signal-stop", daemon=True).start()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def run_daemons(daemons: Iterable[Daemon], stop: threading.Event, *, join_timeout: float = 30.0,
                first_backoff: float = 1.0, max_backoff: float = 60.0, health: Any = None) -> int:
    """Run each daemon in a thread until ``stop``; 0 when all stopped cleanly.

    A daemon whose ``run`` raises (or returns before ``stop``) is restarted after a
    backoff (``first_backoff`` doubling up to ``max_backoff``; back to the first after it
    ran for ``max_backoff``), with a log line each time: one crash never stops its
    siblings, and the process never goes on silently without it. A restart runs
    ``daemon.fresh()`` when the daemon has it (a new instance with the same settings:
    no state half-torn by the crash), else ``run`` again. Returns 1 when a daemon
    crashed at least once or did not stop within ``join_timeout``. A ``ConfigError`` on a
    daemon's first run (it cannot start as configured) stops the process instead.
    ``health`` (pyscheduler.web.endpoint.Health) is told when each daemon runs and when it
    is down (crashed, waiting to restart), under the name it started with."""
    crashes: list[str] = []
    daemons = list(daemons)

    def target(d: Daemon) -> None:
        try:
            supervise(d)
        finally:
            if health is not None:
                health.down(d.name, "stopped", crashed=False)

    def supervise(d: Daemon) -> None:
        backoff = first_backoff
        first = True
        key = d.name
        while not stop.is_set():
            started = time.monotonic()
            if health is not None:
                health.running(key, d)
            try:
                d.run(stop)
                if stop.is_set():
                    return
                why = "returned before it was stopped"
                log.error("daemon %s %s", d.name, why)
            except ConfigError as exc:
                crashes.append(d.name)
                if first:  # the operator's mistake, told at once (e.g. a topic that does not exist)
                    log.error("daemon %s cannot start: %s; stopping", d.name, exc)
                    stop.set()
                    return
                why = f"crashed: {exc}"
                log.error("daemon %s %s", d.name, why)
            except BaseException as exc:  # noqa: BLE001 - whatever it was, its siblings go on
                why = f"crashed: {type(exc).__name__}: {exc}"
                log.exception("daemon %s crashed", d.name)
            if health is not None:
                health.down(key, why.splitlines()[0] if why else "crashed")
            first = False
            crashes.append(d.name)
            if time.monotonic() - started >= max_backoff:
                backoff = first_backoff
            log.error("daemon %s %s; restarting it in %.1fs", d.name, why.splitlines()[0] if why else "", backoff)
            if stop.wait(backoff):
                return
            backoff = min(max_backoff, backoff * 2)
            fresh = getattr(d, "fresh", None)
            if fresh is not None:
                try:
                    d = fresh()
                except Exception:  # noqa: BLE001 - a failed rebuild runs the old instance again
                    log.exception("daemon %s could not be rebuilt; running the old instance again", d.name)
            log.warning("daemon %s restarting", d.name)

    if health is not None:
        for d in daemons:
            health.expect(d.name)
    threads = [threading.Thread(target=target, args=(d,), name=d.name) for d in daemons]
    for t in threads:
        t.start()
    while not stop.wait(0.5):
        pass
    failed = bool(crashes)
    for t in threads:
        t.join(join_timeout)
        if t.is_alive():
            log.error("daemon %s did not stop within %.0fs", t.name, join_timeout)
            failed = True
    return 1 if failed else 0


def wait_for(condition: Callable[[], Any], timeout: float = 30.0, what: str = "the condition",
             interval: float = 0.02) -> Any:
    """Poll ``condition`` until it is truthy; its value, or TimeoutError naming ``what`` after
    ``timeout`` seconds. For demos, benches and tests, which watch what other threads and
    processes change (a generous default: a busy machine is slow, not wrong)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)
