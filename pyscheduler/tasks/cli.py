"""``pyscheduler tasks ...``: the monitor daemon, admin commands, a sample worker and
the demo (the capability contract of pyscheduler/daemon.py)."""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import queue as queue_mod
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import timedelta

import click

from ..calls import jsonable
from ..clihints import HintedGroup
from ..config import (DURATION, INSTANT, POSITIVE_DURATION, dsn_option, env, http_options,
                      option, require_dsn, require_text, wait_for_database)
from ..daemon import RunContext, install_signal_handlers, wait_for
from .. import migrate
from ..db import Database, Jsonb
from . import sqlapi as sql
from .app import TaskApp
from .client import STATUSES, Task, TaskClient
from .monitor import Monitor
from .worker import TaskContext, Worker

log = logging.getLogger(__name__)


def _monitor_options(f):
    f = option("--batch", type=click.IntRange(1), default=1000, show_default=True, envvar=env("tasks_batch"),
               help="Tasks reset per statement.")(f)
    f = option("--cleanup-interval", type=POSITIVE_DURATION, default="60s", show_default=True,
               envvar=env("tasks_cleanup_interval"), help="How often terminal tasks past retention are deleted.")(f)
    f = option("--retention", type=DURATION, default="7d", show_default=True, envvar=env("tasks_retention"),
               help="How long completed, aborted and cancelled tasks are kept.")(f)
    f = option("--merge-interval", type=POSITIVE_DURATION, default="250ms", show_default=True,
               envvar=env("tasks_merge_interval"),
               help="How often the spec search index's pending list is merged and the count tallies folded.")(f)
    f = option("--reset-interval", type=POSITIVE_DURATION, default="1s", show_default=True,
               envvar=env("tasks_reset_interval"),
               help="How often expired leases are looked for (a yield wakes the monitor at once).")(f)
    return f


def _monitor(dsn: str, reset_interval: timedelta, retention: timedelta, cleanup_interval: timedelta,
             batch: int, merge_interval: timedelta) -> Monitor:
    return Monitor(dsn, reset_interval=reset_interval.total_seconds(), retention=retention,
                   cleanup_interval=cleanup_interval.total_seconds(), batch=batch,
                   merge_interval=merge_interval.total_seconds())


class _Tasks(HintedGroup):
    """What to do next, in commands (the SQL's hints name SQL functions and arguments)."""

    codes = {
        "PS200": "The task never existed or was cleaned up after its retention period; "
                 "`pyscheduler tasks list` shows the tasks kept.",
        "PS201": "Another lease holds the task now: this token's lease expired; `pyscheduler tasks get RN` shows it.",
        "PS202": "The task is not running under a lease (reset, failed or finished); "
                 "`pyscheduler tasks get RN` shows it.",
        "PS203": "The task was cancelled and stays cancelled; `pyscheduler tasks retry RN` requeues it.",
        "PS209": "Only scheduled, ready or running tasks can be cancelled; `pyscheduler tasks retry RN` requeues an "
                 "aborted one.",
        "PS210": "The lease was yielded; the monitor makes the task ready again.",
        "PS211": "Only aborted or cancelled tasks can be requeued; `pyscheduler tasks get RN` shows its status.",
        "PS214": "A live task of the queue holds its unique key: `pyscheduler tasks list --queue QUEUE` shows it; "
                 "requeue this one once that one finished.",
        "PS216": f"A limit is 1..{sql.MAX_QUEUE_LIMIT} (`none` removes it); to lease nothing, "
                 "`pyscheduler tasks pause QUEUE`.",
        "42501": "It belongs to another role: run the command with that role's --dsn, or an admin's.",
    }


def _with_client(dsn: str | None, action):
    """``action(TaskClient)`` on a short-lived pool; its result."""
    with Database(require_dsn(dsn), max_size=1) as db:
        return action(TaskClient(db))


def _echo_json(obj) -> None:
    """A task as the SQL functions return it; another result with its fields."""
    click.echo(json.dumps(obj.json if isinstance(obj, Task) else jsonable(obj), indent=2, default=str))


@click.group("tasks", cls=_Tasks)
def group() -> None:
    """Leased tasks: queues, priorities, leases, heartbeats, cancel, yield, monitor."""


@group.command("monitor")
@dsn_option
@_monitor_options
@http_options()
def monitor_cmd(dsn, reset_interval, retention, cleanup_interval, batch, merge_interval, http_port,
                http_host) -> None:
    """Run the monitor: reset expired leases, merge the spec search index, delete old finished tasks."""
    from ..web.endpoint import run_serving

    wait_for_database(dsn, http_host, http_port)
    stop = threading.Event()
    install_signal_handlers(stop)
    sys.exit(run_serving([_monitor(dsn, reset_interval, retention, cleanup_interval, batch, merge_interval)], stop,
                         http_host, http_port, dsn=dsn))


@group.command("submit")
@dsn_option
@click.argument("queue")
@click.argument("spec")
@click.option("--priority", type=click.IntRange(0, sql.MAX_PRIORITY), default=50, show_default=True)
@click.option("--run-at", type=INSTANT, default=None,
              help="Not leased before this time (ISO 8601; UTC without an offset).")
@click.option("--delay", type=DURATION, default=None,
              help="Not leased before this long from now, by the database clock (e.g. 30s, 5m).")
@click.option("--unique-key", default=None,
              help="At most one live task of QUEUE with this key: a second submit answers the first task.")
@click.option("--max-attempts", type=click.IntRange(1, sql.MAX_ATTEMPTS), default=None,
              help="Attempts before a failing task is aborted  [default: the setting task_max_attempts]")
def submit_cmd(dsn, queue, spec, priority, run_at, delay, unique_key, max_attempts) -> None:
    """Submit a task: QUEUE and SPEC (a JSON object); later with --run-at or --delay."""
    try:
        spec_obj = json.loads(spec)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="SPEC") from exc
    if run_at is not None and delay is not None:
        raise click.UsageError("give --run-at or --delay, not both")
    require_text(unique_key, "--unique-key")
    _echo_json(_with_client(dsn, lambda client: client.submit(
        queue, spec_obj, priority, run_at=delay if delay is not None else run_at, unique_key=unique_key,
        max_attempts=max_attempts)))


@group.command("get")
@dsn_option
@click.argument("rn")
def get_cmd(dsn, rn) -> None:
    """Show one task."""
    _echo_json(_with_client(dsn, lambda client: client.get(rn)))


@group.command("list")
@dsn_option
@click.option("--queue", default=None)
@click.option("--status", type=click.Choice(STATUSES), default=None)
@click.option("--owner", default=None)
@click.option("--limit", type=click.IntRange(1), default=20, show_default=True)
def list_cmd(dsn, queue, status, owner, limit) -> None:
    """List tasks, newest first (filters: --queue, --status, --owner)."""
    for t in _with_client(dsn, lambda client: client.list(queue, status, owner, limit)):
        due = f" run_at={t['run_at']}" if t.status == "scheduled" else ""
        click.echo(f"{t.rn}  {t.queue:<12} {t.status:<9} p={t.priority:<5} "
                   f"progress={t.progress:.2f} attempts={t.attempts} owner={t.owner or '-'}{due}")


@group.command("cancel")
@dsn_option
@click.argument("rn")
def cancel_cmd(dsn, rn) -> None:
    """Cancel a scheduled, ready or running task of your role."""
    _echo_json(_with_client(dsn, lambda client: client.cancel(rn)))


@group.command("retry")
@dsn_option
@click.argument("rn", required=False)
@click.option("--queue", default=None, help="Requeue tasks of this queue instead of one task.")
@click.option("--status", type=click.Choice(["aborted", "cancelled"]), default="aborted", show_default=True,
              help="With --queue: which tasks.")
@click.option("--limit", type=click.IntRange(1, sql.MAX_REQUEUE), default=100, show_default=True,
              help="With --queue: at most this many, finished longest ago first.")
def retry_cmd(dsn, rn, queue, status, limit) -> None:
    """Requeue an aborted or cancelled task RN of your role (or, with --queue, up to --limit of
    them): ready again with its attempts reset and its errors kept."""
    if (rn is None) == (queue is None):
        raise click.UsageError("give RN (one task) or --queue (a batch), not both")
    if rn is not None:
        _echo_json(_with_client(dsn, lambda client: client.retry(_uuid(rn))))
        return
    require_text(queue, "--queue")
    rows = _with_client(dsn, lambda client: client.retry_many(queue, status, limit))
    for task in rows:
        click.echo(task.rn)
    click.echo(f"requeued {len(rows)} {status} task{'s' if len(rows) != 1 else ''} of queue {queue}"
               + (f" (at most {limit}: run it again for more)" if len(rows) == limit else ""))


@group.command("abort")
@dsn_option
@click.argument("rn")
@click.option("--token", required=True, help="The lease token (from the lease).")
@click.option("--code", required=True, help="The error code, e.g. superseded.")
@click.option("--description", default="", help="What went wrong.")
def abort_cmd(dsn, rn, token, code, description) -> None:
    """Abort task RN for good as the holder of its lease (--token): a worker written as a script.
    To stop a task you do not hold, `pyscheduler tasks cancel RN`."""
    require_text(code, "--code")
    require_text(description, "--description")
    errors = [{"code": code, "args": {}, "description": description}]
    _echo_json(_with_client(dsn, lambda client: client.db.call_value(
        sql.ABORT_TASK, rn=_uuid(rn), token=_uuid(token, "--token"), errors=Jsonb(errors))))


@group.command("pause")
@dsn_option
@click.argument("queue")
@click.option("--note", default=None, help="Why, e.g. 'payment provider down'.")
def pause_cmd(dsn, queue, note) -> None:
    """Pause QUEUE: its workers lease nothing from their next lease on (running tasks finish)."""
    require_text(queue, "QUEUE")
    require_text(note, "--note")
    _echo_json(_with_client(dsn, lambda client: client.pause_queue(queue, note)))


@group.command("resume")
@dsn_option
@click.argument("queue")
def resume_cmd(dsn, queue) -> None:
    """Resume QUEUE (paused by your role, or as admin) and wake its workers."""
    require_text(queue, "QUEUE")
    _echo_json(_with_client(dsn, lambda client: client.resume_queue(queue)))


@group.command("keep-completed")
@dsn_option
@click.argument("queue")
@click.argument("keep", type=click.Choice(["yes", "no"]))
def keep_completed_cmd(dsn, queue, keep) -> None:
    """Whether QUEUE keeps its completed tasks (yes: every queue's default) or deletes each task as
    it completes (no: failures, watched tasks and parents stay; set_queue_keep_completed)."""
    require_text(queue, "QUEUE")
    _echo_json(_with_client(dsn, lambda client: client.set_queue_keep_completed(queue, keep == "yes")))


@group.command("spec-index")
@dsn_option
@click.argument("state", type=click.Choice(["on", "off"]), required=False)
def spec_index_cmd(dsn, state) -> None:
    """The spec search index (find_tasks by spec, the dashboard's search): on (the default) or off,
    which saves every task its entries (10-18 % of a Worker's capacity on 2 cores) and leaves the
    search to the newest 100,000 tasks. Built or dropped CONCURRENTLY, by the schema's owner.
    Without STATE: prints on, off or invalid (a build that failed: run on again)."""
    url = require_dsn(dsn)
    now = migrate.spec_index(url) if state is None else migrate.set_spec_index(url, state == "on")
    click.echo(now)


@group.command("queues")
@dsn_option
@click.option("--watch", type=click.FloatRange(0.5, 3600), default=None, metavar="SECONDS",
              help="Redraw a table of the queues every SECONDS, with when a worker of each was last seen and "
                   "the queues nobody works flagged, as `top` does (Ctrl-C stops).")
@click.option("--iterations", type=click.IntRange(1), default=None, hidden=True,
              help="With --watch: stop after this many redraws.")
def queues_cmd(dsn, watch, iterations) -> None:
    """Per queue: tasks ready, delayed and running, paused or not, the oldest ready task's wait."""
    if watch is not None:
        _watch_queues(dsn, watch, iterations)
        return
    rows = _with_client(dsn, lambda client: client.db.query(sql.QUEUE_STATUS.select("ORDER BY queue")))
    for q in rows:
        age = f"{q['oldest_ready_age'].total_seconds():.1f}s" if q["oldest_ready_age"] is not None else "-"
        paused = f" PAUSED by {q['paused_by']}" + (f": {q['note']}" if q["note"] else "") if q["paused"] else ""
        click.echo(f"{q['queue']:<20} ready={q['ready']:<7} delayed={q['delayed']:<7} running={q['running']:<6} "
                   f"oldest_ready={age} next_due={q['next_due'] or '-'}{paused}")


def _watch_queues(dsn: str | None, every: float, iterations: int | None) -> None:
    """``tasks queues --watch``: the table, redrawn (the screen cleared on a terminal)."""
    from ..sqlapi import NOW
    from .workers import NO_WORKER_AFTER, last_seen

    def ago(d: timedelta | None) -> str:
        if d is None:
            return "-"
        s = d.total_seconds()
        return f"{s:.1f}s" if s < 90 else f"{s / 60:.0f}m" if s < 5400 else f"{s / 3600:.1f}h"

    with Database(require_dsn(dsn), max_size=1) as db, contextlib.suppress(KeyboardInterrupt):
        drawn = 0
        while iterations is None or drawn < iterations:
            now = db.query(NOW)[0]["now"]
            rows = db.query(sql.QUEUE_STATUS.select("ORDER BY queue"))
            seen = last_seen(db.query(sql.WORKERS.select()))
            click.clear()
            click.echo(f"pyscheduler queues at {now:%Y-%m-%d %H:%M:%S}Z (every {every:g} s; Ctrl-C stops)")
            click.echo(f"{'QUEUE':<24} {'READY':>8} {'DELAYED':>8} {'RUNNING':>8} {'WAITING':>8} {'OLDEST':>8} "
                       f"{'WORKER SEEN':>11}  STATE")
            for q in rows:
                worker = now - seen[q["queue"]] if q["queue"] in seen else None
                state = "paused" if q["paused"] else "NO WORKER" if q["ready"] and (
                    worker is None or worker > NO_WORKER_AFTER) else ""
                click.echo(f"{q['queue']:<24} {q['ready']:>8} {q['delayed']:>8} {q['running']:>8} {q['waiting']:>8} "
                           f"{ago(q['oldest_ready_age']):>8} {ago(worker) + ' ago' if worker else 'never':>11}  "
                           f"{state}".rstrip())
            drawn += 1
            if iterations is None or drawn < iterations:
                time.sleep(every)


def _limit(value: str | None, what: str) -> int | None | bool:
    """A limit option: None (not given: keep), False (`none`: remove), or an int in 1..MAX_QUEUE_LIMIT."""
    if value is None:
        return None
    if value.strip().lower() == "none":
        return False
    try:
        n = int(value)
    except ValueError:
        raise click.BadParameter(f"a number of tasks or 'none', got {value!r}", param_hint=what) from None
    if not 1 <= n <= sql.MAX_QUEUE_LIMIT:
        raise click.BadParameter(f"must be in 1..{sql.MAX_QUEUE_LIMIT} (to lease nothing, pause the queue), got {n}",
                                 param_hint=what)
    return n


def _rate(value: str) -> tuple[int, timedelta] | bool:
    """--rate STARTS/DURATION (500/1s, 60/1m) or none."""
    if value.strip().lower() == "none":
        return False
    starts, sep, per = value.partition("/")
    n = _limit(starts, "--rate")
    if not sep or not isinstance(n, int) or isinstance(n, bool):
        raise click.BadParameter(f"STARTS/DURATION, e.g. 500/1s, or none; got {value!r}", param_hint="--rate")
    return n, DURATION.convert(per, None, None)


@group.command("limits")
@dsn_option
@click.argument("queue", required=False)
@click.option("--running-per-key", default=None, metavar="N|none",
              help="At most N tasks of one concurrency key run at once (none: no limit).")
@click.option("--running-total", default=None, metavar="N|none", help="At most N tasks of the queue run at once.")
@click.option("--rate", default=None, metavar="STARTS/DURATION|none",
              help="At most STARTS leases begin per DURATION (a token bucket), e.g. 500/1s.")
@click.option("--by-key/--per-queue", default=False, show_default=True,
              help="With --rate: a bucket per concurrency key, or one for the queue.")
def limits_cmd(dsn, queue, running_per_key, running_total, rate, by_key) -> None:
    """Show the queues' limits, or set QUEUE's: concurrency per key and in total, and a rate of
    lease starts. Options not given keep their value; `none` removes a limit."""
    per_key, total = _limit(running_per_key, "--running-per-key"), _limit(running_total, "--running-total")
    new_rate = None if rate is None else _rate(rate)
    if queue is None:
        if (per_key, total, new_rate) != (None, None, None):
            raise click.UsageError("name the QUEUE whose limits to set")
        rows = _with_client(dsn, lambda client: client.queue_limits())
        for q in rows:
            r = f"{q.rate_starts}/{q.rate_per.total_seconds():g}s{' by key' if q.rate_by_key else ''}" \
                if q.rate_starts is not None and q.rate_per is not None else "-"
            click.echo(f"{q.queue:<20} running_per_key={q.running_per_key or '-'} "
                       f"running_total={q.running_total or '-'} rate={r} set_by={q.limits_by}")
        return
    require_text(queue, "QUEUE")

    def apply(client: TaskClient):
        current = {q.queue: q for q in client.queue_limits()}.get(queue)
        answer = None
        if per_key is not None or total is not None or current is None and new_rate is None:
            keep_key = current.running_per_key if current else None
            keep_total = current.running_total if current else None
            answer = client.set_queue_limits(
                queue, running_per_key=keep_key if per_key is None else (per_key or None),
                running_total=keep_total if total is None else (total or None))
        if new_rate is not None:
            starts, per = (None, timedelta(seconds=1)) if new_rate is False else new_rate
            answer = client.set_rate_limit(queue, starts, per, by_key=by_key)
        return answer

    _echo_json(_with_client(dsn, apply))


def _uuid(value: str, what: str = "RN") -> uuid.UUID:
    """A task id or lease token argument as a UUID; a usage error naming it otherwise."""
    try:
        return uuid.UUID(value)
    except ValueError:
        raise click.BadParameter(f"not a UUID: {value!r}", param_hint=what) from None


_say_lock = threading.Lock()


def _say(text: str) -> None:
    """One whole line on stdout: print() from handler threads at once could interleave two
    lines' text before their newlines (tests wait for lines starting with 'leased')."""
    with _say_lock:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


def sleep_handler(ctx: TaskContext) -> None:
    """The sample handler: sleeps spec['seconds'] in steps, reporting progress."""
    seconds = float(ctx.spec.get("seconds", 0))
    _say(f"leased {ctx.rn} {json.dumps(ctx.spec)}")
    started = time.monotonic()
    while (elapsed := time.monotonic() - started) < seconds:
        if ctx.stopping.wait(min(0.1, seconds - elapsed)):
            _say(f"stopped {ctx.rn} ({ctx.reason})")
            return
        ctx.progress(min(1.0, elapsed / seconds))
    _say(f"done {ctx.rn}")


@group.command("work")
@dsn_option
@click.option("--queue", required=True)
@option("--capacity", type=click.IntRange(1), default=1, show_default=True, envvar=env("tasks_capacity"),
        help="Tasks worked at once.")
@option("--lease-timeout", type=POSITIVE_DURATION, default="10s", show_default=True,
        envvar=env("tasks_lease_timeout"), help="Lease length; heartbeats extend it every third of it.")
@http_options()
def work_cmd(dsn, queue, capacity, lease_timeout, http_port, http_host) -> None:
    """A sample worker: sleeps spec.seconds per task (for demos and crash tests)."""
    from prometheus_client import CollectorRegistry

    from ..web.endpoint import run_serving

    wait_for_database(dsn, http_host, http_port)
    stop = threading.Event()
    install_signal_handlers(stop)
    registry = CollectorRegistry(auto_describe=True) if http_port is not None else None
    worker = Worker(dsn, queue, sleep_handler, capacity=capacity, timeout=lease_timeout.total_seconds(),
                    poll_interval=0.5, registry=registry)
    sys.exit(run_serving([worker], stop, http_host, http_port, dsn=dsn, registry=registry))


def load_app(path: str) -> TaskApp:
    """The TaskApp at ``module:attribute`` (the module found from the current directory too)."""
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise click.BadParameter(f"expected MODULE:ATTRIBUTE, got {path!r}", param_hint="APP")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        app = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise click.BadParameter(f"cannot load {path}: {exc}", param_hint="APP") from None
    if not isinstance(app, TaskApp):
        raise click.BadParameter(f"{path} is a {type(app).__name__}, not a TaskApp", param_hint="APP")
    return app


@group.command("sync-schedules")
@click.argument("app", metavar="APP")
def sync_schedules_cmd(app) -> None:
    """Create or update the schedules of APP's periodic tasks (APP: MODULE:ATTRIBUTE, a TaskApp,
    on its own database) and print what changed; schedules no longer declared are listed under
    "removed" and left in place."""
    task_app = load_app(app)
    try:
        _echo_json(task_app.sync_schedules())
    finally:
        task_app.close()


def daemons(ctx: RunContext) -> list:
    """The monitor, configured from the same environment variables as ``tasks monitor``."""
    values = {}
    for p in monitor_cmd.params:
        if p.name in ("reset_interval", "retention", "cleanup_interval", "batch", "merge_interval"):
            raw = os.environ.get(p.envvar) or p.default
            values[p.name] = p.type.convert(raw, p, None) if not isinstance(raw, int) else raw
    return [_monitor(ctx.dsn, **values)]


class WorkerProcess:
    """A sample worker process (``pyscheduler tasks work``) whose output lines are
    read in a thread, so waiting for one never blocks past a deadline."""

    def __init__(self, dsn: str, queue: str, lease_timeout: str = "2s", capacity: int = 1):
        self.log = tempfile.TemporaryFile(mode="w+")  # its log, shown when it fails us
        self.proc = subprocess.Popen(worker_command(dsn, queue, lease_timeout, capacity), stdout=subprocess.PIPE,
                                     stderr=self.log, text=True)
        self.pid = self.proc.pid
        self._lines: queue_mod.Queue[str] = queue_mod.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line.strip())

    def line(self, timeout: float = 30.0, startswith: str = "") -> str:
        """The next output line that starts with ``startswith``; TimeoutError after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue_mod.Empty:
                self.log.seek(0)
                raise TimeoutError(f"worker {self.pid} printed no {startswith!r} line in {timeout}s; "
                                   f"its log:\n{self.log.read()[-3000:]}") from None
            if line.startswith(startswith):
                return line

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def worker_command(dsn: str, queue: str, lease_timeout: str = "2s", capacity: int = 1) -> list[str]:
    """argv of a sample worker process (``pyscheduler tasks work``)."""
    return [sys.executable, "-m", "pyscheduler", "tasks", "work", "--dsn", dsn,
            "--queue", queue, "--lease-timeout", lease_timeout, "--capacity", str(capacity)]


def demo(ctx: RunContext, echo) -> None:
    """Mixed priorities, two worker processes, one killed with -9: timeout and re-lease."""
    stop = threading.Event()
    monitor = Monitor(ctx.dsn, reset_interval=0.5)
    mon_thread = threading.Thread(target=monitor.run, args=(stop,), daemon=True)
    mon_thread.start()
    procs: list[WorkerProcess] = []
    with Database(ctx.dsn, max_size=2) as db:
        client = TaskClient(db)
        queue = f"demo-{os.getpid()}"
        long = client.submit(queue, {"name": "long report", "seconds": 3}, priority=100)
        for p in (2, 9, 10):
            client.submit(queue, {"name": f"priority {p}", "seconds": 0.2}, priority=p)
        echo("submitted: 'long report' (priority 100, 3 s) and three short tasks of priorities 2, 9, 10")
        victim = WorkerProcess(ctx.dsn, queue)
        procs.append(victim)
        echo(f"worker A (pid {victim.pid}): {victim.line(startswith='leased')}")
        held = wait_for(lambda: client.get(long["rn"])["owner"], timeout=30)
        progress = wait_for(lambda: client.get(long["rn"])["progress"], timeout=30)  # sent by a heartbeat
        echo(f"the highest priority went first: 'long report' is leased by {held}, heartbeat progress "
             f"{progress:.2f}; killing worker A with SIGKILL (no yield, no goodbye)")
        victim.proc.kill()
        victim.proc.wait()
        rescuer = WorkerProcess(ctx.dsn, queue)
        procs.append(rescuer)
        order = [rescuer.line(startswith="leased") for _ in range(3)]
        echo("worker B leases in priority order, numerically (10 before 9 before 2):")
        for line in order:
            echo(f"  {line}")
        task = wait_for(lambda: (t := client.get(long["rn"]))["owner"] not in (None, held) and t, timeout=30)
        echo(f"after its 2 s lease expired the monitor reset 'long report'; now leased by {task['owner']}")
        done = wait_for(lambda: (t := client.get(long["rn"]))["status"] == "completed" and t, timeout=30)
        echo("history of 'long report':")
        for h in done["history"]:
            extra = f" progress={h['progress']:.2f}" if "progress" in h else ""
            echo(f"  {h['_typ']:<15} {h['worker']:<10} {h['time']}{extra}")
        counts = db.query(sql.TASK_COUNTS.select("WHERE queue = %s ORDER BY status", "status, tasks"), (queue,))
        echo("task_counts: " + ", ".join(f"{r['status']}={r['tasks']}" for r in counts))
    for p in procs:
        p.stop()
    stop.set()
    mon_thread.join(10)
