"""What ``pyscheduler bench flatness`` stores and measures, per capability: a Section (Delay,
Schedules, Checks, Tasks) writes its stored work fast (pyscheduler/bench/sqlapi.py) and lists
its hot and read paths as Measures; the shapes of issue 34 (TaskShape, DelayShape, ...) store
the same capability's work in a shape the planner's statistics mislead on; a Backend is the
connection they run on, with its CPU (precise_cpu); time_measure runs a Measure. The command
and the report: flatness.py."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Callable

import psycopg
from psycopg.rows import dict_row

from ..checks import sqlapi as checks_sql
from ..db import Jsonb, Session
from ..delay import sqlapi as delay_sql
from ..schedules import sqlapi as schedules_sql
from ..sqlapi import Fn, View
from ..tasks import sqlapi as tasks_sql
from ..web.dashboard.data import id_range
from . import sqlapi as sql
from .stats import precise_cpu

CHUNK = 1_000_000


class Backend:
    """A connection and the CPU seconds its server process used so far (None: not readable,
    e.g. a server on another machine)."""

    def __init__(self, dsn: str):
        self.conn = psycopg.connect(dsn, autocommit=True, row_factory=dict_row)
        self.conn.execute("SET TimeZone = 'UTC'")
        self.pid = self.conn.execute(sql.BACKEND).fetchone()["pid"]
        self.session = Session(self.conn)

    def cpu(self) -> float | None:
        """From /proc/PID/schedstat (precise_cpu): /proc/PID/stat counts in ticks of 10 ms,
        more than most read paths take."""
        return precise_cpu(self.pid)

    def q(self, sql: str, params=()) -> list[dict]:
        """The rows of one statement (always with parameters: a literal % is written %%)."""
        cur = self.conn.execute(sql, params)
        return cur.fetchall() if cur.description else []

    def one(self, sql: str, params=()) -> dict:
        return self.conn.execute(sql, params).fetchone()

    def call(self, fn: Fn, **args) -> list[dict]:
        """``SELECT * FROM pyscheduler.fn(name => value, ...)``, as the clients call."""
        return self.session.call(fn, **args)

    def close(self) -> None:
        self.conn.close()


@dataclass
class Measure:
    """One path: run(backend) does the work once and returns how many items it handled (a hot
    path: the per-item cost is reported; a read path: 1, the call)."""

    name: str
    kind: str  # "hot" or "read"
    run: Callable[[Backend], int]
    setup: Callable[[Backend], None] | None = None
    reps: int = 15


@dataclass
class Result:
    wall: list[float] = field(default_factory=list)  # seconds per item, one entry per run
    cpu: list[float] = field(default_factory=list)

    def add(self, seconds: float, cpu: float | None, items: int) -> None:
        if items:
            self.wall.append(seconds / items)
            if cpu is not None:
                self.cpu.append(cpu / items)


class Section:
    """A capability's part of the bench: build(b, n) writes n stored items; measures() the paths."""

    name = ""

    def __init__(self, n: int):
        self.n = n

    def build(self, b: Backend, echo) -> None:
        raise NotImplementedError

    def prepare(self, b: Backend) -> None:
        """After the build and VACUUM ANALYZE, before measuring."""

    def measures(self) -> list[Measure]:
        raise NotImplementedError


def _chunks(n: int):
    for lo in range(1, n + 1, CHUNK):
        yield lo, min(n, lo + CHUNK - 1)


def _read(what: Fn | View, tail: str = "", **args) -> Callable[[Backend], int]:
    """A read path: one call of a function with ``args``, or one read of a view with ``tail``
    (a page), whatever it returns. An argument that is a callable is given the backend."""
    def run(b: Backend) -> int:
        if isinstance(what, View):
            b.q(what.select(tail))
        else:
            b.call(what, **{k: v(b) if callable(v) else v for k, v in args.items()})
        return 1
    return run


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _has_function(b: Backend, name: str) -> bool:
    return bool(b.one(sql.HAS_FUNCTION, (name,))["n"])


# ---------------------------------------------------------------- delay queue

class Delay(Section):
    """Stored: n waiting messages, deadlines from 1 hour to 30 days ahead, 200-byte values; 1,000
    ready (claimed by four nodes that never fire them). Hot: 20,000 messages of the same size
    enqueued due now (``enqueue_messages``, batches of 1,000, store_late) and fired
    (``ready_and_claim`` + ``delete_fired``, batches of 1,000, with ``after`` as the relay passes
    it). (Much smaller hot messages than the stored ones land one per page across a large table,
    in the tenth of each page fillfactor keeps free: docs/benchmarks.md, "Kept counts and
    live-status pages".)"""

    name = "delay"
    HOT = 20_000

    def build(self, b: Backend, echo) -> None:
        for lo, hi in _chunks(self.n):
            b.q(sql.FLAT_DELAY_MESSAGES, (lo, hi))
        nodes = [uuid.uuid4() for _ in range(4)]
        b.q(sql.FLAT_DELAY_READIED, (nodes, max(1, self.n // 1000)))
        if _has_function(b, "_delay_count_all"):
            b.q(sql.DELAY_COUNT_ALL)

    def measures(self) -> list[Measure]:
        state: dict = {}

        def enqueue(b: Backend) -> int:
            tag = uuid.uuid4().hex[:8]
            state["ids"] = []
            for k in range(0, self.HOT, 1000):
                ids = [f"hot-{tag}-{k + i}" for i in range(1000)]
                b.q(sql.ENQUEUE_DUE_NOW, (ids, b"v" * 200))
            return self.HOT

        def fire(b: Backend) -> int:
            node, mark, fired, rescan_at = uuid.uuid4(), None, 0, 0.0
            while True:
                after = None
                if mark is not None and time.monotonic() < rescan_at:
                    after = mark - timedelta(seconds=1)  # the relay's MARK_SLACK
                else:
                    rescan_at = time.monotonic() + 2.0  # the relay's RESCAN_S
                rows = b.q(sql.CLAIM_READY, (node, after))
                if not rows:
                    if after is None:
                        return fired
                    rescan_at = 0.0
                    continue
                top = max(r["deadline"] for r in rows)
                mark = top if mark is None or top > mark else mark
                b.q(sql.DELETE_FIRED, ([r["id"] for r in rows], node))
                fired += len(rows)

        return [
            Measure("enqueue_messages (per message)", "hot", enqueue, reps=3),
            Measure("ready_and_claim + delete_fired (per message)", "hot", fire, setup=enqueue, reps=3),
            Measure("delay_queue", "read", _read(delay_sql.DELAY_QUEUE)),
            Measure("delay_ready_by_node", "read", _read(delay_sql.DELAY_READY_BY_NODE)),
            Measure("next_deadline()", "read", _read(delay_sql.NEXT_DEADLINE)),
            # the dashboard's search and its list of waiting messages (issue 30)
            Measure("find_message(id)", "read", _read(delay_sql.FIND_MESSAGE, id="cold-4242")),
            Measure("waiting_messages(max_messages => 51)", "read", _read(delay_sql.WAITING_MESSAGES, max_messages=51)),
        ]


# ---------------------------------------------------------------- schedules

class Schedules(Section):
    """Stored: n schedules every 1 s (Kafka targets; 2 % HTTP, 2 % task), 10 % critical, 1 %
    paused, 0.5 % failing, 0.1 % late and 0.1 % due within 5 minutes (non-critical, never fired:
    the views' rows), the others due from 1 hour to 30 days ahead; n executions, from 10,000 to
    100,000 (a fifth of n) of them one schedule's ('cold-00002002', 1 % failed: a full page of
    failed ones at either size). Hot, due now but analyzed a day away (the statistics of issue
    21's degraded case): 10,000 non-critical schedules fired
    through the PostgreSQL side of the Redis path (``fire_details`` + ``record_executions``,
    batches of 1,000) and 10,000 critical ones through the degraded path (``claim_due_critical``
    + ``fire_details`` + ``record_executions`` with tokens, batches of 1,000)."""

    name = "schedules"
    HOT = 10_000
    PROBE = "cold-00002002"  # the schedule with many executions

    def build(self, b: Backend, echo) -> None:
        first = b.call(schedules_sql.CREATE_SCHEDULE, name="template", every=timedelta(seconds=1), target_kind="kafka",
                       target="flat.bench", retry_attempts=0)[0]["create_schedule"]["id"]
        for lo, hi in _chunks(self.n):
            b.q(sql.FLAT_SCHEDULES_COLD, {"prefix": "cold-", "lo": lo, "hi": hi, "first": first})
        for prefix, critical in (("hot-r-", False), ("hot-c-", True)):
            b.q(sql.FLAT_SCHEDULES_HOT, {"prefix": prefix, "lo": 1, "hi": self.HOT, "first": first,
                                         "critical": critical})
        b.q(sql.DELETE_SCHEDULE_ROW, (first,))
        probe = b.one(sql.SCHEDULE_ID, (self.PROBE,))["id"]
        per_probe = min(100_000, max(10_000, self.n // 5))
        b.q(sql.FLAT_EXECUTIONS_PROBE, (probe, per_probe))
        lo_id = b.one(sql.FLAT_FIRST_COLD)["m"]
        for lo, hi in _chunks(self.n - per_probe):
            b.q(sql.FLAT_EXECUTIONS, (lo_id, self.n, lo, hi))

    def prepare(self, b: Backend) -> None:
        self._due_now(b)

    @staticmethod
    def _due_now(b: Backend) -> None:
        """The hot schedules due now, the statistics left as they were (a day away)."""
        b.q(sql.FLAT_HOT_DUE_NOW)

    def measures(self) -> list[Measure]:
        mid = f"cold-{self.n // 2:08d}"

        def redis_path(b: Backend) -> int:
            hot = b.q(sql.FLAT_HOT_REDIS)
            for k in range(0, len(hot), 1000):
                part = hot[k:k + 1000]
                ids = [r["id"] for r in part]
                b.q(sql.FIRE_DETAILS_COUNT, (ids,))
                b.q(sql.RECORD_EXECUTIONS_COUNT, (ids, [r["next_run_at"] for r in part], ["fired"] * len(ids),
                                                  [1] * len(ids)))
            return len(hot)

        def degraded(b: Backend) -> int:
            fired = 0
            while fired < self.HOT:
                rows = b.q(sql.CLAIM_DUE_CRITICAL_1000)
                if not rows:
                    break
                ids = [r["id"] for r in rows]
                b.q(sql.FIRE_DETAILS_COUNT, (ids,))
                b.q(sql.RECORD_CLAIMED_COUNT, (ids, [r["expected_at"] for r in rows], ["fired"] * len(ids),
                                               [1] * len(ids), [r["claim_token"] for r in rows]))
                fired += len(rows)
            return fired

        return [
            Measure("via Redis: fire_details + record_executions (per firing)", "hot", redis_path,
                    setup=self._due_now, reps=3),
            Measure("degraded: claim_due_critical + fire_details + record_executions (per firing)", "hot",
                    degraded, setup=self._due_now, reps=3),
            Measure("list_schedules()", "read", _read(schedules_sql.LIST_SCHEDULES)),
            Measure("list_schedules(after_name => middle)", "read",
                    _read(schedules_sql.LIST_SCHEDULES, after_name=mid)),
            Measure("list_schedules(paused => true)", "read", _read(schedules_sql.LIST_SCHEDULES, paused=True)),
            Measure("list_schedules(critical => true)", "read", _read(schedules_sql.LIST_SCHEDULES, critical=True)),
            Measure("list_schedules(target_kind => 'http')", "read",
                    _read(schedules_sql.LIST_SCHEDULES, target_kind="http")),
            Measure("get_schedule", "read", _read(schedules_sql.GET_SCHEDULE, name=mid)),
            Measure("schedule_runs(name)", "read", _read(schedules_sql.SCHEDULE_RUNS, name=self.PROBE)),
            Measure("schedule_runs(name, before => 30 minutes ago)", "read",
                    _read(schedules_sql.SCHEDULE_RUNS, name=self.PROBE,
                          before=lambda b: _now() - timedelta(minutes=30))),
            Measure("schedule_runs(name, with_outcome => 'failed')", "read",
                    _read(schedules_sql.SCHEDULE_RUNS, name=self.PROBE, with_outcome="failed")),
            Measure("execution_count", "read", _read(schedules_sql.EXECUTION_COUNT, name=self.PROBE)),
            Measure("upcoming_runs(name, n => 10)", "read", _read(schedules_sql.UPCOMING_RUNS, name=mid, n=10)),
            Measure("find_schedules(target_prefix => an HTTP target's)", "read",  # the dashboard's search
                    _read(schedules_sql.FIND_SCHEDULES, target_prefix="https://example.com/h", max_schedules=20)),
            Measure("schedules_due_soon LIMIT 100", "read", _read(schedules_sql.SCHEDULES_DUE_SOON, "LIMIT 100")),
            Measure("schedules_late LIMIT 100", "read", _read(schedules_sql.SCHEDULES_LATE, "LIMIT 100")),
            Measure("schedules_paused LIMIT 100", "read", _read(schedules_sql.SCHEDULES_PAUSED, "LIMIT 100")),
            Measure("schedules_failing LIMIT 100", "read", _read(schedules_sql.SCHEDULES_FAILING, "LIMIT 100")),
        ]


# ---------------------------------------------------------------- checks

class Checks(Section):
    """Stored: n pending checks of entity 'order' in the 2,880 slots of the next 30 days (15-minute
    slots; 90 % SQL jobs, 5 % Python, 5 % task; 0.1 % handed to a task job, 0.01 % in a missed
    slot) and n ended ones over the last 30 days. Hot: 20,000 checks of a no-op SQL job in the
    current slot, taken and run by ``run_due_checks`` (batches of 1,000, with ``after`` as a
    runner passes it), and the take alone (``due_checks``, 1,000, rolled back)."""

    name = "checks"
    HOT = 20_000

    def build(self, b: Backend, echo) -> None:
        b.q(sql.NOOP_CHECK_JOB)
        for lo, hi in _chunks(self.n):
            b.q(sql.FLAT_CHECKS, (lo, hi))
            b.q(sql.FLAT_CHECK_HISTORY, (lo, hi, self.n))

    def measures(self) -> list[Measure]:
        state = {"k": 0}

        def fill(b: Backend) -> None:
            """HOT checks in a slot of their own (one long past: a runner's next slot holds no entries
            its earlier slots left), so no take reads what an earlier repetition left."""
            state["k"] += 1
            state["slot"] = b.one(sql.FLAT_PAST_SLOT, (200 + state["k"],))["s"]
            b.q(sql.FLAT_HOT_CHECKS, (uuid.uuid4().hex[:8], state["slot"], state["slot"], self.HOT))

        def run(b: Backend) -> int:
            taken, after = 0, None
            while True:
                r = b.one(sql.RUN_DUE_CHECKS_1000, (state["slot"], after))
                if not r["taken"]:
                    if after is None:
                        return taken
                    after = None  # a runner ends a slot with a call without after
                    continue
                taken += r["taken"]
                after = r["last_id"]

        def take(b: Backend) -> int:
            with b.conn.transaction(force_rollback=True):
                return len(b.q(sql.DUE_CHECKS_1000, (state["slot"],)))

        def clean(b: Backend) -> None:
            b.q(sql.CHECKS_CLEAN, ("hot",))

        return [
            Measure("run_due_checks: take, run, record (per check)", "hot", run, setup=fill, reps=3),
            Measure("due_checks: the take alone (per check)", "hot", take, setup=lambda b: (clean(b), fill(b)),
                    reps=5),
            Measure("list_checks()", "read", _read(checks_sql.LIST_CHECKS)),
            Measure("list_checks(after => 15 days ahead)", "read",
                    _read(checks_sql.LIST_CHECKS, after_at=lambda b: _now() + timedelta(days=15), after_id=0)),
            Measure("list_checks(entity_name, entity_key)", "read",
                    _read(checks_sql.LIST_CHECKS, entity_name="order", entity_key="4242")),
            Measure("check_history()", "read", _read(checks_sql.CHECK_HISTORY)),
            Measure("check_history(before => 15 days ago)", "read",
                    _read(checks_sql.CHECK_HISTORY, before_at=lambda b: _now() - timedelta(days=15), before_id=0)),
            Measure("check_history(entity_name, entity_key)", "read",
                    _read(checks_sql.CHECK_HISTORY, entity_name="order", entity_key="4242")),
            Measure("checks_per_slot LIMIT 100", "read", _read(checks_sql.CHECKS_PER_SLOT, "LIMIT 100")),
            Measure("overdue_checks LIMIT 100", "read", _read(checks_sql.OVERDUE_CHECKS, "LIMIT 100")),
            Measure("check_outcomes", "read", _read(checks_sql.CHECK_OUTCOMES)),
            Measure("find_checks(entity_key)", "read",  # the dashboard's search
                    _read(checks_sql.FIND_CHECKS, entity_key="4242", max=20)),
        ]


# ---------------------------------------------------------------- tasks

class Tasks(Section):
    """Stored: n tasks in 20 busy queues and a quiet one (50 finished tasks whatever the size),
    submitted over the last 7 days (time-ordered ids, as ``submit_task`` makes them), a
    deployment's mix: 1 % ready (two priorities), 0.5 % scheduled (delayed or waiting for a
    retry, due within a day), 200 running whatever the size (leases an hour long: the leases in
    flight follow the workers' capacity, not what is stored), 0.1 % waiting (for a parent), 1 %
    aborted, 0.1 % cancelled, the rest completed (kept for their retention period); the ready
    ones all in q11, the scheduled in q13, the waiting in q19 (backlogs the q11 and q13 lists page
    through: 100,000 and 50,000 at 10M, 100 and 50 at 10,000); at 10,000
    stored a page of the ready and of the aborted ones is full, as at the large size. Hot: 10,000
    tasks of a queue of their own leased and completed as the Worker does (``lease_tasks_lean``,
    n 500, then ``complete_tasks``); they are deleted before the next repetition and before the
    reads."""

    name = "tasks"
    HOT = 10_000
    HOT_QUEUE = "flat-hot"
    RUNNING = 200
    QUIET = 50

    def build(self, b: Backend, echo: Callable[[str], None]) -> None:
        for lo, hi in _chunks(self.n):
            b.q(sql.FLAT_TASKS, {"lo": lo, "hi": hi, "n": self.n, "quiet_every": max(50, self.n // self.QUIET),
                                 "running_every": max(50, self.n // self.RUNNING)})
        b.q(sql.FLAT_TASK_SEQ, (self.n + 1,))
        if _has_function(b, "_task_count_all"):  # rows written by hand are counted again
            b.q(sql.TASK_COUNT_ALL)

    def clean(self, b: Backend) -> None:
        """The hot path's tasks go (so the reads see the stored tasks only, at either size)."""
        b.q(sql.DELETE_QUEUE, (self.HOT_QUEUE,))

    def measures(self) -> list[Measure]:
        state: dict[str, uuid.UUID] = {}
        hot = {"queue": self.HOT_QUEUE, "worker": "flat-1", "b": 500, "n": self.HOT}
        clean = self.clean

        def submit(b: Backend) -> None:
            clean(b)
            b.q(sql.SUBMIT_SERIES, hot)

        def work(b: Backend) -> int:
            done = 0
            while rows := b.q(sql.LEASE_LEAN, hot):
                b.q(sql.COMPLETE_LEASED, ([r["rn"] for r in rows], [r["token"] for r in rows]))
                done += len(rows)
            return done

        def middle(b: Backend) -> uuid.UUID:
            """A task id of 3.5 days ago: a page in the middle of the list."""
            if "middle" not in state:
                state["middle"] = b.one(sql.TASK_RN_AGO, (timedelta(days=3, hours=12),))["rn"]
            return state["middle"]

        def tasks(**args) -> Callable[[Backend], int]:
            return _read(tasks_sql.LIST_TASKS, **args)

        return [
            Measure("Worker: lease_tasks_lean + complete_tasks (per task)", "hot", work, setup=submit, reps=3),
            Measure("list_tasks()", "read", tasks(), setup=clean),
            Measure("list_tasks(before_rn => 3.5 days ago)", "read", tasks(before_rn=middle)),
            Measure("list_tasks(status => 'completed', before_rn => 3.5 days ago)", "read",
                    tasks(status="completed", before_rn=middle)),
            Measure("list_tasks(status => 'ready')", "read", tasks(status="ready")),
            Measure("list_tasks(queue => 'q03', status => 'ready')", "read", tasks(queue="q03", status="ready")),
            Measure("list_tasks(status => 'aborted')", "read", tasks(status="aborted")),
            Measure("list_tasks(status => 'running')", "read", tasks(status="running")),
            Measure("list_tasks(queue => 'q03')", "read", tasks(queue="q03")),
            Measure("list_tasks(queue => 'q11') (its ready backlog)", "read", tasks(queue="q11")),
            Measure("list_tasks(queue => 'q11', status => 'ready')", "read", tasks(queue="q11", status="ready")),
            Measure("list_tasks(queue => 'q13') (its scheduled backlog)", "read", tasks(queue="q13")),
            Measure("list_tasks(queue => 'quiet')", "read", tasks(queue="quiet")),
            Measure("list_tasks(queue => 'quiet', status => 'completed')", "read",
                    tasks(queue="quiet", status="completed")),
            Measure("task_counts", "read", _read(tasks_sql.TASK_COUNTS)),
            Measure("queue_status", "read", _read(tasks_sql.QUEUE_STATUS)),
            Measure("oldest_ready_tasks", "read", _read(tasks_sql.OLDEST_READY_TASKS)),
            Measure("expired_leases LIMIT 100", "read", _read(tasks_sql.EXPIRED_LEASES, "LIMIT 100")),
            # the dashboard's search: an id's prefix (13 hex digits), a spec fragment, a unique key
            Measure("find_tasks(rn_from, rn_to: an id's prefix)", "read",
                    _read(tasks_sql.FIND_TASKS, rn_from=lambda b: id_range(middle(b).hex[:13])[0],
                          rn_to=lambda b: id_range(middle(b).hex[:13])[1], max_tasks=20)),
            Measure("find_tasks(spec => {\"i\": 4242})", "read",
                    _read(tasks_sql.FIND_TASKS, spec=Jsonb({"i": 4242}), max_tasks=20)),
            Measure("find_tasks(unique_key)", "read", _read(tasks_sql.FIND_TASKS, unique_key="k-4242", max_tasks=20)),
        ]


# ---------------------------------------------------------------- shapes (issue 34)

def _hot(measures: list[Measure], *drop: str) -> list[Measure]:
    return [m for m in measures if m.kind == "hot" and m.name not in drop]


class TaskShape(Tasks):
    """Stored: n tasks of one shape the planner's statistics mislead on (QUERIES); the hot path and
    the reads of the shape's queues."""

    QUERIES = {"quiet": sql.FLAT_TASKS_QUIET, "one-queue": sql.FLAT_TASKS_ONE_QUEUE,
               "priorities": sql.FLAT_TASKS_PRIORITIES, "long-lease": sql.FLAT_TASKS_LONG_LEASE}
    READS = {
        "quiet": [{"queue": "hot"}, {"queue": "hot", "status": "completed"}, {"status": "completed"},
                  {"queue": "q03"}, {"status": "ready"}],
        "one-queue": [{"queue": "big"}, {"queue": "big", "status": "ready"}, {"queue": "big", "status": "aborted"},
                      {"queue": "big", "status": "cancelled"}, {"queue": "q03"},
                      {"queue": "q03", "status": "completed"}, {"status": "scheduled"}, {"status": "aborted"}],
        "priorities": [{"queue": "prio", "status": "ready"}, {"queue": "prio"}, {"status": "ready"}],
        "long-lease": [{"status": "running"}, {"queue": "long"}, {"queue": "long", "status": "completed"},
                       {"status": "completed"}],
    }
    shape = ""

    def build(self, b: Backend, echo: Callable[[str], None]) -> None:
        for lo, hi in _chunks(self.n):
            b.q(self.QUERIES[self.shape], {"lo": lo, "hi": hi, "n": self.n})
        b.q(sql.FLAT_TASK_SEQ, (self.n + 1,))
        b.q(sql.TASK_COUNT_ALL)

    def measures(self) -> list[Measure]:
        def label(args: dict) -> str:
            return ", ".join(f"{k} => '{v}'" for k, v in args.items())

        reads = [Measure(f"list_tasks({label(args)})", "read", _read(tasks_sql.LIST_TASKS, **args))
                 for args in self.READS[self.shape]]
        reads[0].setup = self.clean  # the hot path's tasks go: the reads see the shape only
        return _hot(super().measures()) + reads + [
            Measure("task_counts", "read", _read(tasks_sql.TASK_COUNTS)),
            Measure("queue_status", "read", _read(tasks_sql.QUEUE_STATUS)),
            Measure("oldest_ready_tasks", "read", _read(tasks_sql.OLDEST_READY_TASKS)),
            Measure("expired_leases LIMIT 100", "read", _read(tasks_sql.EXPIRED_LEASES, "LIMIT 100")),
        ]


class DelayShape(Delay):
    """Stored: n messages all far off (2099 on) or all due in the last hour that no relay took
    (then the hot path is enqueue alone: a claim would take the stored ones)."""

    shape = ""

    def build(self, b: Backend, echo) -> None:
        for lo, hi in _chunks(self.n):
            b.q(sql.FLAT_DELAY_FAR if self.shape == "far" else sql.FLAT_DELAY_DUE, (lo, hi))
        b.q(sql.DELAY_COUNT_ALL)

    def measures(self) -> list[Measure]:
        fire = () if self.shape == "far" else ("ready_and_claim + delete_fired (per message)",)
        return _hot(super().measures(), *fire) + [m for m in super().measures() if m.kind == "read"]


class SchedulesOneInstant(Schedules):
    """Stored: n schedules all due at one instant (today's midnight UTC: a daily cron of one zone,
    late), none critical; the hot ones as Schedules'."""

    def build(self, b: Backend, echo) -> None:
        first = b.call(schedules_sql.CREATE_SCHEDULE, name="template", every=timedelta(days=1), target_kind="kafka",
                       target="flat.bench", retry_attempts=0)[0]["create_schedule"]["id"]
        for lo, hi in _chunks(self.n):
            b.q(sql.FLAT_SCHEDULES_ONE_INSTANT, {"prefix": "cold-", "lo": lo, "hi": hi, "first": first})
        for prefix, critical in (("hot-r-", False), ("hot-c-", True)):
            b.q(sql.FLAT_SCHEDULES_HOT, {"prefix": prefix, "lo": 1, "hi": self.HOT, "first": first,
                                         "critical": critical})
        b.q(sql.DELETE_SCHEDULE_ROW, (first,))

    def measures(self) -> list[Measure]:
        mid = f"cold-{self.n // 2:08d}"
        return _hot(super().measures()) + [
            Measure("list_schedules()", "read", _read(schedules_sql.LIST_SCHEDULES)),
            Measure("list_schedules(after_name => middle)", "read",
                    _read(schedules_sql.LIST_SCHEDULES, after_name=mid)),
            Measure("list_schedules(critical => true)", "read", _read(schedules_sql.LIST_SCHEDULES, critical=True)),
            Measure("list_schedules(name_like => 'cold-0000%')", "read",
                    _read(schedules_sql.LIST_SCHEDULES, name_like="cold-0000%")),
            Measure("get_schedule", "read", _read(schedules_sql.GET_SCHEDULE, name=mid)),
            Measure("schedules_due_soon LIMIT 100", "read", _read(schedules_sql.SCHEDULES_DUE_SOON, "LIMIT 100")),
            Measure("schedules_late LIMIT 100", "read", _read(schedules_sql.SCHEDULES_LATE, "LIMIT 100")),
            Measure("schedules_late_count(up_to => 10000)", "read",
                    _read(schedules_sql.SCHEDULES_LATE_COUNT, up_to=10_000)),
            Measure("schedules_paused LIMIT 100", "read", _read(schedules_sql.SCHEDULES_PAUSED, "LIMIT 100")),
            Measure("schedules_failing LIMIT 100", "read", _read(schedules_sql.SCHEDULES_FAILING, "LIMIT 100")),
        ]


class ChecksOneSlot(Checks):
    """Stored: n checks all in the next slot, and n ended ones over the last 30 days."""

    def build(self, b: Backend, echo) -> None:
        b.q(sql.NOOP_CHECK_JOB)
        for lo, hi in _chunks(self.n):
            b.q(sql.FLAT_CHECKS_ONE_SLOT, (lo, hi))
            b.q(sql.FLAT_CHECK_HISTORY, (lo, hi, self.n))


def _shaped(base: type[Section], shape: str) -> type[Section]:
    return type(f"{base.__name__}_{shape}", (base,), {"shape": shape, "name": f"{base.name}-{shape}"})


SECTIONS: dict[str, type[Section]] = {
    "delay": Delay, "schedules": Schedules, "checks": Checks, "tasks": Tasks,
    **{f"tasks-{s}": _shaped(TaskShape, s) for s in TaskShape.QUERIES},
    "delay-far": _shaped(DelayShape, "far"), "delay-due": _shaped(DelayShape, "due"),
    "schedules-one-instant": _shaped(SchedulesOneInstant, "one-instant"),
    "checks-one-slot": _shaped(ChecksOneSlot, "one-slot")}
SHAPES = [name for name in SECTIONS if "-" in name]  # issue 34: each in a database of its own


def time_measure(b: Backend, m: Measure, result: Result) -> None:
    """Run ``m`` its reps times on ``b`` (its setup first, untimed), adding each run to ``result``."""
    for _ in range(m.reps):
        if m.setup is not None:
            m.setup(b)
        cpu0, t0 = b.cpu(), time.perf_counter()
        items = m.run(b)
        took, cpu1 = time.perf_counter() - t0, b.cpu()
        result.add(took, None if cpu0 is None or cpu1 is None else cpu1 - cpu0, items)
