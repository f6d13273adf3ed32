"""The check runner end to end on real time with half-second slots: shards, SKIP LOCKED,
catch-up after downtime, timeouts, errors, task jobs, the CLI."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from datetime import timedelta

import pytest
from click.testing import CliRunner

from tests.support.checks import Counting, add_many, history, scrape, wait_history
from pyscheduler.checks import Check, CheckRunner, task_handler
from pyscheduler.cli import main
from pyscheduler.db import Jsonb
from pyscheduler.tasks import Worker
from tests.support import REPO, wait_for

pytestmark = pytest.mark.slow  # every test here: daemons, processes or servers of its own, on the real clock


SLEEPY_SQL = """
CREATE SCHEMA app;
CREATE FUNCTION app.nap(c pyscheduler.future_check) RETURNS timestamptz
LANGUAGE plpgsql SECURITY DEFINER SET search_path = app, pg_temp AS $$
BEGIN
    PERFORM pg_sleep((c.payload ->> 'sleep')::float);
    IF c.payload ? 'raise' THEN
        RAISE EXCEPTION 'job for % failed', c.entity_key;
    END IF;
    RETURN NULL;
END $$;
"""


def test_two_runners_on_shards_0_and_1_of_2_run_disjoint_sets_covering_the_slot(slots, running, dsn):
    handler = Counting()
    ids = add_many(slots, 200, "count", "python")
    runners = [running.start(CheckRunner(dsn, {"count": handler}, shard=k, shards=2, batch=30)) for k in (0, 1)]
    for r in runners:
        r.record_ids = True
    ended = wait_history(slots, 200)
    assert set(ended) == set(ids) and {h["outcome"] for h in ended.values()} == {"done"}
    zero, one = set(runners[0].ran), set(runners[1].ran)
    assert zero and one and not zero & one and zero | one == set(ids)
    assert all(i % 2 == 0 for i in zero) and all(i % 2 == 1 for i in one)
    assert set(handler.calls.values()) == {1}


def test_two_runners_on_the_same_shard_never_run_a_check_twice(slots, running, dsn):
    handler = Counting(sleep=0.002)  # slow enough that both runners work the slot at once
    ids = add_many(slots, 300, "count", "python")
    runners = [running.start(CheckRunner(dsn, {"count": handler}, batch=20)) for _ in range(2)]
    for r in runners:
        r.record_ids = True
    ended = wait_history(slots, 300)
    assert set(ended) == set(ids)
    assert len(handler.calls) == 300 and set(handler.calls.values()) == {1}, handler.calls.most_common(3)
    assert runners[0].ran and runners[1].ran  # both took part
    assert all(h["check_count"] == 1 for h in ended.values())


def test_a_runner_down_for_three_slots_catches_up_exactly_once(slots, running, dsn):
    handler = Counting()
    ids = []
    for k in (1, 2, 3):
        ids += add_many(slots, 5, "count", "python", after=k / 2, prefix=f"s{k}-")
    assert len({r["next_check_at"] for r in slots.call("list_checks", max=100)}) == 3  # three slots
    last = max(r["next_check_at"] for r in slots.call("list_checks", max=100))
    wait_for(lambda: slots.call_one("check_slots")["slot"] > last, timeout=10, interval=0.05)  # all missed
    runner = running.start(CheckRunner(dsn, {"count": handler}, batch=4))
    ended = wait_history(slots, 15)
    assert set(ended) == set(ids) and set(handler.calls.values()) == {1}
    assert runner.slots_done.wait(10)
    # and the following slots run as they come, nothing twice
    more = add_many(slots, 3, "count", "python", after=1, prefix="later-")
    wait_history(slots, 18)
    assert set(handler.calls) == set(ids) | set(more) and set(handler.calls.values()) == {1}


def test_a_slow_job_ends_as_timeout_and_its_neighbours_run(slots, running, dsn, conn):
    conn.execute(SLEEPY_SQL)
    slow_py, quick = Counting(sleep=3.0), Counting()
    at = slots.call_one("check_slots")["clock"] + timedelta(seconds=1)
    added = {}
    for key, job, kind, payload in [("sql-slow", "app.nap", "sql", {"sleep": 3}),
                                    ("sql-quick", "app.nap", "sql", {"sleep": 0}),
                                    ("py-slow", "slow", "python", None), ("py-quick", "quick", "python", None)]:
        added[key] = slots.call_one("add_check", entity_name="order", entity_key=key, job=job, kind=kind, check_at=at,
                                    payload=Jsonb(payload) if payload else None)["id"]
    running.start(CheckRunner(dsn, {"slow": slow_py, "quick": quick}, timeout=0.5))
    ended = wait_history(slots, 4)
    outcome = {key: ended[i]["outcome"] for key, i in added.items()}
    assert outcome == {"sql-slow": "timeout", "sql-quick": "done", "py-slow": "timeout", "py-quick": "done"}
    assert "timeout" in ended[added["sql-slow"]]["error"]


def test_a_job_that_raises_ends_as_error_and_the_next_one_runs(slots, running, dsn, conn, caplog):
    """... and the runner logs it (issue 30: check errors were in the history only): a Python
    job's error with its text, the in-database ones counted per job."""
    caplog.set_level(logging.WARNING, logger="pyscheduler")
    conn.execute(SLEEPY_SQL)
    handler = Counting(fail={"p1"})
    py = add_many(slots, 3, "count", "python", prefix="p")
    sql = add_many(slots, 3, "app.nap", "sql", payload={"sleep": 0}, prefix="q")
    conn.execute("UPDATE pyscheduler.checks SET payload = '{\"sleep\": 0, \"raise\": true}' WHERE entity_key = 'q1'")
    unknown = add_many(slots, 1, "nobody_registered_me", "python", prefix="u")
    before = scrape()  # the series are per process: other tests of this process counted too
    running.start(CheckRunner(dsn, {"count": handler}))
    ended = wait_history(slots, 7)
    assert [ended[i]["outcome"] for i in py] == ["done", "error", "done"]
    assert [ended[i]["outcome"] for i in sql] == ["done", "error", "done"]
    assert "cannot check p1" in ended[py[1]]["error"] and "job for q1 failed" in ended[sql[1]]["error"]
    assert ended[unknown[0]]["outcome"] == "error" and "no Python handler" in ended[unknown[0]]["error"]
    logged = caplog.text
    assert f"check {py[1]} (job count) ended with error: " in logged and "cannot check p1" in logged, logged
    assert f"check {unknown[0]} (job (unregistered)) ended with error: " in logged, logged
    assert "1 check of job app.nap ended with error (pyscheduler checks history shows why)" in logged, logged
    outcomes = {(r["job"], r["outcome"]): r["checks"] for r in slots.query("SELECT * FROM pyscheduler.check_outcomes")}
    assert outcomes[("count", "error")] == 1 and outcomes[("app.nap", "done")] == 2
    # the runner's series, per job (a Python job without a handler here: one label for all such)
    series = scrape()
    assert series['pyscheduler_checks_outcomes_total{job="count",outcome="done"}'] - before.get(
        'pyscheduler_checks_outcomes_total{job="count",outcome="done"}', 0) == 2
    for key in ('{job="count",outcome="error"}', '{job="app.nap",outcome="error"}',
                '{job="(unregistered)",outcome="error"}'):
        assert series["pyscheduler_checks_outcomes_total" + key] - before.get(
            "pyscheduler_checks_outcomes_total" + key, 0) == 1, key
    assert series['pyscheduler_checks_outcomes_total{job="app.nap",outcome="done"}'] - before.get(
        'pyscheduler_checks_outcomes_total{job="app.nap",outcome="done"}', 0) == 2
    assert not any("nobody_registered_me" in key for key in series)
    # and the slots it ran, with how late it began the last one (database clock minus the slot's start)
    assert series["pyscheduler_checks_slots_total"] > before.get("pyscheduler_checks_slots_total", 0)
    assert 0 <= series["pyscheduler_checks_slot_lag_seconds"] < 30


def test_a_python_check_is_rescheduled_until_done(slots, running, dsn):
    seen = []

    def twice(check: Check):
        seen.append(check.check_count)
        return check.next_check_at + timedelta(seconds=0.5) if check.check_count == 0 else None

    (cid,) = add_many(slots, 1, "twice", "python", after=0.5)
    running.start(CheckRunner(dsn, {"twice": twice}))
    ended = wait_history(slots, 1)
    assert seen == [0, 1] and ended[cid]["outcome"] == "done" and ended[cid]["check_count"] == 2


def test_a_task_job_runs_on_a_task_worker(slots, running, dsn):
    def slow_check(check: Check):
        return check.next_check_at + timedelta(seconds=1) if check.check_count == 0 else None

    (cid,) = add_many(slots, 1, "slow-checks", "task", after=1)
    running.start(CheckRunner(dsn, {}))
    running.start(Worker(dsn, "slow-checks", task_handler(slots, slow_check), timeout=5, poll_interval=0.2))
    ended = wait_history(slots, 1)
    assert ended[cid]["outcome"] == "done" and ended[cid]["check_count"] == 2
    # the handler records the check, then the worker completes its task (two tasks: two runs)
    wait_for(lambda: [t["task"]["status"] for t in slots.call("list_tasks", queue="slow-checks")]
             == ["completed", "completed"], timeout=30)


def test_the_cli_adds_lists_deletes_and_shows_history(dsn, conn):
    conn.execute(SLEEPY_SQL)
    cli = CliRunner()

    def run(*args):
        result = cli.invoke(main, [*args[:2], "--dsn", dsn, *args[2:]], catch_exceptions=False)
        return result

    added = run("checks", "add", "order", "42", "--job", "app.nap", "--after", "3h", "--payload", '{"sleep": 0}')
    assert added.exit_code == 0 and added.output.startswith("check ")
    again = run("checks", "add", "order", "42", "--job", "app.nap", "--after", "5h")
    assert "already pending" in again.output
    listed = run("checks", "list", "--entity-name", "order")
    assert "order:42" in listed.output and "sql:app.nap" in listed.output
    bad = run("checks", "add", "order", "43", "--job", "app.missing", "--after", "1h")
    assert bad.exit_code == 2 and "PS402" not in bad.output and "does not exist" in bad.output
    deleted = run("checks", "delete", "order", "42")
    assert deleted.output.strip() == "deleted 1 check(s)"
    shown = run("checks", "history", "--entity-key", "42", "--entity-name", "order")
    assert "deleted" in shown.output and "order:42" in shown.output


def test_a_runner_killed_mid_batch_loses_nothing(slots, running, dsn, conn):
    """SIGKILL while a batch is half run: its locks die with its connection, the checks stay at
    their slot, another runner takes them; every check ends in the history exactly once."""
    ids = add_many(slots, 20, "slow", "python", after=0.5)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "pyscheduler", "checks", "run", "--dsn", dsn, "--batch", "5",
                             "--handlers", "tests.support.checks_handlers"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        before = wait_for(lambda: len(h := history(slots)) >= 5 and h, timeout=30, interval=0.02)
        proc.kill()
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert len(before) < 20, "the killed runner had finished everything: nothing was mid-batch"
    wait_for(lambda: conn.execute("SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() "
                                  "AND state = 'idle in transaction'").fetchone()["n"] == 0, timeout=30)
    rescuer = Counting()
    running.start(CheckRunner(dsn, {"slow": rescuer}))
    ended = wait_history(slots, 20)
    assert set(ended) == set(ids) and {h["outcome"] for h in ended.values()} == {"done"}
    assert set(rescuer.calls) == set(ids) - set(before) and set(rescuer.calls.values()) == {1}


def test_the_demo_reproduces_the_seeds_order_example(dsn):
    from pyscheduler.checks import cli
    from pyscheduler.daemon import RunContext

    lines: list[str] = []
    cli.demo(RunContext(dsn=dsn), lines.append)
    alerts = [line.split(",")[0].split() for line in lines if "alert for order" in line]
    assert sorted((a[0], a[-1]) for a in alerts) == [("escalation", "A"), ("primary", "A"), ("primary", "C")]
    assert sum("done" in line for line in lines if line.strip().startswith("order ")) == 3
