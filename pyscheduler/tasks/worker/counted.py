"""The Worker's metric series, and a worker's children of them (``Worker(..., registry=R)``)."""

from __future__ import annotations

from collections import deque

from ... import metrics

# Series of Worker(..., registry=R): registered in R, counted per batch where there is one.
LEASED = metrics.counter("pyscheduler_worker_leased", "Tasks leased by Worker", ["queue"])
COMPLETED = metrics.counter("pyscheduler_worker_completed", "Completions recorded by Worker", ["queue"])
FAILED = metrics.counter("pyscheduler_worker_failed",
                         "Failed attempts recorded by Worker (a handler raised: retried after a backoff unless it "
                         "was the task's last attempt)", ["queue"])
RETRIED = metrics.counter("pyscheduler_worker_retried", "Attempts whose handler raised Retry (retried after the delay "
                                                        "it chose)", ["queue"])
ABORTED = metrics.counter("pyscheduler_worker_aborted", "Tasks whose handler raised Abort", ["queue"])
LEASE_SECONDS = metrics.histogram("pyscheduler_worker_lease_seconds", "Round trip of one lease call (a batch of "
                                                                      "tasks)", ["queue"])
HANDLER_SECONDS = metrics.histogram("pyscheduler_worker_handler_seconds", "Time a handler took per task", ["queue"])
WORKER_SERIES = (LEASED, COMPLETED, FAILED, RETRIED, ABORTED, LEASE_SECONDS, HANDLER_SECONDS)


class Counted:
    """A Worker's children of the series above (its queue's labels) and the handler times not yet
    observed (a deque: handler threads append, the recorder drains in batches)."""

    def __init__(self, queue: str):
        self.leased, self.completed, self.failed, self.retried, self.aborted, self.lease, self.handler = (
            s.labels(queue) for s in WORKER_SERIES)
        self.took: deque[float] = deque()

    def drain(self) -> None:
        took, pop, values = self.took, self.took.popleft, []
        while took:
            values.append(pop())
        if values:
            metrics.observe_many(self.handler, values)
