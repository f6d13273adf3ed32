"""Stored values no reader can stop on (issue 27, items 6 and D): rows written before the SQL
boundary refused them, or by hand as a superuser. Every JSON value pyscheduler reads loads
through ``pyscheduler.db.load_json``: one nested deeper than MAX_JSON_DEPTH comes with its
deep part replaced by TOO_DEEP, so the task that holds it is listed, shown and handled like
its neighbours (it used to raise RecursionError in every reader). Then the daemon poison
walk: one stored value of each kind under every daemon and every dashboard page."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from pyscheduler.db import MAX_JSON_DEPTH, TOO_DEEP, Jsonb
from pyscheduler.tasks import AsyncTaskClient, TaskClient, TaskContext, Worker
from pyscheduler.tasks.monitor import Monitor
from pyscheduler.tasks.worker import wait_for

from dashboard_support import served
from test_dashboard import Client, text_of

DEEP = 3000  # levels: json.loads stops at about 1,000
DEEP_OBJECT = '{"a": ' * DEEP + "1" + "}" * DEEP
DEEP_ARRAY = "[" * DEEP + "]" * DEEP


def depth_to_marker(value) -> int:
    """How many levels down ``value`` holds TOO_DEEP (following the first member each time)."""
    levels = 0
    while value != TOO_DEEP:
        value = next(iter(value.values())) if isinstance(value, dict) else value[0]
        levels += 1
    return levels


def store(conn, statement: str, *params) -> None:
    """Write as the superuser, past the SQL API (as a row stored before its rules)."""
    conn.execute(statement, params)


def test_a_task_whose_spec_result_or_errors_nest_too_deep_loads_cut_in_every_client(db, conn, dsn):
    """TaskClient.get and .list, on pyscheduler's pool, on the application's connection and
    asynchronously: the deep field comes cut at MAX_JSON_DEPTH (it raised RecursionError)."""
    client = TaskClient(db)
    deep_spec, deep_result, deep_errors, plain = (client.submit("poison", {"i": i}) for i in range(4))
    store(conn, "UPDATE pyscheduler.tasks SET spec = %s::jsonb WHERE rn = %s", DEEP_OBJECT, deep_spec.rn)
    store(conn, "UPDATE pyscheduler.tasks SET result = %s::jsonb WHERE rn = %s", DEEP_ARRAY, deep_result.rn)
    store(conn, "UPDATE pyscheduler.tasks SET errors = jsonb_build_array(jsonb_build_object('code', 'x', "
                "'description', 'deep', 'args', jsonb_build_object('v', %s::jsonb))) WHERE rn = %s",
          DEEP_OBJECT, deep_errors.rn)

    def check(got: dict, listed: list) -> None:
        assert depth_to_marker(got[deep_spec.rn].spec) == MAX_JSON_DEPTH - 1  # the task's JSON is level 1
        assert depth_to_marker(got[deep_result.rn].output) == MAX_JSON_DEPTH - 1
        assert depth_to_marker(got[deep_errors.rn].errors[0].args) == MAX_JSON_DEPTH - 3
        assert got[plain.rn].spec == {"i": 3}
        assert sorted(t.rn for t in listed) == sorted(t.rn for t in (deep_spec, deep_result, deep_errors, plain))

    rns = [deep_spec.rn, deep_result.rn, deep_errors.rn, plain.rn]
    check({rn: client.get(rn) for rn in rns}, client.list(queue="poison"))
    with psycopg.connect(dsn, autocommit=True) as app:  # the application's own connection
        on_app = TaskClient(app)
        check({rn: on_app.get(rn) for rn in rns}, on_app.list(queue="poison"))

    async def on_async() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            aclient = AsyncTaskClient(aconn)
            check({rn: await aclient.get(rn) for rn in rns}, await aclient.list(queue="poison"))

    asyncio.run(on_async())


def test_the_monitor_resets_every_expired_lease_one_with_a_spec_too_deep_too(db, conn):
    client = TaskClient(db)
    rns = [client.submit("poison", {"i": i}).rn for i in range(3)]
    worker = db.call_value("register_worker")
    for _ in rns:
        db.call("lease_task", queue="poison", worker=worker, timeout=timedelta(minutes=5))
    store(conn, "UPDATE pyscheduler.tasks SET spec = %s::jsonb WHERE rn = %s", DEEP_OBJECT, rns[1])
    store(conn, "UPDATE pyscheduler.tasks SET deadline = now() - interval '1 minute' WHERE queue = 'poison'")
    assert Monitor(db.dsn).reset_once(db) == 3
    assert [client.get(rn).status for rn in rns] == ["ready"] * 3


def test_a_child_reads_its_parents_results_one_too_deep_cut(db, conn, dsn):
    client = TaskClient(db)
    deep, plain = client.submit("parents", {"n": 1}), client.submit("parents", {"n": 2})
    child = client.submit("child", {}, after=[deep.rn, plain.rn])
    seen: list = []

    def parent(ctx: TaskContext):
        return ctx.spec["n"]

    def handler(ctx: TaskContext):
        seen.append(ctx.parents())

    running = Worker(dsn, "parents", parent).start()
    try:
        assert deep.result(timeout=30) == 1 and plain.result(timeout=30) == 2
    finally:
        running.stop()
    store(conn, "UPDATE pyscheduler.tasks SET result = %s::jsonb WHERE rn = %s", DEEP_ARRAY, deep.rn)
    running = Worker(dsn, "child", handler).start()
    try:
        child.result(timeout=30)
    finally:
        running.stop()
    [parents] = seen
    assert [p["rn"] for p in parents] == [str(deep.rn), str(plain.rn)]
    assert depth_to_marker(parents[0]["result"]) == MAX_JSON_DEPTH - 2 and parents[1]["result"] == 2


def test_the_dashboard_shows_a_task_too_deep_instead_of_failing(db, conn, login):
    from pyscheduler.dashboard import make_app

    client = TaskClient(db)
    deep, plain = client.submit("poison", {"i": 0}), client.submit("poison", {"i": 1})
    store(conn, "UPDATE pyscheduler.tasks SET spec = %s::jsonb, result = %s::jsonb WHERE rn = %s",
          DEEP_OBJECT, DEEP_ARRAY, deep.rn)
    app = make_app(login("pyscheduler_monitor")[1])
    with served(app) as base:
        c = Client(base)
        status, _, page = c.get("/tasks?status=all&queue=poison")
        assert status == 200 and str(deep.rn)[:8] in page and str(plain.rn)[:8] in page
        status, _, page = c.get(f"/tasks/{deep.rn}")
        assert status == 200 and TOO_DEEP in text_of(page)
    app.close()
