"""What the suite's tests share (more helpers live in the *_support.py modules by capability)."""

from pyscheduler.daemon import wait_for  # noqa: F401  (poll until truthy; TimeoutError)
