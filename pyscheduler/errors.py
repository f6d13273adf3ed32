"""The one place where database errors become pyscheduler exceptions.

SQL functions raise deliberate errors with their own SQLSTATE codes (class
``PS``; see docs/sql-api.md). ``translate()`` maps a psycopg error to the
exception class registered for its code; every call from Python to SQL goes
through ``pyscheduler.db`` which applies it.

Code ranges: PS0xx foundation, PS1xx delay queue, PS2xx leased tasks,
PS3xx recurring schedules, PS4xx future checks.
"""

from __future__ import annotations

import psycopg


class SchedulerError(Exception):
    """Base class of every error pyscheduler raises on purpose."""

    sqlstate: str | None = None

    def __init__(self, message: str, *, sqlstate: str | None = None, hint: str | None = None):
        super().__init__(message)
        if sqlstate is not None:
            self.sqlstate = sqlstate
        self.hint = hint


class ConfigError(SchedulerError):
    """Bad or missing configuration (a flag, an environment variable)."""


class DatabaseUnavailable(SchedulerError):
    """The database cannot be reached or refused the connection."""


class SchemaError(SchedulerError):
    """The database schema is missing, or newer than this version of pyscheduler."""


class PermissionDenied(SchedulerError):
    """The database role may not call this function (SQLSTATE 42501)."""


class InvalidArgument(SchedulerError):
    """A parameter was outside its documented domain."""


class NotFound(SchedulerError):
    """The named object does not exist."""


class Conflict(SchedulerError):
    """The object is not in a state that allows the operation."""


# delay queue
class InvalidMessage(InvalidArgument):
    """A delay-queue message is malformed: bad id, missing or out-of-range deadline, bad headers."""


# leased tasks
class TaskNotFound(NotFound):
    """PS200: no task with this rn (never existed, or cleaned up)."""


class TaskNotOwned(Conflict):
    """PS201: another lease holds the task (this lease expired and the task was leased again)."""


class TaskNotRunning(Conflict):
    """PS202: the task is not running (reset to ready, or finished)."""


class TaskCancelled(Conflict):
    """PS203: a client cancelled the task; stop working on it."""


class TaskFinished(Conflict):
    """PS209: the task is already completed or aborted and cannot be cancelled."""


class TaskYielded(Conflict):
    """PS210: the lease was yielded; the monitor makes the task ready for another lease."""


class TaskNotRequeueable(Conflict):
    """PS211: only an aborted or cancelled task can be requeued (retry_task), and not while a parent
    of it is aborted or cancelled (requeue that parent first)."""


class UniqueKeyTaken(Conflict):
    """PS214: another live task of the queue holds the task's unique_key (a requeue would make two)."""


# Answers to a lease holder's write that mean "this lease is gone": stop working on the task.
LEASE_GONE = (TaskNotFound, TaskNotOwned, TaskNotRunning, TaskCancelled, TaskYielded)


# recurring schedules
class ScheduleNotFound(NotFound):
    """PS300: no schedule with this name (never created, or deleted)."""


class InvalidSchedule(InvalidArgument):
    """PS301-PS310, PS312-PS314: a schedule parameter is invalid (the message names it)."""


class ScheduleExists(Conflict):
    """PS311: a schedule with this name already exists."""
# future checks
class InvalidResolution(InvalidArgument):
    """PS400: a slot resolution that does not divide a day into whole slots."""


class InvalidJob(InvalidArgument):
    """PS402: a check's kind or job is invalid (e.g. the SQL job function does not exist)."""


class SlotNotStarted(InvalidArgument):
    """PS404: due_checks for a slot that has not begun by the database clock (checks never run early)."""


class SlotNotOnBoundary(InvalidArgument):
    """PS405: due_checks for a time that is not a slot boundary (e.g. the resolution changed)."""


class CheckNotTaken(Conflict):
    """PS407: finish_check of a check the caller did not take (or that is gone)."""


# SQLSTATE -> exception class. Capabilities add their codes here, next to the
# code's meaning, and nowhere else.
CODES: dict[str, type[SchedulerError]] = {
    "42501": PermissionDenied,
    # the server went away mid-session (restart, failover): an outage, not a bug
    "57P01": DatabaseUnavailable,  # admin_shutdown
    "57P02": DatabaseUnavailable,  # crash_shutdown
    "57P03": DatabaseUnavailable,  # cannot_connect_now (starting up, shutting down)
    "08000": DatabaseUnavailable,  # connection_exception
    "08003": DatabaseUnavailable,  # connection_does_not_exist
    "08006": DatabaseUnavailable,  # connection_failure
    # foundation
    "PS001": InvalidArgument,  # invalid argument to a foundation function
    "PS002": SchemaError,  # schema setting missing or corrupt
    "PS003": InvalidArgument,  # user code (a check's SQL job) made the transaction read-only
    # delay queue
    "PS101": InvalidMessage,  # message id NULL, empty, over 128 characters or not a label (the input rule)
    "PS102": InvalidMessage,  # message without a deadline
    "PS103": InvalidArgument,  # array arguments of different lengths
    "PS104": InvalidMessage,  # headers not a JSON array of single-pair objects, or nested over 64 levels
    "PS105": InvalidArgument,  # bad interval or count (advance, hold, max_count) or NULL node
    "PS106": InvalidMessage,  # deadline outside [1970-01-01T00:00:00Z, 9999-01-01T00:00:00Z)
    # leased tasks
    "PS200": TaskNotFound,  # unknown task
    "PS201": TaskNotOwned,  # another lease holds the task
    "PS202": TaskNotRunning,  # task not running
    "PS203": TaskCancelled,  # task cancelled
    "PS204": InvalidArgument,  # invalid priority
    "PS205": InvalidArgument,  # invalid progress
    "PS206": InvalidArgument,  # invalid spec (not an object, too large, nested over 64 levels)
    "PS207": InvalidArgument,  # invalid errors (shape, too many, too large)
    "PS208": InvalidArgument,  # invalid argument (queue, worker, timeout, n, aging, status, retention, tokens,
    #                            max_attempts, note, array lengths)
    "PS209": TaskFinished,  # cancel of a completed or aborted task
    "PS210": TaskYielded,  # the lease was yielded
    "PS211": TaskNotRequeueable,  # retry of a task that is not aborted or cancelled, or whose parent failed
    "PS212": InvalidArgument,  # run_at outside [1970-01-01Z, 9999-01-01Z), run_in or retry_in outside 0..365 days
    "PS213": InvalidArgument,  # unique_key empty, over 200 bytes, padded, or with control/zero-width/bidi characters
    "PS214": UniqueKeyTaken,  # requeue of a task whose unique_key another live task holds
    "PS215": InvalidArgument,  # concurrency_key not a clean label of at most 200 bytes (or keys not one per spec)
    "PS216": InvalidArgument,  # a limit outside its bounds (running_per_key, running_total, starts, per)
    "PS217": InvalidArgument,  # a result larger than task_max_result_bytes or nested over 64 levels
    "PS218": InvalidArgument,  # a lease of a limited queue outside READ COMMITTED
    "PS219": InvalidArgument,  # after: a missing task, another role's, NULL, too many; bad on_parent_failure
    "PS220": InvalidArgument,  # a workflow: not an array of nodes, duplicate name, unknown name, cycle, too many
    "PS230": InvalidArgument,  # a step name not a clean label of at most 200 bytes (record_step, sleep_task)
    "PS231": InvalidArgument,  # an event name not a clean label of at most 200 bytes (await_event, emit_event)
    "PS232": InvalidArgument,  # an event payload larger than task_max_result_bytes or nested over 64 levels
    # recurring schedules (PS300-PS349; the daemons' own codes PS350-PS399)
    "PS300": ScheduleNotFound,  # unknown schedule
    "PS301": InvalidSchedule,  # cron expression does not parse (the field is named)
    "PS302": InvalidSchedule,  # not exactly one of every / cron
    "PS303": InvalidSchedule,  # not an IANA time zone name
    "PS304": InvalidSchedule,  # end_at not after start_at
    "PS305": InvalidSchedule,  # recurrence shorter than the retry policy's worst case
    "PS306": InvalidSchedule,  # every not a positive whole number of milliseconds (or has months)
    "PS307": InvalidSchedule,  # target kind or target (topic, URL: the egress policy, queue) invalid
    "PS308": InvalidSchedule,  # payload too large or (task targets) not an object
    "PS309": InvalidSchedule,  # retry policy out of range
    "PS310": InvalidSchedule,  # name empty, too long, padded, or with control, zero-width or bidi characters
    "PS311": ScheduleExists,  # name already taken
    "PS312": InvalidSchedule,  # other invalid argument (limits, outcome, overlap, array lengths, ...)
    "PS313": InvalidSchedule,  # cron expression that never fires (e.g. February 30)
    "PS314": InvalidSchedule,  # instant outside [1970-01-01Z, 9999-01-01Z) (start_at, end_at, after, first run)
    # future checks
    "PS400": InvalidResolution,  # resolution does not divide a day
    "PS401": InvalidArgument,  # entity_name or entity_key not a clean label (entity_key: 1..1000 bytes)
    "PS402": InvalidJob,  # invalid kind or job (SQL job function missing, wrong type, not SECURITY DEFINER,
    #                       no pinned search_path ending in pg_temp; handler or queue name not a clean label)
    "PS403": InvalidArgument,  # check time: not one of check_at/check_after, outside the instants, beyond horizon
    "PS404": SlotNotStarted,  # slot after the database clock
    "PS405": SlotNotOnBoundary,  # slot not on a slot boundary
    "PS406": InvalidArgument,  # shard, shards or max out of range
    "PS407": CheckNotTaken,  # finish of a check the caller did not take
    "PS408": InvalidArgument,  # other invalid argument (max_checks, horizon, task_timeout, retention, batch, ...)
    "PS409": InvalidArgument,  # payload larger than max_payload_bytes (or than a task's spec may be)
    "PS410": Conflict,  # a check of (entity_name, entity_key, job) is pending with another kind
}


def translate(exc: psycopg.Error) -> Exception:
    """Return the pyscheduler exception for a psycopg error (or the error itself)."""
    if isinstance(exc, psycopg.OperationalError) and exc.sqlstate is None:
        return DatabaseUnavailable(_first_line(str(exc)))
    code = exc.sqlstate
    cls = CODES.get(code or "")
    if cls is None:
        return exc
    diag = exc.diag
    err = cls(diag.message_primary or _first_line(str(exc)), sqlstate=code, hint=diag.message_hint)
    err.__cause__ = exc
    return err


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


# The one classification of failures (design.md, "Only an outage is retryable").
# An outage is retried with backoff, everywhere: connection loss (class 08, and a
# connection psycopg reports broken without a SQLSTATE), admin or crash shutdown and
# cannot-connect-now (57P0x), a statement cancelled by a timeout or an operator
# (57014), serialization failures and deadlocks (class 40), a lock timeout (55P03),
# a read-only server during a failover (25006), a server out of resources (class 53:
# too many connections, disk full) or with an I/O error (class 58). Everything else
# is an answer: a data error (class 22/23, 54000, a PS code, a value psycopg cannot
# load or dump) belongs to the item that caused it and is never retried; any other
# error (a missing function or privilege: 42xxx, a bug: XX000) is not retried either,
# and a daemon that meets one crashes and is restarted with backoff by run_daemons.
# (One exception, below the classification: db.py's _replanned runs a call once more when a
# migration made a plan cached on the connection wrong, 42804 or 0A000.)
# SQLSTATE classes and codes of an outage (psycopg's exception classes follow the DB-API,
# not the SQLSTATE classes: QueryCanceled is no subclass of OperatorIntervention).
OUTAGE_CLASSES = ("08", "53", "58")  # connection, insufficient resources, I/O
OUTAGE_CODES = ("40000", "40001", "40003", "40P01",  # serialization failure, deadlock (not 40002: data)
                "57000", "57014", "57P01", "57P02", "57P03", "57P04", "57P05",  # cancelled, shut down
                "55P03",  # lock_not_available (lock_timeout)
                "25006",  # read_only_sql_transaction: a standby, or a primary demoted by a failover
                "25P03")  # idle_in_transaction_session_timeout

RETRYABLE: tuple[type[BaseException], ...] = (DatabaseUnavailable,) + tuple(dict.fromkeys(
    psycopg.errors.lookup(code) for code in (
        *OUTAGE_CODES, "08000", "08001", "08003", "08004", "08006", "08007", "08P01",
        "53000", "53100", "53200", "53300", "53400", "58000", "58030")))


def is_retryable(exc: BaseException) -> bool:
    """True for an outage (``RETRYABLE``, a SQLSTATE of ``OUTAGE_CLASSES``/``OUTAGE_CODES``, or
    a connection psycopg reports broken without a SQLSTATE): worth waiting and trying again.
    False for every answer, data error and bug."""
    if isinstance(exc, RETRYABLE):
        return True
    if not isinstance(exc, psycopg.Error):
        return False
    code = exc.sqlstate or ""
    if not code:
        return isinstance(exc, psycopg.OperationalError)
    return code.startswith(OUTAGE_CLASSES) or code in OUTAGE_CODES


def rejects_arguments(exc: BaseException) -> bool:
    """True for a data error: the values passed or returned are at fault, so the same
    call cannot succeed and the item that carries them is poison (it ends alone, its
    neighbours go on). That is an ``InvalidArgument`` (a deliberate PS code such as
    PS101), a data exception (class 22, e.g. a byte sequence invalid in the server
    encoding, a timestamp out of range), an integrity violation (class 23, e.g. a CHECK
    constraint), program_limit_exceeded (54000, e.g. a row too big for an index), or a
    value psycopg cannot load or dump (``psycopg.DataError`` without a SQLSTATE: a
    timestamp after year 9999 or BC, an infinite date, a DateStyle it cannot parse).

    Never an outage (``is_retryable``): a statement or lock timeout, a deadlock, a
    read-only or full database, a lost connection are about the server, not the data."""
    if isinstance(exc, InvalidArgument):
        return True
    if isinstance(exc, psycopg.DataError) and not getattr(exc, "sqlstate", None):
        return True
    code = getattr(exc, "sqlstate", None) or ""
    if issubclass(CODES.get(code, SchedulerError), InvalidArgument):  # a PS code not translated yet
        return True
    return code.startswith(("22", "23")) or code == "54000"
