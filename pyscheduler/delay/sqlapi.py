"""What the delay queue's Python asks of sql/delay.sql: every function and view it uses, the
channel it listens on, and the limits it checks before a round trip (pyscheduler/sqlapi.py)."""

from __future__ import annotations

from datetime import timedelta

from ..calls import MAX_INSTANT, MIN_INSTANT
from ..sqlapi import Fn, View

# -- the relay (its columns read by position: call_tuples) --------------------------------------

ENQUEUE_MESSAGES = Fn("enqueue_messages", ("ids", "deadlines", "keys", "vals", "header_lists", "advance",
                                           "store_late"), ("ord", "id", "outcome"))
READY_AND_CLAIM = Fn("ready_and_claim", ("node", "advance", "max_count", "after"),
                     ("id", "deadline", "headers", "key", "value", "readied_at"))
DELETE_FIRED = Fn("delete_fired", ("ids", "node"), ("id",))  # the ids already gone
NEXT_DEADLINE = Fn("next_deadline", ("after",))
RESET_STUCK = Fn("reset_stuck", ("hold",), ("id", "suspected_node"))
# enqueue_messages notifies it when a message is due sooner than the relays sleep
NOTIFY_CHANNEL = "pyscheduler_delay"

# -- views (delay status, the relay's backlog gauge, the demo) ----------------------------------

CANCEL_MESSAGE = Fn("cancel_message", ("id",))
FIND_MESSAGE = Fn("find_message", ("id",), ("id", "deadline", "state", "readied_at", "readied_by", "headers",
                                          "key_bytes", "value_bytes"))
WAITING_MESSAGES = Fn("waiting_messages", ("after_deadline", "after_id", "max_messages"),
                      ("id", "deadline", "headers", "key_bytes", "value_bytes"))
DELAY_QUEUE = View("delay_queue", ("waiting", "ready", "overdue", "next_deadline", "oldest_ready_age"))
DELAY_READY_BY_NODE = View("delay_ready_by_node", ("node", "ready", "oldest_readied_at", "oldest_ready_age"))

# -- limits: SQL's, checked in Python first (the relay dead-letters a message alone instead of
# having its batch refused; DelayProducer refuses before sending). tests/delay/test_limits.py
# holds each to SQL's refusal one past it.

MAX_ID_LENGTH = 128  # characters of a message id: the domain message_id (PS101)
MAX_ID_BYTES = 4 * MAX_ID_LENGTH  # ... and its bytes, for label_refusal (the same domain's rule)
MIN_DEADLINE, MAX_DEADLINE = MIN_INSTANT, MAX_INSTANT  # [MIN, MAX): the table's CHECK (PS106)
MAX_ADVANCE = timedelta(minutes=1)  # the timing advance of enqueue_messages and ready_and_claim (PS105)
MAX_ADVANCE_MS = MAX_ADVANCE // timedelta(milliseconds=1)
