"""Every query of the dashboard, in one place: ``Reader`` (the monitor role's views and
functions only, docs/sql-api.md "Roles", as the capabilities' ``sqlapi`` declare them) and
``Actions`` (the write side: the typed clients' calls, on their own login); ``attempts``
reads a task's attempts from its history. Lists page by
keyset through the SQL functions' cursors: a page asks for ``size + 1`` rows, the extra one
says whether there is a next page (docs/operations.md, "Dashboard").
"""

from __future__ import annotations

import base64
import functools
import json
import re
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, get_args

from ... import sqlapi
from ...checks import sqlapi as checks_sql
from ...checks.client import CheckOutcome
from ...db import Database, Jsonb
from ...errors import InvalidArgument, SchedulerError
from ...delay import sqlapi as delay_sql
from ...schedules import sqlapi as schedules_sql
from ...schedules.client import RunOutcome
from ...sqlapi import View
from ...tasks import sqlapi as tasks_sql
from ...tasks.client import TaskStatus
from .formatting import parse_time

PAGE = 50  # rows per page
UP_TO = 1000  # the overview counts up to this many ("1000+"): a LIMIT stops each read
LATE_AFTER = timedelta(seconds=10)  # schedules_late: due more than 10 seconds ago
MAX_WORKERS = 1000  # rows of the workers page
TASK_STATUSES: tuple[str, ...] = get_args(TaskStatus)
CHECK_OUTCOMES: tuple[str, ...] = get_args(CheckOutcome)
RUN_OUTCOMES: tuple[str, ...] = get_args(RunOutcome)


@dataclass
class Page:
    rows: list[dict[str, Any]]
    next: str | None = None  # the cursor of the next page, None on the last


def encode_cursor(value: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(value, default=str).encode()).decode().rstrip("=")


def decode_cursor(token: str | None) -> dict[str, Any]:
    if not token:
        return {}
    try:
        value = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (ValueError, TypeError):
        return {}
    return value if isinstance(value, dict) else {}


_HEX = re.compile(r"[0-9a-f]{4,32}")
_SPEC_TERM = re.compile(r"(?P<path>[A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*)*):(?!//)(?P<value>.+)", re.S)


def id_range(q: str) -> tuple[uuid.UUID, uuid.UUID] | None:
    """The ids a task id prefix stands for (4 to 32 hex digits, dashes anywhere), or None."""
    digits = q.strip().lower().replace("-", "")
    if not _HEX.fullmatch(digits):
        return None
    return uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))


def spec_fragment(q: str) -> dict[str, Any] | None:
    """``to:a@example.com`` as the spec fragment ``{"to": "a@example.com"}`` (``a.b:v``: ``{"a":
    {"b": "v"}}``; a value that reads as JSON, ``42``, ``true``, ``"42"``, is that value), or a
    JSON object as itself; None for anything else."""
    q = q.strip()
    if q.startswith("{"):
        try:
            value = json.loads(q)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None
    m = _SPEC_TERM.fullmatch(q)
    if m is None:
        return None
    try:
        fragment: Any = json.loads(m["value"])
    except ValueError:
        fragment = m["value"]
    for key in reversed(m["path"].split(".")):
        fragment = {key: fragment}
    return fragment


def attempts(task: dict[str, Any]) -> list[dict[str, Any]]:
    """A task's attempts as its history shows them: each lease (TaskAssignment) to the entry
    after it (a retry, a timeout, a yield, how it ended), with its worker and duration; the
    errors go to the attempts that failed (TaskRetry, TaskAborted), latest last (the history
    and the errors are both trimmed from the front)."""
    history = task.get("history") or []
    out: list[dict[str, Any]] = []
    for i, h in enumerate(history):
        if h.get("_typ") != "TaskAssignment":
            continue
        after = history[i + 1] if i + 1 < len(history) else None
        start, end = parse_time(h.get("time")), parse_time(after.get("time")) if after else None
        out.append({"worker": h.get("worker"), "started": start, "ended": end,
                    "took": end - start if start and end else None,
                    "how": after.get("_typ") if after else ("running" if task["status"] == "running" else "")})
    failed = [a for a in out if a["how"] in ("TaskRetry", "TaskAborted")]
    for a, error in zip(reversed(failed), reversed(task.get("errors") or [])):
        a["error"] = error
    return out


class Reader:
    """The monitor's reads (a pool of a login that is a member of pyscheduler_monitor)."""

    def __init__(self, db: Database):
        self.db = db
        self._lock = threading.Lock()
        self._windowed_cache: dict[tuple, tuple[float, list[dict[str, Any]]]] = {}  # _windowed's
        # delay_queue samples (the delay queue keeps no history): (monotonic, wall, row)
        self.delay_samples: deque[tuple[float, datetime, dict[str, Any]]] = deque()

    # -- overview -------------------------------------------------------------------

    def clock(self) -> datetime:
        return self.db.query(sqlapi.NOW)[0]["now"]

    @functools.cached_property
    def role(self) -> str:
        """The role the pages read as (what it may not see is hidden: docs/sql-api.md, "Ownership")."""
        return self.db.query(sqlapi.CURRENT_ROLE)[0]["role"]

    def _windowed(self, fn: Any, since: timedelta, **args: Any) -> list[dict[str, Any]]:
        """``fn`` over the last ``since``; a range of a day or more is read again at most once a
        minute (the tasks and schedule executions come from their per-minute rollups, but the
        checks' history is read up to 100,000 rows: a page's refresh would repeat it)."""
        if since < timedelta(days=1):
            return self.db.call(fn, since=since, **args)
        key = (fn, since, *args.values())
        hit = self._windowed_cache.get(key)
        if hit is None or time.monotonic() - hit[0] > 60:
            hit = self._windowed_cache[key] = (time.monotonic(), self.db.call(fn, since=since, **args))
        return hit[1]

    def activity(self, since: timedelta = timedelta(hours=1),
                 bucket: timedelta = timedelta(minutes=5)) -> list[dict[str, Any]]:
        """Ended in the last ``since``, per capability, outcome and bucket."""
        return self._windowed(sqlapi.ACTIVITY, since, bucket=bucket)

    def latency(self, since: timedelta, bucket: timedelta) -> list[dict[str, Any]]:
        """Latency p50/p95 per capability and bucket (activity_latency)."""
        return self._windowed(sqlapi.ACTIVITY_LATENCY, since, bucket=bucket)

    def counts(self) -> dict[str, int]:
        """The overview's counts of what needs a look, each up to ``UP_TO``."""
        return {"expired": self._count(tasks_sql.EXPIRED_LEASES),
                "late": self.db.call_value(schedules_sql.SCHEDULES_LATE_COUNT, up_to=UP_TO),
                "failing": self._count(schedules_sql.SCHEDULES_FAILING),
                "paused": self._count(schedules_sql.SCHEDULES_PAUSED),
                "overdue": self._count(checks_sql.OVERDUE_CHECKS)}

    def _count(self, view: View) -> int:
        return self.db.query(f"SELECT count(*) AS n FROM ({view.select('LIMIT %s', '1')}) x", (UP_TO,))[0]["n"]

    # -- tasks ----------------------------------------------------------------------

    def queues(self) -> list[dict[str, Any]]:
        return self.db.query(tasks_sql.QUEUE_STATUS.select("ORDER BY queue"))

    def all_queues(self) -> list[dict[str, Any]]:
        """Every queue with tasks (finished ones kept included), paused or limited: queue_status's
        row, its count of each status (task_counts: exact) and its limits (queue_limits)."""
        rows: dict[str, dict[str, Any]] = {}
        for c in self.db.query(tasks_sql.TASK_COUNTS.select()):
            rows.setdefault(c["queue"], {"queue": c["queue"], "counts": {}})["counts"][c["status"]] = c["tasks"]
        for q in self.queues():
            rows.setdefault(q["queue"], {"queue": q["queue"], "counts": {}}).update(q)
        for q in self.db.query(tasks_sql.QUEUE_LIMITS.select()):
            rows.setdefault(q["queue"], {"queue": q["queue"], "counts": {}})["limits"] = q
        return [rows[k] for k in sorted(rows)]

    def finished(self, since: timedelta) -> dict[str, Any]:
        """Tasks finished in the last ``since`` per queue and status (queue_activity), and
        whether all were counted (else the newest 100,000)."""
        rows = self._windowed(sqlapi.QUEUE_ACTIVITY, since)
        per: dict[str, dict[str, int]] = {}
        for r in rows:
            per.setdefault(r["queue"], {})[r["status"]] = r["n"]
        return {"queues": per, "complete": all(r["complete"] for r in rows)}

    def queue_limits(self, queue: str) -> dict[str, Any] | None:
        rows = self.db.query(tasks_sql.QUEUE_LIMITS.select("WHERE queue = %s"), (queue,))
        return rows[0] if rows else None

    def task_family(self, rn: str) -> list[dict[str, Any]]:
        return self.db.call(tasks_sql.TASK_FAMILY, rn=uuid.UUID(rn), max_tasks=100)

    def workers(self) -> list[dict[str, Any]]:
        return self.db.query(tasks_sql.WORKERS.select("ORDER BY queue, worker LIMIT %s"), (MAX_WORKERS,))

    def expired_leases(self, limit: int = 20) -> list[dict[str, Any]]:
        return self.db.query(tasks_sql.EXPIRED_LEASES.select("ORDER BY deadline LIMIT %s"), (limit,))

    def tasks(self, *, queue: str | None, status: str | None, owner: str | None, cursor: str | None,
              size: int = PAGE) -> Page:
        before = decode_cursor(cursor).get("before")
        try:
            before = str(uuid.UUID(before)) if before is not None else None
        except (ValueError, TypeError, AttributeError):
            before = None  # not a cursor of this page: the first page
        rows = [r["task"] for r in self.db.call(tasks_sql.LIST_TASKS, queue=queue, status=status, owner=owner,
                                                max_tasks=size + 1, before_rn=before)]
        nxt = encode_cursor({"before": rows[size - 1]["rn"]}) if len(rows) > size else None
        return Page(rows[:size], nxt)

    def task(self, rn: str) -> dict[str, Any] | None:
        """The task; its history (the page's timeline) with its durable steps, sleeps and events
        merged in, in time order, when the reader sees its contents."""
        try:
            task: dict[str, Any] | None = self.db.call_value(tasks_sql.GET_TASK, rn=uuid.UUID(rn))
        except ValueError:
            return None  # not a task id: no such task
        if task is not None and not task.get("redacted"):
            try:
                steps = self.db.call(tasks_sql.TASK_STEPS, rn=uuid.UUID(rn))
            except SchedulerError:  # a reader without the right to them (42501): the history alone
                steps = []
            task["history"] = sorted(task["history"] + [_step_entry(s) for s in steps],
                                     key=lambda h: str(h.get("time") or ""))
        return task

    # -- search -----------------------------------------------------------------------

    def search(self, q: str, limit: int = 20) -> dict[str, list[dict[str, Any]]]:
        """What the search box finds for ``q``, each kind of term read through an index
        (docs/operations.md, "Dashboard"): tasks by id prefix, spec fragment (``to:a@x``) or
        unique key; a queue by name; the running tasks of a worker; schedules by name or
        target prefix; checks by entity key; a delay message by id. A term a kind refuses
        (not a valid key, name or id) finds nothing of that kind."""
        found: dict[str, list[dict[str, Any]]] = {}

        def each(kind: str, read: Any) -> None:
            try:
                found[kind] = read()
            except InvalidArgument:
                found[kind] = []

        rng, fragment = id_range(q), spec_fragment(q)
        if rng is not None:
            each("tasks by id", lambda: [r["task"] for r in self.db.call(
                tasks_sql.FIND_TASKS, rn_from=rng[0], rn_to=rng[1], max_tasks=limit)])
        if fragment is not None:
            each("tasks by spec", lambda: [r["task"] for r in self.db.call(
                tasks_sql.FIND_TASKS, spec=Jsonb(fragment), max_tasks=limit)])
        each("tasks by unique key", lambda: [r["task"] for r in self.db.call(
            tasks_sql.FIND_TASKS, unique_key=q, max_tasks=limit)])
        each("tasks held by worker", lambda: [r["task"] for r in self.db.call(
            tasks_sql.LIST_TASKS, owner=q, status="running", max_tasks=limit)])
        found["queues"] = [r for r in self.queues() if r["queue"] == q]
        prefix = q.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        each("schedules by name", lambda: [r["schedule"] for r in self.db.call(
            schedules_sql.LIST_SCHEDULES, name_like=prefix, max_schedules=limit)])
        each("schedules by target", lambda: [r["schedule"] for r in self.db.call(
            schedules_sql.FIND_SCHEDULES, target_prefix=q, max_schedules=limit)])
        each("checks by entity key", lambda: self.db.call(checks_sql.FIND_CHECKS, entity_key=q, max=limit))
        found["delay messages by id"] = self.message(q)
        return found

    # -- delay queue ----------------------------------------------------------------

    def delay(self) -> dict[str, Any]:
        with self.db.session() as s:
            row = s._cursor().execute(delay_sql.DELAY_QUEUE.select(columns="*, now() AS now")).fetchone()
            nodes = s._cursor().execute(
                delay_sql.DELAY_READY_BY_NODE.select("ORDER BY oldest_readied_at LIMIT 100")).fetchall()
        self._sample_delay(row)
        return {"queue": row, "nodes": nodes}

    def waiting_messages(self, cursor: str | None) -> Page:
        """A page of the waiting messages, soonest deadline first (keyset by deadline and id)."""
        c = decode_cursor(cursor)
        deadline = parse_time(c.get("deadline"))  # None: not a cursor of this page, the first page
        after = (deadline, c.get("id")) if deadline and isinstance(c.get("id"), str) else (None, None)
        rows = self.db.call(delay_sql.WAITING_MESSAGES, after_deadline=after[0], after_id=after[1],
                            max_messages=PAGE + 1)
        last = rows[PAGE - 1] if len(rows) > PAGE else None
        nxt = encode_cursor({"deadline": last["deadline"].isoformat(), "id": last["id"]}) if last else None
        return Page([dict(r, state="waiting") for r in rows[:PAGE]], nxt)

    def message(self, id: str) -> list[dict[str, Any]]:
        """The stored message of that id (none when the id is not one a message may have)."""
        try:
            return self.db.call(delay_sql.FIND_MESSAGE, id=id)
        except InvalidArgument:
            return []

    def _sample_delay(self, row: dict[str, Any]) -> None:
        """Keep one sample per 10 s for an hour: the delay queue's only history."""
        now = time.monotonic()
        with self._lock:
            if self.delay_samples and now - self.delay_samples[-1][0] < 10:
                return
            self.delay_samples.append((now, row["now"], {k: row[k] for k in ("waiting", "ready", "overdue")}))
            while self.delay_samples and now - self.delay_samples[0][0] > 3600:
                self.delay_samples.popleft()

    # -- schedules ------------------------------------------------------------------

    def schedules(self, *, name_like: str | None, target_kind: str | None, paused: bool | None,
                  critical: bool | None, cursor: str | None) -> Page:
        args = dict(name_like=name_like, target_kind=target_kind, paused=paused, critical=critical)
        after = decode_cursor(cursor).get("after")
        rows = [r["schedule"] for r in self.db.call(schedules_sql.LIST_SCHEDULES, **args, max_schedules=PAGE + 1,
                                                    after_name=after)]
        nxt = encode_cursor({"after": rows[PAGE - 1]["name"]}) if len(rows) > PAGE else None
        return Page(rows[:PAGE], nxt)

    def due_soon(self, limit: int = 20) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(late, due soon): one read for both, as schedules_due_soon lists the late schedules
        first, in the order of schedules_late (both by due time), so its first ``limit`` rows hold
        the first ``limit`` late ones; a late one gets ``late_by``."""
        soon = self.db.query(schedules_sql.SCHEDULES_DUE_SOON.select("LIMIT %s"), (limit,))
        return [dict(s, late_by=-s["due_in"]) for s in soon if s["due_in"] < -LATE_AFTER], soon

    def failing_schedules(self, limit: int = 20) -> list[dict[str, Any]]:
        return self.db.query(schedules_sql.SCHEDULES_FAILING.select("LIMIT %s"), (limit,))

    def paused_schedules(self, limit: int = 20) -> list[dict[str, Any]]:
        return self.db.query(schedules_sql.SCHEDULES_PAUSED.select("LIMIT %s"), (limit,))

    def schedule(self, name: str) -> dict[str, Any]:
        return self.db.call_value(schedules_sql.GET_SCHEDULE, name=name)

    def upcoming(self, name: str, n: int = 5) -> list[Any]:
        return [r["run_at"] for r in self.db.call(schedules_sql.UPCOMING_RUNS, name=name, n=n)]

    def preview(self, *, cron: str | None, every: timedelta | None, tz: str | None, start_at: datetime | None,
                n: int) -> list[Any]:
        """The next ``n`` fire times of a recurrence not saved yet (the schedule editor's preview)."""
        return [r["run_at"] for r in self.db.call(schedules_sql.UPCOMING_RUNS, n=n, cron=cron, every=every,
                                                  tz=tz or "UTC", start_at=start_at)]

    def runs(self, name: str, *, outcome: str | None, cursor: str | None) -> Page:
        before = decode_cursor(cursor).get("before")
        rows = self.db.call(schedules_sql.SCHEDULE_RUNS, name=name, with_outcome=outcome, max_runs=PAGE + 1,
                            before=before)
        nxt = encode_cursor({"before": rows[PAGE - 1]["expected_at"].isoformat()}) if len(rows) > PAGE else None
        return Page(rows[:PAGE], nxt)

    # -- checks ---------------------------------------------------------------------

    def check_slots(self) -> dict[str, Any]:
        return self.db.call(checks_sql.CHECK_SLOTS)[0]

    def checks_per_slot(self, limit: int = 12) -> list[dict[str, Any]]:
        return self.db.query(checks_sql.CHECKS_PER_SLOT.select("ORDER BY slot LIMIT %s"), (limit,))

    def overdue_checks(self, limit: int = 20) -> list[dict[str, Any]]:
        # the view's own order (oldest slot first) lets a LIMIT stop its index scan
        return self.db.query(checks_sql.OVERDUE_CHECKS.select("LIMIT %s"), (limit,))

    def check_outcomes(self) -> list[dict[str, Any]]:
        return self.db.query(checks_sql.CHECK_OUTCOMES.select("ORDER BY job, outcome"))

    def checks(self, *, entity_name: str | None, entity_key: str | None, job: str | None,
               cursor: str | None) -> Page:
        args = dict(entity_name=entity_name, entity_key=entity_key, job=job)
        c = decode_cursor(cursor)
        rows = self.db.call(checks_sql.LIST_CHECKS, **args, max=PAGE + 1, after_at=c.get("at"), after_id=c.get("id"))
        last = rows[PAGE - 1] if len(rows) > PAGE else None
        nxt = encode_cursor({"at": last["next_check_at"].isoformat(), "id": last["id"]}) if last else None
        return Page(rows[:PAGE], nxt)

    def history(self, *, entity_name: str | None, entity_key: str | None, job: str | None,
                outcome: str | None, cursor: str | None) -> Page:
        """check_history has no outcome filter: the outcome is filtered on the page."""
        args = dict(entity_name=entity_name, entity_key=entity_key, job=job)
        keep = (lambda rows: [r for r in rows if r["outcome"] == outcome]) if outcome else (lambda rows: rows)
        c = decode_cursor(cursor)
        rows = self.db.call(checks_sql.CHECK_HISTORY, **args, max=PAGE + 1, before_at=c.get("at"),
                            before_id=c.get("id"))
        last = rows[PAGE - 1] if len(rows) > PAGE else None
        nxt = encode_cursor({"at": last["ended"].isoformat(), "id": last["id"]}) if last else None
        return Page(keep(rows[:PAGE]), nxt)


class Actions:
    """The write side, only with --allow-actions: the typed clients' calls (a task, schedule
    or check belongs to its role: use an admin login to act on all)."""

    def __init__(self, db: Database):
        from ...checks import CheckClient
        from ...schedules import ScheduleClient
        from ...tasks import TaskClient

        tasks, schedules, checks = TaskClient(db), ScheduleClient(db), CheckClient(db)
        self.cancel_task, self.retry_task = tasks.cancel, tasks.retry
        self.delete_tasks, self.run_tasks_now = tasks.delete_many, tasks.run_now
        self.pause_queue, self.resume_queue = tasks.pause_queue, tasks.resume_queue
        self.pause_schedule, self.resume_schedule = schedules.pause, schedules.resume
        self.trigger_schedule, self.delete_checks = schedules.trigger, checks.delete
        self.create_schedule, self.update_schedule = schedules.create, schedules.update
        self.delete_schedule = schedules.delete
        self.cancel_message = lambda id: db.call_value(delay_sql.CANCEL_MESSAGE, id=id)  # no delay client has it


# task_steps' kinds as the task page's history entries
STEP_ENTRIES = {"step": "Step", "sleep": "Sleep", "event": "Event", "await": "AwaitingEvent"}


def _step_entry(row: dict[str, Any]) -> dict[str, Any]:
    """A task_steps row as a history entry of the task page's timeline."""
    kind, result = row["kind"], row["result"]
    result = result if isinstance(result, dict) or kind == "step" else {"result": result}  # as stored by hand
    entry: dict[str, Any] = {"_typ": STEP_ENTRIES[kind],
                             "time": row["recorded"].astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")}
    if kind == "step":
        return entry | {"step": row["step"], "result": result}
    if kind == "sleep":
        return entry | {"sleep": row["step"], "until": result.get("until")}
    return entry | {"event": row["step"], **result}
