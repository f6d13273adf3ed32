"""What the suite's tests share; the helpers of one capability or concern are in this package's
modules (tests.support.delay, .schedules, .checks, .tasks, .dashboard, .ops, .reads)."""

from pathlib import Path

import psycopg

from pyscheduler import errors
from pyscheduler.daemon import wait_for  # noqa: F401  (the one poll-until helper: TimeoutError naming what)

REPO = Path(__file__).resolve().parents[2]


def code(fn) -> str | None:
    """The SQLSTATE ``fn()`` raised (from SQL or as the client's error), None if it did not."""
    try:
        fn()
    except (errors.SchedulerError, psycopg.Error) as exc:
        return exc.sqlstate
    return None
