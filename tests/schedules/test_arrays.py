"""The executors' ready-made binary arrays (pyscheduler/schedules/arrays.py) read back in
PostgreSQL as the values they stand for, and record_executions takes them."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from pyscheduler.schedules.arrays import EpochMsArray, Int4Array, Int8Array
from pyscheduler.schedules.index import from_ms, to_ms

from tests.support.schedules import create


def test_binary_arrays_read_back_as_the_values_they_stand_for(tx):
    ms = [0, 946_684_800_000, 1_700_000_000_123, 4_102_444_800_999, -86_400_001]
    row = tx.execute("SELECT %b AS ids, pg_typeof(%b)::text AS ids_type, %b AS fours, %b AS ts, "
                       "pg_typeof(%b)::text AS ts_type, cardinality(%b) AS empty",
                       (Int8Array([1, -5, 2**62]), Int8Array([1]), Int4Array([0, -(2**31), 2**31 - 1]),
                        EpochMsArray(ms), EpochMsArray([1]), EpochMsArray([]))).fetchone()
    assert row["ids"] == [1, -5, 2**62] and row["ids_type"] == "bigint[]"
    assert row["fours"] == [0, -(2**31), 2**31 - 1]
    assert [to_ms(t) for t in row["ts"]] == ms and row["ts_type"] == "timestamp with time zone[]"
    assert row["ts"][2] == datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=timezone.utc)
    assert row["empty"] == 0


def test_record_executions_takes_the_binary_arrays_and_records_once(tx):
    s = create(tx, "arrays", every=1, target_kind="kafka", target="t",
               start_at=datetime.now(timezone.utc) - timedelta(seconds=5))
    due = tx.query("SELECT next_run_at FROM pyscheduler.schedules WHERE id = %s", (s["id"],))[0]["next_run_at"]
    args = dict(ids=Int8Array([s["id"]]), expected=EpochMsArray([to_ms(due)]), outcomes=["fired"],
                attempts=Int4Array([1]), errors=None)
    first = tx.call_binary("record_executions", **args)
    again = tx.call_binary("record_executions", **args)
    assert [(r["recorded"], r["expected_at"]) for r in first] == [(True, due)]
    assert first[0]["next_run_at"] == from_ms(to_ms(due) + 1000)
    assert [r["recorded"] for r in again] == [False]  # the same occurrence counts once
    assert tx.call_value("execution_count", name="arrays") == 1
