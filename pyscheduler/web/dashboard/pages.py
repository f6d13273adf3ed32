"""The dashboard's pages: ``Dashboard`` (a ``http.Site``) renders the overview, tasks, task,
workers, search, delay queue, schedules, schedule and checks pages from ``data.Reader`` (as a
login in ``pyscheduler_monitor``, or the action login when actions are on), and with
``allow_actions`` offers the actions of ``ACTIONS`` and the bulk actions of ``BULK_OPS`` on
tasks, each a GET that shows a confirmation and a POST that acts through ``data.Actions``.
``make_app`` builds one.
"""

from __future__ import annotations

import functools
import html
import logging
import re
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta, timezone
from typing import Any

from markupsafe import Markup

from ...db import Database
from ...errors import SchedulerError
from . import charts, editor
from ...tasks.workers import unattended
from .data import CHECK_OUTCOMES, PAGE, RUN_OUTCOMES, TASK_STATUSES, Actions, Reader, attempts
from .formatting import environment, fmt_relative, mask_target
from .http import HTTPError, Request, Site

log = logging.getLogger("pyscheduler.dashboard")

REFRESH_S = 10
BULK_MAX = 1000  # tasks one bulk action takes at most (of a filter: its newest first)
BULK_BATCH = 100  # task ids per call of delete_tasks and run_tasks_now
BULK_OPS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    # op: (what it does, the past tense, the statuses it applies to)
    "retry": ("Requeue", "requeued", ("aborted", "cancelled")),
    "cancel": ("Cancel", "cancelled", ("waiting", "scheduled", "ready", "running")),
    "delete": ("Delete", "deleted", ("completed", "aborted", "cancelled")),
    "run": ("Run now", "made due now", ("scheduled",)),
}


class Dashboard(Site):
    """The WSGI application (``make_app`` builds one)."""

    def __init__(self, dsn: str, *, allow_actions: bool = False, token: str | None = None,
                 action_dsn: str | None = None, redis_url: str | None = None,
                 redis_prefix: str = "pyscheduler:schedules", refresh_s: int = REFRESH_S,
                 allowed_hosts: str | Iterable[str] | None = None):
        super().__init__(allow_actions=allow_actions, token=token, allowed_hosts=allowed_hosts)
        self.dsn = dsn
        self.action_dsn = action_dsn or dsn
        self.redis_url = redis_url
        self.redis_prefix = redis_prefix
        self.refresh_s = refresh_s
        self._db: Database | None = None
        self._open_lock = threading.Lock()
        self.reader: Reader | None = None
        self._redis_state: tuple[float, dict[str, Any]] | None = None
        # what /readyz knows, when the process's endpoint serves the dashboard (web.endpoint.serve
        # sets it): () -> (ready, body), as Health.report
        self.health: Callable[[], tuple[bool, dict[str, Any]]] | None = None
        self.env = environment()
        self.routes = [
            ("GET", re.compile(r"^/$"), self.overview),
            ("GET", re.compile(r"^/tasks$"), self.tasks_page),
            ("GET", re.compile(r"^/tasks/(?P<rn>[0-9a-fA-F-]{36})$"), self.task_page),
            ("GET", re.compile(r"^/search$"), self.search_page),
            ("GET", re.compile(r"^/workers$"), self.workers_page),
            ("GET", re.compile(r"^/delay$"), self.delay_page),
            ("GET", re.compile(r"^/delay/messages$"), self.delay_messages_page),
            ("GET", re.compile(r"^/schedules$"), self.schedules_page),
            ("GET", re.compile(r"^/schedule$"), self.schedule_page),
            ("GET", re.compile(r"^/schedules/(?P<name>.+)$"), self.schedule_page),
            ("GET", re.compile(r"^/schedule/(?:new|edit)$"), functools.partial(editor.edit_page, self)),
            ("POST", re.compile(r"^/schedule/save$"), functools.partial(editor.save, self)),
            ("GET", re.compile(r"^/checks$"), self.checks_page),
            ("GET", re.compile(r"^/confirm/bulk_tasks$"), self.bulk_confirm_page),
            ("POST", re.compile(r"^/actions/bulk_tasks$"), self.bulk_act),
            ("GET", re.compile(r"^/confirm/(?P<action>[a-z_]+)$"), self.confirm_page),
            ("POST", re.compile(r"^/actions/(?P<action>[a-z_]+)$"), self.act),
            ("GET", re.compile(r"^/login$"), self.login_page),
            ("POST", re.compile(r"^/login$"), self.login),
        ]

    # -- resources ------------------------------------------------------------------

    def _open(self) -> Reader:
        """The pages read as the login that acts when actions are on (the operator sees what
        that role may see: docs/sql-api.md, "Ownership"), else as the read-only login."""
        with self._open_lock:
            if self.reader is None:
                db = Database(self.action_dsn if self.allow_actions else self.dsn, min_size=1, max_size=4,
                              name="dashboard", timeout=10.0)
                db.open(wait=True, timeout=10.0)
                self._db, self.reader = db, Reader(db)
            return self.reader

    def _actions(self) -> Actions:
        self._open()
        assert self._db is not None
        return Actions(self._db)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()

    def redis_state(self) -> dict[str, Any]:
        """Degraded mode as the executors see it: Redis unreachable, or its index incomplete
        (marker gone: a resync runs). Cached 5 s; unknown without --redis-url."""
        if not self.redis_url:
            return {"known": False}
        now = time.monotonic()
        if self._redis_state and now - self._redis_state[0] < 5:
            return self._redis_state[1]
        from ...schedules.index import Shards  # its client from pyscheduler.redisconn

        state: dict[str, Any] = {"known": True}
        try:
            index = Shards.from_url(self.redis_url, self.redis_prefix, timeout=0.5)  # redis:// or redis+cluster://
            try:
                state.update(index_complete=index.marker() is not None, reachable=True)
            finally:
                index.close()
        except Exception as exc:  # noqa: BLE001  (any failure to reach Redis is what we report)
            state.update(reachable=False, error=type(exc).__name__)
        self._redis_state = (now, state)
        return state

    # -- rendering ------------------------------------------------------------------------

    def _render(self, req: Request, template: str, **ctx: Any) -> str:
        now = ctx.pop("now", None) or datetime.now(timezone.utc)
        flash = None
        try:
            flash = self._read_flash(req)
        except (ValueError, TypeError):
            pass

        def url(path: str, **params: Any) -> str:
            return req.url(path, **params)

        def here(**changes: Any) -> str:
            q = dict(req.query)
            q.pop("flash", None)
            q.update(changes)
            return req.url(req.path, **q)

        def action(name: str, label: str, /, danger: bool = False, **args: Any) -> Markup:
            if not self.allow_actions:
                return Markup("")
            href = req.url(f"/confirm/{name}", next=_here_plain(req), **args)
            cls = "act danger" if danger else "act"
            return Markup(f'<a class="{cls}" href="{html.escape(href)}">{html.escape(label)}</a>')

        return self.env.get_template(template).render(
            req=req, url=url, here=here, action=action, now=now, nonce=req.nonce,
            rel=lambda v: fmt_relative(v, now), allow_actions=self.allow_actions, flash=flash,
            refresh_s=self.refresh_s, PAGE=PAGE, mask_target=mask_target, next_here=_here_plain(req),
            reader_role=lambda: self.reader.role if self.reader is not None else "",
            health=self.health() if self.health is not None else None, **ctx)

    # -- pages ----------------------------------------------------------------------------

    def overview(self, req: Request) -> str:
        r = self._open()
        now = r.clock()
        queues = r.queues()
        span, (since, bucket, per) = _range(req)
        delay = r.delay()
        slots = r.check_slots()
        per_slot = r.checks_per_slot(4)
        hour = charts.summarise(r.activity(since, bucket), now, since / timedelta(hours=1), bucket)
        latency = r.latency(since, bucket)
        return self._render(
            req, "overview.html", title="overview", now=now, queues=queues,
            tasks_total={k: sum(q[k] for q in queues) for k in ("ready", "delayed", "running")},
            unattended=unattended(queues, r.workers(), now),
            paused_queues=sum(1 for q in queues if q["paused"]),
            oldest_ready=max((q["oldest_ready_age"] for q in queues if q["oldest_ready_age"]), default=None),
            **r.counts(),
            delay=delay, slots=slots, per_slot=per_slot, hour=hour, redis=self.redis_state(),
            span=span, spans=list(charts.RANGES), per=per,
            charts={cap: Markup(charts.bars(hour[cap]["buckets"], hour["edges"], per)) for cap in charts.CAPABILITIES},
            latency={cap: Markup(charts.latency([x for x in latency if x["capability"] == cap], hour["edges"],
                                                hour["index"])) for cap in charts.CAPABILITIES},
            delay_chart=Markup(charts.samples([(t, s) for _, t, s in r.delay_samples], now)))

    def tasks_page(self, req: Request) -> str:
        r = self._open()
        queue, owner = req.arg("queue"), req.arg("owner")
        status = req.arg("status") or "running"
        if status not in TASK_STATUSES + ("all",):
            raise HTTPError("400 Bad Request", f"unknown status {status!r}")
        page = r.tasks(queue=queue, status=None if status == "all" else status, owner=owner,
                       cursor=req.arg("cursor"))
        span, (since, _, _) = _range(req)
        return self._render(req, "tasks.html", title="tasks", now=r.clock(), queues=r.all_queues(),
                            expired=r.expired_leases(20), page=page, queue=queue, owner=owner, status=status,
                            statuses=TASK_STATUSES, span=span, spans=list(charts.RANGES), finished=r.finished(since))

    def task_page(self, req: Request, rn: str) -> str:
        r = self._open()
        try:
            task = r.task(rn)
        except SchedulerError as exc:
            raise HTTPError("404 Not Found", f"task {rn}: {exc}") from None
        if task is None:
            raise HTTPError("404 Not Found", f"no task {rn}")
        ended = "Task" + task["status"].capitalize()
        if (task["status"] in ("completed", "aborted", "cancelled") and task.get("history") is not None
                and (not task["history"] or task["history"][-1].get("_typ") != ended)):
            # the history records leases (and a cancel); how the task ended is its status since its last update
            task["history"] = [*task["history"], {"_typ": ended, "time": task["updated"], "worker": task["owner"]}]
        return self._render(req, "task.html", title=f"task {rn}", now=r.clock(), task=task, attempts=attempts(task),
                            family=r.task_family(rn), limits=r.queue_limits(task["queue"]))

    def workers_page(self, req: Request) -> str:
        r = self._open()
        now, queues, workers = r.clock(), r.queues(), r.workers()
        return self._render(req, "workers.html", title="workers", now=now, workers=workers,
                            unattended=unattended(queues, workers, now))

    def search_page(self, req: Request) -> str:
        r = self._open()
        q = (req.query.get("q") or "").strip()[:2048]
        found = r.search(q) if q else {}
        return self._render(req, "search.html", title=f"search {q}" if q else "search", now=r.clock(), q=q,
                            found=found)

    def delay_page(self, req: Request) -> str:
        r = self._open()
        d = r.delay()
        now = d["queue"]["now"]
        return self._render(req, "delay.html", title="delay queue", now=now, d=d,
                            chart=Markup(charts.samples([(t, s) for _, t, s in r.delay_samples], now)))

    def schedules_page(self, req: Request) -> str:
        r = self._open()
        kind = req.arg("target_kind")
        if kind not in (None, "kafka", "http", "task"):
            raise HTTPError("400 Bad Request", f"unknown target kind {kind!r}")
        flags = {k: {"yes": True, "no": False}.get(req.arg(k) or "") for k in ("paused", "critical")}
        page = r.schedules(name_like=req.arg("name_like"), target_kind=kind, cursor=req.arg("cursor"), **flags)
        late, soon = r.due_soon(20)
        return self._render(req, "schedules.html", title="schedules", now=r.clock(), page=page,
                            late=late, failing=r.failing_schedules(), paused=r.paused_schedules(),
                            redis=self.redis_state(), due_soon=soon[:10])

    def schedule_page(self, req: Request, name: str | None = None) -> str:
        """``/schedules/NAME`` or ``/schedule?name=NAME``."""
        r = self._open()
        name = name or req.query.get("name") or ""
        outcome = req.arg("outcome")
        if outcome not in (None,) + RUN_OUTCOMES:
            raise HTTPError("400 Bad Request", f"unknown outcome {outcome!r}")
        try:
            schedule = r.schedule(name)
        except SchedulerError as exc:
            raise HTTPError("404 Not Found", str(exc)) from None
        return self._render(req, "schedule.html", title=f"schedule {name}", now=r.clock(), s=schedule,
                            upcoming=r.upcoming(name), runs=r.runs(name, outcome=outcome, cursor=req.arg("cursor")),
                            outcome=outcome, outcomes=RUN_OUTCOMES)

    def checks_page(self, req: Request) -> str:
        r = self._open()
        filters = {k: req.arg(k) for k in ("entity_name", "entity_key", "job")}
        outcome = req.arg("outcome")
        if outcome not in (None,) + CHECK_OUTCOMES:
            raise HTTPError("400 Bad Request", f"unknown outcome {outcome!r}")
        pending = r.checks(**filters, cursor=req.arg("cursor"))
        history = r.history(**filters, outcome=outcome, cursor=req.arg("hcursor"))
        return self._render(req, "checks.html", title="checks", now=r.clock(), slots=r.check_slots(),
                            per_slot=r.checks_per_slot(12), overdue=r.overdue_checks(20),
                            outcomes=r.check_outcomes(), pending=pending, history=history, filters=filters,
                            outcome=outcome, check_outcomes=CHECK_OUTCOMES)

    def delay_messages_page(self, req: Request) -> str:
        """The waiting messages, soonest first, a page at a time; or the one of ``id``."""
        r = self._open()
        id = req.arg("id")
        return self._render(req, "delay_messages.html", title="waiting messages", now=r.clock(), id=id,
                            found=r.message(id) if id else None,
                            page=None if id else r.waiting_messages(req.arg("cursor")))

    # -- actions ----------------------------------------------------------------------------

    ACTIONS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
        # name: (what it does, required arguments, optional arguments)
        "cancel_task": ("Cancel task {rn}", ("rn",), ()),
        "retry_task": ("Requeue task {rn} (a fresh round of attempts)", ("rn",), ()),
        "pause_queue": ("Pause queue {queue}: its workers lease nothing until it is resumed", ("queue",), ("note",)),
        "resume_queue": ("Resume queue {queue}", ("queue",), ()),
        "pause_schedule": ("Pause schedule {name}", ("name",), ("note",)),
        "resume_schedule": ("Resume schedule {name} (from the first occurrence at or after now)", ("name",), ()),
        "trigger_schedule": ("Fire schedule {name} once now", ("name",), ()),
        "delete_schedule": ("Delete schedule {name} and its runs", ("name",), ()),
        "delete_checks": ("Delete the pending checks of {entity_name} {entity_key} (job {job})",
                          ("entity_name", "entity_key"), ("job",)),
        "cancel_message": ("Cancel delayed message {id}: it never fires", ("id",), ()),
    }

    def _action_args(self, action: str, source: dict[str, str]) -> dict[str, str | None]:
        if not self.allow_actions:
            raise HTTPError("403 Forbidden", "actions are disabled (start the dashboard with --allow-actions)")
        if action not in self.ACTIONS:
            raise HTTPError("404 Not Found", f"no action {action}")
        _, required, optional = self.ACTIONS[action]
        args: dict[str, str | None] = {}
        for name in required:
            value = (source.get(name) or "").strip()
            if not value:
                raise HTTPError("400 Bad Request", f"{action} needs {name}")
            args[name] = value
        for name in optional:
            args[name] = (source.get(name) or "").strip() or None
        if "rn" in args:
            try:
                args["rn"] = str(uuid.UUID(args["rn"] or ""))
            except ValueError:
                raise HTTPError("400 Bad Request", "rn is not a UUID") from None
        return args

    def confirm_page(self, req: Request, action: str) -> str:
        args = self._action_args(action, req.query)
        what = self.ACTIONS[action][0].format(**{k: v if v is not None else "any" for k, v in args.items()})
        return self._render(req, "confirm.html", title="confirm", act_name=action, args=args, what=what,
                            back=_safe_next(req.query.get("next")), csrf=self.csrf_token(req))

    def act(self, req: Request, action: str):
        self._check_csrf(req)
        args = self._action_args(action, req.form)
        back = _safe_next(req.form.get("next"))
        what = self.ACTIONS[action][0].format(**{k: v if v is not None else "any" for k, v in args.items()})
        try:
            result = getattr(self._actions(), action)(**args)
            ok, text = True, f"done: {what}" + (f" ({result} checks)" if action == "delete_checks" else "")
            if action == "cancel_message" and not result:
                ok, text = False, f"not cancelled: {what}: it is no longer waiting (fired, being fired, or unknown)"
            if action == "delete_schedule" and not result:
                ok, text = False, f"not deleted: {what}: there is no such schedule"
            log.info("dashboard action %s %s", action, args)
        except SchedulerError as exc:
            ok, text = False, f"refused: {what}: {exc}" + (f" ({exc.sqlstate})" if exc.sqlstate else "")
        sep = "&" if "?" in back else "?"
        return "303 See Other", "", [("Location", req.root + back + sep + "flash=" + self._flash(ok, text))]


    # -- bulk actions on tasks --------------------------------------------------------------

    def _bulk_op(self, op: str | None) -> str:
        if not self.allow_actions:
            raise HTTPError("403 Forbidden", "actions are disabled (start the dashboard with --allow-actions)")
        if op not in BULK_OPS:
            raise HTTPError("400 Bad Request", f"unknown bulk action {op!r}")
        return op

    def bulk_confirm_page(self, req: Request) -> str:
        """The tasks ticked on a list (``rn``, repeated), or with ``scope=filter`` those the list's
        filter matches (``queue``, ``status``, ``owner``: its newest BULK_MAX, of the statuses the
        action applies to): how many, before anything is done."""
        op = self._bulk_op(req.arg("op"))
        verb, _, statuses = BULK_OPS[op]
        if req.arg("scope") == "filter":
            status = req.arg("status") or "running"
            if status not in TASK_STATUSES + ("all",):
                raise HTTPError("400 Bad Request", f"unknown status {status!r}")
            rows = self._open().tasks(queue=req.arg("queue"), status=None if status == "all" else status,
                                      owner=req.arg("owner"), cursor=None, size=BULK_MAX).rows
            rns = [t["rn"] for t in rows if t["status"] in statuses]
            which = " ".join(filter(None, ["the", "/".join(s for s in statuses if status in (s, "all")),
                                           "tasks", req.arg("queue") and f"in queue {req.arg('queue')}",
                                           req.arg("owner") and f"held by {req.arg('owner')}"]))
            what = f"{verb} {len(rns)} tasks: {which}" + (f" (its newest {BULK_MAX})" if len(rows) >= BULK_MAX else "")
        else:
            rns = _task_ids(req.arg_list("rn"))
            what = f"{verb} {len(rns)} selected task{'' if len(rns) == 1 else 's'} (those {'/'.join(statuses)})"
        if not rns:
            raise HTTPError("400 Bad Request", "no task to act on: tick some rows, or filter the list")
        return self._render(req, "confirm.html", title="confirm", act_name="bulk_tasks", what=what,
                            args={"op": op, "rns": ",".join(rns)}, back=_safe_next(req.query.get("next")),
                            csrf=self.csrf_token(req), danger=op in ("cancel", "delete"))

    def bulk_act(self, req: Request):
        """The confirmed ids, in batches: retry and cancel one task a call (retry_task and cancel_task
        decide each), delete and run now BULK_BATCH a call; logged, and the flash says how many."""
        self._check_csrf(req)
        op = self._bulk_op(req.form.get("op"))
        verb, done_word, _ = BULK_OPS[op]
        rns = _task_ids((req.form.get("rns") or "").split(","))
        actions = self._actions()
        done, refused = 0, []
        if op in ("retry", "cancel"):
            act = actions.retry_task if op == "retry" else actions.cancel_task
            for rn in rns:
                try:
                    act(rn=rn)
                    done += 1
                except SchedulerError as exc:
                    refused.append(f"{rn}: {exc}" + (f" ({exc.sqlstate})" if exc.sqlstate else ""))
        else:
            act = actions.delete_tasks if op == "delete" else actions.run_tasks_now
            for i in range(0, len(rns), BULK_BATCH):
                done += len(act(rns[i:i + BULK_BATCH]))
        log.info("dashboard bulk action %s: %d of %d tasks %s", op, done, len(rns), done_word)
        text = f"done: {done_word} {done} of {len(rns)} tasks"
        if done < len(rns):
            text += f"; {len(rns) - done} left as they were" + (f" (first: {refused[0]})" if refused else
                                                                 " (not in a status it applies to, or another role's)")
        back = _safe_next(req.form.get("next"))
        sep = "&" if "?" in back else "?"
        return "303 See Other", "", [("Location", req.root + back + sep + "flash=" + self._flash(True, text))]


def _range(req: Request) -> tuple[str, tuple[timedelta, timedelta, str]]:
    """The page's time range (?range=1h|6h|24h|7d, default 1h) and its (since, bucket, words)."""
    span = req.arg("range") or "1h"
    if span not in charts.RANGES:
        raise HTTPError("400 Bad Request", f"unknown range {span!r} (one of {', '.join(charts.RANGES)})")
    return span, charts.RANGES[span]


def _task_ids(values: Iterable[str]) -> list[str]:
    """Task ids from a form (empty ones skipped), at most BULK_MAX; 400 for one that is not a UUID."""
    try:
        rns = list(dict.fromkeys(str(uuid.UUID(v.strip())) for v in values if v.strip()))
    except ValueError:
        raise HTTPError("400 Bad Request", "a task id is not a UUID") from None
    if len(rns) > BULK_MAX:
        raise HTTPError("400 Bad Request", f"at most {BULK_MAX} tasks at a time")
    return rns


def _here_plain(req: Request) -> str:
    q = {k: v for k, v in req.query.items() if k != "flash"}
    return req.path + ("?" + urllib.parse.urlencode(q) if q else "")


def _safe_next(value: str | None) -> str:
    """Only a path of this site (no scheme, no //host)."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    return value


def make_app(dsn: str, allow_actions: bool = False, token: str | None = None, action_dsn: str | None = None,
             **options: Any) -> Dashboard:
    """The dashboard as a WSGI callable. ``dsn``: a login in pyscheduler_monitor, the pages'
    when actions are off; ``action_dsn``: the login the pages and actions use when they are on
    (default ``dsn``; an admin login sees and acts on every role's work); options: ``redis_url``,
    ``redis_prefix``, ``refresh_s``, ``allowed_hosts`` (names it answers to besides loopback:
    ``parse_hosts``)."""
    return Dashboard(dsn, allow_actions=allow_actions, token=token, action_dsn=action_dsn, **options)
