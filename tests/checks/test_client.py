"""CheckClient: every field round-trips (pending checks as the runner's Check, ended ones as
EndedCheck) on pyscheduler's pool and on the application's own connection; ownership hides
payloads; the checks CLI (add options, hints naming CLI commands) goes through it."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import psycopg
import pytest
from click.testing import CliRunner

from pyscheduler.checks import AddedCheck, AsyncCheckClient, Check, CheckClient, EndedCheck
from pyscheduler.cli import main
from pyscheduler.errors import Conflict, InvalidArgument, InvalidJob

ODD = "-c DateStyle=German,DMY -c IntervalStyle=postgres_verbose -c TimeZone=Australia/Lord_Howe"


def slot(db, at: datetime) -> datetime:
    return db.call_value("slot_round", ts=at).astimezone(timezone.utc)


def test_every_field_round_trips_pending_and_ended(dsn, db):
    at = datetime(2030, 4, 6, 14, 7, tzinfo=ZoneInfo("Australia/Lord_Howe"))  # the day its DST ends
    payload = {"escalate_after": "1 hour", "n": [1, 2.5, None], "ü": True}
    with psycopg.connect(dsn, autocommit=True, options=ODD) as conn:
        client = CheckClient(conn)
        added = client.add("order", "233", "order_sms", check_at=at, payload=payload, kind="python", max_checks=3,
                           horizon=timedelta(days=3650))
        assert added == AddedCheck(added.id, slot(db, at), True)
        again = client.add("order", "233", "order_sms", check_after=timedelta(hours=1), kind="python")
        assert again == AddedCheck(added.id, added.next_check_at, False)  # pending: unchanged
        [pending] = client.list(entity_name="order", entity_key="233", job="order_sms")
        owner = conn.execute("SELECT current_user").fetchone()[0]
    assert pending == Check(id=added.id, entity_name="order", entity_key="233", job="order_sms", kind="python",
                            payload=payload, first_check_at=added.next_check_at,
                            next_check_at=added.next_check_at, check_count=0, max_checks=3,
                            created=pending.created, owner=owner)
    assert pending.created.tzinfo is timezone.utc
    assert CheckClient(db).list() == [pending]
    columns = set(db.query("SELECT * FROM pyscheduler.list_checks()")[0])
    assert {f.name for f in dataclasses.fields(Check)} == columns, "Check misses or adds a field"

    with psycopg.connect(dsn, autocommit=True, options=ODD) as conn:
        client = CheckClient(conn)
        assert client.delete("order", "233", job="other") == 0
        assert client.delete("order", "233") == 1
        [ended] = client.history(entity_name="order")
    assert ended == EndedCheck(id=added.id, entity_name="order", entity_key="233", job="order_sms", kind="python",
                               payload=payload, first_check_at=added.next_check_at, last_check_at=None,
                               check_count=0, outcome="deleted", error=None, last_took=None,
                               total_took=timedelta(0), created=pending.created, ended=ended.ended, owner=owner)
    assert CheckClient(db).history() == [ended] and ended.ended.tzinfo is timezone.utc
    assert CheckClient(db).list() == []
    columns = set(db.query("SELECT * FROM pyscheduler.check_history()")[0])
    assert {f.name for f in dataclasses.fields(EndedCheck)} == columns, "EndedCheck misses or adds a field"


def test_another_roles_checks_come_without_their_payload(dsn, login):
    _, owner_dsn = login("pyscheduler_client")
    _, other_dsn = login("pyscheduler_client")
    with psycopg.connect(owner_dsn, autocommit=True) as conn:
        CheckClient(conn).add("order", "1", "slow-checks", kind="task", check_after=timedelta(hours=1),
                              payload={"secret": 1})
    with psycopg.connect(other_dsn, autocommit=True) as conn:
        client = CheckClient(conn)
        [theirs] = client.list()
        assert theirs.payload is None and theirs.job == "slow-checks"
        assert client.delete("order", "1") == 0  # not theirs to delete
        with pytest.raises(Exception) as refused:  # not theirs to share: 42501
            client.add("order", "1", "slow-checks", kind="task", check_after=timedelta(hours=1))
        assert getattr(refused.value, "sqlstate", None) == "42501"


def test_a_check_added_in_a_rolled_back_transaction_does_not_exist(dsn, db):
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE orders (id text PRIMARY KEY)")
        conn.commit()
        conn.execute("INSERT INTO orders VALUES ('42')")
        CheckClient(conn).add("order", "42", "reminders", kind="task", check_after=timedelta(hours=3))
        assert len(CheckClient(conn).list()) == 1
        conn.rollback()
    assert CheckClient(db).list() == [] and CheckClient(db).history() == []


def test_bad_arguments_are_refused_naming_the_field(tx):
    client = CheckClient(tx)
    for call, field in (
            (lambda: client.add("o", "1", "j", check_at=datetime(2030, 1, 1)), "check_at"),
            (lambda: client.add("o", "1", "j", check_at=datetime(1969, 12, 31, tzinfo=timezone.utc)), "check_at"),
            (lambda: client.add("o", "1", "j"), "check_at and check_after"),
            (lambda: client.add("o", "1", "j", check_at=datetime.now(timezone.utc), check_after=timedelta(0)),
             "check_at and check_after"),
            (lambda: client.add("o", "1", "j", check_after=timedelta(0), payload={"x": math.inf}), "payload"),
            (lambda: client.add("o", "1", "j", check_after=timedelta(0), kind="shell"), "kind"),  # type: ignore
            (lambda: client.add("o", "1", "j", check_after=timedelta(0), max_checks=2**40), "max_checks"),
            (lambda: client.add("o", "1\x00", "j", check_after=timedelta(0)), "entity_key"),
            (lambda: client.list(limit=0), "limit"),
            (lambda: client.history(entity_key="1"), "entity_key needs entity_name")):
        with pytest.raises(InvalidArgument, match=field):
            call()
    with pytest.raises(InvalidJob):  # the SQL function's own check (PS402)
        client.add("o", "1", "app.no_such_job", check_after=timedelta(hours=1))
    client.add("o", "1", "j", kind="python", check_after=timedelta(hours=1))
    with pytest.raises(Conflict):  # PS410: pending with another kind
        client.add("o", "1", "j", kind="task", check_after=timedelta(hours=1))


def test_the_async_client_adds_in_the_applications_transaction(dsn, db):
    async def scenario() -> AddedCheck:
        async with await psycopg.AsyncConnection.connect(dsn, options=ODD) as aconn:
            client = AsyncCheckClient(aconn)
            await client.add("order", "dropped", "q", kind="task", check_after=timedelta(hours=1))
            await aconn.rollback()
            kept = await client.add("order", "kept", "q", kind="task", check_after=timedelta(hours=1))
            assert [c.entity_key for c in await client.list()] == ["kept"]
            await aconn.commit()
            assert await client.delete("order", "kept") == 1
            assert [h.outcome for h in await client.history()] == ["deleted"]
            await aconn.commit()
            return kept

    kept = asyncio.run(scenario())
    assert [h.id for h in CheckClient(db).history()] == [kept.id]


# ------------------------------------------------------------------ CLI


def run(dsn, *args, code=0):
    result = CliRunner().invoke(main, ["checks", args[0], "--dsn", dsn, *args[1:]])
    assert result.exit_code == code, result.output
    return result.output


def test_cli_add_takes_every_add_check_argument_and_hints_name_cli_commands(dsn, db):
    out = run(dsn, "add", "order", "7", "--job", "sms", "--kind", "python", "--after", "1h", "--max-checks", "2",
              "--horizon", "2d", "--payload", '{"a": 1}')
    assert out.startswith("check ")
    [c] = CheckClient(db).list()
    assert (c.max_checks, c.payload, c.kind) == (2, {"a": 1}, "python")
    assert "runs=0/2" in run(dsn, "list", "--entity-name", "order", "--job", "sms")
    again = run(dsn, "add", "order", "7", "--job", "sms", "--kind", "python", "--after", "1h")
    assert "already pending" in again and "pyscheduler checks delete" in again
    out = run(dsn, "add", "order", "7", "--job", "sms", "--kind", "task", "--after", "1h", code=1)
    assert "pyscheduler checks delete ENTITY_NAME ENTITY_KEY --job JOB" in out and "delete_checks" not in out
    out = run(dsn, "add", "order", "8", "--job", "sms", "--kind", "python", "--after", "3d", "--horizon", "1d",
              code=2)  # a flag value the database refuses (PS403): a usage error
    assert "--horizon" in out
    assert run(dsn, "delete", "order", "7").strip() == "deleted 1 check(s)"
    assert "deleted" in run(dsn, "history", "--entity-name", "order", "--entity-key", "7")
    assert "--entity-key needs --entity-name" in run(dsn, "history", "--entity-key", "7", code=2)
