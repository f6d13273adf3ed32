"""Shared by the checks tests: half-second slots, runners in threads, adding and waiting."""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import timedelta

from prometheus_client import CollectorRegistry, generate_latest

from pyscheduler.checks import Check, CheckRunner
from pyscheduler.db import Jsonb
from pyscheduler.metrics import process_registry
from tests.support import wait_for
from tests.support.ops import samples

# the runner's series, as a process that runs one exports them (pyscheduler.metrics)
REGISTRY = process_registry([CheckRunner], registry=CollectorRegistry())


def scrape() -> dict[str, float]:
    """The registry as /metrics serves it: 'name{label="v",...}' -> value."""
    return samples(generate_latest(REGISTRY).decode())


class Counting:
    """A Python handler that records each call (thread-safe)."""

    def __init__(self, sleep: float = 0.0, fail: set[str] = frozenset()):
        self.calls: Counter[int] = Counter()
        self.lock = threading.Lock()
        self.sleep, self.fail = sleep, fail

    def __call__(self, check: Check):
        with self.lock:
            self.calls[check.id] += 1
        if self.sleep:
            time.sleep(self.sleep)
        if check.entity_key in self.fail:
            raise RuntimeError(f"cannot check {check.entity_key}")
        return None


class Running:
    """Runners in threads, stopped at the end."""

    def __init__(self):
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def start(self, runner: CheckRunner) -> CheckRunner:
        t = threading.Thread(target=runner.run, args=(self.stop,), daemon=True)
        t.start()
        self.threads.append(t)
        return runner

    def alive(self) -> bool:
        return all(t.is_alive() for t in self.threads)

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join(15)
            assert not t.is_alive()


def add_many(db, n: int, job: str, kind: str, after: float = 1.0, payload=None, prefix: str = "k",
             entity: str = "order") -> list[int]:
    """n checks in one slot: the check time is computed once, so all round to the same slot."""
    at = db.call_one("check_slots")["clock"] + timedelta(seconds=after)
    return [db.call_one("add_check", entity_name=entity, entity_key=f"{prefix}{i}", job=job, kind=kind,
                        check_at=at, payload=None if payload is None else Jsonb(payload))["id"] for i in range(n)]


def history(db, **filters) -> dict[int, dict]:
    return {r["id"]: r for r in db.call("check_history", max=100_000, **filters)}


def wait_history(db, n: int, timeout: float = 30.0) -> dict[int, dict]:
    return wait_for(lambda: len(h := history(db)) >= n and h, timeout=timeout, interval=0.05)
