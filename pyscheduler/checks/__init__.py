"""Future checks ("Are we there yet?"): slot-rounded checks with guards and history.

SQL API in sql/checks.sql (docs/sql-api.md, "Future checks"); the runner in
:mod:`pyscheduler.checks.runner`; ``pyscheduler checks ...`` in cli.py.
"""

from .runner import HANDLERS, Check, CheckRunner, handler, import_handlers
from .tasks import task_handler

__all__ = ["HANDLERS", "Check", "CheckRunner", "handler", "import_handlers", "task_handler"]
