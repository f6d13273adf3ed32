"""The edge between Python and SQL: what Python asks of the schema, declared in one place.

Each capability's ``sqlapi.py`` (``tasks``, ``delay``, ``schedules``, ``checks``) and this
module (what they share) declare every SQL function, view and statement Python uses: a
:class:`Fn` (a public function, the arguments Python passes, the columns it reads), a
:class:`View` (its columns) or a :class:`Query` (a named statement, e.g. a bench's cleanup).
``pyscheduler.db`` says *how* to call (``db.call(fn, **args)``); ``sqlapi`` says *what*.
``tests/shared/test_sqlapi.py`` checks every declaration against the migrated catalog (the contract)
and that no other module names a SQL function or ``FROM pyscheduler.`` (the boundary).
"""

from __future__ import annotations

SCHEMA = "pyscheduler"


class Fn(str):
    """A public SQL function: a ``str`` of its name (what ``db.call`` and its kin take), with
    ``args``, the parameters Python passes by name, and ``columns``, the result columns Python
    reads (a scalar function: its own name, as psycopg names the one column)."""

    args: tuple[str, ...]
    columns: tuple[str, ...]

    def __new__(cls, name: str, args: tuple[str, ...] = (), columns: tuple[str, ...] | None = None) -> Fn:
        self = super().__new__(cls, name)
        self.args = tuple(args)
        self.columns = (name,) if columns is None else tuple(columns)
        return self


class View(str):
    """A public view: a ``str`` of its name, with the ``columns`` Python reads."""

    columns: tuple[str, ...]

    def __new__(cls, name: str, columns: tuple[str, ...]) -> View:
        self = super().__new__(cls, name)
        self.columns = tuple(columns)
        return self

    def select(self, tail: str = "", columns: str = "*") -> str:
        """``SELECT columns FROM pyscheduler.<view> tail``: tail is the caller's WHERE, ORDER BY
        and LIMIT (with %s placeholders for its parameters)."""
        return f"SELECT {columns} FROM {SCHEMA}.{self} {tail}".rstrip()


class Query(str):
    """A named SQL statement (its text) that is neither a function call nor a view's read: a
    bench's setup or cleanup, a one-off probe."""


# -- what every capability shares ------------------------------------------------------------

VERSION = Fn("version", columns=("code_version", "migrations"))
NOW = Query("SELECT now() AS now")  # the database clock
CURRENT_ROLE = Query("SELECT current_user AS role")  # the role a login reads and acts as
ACTIVITY = Fn("activity", ("since", "bucket", "max_rows"),
              ("capability", "outcome", "bucket_start", "n", "worst", "complete"))
ACTIVITY_LATENCY = Fn("activity_latency", ("since", "bucket", "max_rows"),
                      ("capability", "bucket_start", "n", "p50", "p95", "complete"))
QUEUE_ACTIVITY = Fn("queue_activity", ("since", "max_rows"), ("queue", "status", "n", "complete"))
HTTP_ALLOW = Fn("http_allow")
SET_HTTP_ALLOW = Fn("set_http_allow", ("allow",))
# the role of an audience (client, worker, monitor, admin, ...) and whether the caller is a member
AUDIENCE_ROLE = Query("SELECT s.value, pg_has_role(current_user, s.value, 'MEMBER') FROM pyscheduler.settings s "
                      "WHERE s.name = %s")
