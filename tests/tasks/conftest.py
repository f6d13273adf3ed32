"""Fixtures of the leased tasks' tests (their helpers: tests.support.tasks)."""

from __future__ import annotations

import threading

import pytest

from pyscheduler.tasks import Monitor, TaskClient


@pytest.fixture
def client(db):
    return TaskClient(db)


@pytest.fixture
def monitor(dsn):
    """A monitor daemon in a thread, resetting expired leases every 0.2 s."""
    stop = threading.Event()
    mon = Monitor(dsn, reset_interval=0.2)
    thread = threading.Thread(target=mon.run, args=(stop,), daemon=True)
    thread.start()
    yield mon
    stop.set()
    thread.join(10)
    assert not thread.is_alive()
