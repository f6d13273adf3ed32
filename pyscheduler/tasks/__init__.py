"""Leased tasks (seeds/scylla.md): queues, priorities, leases, heartbeats,
cancel, yield, and a monitor that resets expired leases.

* ``TaskClient``: submit, get, list, cancel, on pyscheduler's pool or on the
  application's connection in its transaction (``AsyncTaskClient`` for asyncio);
  results are ``Task`` objects.
* ``Worker``: register, lease woken by NOTIFY into a local queue (prefetch),
  handler threads, batched heartbeats, completions and failures (retried with
  backoff; ``Abort`` aborts, ``Retry`` picks the delay, ``Snooze`` puts it
  back for later without using an attempt; a return value is the result), cancellation
  delivered to the handler, yield on stop.
* ``AsyncWorker`` (``pyscheduler.tasks.aio``): the same for ``async def`` handlers.
* ``Monitor``: the daemon that resets expired leases and cleans up.

The SQL API (sql/tasks/, docs/sql-api.md) is the product; this package
only calls it.
"""

from .client import TaskClient
from .aio import AsyncTaskContext, AsyncWorker
from .monitor import Monitor
from .worker import Abort, Retry, RunningWorker, Snooze, TaskContext, Worker

__all__ = ["Abort", "AsyncTaskContext", "AsyncWorker", "Monitor", "Retry", "RunningWorker", "Snooze", "TaskClient",
           "TaskContext", "Worker"]

from .client import (AsyncTaskClient, AsyncTaskHandle, QueueLimits, Task, TaskFailed, TaskHandle,  # noqa: E402
                     Workflow)

__all__ += ["AsyncTaskClient", "AsyncTaskHandle", "QueueLimits", "Task", "TaskFailed", "TaskHandle", "Workflow"]
