"""The worker library of leased tasks: a ``Worker`` leases tasks of one queue ahead into a local
queue and runs its handler on each in ``capacity`` threads (docs/python-api.md, "Leased tasks").

outcomes.py    what a handler's end records: a return, Abort, Retry, Snooze, Suspended, any other exception
context.py     TaskContext: what a handler gets, its durable steps, sleeps and waits (Suspended)
localqueue.py  the tasks leased ahead, waiting for a free handler, and the lease loop filling it
recorder.py    completions and failures recorded in batches; every other outcome one by one
heartbeats.py  one heartbeat_tasks call renews every lease held
lifecycle.py   Worker (registration, threads, handlers, stop) and RunningWorker
"""

from .context import Handler, Suspended, TaskContext
from .lifecycle import RunningWorker, Worker
from .outcomes import Abort, Retry, Snooze, error_entry, json_safe

__all__ = ["Abort", "Handler", "Retry", "RunningWorker", "Snooze", "Suspended", "TaskContext", "Worker",
           "error_entry", "json_safe"]
