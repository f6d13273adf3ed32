"""The lean submit (issue 31): submit_tasks_lean and TaskClient.submit_ids make the same tasks,
in the same order, with the same deduplication answers, tallies and refusals as submit_tasks,
answering only (rn, deduplicated) per spec."""

from __future__ import annotations

import asyncio
import re
from collections import OrderedDict
from datetime import datetime, timedelta, timezone
from enum import IntEnum
from types import MappingProxyType
from uuid import UUID

import psycopg
import pytest

from pyscheduler import errors
from pyscheduler.db import Jsonb
from pyscheduler.errors import InvalidArgument
from pyscheduler.tasks import AsyncTaskClient, TaskClient
from pyscheduler.tasks import sqlapi as sql

from tests.support import wait_for
from tests.support.tasks import held, lease, submit

# the columns a submit decides (rn, seq, created and updated differ between two runs)
COLUMNS = ("queue", "spec", "priority", "status", "run_at IS NOT NULL AS delayed", "unique_key", "concurrency_key",
           "max_attempts", "submitted_by", "after", "waiting_on", "on_parent_failure", "history")


def answers(tx, function: str, **args) -> list[tuple[str, bool]]:
    """(rn, deduplicated) per spec, from either function."""
    rows = tx.call(function, **args)
    if function == "submit_tasks":
        return [(r["task"]["rn"], r["task"].get("deduplicated", False)) for r in rows]
    return [(str(r["rn"]), r["deduplicated"]) for r in rows]


def outcome(tx, function: str, **args) -> tuple[list, list, list]:
    """What a submit did, comparable between the two functions: each answer as the position of
    its task among the queue's tasks in lease (seq) order, those tasks' columns, the tallies."""
    with tx.conn.transaction(force_rollback=True):
        got = answers(tx, function, **args)
        rows = tx.execute(f"SELECT rn::text, {', '.join(COLUMNS)} FROM pyscheduler.tasks "
                          "WHERE queue = 'lean' ORDER BY seq").fetchall()
        counts = tx.execute("SELECT status, tasks FROM pyscheduler.task_counts WHERE queue = 'lean' "
                            "ORDER BY status").fetchall()
    position = {r.pop("rn"): i for i, r in enumerate(rows)}
    return [(position[rn], dedup) for rn, dedup in got], rows, counts


def specs(n: int) -> Jsonb:
    return Jsonb([{"i": i} for i in range(n)])


CASES = {
    "plain": dict(specs=specs(5)),
    "delayed": dict(specs=specs(3), run_in=timedelta(hours=1), priority=7, max_attempts=3),
    "unique keys": dict(specs=specs(6), unique_keys=["live", "b", None, "b", "c", "live"]),
    "distinct unique keys, one live": dict(specs=specs(4), unique_keys=["x", "live", None, "y"]),
    "distinct unique keys": dict(specs=specs(3), unique_keys=["z", "x", None]),
    "a key repeated, none live": dict(specs=specs(3), unique_keys=["r", None, "r"]),  # refused by the index
    "concurrency keys": dict(specs=specs(3), concurrency_keys=["k", None, "k"]),
    "after a live parent": dict(specs=specs(2), after="live"),
    "after a cancelled parent": dict(specs=specs(2), after="cancelled"),
    "after a cancelled parent, run": dict(specs=specs(2), after="cancelled", on_parent_failure="run"),
    # one spec without unique key or parents: the single path (_submit_one)
    "one spec": dict(specs=specs(1)),
    "one spec, delayed": dict(specs=specs(1), run_in=timedelta(hours=1), priority=7, max_attempts=3),
    "one spec, due already": dict(specs=specs(1), run_at=datetime(2020, 1, 1, tzinfo=timezone.utc)),
    "one spec, a concurrency key": dict(specs=specs(1), concurrency_keys=["k"], on_parent_failure="run"),
    "one spec, a unique key": dict(specs=specs(1), unique_keys=["live"]),
}
SINGLE = [case for case in CASES if case.startswith("one spec") and "unique" not in case]


@pytest.mark.parametrize("case", list(CASES))
def test_submit_tasks_lean_does_what_submit_tasks_does_answering_ids(tx, case):
    live = submit(tx, queue="lean", spec={"live": 1}, unique_key="live")["rn"]
    cancelled = submit(tx, queue="lean", spec={"gone": 1})["rn"]
    tx.call("cancel_task", rn=cancelled)
    args = dict(CASES[case], queue="lean")
    if "after" in args:
        args["after"] = [{"live": live, "cancelled": cancelled}[args["after"]]]
    lean = outcome(tx, "submit_tasks_lean", **args)
    assert lean == outcome(tx, "submit_tasks", **args)
    got, rows, _ = lean
    assert len(got) == len(args["specs"].obj)
    expected = {  # the live task is position 0 (the cancelled one 1); the first of equal keys in the array wins
        "unique keys": [(0, True), (2, False), (3, False), (2, True), (4, False), (0, True)],
        "distinct unique keys, one live": [(2, False), (0, True), (3, False), (4, False)],
        "distinct unique keys": [(2, False), (3, False), (4, False)],
        "a key repeated, none live": [(2, False), (3, False), (2, True)]}
    if case in expected:
        assert got == expected[case]


@pytest.mark.parametrize("keys, ckeys, dedup", [
    ("[0:2]={a,b,c}", "[5:7]={x,y,z}", [False, False, False]),  # fresh keys: the plain insert
    ("[0:2]={a,live,c}", "[5:7]={x,y,z}", [False, True, False]),  # a live one: the conflict path
    ("{{a,b},{c,live}}", "{{x,y},{z,w}}", [False, False, False, True]),
])
def test_keys_of_other_bounds_or_dimensions_go_to_the_specs_in_array_order(tx, keys, ckeys, dedup):
    live = submit(tx, queue="lean", spec={"live": 1}, unique_key="live")["rn"]
    n = len(dedup)
    got = tx.execute("SELECT rn, deduplicated FROM pyscheduler.submit_tasks_lean(queue => 'lean', specs => %s, "
                     "unique_keys => %s, concurrency_keys => %s)", (specs(n), keys, ckeys)).fetchall()
    assert [r["deduplicated"] for r in got] == dedup
    flat = keys.split("=")[-1].replace("{", "").replace("}", "").split(",")
    cflat = ckeys.split("=")[-1].replace("{", "").replace("}", "").split(",")
    for i, r in enumerate(got):
        task = tx.execute("SELECT unique_key, concurrency_key, spec FROM pyscheduler.tasks WHERE rn = %s",
                          (r["rn"],)).fetchone()
        if r["deduplicated"]:
            assert (str(r["rn"]), flat[i]) == (live, "live")
        else:
            assert (task["unique_key"], task["concurrency_key"], task["spec"]) == (flat[i], cflat[i], {"i": i})


@pytest.mark.parametrize("keys", [None, ["a", "b", "c", "d"], ["a", "a", "c", "d"], ["d", "c", "b", "a"]],
                         ids=["plain", "fresh keys", "a key twice", "keys in reverse"])
def test_a_batch_with_bad_specs_is_refused_naming_the_first_one(tx, keys):
    """Whichever path takes the batch (the keys' order is the insert's), the error names the first
    refused spec, and nothing is submitted."""
    bad = [{"i": 0}, {"x": "y" * 2_000_000}, 1, {"i": 3}]
    with pytest.raises(psycopg.Error, match=r"specs\[1\] is \d+ bytes, more than task_max_spec_bytes") as refused:
        with tx.conn.transaction():
            tx.execute("SELECT * FROM pyscheduler.submit_tasks_lean(queue => 'badspec', specs => %s, "
                       "unique_keys => %s)", (Jsonb(bad), keys))
    assert refused.value.sqlstate == "PS206"
    assert tx.execute("SELECT count(*) AS n FROM pyscheduler.tasks WHERE queue = 'badspec'").fetchone()["n"] == 0


@pytest.mark.parametrize("case", SINGLE)
def test_one_spec_takes_the_single_path(tx, case):
    """submit_tasks_lean of one spec without unique key or parents is _submit_one's (the cases
    above check it does what submit_tasks, through _submit_lean, does)."""
    tx.execute("SET LOCAL track_functions = 'all'")
    tx.call("submit_tasks_lean", queue="lean", **CASES[case])
    calls = tx.execute("SELECT pg_stat_get_xact_function_calls('pyscheduler._submit_one'::regproc) AS one, "
                       "pg_stat_get_xact_function_calls('pyscheduler._submit_lean'::regproc) AS lean").fetchone()
    assert calls == {"one": 1, "lean": None}


def test_a_single_submit_refuses_what_submit_tasks_refuses_with_the_same_error(tx):
    """The single path's checks are the batch's: same SQLSTATE, same message (a spec named specs[0])."""
    tx.execute("UPDATE pyscheduler.settings SET value = '40' WHERE name = 'task_max_spec_bytes'")
    bad = [dict(specs=Jsonb([[1]])), dict(specs=Jsonb([{"long": "x" * 50}])), dict(specs=specs(1), priority=-1),
           dict(specs=specs(1), max_attempts=1001), dict(specs=specs(1), run_in=timedelta(days=400)),
           dict(specs=specs(1), run_at=datetime(9999, 6, 1, tzinfo=timezone.utc)),
           dict(specs=specs(1), run_at=datetime(2030, 1, 1, tzinfo=timezone.utc), run_in=timedelta(hours=1)),
           dict(specs=specs(1), concurrency_keys=[" padded"]), dict(specs=specs(1), on_parent_failure="never"),
           dict(specs=specs(1), priority=None)]

    def refusal(function: str, args: dict) -> tuple[str, str] | None:
        try:
            with tx.conn.transaction(force_rollback=True):
                tx.call(function, queue="lean", **args)
        except (errors.SchedulerError, psycopg.Error) as exc:
            return exc.sqlstate, str(exc).splitlines()[0]
        return None

    refusals = [refusal("submit_tasks_lean", args) for args in bad]
    assert refusals == [refusal("submit_tasks", args) for args in bad]
    assert None not in refusals and "specs[0]" in refusals[0][1] and "specs[0]" in refusals[1][1]
    assert refusals[-1] == ("PS204", "priority must be an integer in 0..4294967295, got NULL")  # it said -1


def singular(args: dict) -> dict:
    """submit_tasks' arguments of one spec as submit_task's."""
    names = {"specs": "spec", "unique_keys": "unique_key", "concurrency_keys": "concurrency_key"}
    one = {names.get(k, k): v for k, v in args.items()}
    one["spec"] = Jsonb(one["spec"].obj[0])
    return {k: v[0] if k in ("unique_key", "concurrency_key") else v for k, v in one.items()}


ONE = [case for case in CASES if case.startswith("one spec")] + ["after a live parent", "after a cancelled parent, run"]


@pytest.mark.parametrize("case", ONE)
def test_submit_task_lean_does_what_submit_task_does_answering_the_id(tx, case):
    """The same task, tallies and answer (the id of the task made, or of the live task holding the
    key) as submit_task, for every path: _submit_one, and _submit_lean with a key or parents."""
    live = submit(tx, queue="lean", spec={"live": 1}, unique_key="live")["rn"]
    cancelled = submit(tx, queue="lean", spec={"gone": 1})["rn"]
    tx.call("cancel_task", rn=cancelled)
    args = singular(dict(CASES[case], queue="lean", specs=specs(1)))  # the "after" cases' one spec
    if "after" in args:
        args["after"] = [{"live": live, "cancelled": cancelled}[args["after"]]]

    def made(function: str) -> tuple:
        with tx.conn.transaction(force_rollback=True):
            answer = tx.call(function, **args)[0][function]
            rn = str(answer) if function == "submit_task_lean" else answer["rn"]
            rows = tx.execute(f"SELECT rn::text, {', '.join(COLUMNS)} FROM pyscheduler.tasks "
                              "WHERE queue = 'lean' ORDER BY seq").fetchall()
            counts = tx.execute("SELECT status, tasks FROM pyscheduler.task_counts WHERE queue = 'lean' "
                                "ORDER BY status").fetchall()
        position = {r.pop("rn"): i for i, r in enumerate(rows)}
        return position[rn], rows, counts

    lean = made("submit_task_lean")
    assert lean == made("submit_task")
    assert (lean[0] == 0) == (case == "one spec, a unique key")  # the live task's id, deduplicated


def test_submit_task_lean_and_submit_task_take_the_single_path_without_a_key_or_parents(tx):
    tx.execute("SET LOCAL track_functions = 'all'")
    for case in SINGLE:
        tx.call("submit_task_lean", **singular(dict(CASES[case], queue="lean")))
        tx.call("submit_task", **singular(dict(CASES[case], queue="lean")))
    tx.call("submit_task_lean", queue="lean", spec=Jsonb({}), unique_key="u")
    tx.call("submit_task", queue="lean", spec=Jsonb({}), unique_key="v")
    calls = tx.execute("SELECT pg_stat_get_xact_function_calls('pyscheduler._submit_one'::regproc) AS one, "
                       "pg_stat_get_xact_function_calls('pyscheduler._submit_lean'::regproc) AS lean, "
                       "pg_stat_get_xact_function_calls('pyscheduler._submit_task'::regproc) AS general").fetchone()
    assert calls == {"one": 2 * len(SINGLE), "lean": 1, "general": 1}


@pytest.mark.parametrize("function", ["submit_task", "submit_task_lean", "submit_tasks", "submit_tasks_lean"])
def test_the_defaults_a_single_submit_leaves_out_are_the_functions_own(tx, function):
    """TaskClient's single submits send neither priority nor on_parent_failure when they equal
    sqlapi.SUBMIT_DEFAULTS: a task submitted without them gets exactly those."""
    spec = {"specs": Jsonb([{}])} if function.startswith("submit_tasks") else {"spec": Jsonb({})}
    tx.call(function, queue="defaults", **spec)
    row = tx.execute("SELECT priority, coalesce(on_parent_failure, 'cancel') AS on_parent_failure "
                     "FROM pyscheduler.tasks WHERE queue = 'defaults'").fetchone()
    assert row == sql.SUBMIT_DEFAULTS


@pytest.mark.parametrize("case", SINGLE)
def test_submit_task_on_the_single_path_answers_the_task_as_the_general_path_does(tx, case):
    """submit_task without a key or parents (_submit_one, then the row read back as JSON) answers
    every key with the value submit_tasks' general path answers for the same spec, but the id (one
    transaction: the same now(), so the same instants)."""
    args = dict(CASES[case], queue="lean")

    def answer(function: str) -> dict:
        with tx.conn.transaction(force_rollback=True):
            if function == "submit_task":
                task = tx.call(function, **singular(args))[0][function]
            else:
                task = tx.call(function, **args)[0]["task"]
        assert UUID(task.pop("rn"))
        return task

    single = answer("submit_task")
    assert single == answer("submit_tasks")
    assert single["status"] == ("scheduled" if "delayed" in case else "ready") and "deduplicated" not in single


@pytest.mark.parametrize("key", [None, "u"], ids=["single path", "with a unique key"])
def test_submit_task_lean_refuses_what_submit_task_refuses_with_the_same_error(tx, key):
    """Same SQLSTATE, same message (a refused spec named spec), on either path."""
    tx.execute("UPDATE pyscheduler.settings SET value = '40' WHERE name = 'task_max_spec_bytes'")
    bad = [dict(spec=Jsonb([1])), dict(spec=Jsonb({"long": "x" * 50})), dict(spec=None),
           dict(spec=Jsonb({}), priority=-1), dict(spec=Jsonb({}), max_attempts=1001),
           dict(spec=Jsonb({}), run_in=timedelta(days=400)),
           dict(spec=Jsonb({}), run_at=datetime(2030, 1, 1, tzinfo=timezone.utc), run_in=timedelta(hours=1)),
           dict(spec=Jsonb({}), concurrency_key=" padded"), dict(spec=Jsonb({}), on_parent_failure="never"),
           dict(spec=Jsonb({}), priority=None), dict(spec=Jsonb({}), after=[UUID(int=1)])]

    def refusal(function: str, args: dict) -> tuple[str, str] | None:
        try:
            with tx.conn.transaction(force_rollback=True):
                tx.call(function, queue="lean", unique_key=key, **args)
        except (errors.SchedulerError, psycopg.Error) as exc:
            return exc.sqlstate, str(exc).splitlines()[0]
        return None

    refusals = [refusal("submit_task_lean", args) for args in bad]
    assert refusals == [refusal("submit_task", args) for args in bad]
    assert None not in refusals and refusals[0][1].startswith("spec ") and refusals[1][1].startswith("spec ")


def test_submit_tasks_lean_refuses_what_submit_tasks_refuses(tx):
    bad = [dict(specs=Jsonb([{}, 1])), dict(specs=Jsonb({"a": 1})), dict(specs=specs(2), unique_keys=["x"]),
           dict(specs=specs(2), unique_keys=["ok", " padded"]), dict(specs=specs(1), concurrency_keys=["a", "b"]),
           dict(specs=specs(1), priority=-1), dict(specs=specs(1), max_attempts=0),
           dict(specs=specs(1), run_in=timedelta(days=400)), dict(specs=specs(1), after=[UUID(int=1)])]

    def code(function: str, args: dict) -> str | None:
        try:
            with tx.conn.transaction(force_rollback=True):
                tx.call(function, queue="lean", **args)
        except (errors.SchedulerError, psycopg.Error) as exc:
            return exc.sqlstate
        return None

    codes = [code("submit_tasks_lean", args) for args in bad]
    assert codes == [code("submit_tasks", args) for args in bad]
    assert None not in codes


def test_submit_ids_answers_the_ids_in_the_order_of_specs(client):
    first = client.submit("ids", {"first": 1}, unique_key="k")
    ids = client.submit_ids("ids", [{"i": 0}, {"i": 1}, {"i": 2}], unique_keys=[None, "k", "j"], priority=9)
    assert all(isinstance(rn, UUID) for rn in ids) and ids[1] == first.rn
    assert [client.get(rn).spec for rn in ids] == [{"i": 0}, {"first": 1}, {"i": 2}]
    assert [t.rn for t in client.list("ids", limit=10)] == sorted({first.rn, *ids}, reverse=True)
    assert client.submit_ids("ids", []) == []
    assert client.submit_ids("ids", [{"again": 1}], unique_keys=["k"]) == [first.rn]  # one spec: submit_task_lean
    [alone] = client.submit_ids("ids", [{"i": 3}], run_at=timedelta(hours=1), concurrency_keys=["c"], priority=4)
    assert (client.get(alone).status, client.get(alone).concurrency_key, client.get(alone).priority) == \
        ("scheduled", "c", 4)
    ids.append(alone)
    with pytest.raises(InvalidArgument, match=r"specs\[1\]"):
        client.submit_ids("ids", [{}, [1]])
    with pytest.raises(InvalidArgument, match="unique_keys"):
        client.submit_ids("ids", [{}], unique_keys=["a", "b"])
    with pytest.raises(InvalidArgument, match="no such task") as refused:  # the server's refusal, mapped
        client.submit_ids("ids", [{}, {}], after=[UUID(int=7)])
    assert refused.value.sqlstate == "PS219"
    assert [t.rn for t in client.list("ids", limit=10)] == sorted({first.rn, *ids}, reverse=True)


@pytest.mark.parametrize("key, why", [(5, "must be a str"), ("a\x00b", "NUL"), ("\ud800", "lone surrogate")])
@pytest.mark.parametrize("keys", ["unique_keys", "concurrency_keys"])
def test_a_bulk_submit_refuses_a_bad_key_naming_it_and_submits_nothing(client, keys, key, why):
    with pytest.raises(InvalidArgument, match=rf"{keys}\[2\] .*{why}"):
        client.submit_ids("badkey", [{}, {}, {}], **{keys: ["é", None, key]})
    assert client.list("badkey") == []
    assert len(client.submit_ids("badkey", [{}, {}], **{keys: ["é", None]})) == 2  # not ASCII, fine


@pytest.mark.parametrize("n", [1, 3])
def test_a_lean_submit_is_leased_in_order_and_wakes_the_queue(db, dsn, n):
    from pyscheduler.db import Listener, Wakeup

    woken = Wakeup()
    listener = Listener(dsn, [sql.task_channel("woken")], woken.poke).start()
    try:
        assert listener.ready.wait(30)
        ids = TaskClient(db).submit_ids("woken", [{"i": i} for i in range(n)])
        assert woken.wait(10, jitter=0)
    finally:
        listener.stop()
    with db.session() as s:
        leased = [held(lease(s, queue="woken"))["rn"] for _ in ids]
    assert leased == [str(rn) for rn in ids]


DEEP = {"a": 1}
for _ in range(210):
    DEEP = {"a": DEEP}


@pytest.mark.parametrize("spec, why", [
    ({"x": float("nan")}, "nan"), ({"a": [1, float("-inf")]}, "inf"), ({"s": "a\x00b"}, "NUL"),
    ({"k\x00": 1}, "NUL"), ({"s": "\ud800"}, "surrogate"), ({1: "a"}, "not a string"),
    ({"m": MappingProxyType({"a": 1})}, "serialisable"), ({"o": object()}, "not JSON"), (DEEP, "deeper"),
    (["not an object"], "JSON object")])
def test_a_bulk_submit_refuses_unstorable_json_naming_the_spec(client, spec, why):
    """The batch's one-pass check (calls.json_objects) refuses what json_object refuses one by one."""
    for bulk in (client.submit_ids, client.submit_many):
        with pytest.raises(InvalidArgument, match=r"specs\[1\]") as info:
            bulk("q", [{}, spec])
        assert why in str(info.value)
    with pytest.raises(InvalidArgument, match=r"specs\[0\]") as info:  # one spec: the single submit's own check
        client.submit_ids("q", [spec])
    assert why in str(info.value)
    assert client.list() == []


@pytest.mark.parametrize("priority, why", [(50.0, "integer"), (True, "integer"), ("50", "integer"), (-1, "0.."),
                                           (2 ** 32, "0..")])
def test_a_single_submit_checks_its_arguments_as_a_batch_does(client, priority, why):
    """One plain spec takes submit_ids' fast path (its default arguments left out of the call):
    a priority that only looks like the default (50.0, True, "50") is checked, not taken for it."""
    for specs in ([{"i": 1}], [{"i": 1}, {"i": 2}]):
        with pytest.raises(InvalidArgument, match=rf"priority .*{why}"):
            client.submit_ids("q", specs, priority=priority)
    [rn] = client.submit_ids("q", [{"i": 1}])
    task = client.get(rn)
    assert (task.priority, task.spec, task.status, task.on_parent_failure) == (50, {"i": 1}, "ready", "cancel")
    assert client.list() == [task]


def test_a_bulk_submit_stores_unusual_but_storable_json_as_submit_does(client):
    class Colour(IntEnum):
        RED = 1

    class Name(str):
        pass

    specs = [{"t": (1, 2)}, OrderedDict(b=1, a=2), {"c": Colour.RED, "é": "ünïcode", "n": None, "f": 1.5},
             MappingProxyType({"m": True}), {"e": 1e22, "z": -0.0, "tiny": 5e-324, "s": Name("x")}, {"big": 2 ** 70}]
    # orjson writes the ASCII batches; json.dumps the others and what orjson refuses (an int past 64
    # bits); a batch of one is a single submit (only_object)
    for batch in (specs, specs[:2], specs[4:5], specs[5:], *([s] for s in specs)):
        ids = client.submit_ids("q", batch)
        assert [client.get(rn).spec for rn in ids] == [client.submit("q", s).spec for s in batch]


def test_the_async_client_submits_ids_in_the_applications_transaction(dsn):
    async def run() -> list[UUID]:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            client = AsyncTaskClient(conn)
            ids = await client.submit_ids("async", [{"i": 0}, {"i": 1}]) + await client.submit_ids("async", [{"i": 2}])
            assert [(await client.get(rn)).spec["i"] for rn in ids] == [0, 1, 2]  # in its transaction
            await conn.rollback()
            return ids

    ids = asyncio.run(run())
    assert len(ids) == 3 and all(isinstance(rn, UUID) for rn in ids)
    with psycopg.connect(dsn) as conn:  # rolled back with the application's transaction
        assert conn.execute("SELECT count(*) FROM pyscheduler.tasks WHERE rn = ANY (%s)", (ids,)).fetchone()[0] == 0


def test_a_single_submit_on_the_applications_connection_is_in_its_transaction(dsn):
    """submit_ids of one spec (call_scalar) on the application's own connection, whatever its row
    factory: the task exists in its transaction only until it commits."""
    from psycopg.rows import namedtuple_row

    with psycopg.connect(dsn, row_factory=namedtuple_row) as app:
        [rn] = TaskClient(app).submit_ids("mine", [{"i": 1}], priority=3)
        assert app.execute("SELECT priority FROM pyscheduler.tasks WHERE rn = %s", (rn,)).fetchone().priority == 3
        app.rollback()
        assert app.execute("SELECT count(*) AS n FROM pyscheduler.tasks WHERE rn = %s", (rn,)).fetchone().n == 0


def test_a_pooled_submit_survives_its_statements_deallocated_and_its_connection_killed(dsn, conn):
    """Database.call_column and call_scalar (submit_ids of many specs and of one) prepare their
    statements on each pool connection themselves (below psycopg's cursor, issue 31): DEALLOCATE
    ALL or DISCARD ALL run on that connection make them prepare again, and a connection killed
    between two calls is replaced at checkout, its prepared statements with it."""
    from pyscheduler.db import Database

    with Database(dsn, min_size=1, max_size=1) as db:
        client = TaskClient(db)
        ids = [*client.submit_ids("prep", [{"i": 0}])]
        for command in ("DEALLOCATE ALL", "DISCARD ALL", None):
            with db.connection() as c:
                if command:
                    c.execute(command)
                else:
                    conn.execute("SELECT pg_terminate_backend(%s)", (c.info.backend_pid,))
                    # gone (its goodbye sent) before the next checkout looks at the socket
                    wait_for(lambda pid=c.info.backend_pid: conn.execute(
                        "SELECT count(*) AS n FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()["n"] == 0)
            ids += client.submit_ids("prep", [{"i": len(ids)}, {"i": len(ids) + 1}])
            ids += client.submit_ids("prep", [{"i": len(ids)}])
        with db.connection() as c:
            assert c.execute("SELECT count(*) AS n FROM pg_prepared_statements "
                             "WHERE name LIKE '\\_pys\\_%'").fetchone()["n"] == 2
        assert [client.get(rn).spec["i"] for rn in ids] == list(range(len(ids)))


def test_a_bad_key_is_refused_in_python_naming_its_place(client):
    """A key that is not a str, or holds a NUL, is refused before the call, naming its place in
    unique_keys or concurrency_keys; nothing of the batch is stored."""
    bad = {"unique_keys[1]": dict(unique_keys=["a", 7]), "unique_keys[0]": dict(unique_keys=["a\x00", None]),
           "concurrency_keys[2]": dict(concurrency_keys=[None, "é", b"k"])}
    for place, keys in bad.items():
        with pytest.raises(errors.InvalidArgument, match=re.escape(place)):
            client.submit_ids("badkey", [{}] * len(next(iter(keys.values()))), **keys)
    assert client.list("badkey") == []


def test_a_bulk_submits_keys_arrive_as_sent(client, dsn):
    """The keys go as one text[] literal built by pyscheduler (db.TextArray): what is stored is
    what was given, NULLs, multibyte characters and array syntax characters included, from the
    pool, the application's own connection and asyncio; keys with no quote, backslash or None
    (joined at once) too, "NULL" a key like any other."""
    keys = ["é€😀", None, '"{a,b}\\', "plain", "x y"]
    joined = ["é€😀", "NULL", "{a,b}", "x y", "p,q"]
    assert [client.get(rn).unique_key for rn in client.submit_ids("joined", [{}] * 5, unique_keys=joined)] == joined

    def send(on) -> list:
        return on.submit_ids("sent", [{"i": i} for i in range(5)], unique_keys=keys,
                             concurrency_keys=list(reversed(keys)))

    async def submit_async() -> list:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            return await AsyncTaskClient(aconn).submit_ids("sent", [{"i": i} for i in range(5)],
                                                           unique_keys=[k and k + "!" for k in keys])

    pool_ids = send(client)
    with psycopg.connect(dsn, autocommit=True) as app:
        app_ids = send(TaskClient(app))
    async_ids = asyncio.run(submit_async())
    assert [client.get(rn).spec for rn in pool_ids] == [{"i": i} for i in range(5)]
    assert [client.get(rn).unique_key for rn in pool_ids] == keys
    assert [client.get(rn).concurrency_key for rn in pool_ids] == list(reversed(keys))
    assert [a == b for a, b in zip(app_ids, pool_ids)] == [k is not None for k in keys]  # keyed: the live task
    assert [client.get(rn).unique_key for rn in async_ids] == [k and k + "!" for k in keys]
