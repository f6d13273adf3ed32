"""Python check handlers for tests that run ``pyscheduler checks run --handlers tests.support.checks_handlers``."""

import time

from pyscheduler.checks import handler


@handler("slow")
def slow(check):
    time.sleep(0.1)
    return None
