"""Leased tasks (seeds/scylla.md): queues, priorities, leases, heartbeats, cancel, yield, and a
monitor that resets expired leases. The SQL API (sql/tasks/, docs/sql-api.md) is the product;
this package calls it, naming it only in ``sqlapi.py``.

* ``TaskApp`` (``app.py``): task functions (``@app.task``), periodic tasks, their workers, tests.
* ``TaskClient`` (``AsyncTaskClient``): submit, get, list, cancel, requeue, pause; ``Task`` results.
* ``Worker`` (``worker/``; ``AsyncWorker`` in ``aio.py``): the worker library. A handler's return
  completes its task (the value its result), ``Abort`` aborts it, ``Retry`` and any other
  exception fail the attempt, ``Snooze`` puts it back for later, ``Suspended`` a durable sleep.
* ``Monitor``: the daemon that resets expired leases and cleans up."""

from .client import AsyncTaskClient, AsyncTaskHandle, QueueLimits, Task, TaskClient, TaskFailed, TaskHandle, Workflow
from .aio import AsyncTaskContext, AsyncWorker
from .monitor import Monitor
from .worker import Abort, Retry, RunningWorker, Snooze, Suspended, TaskContext, Worker
from .app import TaskApp
from .functions import TaskFunction, current_context

__all__ = ["Abort", "AsyncTaskClient", "AsyncTaskContext", "AsyncTaskHandle", "AsyncWorker", "Monitor", "QueueLimits",
           "Retry", "RunningWorker", "Snooze", "Suspended", "Task", "TaskApp", "TaskClient", "TaskContext",
           "TaskFailed", "TaskFunction", "TaskHandle", "Worker", "Workflow", "current_context"]
