"""What the typed clients share (``TaskClient``, ``ScheduleClient``, ``CheckClient``).

A client method is a *call*: a function that checks its arguments in Python (an
``InvalidArgument`` naming the field, before any round trip) and returns a :class:`Call`;
``sync(op)`` and ``asynchronous(op)`` make it a method of a sync and of an async client. Every
call goes through ``pyscheduler.db`` (``call_binary``), on pyscheduler's pool or on the
application's connection or cursor, in its transaction; results are converted here whatever
the session's TimeZone, DateStyle or IntervalStyle (instants aware in UTC, intervals
timedeltas), and the argument checks and converters below are the ones every client uses.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import re
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, fields, is_dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar
from uuid import UUID

import orjson
import psycopg

from .db import MAX_JSON_DEPTH, AsyncSession, Database, Jsonb, Session
from .errors import InvalidArgument

__all__ = ["AsyncClient", "AsyncConnectable", "Call", "Connectable", "SyncClient", "asynchronous", "sync"]

T = TypeVar("T")
P = ParamSpec("P")
Rows = list[dict[str, Any]]

UTC = timezone.utc
# the instants every pyscheduler function accepts and every client library loads (design.md)
MIN_INSTANT = datetime(1970, 1, 1, tzinfo=UTC)
MAX_INSTANT = datetime(9999, 1, 1, tzinfo=UTC)
INT32 = 2**31 - 1
INT64 = 2**63 - 1

# What a sync client runs on: pyscheduler's pool, a session, or the application's connection or cursor.
Connectable = Database | Session | psycopg.Connection[Any] | psycopg.Cursor[Any]
# What an async client runs on: the application's async connection or cursor.
AsyncConnectable = AsyncSession | psycopg.AsyncConnection[Any] | psycopg.AsyncCursor[Any]


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One SQL function call: ``pyscheduler.<function>(name => value, ...)`` and its result. A
    capability writes each client method once, as a call (``sql``: its ``sqlapi``)::

        def _get(rn: str | UUID) -> Call[Task]:
            \"\"\"The task; TaskNotFound (PS200) when there is none.\"\"\"
            return Call(sql.GET_TASK, {"rn": task_id(rn)}, Task.from_json, scalar=True)

        class TaskClient(SyncClient):
            get = sync(_get)
    """

    function: str
    args: dict[str, Any]
    result: Callable[[Any], T]  # the rows (dicts), or the column's values with ``column``
    # the result gets this column of every row as one list (call_column), not the rows: for
    # many rows of which one column is read (submit_ids)
    column: str | None = None
    # the result gets the value of a function of one value (call_scalar: ``SELECT f(...)``, below
    # psycopg's cursor), not the rows: a task, a schedule, a count
    scalar: bool = False


class SyncClient:
    """A client on pyscheduler's pool (``Database``), a ``Session``, or the application's own
    psycopg ``Connection`` or ``Cursor``: then every call runs in the application's
    transaction (what it writes exists only if the application commits) and nothing is
    committed, rolled back or SET (``Session.borrow``)."""

    def __init__(self, db: Connectable) -> None:
        self.db: Database | Session = db if isinstance(db, (Database, Session)) else Session.borrow(db)

    def _run(self, call: Call[T]) -> T:
        if call.column:
            return call.result(self.db.call_column(call.function, call.column, **call.args))
        if call.scalar:
            return call.result(self.db.call_scalar(call.function, **call.args))
        return call.result(self.db.call_binary(call.function, **call.args))


class AsyncClient:
    """A client on the application's psycopg ``AsyncConnection`` or ``AsyncCursor``, in its
    transaction, as ``SyncClient`` on a connection (``AsyncSession.borrow``)."""

    def __init__(self, conn: AsyncConnectable) -> None:
        self.db: AsyncSession = conn if isinstance(conn, AsyncSession) else AsyncSession.borrow(conn)

    async def _run(self, call: Call[T]) -> T:
        if call.column:
            return call.result(await self.db.call_column(call.function, call.column, **call.args))
        if call.scalar:
            return call.result(await self.db.call_scalar(call.function, **call.args))
        return call.result(await self.db.call_binary(call.function, **call.args))


def _method(op: Callable[..., Any], method: Callable[..., Any]) -> None:
    """Name, document and sign ``method`` as ``op``, with ``self`` first and, as its return,
    what the ``Call`` returned by ``op`` gives (help() and IDEs show the method, not the call)."""
    functools.update_wrapper(method, op)
    del method.__wrapped__  # type: ignore[attr-defined]
    method.__name__ = method.__qualname__ = op.__name__.lstrip("_")
    sig = inspect.signature(op)
    returns = str(sig.return_annotation)  # "Call[Task]" (annotations are strings here)
    self = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
    method.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=[self, *sig.parameters.values()],
        return_annotation=returns[len("Call["):-1] if returns.startswith("Call[") else returns)


def sync(op: Callable[P, Call[T]]) -> Callable[Concatenate[SyncClient, P], T]:
    """The call ``op`` as a method of a sync client."""

    def method(self: SyncClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._run(op(*args, **kwargs))

    _method(op, method)
    return method


def asynchronous(op: Callable[P, Call[T]]) -> Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, T]]:
    """The call ``op`` as a coroutine method of an async client."""

    async def method(self: AsyncClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._run(op(*args, **kwargs))

    _method(op, method)
    return method


# -- results --------------------------------------------------------------------------------------

def one(convert: Callable[[dict[str, Any]], T]) -> Callable[[Rows], T]:
    """The single row a function returns, converted."""

    def result(rows: Rows) -> T:
        return convert(rows[0])

    return result


def each(convert: Callable[[Any], T], column: str | None = None) -> Callable[[Rows], list[T]]:
    """Every row (or one column of it), converted."""

    def result(rows: Rows) -> list[T]:
        return [convert(row if column is None else row[column]) for row in rows]

    return result


def instant(raw: Any) -> datetime | None:
    """A datetime in UTC from a timestamptz (any session TimeZone) or its JSON text (ISO 8601
    with an offset, or ``Z``); None stays None."""
    if raw is None:
        return None
    at = raw if isinstance(raw, datetime) else datetime.fromisoformat(raw)
    return at.astimezone(UTC)


def required_instant(raw: Any) -> datetime:
    at = instant(raw)
    if at is None:
        raise ValueError("missing instant")
    return at


# An interval as PostgreSQL writes it in any IntervalStyle (postgres, postgres_verbose,
# sql_standard, iso_8601), e.g. '1 day 02:00:00', '@ 1 day 2 hours ago', '1 2:00:00', 'P1DT2H'.
_ISO = re.compile(r"P(?:(?P<Y>[-+]?\d+)Y)?(?:(?P<M>[-+]?\d+)M)?(?:(?P<W>[-+]?\d+)W)?(?:(?P<D>[-+]?\d+)D)?"
                  r"(?:T(?:(?P<h>[-+]?\d+)H)?(?:(?P<m>[-+]?\d+)M)?(?:(?P<s>[-+]?\d+(?:\.\d+)?)S)?)?")
_UNIT = re.compile(r"([-+]?\d+(?:\.\d+)?)\s*(years?|mons?|days?|hours?|mins?|secs?)")
_TIME = re.compile(r"([-+]?)(\d+):(\d+):(\d+(?:\.\d+)?)")
_YEAR_MONTH = re.compile(r"([-+]?)(\d+)-(\d+)")
_DAYS = {"year": 365, "mon": 30, "day": 1}  # as psycopg loads intervals: a month is 30 days
_SECONDS = {"hour": 3600, "min": 60, "sec": 1}


def interval(raw: Any) -> timedelta | None:
    """A timedelta from an interval (binary) or its text in any IntervalStyle; None stays None.
    Months count 30 days and years 365, as psycopg loads them."""
    if raw is None or isinstance(raw, timedelta):
        return raw
    text = str(raw).strip()
    if text.startswith("P"):  # iso_8601: each field carries its own sign
        m = _ISO.fullmatch(text)
        if not m:
            raise ValueError(f"not an interval: {text!r}")
        g = {k: float(v) if v else 0.0 for k, v in m.groupdict().items()}
        return timedelta(days=g["Y"] * 365 + g["M"] * 30 + g["W"] * 7 + g["D"], hours=g["h"], minutes=g["m"],
                         seconds=g["s"])
    if text.startswith("@") or _UNIT.search(text):  # postgres_verbose, postgres: each field its own sign
        ago = text.endswith(" ago")
        body = text.removeprefix("@").removesuffix(" ago")
        total = timedelta()
        for number, unit in _UNIT.findall(body):
            unit = unit.rstrip("s")
            amount = float(number)
            total += (timedelta(days=amount * _DAYS[unit]) if unit in _DAYS
                      else timedelta(seconds=amount * _SECONDS[unit]))
        rest = _UNIT.sub("", body)
        for sign, h, mi, s in _TIME.findall(rest):
            part = timedelta(hours=int(h), minutes=int(mi), seconds=float(s))
            total += -part if sign == "-" else part
        if _TIME.sub("", rest).strip() not in ("", "0"):
            raise ValueError(f"not an interval: {text!r}")
        return -total if ago else total
    # sql_standard (and a bare time, the same in every style): [Y-M] [D] [H:M:S]; a leading
    # sign applies to every field, unless another field carries its own
    tokens = text.split()
    own_signs = any(t[0] in "+-" for t in tokens[1:])
    total = timedelta()
    for i, token in enumerate(tokens):
        sign = -1 if (tokens[i if own_signs else 0]).startswith("-") else 1
        if (ym := _YEAR_MONTH.fullmatch(token)) is not None:
            total += sign * timedelta(days=int(ym[2]) * 365 + int(ym[3]) * 30)
        elif (tm := _TIME.fullmatch(token)) is not None:
            total += sign * timedelta(hours=int(tm[2]), minutes=int(tm[3]), seconds=float(tm[4]))
        elif re.fullmatch(r"[-+]?\d+", token):
            total += sign * timedelta(days=abs(int(token)))
        else:
            raise ValueError(f"not an interval: {text!r}")
    return total


def required_interval(raw: Any) -> timedelta:
    iv = interval(raw)
    if iv is None:
        raise ValueError("missing interval")
    return iv


def uuid_or_none(raw: Any) -> UUID | None:
    return None if raw is None else raw if isinstance(raw, UUID) else UUID(str(raw))


# -- arguments ------------------------------------------------------------------------------------

def text(name: str, raw: Any, *, optional: bool = False) -> Any:
    """A str PostgreSQL can store (no NUL, valid Unicode), else InvalidArgument naming ``name``."""
    if raw is None and optional:
        return None
    if not isinstance(raw, str):
        raise InvalidArgument(f"{name} must be a str, got {type(raw).__name__}")
    if "\x00" in raw:
        raise InvalidArgument(f"{name} contains a NUL character (\\u0000), which PostgreSQL cannot store")
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(f"{name} is not valid Unicode (a lone surrogate)") from None
    return raw


def texts(name: str, raw: Iterable[Any]) -> list[Any]:
    """``text`` of each item, None allowed (a refusal names ``name[i]``): one pass that builds
    no names while the items are fine (a batch's keys: a name each cost ~0.3 us a key)."""
    items = list(raw)
    try:  # every one a str or None, the strs ASCII without NUL: in one go (~0.04 us a key)
        whole = "".join([k for k in items if k is not None])  # TypeError: not a str
        if whole.isascii() and "\x00" not in whole:
            return items
    except TypeError:
        pass
    return [text(f"{name}[{i}]", k, optional=True) for i, k in enumerate(items)]


# sql/common.sql's _label_refusal (the rule of every name and label a public function takes), for
# a label Python must judge before it reaches SQL: the relay dead-letters a message whose id the
# database would refuse, alone, instead of having its batch refused. NUL too: PostgreSQL cannot
# store it at all. tests/shared/test_input_rule.py checks both agree.
_LABEL_SPACE = " \t\n\r\x0b\x0c\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000"  # \s as PostgreSQL's, and these
_LABEL_EDGE = re.compile(f"^[{_LABEL_SPACE}]|[{_LABEL_SPACE}]\\Z")
_LABEL_HIDDEN = re.compile("[\u0000-\u001f\u007f-\u009f\u00ad\u061c\u115f\u1160\u180e\u200b-\u200f\u2028-\u202e"
                           "\u2060-\u206f\u3164\ufeff\ufff9-\ufffb]")


def label_refusal(value: str, max_bytes: int) -> str | None:
    """Why ``value`` is not a name or label of at most ``max_bytes`` UTF-8 bytes; None when it is."""
    if value.isascii() and value.isprintable() and 0 < len(value) <= max_bytes and value[0] != " " != value[-1]:
        return None  # the usual label, at once: printable ASCII, not padded
    if not value:
        return "must not be empty"
    if len(value.encode("utf-8", "surrogatepass")) > max_bytes:
        return f"must be at most {max_bytes} bytes"
    if _LABEL_EDGE.search(value):
        return "must not start or end with white space"
    if _LABEL_HIDDEN.search(value):
        return "must not contain control, zero-width or bidirectional formatting characters"
    return None


def integer(name: str, raw: Any, lo: int, hi: int, *, optional: bool = False) -> Any:
    """An int in lo..hi (not a bool), else InvalidArgument naming ``name``."""
    if raw is None and optional:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or not lo <= raw <= hi:
        raise InvalidArgument(f"{name} must be an integer in {lo}..{hi}, got {raw!r}")
    return raw


def boolean(name: str, raw: Any, *, optional: bool = False) -> Any:
    if raw is None and optional:
        return None
    if not isinstance(raw, bool):
        raise InvalidArgument(f"{name} must be a bool, got {raw!r}")
    return raw


def duration(name: str, raw: Any, *, optional: bool = False) -> Any:
    """A timedelta, else InvalidArgument naming ``name`` (its bounds are the SQL function's)."""
    if raw is None and optional:
        return None
    if not isinstance(raw, timedelta):
        raise InvalidArgument(f"{name} must be a datetime.timedelta, got {type(raw).__name__}")
    return raw


def aware(name: str, raw: Any, *, optional: bool = False) -> Any:
    """A timezone-aware datetime in [1970-01-01Z, 9999-01-01Z), else InvalidArgument naming
    ``name``. A naive datetime is refused rather than guessed: Python's ``datetime.now()`` is
    local time, and PostgreSQL would read it in the session's TimeZone."""
    if raw is None and optional:
        return None
    if not isinstance(raw, datetime):
        raise InvalidArgument(f"{name} must be a datetime.datetime, got {type(raw).__name__}")
    if raw.utcoffset() is None:
        raise InvalidArgument(f"{name} must be timezone-aware (e.g. datetime.now(timezone.utc)), got {raw!r}")
    try:
        in_range = MIN_INSTANT <= raw < MAX_INSTANT
    except OverflowError:
        in_range = False
    if not in_range:
        raise InvalidArgument(f"{name} must be in [1970-01-01T00:00:00Z, 9999-01-01T00:00:00Z), got {raw!r}")
    return raw


def choice(name: str, raw: Any, options: tuple[str, ...], *, optional: bool = False) -> Any:
    if raw is None and optional:
        return None
    if raw not in options:
        raise InvalidArgument(f"{name} must be one of {', '.join(options)}, got {raw!r}")
    return raw


def json_problem(value: Any, path: str, depth: int = 0) -> str | None:
    """Why ``value`` (at ``path``) cannot be stored as jsonb, or None: NaN and infinities
    (JSON has no such numbers), NUL characters (jsonb cannot hold U+0000), unencodable
    surrogates, non-string keys, nesting deeper than the readers load (MAX_JSON_DEPTH), and
    anything json.dumps cannot write."""
    if depth > MAX_JSON_DEPTH:
        return f"{path} is nested deeper than {MAX_JSON_DEPTH} levels"
    if value is None or isinstance(value, (bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path} is {value!r}: JSON has no NaN or infinity"
    if isinstance(value, str):
        if "\x00" in value:
            return f"{path} contains a NUL character (\\u0000), which PostgreSQL cannot store"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return f"{path} is not valid Unicode (a lone surrogate)"
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path} has a key that is not a string: {key!r}"
            why = json_problem(key, f"{path} key {key!r}", depth + 1) or json_problem(item, f"{path}[{key!r}]",
                                                                                        depth + 1)
            if why:
                return why
        return None
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            why = json_problem(item, f"{path}[{i}]", depth + 1)
            if why:
                return why
        return None
    return f"{path} is a {type(value).__name__}, which is not JSON"


def json_value(name: str, raw: Any) -> Jsonb:
    """Any JSON value as jsonb, else InvalidArgument naming ``name`` and the bad field inside it."""
    why = json_problem(raw, name)
    if why:
        raise InvalidArgument(f"{name} is not storable JSON: {why}")
    try:
        json.dumps(raw, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidArgument(f"{name} is not JSON-serialisable: {exc}") from exc
    return Jsonb(raw)


def json_object(name: str, raw: Any) -> Jsonb:
    """A JSON object (a Mapping) as jsonb, else InvalidArgument naming ``name``."""
    if not isinstance(raw, Mapping):
        raise InvalidArgument(f"{name} must be a JSON object (a dict), got {type(raw).__name__}")
    return json_value(name, dict(raw))


def _json_fine(value: Any, depth: int = 0) -> bool:
    """Whether json_problem finds nothing in ``value``, without building the paths it names (a
    batch's fast path): plain dicts, lists and scalars here, anything else by json_problem."""
    kind = type(value)
    if kind is str:
        return "\x00" not in value and (value.isascii() or json_problem(value, "") is None)
    if value is None or kind is bool or kind is int:
        return True
    if kind is float:
        return math.isfinite(value)
    if depth >= MAX_JSON_DEPTH:
        return json_problem(value, "", depth) is None
    if kind is dict:  # its scalars checked here, without a call each (a batch's specs are mostly flat)
        for k, v in value.items():
            if type(k) is not str or "\x00" in k or not (k.isascii() or json_problem(k, "") is None):
                return False
            t = type(v)
            if t is str:
                if "\x00" in v or not (v.isascii() or json_problem(v, "") is None):
                    return False
            elif t is float:
                if not math.isfinite(v):
                    return False
            elif not (v is None or t is bool or t is int) and not _json_fine(v, depth + 1):
                return False
        return True
    if kind is list:
        return all(_json_fine(v, depth + 1) for v in value)
    return json_problem(value, "", depth) is None


def _dumps(fine: Any) -> bytes | str | None:
    """``json.dumps(fine, allow_nan=False)`` of a value ``_json_fine`` accepted, or None when it
    refuses: orjson's text (~15x faster: ~1 us a spec of a bulk submit, issue 31) when it is
    ASCII, which every client encoding reads alike; else json.dumps, which writes escapes."""
    try:
        text = orjson.dumps(fine)
    except TypeError:  # orjson.JSONEncodeError: an integer past 64 bits, a float subclass, ...
        pass
    else:
        if text.isascii():
            return text
    try:
        return json.dumps(fine, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return None


def only_object(objects: Jsonb) -> Jsonb:
    """The one object of a ``json_objects`` answer as jsonb of its own, serialised as it
    serialises them (orjson, ~0.2 us, where psycopg's json.dumps took ~4): a single submit's."""
    one = objects.obj[0]
    text = _dumps(one)
    if text is None:  # not after json_objects, which serialised the list it is in
        raise InvalidArgument("spec is not storable JSON")
    return Jsonb(one, dumps=lambda _: text)


def plain_object(raw: Any) -> Jsonb | None:
    """``raw`` as jsonb serialised once (orjson) when it is a dict ``json_object`` would take as it
    is; None for anything else, which the caller then checks the slow way (naming the refusal):
    a single submit's spec in ~2 us, where json_objects and only_object took ~8."""
    if type(raw) is not dict or not _json_fine(raw):
        return None
    text = _dumps(raw)
    return None if text is None else Jsonb(raw, dumps=lambda _: text)


def json_objects(name: str, raw: Iterable[Any]) -> Jsonb:
    """JSON objects (Mappings) as one jsonb array, each checked as json_object checks it (a
    refusal names ``name[i]``): one pass that builds no paths, and one serialisation (sent as
    is), when all of them are fine."""
    objects = [o if type(o) is dict else dict(o) if isinstance(o, Mapping) else o for o in raw]
    if all(type(o) is dict and _json_fine(o) for o in objects):
        text = _dumps(objects)
        if text is not None:
            return Jsonb(objects, dumps=lambda _: text)
    for i, o in enumerate(objects):
        json_object(f"{name}[{i}]", o)
    raise InvalidArgument(f"{name} is not storable JSON")  # json.dumps refused the list, not one of them


# -- output ---------------------------------------------------------------------------------------

def duration_text(td: timedelta) -> str:
    """A duration as the CLI takes it: 30s, 5m, 2h, 7d, 200ms (the largest exact unit)."""
    micros = (td.days * 86_400 + td.seconds) * 1_000_000 + td.microseconds
    for unit, size in (("d", 86_400_000_000), ("h", 3_600_000_000), ("m", 60_000_000), ("s", 1_000_000),
                       ("ms", 1_000)):
        if micros % size == 0:
            return f"{micros // size}{unit}"
    return f"{micros / 1_000_000:f}".rstrip("0") + "s"


def jsonable(obj: Any) -> Any:
    """A typed result as plain JSON values (the CLI prints them): dataclasses as objects,
    datetimes in ISO 8601, timedeltas as durations (30s, 5m), UUIDs as text."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: jsonable(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, datetime):
        return obj.isoformat()
    if isinstance(obj, timedelta):
        return duration_text(obj)
    if isinstance(obj, UUID):
        return str(obj)
    if isinstance(obj, Mapping):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    return obj
