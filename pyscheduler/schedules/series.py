"""The Prometheus series of the schedule executors (``Executor.series``; the relay exports
``POISON`` too), ``late_gauge`` (schedules late, read at each scrape), and ``observe_ms``: a
batch of durations into a histogram at once."""

from __future__ import annotations

import bisect

from prometheus_client import Histogram
from prometheus_client.core import GaugeMetricFamily

from ..db import Database
from ..metrics import COUNT_UP_TO, counter, gauge, histogram
from . import sqlapi as sql

CLAIMED = counter("pyscheduler_schedules_claimed", "Occurrences claimed (Redis and Postgres-only)", ["source"])
FIRED = counter("pyscheduler_schedules_fired", "Occurrences delivered to their target", ["target"])
FAILED = counter("pyscheduler_schedules_failed", "Occurrences given up after the retry policy's attempts", ["target"])
RETRIES = counter("pyscheduler_schedules_retries", "Retries of failed tries")
RECORDED = counter("pyscheduler_schedules_recorded", "Executions recorded in PostgreSQL", ["outcome"])
DUPLICATES = counter("pyscheduler_schedules_duplicates", "Occurrences recorded before (counted once)")
RECOVERED = counter("pyscheduler_schedules_recovered", "Stuck claims reset by the next-check")
RESYNCED = counter("pyscheduler_schedules_resynced", "Index members written by a resync")
DEGRADED = gauge("pyscheduler_schedules_degraded", "1 while Redis (or a shard of the index) is unreachable "
                                                   "(critical schedules fire from PostgreSQL)")
SHARDS_DOWN = gauge("pyscheduler_schedules_shards_down", "Index shards unreachable (their critical schedules fire "
                    "from PostgreSQL)")
POISON = counter("pyscheduler_schedules_poison", "Occurrences stopped, or schedules left out of the index, because a "
                 "value could not be loaded or a row was refused (logged with the schedule id)", ["where"])
LATENESS = histogram("pyscheduler_schedules_lateness_seconds", "Fire time minus expected time",
                     buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
SERIES = (CLAIMED, FIRED, FAILED, RETRIES, RECORDED, DUPLICATES, RECOVERED, RESYNCED, DEGRADED, SHARDS_DOWN, POISON,
          LATENESS)


def late_gauge(db: Database):
    """Schedules due more than 10 s ago and not fired (schedules_late_count: up to COUNT_UP_TO)."""
    late = db.call_value(sql.SCHEDULES_LATE_COUNT, up_to=COUNT_UP_TO)
    return (GaugeMetricFamily("pyscheduler_schedules_late", "Schedules due more than 10 s ago and not yet fired "
                                                            f"(counted up to {COUNT_UP_TO})", value=late),)


def observe_ms(hist: Histogram, values_ms: list[float]) -> None:
    """Observe many durations (ms, negative = 0) in a seconds histogram: one increment per
    bucket touched instead of a locked increment per value and bucket."""
    bounds = getattr(hist, "_upper_bounds", None)
    buckets = getattr(hist, "_buckets", None)
    if bounds is None or buckets is None or len(bounds) != len(buckets):  # another prometheus_client
        for v in values_ms:
            hist.observe(max(0.0, v / 1000))
        return
    counts = [0] * len(bounds)
    total = 0.0
    for v in values_ms:
        v = max(0.0, v / 1000)
        total += v
        counts[bisect.bisect_left(bounds, v)] += 1  # the first bound >= v (the last is +Inf)
    hist._sum.inc(total)
    for bucket, n in zip(buckets, counts):
        if n:
            bucket.inc(n)
