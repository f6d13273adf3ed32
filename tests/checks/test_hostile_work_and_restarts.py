"""Future checks against hostile clients, poison values and dependency restarts (design.md,
conventions A, B and C).

The two class tests are at the top: ``test_poison_catalogue_*`` (every client-writable field and
every value a job or a handler returns, each refused with a SQLSTATE or, if stored, a running
runner still runs a neighbouring check on time) and ``test_privilege_walk_*`` (a client tries to
make the runner do what it could not do itself). Then one test (or two) per item, named
``test_itemNN_...``.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import datetime, timedelta, timezone, tzinfo
from zoneinfo import ZoneInfo

import psycopg
import pytest
from psycopg.rows import dict_row

from tests.support.checks import Counting, Running, add_many, history, scrape, wait_history
from pyscheduler import errors
from pyscheduler.checks import Check, CheckRunner
from pyscheduler.checks.handlers import run_handler
from pyscheduler.db import Database, Jsonb
from tests.support import wait_for

UTC = timezone.utc

APP_SQL = """
CREATE SCHEMA app;
CREATE TABLE app.ran (entity_key text, job text, at timestamptz NOT NULL DEFAULT clock_timestamp());
GRANT USAGE ON SCHEMA app TO PUBLIC;
GRANT INSERT, SELECT ON app.ran TO PUBLIC;
-- returns payload.ret (a timestamptz literal; absent: NULL)
CREATE FUNCTION app.ret(c pyscheduler.future_check) RETURNS timestamptz
LANGUAGE plpgsql SECURITY DEFINER SET search_path = app, pg_temp AS $$
BEGIN
    INSERT INTO ran (entity_key, job) VALUES (c.entity_key, 'ret');
    RETURN (c.payload ->> 'ret')::timestamptz;
END $$;
"""


@pytest.fixture
def app(conn):
    conn.execute(APP_SQL)
    return conn


def ran(conn, job: str | None = None) -> Counter:
    rows = conn.execute("SELECT entity_key FROM app.ran WHERE %s::text IS NULL OR job = %s", (job, job)).fetchall()
    return Counter(r["entity_key"] for r in rows)


def sqlstate(conn, query, params=None) -> str:
    with pytest.raises(psycopg.Error) as info:
        conn.execute(query, params)
    return info.value.sqlstate


def at_next(db, seconds: float = 1.0) -> datetime:
    return db.call_one("check_slots")["clock"] + timedelta(seconds=seconds)


def add(db, key: str, job: str, kind: str = "sql", at: datetime | None = None, payload=None, entity="order",
        **more) -> int:
    return db.call_one("add_check", entity_name=entity, entity_key=key, job=job, kind=kind,
                       check_at=at or at_next(db), payload=None if payload is None else Jsonb(payload),
                       **more)["id"]


def pending(db, **filters) -> dict[int, dict]:
    return {r["id"]: r for r in db.call("list_checks", max=100_000, **filters)}


# =============================================================================================
# Class test: the poison catalogue
# =============================================================================================

TEN_MB = "repeat('x', 10 * 1024 * 1024)"
BIDI = "chr(8238)"  # U+202E RIGHT-TO-LEFT OVERRIDE
ZERO_WIDTH = "chr(8203)"  # U+200B
NON_UTF8 = "convert_from('\\xff'::bytea, 'UTF8')"

# (field, SQL expression): every client-writable argument of add_check with hostile values. Each
# is either refused with a SQLSTATE, or stored and then run next to a neighbour.
HOSTILE_ADDS = [
    ("entity_name", "NULL"), ("entity_name", "''"), ("entity_name", "' '"), ("entity_name", "'order '"),
    ("entity_name", "chr(0)"), ("entity_name", f"'or' || {BIDI} || 'der'"),
    ("entity_name", f"'or' || {ZERO_WIDTH} || 'der'"), ("entity_name", "'or' || chr(1) || 'der'"),
    ("entity_name", "'or' || chr(10) || 'der'"), ("entity_name", NON_UTF8), ("entity_name", TEN_MB),
    ("entity_key", "NULL"), ("entity_key", "''"), ("entity_key", "chr(0)"), ("entity_key", NON_UTF8),
    ("entity_key", TEN_MB), ("entity_key", f"'key-' || {BIDI} || chr(1) || chr(10) || %(i)s"),
    ("job", "NULL"), ("job", "''"), ("job", "chr(0)"), ("job", NON_UTF8), ("job", TEN_MB),
    ("job", f"'co' || {BIDI} || 'unt'"), ("job", "' count'"),
    ("kind", "NULL"), ("kind", "'shell'"), ("kind", "'SQL'"), ("kind", f"{BIDI} || 'python'"), ("kind", "chr(0)"),
    ("check_at", "'infinity'"), ("check_at", "'-infinity'"), ("check_at", "'0001-01-01 00:00+00'"),
    ("check_at", "'10000-01-01 00:00+00'"), ("check_at", "'294276-01-01 00:00+00'"),
    ("check_at", "'1969-12-31 23:59+00'"),
    ("check_after", "'-1 second'"), ("check_after", "'170000000 years'"), ("check_after", "'101 years'"),
    ("payload", f"to_jsonb({TEN_MB})"), ("payload", "'NaN'::jsonb"), ("payload", "'\"\\u0000\"'::jsonb"),
    ("payload", "'{\"n\": 1e400}'::jsonb"), ("payload", f"jsonb_build_object({BIDI}, chr(1) || {BIDI})"),
    ("max_checks", "0"), ("max_checks", "-1"), ("max_checks", "2147483647"),
    ("horizon", "'0'"), ("horizon", "'-1 day'"), ("horizon", "'300000 years'"), ("horizon", "'101 years'"),
]

# what a SQL job returns (app.ret returns payload.ret)
HOSTILE_SQL_RETURNS = ["infinity", "-infinity", "0001-01-01 00:00+00", "10000-01-01 00:00+00",
                       "294276-01-01 00:00+00", "1969-12-31 00:00+00"]


class _BadTz(tzinfo):  # a tzinfo whose offset raises
    def utcoffset(self, dt):
        raise RuntimeError("no offset today")


# what a Python handler returns (or raises)
HOSTILE_HANDLER_RETURNS = {
    "nan": float("nan"), "inf": float("inf"), "max": datetime.max.replace(tzinfo=UTC),
    "min+14": datetime.min.replace(tzinfo=timezone(timedelta(hours=14))), "naive": datetime(2030, 1, 1),
    "text": "tomorrow", "cancel": asyncio.CancelledError("cancelled"), "exit": SystemExit(3),
    "badtz": datetime(2030, 1, 1, tzinfo=_BadTz()), "nul-error": ValueError("a\x00b\udcff" * 5000),
}


def poison(check: Check):
    value = HOSTILE_HANDLER_RETURNS[check.entity_key]
    if isinstance(value, BaseException):
        raise value
    return value


@pytest.mark.slow
def test_poison_catalogue_every_hostile_value_is_refused_or_a_neighbour_still_runs_on_time(app, slots, running, dsn):
    at = at_next(slots, 1.5)
    refused, stored = {}, []
    for i, (field, expr) in enumerate(HOSTILE_ADDS):
        args = {"entity_name": "'order'", "entity_key": f"'hostile-{i}'", "job": "'count'", "kind": "'python'",
                "check_at": "%(at)s::timestamptz"}
        if field == "check_after":
            del args["check_at"]
        args[field] = expr.replace("%(i)s", f"'{i}'")
        query = "SELECT * FROM pyscheduler.add_check(" + ", ".join(f"{k} => {v}" for k, v in args.items()) + ")"
        try:
            row = app.execute(query, {"at": at}).fetchone()
        except psycopg.Error as exc:
            refused[(field, expr)] = exc.sqlstate
            continue
        stored.append(row["id"])
    # every refusal is a data error or a documented code, never a raw internal error
    assert all(code and (code[:2] in ("22", "23", "54") or code.startswith("PS")) for code in refused.values()), \
        refused
    assert refused[("check_at", "'infinity'")] == "PS403" and refused[("horizon", "'300000 years'")] == "PS408"
    assert refused[("payload", f"to_jsonb({TEN_MB})")] == "PS409"
    assert refused[("entity_name", f"'or' || {BIDI} || 'der'")] == "PS401"
    assert refused[("job", f"'co' || {BIDI} || 'unt'")] == "PS402"
    # a key is a label too (the input rule, issue 27 B): a bidi, control or newline character is refused
    assert refused[("entity_key", f"'key-' || {BIDI} || chr(1) || chr(10) || %(i)s")] == "PS401"
    assert len(stored) == 3, stored  # two odd payloads, max_checks 2147483647
    # stored: odd values returned at run time, by SQL jobs and Python handlers
    for i, ret in enumerate(HOSTILE_SQL_RETURNS):
        stored.append(add(slots, f"sql-{i}", "app.ret", at=at, payload={"ret": ret}))
    for key in HOSTILE_HANDLER_RETURNS:
        stored.append(add(slots, key, "poison", "python", at=at))
    neighbours = [add(slots, "neighbour-sql", "app.ret", at=at), add(slots, "neighbour-py", "count", "python", at=at)]
    running.start(CheckRunner(dsn, {"count": Counting(), "poison": poison}, batch=7, timeout=5))
    ended = wait_history(slots, len(stored) + len(neighbours))
    assert running.alive()
    for cid in neighbours:  # on time: in the slot's own pass, not one retried later
        assert ended[cid]["outcome"] == "done"
        assert ended[cid]["ended"] - ended[cid]["last_check_at"] < timedelta(seconds=5)
    outcomes = {ended[cid]["entity_key"]: (ended[cid]["outcome"], ended[cid]["error"]) for cid in stored}
    for i in range(len(HOSTILE_SQL_RETURNS)):
        assert outcomes[f"sql-{i}"][0] == "error" and "outside" in outcomes[f"sql-{i}"][1]
    for key in HOSTILE_HANDLER_RETURNS:
        assert outcomes[key][0] == "error", (key, outcomes[key])
    assert len(outcomes["nul-error"][1]) <= 2000 and "\x00" not in outcomes["nul-error"][1]
    assert {o for o, _ in outcomes.values()} == {"done", "error"} and not pending(slots)


# =============================================================================================
# Class test: the privilege walk
# =============================================================================================

ADMIN_SQL = """
CREATE SCHEMA admin_s;
CREATE TABLE admin_s.secrets (v text);
-- a job only the admin may run: a client must not get the runner to run it
CREATE FUNCTION admin_s.secret(c pyscheduler.future_check) RETURNS timestamptz
LANGUAGE plpgsql SECURITY DEFINER SET search_path = admin_s, pg_temp AS $$
BEGIN
    INSERT INTO secrets VALUES ('ran for ' || c.entity_key);
    RETURN NULL;
END $$;
REVOKE EXECUTE ON FUNCTION admin_s.secret(pyscheduler.future_check) FROM PUBLIC;
GRANT USAGE ON SCHEMA admin_s TO PUBLIC;
"""

# the client's own schema: a job that tries everything, and functions named like pyscheduler's
# private ones, for a search_path that puts this schema first
EVIL_SQL = """
CREATE TABLE evil.ran_as (who name, superuser boolean);
CREATE TABLE evil.seen (entity_key text, payload jsonb, error text);
CREATE TABLE evil.tried (what text, sqlstate text);
CREATE FUNCTION evil.escalate() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO evil.ran_as SELECT current_user, (SELECT rolsuper FROM pg_roles WHERE rolname = current_user);
    EXECUTE format('ALTER ROLE %I SUPERUSER', '{alice}');
END $$;
-- pyscheduler's private helpers, as an unqualified call after the job would find them
CREATE FUNCTION evil._finish_checks(bigint[], timestamptz[], text[], boolean[], interval[], uuid[], timestamptz)
RETURNS TABLE (id bigint, outcome text, next_check_at timestamptz) LANGUAGE plpgsql AS $$
BEGIN PERFORM evil.escalate(); END $$;
CREATE FUNCTION evil._end_checks(bigint[], text[], text[], interval[], boolean, timestamptz) RETURNS integer
LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.escalate(); RETURN 0; END $$;
CREATE FUNCTION evil._setting(text) RETURNS text
LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.escalate(); RETURN NULL; END $$;
CREATE FUNCTION evil._instant_ok(timestamptz) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN PERFORM evil.escalate(); RETURN true; END $$;
CREATE FUNCTION evil.sneaky(c pyscheduler.future_check) RETURNS timestamptz
LANGUAGE plpgsql SECURITY DEFINER SET search_path = evil, pg_temp AS $$
DECLARE
    r record;
BEGIN
    -- see what the runner's identity would show: another client's payload and errors
    FOR r IN SELECT * FROM pyscheduler.list_checks(entity_name => 'bob') LOOP
        INSERT INTO seen VALUES (r.entity_key, r.payload, NULL);
    END LOOP;
    FOR r IN SELECT * FROM pyscheduler.check_history(entity_name => 'bob') LOOP
        INSERT INTO seen VALUES (r.entity_key, r.payload, r.error);
    END LOOP;
    -- delete another client's checks as the runner
    BEGIN
        INSERT INTO tried
        VALUES ('delete bob', pyscheduler.delete_checks(entity_name => 'bob', entity_key => 'b1')::text);
    EXCEPTION WHEN OTHERS THEN INSERT INTO tried VALUES ('delete bob', SQLSTATE);
    END;
    -- have the runner add a check of a job this role may not execute
    BEGIN
        PERFORM pyscheduler.add_check(entity_name => 'alice', entity_key => 'x', job => 'admin_s.secret',
                                      check_after => '0 seconds');
        INSERT INTO tried VALUES ('add secret', 'added');
    EXCEPTION WHEN OTHERS THEN INSERT INTO tried VALUES ('add secret', SQLSTATE);
    END;
    -- and redirect whatever pyscheduler calls next, and leave the session in odd settings
    PERFORM set_config('search_path', 'evil, pyscheduler, pg_catalog, public', false),
            set_config('DateStyle', 'German', false), set_config('TimeZone', 'Asia/Kathmandu', false);
    RETURN NULL;
END $$;
CREATE FUNCTION evil.unpinned(c pyscheduler.future_check) RETURNS timestamptz
LANGUAGE sql SECURITY DEFINER AS 'SELECT NULL::timestamptz';
"""


@pytest.mark.slow
def test_privilege_walk_a_client_cannot_make_the_runner_do_what_it_could_not_do_itself(app, conn, login, slots,
                                                                                      running, dsn):
    conn.execute(ADMIN_SQL)
    alice, alice_dsn = login("pyscheduler_client")
    bob, bob_dsn = login("pyscheduler_client")
    monitor, monitor_dsn = login("pyscheduler_monitor")
    conn.execute(f'CREATE SCHEMA evil AUTHORIZATION "{alice}"')
    with psycopg.connect(alice_dsn, autocommit=True, row_factory=dict_row) as a:
        a.execute(EVIL_SQL.replace("{alice}", alice))
    with Database(alice_dsn, max_size=1) as as_alice, Database(bob_dsn, max_size=1) as as_bob, \
            Database(monitor_dsn, max_size=1) as as_monitor:
        at = at_next(slots, 1.5)
        # a job the client may not execute: refused at add
        with pytest.raises(errors.PermissionDenied):
            add(as_alice, "1", "admin_s.secret", entity="alice", at=at)
        # a job without its own search_path (the next job's names would be the previous one's): refused
        with pytest.raises(errors.InvalidJob):
            add(as_alice, "1", "evil.unpinned", entity="alice", at=at)
        # an admin's job granted to the client, revoked before it runs: refused at run time
        conn.execute(f'GRANT EXECUTE ON FUNCTION admin_s.secret(pyscheduler.future_check) TO "{alice}"')
        revoked = add(as_alice, "revoked", "admin_s.secret", entity="alice", at=at)
        conn.execute(f'REVOKE EXECUTE ON FUNCTION admin_s.secret(pyscheduler.future_check) FROM "{alice}"')
        # bob's checks: one pending far ahead with a secret payload, one that fails with a secret error
        bob_pending = add(as_bob, "b1", "count", "python", entity="bob", at=at + timedelta(hours=1),
                          payload={"secret": "bob's"})
        bob_failing = add(as_bob, "b2", "boom", "python", entity="bob", at=at, payload={"secret": "bob's"})
        # another role's pending check is not the client's to share
        with pytest.raises(errors.PermissionDenied):
            add(as_alice, "b1", "count", "python", entity="bob", at=at)
        sneaky = add(as_alice, "s1", "evil.sneaky", entity="alice", at=at)
        neighbour = add(slots, "n1", "app.ret", at=at)

        def boom(check):
            raise RuntimeError("bob's secret error")

        running.start(CheckRunner(dsn, {"count": Counting(), "boom": boom}))
        ended = wait_for(lambda: {sneaky, revoked, bob_failing, neighbour} <= set(h := history(slots)) and h,
                         timeout=30)
        # the runner kept its identity and its environment: the client's functions never ran as it
        assert not conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (alice,)).fetchone()["rolsuper"]
        assert conn.execute("SELECT count(*) AS n FROM evil.ran_as").fetchone()["n"] == 0
        assert ended[sneaky]["outcome"] == "done" and ended[neighbour]["outcome"] == "done"
        # the job acted as its client: it could not delete, read or add what the client could not
        tried = {r["what"]: r["sqlstate"] for r in conn.execute("SELECT * FROM evil.tried")}
        assert tried == {"delete bob": "0", "add secret": "42501"}
        assert pending(slots, entity_name="bob").keys() == {bob_pending}
        assert conn.execute("SELECT count(*) AS n FROM admin_s.secrets").fetchone()["n"] == 0
        assert ended[revoked]["outcome"] == "error" and "may not execute" in ended[revoked]["error"]
        seen = conn.execute("SELECT * FROM evil.seen").fetchall()
        assert {r["entity_key"] for r in seen} >= {"b1"} and all(r["payload"] is None and r["error"] is None
                                                                for r in seen)
        # directly, the same: bob's checks are bob's
        assert as_alice.call_value("delete_checks", entity_name="bob", entity_key="b1") == 0
        assert pending(as_bob, entity_name="bob")[bob_pending]["payload"] == {"secret": "bob's"}
        assert pending(as_alice, entity_name="bob")[bob_pending]["payload"] is None
        assert pending(as_monitor, entity_name="bob")[bob_pending]["payload"] is None
        assert history(as_bob, entity_name="bob")[bob_failing]["error"].endswith("bob's secret error")
        theirs = history(as_alice, entity_name="bob")[bob_failing]
        assert theirs["error"] is None and theirs["payload"] is None and theirs["owner"] == bob
        assert history(slots, entity_name="bob")[bob_failing]["error"]  # the admin sees everything
        with pytest.raises(errors.PermissionDenied):
            as_monitor.call("delete_checks", entity_name="bob", entity_key="b1")
        assert as_bob.call_value("delete_checks", entity_name="bob", entity_key="b1") == 1


# =============================================================================================
# The items
# =============================================================================================

@pytest.mark.slow
def test_item01_a_job_that_puts_its_schema_first_in_search_path_cannot_run_its_functions_as_pyscheduler(
        app, conn, login, slots, running, dsn):
    alice, alice_dsn = login("pyscheduler_client")
    conn.execute(ADMIN_SQL)
    conn.execute(f'CREATE SCHEMA evil AUTHORIZATION "{alice}"')
    with psycopg.connect(alice_dsn, autocommit=True) as a:
        a.execute(EVIL_SQL.replace("{alice}", alice))
    with Database(alice_dsn, max_size=1) as as_alice:
        at = at_next(slots)
        ids = [add(as_alice, f"s{i}", "evil.sneaky", entity="alice", at=at) for i in range(3)]
    ids += [add(slots, "after", "app.ret", at=at), add(slots, "py", "count", "python", at=at)]
    running.start(CheckRunner(dsn, {"count": Counting()}))

    def escalated() -> int:
        return conn.execute("SELECT count(*) AS n FROM evil.ran_as").fetchone()["n"]

    wait_for(lambda: escalated() or len(history(slots)) == len(ids), timeout=30)
    assert escalated() == 0
    assert not conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (alice,)).fetchone()["rolsuper"]
    assert {h["outcome"] for h in history(slots).values()} == {"done"}


@pytest.mark.slow
def test_item02_a_job_the_adder_may_not_execute_is_refused_when_added_and_when_run(app, conn, login, slots, running,
                                                                                    dsn):
    conn.execute(ADMIN_SQL)
    alice, alice_dsn = login("pyscheduler_client")
    with Database(alice_dsn, max_size=1) as as_alice:
        with pytest.raises(errors.PermissionDenied) as info:
            add(as_alice, "1", "admin_s.secret")
        assert info.value.sqlstate == "42501" and "may not execute" in str(info.value)
        conn.execute(f'GRANT EXECUTE ON FUNCTION admin_s.secret(pyscheduler.future_check) TO "{alice}"')
        cid = add(as_alice, "1", "admin_s.secret")
        conn.execute(f'REVOKE EXECUTE ON FUNCTION admin_s.secret(pyscheduler.future_check) FROM "{alice}"')
    assert slots.call_one("list_checks")["owner"] == alice
    running.start(CheckRunner(dsn, {}))
    ended = wait_history(slots, 1)
    assert ended[cid]["outcome"] == "error" and "may not execute" in ended[cid]["error"]
    assert conn.execute("SELECT count(*) AS n FROM admin_s.secrets").fetchone()["n"] == 0


@pytest.mark.slow
def test_item03_a_task_check_its_task_cannot_carry_ends_alone_and_the_runner_goes_on(slots, conn, running, dsn):
    with pytest.raises(errors.InvalidArgument) as info:  # beyond max_payload_bytes
        add(slots, "huge", "slow-checks", "task", payload={"x": "y" * 70_000})
    assert info.value.sqlstate == "PS409"
    conn.execute("UPDATE pyscheduler.settings SET value = '3000' WHERE name = 'task_max_spec_bytes'")
    with pytest.raises(errors.InvalidArgument) as info:  # more than a task's spec may be
        add(slots, "big", "slow-checks", "task", payload={"x": "y" * 5000})
    assert info.value.sqlstate == "PS409"
    conn.execute("UPDATE pyscheduler.settings SET value = '1048576' WHERE name = 'task_max_spec_bytes'")
    at = at_next(slots)
    big = add(slots, "big", "slow-checks", "task", at=at, payload={"x": "y" * 5000})
    small = add(slots, "small", "slow-checks", "task", at=at)
    py = add(slots, "py", "count", "python", at=at)
    # the admin lowers the limit afterwards: the stored check cannot become a task any more
    conn.execute("UPDATE pyscheduler.settings SET value = '3000' WHERE name = 'task_max_spec_bytes'")
    running.start(CheckRunner(dsn, {"count": Counting()}))
    ended = wait_history(slots, 2)
    assert ended[big]["outcome"] == "error" and "task_max_spec_bytes" in ended[big]["error"]
    assert ended[py]["outcome"] == "done"
    wait_for(lambda: slots.call("list_tasks", queue="slow-checks"), timeout=10)  # small became a task
    assert list(pending(slots)) == [small] and running.alive()


@pytest.mark.slow
def test_item04_a_job_returning_infinity_or_a_year_past_9999_ends_alone(app, slots, running, dsn):
    at = at_next(slots)
    bad = {ret: add(slots, ret, "app.ret", at=at, payload={"ret": ret})
           for ret in ("infinity", "-infinity", "294276-01-01 00:00+00", "10000-01-01 00:00+00")}
    ok = add(slots, "ok", "app.ret", at=at)
    again = add(slots, "again", "app.ret", at=at, payload={"ret": "2100-01-01 00:00+00"}, horizon=timedelta(days=30000))
    py = add(slots, "py", "count", "python", at=at)
    running.start(CheckRunner(dsn, {"count": Counting()}))
    ended = wait_history(slots, 6)
    assert {ended[i]["outcome"] for i in bad.values()} == {"error"}
    assert all("outside [1970-01-01, 9999-01-01)" in ended[i]["error"] for i in bad.values())
    assert ended[ok]["outcome"] == ended[py]["outcome"] == "done"
    assert pending(slots)[again]["check_count"] == 1  # and a far but valid time is kept
    assert running.alive()


STUBBORN_SQL = """
CREATE FUNCTION app.stubborn(c pyscheduler.future_check) RETURNS timestamptz
LANGUAGE plpgsql SECURITY DEFINER SET search_path = app, pg_temp AS $$
BEGIN
    LOOP
        BEGIN
            PERFORM pg_sleep(60);
        EXCEPTION WHEN query_canceled THEN
            NULL;  -- the statement timeout's cancel: ignored
        END;
    END LOOP;
END $$;
"""


@pytest.mark.slow
def test_item05_a_job_that_catches_the_cancel_is_ended_by_the_watchdog_and_its_neighbours_run(app, slots, dsn):
    app.execute(STUBBORN_SQL)
    at = at_next(slots)
    stubborn = add(slots, "stubborn", "app.stubborn", at=at)
    ok = [add(slots, f"ok{i}", "app.ret", at=at) for i in range(3)]
    py = add(slots, "py", "count", "python", at=at)
    runner = CheckRunner(dsn, {"count": Counting()}, timeout=0.5, grace=1.0)
    run = Running()
    run.start(runner)
    try:
        ended = wait_history(slots, 5, timeout=30)
        assert ended[stubborn]["outcome"] == "timeout" and "terminated" in ended[stubborn]["error"]
        assert {ended[i]["outcome"] for i in ok + [py]} == {"done"}
        assert ran(app)["ok0"] == 1  # the runs in the batches the watchdog ended were rolled back
        # and a stop request is not ignored while a job hangs: the watchdog bounds it
        again = add(slots, "again", "app.stubborn")
        wait_for(lambda: app.execute("SELECT count(*) AS n FROM pg_stat_activity WHERE wait_event = 'PgSleep' "
                                     "AND datname = current_database()").fetchone()["n"] > 0, timeout=10)
        started = time.monotonic()
        run.stop.set()
        run.threads[0].join(10)
        assert not run.threads[0].is_alive() and time.monotonic() - started < 5
        assert again in pending(slots)  # its batch was lost, not recorded: the next runner takes it again
    finally:
        run.close()


@pytest.mark.slow
def test_item06_a_handler_raising_a_base_exception_ends_alone_once(slots, running, dsn):
    calls: Counter = Counter()
    raised = {"cancel": asyncio.CancelledError("cancelled"), "exit": SystemExit(3), "kbd": KeyboardInterrupt(),
              "gen": GeneratorExit()}

    def raising(check: Check):
        calls[check.entity_key] += 1
        raise raised[check.entity_key]

    at = at_next(slots)
    ids = {key: add(slots, key, "raising", "python", at=at) for key in raised}
    counting = Counting()
    neighbours = [add(slots, f"n{i}", "count", "python", at=at) for i in range(3)]
    running.start(CheckRunner(dsn, {"raising": raising, "count": counting}))
    ended = wait_history(slots, 7)
    assert {key: ended[i]["outcome"] for key, i in ids.items()} == dict.fromkeys(raised, "error")
    assert "CancelledError" in ended[ids["cancel"]]["error"] and "SystemExit" in ended[ids["exit"]]["error"]
    assert {ended[i]["outcome"] for i in neighbours} == {"done"} and set(counting.calls.values()) == {1}
    assert calls == dict.fromkeys(raised, 1)  # once each: not re-run


@pytest.mark.slow
def test_item07_slot_arithmetic_is_utc_whatever_the_session_time_zone(slots, conn, login, running, dsn):
    # what check_slots() gives a Europe/Berlin session at the autumn change (02:59:59 CEST -> 02:00 CET):
    # the last slot was 00:45 UTC (02:45 CEST), the current one is 01:00 UTC (02:00 CET)
    from pyscheduler.checks.runner import next_step  # (new: the old runner did this inline, in the session's zone)

    berlin = ZoneInfo("Europe/Berlin")
    last = datetime(2024, 10, 27, 0, 45, tzinfo=UTC).astimezone(berlin)
    slot = datetime(2024, 10, 27, 1, 0, tzinfo=UTC).astimezone(berlin)
    clock = datetime(2024, 10, 27, 1, 0, 5, tzinfo=UTC).astimezone(berlin)
    assert last.utcoffset() == timedelta(hours=2) and slot.utcoffset() == timedelta(hours=1)
    assert next_step(last, slot, clock, timedelta(minutes=15)) == ("run", datetime(2024, 10, 27, 1, 0, tzinfo=UTC))
    early = datetime(2024, 10, 27, 0, 59, 55, tzinfo=UTC).astimezone(berlin)  # 02:59:55 CEST
    assert next_step(last, last, early, timedelta(minutes=15)) == ("wait", 5.0)
    # and a runner whose role sets a DST zone works in UTC
    name, runner_dsn = login("pyscheduler_checker")
    conn.execute(f"ALTER ROLE \"{name}\" SET TimeZone = 'Europe/Berlin'")
    ids = add_many(slots, 2, "count", "python")
    runner = running.start(CheckRunner(runner_dsn, {"count": Counting()}))
    wait_history(slots, 2)
    assert runner.slots_done.wait(10) and runner.last_slot.utcoffset() == timedelta(0)
    assert set(history(slots)) == set(ids)


DELETER_SQL = """
-- the seed's pattern: when the entity needs no more checking, delete its future checks
CREATE FUNCTION app.deleter(c pyscheduler.future_check) RETURNS timestamptz
LANGUAGE plpgsql SECURITY DEFINER SET search_path = app, pg_temp AS $$
BEGIN
    INSERT INTO ran (entity_key, job) VALUES (c.entity_key, 'deleter');
    PERFORM pyscheduler.delete_checks(entity_name => c.entity_name, entity_key => c.entity_key);
    RETURN NULL;
END $$;
"""


@pytest.mark.slow
def test_item08_a_job_deleting_its_entitys_checks_stops_the_rest_of_its_batch(app, slots, running, dsn):
    app.execute(DELETER_SQL)
    at = at_next(slots)
    deleter = add(slots, "1", "app.deleter", at=at)
    sql_after = add(slots, "1", "app.ret", at=at)  # the same entity, a later set of jobs
    py_after = add(slots, "1", "count", "python", at=at)
    other_sql = add(slots, "2", "app.ret", at=at)  # another entity: runs
    other_py = add(slots, "2", "count", "python", at=at)
    counting = Counting()
    running.start(CheckRunner(dsn, {"count": counting}))
    ended = wait_history(slots, 5)
    assert (ended[deleter]["outcome"], ended[deleter]["check_count"]) == ("done", 1)
    for cid in (sql_after, py_after):
        assert (ended[cid]["outcome"], ended[cid]["check_count"]) == ("deleted", 0)
    assert ran(app, "ret") == {"2": 1} and set(counting.calls) == {other_py}
    assert ended[other_sql]["outcome"] == ended[other_py]["outcome"] == "done"


def test_run_due_checks_counts_outcomes_per_job_with_deleted_and_task_ones(app):
    """job_outcomes (what the runner's pyscheduler_checks_outcomes{job,outcome} counts): per job, the
    SQL jobs' results, task jobs handed over, and checks a job of the batch deleted before they ran."""
    app.execute(DELETER_SQL)
    past = datetime.now(UTC) - timedelta(hours=1)

    def old(key: str, job: str, kind: str = "sql") -> int:
        return app.execute("SELECT id FROM pyscheduler._add_check('order', %s, %s, %s, %s, NULL, NULL, NULL, NULL, "
                           "%s)", (key, job, kind, past, past - timedelta(hours=1))).fetchone()["id"]

    old("1", "app.deleter")
    old("1", "app.ret")  # deleted by the deleter before it ran
    old("1", "count", "python")  # the same
    old("2", "app.ret")
    py = old("2", "count", "python")
    old("2", "checks-q", "task")
    with app.transaction():
        batch = app.execute("SELECT * FROM pyscheduler.run_due_checks()").fetchone()
        assert batch["taken"] == 6 and [c[0] for c in batch["checks"]] == [py]  # left to run in Python
        assert batch["job_outcomes"] == {"app.deleter": {"done": 1}, "app.ret": {"deleted": 1, "done": 1},
                                         "count": {"deleted": 1}, "checks-q": {"task": 1}}
        assert batch["outcomes"] == {"done": 2, "deleted": 2, "task": 1}


class Gate:
    """A Python handler that blocks until released, and says when it started."""

    def __init__(self, returns=None):
        self.started, self.release, self.returns = threading.Event(), threading.Event(), returns

    def __call__(self, check: Check):
        self.started.set()
        assert self.release.wait(30)
        return self.returns(check) if self.returns else None


@pytest.mark.slow
def test_item09_an_add_while_a_runner_holds_the_check_is_kept_not_lost(slots, running, dsn):
    gate = Gate()
    old = add(slots, "9", "held", "python")
    running.start(CheckRunner(dsn, {"held": gate}, timeout=60))
    assert gate.started.wait(30)
    again = slots.call_one("add_check", entity_name="order", entity_key="9", job="held", kind="python",
                           check_after=timedelta(hours=1), payload=Jsonb({"v": 2}))
    assert again["added"] is None and again["id"] == old  # not added yet, and not lost
    gate.release.set()
    wait_history(slots, 1)
    new = wait_for(lambda: pending(slots), timeout=10)
    ((nid, row),) = new.items()
    assert nid != old and row["payload"] == {"v": 2} and row["next_check_at"] == again["next_check_at"]
    assert history(slots)[old]["outcome"] == "done"


@pytest.mark.slow
def test_item09_an_add_while_the_run_reschedules_the_check_changes_nothing(slots, running, dsn):
    gate = Gate(returns=lambda check: check.next_check_at + timedelta(hours=2))
    old = add(slots, "9", "held", "python")
    running.start(CheckRunner(dsn, {"held": gate}, timeout=60))
    assert gate.started.wait(30)
    assert slots.call_one("add_check", entity_name="order", entity_key="9", job="held", kind="python",
                          check_after=timedelta(hours=1))["added"] is None
    gate.release.set()
    wait_for(lambda: pending(slots).get(old, {}).get("check_count") == 1, timeout=10)
    assert list(pending(slots)) == [old] and not history(slots)  # still the one pending check
    assert slots.query("SELECT count(*) AS n FROM pyscheduler.check_requests")[0]["n"] == 0


@pytest.mark.slow
def test_item10_delete_checks_never_waits_for_a_runner_and_a_check_not_started_does_not_run(slots, running, dsn):
    gate = Gate(returns=lambda check: check.next_check_at + timedelta(hours=1))
    counting = Counting()
    at = at_next(slots)
    first = add(slots, "k0", "hold", "python", at=at)
    later = [add(slots, f"k{i}", "count", "python", at=at) for i in (1, 2)]
    runner = running.start(CheckRunner(dsn, {"hold": gate, "count": counting}, timeout=60))
    assert gate.started.wait(30)  # the batch holds all three now
    with psycopg.connect(dsn, autocommit=True, options="-c statement_timeout=3000") as client:
        started = time.monotonic()
        assert client.execute("SELECT pyscheduler.delete_checks(entity_name => 'order', entity_key => 'k2')"
                              ).fetchone()[0] == 1
        assert client.execute("SELECT pyscheduler.delete_checks(entity_name => 'order', entity_key => 'k0')"
                              ).fetchone()[0] == 1
        assert time.monotonic() - started < 1.5
    assert set(pending(slots)) == {later[0]}  # k0 and k2 are on their way out
    wait_for(lambda: runner.counts.get("deleted") == 1, timeout=10)  # k2 ended before it started
    gate.release.set()
    ended = wait_history(slots, 3)
    assert (ended[later[1]]["outcome"], ended[later[1]]["check_count"]) == ("deleted", 0)
    assert later[1] not in counting.calls and ended[later[0]]["outcome"] == "done"
    assert (ended[first]["outcome"], ended[first]["check_count"]) == ("deleted", 1)  # ran, then deleted
    assert not pending(slots)


MESSY_SQL = """
-- leaves the session in settings the runner cannot live with, for good (set_config(..., false))
CREATE FUNCTION app.messy(c pyscheduler.future_check) RETURNS timestamptz
LANGUAGE plpgsql SECURITY DEFINER SET search_path = app, pg_temp AS $$
BEGIN
    PERFORM set_config('DateStyle', 'German', false), set_config('IntervalStyle', 'iso_8601', false),
            set_config('TimeZone', 'America/St_Johns', false), set_config('statement_timeout', '1', false),
            set_config('lock_timeout', '1', false), set_config('idle_in_transaction_session_timeout', '1', false),
            set_config('default_transaction_read_only', 'on', false), set_config('bytea_output', 'escape', false);
    RETURN NULL;
END $$;
CREATE FUNCTION app.readonly(c pyscheduler.future_check) RETURNS timestamptz
LANGUAGE plpgsql SECURITY DEFINER SET search_path = app, pg_temp AS $$
BEGIN
    PERFORM set_config('transaction_read_only', 'on', false);
    RETURN NULL;
END $$;
"""


@pytest.mark.slow
def test_item11_the_roles_or_a_jobs_session_settings_never_stop_the_runner(app, conn, login, slots, running, dsn):
    app.execute(MESSY_SQL)
    name, runner_dsn = login("pyscheduler_checker")
    conn.execute(f"ALTER ROLE \"{name}\" SET DateStyle = 'German'")
    conn.execute(f"ALTER ROLE \"{name}\" SET IntervalStyle = 'iso_8601'")
    at = at_next(slots)
    first = [add(slots, "messy", "app.messy", at=at), add(slots, "py", "count", "python", at=at),
             add(slots, "ok", "app.ret", at=at)]
    readonly = add(slots, "readonly", "app.readonly", at=at)
    later = [add(slots, "py2", "count", "python", at=at + timedelta(seconds=1)),
             add(slots, "ok2", "app.ret", at=at + timedelta(seconds=1),
                 payload={"ret": (at + timedelta(hours=1)).isoformat()})]
    running.start(CheckRunner(runner_dsn, {"count": Counting()}))
    ended = wait_for(lambda: set(first + [readonly, later[0]]) <= set(h := history(slots)) and h, timeout=30)
    assert {ended[i]["outcome"] for i in first + [later[0]]} == {"done"}
    assert ended[readonly]["outcome"] == "error" and "PS003" in ended[readonly]["error"]  # alone
    wait_for(lambda: pending(slots).get(later[1], {}).get("check_count") == 1, timeout=10)  # rescheduled
    assert running.alive()


@pytest.mark.slow
def test_item12_the_history_is_purged_after_its_retention(slots, conn, running, dsn):
    ids = [add(slots, f"k{i}", "count", "python") for i in range(5)]
    assert slots.call_value("delete_checks", entity_name="order", entity_key="k0") == 1
    for i in range(1, 5):
        slots.call("delete_checks", entity_name="order", entity_key=f"k{i}")
    conn.execute("UPDATE pyscheduler.check_history SET ended = now() - interval '31 days' WHERE id = ANY(%s)",
                 (ids[:3],))
    assert conn.execute("SELECT pyscheduler._purge_check_history(2, now()) AS n").fetchone()["n"] == 2
    assert conn.execute("SELECT pyscheduler._purge_check_history(2, now()) AS n").fetchone()["n"] == 1
    assert set(history(slots)) == set(ids[3:])
    # the runner purges on its own, with the retention set
    assert slots.call_one("set_check_settings", history_retention=timedelta(seconds=1))["history_retention"] \
        == timedelta(seconds=1)
    running.start(CheckRunner(dsn, {}, purge_interval=0.2))
    wait_for(lambda: not history(slots), timeout=15)
    with pytest.raises(errors.InvalidArgument):
        slots.call("purge_check_history", batch=0)


def test_item13_values_that_gave_raw_errors_get_documented_codes(tx):
    cases = [
        ("SELECT * FROM pyscheduler.add_check(entity_name => 'o', entity_key => '1', job => 'j', kind => 'python', "
         "check_at => 'infinity')", "PS403"),
        ("SELECT * FROM pyscheduler.add_check(entity_name => 'o', entity_key => '1', job => 'j', kind => 'python', "
         "check_after => '170000000 years')", "PS403"),
        ("SELECT * FROM pyscheduler.add_check(entity_name => 'o', entity_key => '1', job => 'j', kind => 'python', "
         "check_after => '1 hour', horizon => '300000 years')", "PS408"),
        ("SELECT * FROM pyscheduler.set_check_settings(horizon => '300000 years')", "PS408"),
        ("SELECT * FROM pyscheduler.set_check_settings(task_timeout => '300000 years')", "PS408"),
        ("SELECT * FROM pyscheduler.set_check_settings(history_retention => '0')", "PS408"),
        ("SELECT * FROM pyscheduler.set_check_settings(max_payload_bytes => 0)", "PS408"),
        ("SELECT pyscheduler.slot_round(ts => '294276-12-31 23:59:59+00')", "PS403"),
        ("SELECT pyscheduler.slot_round(ts => '-infinity')", "PS403"),
        ("SELECT * FROM pyscheduler.due_checks(slot => 'infinity')", "PS405"),
    ]
    assert {query: sqlstate(tx, query) for query, _ in cases} == dict(cases)
    # the refused settings changed nothing: adding still works
    assert tx.execute("SELECT added FROM pyscheduler.add_check(entity_name => 'o', entity_key => '1', job => 'j', "
                        "kind => 'python', check_after => '1 hour')").fetchone()["added"]


@pytest.mark.parametrize("args, message", [
    (["order", "1", "--payload", "NaN"], "not JSON"),
    (["order", "1", "--payload", '{"a": Infinity}'], "not JSON"),
    ([b"or\xffder", "1"], "not valid UTF-8"),
    (["order", b"\xfe1"], "not valid UTF-8"),
])
def test_item13_the_cli_refuses_a_nan_payload_and_non_utf8_names_without_a_traceback(dsn, args, message):
    out = subprocess.run([sys.executable, "-m", "pyscheduler", "checks", "add", "--dsn", dsn, *args,
                          "--job", "j", "--kind", "python", "--after", "1h"], capture_output=True, timeout=60)
    stderr = out.stderr.decode(errors="replace")
    assert out.returncode == 2 and message in stderr and "Traceback" not in stderr, stderr


def test_item14_a_second_add_with_another_kind_is_refused_not_dropped(slots):
    first = slots.call_one("add_check", entity_name="order", entity_key="1", job="slow", kind="python",
                           check_after=timedelta(hours=1))
    with pytest.raises(errors.Conflict) as info:
        slots.call("add_check", entity_name="order", entity_key="1", job="slow", kind="task",
                   check_after=timedelta(hours=1))
    assert info.value.sqlstate == "PS410" and "python" in str(info.value)
    again = slots.call_one("add_check", entity_name="order", entity_key="1", job="slow", kind="python",
                           check_after=timedelta(hours=2))
    assert (again["id"], again["added"]) == (first["id"], False)


# =============================================================================================
# The runner as a daemon: restarts, outages
# =============================================================================================

def test_fresh_gives_a_runner_with_the_same_settings(dsn):
    handlers = {"count": Counting()}
    runner = CheckRunner(dsn, handlers, shard=1, shards=3, batch=7, timeout=2.5, name="r", purge_interval=9,
                         grace=4)
    runner.last_slot, runner._careful = datetime.now(UTC), True
    again = runner.fresh()
    assert again is not runner and again.last_slot is None and not again._careful
    assert (again.dsn, again.handlers, again.shard, again.shards, again.batch, again.timeout, again.name,
            again.purge_interval, again.grace) == (dsn, handlers, 1, 3, 7, 2.5, "r", 9, 4)


@pytest.mark.slow
def test_the_runner_survives_a_postgresql_restart(pg, slots, running, dsn):
    if pg.server is None:
        pytest.skip("needs the embedded PostgreSQL (PYSCHEDULER_TEST_DSN is set)")
    counting = Counting()
    runner = running.start(CheckRunner(dsn, {"count": counting}))
    before = add_many(slots, 2, "count", "python", prefix="before-")
    wait_history(slots, 2)
    pg.server.stop()
    pg.server.start()
    after = wait_for(lambda: _try(lambda: add_many(slots, 2, "count", "python", prefix="after-")), timeout=30)
    ended = wait_history(slots, 4)
    assert set(ended) == set(before + after) and {h["outcome"] for h in ended.values()} == {"done"}
    assert running.alive() and runner.slots_done.is_set() and set(counting.calls.values()) == {1}


def _try(fn):
    try:
        return fn()
    except errors.DatabaseUnavailable:
        return None


def test_run_handler_turns_every_bad_result_into_an_error():
    check = Check(1, "order", "1", "h", "python", None, datetime.now(UTC), datetime.now(UTC), 0, 5,
                  datetime.now(UTC))
    for key, value in HOSTILE_HANDLER_RETURNS.items():
        if key == "max":  # 9999-12-31: a datetime, in UTC; finish_checks refuses it (the catalogue)
            continue
        result = run_handler(lambda c, v=value: poison(Check(**{**c.__dict__, "entity_key": key})), check)
        assert result.error and result.next_check_at is None, key
        assert "\x00" not in result.error and len(result.error) <= 2000
    kolkata = datetime(2030, 1, 1, 10, 0, tzinfo=ZoneInfo("Asia/Kolkata"))
    assert run_handler(lambda c: kolkata, check).next_check_at == kolkata and \
        run_handler(lambda c: kolkata, check).next_check_at.tzinfo is UTC


def test_what_a_client_asks_of_a_held_check_is_applied_by_the_next_runner_if_the_first_dies(app, dsn):
    """A runner holds three checks; the client deletes one and adds another again without waiting;
    the runner dies (rolls back). The next runner's take leaves the deleted one out (ended as
    deleted, never run), and ending the other applies the re-add."""
    now = datetime.now(UTC)
    ids = [app.execute("SELECT id FROM pyscheduler._add_check('order', %s, 'app.ret', 'sql', %s, NULL, NULL, NULL, "
                       "NULL, %s)", (f"k{i}", now - timedelta(hours=1), now - timedelta(hours=2))).fetchone()["id"]
           for i in range(3)]
    with psycopg.connect(dsn, row_factory=dict_row) as runner, \
            psycopg.connect(dsn, autocommit=True, row_factory=dict_row, options="-c statement_timeout=2000") as client:
        held = [r["id"] for r in runner.execute("SELECT id FROM pyscheduler.catch_up_checks()")]
        assert held == ids
        assert client.execute("SELECT pyscheduler.delete_checks(entity_name => 'order', entity_key => 'k0') AS n"
                              ).fetchone()["n"] == 1
        readd = client.execute("SELECT * FROM pyscheduler.add_check(entity_name => 'order', entity_key => 'k1', "
                               "job => 'app.ret', check_after => '1 hour')").fetchone()
        assert readd["added"] is None and readd["id"] == ids[1]
        assert [r["id"] for r in client.execute("SELECT id FROM pyscheduler.list_checks()")] == ids[1:]
        runner.rollback()  # the runner dies
        # the next runner, the careful way: the take ends k0, the jobs run, ending k1 applies the re-add
        taken = [r["id"] for r in runner.execute("SELECT id FROM pyscheduler.catch_up_checks()")]
        assert taken == ids[1:]
        out = runner.execute("SELECT * FROM pyscheduler.run_checks(ids => %s)", (taken,)).fetchall()
        assert {r["outcome"] for r in out} == {"done"}
        runner.commit()
    ended = {r["entity_key"]: r for r in app.execute("SELECT * FROM pyscheduler.check_history()")}
    assert (ended["k0"]["outcome"], ended["k0"]["check_count"]) == ("deleted", 0) and "k0" not in ran(app)
    assert [(r["entity_key"], r["next_check_at"]) for r in app.execute("SELECT * FROM pyscheduler.list_checks()")] \
        == [("k1", readd["next_check_at"])]
    assert app.execute("SELECT count(*) AS n FROM pyscheduler.check_requests").fetchone()["n"] == 0


# =============================================================================================
# Issue 32, item 2: Python handlers that hang (or are slow) hold a batch's transaction boundedly
# =============================================================================================

class Hang:
    """A Python handler that hangs, past any deadline, until released; counts its calls."""

    def __init__(self):
        self.release, self.calls, self.cond = threading.Event(), 0, threading.Condition()

    def __call__(self, check: Check):
        with self.cond:
            self.calls += 1
            self.cond.notify_all()
        self.release.wait(60)

    def wait_calls(self, n: int) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.calls >= n, timeout=30)


class OldestIdleTransaction(threading.Thread):
    """Samples pg_stat_activity every 20 ms: the age of the oldest transaction of this database
    while it is ``idle in transaction`` (a batch's transaction while its Python handlers run)."""

    def __init__(self, dsn: str):
        super().__init__(daemon=True)
        self.dsn, self.longest, self.done = dsn, 0.0, threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.done.is_set():
                (age,) = conn.execute("SELECT coalesce(max(extract(epoch FROM clock_timestamp() - xact_start)), 0) "
                                      "FROM pg_stat_activity WHERE datname = current_database() "
                                      "AND state = 'idle in transaction'").fetchone()
                self.longest = max(self.longest, float(age))
                self.done.wait(0.02)

    def __enter__(self) -> "OldestIdleTransaction":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.join(10)


@pytest.mark.slow
def test_hanging_handlers_hold_a_batch_one_timeout_and_a_stop_waits_for_one_handler(slots, dsn):
    """12 handlers that hang, timeout 1 s: each batch ends at the first one's deadline (recorded
    as timeout) and the rest waits at its slot; a stop during the third waits for that one only
    (the old runner: 12 s of one idle transaction, and a stop held up by every handler left)."""
    hang = Hang()
    ids = add_many(slots, 12, "hang", "python")
    runner = CheckRunner(dsn, {"hang": hang}, timeout=1.0)
    run = Running()
    with OldestIdleTransaction(dsn) as oldest:
        run.start(runner)
        try:
            assert hang.wait_calls(3)
            started = time.monotonic()
            run.stop.set()
            run.threads[0].join(30)
            stopped = time.monotonic() - started
        finally:
            hang.release.set()
            run.close()
    # operations.md: a stop waits for the running handler (the timeout), never longer than the
    # timeout plus the grace; a batch's handlers keep its transaction open about one timeout here
    assert stopped < runner.timeout + runner.grace, stopped
    assert 0.9 < oldest.longest < 2 * runner.timeout, oldest.longest
    ended = history(slots)
    assert sorted(ended) == ids[:3] and hang.calls == 3  # none started after the stop
    assert all(h["outcome"] == "timeout" and "exceeded its timeout of 1 s" in h["error"] for h in ended.values())
    assert {i: r["check_count"] for i, r in pending(slots).items()} == dict.fromkeys(ids[3:], 0)  # at their slot


@pytest.mark.slow
def test_handlers_stop_starting_after_a_timeout_of_handler_time_and_the_rest_runs_next(slots,
                                                                                                  running, dsn):
    """Handlers each well inside the timeout but longer than it together: a batch starts none
    after a timeout's worth, records what ran, and the next batch runs the rest, each once."""
    slow = Counting(sleep=0.2)
    ids = add_many(slots, 8, "slow", "python")
    runner = CheckRunner(dsn, {"slow": slow}, timeout=0.5)
    with OldestIdleTransaction(dsn) as oldest:
        running.start(runner)
        ended = wait_history(slots, 8)
    assert {h["outcome"] for h in ended.values()} == {"done"} and set(ended) == set(ids)
    assert set(slow.calls.values()) == {1} and len(slow.calls) == 8
    assert oldest.longest < 2 * runner.timeout, oldest.longest  # the old runner: one batch of 1.6 s


@pytest.mark.slow
def test_at_max_abandoned_handlers_none_starts_until_one_returns(app, slots, running, dsn, caplog):
    """Two abandoned handler threads still running (max_abandoned => 2): the runner starts no
    more handlers, says so once (log, gauge), runs SQL jobs on; once they return, the Python
    checks that waited run."""
    gauge = "pyscheduler_checks_abandoned_handlers"
    before = scrape()[gauge]
    hang = Hang()
    at = at_next(slots)
    ids = [add(slots, f"h{i}", "hang", "python", at=at) for i in range(5)]
    running.start(CheckRunner(dsn, {"hang": hang}, timeout=0.5, max_abandoned=2))
    try:
        assert hang.wait_calls(2)
        later = add(slots, "later", "app.ret", at=at_next(slots, 1.5))  # a slot after the bound is reached
        wait_for(lambda: later in history(slots), timeout=30)
        assert hang.calls == 2 and scrape()[gauge] - before == 2
        assert set(pending(slots)) == set(ids[2:])
        warnings = [r for r in caplog.records if "max_abandoned" in r.getMessage()]
        assert len(warnings) == 1 and warnings[0].levelname == "WARNING"
    finally:
        hang.release.set()
    ended = wait_history(slots, 6)
    assert [ended[i]["outcome"] for i in ids] == ["timeout", "timeout", "done", "done", "done"]
    assert hang.calls == 5 and ended[later]["outcome"] == "done"
    wait_for(lambda: scrape()[gauge] == before, timeout=10)


NAP_SQL = """
CREATE FUNCTION app.nap(c pyscheduler.future_check) RETURNS timestamptz
LANGUAGE plpgsql SECURITY DEFINER SET search_path = app, pg_temp AS $$
BEGIN
    PERFORM pg_sleep(0.4);
    RETURN NULL;
END $$;
"""


@pytest.mark.slow
def test_a_stop_while_a_batch_runs_its_sql_jobs_one_by_one_waits_for_one_job(app, slots, dsn):
    """15 SQL jobs of 0.4 s: their one statement times out (1 s), so the batch runs them one
    statement each; a stop then waits for the job running, not for the 14 after it."""
    app.execute(NAP_SQL)
    at = at_next(slots)
    ids = [add(slots, f"s{i}", "app.nap", at=at) for i in range(15)]
    runner = CheckRunner(dsn, {}, timeout=1.0)
    run = Running()
    run.start(runner)
    try:
        wait_for(lambda: app.execute("SELECT count(*) AS n FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
                                     "AND state = 'active' AND query LIKE '%%run_check_jobs%%'").fetchone()["n"],
                 timeout=30, interval=0.02)
        started = time.monotonic()
        run.stop.set()
        run.threads[0].join(30)
        stopped = time.monotonic() - started
    finally:
        run.close()
    assert stopped < runner.timeout + runner.grace, stopped
    ended = history(slots)
    assert 0 < len(ended) < 15 and {h["outcome"] for h in ended.values()} == {"done"}
    assert set(pending(slots)) == set(ids) - set(ended)  # the rest waits at its slot
