"""Leased tasks as a job queue, SQL API: delayed tasks, failures retried with
backoff, requeue, unique tasks, queue pause, ownership; bounds and hostile input."""

from __future__ import annotations

import threading
import uuid
from datetime import datetime, timedelta

import psycopg
import pytest
from psycopg.rows import dict_row

from pyscheduler.db import Database, Jsonb

from tests.support import code
from tests.support.tasks import T0, at, call, held, lease, submit, types_of, value

ERROR = {"code": "upstream", "args": {"status": 503}, "description": "upstream 503"}


def ts(text: str) -> datetime:
    return datetime.fromisoformat(text)


def fail(db, h, now=None, error=None, **kw):
    return value(db, "fail_task", now, **h, error=Jsonb(error or ERROR), **kw)


def get(db, rn):
    return db.call_value("get_task", rn=rn)


def set_setting(conn, name: str, value: str) -> None:
    conn.execute("UPDATE pyscheduler.settings SET value = %s WHERE name = %s", (value, name))


# ------------------------------------------------------------------ item 1: delayed tasks


def test_a_delayed_task_is_scheduled_and_not_leased_before_its_run_at(tx):
    task = submit(tx, now=at(0), run_at=at(60))
    assert task["status"] == "scheduled" and ts(task["run_at"]) == at(60)
    assert lease(tx, now=at(59.999)) is None
    assert get(tx, task["rn"])["status"] == "scheduled"
    leased = lease(tx, now=at(60))
    assert leased["rn"] == task["rn"] and leased["status"] == "running"
    assert ts(leased["run_at"]) == at(60)  # kept: when it was due


def test_a_run_at_in_the_past_or_null_is_ready_at_once(tx):
    assert submit(tx, now=at(0), run_at=at(-10))["status"] == "ready"
    assert submit(tx, now=at(0), run_at=None)["status"] == "ready"
    assert [t["task"]["status"] for t in call(tx, "submit_tasks", at(0), queue="q", specs=Jsonb([{}, {}]),
                                               run_at=at(5))] == ["scheduled", "scheduled"]


def test_due_tasks_lease_in_priority_then_age_then_submission_order(tx):
    """Lease order among due tasks is unchanged: a delayed task joins the ready ones where its
    priority and its age (created) put it, whatever its run_at."""
    late_high = submit(tx, spec={"n": "late-high"}, now=at(0), run_at=at(50), priority=90)["rn"]
    old_low = submit(tx, spec={"n": "old-low"}, now=at(1), run_at=at(10), priority=10)["rn"]
    ready_mid = submit(tx, spec={"n": "ready-mid"}, now=at(2), priority=50)["rn"]
    new_low = submit(tx, spec={"n": "new-low"}, now=at(3), priority=10)["rn"]
    not_due = submit(tx, spec={"n": "not-due"}, now=at(4), run_at=at(1000), priority=99)["rn"]
    order = [lease(tx, now=at(100))["rn"] for _ in range(4)]
    assert order == [late_high, ready_mid, old_low, new_low]
    assert lease(tx, now=at(100)) is None and get(tx, not_due)["status"] == "scheduled"


def test_a_batch_lease_takes_due_tasks_in_claim_order(tx):
    call(tx, "submit_tasks", at(0), queue="b", specs=Jsonb([{"i": i} for i in range(5)]), run_at=at(30))
    call(tx, "submit_tasks", at(1), queue="b", specs=Jsonb([{"i": i} for i in range(5, 8)]))
    rows = call(tx, "lease_tasks", at(10), queue="b", worker="w", n=100)
    assert [r["task"]["spec"]["i"] for r in rows] == [5, 6, 7]
    rows = call(tx, "lease_tasks_lean", at(30), queue="b", worker="w", n=100)
    assert [r["spec"]["i"] for r in rows] == [0, 1, 2, 3, 4]


def test_the_lease_reads_a_bounded_number_of_pages_however_many_tasks_are_delayed(tx):
    """design.md: cost stays flat as stored work grows. 20,000 delayed tasks not due are
    never stepped over: the lease's probe of them reads a few index pages, as with none."""

    def probe_buffers() -> int:
        plan = tx.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT (SELECT r.run_at FROM pyscheduler.tasks r "
            "WHERE r.queue = 'flat' AND r.status = 'scheduled' ORDER BY r.run_at LIMIT 1) <= now()").fetchone()
        node = plan["QUERY PLAN"][0]["Plan"]
        return node["Shared Hit Blocks"] + node.get("Shared Read Blocks", 0)

    submit(tx, queue="flat", run_at=T0)
    few = probe_buffers()
    tx.call("submit_tasks", queue="flat", specs=Jsonb([{"i": i} for i in range(20_000)]), run_at=T0)
    tx.execute("ANALYZE pyscheduler.tasks")
    assert probe_buffers() <= few + 2 <= 8
    ready = submit(tx, queue="flat")["rn"]
    assert lease(tx, queue="flat")["rn"] == ready


def test_next_task_due_bounds_an_idle_workers_wait(db):
    assert db.call_value("next_task_due", queue="q") is None
    submit(db, run_at=datetime.now().astimezone() + timedelta(hours=1))
    due = db.call_value("next_task_due", queue="q")
    assert timedelta(minutes=59) < due <= timedelta(hours=1)
    submit(db, run_at=T0 - timedelta(days=3650))  # in the past: ready
    long_ago = datetime.now().astimezone() - timedelta(days=2)
    submit(db, queue="past", now=long_ago, run_at=long_ago + timedelta(days=1))  # scheduled, due a day ago
    assert db.call_value("next_task_due", queue="past") == timedelta(0)
    db.call("pause_queue", queue="q")
    assert db.call_value("next_task_due", queue="q") is None  # paused: nothing to wait for


@pytest.mark.parametrize("run_at", ["10000-01-01T00:00:00Z", "1969-12-31T23:59:59Z", "infinity", "-infinity",
                                    "9999-01-01T00:00:00Z"])
def test_a_run_at_outside_the_instants_is_ps212(tx, run_at):
    for fn in ("submit_task(queue => 'q', spec => '{}', run_at => %s)",
               "submit_tasks(queue => 'q', specs => '[{}]', run_at => %s)"):
        with pytest.raises(psycopg.Error) as info:
            tx.execute(f"SELECT * FROM pyscheduler.{fn}", (run_at,))
        assert info.value.sqlstate == "PS212", (fn, run_at)
    assert tx.execute("SELECT count(*) AS n FROM pyscheduler.tasks").fetchone()["n"] == 0


def test_run_in_delays_by_the_database_clock(tx):
    for fn in ("submit_task(queue => 'q', spec => '{}', run_in => '90 seconds')",
               "submit_tasks(queue => 'q', specs => '[{}]', run_in => '90 seconds')"):
        row = tx.execute(f"SELECT t ->> 'status' AS status, (t ->> 'run_at')::timestamptz - now() AS d "
                           f"FROM pyscheduler.{fn} AS t").fetchone()
        assert (row["status"], row["d"]) == ("scheduled", timedelta(seconds=90))
    ready = tx.execute("SELECT pyscheduler.submit_task('q', '{}', run_in => '0') AS t").fetchone()["t"]
    assert ready["status"] == "ready"


@pytest.mark.parametrize("args", ["run_in => '-1 second'", "run_in => '366 days'", "run_in => '13 months'",
                                  "run_in => '10 seconds', run_at => now()"])
def test_a_run_in_outside_0_to_365_days_or_with_run_at_is_ps212(conn, args):
    for fn in (f"submit_task(queue => 'q', spec => '{{}}', {args})",
               f"submit_tasks(queue => 'q', specs => '[{{}}]', {args})"):
        with pytest.raises(psycopg.Error) as info:
            conn.execute(f"SELECT * FROM pyscheduler.{fn}")
        assert info.value.sqlstate == "PS212", (fn, args)
        conn.rollback()
    assert conn.execute("SELECT count(*) AS n FROM pyscheduler.tasks").fetchone()["n"] == 0


# ------------------------------------------------------------------ item 2: failures and retries


def test_a_failed_attempt_is_retried_after_the_backoff_with_its_error_and_history(tx):
    rn = submit(tx, now=at(0))["rn"]
    h = held(lease(tx, now=at(1)))
    task = fail(tx, h, now=at(2))
    assert task["status"] == "scheduled" and task["owner"] is None and task["deadline"] is None
    assert task["errors"] == [ERROR] and task["attempts"] == 1 and task["progress"] == 0
    delay = (ts(task["run_at"]) - at(2)).total_seconds()
    assert 1.0 <= delay < 3.0  # least(1 s * 2^1, 1 h) * [0.5, 1.5)
    assert types_of(task) == ["TaskAssignment", "TaskRetry"]
    retry = task["history"][-1]
    assert (retry["worker"], retry["attempt"], ts(retry["time"]), retry["run_at"]) == ("w1", 1, at(2), task["run_at"])
    for fn in ("heartbeat_task", "complete_task"):  # the failed lease is gone
        assert code(lambda: tx.call(fn, **h)) == "PS202", fn
    assert lease(tx, now=ts(task["run_at"]) - timedelta(milliseconds=1)) is None
    assert lease(tx, now=ts(task["run_at"]))["rn"] == rn


def test_a_task_failing_twice_then_succeeding_completes_with_3_attempts_and_2_errors(tx):
    rn = submit(tx, now=at(0))["rn"]
    when = 1.0
    for k in (1, 2):
        h = held(lease(tx, now=at(when)))
        task = fail(tx, h, now=at(when), error={"code": f"E{k}"})
        delay = (ts(task["run_at"]) - at(when)).total_seconds()
        assert 2 ** k * 0.5 <= delay < 2 ** k * 1.5, (k, delay)
        when += 10
    h = held(lease(tx, now=at(when)))
    tx.call("complete_task", **h)
    task = get(tx, rn)
    assert task["status"] == "completed" and task["attempts"] == 3
    assert [e["code"] for e in task["errors"]] == ["E1", "E2"]
    assert types_of(task) == ["TaskAssignment", "TaskRetry", "TaskAssignment", "TaskRetry", "TaskAssignment"]


def test_the_backoff_grows_up_to_its_cap_and_follows_the_settings(tx):
    set_setting(tx, "task_backoff_base", "10 seconds")
    set_setting(tx, "task_backoff_cap", "1 minute")
    submit(tx, now=at(0))
    delays = []
    when = 0.0
    for _ in range(5):
        task = fail(tx, held(lease(tx, now=at(when))), now=at(when))
        delays.append((ts(task["run_at"]) - at(when)).total_seconds())
        when += 1000
    bounds = [min(10 * 2 ** a, 60) for a in range(1, 6)]  # 20, 40, 60, 60, 60
    assert all(b * 0.5 <= d < b * 1.5 for d, b in zip(delays, bounds)), delays


def test_retry_in_chooses_the_delay_and_zero_is_ready_at_once(tx):
    submit(tx, now=at(0))
    task = fail(tx, held(lease(tx, now=at(0))), now=at(1), retry_in="90 seconds")
    assert task["status"] == "scheduled" and ts(task["run_at"]) == at(91)
    task = fail(tx, held(lease(tx, now=at(91))), now=at(92), retry_in="0")
    assert task["status"] == "ready" and ts(task["run_at"]) == at(92)
    assert lease(tx, now=at(92))["rn"] == task["rn"]


@pytest.mark.parametrize("retry_in", ["-1 second", "366 days", "1 year"])
def test_a_retry_in_outside_its_bounds_is_ps212_and_changes_nothing(tx, retry_in):
    submit(tx)
    h = held(lease(tx))
    assert code(lambda: tx.call("fail_task", **h, error=Jsonb(ERROR), retry_in=retry_in)) == "PS212"
    assert get(tx, h["rn"])["status"] == "running"


def test_a_task_that_used_its_max_attempts_is_aborted_with_all_its_errors(tx):
    rn = submit(tx, now=at(0), max_attempts=2)["rn"]
    fail(tx, held(lease(tx, now=at(0))), now=at(0), error={"code": "E1"})
    task = fail(tx, held(lease(tx, now=at(100))), now=at(100), error={"code": "E2"})
    assert task["status"] == "aborted" and task["attempts"] == 2 and task["owner"] == "w1"
    assert task["errors"][:2] == [{"code": "E1", "args": {}, "description": ""},
                                  {"code": "E2", "args": {}, "description": ""}]
    assert task["errors"][2] == {"code": "TaskMaxAttempts", "args": {"attempts": 2, "max_attempts": 2},
                                 "description": "attempt 2 of 2 failed"}
    assert lease(tx, now=at(10_000)) is None and get(tx, rn)["status"] == "aborted"
    set_setting(tx, "task_max_attempts", "1")  # the setting, for tasks without their own
    other = submit(tx, now=at(0))
    assert fail(tx, held(lease(tx, now=at(0))), now=at(0))["status"] == "aborted"
    assert get(tx, other["rn"])["max_attempts"] is None


def test_timeouts_and_failures_count_against_the_same_attempts(tx):
    """The monitor's crash-loop guard and fail_task share the per-task max_attempts."""
    rn = submit(tx, now=at(0), max_attempts=3)["rn"]
    fail(tx, held(lease(tx, now=at(0))), now=at(1))
    lease(tx, now=at(100))
    assert [r["task"]["status"] for r in call(tx, "reset_expired_tasks", at(200))] == ["ready"]
    lease(tx, now=at(300))
    [reset] = [r["task"] for r in call(tx, "reset_expired_tasks", at(400))]
    assert reset["status"] == "aborted" and reset["attempts"] == 3
    assert [e["code"] for e in reset["errors"]] == ["upstream", "TaskMaxAttempts"]
    assert reset["errors"][-1]["description"] == "attempt 3 of 3: the lease timed out"
    assert get(tx, rn)["status"] == "aborted"


def test_errors_stay_within_their_limits_keeping_the_newest(tx):
    set_setting(tx, "task_max_errors", "3")
    submit(tx, now=at(0), max_attempts=10)
    for k in range(5):
        task = fail(tx, held(lease(tx, now=at(100 * k))), now=at(100 * k), error={"code": f"E{k}"})
    assert [e["code"] for e in task["errors"]] == ["E2", "E3", "E4"]


@pytest.mark.parametrize("error", [None, [], "text", {"args": {}}, {"code": 5}, {"code": "x", "args": []},
                                   {"code": "x", "description": "d" * 10_000_000}])
def test_a_bad_error_is_ps207_and_the_lease_goes_on(tx, error):
    submit(tx)
    h = held(lease(tx))
    got = code(lambda: tx.call("fail_task", **h, error=Jsonb(error) if error is not None else None))
    assert got == "PS207"
    assert tx.call_value("heartbeat_task", **h)["status"] == "running"


def test_fail_tasks_fails_a_batch_and_answers_only_the_refused(tx):
    tx.call("submit_tasks", queue="b", specs=Jsonb([{"i": i} for i in range(4)]))
    leased = [r["task"] for r in tx.call("lease_tasks", queue="b", worker="w", n=4)]
    tx.call("cancel_task", rn=leased[3]["rn"])
    rns, tokens = [t["rn"] for t in leased], [t["token"] for t in leased]
    unknown = str(uuid.uuid4())
    refused = tx.call("fail_tasks", rns=rns + [unknown], tokens=tokens + [str(uuid.uuid4())],
                      errors=Jsonb([{"code": f"E{i}"} for i in range(5)]),
                      retry_in=[timedelta(0), timedelta(minutes=5), None, None, None])
    assert sorted((str(r["rn"]), r["sqlstate"]) for r in refused) == sorted([(rns[3], "PS203"), (unknown, "PS200")])
    statuses = [get(tx, rn)["status"] for rn in rns]
    assert statuses == ["ready", "scheduled", "scheduled", "cancelled"]
    assert [get(tx, rn)["errors"][0]["code"] for rn in rns[:3]] == ["E0", "E1", "E2"]


@pytest.mark.parametrize("args, expected", [
    (dict(errors=Jsonb([{"code": "x"}])), "PS207"),  # one error for two leases
    (dict(errors=Jsonb([{"code": "x"}, {"code": 1}])), "PS207"),  # the second is not an error
    (dict(errors=Jsonb([{"code": "x"}] * 2), retry_in=[timedelta(0)]), "PS208"),
    (dict(errors=Jsonb([{"code": "x"}] * 2), retry_in=[timedelta(days=400), None]), "PS212"),
])
def test_fail_tasks_refuses_bad_arrays_whole(tx, args, expected):
    tx.call("submit_tasks", queue="b", specs=Jsonb([{}, {}]))
    leased = [r["task"] for r in tx.call("lease_tasks", queue="b", worker="w", n=2)]
    assert code(lambda: tx.call("fail_tasks", rns=[t["rn"] for t in leased], tokens=[t["token"] for t in leased],
                                **args)) == expected
    assert {get(tx, t["rn"])["status"] for t in leased} == {"running"}


def test_a_concurrent_cancel_wins_over_a_failure(dsn, db):
    """The failure's guard is re-checked on the row it updates: a task cancelled while the
    fail waited for its lock stays cancelled."""
    submit(db)
    h = held(lease(db))
    with psycopg.connect(dsn) as other:
        other.execute("SELECT pyscheduler.cancel_task(rn => %s)", (h["rn"],))
        done = threading.Event()
        result = {}

        def failing():
            result["code"] = code(lambda: db.call("fail_task", **h, error=Jsonb(ERROR)))
            done.set()

        threading.Thread(target=failing, daemon=True).start()
        assert not done.wait(0.3)  # waits for the cancel's transaction
    assert done.wait(10) and result["code"] == "PS203"
    assert get(db, h["rn"])["status"] == "cancelled"


# ------------------------------------------------------------------ item 3: requeue


def test_retry_task_requeues_an_aborted_task_with_attempts_reset_and_errors_kept(tx):
    rn = submit(tx, now=at(0))["rn"]
    h = held(lease(tx, now=at(1)))
    tx.call("abort_task", **h, errors=Jsonb([{"code": "bug"}]))
    assert code(lambda: tx.call("complete_task", **h)) == "PS202"
    task = tx.call_value("retry_task", rn=rn)
    assert task["status"] == "ready" and task["attempts"] == 0 and task["owner"] is None
    assert task["errors"] == [{"code": "bug", "args": {}, "description": ""}]
    assert types_of(task) == ["TaskAssignment", "TaskRequeued"]
    requeued = task["history"][-1]
    assert (requeued["by"], requeued["status"], requeued["attempts"]) == ("postgres", "aborted", 1)
    again = lease(tx)
    assert again["rn"] == rn and again["attempts"] == 1
    assert code(lambda: tx.call("complete_task", **h)) == "PS201"  # the old lease stays refused
    tx.call("complete_task", **held(again))


def test_retry_task_requeues_a_cancelled_task_and_refuses_live_or_completed_ones(tx):
    rn = submit(tx)["rn"]
    assert code(lambda: tx.call("retry_task", rn=rn)) == "PS211"  # ready
    h = held(lease(tx))
    assert code(lambda: tx.call("retry_task", rn=rn)) == "PS211"  # running
    fail(tx, h)
    assert code(lambda: tx.call("retry_task", rn=rn)) == "PS211"  # scheduled
    tx.call("cancel_task", rn=rn)
    assert tx.call_value("retry_task", rn=rn)["status"] == "ready"
    tx.call("complete_task", **held(lease(tx)))
    assert code(lambda: tx.call("retry_task", rn=rn)) == "PS211"  # completed
    assert code(lambda: tx.call("retry_task", rn=str(uuid.uuid4()))) == "PS200"


def test_retry_tasks_requeues_a_queues_aborted_tasks_oldest_first_in_batches(tx):
    rns = []
    for k in range(5):
        rns.append(submit(tx, queue="r", now=at(k))["rn"])
        value(tx, "abort_task", at(k), **held(lease(tx, queue="r", now=at(k))), errors=Jsonb([{"code": "x"}]))
    tx.call("cancel_task", rn=submit(tx, queue="r")["rn"])
    other = submit(tx, queue="elsewhere")["rn"]
    first = [r["task"]["rn"] for r in tx.call("retry_tasks", queue="r", max_tasks=3)]
    assert first == rns[:3]
    assert [r["task"]["rn"] for r in tx.call("retry_tasks", queue="r")] == rns[3:]
    assert tx.call("retry_tasks", queue="r") == []
    assert len(tx.call("retry_tasks", queue="r", status="cancelled")) == 1
    assert get(tx, other)["status"] == "ready"
    for bad in (dict(status="completed"), dict(status="ready"), dict(max_tasks=0), dict(max_tasks=10_001),
                dict(queue="")):
        assert code(lambda: tx.call("retry_tasks", **{"queue": "r", **bad})) == "PS208", bad


def test_a_requeue_never_makes_two_live_tasks_of_one_unique_key(tx):
    rn = submit(tx, unique_key="invoice:1")["rn"]
    tx.call("cancel_task", rn=rn)
    live = submit(tx, unique_key="invoice:1")
    assert live["rn"] != rn and "deduplicated" not in live
    assert code(lambda: tx.call("retry_task", rn=rn)) == "PS214"
    assert tx.call("retry_tasks", queue="q", status="cancelled") == []  # skipped, left as it is
    assert get(tx, rn)["status"] == "cancelled"


# ------------------------------------------------------------------ item 4: unique tasks


def test_a_second_submit_of_a_live_unique_key_returns_the_first_task(tx):
    first = submit(tx, spec={"v": 1}, unique_key="invoice:233")
    assert "deduplicated" not in first and first["unique_key"] == "invoice:233"
    for state in ("ready", "running", "scheduled"):
        if state == "running":
            h = held(lease(tx))
        if state == "scheduled":
            fail(tx, h)
        again = submit(tx, spec={"v": 2}, unique_key="invoice:233", priority=99)
        assert again["deduplicated"] is True and again["rn"] == first["rn"] and again["spec"] == {"v": 1}, state
        assert again["status"] == state and again["priority"] == 50
    assert submit(tx, queue="other", unique_key="invoice:233")["rn"] != first["rn"]  # keys are per queue
    assert len(tx.call("list_tasks", queue="q")) == 1


def test_once_the_task_finished_its_key_is_free_again(tx):
    first = submit(tx, unique_key="k")
    tx.call("complete_task", **held(lease(tx)))
    second = submit(tx, unique_key="k")
    assert second["rn"] != first["rn"] and "deduplicated" not in second


def test_fifty_concurrent_submits_of_one_key_make_one_task(dsn, db):
    n = 50
    barrier = threading.Barrier(n)
    answers: list[dict] = []
    failures: list[BaseException] = []

    def submitter(i: int) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as c:
                c.execute("SELECT 1")
                barrier.wait(30)
                answers.append(c.execute("SELECT pyscheduler.submit_task(queue => 'race', spec => %s, "
                                         "unique_key => 'one') AS t", (Jsonb({"i": i}),)).fetchone()["t"])
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=submitter, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert failures == [] and len(answers) == n
    assert len({a["rn"] for a in answers}) == 1
    assert sum(1 for a in answers if not a.get("deduplicated")) == 1
    assert len(db.call("list_tasks", queue="race")) == 1


def test_submit_tasks_deduplicates_within_the_batch_and_against_live_tasks(tx):
    live = submit(tx, queue="b", unique_key="a")["rn"]
    rows = [r["task"] for r in tx.call("submit_tasks", queue="b", specs=Jsonb([{"i": i} for i in range(5)]),
                                       unique_keys=["a", "b", None, "b", "c"])]
    assert [r["spec"]["i"] if not r.get("deduplicated") else None for r in rows] == [None, 1, 2, None, 4]
    assert rows[0]["rn"] == live and rows[3]["rn"] == rows[1]["rn"]
    assert [r.get("deduplicated", False) for r in rows] == [True, False, False, True, False]
    assert len(tx.call("list_tasks", queue="b")) == 4
    leased = [r["task"]["spec"].get("i") for r in tx.call("lease_tasks", queue="b", worker="w", n=10)]
    assert leased == [None, 1, 2, 4]  # the earlier live one first, then the batch in order
    assert code(lambda: tx.call("submit_tasks", queue="b", specs=Jsonb([{}]), unique_keys=["x", "y"])) == "PS208"


def test_concurrent_batches_with_overlapping_keys_make_one_task_per_key(dsn, db):
    keys = [f"k{i}" for i in range(200)]
    barrier = threading.Barrier(4)
    results: list[list[dict]] = []

    def batch(offset: int) -> None:
        mine = keys[offset:] + keys[:offset]
        with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as c:
            barrier.wait(30)
            results.append([r["task"] for r in c.execute(
                "SELECT task FROM pyscheduler.submit_tasks(queue => 'ov', specs => %s, unique_keys => %s)",
                (Jsonb([{"k": k} for k in mine]), mine))])

    threads = [threading.Thread(target=batch, args=(o,)) for o in (0, 50, 100, 150)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 4 and all(len(r) == 200 for r in results)
    by_key: dict[str, set] = {}
    for rows in results:
        for r in rows:
            by_key.setdefault(r["unique_key"], set()).add(r["rn"])
    assert set(by_key) == set(keys) and all(len(v) == 1 for v in by_key.values())
    assert len(db.call("list_tasks", queue="ov", max_tasks=1000)) == 200


@pytest.mark.parametrize("key", ["", " padded", "padded ", "line\nbreak", "zero\u200bwidth", "bidi\u202e",
                                 "x" * 201, "é" * 101, "x" * 10_000_000])
def test_a_bad_unique_key_is_ps213(tx, key):
    assert code(lambda: submit(tx, unique_key=key)) == "PS213"
    assert code(lambda: tx.call("submit_tasks", queue="q", specs=Jsonb([{}, {}]), unique_keys=["ok", key])) == "PS213"
    assert tx.call("list_tasks") == []


def test_nul_and_bad_utf8_never_reach_the_queue(dsn, db):
    """A text value with NUL cannot be sent at all (the driver refuses it); invalid UTF-8 is
    refused by the server as a class 22 data error before any function runs."""
    with pytest.raises(psycopg.DataError):
        db.call("submit_task", queue="q", spec=Jsonb({}), unique_key="a\x00b")
    with psycopg.connect(dsn, autocommit=True) as c:
        for value_ in (b"a\xff", b"a\xc3"):
            with pytest.raises(psycopg.Error) as info:
                c.execute(b"SELECT pyscheduler.submit_task(queue => 'q', spec => '{}', unique_key => '" + value_
                          + b"')")
            assert info.value.sqlstate.startswith("22")
    assert db.call("list_tasks") == []


@pytest.mark.parametrize("max_attempts", [0, -1, 1001])
def test_max_attempts_outside_1_to_1000_is_ps208(tx, max_attempts):
    assert code(lambda: submit(tx, max_attempts=max_attempts)) == "PS208"
    assert code(lambda: tx.call("submit_tasks", queue="q", specs=Jsonb([{}]), max_attempts=max_attempts)) == "PS208"
    assert submit(tx, max_attempts=1000)["max_attempts"] == 1000


# ------------------------------------------------------------------ item 5: pause


def test_a_paused_queue_leases_nothing_from_its_next_lease_call(tx):
    submit(tx, queue="p")
    paused = tx.call_value("pause_queue", queue="p", note="payment provider down")
    assert paused["paused"] is True and paused["note"] == "payment provider down"
    assert lease(tx, queue="p") is None
    assert tx.call("lease_tasks", queue="p", worker="w", n=10) == []
    assert tx.call("lease_tasks_lean", queue="p", worker="w", n=10) == []
    assert tx.call_value("complete_and_lease", queue="p", worker="w") is None
    assert lease(tx, queue="q") is None and submit(tx, queue="q") and lease(tx, queue="q")  # other queues lease
    resumed = tx.call_value("resume_queue", queue="p")
    assert resumed["paused"] is False and resumed["note"] is None
    assert lease(tx, queue="p")["queue"] == "p"


def test_pausing_lets_running_tasks_finish_and_new_tasks_wait(tx):
    submit(tx, queue="p")
    h = held(lease(tx, queue="p"))
    tx.call("pause_queue", queue="p")
    submit(tx, queue="p")
    assert tx.call_value("heartbeat_task", **h)["status"] == "running"
    assert tx.call_value("complete_task", **h)["status"] == "completed"
    assert lease(tx, queue="p") is None
    [row] = [r for r in tx.query("SELECT * FROM pyscheduler.queue_status") if r["queue"] == "p"]
    assert (row["ready"], row["running"], row["paused"]) == (1, 0, True)


def test_resume_wakes_the_queues_workers(dsn, db):
    db.call("pause_queue", queue="p")
    with psycopg.connect(dsn, autocommit=True) as listen:
        listen.execute('LISTEN "pyscheduler_tasks:p"')
        db.call("resume_queue", queue="p")
        assert [n.channel for n in listen.notifies(timeout=5, stop_after=1)] == ["pyscheduler_tasks:p"]


def test_a_queue_s_pause_belongs_to_its_owner_whoever_paused_it(login, db):
    _, app_a = login("pyscheduler_client")
    b_name, app_b = login("pyscheduler_client")
    _, admin = login("pyscheduler_admin")
    with Database(app_a, max_size=1) as a, Database(app_b, max_size=1) as b, Database(admin, max_size=1) as adm:
        assert a.call_value("pause_queue", queue="p", note="mine")["owner"] != b_name  # a new queue: a's
        assert code(lambda: b.call("resume_queue", queue="p")) == "42501"
        assert code(lambda: b.call("pause_queue", queue="p", note="theirs")) == "42501"
        assert a.call_value("pause_queue", queue="p", note="still mine")["note"] == "still mine"
        assert adm.call_value("resume_queue", queue="p")["paused"] is False
        assert adm.call_value("pause_queue", queue="p", note="admin")["paused"]
        assert a.call_value("resume_queue", queue="p")["paused"] is False  # the owner undoes the admin's pause
        assert a.call_value("resume_queue", queue="p")["paused"] is False  # not paused: unchanged
        assert adm.call_value("set_queue_owner", queue="p", owner=b_name)["owner"] == b_name
        assert b.call_value("pause_queue", queue="p")["paused"]
        assert code(lambda: a.call("resume_queue", queue="p")) == "42501"


@pytest.mark.parametrize("args", [dict(queue=""), dict(queue="x" * 41), dict(queue="q", note=""),
                                  dict(queue="q", note="x" * 1001), dict(queue="q", note="a\nb"),
                                  dict(queue="q", note="x" * 10_000_000)])
def test_pause_arguments_are_checked(tx, args):
    assert code(lambda: tx.call("pause_queue", **args)) == "PS208"
    assert tx.query("SELECT * FROM pyscheduler.task_queues") == []


def test_queue_status_counts_live_tasks_per_queue(tx):
    submit(tx, queue="s", now=at(0))
    submit(tx, queue="s", now=at(0), run_at=at(10**6))
    submit(tx, queue="s", now=at(0))
    lease(tx, queue="s", now=at(1))
    tx.call("complete_task", **held(lease(tx, queue="s", now=at(1))))
    tx.call("pause_queue", queue="only-paused")
    rows = {r["queue"]: r for r in tx.query("SELECT * FROM pyscheduler.queue_status")}
    s = rows["s"]
    assert (s["ready"], s["delayed"], s["running"], s["paused"]) == (0, 1, 1, False)
    assert s["next_due"] == at(10**6) and s["oldest_ready_age"] is None
    assert rows["only-paused"]["paused"] and rows["only-paused"]["ready"] == 0
    submit(tx, queue="s")
    age = {r["queue"]: r for r in tx.query("SELECT * FROM pyscheduler.queue_status")}["s"]["oldest_ready_age"]
    assert timedelta(0) <= age < timedelta(minutes=1)


def test_queue_status_reads_live_tasks_only(db, conn):
    """Its cost follows the live tasks, not the finished ones kept for retention: no scan of
    the whole table (task_counts counts every task)."""
    db.call("submit_tasks", queue="done", specs=Jsonb([{} for _ in range(5000)]))
    while rows := db.call("lease_tasks_lean", queue="done", worker="w", n=1000):
        db.call_binary("complete_tasks", rns=[r["rn"] for r in rows], tokens=[r["token"] for r in rows])
    submit(db, queue="live")
    conn.execute("VACUUM ANALYZE pyscheduler.tasks")
    plan = "\n".join(r["QUERY PLAN"] for r in conn.execute("EXPLAIN SELECT * FROM pyscheduler.queue_status"))
    assert "Seq Scan on tasks" not in plan, plan


# ------------------------------------------------------------------ ownership (convention C)


def test_tasks_belong_to_the_role_that_submitted_them(login, db):
    name_a, app_a = login("pyscheduler_client")
    _, app_b = login("pyscheduler_client")
    member, member_dsn = login(name_a)
    _, admin = login("pyscheduler_admin")
    with Database(app_a, max_size=1) as a, Database(app_b, max_size=1) as b, \
            Database(member_dsn, max_size=1) as m, Database(admin, max_size=1) as adm:
        rn = a.call_value("submit_task", queue="own", spec=Jsonb({}))["rn"]
        assert get(db, rn)["submitted_by"] == name_a
        assert code(lambda: b.call("cancel_task", rn=rn)) == "42501"
        assert get(db, rn)["status"] == "ready"
        assert m.call_value("cancel_task", rn=rn)["status"] == "cancelled"  # a member of the role
        assert code(lambda: b.call("retry_task", rn=rn)) == "42501"
        assert a.call_value("retry_task", rn=rn)["status"] == "ready"
        assert adm.call_value("cancel_task", rn=rn)["status"] == "cancelled"  # admin
        assert b.call("retry_tasks", queue="own", status="cancelled") == []  # not b's
        assert [r["task"]["rn"] for r in a.call("retry_tasks", queue="own", status="cancelled")] == [rn]
        assert member  # (the member role's name, for the record)


def test_a_task_fired_by_a_schedule_or_a_check_belongs_to_its_owner(login, db, conn):
    name, app = login("pyscheduler_client")
    with Database(app, max_size=1) as a:
        s = a.call_value("create_schedule", name="fires", target_kind="task", target="fired", every="1 hour",
                         payload=Jsonb({}))
        e = conn.execute("SELECT * FROM pyscheduler.index_entries(ids => %s)", ([s["id"]],)).fetchone()
        conn.execute("SELECT * FROM pyscheduler._fire_task_schedules(%s, %s, NULL, %s)",
                     ([s["id"]], [e["next_run_at"]], e["next_run_at"]))
        [task] = [r["task"] for r in db.call("list_tasks", queue="fired")]
        assert task["submitted_by"] == name
        assert a.call_value("cancel_task", rn=task["rn"])["status"] == "cancelled"
