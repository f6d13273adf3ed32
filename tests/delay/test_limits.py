"""The delay queue's limits that Python checks before a round trip (pyscheduler/delay/sqlapi.py)
are SQL's: with Python's check bypassed, SQL takes each bound and refuses one past it with its
code, so the two cannot drift apart."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from pyscheduler import errors
from pyscheduler.delay import sqlapi as sql

US = timedelta(microseconds=1)
MS = timedelta(milliseconds=1)


def refused(db, fn, **args) -> str:
    with pytest.raises(errors.SchedulerError) as info:
        db.call(fn, **args)
    return info.value.sqlstate


def enqueue(db, ids, deadline=sql.MAX_DEADLINE - US, **args):
    return db.call(sql.ENQUEUE_MESSAGES, ids=ids, deadlines=[deadline] * len(ids), **args)


def test_a_message_id_of_max_id_length_characters_is_stored_and_one_more_is_ps101(tx):
    widest = "\U0001F600" * sql.MAX_ID_LENGTH  # four bytes each: MAX_ID_BYTES
    assert len(widest.encode()) == sql.MAX_ID_BYTES
    assert [r["outcome"] for r in enqueue(tx, ["x" * sql.MAX_ID_LENGTH, widest])] == ["enqueued", "enqueued"]
    assert refused(tx, sql.ENQUEUE_MESSAGES, ids=["x" * (sql.MAX_ID_LENGTH + 1)],
                   deadlines=[sql.MAX_DEADLINE - US]) == "PS101"


def test_deadlines_from_min_deadline_to_just_before_max_deadline_are_stored_and_past_them_ps106(tx):
    assert [r["outcome"] for r in tx.call(sql.ENQUEUE_MESSAGES, ids=["first", "last"],
                                          deadlines=[sql.MIN_DEADLINE, sql.MAX_DEADLINE - US], store_late=True)
            ] == ["enqueued", "enqueued"]
    for deadline in (sql.MIN_DEADLINE - US, sql.MAX_DEADLINE):
        assert refused(tx, sql.ENQUEUE_MESSAGES, ids=["out"], deadlines=[deadline], store_late=True) == "PS106"


def test_a_timing_advance_of_max_advance_ms_is_taken_and_one_millisecond_more_is_ps105(tx):
    node = uuid.uuid4()
    advance = timedelta(milliseconds=sql.MAX_ADVANCE_MS)
    assert advance == sql.MAX_ADVANCE
    assert enqueue(tx, ["m"], advance=advance)[0]["outcome"] == "enqueued"
    assert tx.call(sql.READY_AND_CLAIM, node=node, advance=advance, max_count=1, after=None) == []
    assert refused(tx, sql.ENQUEUE_MESSAGES, ids=["n"], deadlines=[sql.MAX_DEADLINE - US],
                   advance=advance + MS) == "PS105"
    assert refused(tx, sql.READY_AND_CLAIM, node=node, advance=advance + MS, max_count=1, after=None) == "PS105"
