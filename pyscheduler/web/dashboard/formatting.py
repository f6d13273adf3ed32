"""How the dashboard's pages show values: times (UTC), durations, relative times, JSON
with credential-like keys masked (``mask_json``), HTTP targets masked (``mask_target``,
through pyscheduler.masking), and the jinja2 environment of the templates with these as
filters (autoescaped)."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import jinja2

from ...masking import mask_url

_SECRET_KEY = re.compile(r"pass|secret|token|auth|credential|api[-_]?key|private|signature|cookie|session",
                         re.IGNORECASE)


def mask_json(value: Any) -> Any:
    """A JSON value with the values of credential-like keys replaced by ``***``."""
    if isinstance(value, dict):
        return {k: ("***" if _SECRET_KEY.search(str(k)) else mask_json(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [mask_json(v) for v in value]
    return value


def mask_target(kind: str | None, target: str | None) -> str | None:
    return mask_url(target) if kind == "http" else target


def parse_time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    return None


def fmt_time(value: Any) -> str:
    t = parse_time(value)
    if t is None:
        return "" if value is None else str(value)
    return t.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S") + "Z"


def fmt_duration(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, timedelta):
        s = value.total_seconds()
    elif isinstance(value, (int, float)):
        s = float(value)
    else:
        return str(value)
    sign = "-" if s < 0 else ""
    s = abs(s)
    if s < 1:
        return f"{sign}{s * 1000:.0f} ms"
    if s < 90:
        return f"{sign}{s:.1f} s"
    if s < 5400:
        return f"{sign}{s / 60:.0f} min"
    if s < 172800:
        return f"{sign}{s / 3600:.1f} h"
    return f"{sign}{s / 86400:.1f} d"


_INTERVAL = re.compile(r"^(?:(?P<years>-?\d+) years? ?)?(?:(?P<mons>-?\d+) mons? ?)?(?:(?P<days>-?\d+) days? ?)?"
                       r"(?:(?P<sign>-)?(?P<h>\d+):(?P<m>\d\d):(?P<s>\d\d(?:\.\d+)?))?$")


def fmt_interval(value: Any) -> str:
    """An interval as written, exactly: ``45 s``, ``1 h 30 min``, ``1 day``, ``2 mons`` (PostgreSQL's
    text, ``00:00:45``, or a timedelta); anything else as it is."""
    if value is None:
        return ""
    if isinstance(value, timedelta):
        value = f"{value.days} days {value.seconds // 3600:02d}:{value.seconds // 60 % 60:02d}:" \
                f"{value.seconds % 60 + value.microseconds / 1e6:09.6f}"
    m = _INTERVAL.match(str(value).strip())
    if m is None or not any(m.groupdict().values()):
        return str(value)
    seconds = float(m["s"] or 0)
    parts = [(m["years"], "year"), (m["mons"], "mon"), (m["days"], "day")]
    out = [f"{n} {unit}{'' if abs(int(n)) == 1 else 's'}" for n, unit in parts if n and int(n)]
    sign = "-" if m["sign"] else ""
    out += [f"{sign}{int(n)} {unit}" for n, unit in ((m["h"], "h"), (m["m"], "min")) if n and int(n)]
    if seconds:
        out.append(f"{sign}{seconds:g} s")
    return " ".join(out) or "0 s"


def fmt_relative(value: Any, now: datetime) -> str:
    t = parse_time(value)
    if t is None:
        return ""
    d = (t - now).total_seconds()
    return f"in {fmt_duration(d)}" if d >= 0 else f"{fmt_duration(-d)} ago"


def environment() -> jinja2.Environment:
    """The templates' environment: autoescaped, with the filters ``time``, ``dur``, ``interval``,
    ``mask_url`` and ``json`` (masked, indented, sorted)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
        autoescape=True, trim_blocks=True, lstrip_blocks=True, undefined=jinja2.ChainableUndefined)
    env.filters.update(time=fmt_time, dur=fmt_duration, interval=fmt_interval, mask_url=mask_url,
                       json=lambda v: json.dumps(mask_json(v), indent=2, sort_keys=True, default=str))
    return env
