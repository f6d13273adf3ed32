"""One system's run in ``pyscheduler bench peers``: the protocol every runner follows (given an
EMPTY database and the run's parameters, measure enqueue-to-start latency, enqueue JOBS jobs of the
scenario, time their durable completion, print one line of JSON; docs/benchmarks.md, "Side by
side with peers"), and the runners of pyscheduler itself.

Python runners use :class:`Args`, :class:`Counter`, :func:`finish` and :func:`report` below
(bench/peers/procrastinate_peer.py too); the Node.js ones (bench/peers/*.js) share
bench/peers/common.js, which does the same.

    python -m pyscheduler.bench.peers.runner worker|batch|worker-async DSN JOBS ..."""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

WARM_UP = 3
QUEUE = "peers"
SCENARIOS = ("noop", "fail", "delay")
FAIL_EVERY = 10  # scenario fail: job i fails once when i % FAIL_EVERY == 0
RETRY_SECONDS = math.e  # graphile-worker's first backoff: exp(least(attempts, 10)) s with attempts 1
MAX_ATTEMPTS = 5
DELAY_EVERY = 2  # scenario delay: job i is delayed when i % DELAY_EVERY == 1
DELAY_SECONDS = 1.0


class NotBuilt(RuntimeError):
    """This system is not part of pyscheduler yet."""


@dataclass
class Args:
    dsn: str
    jobs: int
    concurrency: int
    samples: int
    gap: float  # seconds
    max_seconds: float
    scenario: str = "noop"

    @classmethod
    def parse(cls, argv: list[str]) -> "Args":
        dsn, jobs, concurrency, samples, gap_ms, max_seconds = argv[:6]
        scenario = argv[6] if len(argv) > 6 else "noop"
        if scenario not in SCENARIOS:
            raise SystemExit(f"unknown scenario {scenario!r}: one of {', '.join(SCENARIOS)}")
        return cls(dsn, int(jobs), int(concurrency), int(samples), float(gap_ms) / 1000, float(max_seconds),
                    scenario)


@dataclass
class Counter:
    """Jobs whose handler ran (thread-safe), and enqueue-to-start latencies of sample jobs."""

    value: int = 0
    latencies: list[float] = field(default_factory=list)
    started: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def handled(self, payload: dict) -> None:
        """Call from the handler with the job's payload."""
        t = payload.get("t")
        if t is not None:
            self.latencies.append((time.perf_counter() - t) * 1000)
            self.started.set()
            return
        with self._lock:
            self.value += 1

    def sample(self, enqueue_one: Callable[[dict], object], samples: int, gap: float) -> list[float]:
        """Enqueue-to-start latencies (ms) of ``samples`` jobs enqueued one at a time."""
        for _ in range(WARM_UP + samples):
            self.started.clear()
            enqueue_one({"t": time.perf_counter()})
            if not self.started.wait(10):
                raise RuntimeError("a sample job did not start within 10 s")
            time.sleep(gap)
        out, self.latencies = self.latencies[WARM_UP:], []
        return out


def finish(counter: Counter, a: Args, started: float, durable: Callable[[], int]) -> tuple[int, float]:
    """Wait until every job has run and is durably done, or the cap; (completed, seconds since ``started``)."""
    cap = started + a.max_seconds
    while counter.value < a.jobs and time.perf_counter() < cap:
        time.sleep(0.005)
    while time.perf_counter() < cap:
        done = durable()
        if done >= a.jobs:
            return done, time.perf_counter() - started
        time.sleep(0.02)
    return durable(), a.max_seconds


def run_phases(a: Args, counter: Counter, start: Callable[[bool], object], stop: Callable[[object], None],
               enqueue_one: Callable[[dict], object], enqueue_all: Callable[[], float],
               durable: Callable[[], int]) -> dict:
    """The three steps of the protocol: ``start(ready)`` starts the workers (``ready``: return only
    once they listen), ``stop(handle)`` stops them; ``enqueue_all()`` enqueues a.jobs jobs and
    returns the seconds it took. The result fields of the JSON line they give."""
    running = start(True)
    try:
        latencies = counter.sample(enqueue_one, a.samples, a.gap)
    finally:
        stop(running)
    enqueue_s = enqueue_all()
    before = durable()  # the sample jobs
    started = time.perf_counter()
    running = start(False)
    try:
        completed, work_s = finish(counter, a, started, lambda: durable() - before)
    finally:
        stop(running)
    return dict(jobs=a.jobs, completed=completed, enqueue_s=enqueue_s, work_s=work_s, latency_ms=latencies)


def report(**fields) -> None:
    print(json.dumps(fields), flush=True)


def _version() -> str:
    from ... import __version__

    return __version__


def _prepare(a: Args, connections: int = 2):
    """Migrate the empty database; a Database (not open yet) on it."""
    from ... import migrate
    from ...db import Database

    migrate.migrate(a.dsn)
    return Database(a.dsn, min_size=1, max_size=connections)


def _durable(db) -> Callable[[], int]:
    from ..sqlapi import COMPLETED_IN_QUEUE

    def count() -> int:
        return db.query(COMPLETED_IN_QUEUE, (QUEUE,))[0]["n"]
    return count


def _enqueue(db, jobs: int, scenario: str = "noop", chunk: int = 5000) -> float:
    """JOBS jobs of the scenario, ``chunk`` per call of ``TaskClient.submit_ids`` (the bulk
    submit users call: submit_tasks_lean; a delayed half in a call of its own: one run_at per
    call); seconds taken, then ANALYZE."""
    from ...tasks import TaskClient

    client = TaskClient(db)
    started = time.perf_counter()
    for first in range(0, jobs, chunk):
        ids = range(first, min(first + chunk, jobs))
        if scenario == "fail":
            client.submit_ids(QUEUE, [{"i": i, "f": True} if i % FAIL_EVERY == 0 else {"i": i} for i in ids],
                              max_attempts=MAX_ATTEMPTS)
        elif scenario == "delay":
            client.submit_ids(QUEUE, [{"i": i} for i in ids if i % DELAY_EVERY != 1])
            client.submit_ids(QUEUE, [{"i": i} for i in ids if i % DELAY_EVERY == 1],
                              run_at=datetime.now(timezone.utc) + timedelta(seconds=DELAY_SECONDS))
        else:
            client.submit_ids(QUEUE, [{"i": i} for i in ids])
    secs = time.perf_counter() - started
    with db.connection() as conn:
        conn.execute("ANALYZE")
    return secs


class FailOnce:
    """Scenario fail: whether a job fails now (its first attempt) or runs (its retry). One
    process leases each job's attempts (one worker), so a set of the ids seen is enough."""

    def __init__(self, scenario: str):
        self.on = scenario == "fail"
        self.seen: set[str] = set()

    def now(self, rn: str, spec: dict) -> bool:
        if self.on and spec.get("f") and rn not in self.seen:
            self.seen.add(rn)
            return True
        return False


def _submit_one(db) -> Callable[[dict], object]:
    from ...db import Jsonb
    from ...tasks import sqlapi as sql

    return lambda spec: db.call(sql.SUBMIT_TASK, queue=QUEUE, spec=Jsonb(spec))


def worker_system(a: Args, flavour: str = "sync") -> dict:
    """The ``Worker`` library (threads), or its asyncio flavour ``AsyncWorker`` (``async def``
    handlers, issue 10 item 2); capacity = concurrency."""
    from ...tasks import AsyncWorker, Retry, Worker

    counter = Counter()
    fail = FailOnce(a.scenario)
    retry_in = timedelta(seconds=RETRY_SECONDS)

    def handle(ctx) -> None:
        if fail.now(ctx.rn, ctx.spec):
            raise Retry(in_=retry_in)
        counter.handled(ctx.spec)

    async def handle_async(ctx) -> None:
        handle(ctx)

    def start(ready: bool):
        if flavour == "async":
            worker = AsyncWorker(a.dsn, QUEUE, handle_async, capacity=a.concurrency, poll_interval=0.5)
        else:
            worker = Worker(a.dsn, QUEUE, handle, capacity=a.concurrency, poll_interval=0.5)
        running = worker.start()
        if ready:
            running.wait_idle(timeout=30)
        return running

    with _prepare(a) as db:
        result = run_phases(a, counter, start, lambda running: running.stop(), _submit_one(db),
                            lambda: _enqueue(db, a.jobs, a.scenario), _durable(db))
    return dict(system="pyscheduler Worker" + (" (async)" if flavour == "async" else ""), version=_version(),
                **result, settings=f"capacity {a.concurrency}, local queue (prefetch up to 1,000), LISTEN/NOTIFY, "
                                   f"poll 0.5 s")


def worker_async_system(a: Args) -> dict:
    """The asyncio flavour of the Worker (issue 10, item 2), run as worker_system runs Worker."""
    return worker_system(a, "async")


BATCH_CONNECTIONS = 2
BATCH_SIZE = 500


def batch_system(a: Args) -> dict:
    """The SQL alone: BATCH_CONNECTIONS connections loop lease_tasks_lean(n => 500) + complete_tasks
    (and fail_tasks for the failures), woken by the queue's NOTIFY when idle, sleeping at most
    until next_task_due."""
    from ...db import Listener, Wakeup
    from ...tasks import sqlapi as sql
    from ..tasks import lease_and_complete

    counter = Counter()
    db = _prepare(a, BATCH_CONNECTIONS + 2)
    wake = Wakeup()
    lease = timedelta(seconds=60)
    fail = FailOnce(a.scenario)
    lock = threading.Lock()

    def run(task: dict) -> bool:
        """The job; True when it failed."""
        with lock:
            failed = fail.now(str(task["rn"]), task["spec"])
        if not failed:
            counter.handled(task["spec"])
        return failed

    def loop(k: int, stop: threading.Event) -> None:
        with db.session() as s:
            while not stop.is_set():
                n = lease_and_complete(s, QUEUE, f"batch-{k}", BATCH_SIZE, lease, run,
                                       retry_in=timedelta(seconds=RETRY_SECONDS))
                if n:
                    wake.poke()  # the other connection: there may be more
                else:
                    due = s.call_value(sql.NEXT_TASK_DUE, queue=QUEUE)
                    wake.wait(0.5 if due is None else min(0.5, due.total_seconds() + 0.001), jitter=0)

    def start(ready: bool) -> tuple[threading.Event, list[threading.Thread], Listener]:
        stop = threading.Event()
        listener = Listener(a.dsn, [sql.task_channel(QUEUE)], wake.poke).start()
        if ready:
            listener.ready.wait(30)
        threads = [threading.Thread(target=loop, args=(k, stop), daemon=True) for k in range(BATCH_CONNECTIONS)]
        for t in threads:
            t.start()
        return stop, threads, listener

    def halt(running) -> None:
        stop, threads, listener = running
        stop.set()
        for _ in threads:
            wake.poke()
        for t in threads:
            t.join(30)
        listener.stop()

    with db:
        result = run_phases(a, counter, start, halt, _submit_one(db), lambda: _enqueue(db, a.jobs, a.scenario),
                            _durable(db))
    return dict(system="pyscheduler batch SQL", version=_version(), **result,
                settings=f"{BATCH_CONNECTIONS} connections, lease_tasks_lean n={BATCH_SIZE} + complete_tasks "
                         "(+ fail_tasks), LISTEN/NOTIFY and next_task_due when idle")


SYSTEMS = {"worker": worker_system, "worker-async": worker_async_system, "batch": batch_system}


def main(argv: list[str]) -> int:
    try:
        result = SYSTEMS[argv[0]](Args.parse(argv[1:]))
    except NotBuilt as exc:
        print(f"not built: {exc}", file=sys.stderr)
        return 3
    report(**result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
