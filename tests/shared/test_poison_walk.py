"""Stored values no reader can stop on: rows written before the SQL
boundary refused them, or by hand as a superuser. Every JSON value pyscheduler reads loads
through ``pyscheduler.db.load_json``: one nested deeper than MAX_JSON_DEPTH comes with its
deep part replaced by TOO_DEEP, so the task that holds it is listed, shown and handled like
its neighbours (it used to raise RecursionError in every reader). Then the daemon poison
walk: one stored value of each kind under every daemon and every dashboard page."""

from __future__ import annotations

import asyncio
import html
import urllib.parse
from datetime import timedelta

import psycopg
import pytest

from pyscheduler.db import MAX_JSON_DEPTH, TOO_DEEP, Jsonb
from pyscheduler.tasks import AsyncTaskClient, TaskClient, TaskContext, Worker
from pyscheduler.tasks.monitor import Monitor
from tests.support import wait_for
from tests.support.dashboard import Client, served, text_of

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


@pytest.mark.slow
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


@pytest.mark.slow
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
    app = make_app(login("pyscheduler_admin")[1])  # a login that sees the tasks' contents
    with served(app) as base:
        c = Client(base)
        status, _, page = c.get("/tasks?status=all&queue=poison")
        assert status == 200 and str(deep.rn)[:8] in page and str(plain.rn)[:8] in page
        status, _, page = c.get(f"/tasks/{deep.rn}")
        assert status == 200 and TOO_DEEP in text_of(page)
    app.close()


# ------------------------------------------------------------------ the daemon poison walk

WEIRD = {"bidi": "b\u202egnp.exe", "newline": "n\nX-Evil: 1", "zero-width": "z\u200bw\u2060j",
         "control": "c\x01\x07\x1b[31m\x7f\x9b"}  # names no SQL function lets in any more; no NUL
EARLY, LATE = "1970-01-01 00:00:00+00", "9998-12-31 23:59:59.999999+00"  # the edges of [1970, 9999)
HUGE = "jsonb_build_object('x', repeat('x', 5000000))"  # 5 MB: past every size limit
JOBS = """
CREATE TABLE public.walk_runs (slot timestamptz NOT NULL, ran timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION public.walk_job(c pyscheduler.future_check) RETURNS timestamptz
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    INSERT INTO public.walk_runs (slot) VALUES (c.next_check_at);
    RETURN greatest(c.next_check_at, now()) + interval '1 second';
END $$;
CREATE FUNCTION public.poison_job(c pyscheduler.future_check) RETURNS timestamptz
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$ SELECT NULL::timestamptz $$;
"""


# The poison items due that have not ended with a recorded outcome (yet): a message due since
# 1970 still stored, a schedule due with no execution, an SQL or Python check due with no
# history (a task check waits for its task).
ENDED_ALONE = """
SELECT id AS item FROM pyscheduler.delay_messages WHERE deadline < '9000-01-01'
UNION ALL
SELECT name FROM pyscheduler.schedules s WHERE NOT paused AND next_run_at < '9000-01-01'
    AND NOT EXISTS (SELECT FROM pyscheduler.schedule_executions e WHERE e.schedule_id = s.id)
UNION ALL
SELECT entity_key FROM pyscheduler.checks WHERE kind IN ('sql', 'python') AND next_check_at < '9000-01-01'
    AND entity_name <> 'walk'
"""


def _poison_tasks(db, conn) -> dict[str, str]:
    """Tasks for the Worker (queue walk), the monitor (expired leases, finished past
    retention) and the pages, each holding one poison value; -> name: rn."""
    client = TaskClient(db)
    rns: dict[str, str] = {}

    def task(name: str, queue: str, assignments: str = "", *params) -> str:
        rn = str(client.submit(queue, {"name": name}).rn)
        if assignments:
            store(conn, f"UPDATE pyscheduler.tasks SET {assignments} WHERE rn = %s", *params, rn)
        rns[name] = rn
        return rn

    # worked by the Worker: each must complete, the neighbours too
    for i in range(3):
        task(f"walk-neighbour-{i}", "walk")
    task("walk-deep-spec", "walk", "spec = %s::jsonb", DEEP_OBJECT)
    task("walk-huge-spec", "walk", f"spec = {HUGE}")
    task("walk-names-spec", "walk", "spec = %s::jsonb", Jsonb(WEIRD))
    # leases the monitor finds expired (a deadline of 1970), one of a neighbour
    worker = db.call_value("register_worker")
    for name in ("expired-neighbour", "expired-deep-spec", "expired-owner", "expired-queue"):
        task(name, "expired")
        db.call("lease_task", queue="expired", worker=worker, timeout=timedelta(minutes=5))
    store(conn, "UPDATE pyscheduler.tasks SET deadline = %s WHERE queue = 'expired'", EARLY)
    store(conn, "UPDATE pyscheduler.tasks SET spec = %s::jsonb WHERE rn = %s", DEEP_ARRAY, rns["expired-deep-spec"])
    store(conn, "UPDATE pyscheduler.tasks SET owner = %s WHERE rn = %s", WEIRD["control"], rns["expired-owner"])
    store(conn, "UPDATE pyscheduler.tasks SET queue = %s WHERE rn = %s", WEIRD["bidi"], rns["expired-queue"])
    # finished, shown on the pages (and one deleted by the monitor's cleanup: finished in 1970)
    for i, name in enumerate(("result", "errors", "history", "old")):
        rn = task(f"done-{name}", f"done-{i}")
        db.call("lease_task", queue=f"done-{i}", worker=worker)
        db.call("complete_task", rn=rn, token=db.query("SELECT lease_token FROM pyscheduler.tasks WHERE rn = %s",
                                                       (rn,))[0]["lease_token"])
    store(conn, "UPDATE pyscheduler.tasks SET result = %s::jsonb WHERE rn = %s", DEEP_ARRAY, rns["done-result"])
    store(conn, "UPDATE pyscheduler.tasks SET status = 'aborted', errors = jsonb_build_array(jsonb_build_object("
                "'code', %s::text, 'description', %s::text, 'args', %s::jsonb)) WHERE rn = %s",
          WEIRD["newline"], WEIRD["control"], DEEP_OBJECT, rns["done-errors"])
    store(conn, "UPDATE pyscheduler.tasks SET history = history || jsonb_build_array(jsonb_build_object("
                "'_typ', %s::text, 'time', '9998-12-31T23:59:59.999999Z', 'worker', %s::text, 'deep', %s::jsonb)) "
                "WHERE rn = %s", WEIRD["zero-width"], WEIRD["bidi"], DEEP_OBJECT, rns["done-history"])
    store(conn, "UPDATE pyscheduler.tasks SET updated = %s, created = %s WHERE rn = %s", EARLY, EARLY,
          rns["done-old"])
    # waiting for ever: runs in 9998
    task("scheduled-late", "later", "status = 'scheduled', run_at = %s", LATE)
    return rns


def _poison_schedules(db) -> list[str]:
    """A neighbour firing every second (a task target) and poison ones; -> their names."""
    from tests.support.schedules import create

    create(db, "nb-sched", every=1, target_kind="task", target="nb-sched", soon=True)
    names = []
    for kind, name in WEIRD.items():
        create(db, f"p-{kind}", every=1, target_kind="task", target="p-sched", soon=True)
        db.query("UPDATE pyscheduler.schedules SET name = %s, last_error = %s WHERE name = %s RETURNING id",
                 (name, WEIRD["control"], f"p-{kind}"))
        names.append(name)
    for name, assignments, params in (
            ("p-deep", "payload = %s::jsonb", (DEEP_OBJECT,)), ("p-huge", f"payload = {HUGE}", ()),
            ("p-early", "next_run_at = %s", (EARLY,)), ("p-late", "next_run_at = %s", (LATE,)),
            ("p-note", "paused = true, paused_note = %s", (WEIRD["control"],))):
        create(db, name, every=1, target_kind="task", target="p-sched", soon=True)
        db.query(f"UPDATE pyscheduler.schedules SET {assignments} WHERE name = %s RETURNING id", (*params, name))
        names.append(name)
    return names


def _poison_checks(db, conn) -> None:
    """A neighbour SQL job every second and poison checks of each kind."""
    with db.connection() as c:
        c.execute(JOBS)
    db.call("set_check_settings", resolution=timedelta(seconds=1))
    db.call("add_check", entity_name="walk", entity_key="nb", job="public.walk_job",
            check_after=timedelta(seconds=1), max_checks=1_000_000, horizon=timedelta(days=1))
    for kind, job in (("sql", "public.poison_job"), ("python", "poison_handler"), ("task", "p-check")):
        for j, (assignments, params) in enumerate((
                ("payload = %s::jsonb", (DEEP_OBJECT,)), (f"payload = {HUGE}", ()),
                ("entity_name = %s, entity_key = %s", (WEIRD["bidi"], WEIRD["newline"])),
                ("entity_key = %s", (WEIRD["zero-width"] + WEIRD["control"],)),
                ("next_check_at = %s", (EARLY,)), ("next_check_at = %s", (LATE,)))):
            key = f"{kind}-{j}"
            db.call("add_check", entity_name="poison", entity_key=key, job=job, kind=kind,
                    check_after=timedelta(seconds=1))
            store(conn, f"UPDATE pyscheduler.checks SET {assignments} WHERE entity_key = %s", *params, key)


def _poison_messages(conn) -> None:
    """Delayed messages stored as an old relay could have, due since 1970 but one."""
    for ident in WEIRD.values():
        store(conn, "INSERT INTO pyscheduler.delay_messages (id, deadline, value) VALUES (%s, %s, 'v')", ident, EARLY)
    store(conn, "INSERT INTO pyscheduler.delay_messages (id, deadline, value) VALUES ('delay-late', %s, 'v')", LATE)
    store(conn, "INSERT INTO pyscheduler.delay_messages (id, deadline, headers, value) VALUES "
                "('delay-deep-headers', %s, jsonb_build_array(jsonb_build_object('h', %s::jsonb)), 'v')",
          EARLY, DEEP_OBJECT)
    store(conn, "INSERT INTO pyscheduler.delay_messages (id, deadline, value) VALUES "
                "('delay-huge', %s, convert_to(repeat('x', 5000000), 'UTF8'))", EARLY)  # the broker refuses it


def _pages(tasks: dict[str, str], schedules: list[str]) -> list[str]:
    """Every page of the dashboard over the poison: lists, each poison task and schedule,
    filters by the names, and the confirmations that name them."""
    q = urllib.parse.quote
    pages = ["/", "/delay", "/schedules", "/schedules?paused=yes", "/schedules?target_kind=task", "/checks",
             "/checks?entity_name=poison", f"/checks?entity_name={q(WEIRD['bidi'])}", "/tasks?status=all"]
    pages += [f"/tasks?status={s}" for s in ("waiting", "scheduled", "ready", "running", "completed", "aborted",
                                              "cancelled")]
    pages += [f"/tasks?status=all&queue={q(WEIRD['bidi'])}", f"/tasks?status=all&owner={q(WEIRD['control'])}"]
    pages += [f"/tasks/{rn}" for name, rn in tasks.items() if name != "done-old"]  # (deleted by the monitor)
    pages += [f"/schedule?name={q(name)}" for name in schedules]
    pages += [f"/confirm/pause_schedule?name={q(name)}" for name in schedules]
    pages += [f"/confirm/pause_queue?queue={q(WEIRD['bidi'])}", f"/confirm/cancel_task?rn={tasks['scheduled-late']}",
              f"/confirm/delete_checks?entity_name={q(WEIRD['bidi'])}&entity_key={q(WEIRD['newline'])}"]
    return pages


def _send(sender, message_id: str, deadline, value: bytes) -> None:
    """One input message of the delay queue (its producer gone once sent)."""
    sender.send(message_id, deadline, value=value)
    sender.flush()


def _walk_pages(base: str, tasks: dict[str, str], schedules: list[str]) -> None:
    """Each page answers 200; one that filters by a name the input rule refuses (a name stored
    by hand, before the rule) answers 400 saying why, never 500."""
    client = Client(base)
    refused = [urllib.parse.quote(w) for w in WEIRD.values()]
    for page in _pages(tasks, schedules):
        status, _, body = client.get(page)
        if status == 400 and "?" in page and any(r in page.split("?", 1)[1] for r in refused):
            assert "must not" in html.unescape(body), (page, body[-2000:])
            continue
        assert status == 200, (page, status, body[-2000:])


@pytest.mark.slow
def test_daemon_poison_walk_every_daemon_and_page_goes_on(db, conn, dsn, login, kafka, redis_url, topic, tmp_path):
    """One stored value of each kind (JSON nested 3,000 deep, 5 MB values, names with
    bidirectional, newline, zero-width and control characters, instants at 1970 and 9998)
    under every daemon of ``pyscheduler run`` (delay relay, tasks monitor, schedules relay
    and executor, checks runner), a Worker, and every dashboard page: each neighbour is
    handled, no daemon crashes (so none restarts), no page answers 500."""
    from tests.support.delay import Output, Sender, utcnow
    from pyscheduler.dashboard import make_app
    from tests.support.ops import Process, samples

    tasks = _poison_tasks(db, conn)
    schedules = _poison_schedules(db)
    _poison_checks(db, conn)
    _poison_messages(conn)
    topics = {"in": topic("in"), "out": topic("out"), "dlq": topic("dlq")}
    env = {"PYSCHEDULER_DELAY_INPUT_TOPIC": topics["in"], "PYSCHEDULER_DELAY_OUTPUT_TOPIC": topics["out"],
           "PYSCHEDULER_DELAY_DLQ_TOPIC": topics["dlq"], "PYSCHEDULER_DELAY_GROUP_ID": topics["in"],
           "PYSCHEDULER_SCHEDULES_POLL_MS": "50", "PYSCHEDULER_CHECKS_TIMEOUT": "5s",
           "PYSCHEDULER_DASHBOARD_ALLOW_ACTIONS": "1"}
    run = Process(tmp_path / "run.log", "run", "--no-migrate", "--dsn", dsn, "--bootstrap-servers", kafka,
                  "--redis-url", redis_url, env=env)
    output = Output(kafka, topics["out"])
    done: list[str] = []

    def handle(ctx: TaskContext) -> None:
        assert isinstance(ctx.spec, dict)  # loaded (the deep one cut)
        done.append(ctx.rn)

    worker = Worker(dsn, "walk", handle).start()
    try:
        _send(Sender(kafka, topics["in"]), "delay-neighbour", utcnow() + timedelta(seconds=1), b"neighbour")

        def settled() -> bool:
            assert run.proc.poll() is None, run.text()[-5000:]
            status = {r["rn"]: r["status"] for r in db.query(
                "SELECT rn::text, status FROM pyscheduler.tasks WHERE rn = ANY(%s::uuid[])", (list(tasks.values()),))}
            return (all(status[tasks[n]] == "completed" for n in tasks if n.startswith("walk-"))  # the Worker
                    and all(status[tasks[n]] == "ready" for n in tasks if n.startswith("expired-"))  # the monitor
                    and tasks["done-old"] not in status  # the monitor's cleanup
                    and db.call_value("execution_count", name="nb-sched", outcome="fired") >= 3  # schedules
                    and conn.execute("SELECT count(*) AS n FROM public.walk_runs").fetchone()["n"] >= 3  # checks
                    and b"neighbour" in output.values()  # the delay relay
                    # and each poison item due ended alone, with its outcome recorded
                    and not db.query(ENDED_ALONE))

        wait_for(settled, timeout=90, interval=0.2)
        _walk_pages(run.url, tasks, schedules)  # pyscheduler run's dashboard: its monitor role
        admin = make_app(login("pyscheduler_admin")[1], allow_actions=True)  # sees every payload and target
        with served(admin) as base:
            _walk_pages(base, tasks, schedules)
        admin.close()
        series = samples(run.get("/metrics")[1])
        crashes = {k: v for k, v in series.items() if k.startswith("pyscheduler_daemon_crashes_total")}
        running = {k: v for k, v in series.items() if k.startswith("pyscheduler_daemon_running")}
        assert crashes and set(crashes.values()) == {0}, crashes
        assert running and set(running.values()) == {1}, running
        assert run.get("/readyz")[0] == 200
    finally:
        worker.stop()
        output.close()
        code = run.stop()
    text = run.text()
    assert code == 0 and " crashed" not in text and "Traceback" not in text, text[-6000:]
    assert sorted(done) == sorted(rn for name, rn in tasks.items() if name.startswith("walk-"))  # each once
