"""The monitor of leased tasks: failure detector and cleanup (seeds/scylla.md).

Every ``reset_interval`` (and at once when a worker yields, by NOTIFY) it calls
``reset_expired_tasks`` until nothing is left (running tasks past their deadline become
ready, or aborted after their last attempt); every ``merge_interval`` it merges the spec
search index's pending list and folds the count tallies (``merge_task_search_index``,
``fold_task_tallies``: writes need not; docs/sql-api.md); every ``cleanup_interval`` it
deletes terminal tasks older than ``retention`` (``cleanup_tasks``). Replicas are safe: the
reset, the fold and the cleanup skip rows another monitor is working on; a merge waits.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from datetime import timedelta

from prometheus_client.core import GaugeMetricFamily

from ..db import Database, Listener, Outage, Wakeup, poke_on
from ..errors import RETRYABLE, InvalidArgument
from ..metrics import Reads, counter
from . import sqlapi as sql

log = logging.getLogger(__name__)

RESET = counter("pyscheduler_tasks_reset", "Running tasks the monitor made ready again (reason: lease_expired, "
                                           "yielded)", ["queue", "reason"])
EXPIRED_ABORTED = counter("pyscheduler_tasks_expired_aborted", "Tasks aborted by the monitor: the lease of their "
                                                              "last attempt expired (TaskMaxAttempts)", ["queue"])
DELETED = counter("pyscheduler_tasks_deleted", "Finished tasks deleted past retention")
MONITOR_SERIES = (RESET, EXPIRED_ABORTED, DELETED)


def queue_gauges(db: Database):
    """Per queue: ready, running and the oldest ready task's age (queue_status: the tallies every
    write keeps and one index probe per queue)."""
    ready = GaugeMetricFamily("pyscheduler_queue_ready", "Ready tasks of the queue", labels=["queue"])
    running = GaugeMetricFamily("pyscheduler_queue_running", "Running (leased) tasks of the queue", labels=["queue"])
    oldest = GaugeMetricFamily("pyscheduler_queue_oldest_ready_age_seconds",
                               "How long the queue's oldest ready task has waited (0: none ready)", labels=["queue"])
    for q in db.query(sql.QUEUE_STATUS.select()):
        ready.add_metric([q["queue"]], q["ready"])
        running.add_metric([q["queue"]], q["running"])
        age = q["oldest_ready_age"]
        oldest.add_metric([q["queue"]], age.total_seconds() if age is not None else 0.0)
    return ready, running, oldest


class Monitor:
    name = "tasks-monitor"
    series = MONITOR_SERIES  # the class's; an instance adds its Reads (queue gauges)

    def __init__(self, dsn: str, *, reset_interval: float = 1.0, retention: timedelta = timedelta(days=7),
                 cleanup_interval: float = 60.0, batch: int = 1000, merge_interval: float = 0.25):
        for name, seconds in (("reset_interval", reset_interval), ("merge_interval", merge_interval),
                              ("cleanup_interval", cleanup_interval)):
            if not (isinstance(seconds, (int, float)) and 0 < seconds < math.inf):  # 0 or NaN: a busy loop
                raise InvalidArgument(f"{name} must be a finite number of seconds more than 0, got {seconds!r}")
        if not (isinstance(retention, timedelta) and retention >= timedelta(0)):
            raise InvalidArgument(f"retention must be a timedelta of 0 or more, got {retention!r}")
        if not (isinstance(batch, int) and batch >= 1):
            raise InvalidArgument(f"batch must be an integer of at least 1, got {batch!r}")
        self.dsn = dsn
        self.series = (*MONITOR_SERIES, Reads(dsn, "tasks", queue_gauges))
        self.reset_interval = reset_interval
        self.merge_interval = merge_interval
        self.retention = retention
        self.cleanup_interval = cleanup_interval
        self.batch = batch
        self.resets = 0
        self.deleted = 0
        self.merged = 0  # pending pages of the spec search index merged

    def fresh(self) -> "Monitor":
        """A new monitor with these settings (run_daemons' restart after a crash)."""
        return Monitor(self.dsn, reset_interval=self.reset_interval, retention=self.retention,
                       cleanup_interval=self.cleanup_interval, batch=self.batch, merge_interval=self.merge_interval)

    def run(self, stop: threading.Event) -> None:
        wakeup = Wakeup()
        poke_on(stop, wakeup.poke)
        listener = Listener(self.dsn, [sql.MONITOR_CHANNEL], wakeup.poke, on_reconnect=wakeup.poke, logger=log).start()
        outage = Outage("tasks monitor", log)
        next_reset = next_cleanup = next_merge = 0.0
        poked = False
        db = Database.for_daemon(self.dsn, name="pyscheduler-tasks-monitor", max_size=1)
        try:
            while not stop.is_set():
                try:
                    if poked or time.monotonic() >= next_reset:  # workers that yield poke it
                        self.reset_once(db)
                        next_reset = time.monotonic() + self.reset_interval
                    if time.monotonic() >= next_merge:
                        self.merge_once(db)
                        self.fold_once(db)
                        next_merge = time.monotonic() + self.merge_interval
                    if time.monotonic() >= next_cleanup:
                        self.cleanup_once(db)
                        next_cleanup = time.monotonic() + self.cleanup_interval
                    outage.ok()
                except RETRYABLE as exc:  # an outage (also read-only mode, timeouts): wait, retry
                    stop.wait(outage.failed(exc))
                    poked = True  # whatever was due is still due
                    continue
                poked = wakeup.wait(max(0.0, min(next_reset, next_merge) - time.monotonic()), jitter=0.1)
        finally:
            db.close()
            listener.stop()

    def reset_once(self, db: Database) -> int:
        """Reset every expired lease now; how many."""
        total = 0
        while True:
            rows = db.call(sql.RESET_EXPIRED_TASKS, max_tasks=self.batch)
            counts: dict[tuple[str, str], int] = {}
            for row in rows:
                task = row["task"]
                last = task["history"][-1]["_typ"] if task["history"] else None
                if task["status"] == "aborted":  # the crash-loop guard: task_max_attempts
                    log.warning("aborted task %s of queue %s: %s", task["rn"], task["queue"],
                                task["errors"][-1]["description"] if task["errors"] else "TaskMaxAttempts")
                    key = (task["queue"], "aborted")
                else:
                    log.info("reset task %s of queue %s to ready (%s)", task["rn"], task["queue"],
                             "yielded" if last == "TaskYield" else "lease timed out")
                    key = (task["queue"], "yielded" if last == "TaskYield" else "lease_expired")
                counts[key] = counts.get(key, 0) + 1
            for (queue, what), n in counts.items():
                (EXPIRED_ABORTED.labels(queue) if what == "aborted" else RESET.labels(queue, what)).inc(n)
            total += len(rows)
            if len(rows) < self.batch:
                break
        self.resets += total
        return total

    def merge_once(self, db: Database) -> int:
        """Merge the spec search index's pending list now; the pages merged."""
        pages: int = db.call_value(sql.MERGE_TASK_SEARCH_INDEX)
        self.merged += pages
        return pages

    def fold_once(self, db: Database) -> None:
        """Fold the count tallies now (task_counts and queue_status answer the same)."""
        db.call(sql.FOLD_TASK_TALLIES)

    def cleanup_once(self, db: Database) -> int:
        """Delete every terminal task past retention now; how many."""
        total = 0
        while True:
            n = db.call_value(sql.CLEANUP_TASKS, retention=self.retention, max_tasks=self.batch * 10)
            total += n
            if n < self.batch * 10:
                break
        if total:
            log.info("deleted %d finished tasks older than %s", total, self.retention)
            DELETED.inc(total)
        self.deleted += total
        return total
