"""Which queues nobody works: ``unattended`` reads queue_status's rows against the view
``workers`` (a Worker reports itself about every 10 s; one holding tasks counts by its last
lease or heartbeat). The dashboard's warning and ``pyscheduler tasks queues --watch`` use it."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

NO_WORKER_AFTER = timedelta(minutes=1)  # a queue with ready tasks and no worker seen for this long is flagged


def last_seen(workers: list[dict[str, Any]]) -> dict[str, datetime]:
    """Per queue, when a worker of it was last seen (``workers``' last_seen)."""
    last: dict[str, datetime] = {}
    for w in workers:
        if w["last_seen"] is not None and (w["queue"] not in last or w["last_seen"] > last[w["queue"]]):
            last[w["queue"]] = w["last_seen"]
    return last


def unattended(queues: list[dict[str, Any]], workers: list[dict[str, Any]], now: datetime) -> list[dict[str, Any]]:
    """The queues (not paused) with ready tasks and no worker seen for NO_WORKER_AFTER, with
    ``no_worker_for`` (None: none seen in the last day)."""
    last = last_seen(workers)
    out = []
    for q in queues:
        seen = last.get(q["queue"])
        if q["ready"] and not q["paused"] and (seen is None or now - seen > NO_WORKER_AFTER):
            out.append(dict(q, no_worker_for=None if seen is None else now - seen))
    return out
