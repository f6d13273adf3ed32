"""Future checks ("Are we there yet?"): slot-rounded checks with guards and history.

SQL API in sql/checks/ (docs/sql-api.md, "Future checks"); the runner in
:mod:`pyscheduler.checks.runner`; ``pyscheduler checks ...`` in cli.py; ``CheckClient``
(``AsyncCheckClient``) adds, deletes and lists checks from Python.
"""

from .runner import HANDLERS, Check, CheckRunner, handler, import_handlers
from .tasks import task_handler
from .client import AddedCheck, AsyncCheckClient, CheckClient, EndedCheck

__all__ = ["HANDLERS", "AddedCheck", "AsyncCheckClient", "Check", "CheckClient", "CheckRunner", "EndedCheck",
           "handler", "import_handlers", "task_handler"]
