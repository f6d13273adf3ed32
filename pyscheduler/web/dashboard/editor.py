"""The schedule editor: ``/schedule/new`` and ``/schedule/edit?name=`` show a form of every
field of a schedule; it posts (CSRF- and origin-checked) to ``/schedule/save`` with one of
two buttons: ``preview`` shows the next runs of the recurrence typed (upcoming_runs, no
change), ``save`` creates or updates the schedule as the action login (update: only the
fields changed). A refusal (a bad cron, zone or target, another role's schedule) shows the
form again with the SQL's error and the field it names marked. Deleting is the action
``delete_schedule`` (pages.ACTIONS). docs/operations.md, "Dashboard".
"""

from __future__ import annotations

import json
import logging
import re
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ...calls import duration_text
from ...config import DURATION
from ...errors import SchedulerError
from ...schedules.client import OVERLAPS, TARGET_KINDS, UNBOUNDED, Schedule
from .http import HTTPError, Request

if TYPE_CHECKING:
    from .pages import Dashboard

log = logging.getLogger("pyscheduler.dashboard")

PREVIEW_RUNS = 10
DURATIONS = ("every", "retry_base", "retry_jitter", "catchup_window")
INSTANTS = ("start_at", "end_at")
INTEGERS = ("priority", "retry_attempts", "max_runs")
JSONS = ("payload", "task_options")
TEXTS = ("name", "cron", "tz", "target_kind", "target", "overlap", "paused_note")
FLAGS = ("critical", "paused")
# the field a schedule error's SQLSTATE is about (when its message does not start with one)
CODE_FIELDS = {"PS301": "cron", "PS302": "every", "PS303": "tz", "PS304": "end_at", "PS305": "every",
               "PS306": "every", "PS307": "target", "PS308": "payload", "PS309": "retry_attempts", "PS310": "name",
               "PS311": "name", "PS313": "cron", "PS314": "start_at"}
FIELDS = TEXTS + DURATIONS + INSTANTS + INTEGERS + JSONS + FLAGS


class FieldError(Exception):
    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def form_of(schedule: dict[str, Any] | None) -> dict[str, str]:
    """The form's text of each field: a schedule as get_schedule returns it, or the defaults
    of create_schedule for a new one."""
    if schedule is None:
        return {"tz": "UTC", "target_kind": "kafka", "payload": "{}", "priority": "50", "retry_attempts": "3",
                "retry_base": "200ms", "retry_jitter": "500ms", "catchup_window": "1m", "overlap": "allow"}
    s = Schedule.from_json(schedule)
    out = {k: "" if getattr(s, k) is None else str(getattr(s, k))
           for k in ("name", "cron", "tz", "target_kind", "target", "overlap", *INTEGERS)}
    out |= {k: duration_text(getattr(s, k)) for k in DURATIONS if getattr(s, k) is not None}
    out |= {k: getattr(s, k).isoformat() for k in INSTANTS if getattr(s, k) is not None}
    out |= {k: json.dumps(getattr(s, k)) for k in JSONS if getattr(s, k) is not None}
    out |= {k: "on" for k in FLAGS if getattr(s, k)}
    return out


def parse(form: dict[str, str]) -> dict[str, Any]:
    """The client's arguments from the form's text (None: left empty); FieldError names the
    field a value cannot be read from."""
    out: dict[str, Any] = {k: (form.get(k) or "").strip() or None for k in TEXTS}
    for k in DURATIONS:
        raw = (form.get(k) or "").strip()
        try:
            out[k] = DURATION.convert(raw, None, None) if raw else None
        except Exception:  # noqa: BLE001  (click's BadParameter: said with the field's name)
            raise FieldError(k, f"{k} must be a duration such as 30s, 5m, 2h or 7d, got {raw!r}") from None
    for k in INSTANTS:
        raw = (form.get(k) or "").strip()
        try:
            at = datetime.fromisoformat(raw) if raw else None
        except ValueError:
            raise FieldError(k, f"{k} must be an ISO 8601 instant such as 2030-01-01T09:00:00+02:00, "
                                f"got {raw!r}") from None
        out[k] = at.replace(tzinfo=timezone.utc) if at is not None and at.tzinfo is None else at
    for k in INTEGERS:
        raw = (form.get(k) or "").strip()
        if raw and not re.fullmatch(r"-?\d{1,19}", raw):
            raise FieldError(k, f"{k} must be a whole number, got {raw!r}")
        out[k] = int(raw) if raw else None
    for k in JSONS:
        raw = (form.get(k) or "").strip()
        try:
            out[k] = json.loads(raw) if raw else None
        except ValueError as exc:
            raise FieldError(k, f"{k} is not JSON: {exc}") from None
    for k in FLAGS:
        out[k] = form.get(k) == "on"
    if out["every"] is not None and out["cron"] is not None:
        raise FieldError("every", "give one of every and cron, not both")
    return out


def changes(new: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
    """update's arguments: the fields whose value differs from the schedule's (a bound or the
    task options emptied: removed)."""
    was = parse(form_of(old))
    out = {k: v for k, v in new.items() if k not in ("name", "paused", "paused_note") and v is not None and v != was[k]}
    if new["every"] is not None and was["cron"] is not None:
        out["every"] = new["every"]
    if new["cron"] is not None and was["every"] is not None:
        out["cron"] = new["cron"]
    for k in ("start_at", "end_at", "max_runs"):
        if new[k] is None and was[k] is not None:
            out[k] = UNBOUNDED
    if new["task_options"] is None and was["task_options"] is not None:
        out["task_options"] = {}
    return out


def error_field(exc: SchedulerError) -> str | None:
    """The field a refusal names: the first word of its message, else its SQLSTATE's field."""
    first = re.match(r"[a-z_]+", str(exc))
    if first and first[0] in FIELDS:
        return first[0]
    return CODE_FIELDS.get(exc.sqlstate or "")


def _editor(dash: Dashboard) -> None:
    if not dash.allow_actions:
        raise HTTPError("403 Forbidden", "actions are disabled (start the dashboard with --allow-actions)")


def _render(dash: Dashboard, req: Request, *, editing: str | None, form: dict[str, str],
            error: tuple[str | None, str] | None = None, preview: list[Any] | None = None,
            status: str = "200 OK") -> tuple[str, str, list[tuple[str, str]]]:
    r = dash._open()
    body = dash._render(req, "schedule_edit.html", title=f"edit schedule {editing}" if editing else "new schedule",
                        now=r.clock(), editing=editing, f=form, error=error, preview=preview,
                        csrf=dash.csrf_token(req), target_kinds=TARGET_KINDS, overlaps=OVERLAPS)
    return status, body, []


def edit_page(dash: Dashboard, req: Request) -> tuple[str, str, list[tuple[str, str]]]:
    """``/schedule/new``, or ``/schedule/edit?name=NAME``: the form, filled."""
    _editor(dash)
    name = req.query.get("name")
    if req.path.endswith("/new"):
        return _render(dash, req, editing=None, form=form_of(None))
    try:
        schedule = dash._open().schedule(name or "")
    except SchedulerError as exc:
        raise HTTPError("404 Not Found", str(exc)) from None
    note = None if schedule.get("target") is not None else (
        None, f"schedule {name} belongs to {schedule['owner']}: the dashboard's action login "
              f"({dash._open().role}) may not see its target or change it")
    return _render(dash, req, editing=name, form=form_of(schedule), error=note)


def save(dash: Dashboard, req: Request) -> tuple[str, str, list[tuple[str, str]]]:
    """The form posted: ``do=preview`` shows the next runs, ``do=save`` creates (no ``editing``)
    or updates the schedule ``editing``; 303 to the schedule's page when done."""
    _editor(dash)
    dash._check_csrf(req)
    form = {k: req.form.get(k, "") for k in FIELDS}
    editing = req.form.get("editing") or None
    if editing:
        form["name"] = editing
    try:
        args = parse(form)
        if req.form.get("do") == "preview":
            runs = dash._open().preview(cron=args["cron"], every=args["every"], tz=args["tz"],
                                        start_at=args["start_at"], n=PREVIEW_RUNS)
            return _render(dash, req, editing=editing, form=form, preview=runs)
        if req.form.get("do") != "save":
            raise HTTPError("400 Bad Request", "do must be preview or save")
        actions = dash._actions()
        if editing:
            actions.update_schedule(editing, **changes(args, dash._open().schedule(editing)))
            what = f"updated schedule {editing}"
        else:
            if args["name"] is None:
                raise FieldError("name", "name is missing")
            if args["target"] is None:
                raise FieldError("target", "target is missing")
            actions.create_schedule(**{k: v for k, v in args.items() if v is not None and v is not False})
            what = f"created schedule {args['name']}"
    except FieldError as exc:
        return _render(dash, req, editing=editing, form=form, error=(exc.field, str(exc)), status="400 Bad Request")
    except SchedulerError as exc:
        text = f"{exc}" + (f" ({exc.sqlstate})" if exc.sqlstate else "")
        status = "403 Forbidden" if exc.sqlstate == "42501" else "400 Bad Request"
        return _render(dash, req, editing=editing, form=form, error=(error_field(exc), text), status=status)
    name = editing or args["name"]
    log.info("dashboard action: %s", what)
    return "303 See Other", "", [("Location", req.url("/schedule", name=name) + "&flash="
                                  + dash._flash(True, f"done: {what}"))]

