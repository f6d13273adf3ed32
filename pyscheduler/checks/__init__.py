"""Future checks ("Are we there yet?"): slot-rounded checks with guards and history.

SQL API in sql/checks/ (docs/sql-api.md, "Future checks"), what Python uses of it in
sqlapi.py; the runner in :mod:`pyscheduler.checks.runner` (Python jobs: handlers.py);
``pyscheduler checks ...`` in cli.py; ``CheckClient`` (``AsyncCheckClient``) adds, deletes
and lists checks from Python.
"""

from .handlers import HANDLERS, Check, handler, import_handlers
from .runner import CheckRunner
from .tasks import task_handler
from .client import AddedCheck, AsyncCheckClient, CheckClient, EndedCheck

__all__ = ["HANDLERS", "AddedCheck", "AsyncCheckClient", "Check", "CheckClient", "CheckRunner", "EndedCheck",
           "handler", "import_handlers", "task_handler"]
