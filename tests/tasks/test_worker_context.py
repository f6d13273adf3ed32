"""The Worker's per-task Python: the lease's rows arrive as text and a context
parses only what its handler reads; what the handler sees is still what the database holds."""

from __future__ import annotations

import json
import threading
import uuid

import pytest

from pyscheduler.db import UuidArray, load_json
from pyscheduler.tasks import TaskClient, TaskContext, Worker
from tests.support import wait_for

SPECS = [
    {"big": 2**70, "small": -(2**63) - 1, "f": 1.5e300, "neg": -0.0, "s": "é😀\n\"", "nested": [{"a": None}, True]},
    {},
    {"i": 1},
    {"deep": [[[[{"x": 1.25}]]]]},
]


@pytest.mark.slow
def test_a_handler_sees_the_spec_and_task_the_database_holds(db, dsn):
    client = TaskClient(db)
    rns = [client.submit("lean", spec, priority=p)["rn"] for p, spec in enumerate(SPECS)]
    seen: dict[str, tuple] = {}
    lock = threading.Lock()

    def handler(ctx: TaskContext) -> None:
        with lock:
            seen[ctx.rn] = (ctx.spec, ctx.task, ctx.token)

    running = Worker(dsn, "lean", handler, capacity=2).start()
    try:
        wait_for(lambda: running.worker.completed == len(SPECS))
    finally:
        running.stop()
    for p, rn in enumerate(rns):
        spec, task, token = seen[rn]
        stored = client.get(rn)["spec"]  # what psycopg's jsonb loader gives (jsonb writes 1.5e300 as 301 digits)
        assert spec == stored and repr(spec) == repr(stored)  # the same types too
        assert task == {"rn": rn, "token": token, "spec": spec, "priority": p, "queue": "lean", "attempt": 1}
        assert isinstance(rn, str) and isinstance(token, str) and uuid.UUID(token)
        assert client.get(rn)["status"] == "completed"


def test_a_context_made_from_a_task_dict_works_as_before():
    ctx = TaskContext({"rn": "r1", "token": "t1", "spec": {"a": 1}})
    assert (ctx.rn, ctx.token, ctx.spec, ctx.task["spec"]) == ("r1", "t1", {"a": 1}, {"a": 1})
    assert not ctx.stopping.is_set() and ctx.reason is None and not ctx.started
    ctx._stop("cancelled")
    assert ctx.cancelled.is_set() and ctx.stopping.is_set()
    other = TaskContext({"rn": "r2", "spec": []})  # class-level defaults are not shared state
    assert not other.stopping.is_set() and other.token is None and other._progress is None
    ctx.progress(0.5)
    assert ctx._progress == 0.5 and other._progress is None


@pytest.mark.slow
def test_a_context_class_with_its_own_init_is_made_with_the_task_dict(db, dsn):
    made: list[dict] = []

    class Mine(TaskContext):
        def __init__(self, task):
            super().__init__(task)
            made.append(task)

    class MyWorker(Worker):
        context_class = Mine

    rn = TaskClient(db).submit("own", {"k": [1, 2]})["rn"]
    running = MyWorker(dsn, "own", lambda ctx: None).start()
    try:
        wait_for(lambda: running.worker.completed == 1)
    finally:
        running.stop()
    assert made == [{"rn": rn, "token": made[0]["token"], "spec": {"k": [1, 2]}, "priority": 50, "queue": "own",
                     "attempt": 1}]


@pytest.mark.parametrize("values", [
    [str(uuid.uuid4()) for _ in range(3)],
    [str(uuid.uuid4()).upper(), uuid.uuid4().hex, "{%s}" % uuid.uuid4(), uuid.uuid4()],  # not canonical text
    [],
])
def test_a_uuid_array_reaches_the_database_as_the_uuids_given(tx, values):
    got = tx.execute("SELECT %b::text[] AS a", [UuidArray(values)]).fetchone()["a"]
    assert got == [str(uuid.UUID(str(v))) for v in values]


def test_a_uuid_array_refuses_values_that_are_not_uuids():
    a = str(uuid.uuid4())
    # 36 characters each and 64 hex digits together, but 33 and 31 each: not two uuids
    h = uuid.uuid4().hex + uuid.uuid4().hex
    shifted = [f"{h[:9]}-{h[9:13]}-{h[13:17]}-{h[17:33]}", f"{h[33:40]}-{h[40:44]}-{h[44:48]}-{h[48:52]}--{h[52:]}"]
    assert [len(v) for v in shifted] == [36, 36]
    for values in (shifted, [a, "not a uuid"], [a, None]):
        with pytest.raises((ValueError, TypeError)):
            UuidArray(values)


@pytest.mark.parametrize("text", [
    '{"a": 18446744073709551616}', '[-9223372036854775809, 9223372036854775807, -9223372036854775808]',
    "[" + "1" * 301 + "]", "[0." + "0" * 300 + "1]", '{"phone": "1234567890123456789012"}', '[1e400, -0.0, 0.1]',
    '"\\u00e9\\ud83d\\ude00"', '{"x": [1, 2.5, null, true, {"y": []}]}', "null", '"x"',
])
def test_load_json_gives_what_json_loads_gives(text):
    for got in (load_json(text), load_json(text.encode())):
        want = json.loads(text)
        assert got == want and repr(got) == repr(want)  # the same types too (an int stays an int)
