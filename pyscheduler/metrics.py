"""Prometheus series, per process: each process exports only the series of what it runs.

A daemon module makes its series with ``counter``/``gauge``/``histogram`` below, outside any
registry, and the daemon class lists them in ``series``. A process (``pyscheduler run``,
``delay run``, ``tasks monitor``, ...) builds one registry from the daemons it runs
(``process_registry``) and serves it on its HTTP endpoint (pyscheduler.web.endpoint). A
library object (the tasks ``Worker``) takes a ``registry`` argument instead: its series are
registered there (once per registry, whatever the number of workers sharing it). A daemon's
``Reads`` exports gauges of what the database holds (ready tasks per queue, ...), read at each scrape.
"""

from __future__ import annotations

import bisect
import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from prometheus_client import (GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, CollectorRegistry, Counter, Gauge,
                               Histogram)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from .db import Database

log = logging.getLogger(__name__)

# what a Reads counts up to where it counts rows (schedules late, checks overdue): a LIMIT stops each read
COUNT_UP_TO = 10_000
# latency buckets (seconds) the new series share: 1 ms to 1 minute
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


def counter(name: str, documentation: str, labels: Sequence[str] = ()) -> Counter:
    """A counter in no registry (exported as ``<name>_total``)."""
    return Counter(name, documentation, labels, registry=None)


def gauge(name: str, documentation: str, labels: Sequence[str] = ()) -> Gauge:
    return Gauge(name, documentation, labels, registry=None)


def histogram(name: str, documentation: str, labels: Sequence[str] = (),
              buckets: Sequence[float] = LATENCY_BUCKETS) -> Histogram:
    return Histogram(name, documentation, labels, registry=None, buckets=buckets)


_registered: weakref.WeakKeyDictionary[CollectorRegistry, set[int]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def register(registry: CollectorRegistry, collectors: Iterable[Collector]) -> None:
    """Register each collector once in ``registry`` (a second call with the same ones, e.g. from
    a second Worker or a restarted daemon, changes nothing)."""
    with _lock:
        done = _registered.setdefault(registry, set())
        for collector in collectors:
            if id(collector) not in done:
                registry.register(collector)
                done.add(id(collector))


def series_of(daemons: Iterable[Any]) -> list[Collector]:
    """The series the daemons declare (attribute ``series``), each once, in order (one ``Reads`` of
    each name: two executors of a process export one schedules-late gauge)."""
    out: list[Collector] = []
    seen: set[Any] = set()
    for daemon in daemons:
        for collector in getattr(daemon, "series", ()) or ():
            key = ("reads", collector.name) if isinstance(collector, Reads) else id(collector)
            if key not in seen:
                seen.add(key)
                out.append(collector)
    return out


def process_registry(daemons: Iterable[Any], *extra: Collector,
                     registry: CollectorRegistry | None = None) -> CollectorRegistry:
    """A registry (``registry``, or a new one) with the process's standard series (process_*,
    python_*), the daemons' series and ``extra`` (e.g. the health collector)."""
    registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
    register(registry, [PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR])
    register(registry, series_of(daemons))
    register(registry, extra)
    return registry


def observe_many(hist: Histogram, values: Iterable[float]) -> None:
    """Observe many values at once: one increment per bucket touched instead of a locked increment
    and a bucket search per value (falls back to ``observe`` on another prometheus_client)."""
    bounds = getattr(hist, "_upper_bounds", None)
    buckets = getattr(hist, "_buckets", None)
    total_ = getattr(hist, "_sum", None)
    if bounds is None or buckets is None or total_ is None or len(bounds) != len(buckets):
        for v in values:
            hist.observe(v)
        return
    counts = [0] * len(bounds)
    total = 0.0
    for v in values:
        total += v
        counts[bisect.bisect_left(bounds, v)] += 1  # the first bound >= v (the last is +Inf)
    total_.inc(total)
    for bucket, n in zip(buckets, counts):
        if n:
            bucket.inc(n)


class Reads(Collector):
    """Gauges of what the database holds, read at each scrape by ``read(db)`` (bounded reads only:
    tallies, counts up to a limit) over a pool of one connection of its own, opened on the first
    scrape. A read that fails is logged and exports nothing (the rest of /metrics still answers)."""

    def __init__(self, dsn: str, name: str, read: Callable[[Database], Iterable[Metric]]):
        self.dsn, self.name, self.read = dsn, name, read
        self._db: Database | None = None
        self._lock = threading.Lock()

    def describe(self) -> list[Metric]:
        return []  # never read the database to register

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            try:
                if self._db is None:
                    self._db = Database(self.dsn, min_size=1, max_size=1, name=f"metrics-{self.name}", timeout=2.0)
                    self._db.open(wait=False)
                families = list(self.read(self._db))
            except Exception as exc:  # noqa: BLE001 - a scrape never fails on the database
                log.warning("metrics %s: the database did not answer: %s", self.name, exc)
                families = []
        yield from families

    def close(self) -> None:
        """Close its pool (a later scrape opens another)."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
