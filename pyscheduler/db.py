"""One way Python calls SQL. (Over 600 lines: every crossing of the edge is here.)

``Database`` (a pool) and ``Session`` (one connection: held from the pool, or the application's
own in its transaction; ``AsyncSession`` for asyncio) call ``pyscheduler.<fn>(a => ..)`` with
named arguments, rows as dicts, errors translated in one place (``pyscheduler.errors``);
``HeldConnection`` holds one for a thread's stream of calls; ``UuidArray`` is a uuid[] argument
sent in binary. ``Listener``: LISTEN in a thread, reconnecting; ``Wakeup``: what a sleeper waits
on (a notification pokes it, polling with jitter is the fallback; ``poke_on``). ``load_json``:
how every connection loads json and jsonb (a value nested too deep: its deep part replaced)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import random
import re
import select
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import orjson
import psycopg
from psycopg import generators, pq, sql
from psycopg.abc import AdaptContext
from psycopg.adapt import Dumper, PyFormat, Transformer
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import Format
from psycopg.rows import AsyncRowFactory, RowFactory, dict_row, tuple_row
from psycopg.types.json import JsonBinaryLoader, JsonbBinaryLoader, JsonbLoader, JsonLoader, Jsonb
from psycopg.types.string import TextLoader
from psycopg_pool import ConnectionPool

from .errors import is_retryable, translate

log = logging.getLogger(__name__)

SCHEMA = "pyscheduler"
DAEMON_WAIT = 5.0  # s: the longest a daemon's call waits for a connection (Database.for_daemon)
_IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")
T = TypeVar("T")

__all__ = ["AsyncSession", "Database", "Session", "Jsonb", "Listener", "Wakeup", "Outage", "ConnectionSettings",
           "HeldConnection", "MAX_JSON_DEPTH", "TOO_DEEP", "TextArray", "Untyped", "UuidArray", "configure", "connect",
           "load_json", "poke_on", "translating"]


@dataclass(frozen=True)
class ConnectionSettings:
    """What every pyscheduler connection sets, unless its DSN says otherwise: a silent
    network partition fails a call within about a minute instead of hanging a node
    until TCP gives up (hours). Flags --db-* / PYSCHEDULER_DB_* (docs/operations.md)."""

    connect_timeout: int = 10  # s: give up connecting (libpq connect_timeout)
    keepalives_idle: int = 30  # s of silence before the first TCP keepalive probe
    keepalives_interval: int = 10  # s between probes
    keepalives_count: int = 3  # unanswered probes before the connection is dead
    tcp_user_timeout: int = 60_000  # ms a write may stay unacknowledged (Linux)
    statement_timeout: int = 60_000  # ms: the server cancels a longer statement (0: none)

    @classmethod
    def from_env(cls) -> "ConnectionSettings":
        values = {}
        for name in cls.__dataclass_fields__:
            raw = os.environ.get(f"PYSCHEDULER_DB_{name.upper()}")
            if raw:
                try:
                    values[name] = int(raw)
                except ValueError:
                    raise ValueError(f"PYSCHEDULER_DB_{name.upper()} must be an integer, got {raw!r}") from None
        return cls(**values)

    def kwargs(self, dsn: str) -> dict[str, Any]:
        """Connection parameters to add to ``dsn``: only those it does not set itself."""
        given = conninfo_to_dict(dsn)
        out: dict[str, Any] = {"connect_timeout": self.connect_timeout, "keepalives": 1,
                               "keepalives_idle": self.keepalives_idle,
                               "keepalives_interval": self.keepalives_interval,
                               "keepalives_count": self.keepalives_count, "tcp_user_timeout": self.tcp_user_timeout}
        return {k: v for k, v in out.items() if k not in given}

    def apply(self, conn: psycopg.Connection[Any]) -> None:
        """Pin what every pyscheduler connection relies on, in one round trip, whatever the
        role or the database sets: TimeZone UTC (times come back in UTC, and Python's
        arithmetic on them never meets a DST change), DateStyle ISO and IntervalStyle
        postgres (the only ones psycopg's loaders parse: another one made every value a
        DataError). Set the statement timeout too, unless the DSN, the role or the
        database already set one (a DBA's setting wins)."""
        timeout = int(self.statement_timeout)
        conn.execute(SESSION_PINS + (f", CASE WHEN current_setting('statement_timeout') = '0' "
                                     f"THEN set_config('statement_timeout', '{timeout}', false) END"
                                     if timeout else ""))


# The session settings every pyscheduler connection pins (ConnectionSettings.apply; design.md);
# SQL's one owner of them, sql/common.sql's _after_user_code(), pins the same (a test links them).
PINNED = {"TimeZone": "UTC", "DateStyle": "ISO, MDY", "IntervalStyle": "postgres"}
SESSION_PINS = "SELECT " + ", ".join(f"set_config('{name}', '{value}', false)" for name, value in PINNED.items())

_settings: ConnectionSettings | None = None


# -- loading JSON ---------------------------------------------------------------------------------

# The deepest nesting a reader loads: above what the SQL boundary lets in (with the levels the
# functions wrap a stored value in), below what every reader walks recursively (Python's
# recursion limit is 1,000 frames: json.loads, the dashboard's masking and pretty-printing).
MAX_JSON_DEPTH = 200
TOO_DEEP = f"(not loaded: JSON nested deeper than {MAX_JSON_DEPTH} levels)"
_TOO_DEEP_JSON = json.dumps(TOO_DEEP).encode()
_JSON_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')  # a string (skipped) or a bracket
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_ZERO_DIGITS = bytes.maketrans(b"123456789", b"000000000")
_LONG_NUMBER = b"0" * 19  # (or a digit run in a string: loaded the slow way too)


def _maybe_too_deep(raw: bytes) -> bool:
    """False when ``raw`` (JSON) is nested at most MAX_JSON_DEPTH deep; True when it may be
    deeper. Its brackets alone, each pass dropping the innermost pairs: C speed, no Python
    loop per bracket (brackets inside strings may answer True: _cut_deep then decides)."""
    brackets = raw.translate(None, _NOT_BRACKETS)
    for _ in range(MAX_JSON_DEPTH):
        shorter = brackets.replace(b"[]", b"").replace(b"{}", b"")
        if not shorter:
            return False
        if len(shorter) == len(brackets):
            return True
        brackets = shorter
    return True


def _cut_deep(raw: bytes) -> bytes:
    """``raw`` (JSON) with each array or object nested deeper than MAX_JSON_DEPTH replaced by
    the string TOO_DEEP."""
    parts: list[bytes] = []
    depth = start = last = 0
    for m in _JSON_TOKEN.finditer(raw):
        c = raw[m.start()]
        if c == 0x22:  # a string
            continue
        if c in b"[{":
            depth += 1
            if depth == MAX_JSON_DEPTH + 1:
                start = m.start()
        else:
            if depth == MAX_JSON_DEPTH + 1:
                parts += (raw[last:start], _TOO_DEEP_JSON)
                last = m.end()
            depth -= 1
    if not parts:
        return raw
    parts.append(raw[last:])
    return b"".join(parts)


def load_json(data: str | bytes) -> Any:
    """A json or jsonb value's text as Python: what json.loads gives (orjson where that is the
    same: orjson turns integers of 19 digits or more into floats), except that each array or
    object nested deeper than MAX_JSON_DEPTH is the string TOO_DEEP. The SQL boundary refuses
    such values; one stored before (or by hand) still loads, so the task, schedule or check
    that holds it is listed, shown and handled like the others instead of stopping its
    reader with a RecursionError."""
    raw = data.encode() if isinstance(data, str) else data
    # deeper than MAX_JSON_DEPTH takes more brackets than that: a shorter text is not counted
    if len(raw) > MAX_JSON_DEPTH and raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and _maybe_too_deep(raw):
        raw = _cut_deep(raw)
    if _LONG_NUMBER not in raw.translate(_ZERO_DIGITS):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return json.loads(raw)


_JSON_LOADERS = [(name, type(f"Bounded{base.__name__}", (base,), {"_loads": load_json}))
                 for name, base in (("json", JsonLoader), ("jsonb", JsonbLoader), ("json", JsonBinaryLoader),
                                    ("jsonb", JsonbBinaryLoader))]


def use_load_json(context: AdaptContext) -> None:
    """Load json and jsonb with ``load_json`` on ``context`` (a connection or a cursor)."""
    for name, loader in _JSON_LOADERS:
        context.adapters.register_loader(name, loader)


def _prepare(connection: ConnectionSettings, conn: psycopg.Connection[Any]) -> None:
    """What every pyscheduler connection gets: its settings pinned, JSON loaded by load_json."""
    use_load_json(conn)
    connection.apply(conn)


def configure(**changes: int) -> ConnectionSettings:
    """Change the connection settings of every Database, Listener and connect() made from now on
    (the CLI's --db-* flags call it); the start values come from PYSCHEDULER_DB_*."""
    global _settings
    _settings = dataclasses.replace(settings(), **changes)
    return _settings


def settings() -> ConnectionSettings:
    global _settings
    if _settings is None:
        _settings = ConnectionSettings.from_env()
    return _settings


class translating:
    """``with translating():`` re-raises psycopg errors (a pool's timeout too) as pyscheduler
    exceptions. A class, not a generator: every call of every client enters one."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if isinstance(exc, psycopg.Error):
            new = translate(exc)  # a PoolTimeout (an OperationalError without SQLSTATE): DatabaseUnavailable
            if new is not exc:
                raise new from exc


def connect(dsn: str, **kwargs: Any) -> psycopg.Connection:
    """One autocommit connection with dict rows, errors translated."""
    with translating():
        conn = psycopg.connect(dsn, autocommit=True, row_factory=dict_row, **{**settings().kwargs(dsn), **kwargs})
        _prepare(settings(), conn)
        return conn


class Untyped(str):
    """An argument sent as text of no declared type, which the server reads as the parameter's
    type: for a value no Python type holds (``Untyped("infinity")`` for a timestamptz)."""

    __slots__ = ()


class UuidArray:
    """A uuid[] parameter made from uuids in the database's text form (as the lease returns
    them), sent in binary: the array built in one go (~0.15 us a uuid, against ~2.5 us through
    uuid.UUID objects and ~7 us as a text array of strings). Other forms (no dashes, braces,
    UUID objects) take the slow, checked way."""

    __slots__ = ("data",)
    _OID = 2950  # uuid (pg_type)
    _HEADER = struct.Struct("!iiIii")  # ndim 1, no nulls, element type, length, lower bound 1

    def __init__(self, values: list[str]):
        try:
            joined, n = "".join(values), len(values)
        except TypeError:  # not all str
            joined, n = "", -1
        dashes = "-" * n
        if (len(joined) == 36 * n and set(map(len, values)) == {36} and joined.count("-") == 4 * n
                and joined[8::36] == joined[13::36] == joined[18::36] == joined[23::36] == dashes):
            # each value 36 characters with its 4 dashes where a uuid's are (fromhex checks the rest)
            text = ("00000010" + "00000010".join(values)).replace("-", "")
        else:
            text = "".join(f"00000010{uuid.UUID(str(v)).hex}" for v in values)
        self.data = self._HEADER.pack(1, 0, self._OID, len(values), 1) + bytes.fromhex(text) if values \
            else struct.pack("!iiI", 0, 0, self._OID)


class _UuidArrayDumper(Dumper):
    format = Format.BINARY
    oid = 2951  # uuid[] (pg_type)

    def dump(self, obj: UuidArray) -> bytes:
        return obj.data


psycopg.adapters.register_dumper(UuidArray, _UuidArrayDumper)


class TextArray(list[str | None]):
    """A text[] parameter (a list of str and None) sent as one array literal in text format: for
    items with no quote or backslash (keys usually), one join, ~0.02 us an item, against ~0.25
    us in binary, where each item's length goes before it, and ~0.43 us through psycopg's list
    dumper (a bulk submit's 1,000 unique keys: 0.25 ms of a 17 ms call in binary; issue 31).
    Its items must be what ``calls.texts`` lets through (str, no NUL, valid Unicode): they are
    not checked again. Where its dumper is not registered (a connection made before
    pyscheduler.db was imported) it is a list, dumped as psycopg dumps one."""

    __slots__ = ()


class _TextArrayDumper(Dumper):
    format = Format.TEXT
    oid = 1009  # text[] (pg_type)

    def dump(self, obj: TextArray) -> bytes:
        if None not in obj:
            keys = cast("list[str]", obj)
            whole = "".join(keys)
            if '"' not in whole and "\\" not in whole:
                return ('{"' + '","'.join(keys) + '"}').encode() if keys else b"{}"
        # quoted, each backslash and double quote escaped (array_in's rules), None as NULL
        return ("{" + ",".join("NULL" if v is None else '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
                               for v in obj) + "}").encode()


psycopg.adapters.register_dumper(TextArray, _TextArrayDumper)


def _function_call(function: str, args: dict[str, Any], binary: bool = False) -> bytes:
    # binary: every argument in binary format but None, which has no binary type and goes
    # as an untyped NULL the server resolves, Untyped text and a TextArray's literal
    if not binary:
        return _function_query(function, tuple(args))
    return _function_query(function, tuple(args), _formats(args))


def _formats(args: dict[str, Any]) -> str:
    return "".join("s" if v is None or isinstance(v, (Untyped, TextArray)) else "b" for v in args.values())


@functools.lru_cache(maxsize=1024)
def _function_query(function: str, names: tuple[str, ...], fmts: str = "") -> bytes:
    """The query text, built once per (function, parameter names, formats): composing
    it with psycopg.sql on every call cost ~40 us. Names are checked against _IDENT
    (lower-case ASCII), so double quotes are all the quoting they need. ``fmts`` holds
    a placeholder format per name ('s' or 'b'); empty: all 's'."""
    if not _IDENT.match(function):
        raise ValueError(f"not a pyscheduler function name: {function!r}")
    for name in names:
        if not _IDENT.match(name):
            raise ValueError(f"not a parameter name: {name!r}")
    params = ", ".join(f'"{name}" => %({name}){fmts[i] if fmts else "s"}' for i, name in enumerate(names))
    return f'SELECT * FROM "{SCHEMA}"."{function}"({params})'.encode()


@functools.lru_cache(maxsize=64)
def _column_query(function: str, names: tuple[str, ...], fmts: str, column: str) -> bytes:
    """``column`` of every row of ``function``'s call as one array, in the rows' order."""
    if not _IDENT.match(column):
        raise ValueError(f"not a column name: {column!r}")
    call = _function_query(function, names, fmts).decode().removeprefix("SELECT * FROM ")
    return f'SELECT array_agg(r."{column}" ORDER BY r.ordinality) FROM {call} WITH ORDINALITY AS r'.encode()


def _execute_column(conn: psycopg.Connection[Any], function: str, column: str, args: dict[str, Any],
                    pinned: bool = True) -> list[Any]:
    """``call_column`` on ``conn`` (binary)."""
    query = _column_query(function, tuple(args), _formats(args), column)
    with _cursor(conn, tuple_row, pinned) as cur:
        row = cur.execute(query, args, binary=True).fetchone()
    return (row[0] if row else None) or []


@functools.lru_cache(maxsize=64)
def _scalar_query(function: str, names: tuple[str, ...], fmts: str) -> bytes:
    """``SELECT pyscheduler.function(...)``: a scalar function's value, not a set's row (no
    FunctionScan storing it and reading it back: ~20 us of a single submit's server CPU)."""
    return _function_query(function, names, fmts).replace(b"SELECT * FROM ", b"SELECT ", 1)


@functools.lru_cache(maxsize=64)
def _numbered(query: bytes, names: tuple[str, ...], fmts: str) -> bytes:
    """``query`` with libpq's $n placeholders (_execute_pooled prepares it itself)."""
    text = query.decode()
    for i, (name, fmt) in enumerate(zip(names, fmts)):
        text = text.replace(f"%({name}){fmt}", f"${i + 1}", 1)
    return text.encode()


_PY_FORMATS = {"b": PyFormat.BINARY, "s": PyFormat.TEXT}


def _execute_pooled(conn: psycopg.Connection[Any], query: bytes, args: dict[str, Any], fmts: str) -> Any:
    """The first value of ``query``'s first row (None: no row), on one of the pool's own
    connections (autocommit, idle between calls), below psycopg's cursor: arguments dumped and
    the value loaded by the connection's own adapters (a Transformer kept on the connection),
    prepared once per connection and argument types, one round trip. psycopg's cursor spent ~35
    us a call more (a single submit through TaskClient: 476-497 -> 443-461 us p50; issue 31,
    docs/benchmarks.md). Errors are psycopg's (error_from_result), translated by the caller's
    connection(). ``call_column`` and ``call_scalar`` on a Database."""
    statement = _numbered(query, tuple(args), fmts)
    # (psycopg.adapt.Transformer, {(statement, parameter types): prepared statement's name})
    state: tuple[Any, dict[tuple[bytes, Any], bytes]] | None = conn.__dict__.get("_pys_lean")
    if state is None:
        state = conn.__dict__["_pys_lean"] = (Transformer.from_context(conn), {})
    tx, prepared = state
    params = tx.dump_sequence(list(args.values()), [_PY_FORMATS[f] for f in fmts])
    with conn.lock:
        try:
            res = _run_prepared(conn, prepared, statement, tx.types, params, tx.formats)
        except psycopg.errors.InvalidSqlStatementName:  # DEALLOCATE ALL or DISCARD ALL ran on it
            prepared.clear()
            res = _run_prepared(conn, prepared, statement, tx.types, params, tx.formats)
    tx.set_pgresult(res)
    row = tx.load_row(0, tuple) if res.ntuples else None
    return row[0] if row else None


def _run_prepared(conn: psycopg.Connection[Any], prepared: dict[tuple[bytes, Any], bytes], statement: bytes,
                  types: Any, params: Any, formats: Any) -> pq.abc.PGresult:
    """(Under conn.lock.) ``statement`` run with ``params``, prepared first if ``prepared`` (the
    connection's names by statement and parameter types) has no name for it."""
    key = (statement, types)
    name = prepared.get(key)
    if name is None:
        name = f"_pys_{len(prepared)}".encode()
        conn.pgconn.send_prepare(name, statement, param_types=types)
        _result(conn, pq.ExecStatus.COMMAND_OK)
        prepared[key] = name
    conn.pgconn.send_query_prepared(name, params, param_formats=formats, result_format=Format.BINARY)
    return _result(conn, pq.ExecStatus.TUPLES_OK)


def _result(conn: psycopg.Connection[Any], ok: pq.ExecStatus) -> pq.abc.PGresult:
    """(Under conn.lock.) The last result of what was sent on conn; its error raised as psycopg's."""
    res: pq.abc.PGresult = conn.wait(generators.execute(conn.pgconn))[-1]
    if res.status != ok:
        raise psycopg.errors.error_from_result(res, encoding=conn.info.encoding)
    return res


# A migration can change what a plan cached on a connection was made for: a table's columns
# (a function bound to its row type, in flight when the change commits: 42804) or a function's
# result columns (a prepared statement: 0A000, "cached plan must not change result type", on
# every later call, psycopg's own prepared statements too). The call failed whole (autocommit:
# nothing written), so on one of pyscheduler's own connections, idle after it, the call runs once
# more with the connection's prepared statements forgotten and the plans made again. A second
# failure is raised as it is (a bug, never retried again). docs/contributing.md, "Changing the
# schema".
_REPLANNED = (psycopg.errors.DatatypeMismatch, psycopg.errors.FeatureNotSupported)


def _replanned(conn: psycopg.Connection[Any], run: Callable[[], T]) -> T:
    """``run()``, a call on ``conn`` (autocommit, pyscheduler's), once more if a schema change
    made a plan cached on ``conn`` wrong (``_REPLANNED``)."""
    try:
        return run()
    except _REPLANNED:
        if not conn.autocommit or conn.pgconn.transaction_status != pq.TransactionStatus.IDLE:
            raise  # in a transaction: what ran before in it is gone, not ours to run again
        log.warning("a plan cached on a connection was made before a schema change: made again")
        conn.__dict__.pop("_pys_lean", None)
        conn.execute("DEALLOCATE ALL")  # psycopg forgets its prepared statements on seeing it
    return run()


def _execute_binary(conn: psycopg.Connection[Any] | psycopg.Cursor[Any], function: str,
                    args: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = conn.execute(_function_call(function, args, binary=True), args,
                                              binary=True).fetchall()
    return rows


def _cursor(conn: psycopg.Connection[Any], row_factory: RowFactory[Any], pinned: bool = False) -> psycopg.Cursor[Any]:
    """A cursor loading JSON with load_json on any connection (one of the application's too). A
    pinned connection (pyscheduler's own) loads it so already: its cursor shares its loaders (a
    copy of them cost ~15 us, a tenth of a single submit's client CPU)."""
    if pinned:
        return conn.cursor(row_factory=row_factory)
    cur = psycopg.Cursor(conn, row_factory=row_factory)
    use_load_json(cur)
    return cur


def _execute_tuples(conn: psycopg.Connection[Any], function: str, args: dict[str, Any],
                    as_text: tuple[str, ...], pinned: bool = True) -> list[tuple[Any, ...]]:
    """``call_tuples`` on ``conn``: binary, or text with the ``as_text`` types left unparsed."""
    with _cursor(conn, tuple_row, pinned and not as_text) as cur:
        if not as_text:
            return cur.execute(_function_call(function, args, binary=True), args, binary=True).fetchall()
        for name in as_text:
            cur.adapters.register_loader(name, TextLoader)  # this cursor only
        return cur.execute(_function_call(function, args), args).fetchall()


class _Calls:
    """call_one / call_value on top of a ``call`` (Database and Session)."""

    def call(self, function: str, /, **args: Any) -> list[dict[str, Any]]:
        raise NotImplementedError

    def call_one(self, function: str, /, **args: Any) -> dict[str, Any] | None:
        rows = self.call(function, **args)
        return rows[0] if rows else None

    def call_binary(self, function: str, /, **args: Any) -> list[dict[str, Any]]:
        """``call`` with parameters and results in PostgreSQL's binary format: for large
        array arguments (a 2,000-element batch costs ~2 us a message to send instead of
        ~17 us as text). Every argument needs a concrete type (no untyped None, no empty
        list): a None argument is sent as text, where the server infers its type."""
        raise NotImplementedError

    def call_tuples(self, function: str, /, *, as_text: tuple[str, ...] = (),
                    **args: Any) -> list[tuple[Any, ...]]:
        """``call_binary`` with each row a tuple in the function's column order: no dict per
        row, for large results in hot loops (the delay relay's claims). With ``as_text``
        (type names, e.g. ("uuid", "jsonb")) the call uses the text format instead and the
        columns of those types come as their text, unparsed, for a loop that parses only what
        it uses (the worker's lease: ~5 us a row less)."""
        raise NotImplementedError

    def call_column(self, function: str, column: str, /, **args: Any) -> list[Any]:
        """One column of every row the function returns, as a list in the rows' order, sent by
        the server as one array (binary): for many rows of which one column is read (a bulk
        submit's ids: a message and a Python row a task were ~10 % of its time)."""
        raise NotImplementedError

    def call_value(self, function: str, /, **args: Any) -> Any:
        """The single value a scalar function returns."""
        row = self.call_one(function, **args)
        return None if row is None else next(iter(row.values()))

    def call_scalar(self, function: str, /, **args: Any) -> Any:
        """``call_value`` as ``SELECT pyscheduler.function(...)`` in binary: for a scalar
        function on a hot path (a single submit's id), which the server then answers without
        storing a set's row and reading it back."""
        raise NotImplementedError


class Session(_Calls):
    """``call`` on one connection. Held from the pool (``Database.session()``): no pool
    checkout per call, for tight loops such as a worker's. Or the application's own
    (``Session.borrow(conn)``, ``pinned=False``): see ``borrow``."""

    def __init__(self, conn: psycopg.Connection[Any], *, pinned: bool = True):
        self.conn = conn
        self.pinned = pinned  # the connection has pyscheduler's settings (ConnectionSettings.apply)

    @classmethod
    def borrow(cls, target: psycopg.Connection[Any] | psycopg.Cursor[Any]) -> "Session":
        """Calls on the application's own connection (or a cursor's connection), in whatever
        transaction it has open: what they write exists only if the application commits it.
        Nothing is committed, rolled back or SET: on a connection that is not in autocommit,
        a call starts a transaction as any statement does, and one that fails leaves it
        failed, for the application to roll back. Whatever the connection's row factory,
        cursor factory, TimeZone, DateStyle or IntervalStyle, calls return dict rows loaded
        from PostgreSQL's binary format, which none of those settings change (datetimes
        come in the session's TimeZone)."""
        conn = target.connection if isinstance(target, psycopg.Cursor) else target
        if not isinstance(conn, psycopg.Connection):
            raise TypeError(f"expected a psycopg Connection or Cursor, got {type(target).__name__}")
        return cls(conn, pinned=False)

    def _cursor(self) -> psycopg.Cursor[dict[str, Any]]:
        """A cursor of our own on a borrowed connection: dict rows, server-side binding, load_json."""
        return _cursor(self.conn, dict_row)

    def call(self, function: str, /, **args: Any) -> list[dict[str, Any]]:
        with translating():
            if self.pinned:
                query, conn = _function_call(function, args), self.conn
                rows: list[dict[str, Any]] = _replanned(conn, lambda: conn.execute(query, args).fetchall())
                return rows
            with self._cursor() as cur:  # results in binary: the caller's settings do not matter
                return cur.execute(_function_call(function, args), args, binary=True).fetchall()

    def call_binary(self, function: str, /, **args: Any) -> list[dict[str, Any]]:
        with translating():
            if self.pinned:
                return _replanned(self.conn, lambda: _execute_binary(self.conn, function, args))
            with self._cursor() as cur:
                return _execute_binary(cur, function, args)

    def call_tuples(self, function: str, /, *, as_text: tuple[str, ...] = (),
                    **args: Any) -> list[tuple[Any, ...]]:
        if as_text and not self.pinned:  # text results would depend on the caller's DateStyle
            raise ValueError("as_text needs a connection with pyscheduler's settings (a pool connection)")
        with translating():
            if self.pinned:
                return _replanned(self.conn, lambda: _execute_tuples(self.conn, function, args, as_text))
            return _execute_tuples(self.conn, function, args, as_text, False)

    def call_column(self, function: str, column: str, /, **args: Any) -> list[Any]:
        with translating():
            if self.pinned:
                return _replanned(self.conn, lambda: _execute_column(self.conn, function, column, args))
            return _execute_column(self.conn, function, column, args, False)

    def call_scalar(self, function: str, /, **args: Any) -> Any:
        query = _scalar_query(function, tuple(args), _formats(args))

        def run() -> Any:
            with _cursor(self.conn, tuple_row, self.pinned) as cur:
                row = cur.execute(query, args, binary=True).fetchone()
            return row[0] if row else None
        with translating():
            return _replanned(self.conn, run) if self.pinned else run()


class AsyncSession:
    """``Session.borrow`` for asyncio: calls on the application's own ``AsyncConnection``
    (or an ``AsyncCursor``'s connection) in whatever transaction it has open, with the same
    guarantees (nothing committed, rolled back or SET; dict rows in binary format)."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]):
        self.conn = conn

    @classmethod
    def borrow(cls, target: psycopg.AsyncConnection[Any] | psycopg.AsyncCursor[Any]) -> "AsyncSession":
        conn = target.connection if isinstance(target, psycopg.AsyncCursor) else target
        if not isinstance(conn, psycopg.AsyncConnection):
            raise TypeError(f"expected a psycopg AsyncConnection or AsyncCursor, got {type(target).__name__}")
        return cls(conn)

    async def _execute(self, query: bytes, args: dict[str, Any],
                       row_factory: AsyncRowFactory[Any] = dict_row) -> list[Any]:
        with translating():
            async with psycopg.AsyncCursor(self.conn, row_factory=row_factory) as cur:
                use_load_json(cur)
                await cur.execute(query, args, binary=True)
                return await cur.fetchall()

    async def call(self, function: str, /, **args: Any) -> list[dict[str, Any]]:
        return await self._execute(_function_call(function, args), args)

    async def call_binary(self, function: str, /, **args: Any) -> list[dict[str, Any]]:
        return await self._execute(_function_call(function, args, binary=True), args)

    async def call_column(self, function: str, column: str, /, **args: Any) -> list[Any]:
        rows = await self._execute(_column_query(function, tuple(args), _formats(args), column), args, tuple_row)
        return (rows[0][0] if rows else None) or []

    async def call_scalar(self, function: str, /, **args: Any) -> Any:
        rows = await self._execute(_scalar_query(function, tuple(args), _formats(args)), args, tuple_row)
        return rows[0][0] if rows else None

    async def call_one(self, function: str, /, **args: Any) -> dict[str, Any] | None:
        rows = await self.call(function, **args)
        return rows[0] if rows else None

    async def call_value(self, function: str, /, **args: Any) -> Any:
        row = await self.call_one(function, **args)
        return None if row is None else next(iter(row.values()))


def _quiet(conn: psycopg.Connection[Any]) -> bool:
    """Whether nothing waits to be read on ``conn``'s socket (no message, no end of file)."""
    try:
        return not select.select([conn.fileno()], [], [], 0)[0]
    except (OSError, ValueError):
        return False


class Database(_Calls):
    """A pool of autocommit connections to one database."""

    def __init__(self, dsn: str, *, min_size: int = 1, max_size: int = 8, name: str = "pyscheduler",
                 timeout: float = 30.0, connection: ConnectionSettings | None = None, fresh: float = 0.0):
        self.dsn = dsn
        self.fresh = fresh
        self.pool: ConnectionPool[psycopg.Connection[dict[str, Any]]] = ConnectionPool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            open=False,
            name=name,
            timeout=timeout,
            # connect timeout, TCP keepalives, statement timeout (ConnectionSettings)
            kwargs={"autocommit": True, "row_factory": dict_row, **(connection or settings()).kwargs(dsn)},
            configure=functools.partial(_prepare, connection or settings()),
            check=self._check,
        )
        # id(conn) -> when it came back to the pool healthy (see _check)
        self._back: dict[int, float] = {}

    # Every checkout is checked, so a connection that died in the pool is
    # replaced before the caller sees it: a connection that came back healthy
    # and whose socket has nothing to read is handed out as it is (one the
    # server closed meanwhile, by a restart, pg_terminate_backend or an idle
    # timeout, has its goodbye or end of file waiting there), any other with
    # a round trip. A client's call is then one round trip (issue 31: a single
    # submit paid two). With ``fresh`` > 0 a connection back in the pool less
    # than ``fresh`` seconds ago, idle and not known broken, is handed out
    # without looking (the worker library). Only for callers that retry: a
    # connection that died meanwhile fails its first call with
    # DatabaseUnavailable. "Came back healthy" is stamped by connection() as
    # the caller leaves the connection idle, not by a reset hook: psycopg_pool
    # runs that in a worker thread, a thread switch on every call (issue 31).
    def _check(self, conn: psycopg.Connection[Any]) -> None:
        back = self._back.pop(id(conn), None)
        if conn.broken or conn.closed:
            raise psycopg.OperationalError("the connection is closed")
        if back is None or (time.monotonic() - back > self.fresh and not _quiet(conn)):
            ConnectionPool.check_connection(conn)

    @classmethod
    def for_daemon(cls, dsn: str, *, name: str, max_size: int, min_size: int = 1) -> "Database":
        """A daemon's pool, open at once whether the server answers or not: a database down when
        the daemon starts is an outage like one later (docs/operations.md, "Outages"), never a
        crash. Connections are made in the background; a call waits at most DAEMON_WAIT seconds
        for one, then raises DatabaseUnavailable, which the daemon retries with backoff (so a
        stop is seen within that time too)."""
        return cls(dsn, min_size=min_size, max_size=max_size, name=name, timeout=DAEMON_WAIT).open(wait=False)

    def open(self, wait: bool = True, timeout: float = 30.0) -> "Database":
        with translating():
            self.pool.open(wait=wait, timeout=timeout)
        return self

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> "Database":
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connection(self) -> "_Checkout":
        """A pool connection, as a context manager: autocommit, dict rows, pyscheduler's settings."""
        return _Checkout(self)

    def call(self, function: str, /, **args: Any) -> list[dict[str, Any]]:
        """``SELECT * FROM pyscheduler.function(name => value, ...)``; rows as dicts."""
        query = _function_call(function, args)
        with self.connection() as conn:
            return _replanned(conn, lambda: conn.execute(query, args).fetchall())

    def call_binary(self, function: str, /, **args: Any) -> list[dict[str, Any]]:
        with self.connection() as conn:
            return _replanned(conn, lambda: _execute_binary(conn, function, args))

    def call_tuples(self, function: str, /, *, as_text: tuple[str, ...] = (),
                    **args: Any) -> list[tuple[Any, ...]]:
        with self.connection() as conn:
            return _replanned(conn, lambda: _execute_tuples(conn, function, args, as_text))

    def call_column(self, function: str, column: str, /, **args: Any) -> list[Any]:
        fmts = _formats(args)
        query = _column_query(function, tuple(args), fmts, column)
        with self.connection() as conn:
            return _replanned(conn, lambda: _execute_pooled(conn, query, args, fmts)) or []

    def call_scalar(self, function: str, /, **args: Any) -> Any:
        fmts = _formats(args)
        query = _scalar_query(function, tuple(args), fmts)
        with self.connection() as conn:
            return _replanned(conn, lambda: _execute_pooled(conn, query, args, fmts))

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        """Hold one connection for many calls: ``with db.session() as s: s.call(...)``."""
        with self.connection() as conn:
            yield Session(conn)

    def query(self, query: str | sql.SQL | sql.Composed, params: Any = None) -> list[dict[str, Any]]:
        """A read-only query on views (admin and tests); functions go through call()."""
        with self.connection() as conn:
            return _replanned(conn, lambda: conn.execute(query, params).fetchall())


class _Checkout:
    """``Database.connection()``: the pool's ``connection()`` (``getconn``; on leaving, the
    connection's own exit, which commits or rolls back, then ``putconn``) and ``translating()``,
    in one class. Left idle, the connection is stamped as back healthy (``Database._check``);
    then its exit, which has nothing to commit on an idle autocommit connection, is skipped.
    The three generator context managers this replaces cost ~18 us of a single submit's
    ~440 (issue 31, docs/benchmarks.md)."""

    __slots__ = ("db", "conn")

    def __init__(self, db: Database):
        self.db = db

    def __enter__(self) -> psycopg.Connection[dict[str, Any]]:
        with translating():
            self.conn: psycopg.Connection[dict[str, Any]] = self.db.pool.getconn()
        return self.conn

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        conn, db = self.conn, self.db
        with translating():
            try:
                if conn.pgconn.transaction_status == pq.TransactionStatus.IDLE:
                    db._back[id(conn)] = time.monotonic()
                else:
                    conn.__exit__(typ, exc, tb)
            finally:
                db.pool.putconn(conn)
        translating().__exit__(typ, exc, tb)


class HeldConnection:
    """One pool connection held for a thread's stream of calls (a worker's lease loop, its
    recorder): no pool checkout per call. After an outage it is given back (the pool drops it
    if it is broken) and the next call takes another. ``setup``/``teardown``: SQL run on taking
    it and before giving it back (session settings must not leak into the pool)."""

    def __init__(self, db: Database, setup: str | None = None, teardown: str | None = None):
        self.db, self.setup, self.teardown = db, setup, teardown
        self._stack: contextlib.ExitStack | None = None
        self._session: Session | None = None

    def call(self, function: str, /, **args: Any) -> list[dict[str, Any]]:
        return self._call("call", function, args)

    def call_binary(self, function: str, /, **args: Any) -> list[dict[str, Any]]:
        return self._call("call_binary", function, args)

    def call_tuples(self, function: str, /, **args: Any) -> list[tuple[Any, ...]]:
        return self._call("call_tuples", function, args)

    def _call(self, method: str, function: str, args: dict[str, Any]) -> list[Any]:
        """``Session.<method>(function, **args)`` on the held connection."""
        if self._session is None:
            stack = contextlib.ExitStack()
            session = stack.enter_context(self.db.session())
            self._stack, self._session = stack, session
            if self.setup:
                try:
                    with translating():
                        session.conn.execute(self.setup)
                except BaseException:
                    self.close()
                    raise
        try:
            rows: list[Any] = getattr(self._session, method)(function, **args)
            return rows
        except Exception as exc:
            if is_retryable(exc):
                self.close()
            raise

    def close(self) -> None:
        session, stack = self._session, self._stack
        self._session = self._stack = None
        if session is None or stack is None:
            return
        with contextlib.suppress(Exception):
            if self.teardown and not session.conn.closed and not session.conn.broken:
                session.conn.execute(self.teardown)
        with contextlib.suppress(Exception):
            stack.close()


class Wakeup:
    """Sleep until poked or until the poll interval (plus jitter) has passed."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def poke(self, *_: object) -> None:
        if not self._event.is_set():  # already poked: Event.set would take a lock for nothing
            self._event.set()

    def wait(self, seconds: float, jitter: float = 0.2) -> bool:
        """Wait ``seconds`` * (1 + random()*jitter); True when poked."""
        poked = self._event.wait(max(0.0, seconds * (1.0 + random.random() * jitter)))
        self._event.clear()
        return poked


def poke_on(event: threading.Event, *pokes: Callable[[], object]) -> None:
    """Call each of ``pokes`` (``Wakeup.poke``, ``Event.set``, ...) once ``event`` is set, from a
    thread of its own: so sleepers on other events notice at once."""

    def wait() -> None:
        event.wait()
        for poke in pokes:
            poke()

    threading.Thread(target=wait, name="poke-on-stop", daemon=True).start()


class Outage:
    """Logs an outage once when it starts and once when it ends; gives the backoff."""

    def __init__(self, what: str, logger: logging.Logger = log, first: float = 0.1, cap: float = 5.0):
        self.what, self.log, self.first, self.cap = what, logger, first, cap
        self.down_since: float | None = None
        self.delay = first

    def failed(self, exc: BaseException) -> float:
        """Record a failure; return how long to wait before the next try."""
        if self.down_since is None:
            self.down_since = time.monotonic()
            self.log.warning("%s unavailable, retrying with backoff: %s", self.what, _one_line(exc))
            self.delay = self.first
        else:
            self.delay = min(self.cap, self.delay * 2)
        return self.delay * (0.5 + random.random() / 2)

    def ok(self) -> None:
        if self.down_since is not None:
            self.log.warning("%s back after %.1fs", self.what, time.monotonic() - self.down_since)
            self.down_since = None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class Listener:
    """LISTEN on channels in a thread; hand (channel, payload) to a callback.

    The connection is dedicated (notifications need a session that stays
    open); it reconnects with backoff after an outage (one at start too) and
    then calls ``on_reconnect`` so sleepers can poll once for anything they
    missed. ``ready`` is set once it listens, ``tried`` after its first try
    (answered or not). ``stop()`` wakes its wait at once (a socket pair).
    """

    def __init__(self, dsn: str, channels: Iterable[str], callback: Callable[[str, str], None],
                 *, on_reconnect: Callable[[], None] | None = None, logger: logging.Logger = log,
                 connection: ConnectionSettings | None = None):
        self.dsn = dsn
        self.connection = connection or settings()
        self.channels = list(channels)
        self.callback = callback
        self.on_reconnect = on_reconnect
        self.log = logger
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"listen:{','.join(self.channels)}",
                                        daemon=True)
        self.ready = threading.Event()
        self.tried = threading.Event()
        self._wake_lock = threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()

    def start(self) -> "Listener":
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        with self._wake_lock:
            if self._wake_w.fileno() >= 0:  # not closed by the thread's end
                self._wake_w.send(b"x")
        self._thread.join(timeout)

    def _deliver(self, channel: str, payload: str) -> None:
        """Hand one notification to the callback. Any role that may LISTEN may also NOTIFY
        these channels with any payload: a callback that raises on one is logged and the
        listener goes on (it used to end the thread, leaving only the polling fallback)."""
        try:
            self.callback(channel, payload)
        except Exception:  # noqa: BLE001 - any payload may come: logged, the listener goes on
            self.log.exception("notification on %s with payload %r not handled", channel, payload[:100])

    def _run(self) -> None:
        outage = Outage(f"LISTEN {','.join(self.channels)}", self.log)
        failed = False
        try:
            while not self._stop.is_set():
                try:
                    with psycopg.connect(self.dsn, autocommit=True, **self.connection.kwargs(self.dsn)) as conn:
                        for channel in self.channels:
                            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                        outage.ok()
                        self.ready.set()
                        self.tried.set()
                        if failed and self.on_reconnect:
                            self.on_reconnect()
                        failed = False
                        while not self._stop.is_set():
                            for note in conn.notifies(timeout=0):  # what arrived (or was kept by an execute)
                                self._deliver(note.channel, note.payload)
                            select.select([conn.fileno(), self._wake_r.fileno()], [], [], 0.5)
                except psycopg.Error as exc:
                    failed = True
                    self.tried.set()
                    self._stop.wait(outage.failed(exc))
        finally:
            with self._wake_lock:
                self._wake_r.close()
                self._wake_w.close()
