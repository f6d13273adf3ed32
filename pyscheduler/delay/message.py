"""The delay queue's message format (seeds/chronos.md): the Chronos headers of an input message,
parsed and checked (``parse``: ``Delayed``, or ``Malformed`` naming what is wrong), and the
headers as the table stores them (``headers_to_json``, ``headers_from_json``)."""

from __future__ import annotations

import base64
import binascii
import gc
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from confluent_kafka import Message

from ..calls import label_refusal
from . import sqlapi as sql

HEADER_ID = "chronosMessageId"
HEADER_DEADLINE = "chronosDeadline"


class Malformed(ValueError):
    """An input message that cannot be scheduled; the text is the reason. ``headers``:
    the message's headers for its dead letter ([] when they could not be read)."""

    def __init__(self, reason: str, headers: list[tuple[str, bytes | None]] | None = None):
        super().__init__(reason)
        self.headers = headers or []


@dataclass(slots=True)
class Delayed:
    """A parsed input message: what enqueue_messages stores."""

    id: str
    deadline: datetime
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


# hh:mm:60 (or hhmm60), no fraction but zeros, then the offset if any: a leap second
_LEAP_SECOND = re.compile(r"(.*[Tt ]\d\d(:?)\d\d\2)60((?:[.,]0+)?(?:[Zz]|[+-].*)?)")


def parse_deadline(raw: bytes) -> datetime:
    """ISO-8601 (RFC 3339 too), with or without a UTC offset (none means UTC; ``Z`` or ``z``),
    fractional seconds allowed, a leap second (``23:59:60``) read as the next second (as
    PostgreSQL reads it), in [1970-01-01T00:00:00Z, 9999-01-01T00:00:00Z) (the table's CHECK)."""
    try:
        text = raw.decode("utf-8").strip()
        try:
            deadline = datetime.fromisoformat(text)
        except ValueError:
            deadline = _rfc3339_rest(text)
    except (UnicodeDecodeError, ValueError):
        raise Malformed(f"{HEADER_DEADLINE} is not an ISO-8601 date-time: {raw[:64]!r}") from None
    deadline = deadline.replace(tzinfo=timezone.utc) if deadline.tzinfo is None else deadline
    try:
        in_range = sql.MIN_DEADLINE <= deadline.astimezone(timezone.utc) < sql.MAX_DEADLINE
    except OverflowError:  # e.g. 0001-01-01T00:00:00+01:00: before year 1 in UTC
        in_range = False
    if not in_range:
        raise Malformed(f"{HEADER_DEADLINE} {text[:64]!r} is outside the supported range "
                        "[1970-01-01T00:00:00Z, 9999-01-01T00:00:00Z)")
    return deadline


def _rfc3339_rest(text: str) -> datetime:
    """What RFC 3339 and PostgreSQL take and ``datetime.fromisoformat`` does not: a lowercase
    ``z``, and a leap second (``:60`` without a fraction: the next second, 23:59:60Z is 00:00:00Z
    of the next day). ValueError for anything else."""
    if text.endswith("z"):
        text = text[:-1] + "Z"
    leap = _LEAP_SECOND.fullmatch(text)
    if leap is None:
        return datetime.fromisoformat(text)
    try:
        return datetime.fromisoformat(leap[1] + "59" + leap[3]) + timedelta(seconds=1)
    except OverflowError:  # 9999-12-31T23:59:60: past anything the table takes
        return datetime.max.replace(tzinfo=timezone.utc)


def parse(msg: Message) -> Delayed:
    """The Chronos headers of an input message, checked; Malformed names what is wrong.
    Any failure to read the message (e.g. a header name that is not UTF-8) is Malformed:
    that message is dead-lettered, never the batch."""
    try:
        # Read once: for a header name that is not UTF-8, confluent-kafka's msg.headers()
        # raises SystemError or (on a second call, or when the error indicator got lost)
        # returns a (NULL, value) pair that crashes the process when the name is touched.
        # repr() shows such a name as <NULL> (a real name is quoted), without touching it.
        # gc.get_referents lists the objects a tuple holds and skips a NULL: fewer than two per
        # pair means such a name (one C call per message; repr() of every pair cost ~2 us).
        headers = msg.headers() or []
        if len(gc.get_referents(*headers)) != 2 * len(headers):
            raise UnicodeDecodeError("utf-8", b"", 0, 1, "a header name is not UTF-8")
    except Exception as exc:
        raise Malformed(f"unreadable headers ({type(exc).__name__}: {str(exc)[:200]})") from None
    try:
        return _parse(msg, headers)
    except Malformed as exc:
        exc.headers = headers
        raise
    except Exception as exc:
        raise Malformed(f"unreadable message ({type(exc).__name__}: {str(exc)[:200]})", headers) from None


def _parse(msg: Message, headers: list[tuple[str, bytes | None]]) -> Delayed:
    if len(headers) == 2 and headers[0][0] == HEADER_ID and headers[1][0] == HEADER_DEADLINE:
        # the usual message: the two Chronos headers and nothing else
        ident, deadline = headers[0][1], headers[1][1]
        rest: list[tuple[str, bytes | None]] = []
        if ident is None:
            raise Malformed(f"header {HEADER_ID} is missing")
        if deadline is None:
            raise Malformed(f"header {HEADER_DEADLINE} is missing")
    else:
        idents: list[bytes | None] = []
        deadlines: list[bytes | None] = []
        rest = []
        for name, value in headers:
            if name == HEADER_ID:
                idents.append(value)
            elif name == HEADER_DEADLINE:
                deadlines.append(value)
            else:
                rest.append((name, value))
        for name, found in ((HEADER_ID, idents), (HEADER_DEADLINE, deadlines)):
            if not found or found[0] is None:
                raise Malformed(f"header {name} is missing")
            if len(found) > 1:
                raise Malformed(f"header {name} appears {len(found)} times")
        ident, deadline = idents[0], deadlines[0]
    try:
        text = ident.decode("utf-8")
    except UnicodeDecodeError:
        raise Malformed(f"{HEADER_ID} is not UTF-8 text") from None
    if not text:
        raise Malformed(f"{HEADER_ID} is empty")
    if len(text) > sql.MAX_ID_LENGTH:
        raise Malformed(f"{HEADER_ID} is longer than {sql.MAX_ID_LENGTH} characters ({len(text)})")
    why = label_refusal(text, sql.MAX_ID_BYTES)  # the rule of the domain pyscheduler.message_id
    if why is not None:
        raise Malformed(f"{HEADER_ID} {why}: {text[:64]!r}")
    return Delayed(text, parse_deadline(deadline), msg.key(), msg.value(), rest)


def headers_to_json(headers: Sequence[tuple[str, bytes | None]]) -> list[dict[str, Any]]:
    """Kafka headers as the seed's [{"name": "value"}, ...]; bytes that are not
    text become {"base64": "..."} and a NULL header value stays null."""
    out = []
    for name, value in headers:
        if value is None:
            out.append({name: None})
            continue
        try:
            text = value.decode("utf-8")
            if "\x00" in text:
                raise UnicodeDecodeError("utf-8", value, 0, 1, "NUL is not allowed in jsonb")
            out.append({name: text})
        except UnicodeDecodeError:
            out.append({name: {"base64": base64.b64encode(value).decode("ascii")}})
    return out


def headers_from_json(headers: list[dict[str, Any]]) -> list[tuple[str, bytes | None]]:
    out: list[tuple[str, bytes | None]] = []
    for pair in headers or []:
        for name, value in pair.items():
            if value is None:
                out.append((name, None))
            elif isinstance(value, dict) and isinstance(value.get("base64"), str):
                try:
                    out.append((name, base64.b64decode(value["base64"], validate=True)))
                except binascii.Error:
                    out.append((name, str(value).encode()))
            else:
                out.append((name, value.encode("utf-8") if isinstance(value, str) else str(value).encode()))
    return out


def delayed_headers(message_id: str, deadline: datetime) -> list[tuple[str, bytes]]:
    """The two Chronos headers of an input message."""
    return [(HEADER_ID, message_id.encode()), (HEADER_DEADLINE, deadline.isoformat().encode())]



def where(msg: Message) -> str:
    return f"{msg.topic()}/{msg.partition()}/{msg.offset()}"

