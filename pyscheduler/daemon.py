"""Running daemons: threads, signals, clean shutdown.

A daemon is any object with a ``name`` and a ``run(stop)`` method that works
until the ``threading.Event`` ``stop`` is set and then returns after finishing
its in-flight work. ``run_daemons`` runs several in threads, turns SIGTERM and
Ctrl-C into ``stop``, and returns 0 on a clean stop, 1 if a daemon crashed.

Capabilities plug in through ``pyscheduler/<capability>/cli.py``, which
exposes ``group`` (its click commands), ``daemons(ctx)`` (for ``pyscheduler
run``), ``demo(ctx, echo)`` (for ``pyscheduler demo``) and optionally
``bench`` (a click command, ``pyscheduler bench <capability>``).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

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


def run_daemons(daemons: Iterable[Daemon], stop: threading.Event, *, join_timeout: float = 30.0) -> int:
    """Run each daemon in a thread until ``stop``; 0 when all stopped cleanly."""
    failed: list[str] = []

    def target(d: Daemon) -> None:
        try:
            d.run(stop)
        except BaseException:
            log.exception("daemon %s crashed", d.name)
            failed.append(d.name)
            stop.set()

    threads = [threading.Thread(target=target, args=(d,), name=d.name) for d in daemons]
    for t in threads:
        t.start()
    while not stop.wait(0.5):
        pass
    for t in threads:
        t.join(join_timeout)
        if t.is_alive():
            log.error("daemon %s did not stop within %.0fs", t.name, join_timeout)
            failed.append(t.name)
    return 1 if failed else 0
