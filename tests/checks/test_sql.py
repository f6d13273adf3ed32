"""Future checks in SQL: slots, add/delete, the = and < passes, proof of taking, guards, history."""

from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from psycopg.rows import dict_row

UTC = timezone.utc
JOB = "app.order_alert"

JOB_SQL = """
CREATE SCHEMA app;
CREATE TABLE app.orders (id text PRIMARY KEY, status text NOT NULL);
CREATE TABLE app.alerts (order_id text, check_count int);
-- next: payload.next (an interval from now) or NULL; payload.raise: raise instead
CREATE FUNCTION app.order_alert(c pyscheduler.future_check) RETURNS timestamptz
LANGUAGE plpgsql SECURITY DEFINER SET search_path = app, pg_temp AS $$
BEGIN
    INSERT INTO alerts VALUES (c.entity_key, c.check_count);
    IF c.payload ? 'raise' THEN
        RAISE EXCEPTION 'order % is broken', c.entity_key;
    END IF;
    RETURN clock_timestamp() + (c.payload ->> 'next')::interval;
END $$;
"""


@pytest.fixture
def app(conn):
    conn.execute(JOB_SQL)
    return conn


def sqlstate(conn, query, params=None) -> str:
    with pytest.raises(psycopg.Error) as info:
        conn.execute(query, params)
    return info.value.sqlstate


def one(conn, query, params=None):
    return conn.execute(query, params).fetchone()


def slot_round(conn, ts: str, resolution: str | None = None, tz: str = "UTC") -> datetime:
    conn.execute(f"SET TIME ZONE '{tz}'")
    return one(conn, "SELECT pyscheduler.slot_round(ts => %s::timestamptz, resolution => %s::interval) AS s",
               (ts, resolution))["s"]


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def set_resolution(conn, resolution: str) -> None:
    conn.execute("SELECT pyscheduler.set_check_settings(resolution => %s::interval)", (resolution,))


# --- slots -------------------------------------------------------------------------------------

def test_slot_round_rounds_up_and_keeps_boundaries(tx):
    assert slot_round(tx, "2024-05-01 10:05+00") == at("2024-05-01 10:15+00:00")
    assert slot_round(tx, "2024-05-01 10:15+00") == at("2024-05-01 10:15+00:00")
    assert slot_round(tx, "2024-05-01 10:15:00.000001+00") == at("2024-05-01 10:30+00:00")
    # the seed: placed at 10:05, checked after 3 hours, 15-minute slots -> 13:15
    assert one(tx, "SELECT pyscheduler.slot_round(ts => '2024-05-01 10:05+00'::timestamptz + interval '3 hours')"
                     " AS s")["s"] == at("2024-05-01 13:15+00:00")
    assert slot_round(tx, "2024-05-01 10:05+00", "1 hour") == at("2024-05-01 11:00+00:00")
    assert slot_round(tx, "2024-05-01 10:05:01+00", "1 second") == at("2024-05-01 10:05:01+00:00")


def test_slot_round_across_midnight(tx):
    assert slot_round(tx, "2024-12-31 23:50+00") == at("2025-01-01 00:00+00:00")
    assert slot_round(tx, "2024-12-31 23:59:59+00", "1 day") == at("2025-01-01 00:00+00:00")


def test_slots_are_utc_aligned_across_a_dst_change_in_a_local_session(tx):
    # Europe/Berlin springs forward at 02:00 local (01:00 UTC) on 2024-03-31
    assert slot_round(tx, "2024-03-31 01:50:00+01", tz="Europe/Berlin") == at("2024-03-31 01:00+00:00")
    tx.execute("SET TIME ZONE 'Europe/Berlin'")
    rows = tx.execute(
        "SELECT pyscheduler.slot_round(ts => t) AS s FROM generate_series("
        "'2024-03-31 01:31+01'::timestamptz, '2024-03-31 03:31+02'::timestamptz, interval '15 minutes') t"
    ).fetchall()
    slots = [r["s"].astimezone(UTC) for r in rows]  # (same-zone datetimes subtract as wall clocks)
    assert all(b - a == timedelta(minutes=15) for a, b in zip(slots, slots[1:])), slots  # none moved or merged
    assert all(s.astimezone(UTC).minute % 15 == 0 and s.second == 0 for s in slots)
    # and back in autumn (03:00 -> 02:00 local on 2024-10-27): the repeated hour keeps four distinct slots
    rows = tx.execute(
        "SELECT DISTINCT pyscheduler.slot_round(ts => t) AS s FROM generate_series("
        "'2024-10-27 01:59+02'::timestamptz, '2024-10-27 02:59+01'::timestamptz, interval '1 minute') t"
    ).fetchall()
    autumn = sorted(r["s"].astimezone(UTC) for r in rows)  # 2 hours of real time: 8 slots + the closing one
    assert len(autumn) == 9 and all(b - a == timedelta(minutes=15) for a, b in zip(autumn, autumn[1:]))
    # a +05:30 zone: 1-hour slots are UTC hours, so they fall on :30 local
    assert slot_round(tx, "2024-01-01 10:05+05:30", "1 hour", tz="Asia/Kolkata") == at("2024-01-01 10:30+05:30")


def test_a_resolution_that_does_not_divide_a_day_is_refused(tx):
    for resolution in ["7 minutes", "1 month", "0 seconds", "-15 minutes", "25 hours", "0.3 microseconds"]:
        assert sqlstate(tx, "SELECT pyscheduler.slot_round(ts => now(), resolution => %s::interval)",
                        (resolution,)) == "PS400", resolution


def test_set_check_settings_refuses_bad_resolution_and_moves_pending_checks(app):
    assert sqlstate(app, "SELECT pyscheduler.set_check_settings(resolution => '7 minutes')") == "PS400"
    row = one(app, "SELECT * FROM pyscheduler.add_check(entity_name => 'order', entity_key => '1', job => %s, "
                   "check_after => '20 minutes')", (JOB,))
    set_resolution(app, "1 hour")
    moved = one(app, "SELECT next_check_at FROM pyscheduler.list_checks()")["next_check_at"]
    assert moved == one(app, "SELECT pyscheduler.slot_round(ts => %s, resolution => '1 hour') AS s",
                        (row["next_check_at"],))["s"]
    assert sqlstate(app, "SELECT pyscheduler.set_check_settings(horizon => '-1 day')") == "PS408"


# --- add / delete ------------------------------------------------------------------------------

def add(conn, key, *, job=JOB, kind="sql", now=None, after="1 hour", payload='{"next": null}', max_checks=None,
        horizon=None, check_at=None):
    return one(conn, "SELECT * FROM pyscheduler._add_check(%s, %s, %s, %s, %s, %s::interval, %s::jsonb, %s, "
                     "%s::interval, coalesce(%s, clock_timestamp()))",
               ("order", key, job, kind, check_at, None if check_at else after, payload, max_checks, horizon, now))


def test_add_check_rounds_up_and_is_idempotent_per_entity_and_job(app):
    now = at("2024-05-01 10:05+00:00")
    first = add(app, "1", now=now, after="3 hours")
    assert first["next_check_at"] == at("2024-05-01 13:15+00:00") and first["added"]
    again = add(app, "1", now=now + timedelta(minutes=30), after="5 hours")
    assert again == {**first, "added": False}  # unchanged: the first check time is immutable
    other_job = add(app, "1", job="order_sms", kind="python", now=now)
    assert other_job["added"] and other_job["id"] != first["id"]
    past = add(app, "2", now=now, check_at=now - timedelta(days=1))
    assert past["next_check_at"] == at("2024-05-01 10:15+00:00")  # already due: the next slot


BAD_ADDS = [
    ({"entity_name": None}, "PS401"),
    ({"entity_key": None}, "PS401"),
    ({"entity_key": ""}, "PS401"),
    ({"job": "app.no_such_job"}, "PS402"),
    ({"job": "app.invoker_job"}, "PS402"),
    ({"job": "app.wrong_type"}, "PS402"),
    ({"job": "order_alert"}, "PS402"),  # not qualified with its schema
    ({"kind": "shell"}, "PS402"),
    ({"kind": "task", "job": "q" * 41}, "PS402"),
    ({"check_at": "2030-01-01T00:00:00Z"}, "PS403"),  # both check_at and check_after
    ({"check_after": None}, "PS403"),  # neither
    ({"check_after": "-1 hour"}, "PS403"),
    ({"check_after": "31 days"}, "PS403"),  # beyond the default horizon
    ({"max_checks": 0}, "PS408"),
]


def test_add_check_refuses_bad_input(app):
    app.execute("CREATE FUNCTION app.invoker_job(c pyscheduler.future_check) RETURNS timestamptz "
                "LANGUAGE sql AS 'SELECT NULL::timestamptz'")
    app.execute("CREATE FUNCTION app.wrong_type(c pyscheduler.future_check) RETURNS int "
                "LANGUAGE sql SECURITY DEFINER AS 'SELECT 1'")
    for args, code in BAD_ADDS:
        params = {"entity_name": "order", "entity_key": "1", "job": JOB, "check_after": "1 hour", **args}
        names = ", ".join(f"{k} => %({k})s" for k in params)
        with pytest.raises(psycopg.Error) as info:
            app.execute(f"SELECT * FROM pyscheduler.add_check({names})", params)
        assert info.value.sqlstate == code, args
        assert info.value.diag.message_primary


def test_delete_checks_moves_pending_checks_to_history(app):
    add(app, "1")
    add(app, "1", job="order_sms", kind="python")
    add(app, "2")
    assert one(app, "SELECT pyscheduler.delete_checks(entity_name => 'order', entity_key => '1', "
                    "job => 'order_sms') AS n")["n"] == 1
    assert one(app, "SELECT pyscheduler.delete_checks(entity_name => 'order', entity_key => '1') AS n")["n"] == 1
    assert one(app, "SELECT pyscheduler.delete_checks(entity_name => 'order', entity_key => '1') AS n")["n"] == 0
    assert [r["entity_key"] for r in app.execute("SELECT * FROM pyscheduler.list_checks()")] == ["2"]
    history = app.execute("SELECT entity_key, job, outcome, check_count FROM pyscheduler.check_history()").fetchall()
    assert sorted((h["job"], h["outcome"], h["check_count"]) for h in history) == [
        (JOB, "deleted", 0), ("order_sms", "deleted", 0)]
    assert sqlstate(app, "SELECT pyscheduler.delete_checks(entity_name => 'order', entity_key => NULL)") == "PS401"


# --- taking: the = pass, shards, locks ---------------------------------------------------------

def slot_of(conn, key):
    return one(conn, "SELECT next_check_at FROM pyscheduler.list_checks(entity_name => 'order', entity_key => %s)",
               (key,))["next_check_at"]


def due(conn, slot, shard=0, shards=1, max=1000, now=None):
    return [r["id"] for r in conn.execute(
        "SELECT id FROM pyscheduler._take_checks(%s, %s, %s, %s, NULL, coalesce(%s, clock_timestamp()))",
        (slot, shard, shards, max, now))]


def test_due_checks_takes_exactly_its_slot_and_never_a_future_one(app):
    set_resolution(app, "1 minute")
    now = at("2024-05-01 10:00:30+00:00")
    a = add(app, "a", now=now, after="1 minute")["id"]    # slot 10:02
    b = add(app, "b", now=now, after="2 minutes")["id"]   # slot 10:03
    slot = at("2024-05-01 10:02+00:00")
    with app.transaction():
        assert due(app, slot, now=slot + timedelta(minutes=5)) == [a]  # '=': not b, not earlier slots
    assert b not in due(app, slot, now=slot + timedelta(minutes=5))
    assert sqlstate(app, "SELECT * FROM pyscheduler.due_checks(slot => pyscheduler.slot_round(ts => now()) "
                         "+ interval '1 minute')") == "PS404"  # a slot after the database clock
    assert sqlstate(app, "SELECT * FROM pyscheduler.due_checks(slot => '2024-05-01 10:02:30+00')") == "PS405"
    for args in ("shard => 2, shards => 2", "shard => -1", "shards => 0", "max => 0"):
        assert sqlstate(app, f"SELECT * FROM pyscheduler.due_checks(slot => '2024-05-01 10:02+00', {args})") == "PS406"


@pytest.fixture
def second(dsn):
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as c:
        yield c


def fill_slot(conn, n: int) -> datetime:
    now = at("2024-05-01 10:00:00+00:00")
    for i in range(n):
        add(conn, f"k{i}", now=now, after="10 minutes")
    return at("2024-05-01 10:15+00:00")


def test_two_runners_on_shards_0_and_1_of_2_take_disjoint_sets_covering_the_slot(app, second):
    slot = fill_slot(app, 40)
    later = slot + timedelta(minutes=1)
    with app.transaction(), second.transaction():
        zero = due(app, slot, shard=0, shards=2, now=later)
        one_ = due(second, slot, shard=1, shards=2, now=later)
        everything = {r["id"] for r in app.execute("SELECT id FROM pyscheduler.list_checks(max => 1000)")}
    assert zero and one_ and not set(zero) & set(one_)
    assert set(zero) | set(one_) == everything
    assert all(i % 2 == 0 for i in zero) and all(i % 2 == 1 for i in one_)


def test_a_check_held_by_one_runner_is_skipped_by_another_on_the_same_shard(app, second):
    slot = fill_slot(app, 10)
    later = slot + timedelta(minutes=1)
    with app.transaction():
        first = due(app, slot, max=6, now=later)
        with second.transaction():
            rest = due(second, slot, now=later)  # SKIP LOCKED: no wait, no overlap
            assert not set(first) & set(rest) and len(first) + len(rest) == 10
            second.execute("SELECT * FROM pyscheduler._finish_checks(%s, NULL, NULL, NULL, NULL, NULL, %s)",
                           (rest, later))
        app.execute("SELECT * FROM pyscheduler._finish_checks(%s, NULL, NULL, NULL, NULL, NULL, %s)", (first, later))
    assert due(app, slot, now=later) == []
    assert one(app, "SELECT count(*) AS n FROM pyscheduler.check_history() WHERE outcome = 'done'")["n"] == 10


# --- finishing: proof, guards, history ----------------------------------------------------------

def finish(conn, ids, nexts=None, errors=None, timed_out=None, claims=None, now=None):
    return [(r["outcome"], r["next_check_at"]) for r in conn.execute(
        "SELECT * FROM pyscheduler._finish_checks(%s, %s::timestamptz[], %s::text[], %s::boolean[], NULL, "
        "%s::uuid[], %s)", (ids, nexts, errors, timed_out, claims, now))]


def test_finish_is_refused_for_a_check_this_transaction_did_not_take(app):
    cid = add(app, "1")["id"]
    assert finish(app, [cid], now=datetime.now(UTC)) == [("not_taken", None)]
    assert sqlstate(app, "SELECT * FROM pyscheduler.finish_check(id => %s)", (cid,)) == "PS407"
    slot = slot_of(app, "1")
    with app.transaction():
        due(app, slot, now=slot)
        assert finish(app, [cid, cid], now=slot) == [("done", None), ("not_taken", None)]  # once only
    assert sqlstate(app, "SELECT * FROM pyscheduler.finish_check(id => %s)", (cid,)) == "PS407"  # gone
    assert sqlstate(app, "SELECT * FROM pyscheduler.finish_checks(ids => ARRAY[1, 2], "
                         "errors => ARRAY['x'])") == "PS408"


def test_every_outcome_and_guard(app):
    slot = fill_slot(app, 7)
    ids = due(app, slot, now=slot + timedelta(minutes=1))  # autocommit: a peek, the locks end at once
    now = slot + timedelta(minutes=1)
    app.execute("UPDATE pyscheduler.checks SET check_count = 4 WHERE id = %s", (ids[3],))  # 5th run next
    with app.transaction():
        assert due(app, slot, now=now) == ids
        out = finish(app, ids,
                     nexts=[now + timedelta(hours=1), None, None, now + timedelta(hours=1), now - timedelta(seconds=1),
                            now + timedelta(days=31), None],
                     errors=[None, None, "it broke", None, None, None, None],
                     timed_out=[False, False, False, False, False, False, True], now=now)
    assert [o for o, _ in out] == ["rescheduled", "done", "error", "max_checks", "past", "horizon", "timeout"]
    assert out[0][1] == at("2024-05-01 11:30+00:00")  # slot_round(now + 1 h) with now 10:16
    pending = one(app, "SELECT * FROM pyscheduler.list_checks()")
    assert (pending["id"], pending["check_count"], pending["next_check_at"]) == (ids[0], 1, out[0][1])
    history = {h["id"]: h for h in app.execute("SELECT * FROM pyscheduler.check_history()")}
    assert history[ids[2]]["error"] == "it broke"
    assert history[ids[3]]["check_count"] == 5
    assert history[ids[6]]["error"] and history[ids[1]]["last_check_at"] == slot
    app.execute("UPDATE pyscheduler.check_history SET ended = now()")  # the view covers the last day
    outcomes = {(r["outcome"], r["checks"]) for r in app.execute("SELECT * FROM pyscheduler.check_outcomes")}
    assert outcomes == {(o, 1) for o in ("done", "error", "max_checks", "past", "horizon", "timeout")}


# --- running SQL jobs ---------------------------------------------------------------------------

def test_run_check_jobs_isolates_a_job_that_raises(app):
    ok = add(app, "ok", payload='{"next": "2 hours"}')["id"]
    bad = add(app, "bad", payload='{"raise": true}')["id"]
    done = add(app, "done")["id"]
    untaken = add(app, "later", after="3 hours")["id"]
    slot = slot_of(app, "ok")
    with app.transaction():
        due(app, slot, now=slot)
        rows = {r["id"]: r for r in app.execute("SELECT * FROM pyscheduler.run_check_jobs(ids => %s)",
                                                ([ok, bad, done, untaken],))}
        assert set(rows) == {ok, bad, done}  # never a check this transaction did not take
        assert rows[ok]["next_check_at"] and rows[ok]["error"] is None
        assert "order bad is broken" in rows[bad]["error"] and rows[bad]["next_check_at"] is None
        assert rows[done]["next_check_at"] is None and rows[done]["error"] is None
        alerts = {r["order_id"] for r in app.execute("SELECT order_id FROM app.alerts")}
        assert alerts == {"ok", "done"}  # the raising job's insert was rolled back alone
        out = finish(app, list(rows), nexts=[rows[i]["next_check_at"] for i in rows],
                     errors=[rows[i]["error"] for i in rows], now=slot)
    assert sorted(o for o, _ in out) == ["done", "error", "rescheduled"]


def run_due(conn, slot, max=1000, after=None, now=None):
    return one(conn, "SELECT * FROM pyscheduler._run_due_checks(%s, 0, 1, %s, %s, coalesce(%s, clock_timestamp()))",
               (slot, max, after, now))


def test_run_due_checks_runs_a_batch_in_one_statement_and_a_raising_job_affects_only_itself(app, second):
    ok = [add(app, f"ok{i}")["id"] for i in range(18)]
    bad = add(app, "bad", payload='{"raise": true}')["id"]
    again = add(app, "again", payload='{"next": "2 hours"}')["id"]
    py = add(app, "py", job="py_job", kind="python")["id"]
    slot = slot_of(app, "ok0")
    with app.transaction():
        batch = run_due(app, slot, now=slot)
        assert batch["taken"] == 21 and batch["last_id"] == max(ok + [bad, again, py])
        assert batch["outcomes"] == {"done": 18, "error": 1, "rescheduled": 1}
        assert batch["job_outcomes"] == {JOB: {"done": 18, "error": 1, "rescheduled": 1}}  # Python ones: not run yet
        assert [c[0] for c in batch["checks"]] == [py] and batch["checks"][0][3:5] == ["py_job", "python"]
        alerts = {r["order_id"] for r in app.execute("SELECT order_id FROM app.alerts")}
        assert alerts == {f"ok{i}" for i in range(18)} | {"again"}  # the raising job was rolled back alone
        with second.transaction():  # the Python check stays locked by this transaction
            assert due(second, slot, now=slot) == []
        assert finish(app, [py], now=slot) == [("done", None)]
    history = {h["id"]: h for h in app.execute("SELECT * FROM pyscheduler.check_history()")}
    assert {i: history[i]["outcome"] for i in ok} == {i: "done" for i in ok}
    assert history[bad]["outcome"] == "error" and "order bad is broken" in history[bad]["error"]
    assert history[py]["outcome"] == "done" and again not in history
    assert one(app, "SELECT check_count FROM pyscheduler.list_checks()")["check_count"] == 1  # again: rescheduled


def test_run_due_checks_after_skips_what_it_ran_and_a_pass_without_after_takes_what_another_held(app, second):
    ids = [add(app, f"k{i}")["id"] for i in range(10)]
    slot = slot_of(app, "k0")
    with app.transaction():
        with second.transaction():
            held = due(second, slot, max=3, now=slot)  # another runner holds the first three
            first = run_due(app, slot, max=4, now=slot)
            assert held == ids[:3] and (first["taken"], first["last_id"]) == (4, ids[6])
        # the other runner rolled back: its three are pending again, below after
        rest = run_due(app, slot, max=4, after=first["last_id"], now=slot)
        assert (rest["taken"], rest["last_id"]) == (3, ids[9])  # fewer than max: the end of the slot
        final = run_due(app, slot, max=4, now=slot)
        assert (final["taken"], final["last_id"]) == (3, ids[2])
        assert run_due(app, slot, max=4, now=slot)["taken"] == 0
    assert one(app, "SELECT count(*) AS n FROM pyscheduler.check_history() WHERE outcome = 'done'")["n"] == 10


def test_a_job_function_that_lost_security_definer_is_an_error_not_a_privilege(app):
    cid = add(app, "1")["id"]
    app.execute("ALTER FUNCTION app.order_alert(pyscheduler.future_check) SECURITY INVOKER")
    slot = slot_of(app, "1")
    with app.transaction():
        due(app, slot, now=slot)
        row = one(app, "SELECT * FROM pyscheduler.run_check_jobs(ids => %s)", ([cid],))
    assert "SECURITY DEFINER" in row["error"]
    assert one(app, "SELECT count(*) AS n FROM app.alerts")["n"] == 0


# --- the catch-up pass ---------------------------------------------------------------------------

def test_catch_up_takes_missed_slots_once_and_never_the_current_one(app, second):
    set_resolution(app, "1 minute")
    start = at("2024-05-01 10:00:10+00:00")
    missed = [add(app, f"m{i}", now=start, after=f"{i} minutes")["id"] for i in (1, 2, 3)]
    current = add(app, "cur", now=start, after="4 minutes")["id"]  # slot 10:05
    now = at("2024-05-01 10:05:20+00:00")

    def catch_up(conn):
        return [r["id"] for r in conn.execute(
            "SELECT id FROM pyscheduler._take_checks(NULL, 0, 1, 1000, NULL, %s)", (now,))]

    with app.transaction():
        taken = catch_up(app)
        assert taken == missed  # oldest first; the current slot is the '=' pass's
        with second.transaction():
            assert catch_up(second) == []  # held: skipped, never taken twice
        finish(app, taken, now=now)
    assert catch_up(app) == []
    assert [r["id"] for r in app.execute("SELECT id FROM pyscheduler.list_checks()")] == [current]


# --- task jobs ----------------------------------------------------------------------------------

def test_a_task_job_runs_on_the_task_queue_and_reports_with_its_claim(app):
    cid = add(app, "1", job="slow-checks", kind="task")["id"]
    slot = slot_of(app, "1")
    with app.transaction():
        due(app, slot, now=slot)
        handed = one(app, "SELECT * FROM pyscheduler.submit_check_tasks(ids => %s)", ([cid],))
    task = one(app, "SELECT pyscheduler.get_task(rn => %s) AS t", (handed["task_rn"],))["t"]
    assert task["queue"] == "slow-checks" and task["spec"]["check"]["id"] == cid
    with app.transaction():
        assert due(app, slot, now=slot) == []  # with its task: no pass takes it
    assert sqlstate(app, "SELECT * FROM pyscheduler.finish_check(id => %s, claim => gen_random_uuid())",
                    (cid,)) == "PS407"
    out = one(app, "SELECT * FROM pyscheduler.finish_check(id => %s, next_check_at => now() + interval '1 hour', "
                   "claim => %s)", (cid, task["spec"]["claim"]))
    assert out["outcome"] == "rescheduled"
    assert sqlstate(app, "SELECT * FROM pyscheduler.finish_check(id => %s, claim => %s)",
                    (cid, task["spec"]["claim"])) == "PS407"  # a claim is good once


def test_a_task_job_that_never_reports_ends_as_timeout(app):
    cid = add(app, "1", job="slow-checks", kind="task")["id"]
    slot = slot_of(app, "1")
    with app.transaction():
        due(app, slot, now=slot)
        app.execute("SELECT * FROM pyscheduler.submit_check_tasks(ids => %s)", ([cid],))
    taken = app.execute("SELECT * FROM pyscheduler._take_checks(NULL, 0, 1, 100, NULL, clock_timestamp())").fetchall()
    assert taken == []
    assert one(app, "SELECT count(*) AS n FROM pyscheduler.check_history()")["n"] == 0
    app.execute("SELECT * FROM pyscheduler._take_checks(NULL, 0, 1, 100, NULL, clock_timestamp() + interval '2 hours')")
    row = one(app, "SELECT outcome, error FROM pyscheduler.check_history()")
    assert row["outcome"] == "timeout" and "did not report" in row["error"]
