"""`pyscheduler tasks ...` for the job queue: submit later and once,
retry, abort, pause, resume, queues; list filters; hints that name commands."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from pyscheduler.cli import main
from pyscheduler.db import Jsonb


def run(dsn, *args):
    result = CliRunner().invoke(main, ["tasks", args[0], "--dsn", dsn, *args[1:]])
    return result


def answer(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_submit_later_once_and_with_max_attempts(dsn, db):
    task = answer(run(dsn, "submit", "cli", '{"a": 1}', "--delay", "1h", "--unique-key", "report:1",
                      "--max-attempts", "3"))
    assert (task["status"], task["unique_key"], task["max_attempts"]) == ("scheduled", "report:1", 3)
    again = answer(run(dsn, "submit", "cli", '{"a": 2}', "--unique-key", "report:1"))
    assert again["rn"] == task["rn"] and again["deduplicated"] is True
    at = answer(run(dsn, "submit", "cli", "{}", "--run-at", "2999-01-01T00:00:00"))
    assert at["status"] == "scheduled" and at["run_at"] == "2999-01-01T00:00:00.000000Z"  # UTC without an offset
    out = run(dsn, "list", "--queue", "cli", "--status", "scheduled")
    assert out.exit_code == 0 and task["rn"] in out.output and "run_at=" in out.output
    for bad in (["--delay", "1s", "--run-at", "2999-01-01T00:00:00"], ["--max-attempts", "0"],
                ["--run-at", "tomorrow"], ["--unique-key", "a\x00b"]):
        result = run(dsn, "submit", "cli", "{}", *bad)
        assert result.exit_code == 2, (bad, result.output)
    result = run(dsn, "submit", "cli", "{}", "--run-at", "1969-01-01T00:00:00")
    assert result.exit_code == 2 and "run_at" in result.stderr  # refused by the database: a bad flag value


def test_retry_one_task_or_a_queues_batch_with_hints_naming_commands(dsn, db):
    def aborted(queue: str) -> str:
        rn = db.call_value("submit_task", queue=queue, spec=Jsonb({}))["rn"]
        t = db.call_value("lease_task", queue=queue, worker="w")
        db.call("abort_task", rn=t["rn"], token=t["token"], errors=Jsonb([{"code": "bug"}]))
        return rn

    rn = aborted("r1")
    task = answer(run(dsn, "retry", rn))
    assert task["status"] == "ready" and task["attempts"] == 0
    result = run(dsn, "retry", rn)
    assert result.exit_code == 1 and "pyscheduler tasks get RN" in result.stderr
    assert "retry_task" not in result.stderr and "NULL" not in result.stderr
    rns = [aborted("r2") for _ in range(3)]
    result = run(dsn, "retry", "--queue", "r2", "--limit", "2")
    assert result.exit_code == 0 and result.stdout.splitlines()[:2] == rns[:2]
    assert "requeued 2 aborted tasks of queue r2 (at most 2" in result.stdout
    assert run(dsn, "retry").exit_code == 2 and run(dsn, "retry", rn, "--queue", "r2").exit_code == 2
    result = run(dsn, "cancel", db.call_value("get_task", rn=rn)["rn"])
    assert result.exit_code == 0
    db.call("complete_task", **{k: v for k, v in db.call_value("lease_task", queue="r2", worker="w").items()
                                if k in ("rn", "token")})
    done = [t["task"]["rn"] for t in db.call("list_tasks", queue="r2", status="completed")][0]
    result = run(dsn, "cancel", done)
    assert result.exit_code == 1 and "pyscheduler tasks retry RN" in result.stderr


def test_abort_as_the_lease_holder(dsn, db):
    db.call("submit_task", queue="ab", spec=Jsonb({}))
    t = db.call_value("lease_task", queue="ab", worker="w")
    task = answer(run(dsn, "abort", t["rn"], "--token", t["token"], "--code", "superseded", "--description", "new"))
    assert task["status"] == "aborted" and task["errors"] == [{"code": "superseded", "args": {}, "description": "new"}]
    result = run(dsn, "abort", t["rn"], "--token", t["token"], "--code", "x")
    assert result.exit_code == 1 and "pyscheduler tasks get RN" in result.stderr
    assert run(dsn, "abort", t["rn"], "--token", "nope", "--code", "x").exit_code == 2


def test_pause_resume_and_queues(dsn, db):
    db.call("submit_task", queue="pq", spec=Jsonb({}))
    paused = answer(run(dsn, "pause", "pq", "--note", "bank down"))
    assert paused["paused"] is True and paused["note"] == "bank down"
    assert db.call_value("lease_task", queue="pq", worker="w") is None
    out = run(dsn, "queues")
    assert out.exit_code == 0
    [line] = [x for x in out.stdout.splitlines() if x.startswith("pq ")]
    assert "ready=1" in line and "PAUSED" in line and "bank down" in line
    assert answer(run(dsn, "resume", "pq"))["paused"] is False
    assert db.call_value("lease_task", queue="pq", worker="w") is not None
    for bad in (["pause", "pq", "--note", "a\x00b"], ["pause", "x" * 41]):
        result = run(dsn, *bad)
        assert result.exit_code in (1, 2) and ("--note" in result.output or "queue" in result.output), bad


def test_keep_completed_sets_whether_a_queue_keeps_its_completed_tasks(dsn, db):
    assert answer(run(dsn, "keep-completed", "kq", "no"))["keep_completed"] is False
    db.call("submit_task", queue="kq", spec=Jsonb({}))
    task = db.call_value("lease_task", queue="kq", worker="w")
    db.call("complete_task", rn=task["rn"], token=task["token"])
    assert db.query("SELECT count(*) AS n FROM pyscheduler.tasks WHERE queue = 'kq'")[0]["n"] == 0
    assert answer(run(dsn, "keep-completed", "kq", "yes"))["keep_completed"] is True
    result = run(dsn, "keep-completed", "kq", "maybe")
    assert result.exit_code == 2 and "'maybe' is not one of 'yes', 'no'" in result.output


def test_queues_watch_redraws_a_table_and_flags_a_queue_nobody_works(dsn, db):
    """Issue 30 (`pyscheduler top`): `tasks queues --watch SECONDS` redraws the queues with a
    header row, when a worker of each was last seen, and NO WORKER where tasks are ready and no
    worker was seen for a minute."""
    db.call("submit_task", queue="orphan", spec=Jsonb({}))
    db.call("submit_task", queue="served", spec=Jsonb({}))
    db.call("worker_seen", worker=db.call_value("register_worker"), queue="served")
    out = run(dsn, "queues", "--watch", "0.5", "--iterations", "2")
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert [x.split()[:2] for x in lines if x.startswith("QUEUE")] == [["QUEUE", "READY"]] * 2
    orphan = [x for x in lines if x.startswith("orphan ")][-1]  # the last redraw's
    served = [x for x in lines if x.startswith("served ")][-1]
    assert orphan.split()[1] == "1" and orphan.endswith("never  NO WORKER"), orphan
    assert served.endswith(" ago") and "NO WORKER" not in served, served


@pytest.mark.parametrize("status", ["scheduled", "ready", "aborted"])
def test_list_takes_every_status(dsn, status):
    assert run(dsn, "list", "--status", status).exit_code == 0


def test_limits_shows_and_sets_a_queues_limits(dsn, db):
    set_ = answer(run(dsn, "limits", "lq", "--running-per-key", "2", "--running-total", "10"))
    assert (set_["running_per_key"], set_["running_total"]) == (2, 10)
    rate = answer(run(dsn, "limits", "lq", "--rate", "500/1s"))
    assert (rate["rate_starts"], rate["rate_per"], rate["running_per_key"]) == (500, "1s", 2)
    kept = answer(run(dsn, "limits", "lq", "--running-total", "none"))
    assert (kept["running_per_key"], kept["running_total"], kept["rate_starts"]) == (2, None, 500)
    out = run(dsn, "limits")
    assert out.exit_code == 0
    [line] = [x for x in out.stdout.splitlines() if x.startswith("lq ")]
    assert "running_per_key=2" in line and "rate=500/1s" in line
    assert db.query("SELECT running_per_key FROM pyscheduler.queue_limits")[0]["running_per_key"] == 2
    for bad in (["limits", "lq", "--running-per-key", "0"], ["limits", "lq", "--rate", "5"],
                ["limits", "lq", "--rate", "5/0s"], ["limits", "--running-total", "3"]):
        result = run(dsn, *bad)
        assert result.exit_code in (1, 2), (bad, result.output)
    result = run(dsn, "limits", "lq", "--rate", "5/0s")
    assert "1..1000000" in result.output or "per" in result.output or "PS216" in result.output, result.output
