"""Read-only work on a standby: with ``target_session_attrs=prefer-standby``,
the monitor role's views and read functions, and ``pyscheduler schedules list``, answer
from a streaming-replication standby (made with the pgserver wheel's ``pg_basebackup -R``)
as they do on the primary. Nothing of theirs writes, and nothing reads what a standby
cannot: an unlogged table (``_caller()`` skips ``_user_code`` in recovery)."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import psycopg
import pytest

from pyscheduler import embedded, migrate
from pyscheduler.db import Database, Jsonb

# a standby server of its own, on the real clock; the module's tests share it, so one worker runs them
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("standby")]

# What each read function is called with (the rest have defaults for every argument).
ARGS = {
    "get_task": lambda ids: {"rn": ids["task"]},
    "get_schedule": lambda ids: {"name": "nightly"},
    "execution_count": lambda ids: {"name": "nightly"},
    "schedule_runs": lambda ids: {"name": "nightly"},
    "next_task_due": lambda ids: {"queue": "mail"},
    "resync_progress": lambda ids: {"sync_id": "none"},
    "next_cron_time": lambda ids: {"expr": "0 3 * * *"},
    "slot_round": lambda ids: {"ts": ids["now"]},
    "upcoming_runs": lambda ids: {"name": "nightly"},
    "find_checks": lambda ids: {"entity_key": "42"},  # the dashboard's search (issue 30)
    "find_schedules": lambda ids: {"target_prefix": "mail"},
    "find_message": lambda ids: {"id": "m-1"},
    "find_tasks": lambda ids: {"unique_key": "k"},
    "task_family": lambda ids: {"rn": ids["task"]},
}


@pytest.fixture(scope="module")
def standby_pair(tmp_path_factory):
    """A migrated primary with a task, a schedule, a check and a delayed message, and a
    standby made after them (a base backup holds what was committed before it, and a hot
    standby takes connections once it replayed to the backup's end); (primary, standby, ids)."""
    workdir = tmp_path_factory.mktemp("standby")
    primary = embedded.Postgres(workdir / "primary").start()
    standby = None
    try:
        migrate.migrate(primary.dsn())
        with Database(primary.dsn(), max_size=1) as db:
            with db.connection() as c:
                c.execute("CREATE FUNCTION public.no_job(c pyscheduler.future_check) RETURNS timestamptz "
                          "LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp "
                          "AS 'SELECT NULL::timestamptz'")
            task = db.call_value("submit_task", queue="mail", spec=Jsonb({"to": "a"}), run_in=timedelta(hours=1))
            db.call("create_schedule", name="nightly", cron="0 3 * * *", target_kind="task", target="mail")
            db.call("add_check", entity_name="order", entity_key="7", job="public.no_job",
                    check_after=timedelta(hours=1))
            db.call("enqueue_message", id="m-1", deadline=db.query("SELECT now() + interval '1 hour' AS t")[0]["t"],
                    key=b"k", value=b"v")
            now = db.query("SELECT now() AS t")[0]["t"]
        standby = embedded.Standby(workdir / "standby", primary).start()
        yield primary, standby, {"task": task["rn"], "now": now}
    finally:
        for server in (standby, primary):
            if server is not None:
                server.stop()


def prefer_standby(primary, standby) -> str:
    return (f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/postgres"
            "?target_session_attrs=prefer-standby")


def test_every_monitor_view_and_read_function_answers_on_the_standby(standby_pair):
    primary, standby, ids = standby_pair
    with psycopg.connect(prefer_standby(primary, standby), autocommit=True) as c:
        assert c.execute("SELECT pg_is_in_recovery()").fetchone()[0]
        c.execute("SET ROLE pyscheduler_monitor")
        views = [r[0] for r in c.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'pyscheduler' AND c.relkind = 'v' "
            "AND has_table_privilege('pyscheduler_monitor', c.oid, 'SELECT') ORDER BY 1")]
        functions = c.execute(
            "SELECT p.proname, p.pronargs - p.pronargdefaults FROM pg_proc p "
            "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'pyscheduler' "
            "AND p.proname !~ '^_' AND p.provolatile <> 'v' "
            "AND has_function_privilege('pyscheduler_monitor', p.oid, 'EXECUTE') ORDER BY 1").fetchall()
        assert {"task_counts", "queue_status", "delay_queue"} <= set(views) and len(functions) >= 10
        for view in views:
            c.execute(f"SELECT * FROM pyscheduler.{view} LIMIT 10").fetchall()
        for name, required in functions:
            args = ARGS[name](ids) if name in ARGS else {}
            assert len(args) >= required, f"give {name} its arguments in ARGS"
            named = ", ".join(f"{k} => %({k})s" for k in args)
            c.execute(f"SELECT * FROM pyscheduler.{name}({named})", args).fetchall()
        assert c.execute("SELECT pyscheduler.get_task(%s) ->> 'status'", (ids["task"],)).fetchone()[0] == "scheduled"
        assert c.execute("SELECT waiting FROM pyscheduler.delay_queue").fetchone()[0] == 1


def test_schedules_list_reads_from_the_standby(standby_pair):
    primary, standby, _ = standby_pair
    out = subprocess.run([sys.executable, "-m", "pyscheduler", "schedules", "list", "--dsn",
                          prefer_standby(primary, standby)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "nightly"
