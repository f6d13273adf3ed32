"""Leased tasks (seeds/scylla.md): queues, priorities, leases, heartbeats,
cancel, yield, and a monitor that resets expired leases.

* ``TaskClient``: submit, get, list, cancel.
* ``Worker``: register, lease woken by NOTIFY, heartbeats with progress,
  cancellation delivered to the handler, yield on stop.
* ``Monitor``: the daemon that resets expired leases and cleans up.

The SQL API (sql/tasks.sql, docs/sql-api.md) is the product; this package
only calls it.
"""

from .client import TaskClient
from .monitor import Monitor
from .worker import Abort, RunningWorker, TaskContext, Worker

__all__ = ["Abort", "Monitor", "RunningWorker", "TaskClient", "TaskContext", "Worker"]
