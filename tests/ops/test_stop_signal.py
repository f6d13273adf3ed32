"""Daemon plumbing: a stop signal always stops the process."""

from __future__ import annotations

import subprocess
import sys

# The state a worker was found wedged in (py-spy): SIGTERM landed while the main thread,
# inside stop.wait(), held stop's own lock; a handler calling stop.set() there waits
# for that lock forever and the process ignores every further SIGTERM.
WEDGE = """
import signal, threading
from pyscheduler.daemon import install_signal_handlers
stop = threading.Event()
install_signal_handlers(stop)
with stop._cond:  # the main thread holds the event's lock, as inside stop.wait()
    signal.raise_signal(signal.SIGTERM)  # the handler runs here, in this thread
assert stop.wait(5), "stop was not set"
print("stopped")
"""


def test_sigterm_while_the_main_thread_holds_the_stop_events_lock_still_stops():
    out = subprocess.run([sys.executable, "-c", WEDGE], capture_output=True, text=True, timeout=15)
    assert out.returncode == 0 and out.stdout.strip() == "stopped", out.stderr[-2000:]
