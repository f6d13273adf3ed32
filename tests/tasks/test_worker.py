"""Leased tasks, Python side: worker library, monitor daemon, crashes (kill -9), CLI."""

from __future__ import annotations

import signal
import threading
import time
from datetime import timedelta

import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from pyscheduler import errors
from pyscheduler.cli import main
from pyscheduler.db import Jsonb
from pyscheduler.metrics import process_registry
from pyscheduler.daemon import RunContext
from pyscheduler.tasks import Abort, Monitor, TaskContext, Worker
from pyscheduler.tasks.worker.heartbeats import Heartbeats
from pyscheduler.tasks.cli import WorkerProcess, daemons
from tests.support import wait_for
from tests.support.tasks import logged, status, types_of

pytestmark = pytest.mark.slow  # every test here: daemons, processes or servers of its own, on the real clock


def test_worker_completes_tasks_and_reports_progress(dsn, client):
    release = threading.Event()

    def handler(ctx: TaskContext) -> None:
        ctx.progress(0.5)
        release.wait(10)

    running = Worker(dsn, "w", handler, timeout=3, heartbeat_interval=0.1).start()
    try:
        rn = client.submit("w", {"x": 1})["rn"]
        wait_for(lambda: client.get(rn)["progress"] == 0.5)  # sent by the heartbeat thread
        task = client.get(rn)
        assert task["status"] == "running" and task["owner"] == running.worker.worker_id
        release.set()
        wait_for(lambda: status(client, rn) == "completed")
        assert client.get(rn)["progress"] == 1
    finally:
        running.stop()


def test_worker_respects_capacity(dsn, client):
    active, peak, lock, release = [0], [0], threading.Lock(), threading.Event()

    def handler(ctx: TaskContext) -> None:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        release.wait(10)
        with lock:
            active[0] -= 1

    running = Worker(dsn, "cap", handler, capacity=2).start()
    try:
        rns = [t["rn"] for t in client.submit_many("cap", [{"i": i} for i in range(5)])]
        wait_for(lambda: len(client.list("cap", status="running")) == 2)
        assert len(client.list("cap", status="ready")) == 3
        wait_for(lambda: active[0] == 2)  # both handlers started (leased is not yet started)
        release.set()
        wait_for(lambda: all(status(client, rn) == "completed" for rn in rns))
        assert peak[0] == 2
    finally:
        running.stop()


def test_idle_worker_is_woken_by_notify_not_polling(dsn, client):
    started = threading.Event()
    running = Worker(dsn, "n", lambda ctx: started.set(), poll_interval=60).start()
    try:
        running.wait_idle()  # listening, first (empty) lease done; it polls again only after 60 s
        client.submit("n", {})
        assert started.wait(20), "an idle worker was not woken by the submit's NOTIFY"  # polls: every 60 s
    finally:
        running.stop()


@pytest.mark.parametrize("queue, late, within", [("throttled", 0.04, 1.0), ("late", 0.15, 0.5)])
def test_a_submit_whose_notify_was_throttled_is_leased_without_waiting_for_the_poll(dsn, conn, client, queue,
                                                                                    late, within):
    """A queue's NOTIFY is throttled (10 ms): a submit right after another sends none, and its
    commit may come tens of ms later on a busy server, or 150 ms later (a loaded server's WAL
    flush). The worker that was woken looks again after the throttle, the rechecks doubling up
    to 320 ms, so such a task starts then, not at the next poll (60 s here). Before, they
    stopped at 100 ms and a commit 150 ms late waited for the poll (0.5 s in the end-to-end
    bench: a start p99 of 0.6-0.8 s at 10,000 tasks/s)."""
    started: dict[str, float] = {}
    first = threading.Event()

    def handle(ctx):
        started[ctx.spec["name"]] = time.monotonic()
        first.set()

    running = Worker(dsn, queue, handle, capacity=2, poll_interval=60).start()
    try:
        running.wait_idle()
        client.submit(queue, {"name": "a"})  # notifies: the wake-up
        assert first.wait(20), "an idle worker was not woken by the submit's NOTIFY"
        # from now on the queue's channel is throttled: the next submit sends no NOTIFY
        conn.execute("UPDATE pyscheduler._notify_throttle SET channel = pyscheduler._task_channel(%s), "
                     "last_at = clock_timestamp() + interval '1 hour' "
                     "WHERE slot = hashtext(pyscheduler._task_channel(%s)) & 1023", (queue, queue))
        time.sleep(late)  # the scenario, not a wait for an event: the throttled submit commits late
        submitted = time.monotonic()
        client.submit(queue, {"name": "b"})
        assert wait_for(lambda: "b" in started, timeout=5), "the throttled submit waited for the poll (60 s)"
        assert started["b"] - submitted < within
    finally:
        running.stop()


def test_cancellation_reaches_the_handler_at_once_and_the_task_stays_cancelled(dsn, client):
    seen = threading.Event()

    def handler(ctx: TaskContext) -> None:
        if ctx.cancelled.wait(20):
            seen.set()

    # heartbeats every 30 s: only the cancel NOTIFY can tell the handler quickly
    running = Worker(dsn, "c", handler, timeout=90, heartbeat_interval=30).start()
    try:
        rn = client.submit("c", {})["rn"]
        wait_for(lambda: status(client, rn) == "running")
        client.cancel(rn)
        assert seen.wait(20), "the handler did not learn of the cancellation"  # heartbeats: every 30 s
        wait_for(lambda: not running.worker.held)  # handler returned; complete_task refused with PS203
        assert status(client, rn) == "cancelled"
    finally:
        running.stop()


def test_abort_aborts_and_other_exceptions_fail_the_attempt(dsn, db, client):
    def handler(ctx: TaskContext) -> None:
        if ctx.spec["kind"] == "abort":
            raise Abort("superseded", "new task superseded", {"by": 2})
        raise ValueError("bad input")

    running = Worker(dsn, "e", handler, capacity=2).start()
    try:
        a = client.submit("e", {"kind": "abort"})["rn"]
        # any other exception fails the attempt (retried after a backoff); its only attempt: aborted
        b = db.call_value("submit_task", queue="e", spec=Jsonb({"kind": "crash"}), max_attempts=1)["rn"]
        wait_for(lambda: status(client, a) == "aborted" and status(client, b) == "aborted")
        assert client.get(a)["errors"] == [{"code": "superseded", "args": {"by": 2},
                                            "description": "new task superseded"}]
        assert client.get(b)["errors"] == [{"code": "ValueError", "args": {}, "description": "bad input"},
                                           {"code": "TaskMaxAttempts", "args": {"attempts": 1, "max_attempts": 1},
                                            "description": "attempt 1 of 1 failed"}]
    finally:
        running.stop()


def test_stop_yields_held_tasks_and_another_worker_takes_them(dsn, client, monitor):
    def block(ctx: TaskContext) -> None:
        ctx.stopping.wait(30)

    first = Worker(dsn, "y", block, timeout=60).start()
    rn = client.submit("y", {})["rn"]
    wait_for(lambda: status(client, rn) == "running")
    first.stop()
    assert not first.thread.is_alive()
    # the yield wakes the monitor at once (NOTIFY), long before the 60 s lease would end
    second = Worker(dsn, "y", lambda ctx: None).start()
    try:
        wait_for(lambda: status(client, rn) == "completed")
        task = client.get(rn)
        assert types_of(task) == ["TaskAssignment", "TaskYield", "TaskAssignment"]
        assert task["owner"] == second.worker.worker_id != first.worker.worker_id
    finally:
        second.stop()


# the monitor's series, as a process that runs one exports them (pyscheduler.metrics)
MONITOR_REGISTRY = process_registry([Monitor], registry=CollectorRegistry())


def monitor_sample(name: str, **labels: str) -> float:
    return MONITOR_REGISTRY.get_sample_value(name, labels) or 0.0


def test_monitor_resets_expired_leases_and_cleans_up(dsn, db, client):
    reset_before = monitor_sample("pyscheduler_tasks_reset_total", queue="m", reason="lease_expired")
    deleted_before = monitor_sample("pyscheduler_tasks_deleted_total")
    rn = client.submit("m", {})["rn"]
    db.call("lease_task", queue="m", worker="gone", timeout=timedelta(milliseconds=300))
    done = client.submit("m", {})["rn"]
    leased = db.call_value("lease_task", queue="m", worker="w")
    db.call("complete_task", rn=done, token=leased["token"])
    stop = threading.Event()
    mon = Monitor(dsn, reset_interval=0.1, retention=timedelta(0), cleanup_interval=0.1)
    thread = threading.Thread(target=mon.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(lambda: status(client, rn) == "ready")
        assert types_of(client.get(rn)) == ["TaskAssignment", "TaskTimeout"]
        wait_for(lambda: mon.deleted == 1)
        with pytest.raises(errors.TaskNotFound):
            client.get(done)
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive() and mon.resets == 1
    # and counted per queue and reason in its series (/metrics of `tasks monitor`, `run`)
    assert monitor_sample("pyscheduler_tasks_reset_total", queue="m", reason="lease_expired") == reset_before + 1
    assert monitor_sample("pyscheduler_tasks_deleted_total") == deleted_before + 1


def test_worker_killed_with_sigkill_loses_its_leases_to_another_worker(dsn, client, monitor):
    rns = [t["rn"] for t in client.submit_many("k", [{"seconds": 30}, {"seconds": 30}])]
    proc = WorkerProcess(dsn, "k", lease_timeout="1s", capacity=2)
    try:
        proc.line(startswith="leased"), proc.line(startswith="leased")
        victim = client.get(rns[0])["owner"]
        assert {client.get(rn)["owner"] for rn in rns} == {victim}
        proc.proc.send_signal(signal.SIGKILL)
        proc.proc.wait(10)
    finally:
        proc.stop()
    # after the 1 s deadline the monitor resets both: TaskTimeout naming the dead worker
    for rn in rns:
        wait_for(lambda: status(client, rn) == "ready", timeout=15)
        timeout = client.get(rn)["history"][-1]
        assert timeout["_typ"] == "TaskTimeout" and timeout["worker"] == victim
    rescuer = Worker(dsn, "k", lambda ctx: None, capacity=2).start()
    try:
        for rn in rns:
            wait_for(lambda: status(client, rn) == "completed")
            task = client.get(rn)
            assert types_of(task) == ["TaskAssignment", "TaskTimeout", "TaskAssignment"]
            assert task["owner"] == rescuer.worker.worker_id
    finally:
        rescuer.stop()


def test_worker_process_yields_on_sigterm(dsn, client, monitor):
    rn = client.submit("t", {"seconds": 30})["rn"]
    proc = WorkerProcess(dsn, "t", lease_timeout="60s")
    try:
        proc.line(startswith="leased")
        proc.proc.send_signal(signal.SIGTERM)
        assert proc.proc.wait(20) == 0
    finally:
        proc.stop()
    wait_for(lambda: status(client, rn) == "ready")  # long before the 60 s lease would expire
    assert types_of(client.get(rn)) == ["TaskAssignment", "TaskYield"]


# ------------------------------------------------------------------ client and CLI


def test_client_checks_arguments_before_sql(client):
    with pytest.raises(errors.InvalidArgument, match="spec"):
        client.submit("q", ["not", "an", "object"])
    with pytest.raises(errors.InvalidArgument, match="priority"):
        client.submit("q", {}, priority=-1)
    with pytest.raises(errors.InvalidArgument, match=r"specs\[1\]"):
        client.submit_many("q", [{}, {"x": object()}])
    with pytest.raises(errors.InvalidArgument, match="rn"):
        client.get("nope")
    with pytest.raises(errors.InvalidArgument, match="status"):
        client.list(status="done")
    with pytest.raises(errors.InvalidArgument, match="capacity"):
        Worker("dsn", "q", lambda ctx: None, capacity=0)


def test_cli_submit_get_list_cancel(dsn):
    runner = CliRunner()
    out = runner.invoke(main, ["tasks", "submit", "--dsn", dsn, "cli", '{"a": 1}', "--priority", "7"])
    assert out.exit_code == 0, out.output
    rn = next(line.split('"')[3] for line in out.output.splitlines() if '"rn"' in line)
    out = runner.invoke(main, ["tasks", "list", "--dsn", dsn, "--queue", "cli"])
    assert rn in out.output and "ready" in out.output
    out = runner.invoke(main, ["tasks", "cancel", "--dsn", dsn, rn])
    assert out.exit_code == 0 and '"cancelled"' in out.output
    out = runner.invoke(main, ["tasks", "cancel", "--dsn", dsn, rn])
    assert out.exit_code == 0
    out = runner.invoke(main, ["tasks", "get", "--dsn", dsn, "00000000-0000-0000-0000-000000000000"])
    assert out.exit_code == 1 and "unknown task" in out.output
    out = runner.invoke(main, ["tasks", "submit", "--dsn", dsn, "cli", "{not json"])
    assert out.exit_code == 2 and "SPEC" in out.output


def test_monitor_flags_and_environment(dsn, monkeypatch):
    monkeypatch.setenv("PYSCHEDULER_TASKS_RETENTION", "2h")
    monkeypatch.setenv("PYSCHEDULER_TASKS_RESET_INTERVAL", "500ms")
    monkeypatch.setenv("PYSCHEDULER_TASKS_MERGE_INTERVAL", "100ms")
    [mon] = daemons(RunContext(dsn=dsn))
    assert (mon.retention, mon.reset_interval, mon.cleanup_interval) == (timedelta(hours=2), 0.5, 60.0)
    assert mon.merge_interval == 0.1
    out = CliRunner().invoke(main, ["tasks", "monitor", "--dsn", dsn, "--retention", "soon"])
    assert out.exit_code == 2 and "--retention" in out.output


@pytest.mark.parametrize("field, value", [
    ("merge_interval", 0), ("merge_interval", float("nan")), ("reset_interval", -1.0),
    ("reset_interval", float("inf")), ("cleanup_interval", "60"), ("retention", timedelta(seconds=-1)),
    ("batch", 0)])
def test_a_monitor_refuses_settings_it_could_not_run_on_naming_them(dsn, field, value):
    """An interval of 0 or NaN would make the monitor's loop spin against the database; infinity
    cannot be waited; a negative retention is refused by cleanup_tasks on every pass."""
    with pytest.raises(errors.InvalidArgument, match=field):
        Monitor(dsn, **{field: value})


def test_worker_survives_its_connections_being_terminated(dsn, db, client):
    done = threading.Event()
    running = Worker(dsn, "r", lambda ctx: done.set(), poll_interval=0.2).start()
    try:
        running.wait_idle()
        killed = db.query("SELECT count(pg_terminate_backend(pid)) AS n FROM pg_stat_activity "
                          "WHERE datname = current_database() AND pid <> pg_backend_pid()")[0]["n"]
        assert killed >= 2  # its LISTEN connection and its pool
        rn = client.submit("r", {})["rn"]
        assert done.wait(15), "the worker did not recover from losing its connections"
        wait_for(lambda: status(client, rn) == "completed")
        assert running.thread.is_alive()
    finally:
        running.stop()


def test_many_short_tasks_each_run_once_with_batched_completions(dsn, db, client):
    ran: list[str] = []
    rns = [t["rn"] for t in client.submit_many("many", [{"i": i} for i in range(300)])]
    workers = [Worker(dsn, "many", lambda ctx: ran.append(ctx.rn), capacity=8).start() for _ in range(2)]
    try:
        wait_for(lambda: len(client.list("many", status="completed", limit=1000)) == 300, timeout=30)
    finally:
        for w in workers:
            w.stop()
    assert sorted(ran) == sorted(rns)  # each exactly once
    tasks = client.list("many", limit=1000)
    assert all(t["progress"] == 1 and types_of(t) == ["TaskAssignment"] for t in tasks)


# ------------------------------------------------------------------ database trouble, stale leases, stopping


def read_only(conn, on: bool) -> None:
    """Stage a failover-like outage for real: the database turns read-only (or back) for new
    sessions, and every other session is ended so the worker reconnects into it. ``conn`` is a
    session opened before, so it stays writable and can turn it back."""
    from psycopg import sql

    name = conn.execute("SELECT current_database() AS d").fetchone()["d"]
    setting = sql.SQL("SET default_transaction_read_only = on" if on else "RESET default_transaction_read_only")
    conn.execute(sql.SQL("ALTER DATABASE {} ").format(sql.Identifier(name)) + setting)
    conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                 "WHERE datname = current_database() AND pid <> pg_backend_pid()")


def test_heartbeats_and_completions_survive_a_read_only_database(dsn, conn, client, caplog):
    """ReadOnlySqlTransaction is no OperationalError: it used to kill the heartbeat and completer
    threads, so leases expired under running handlers and the worker never leased again."""
    go, contexts = threading.Event(), []

    def handler(ctx: TaskContext) -> None:
        contexts.append(ctx)
        ctx.progress(0.25)
        if ctx.spec["n"] == 1:
            go.wait(30)
        else:
            ctx.stopping.wait(30)

    running = Worker(dsn, "ro", handler, timeout=30, heartbeat_interval=0.1, poll_interval=0.2).start()
    try:
        first = client.submit("ro", {"n": 1})["rn"]
        wait_for(lambda: client.get(first)["progress"] == 0.25)
        worker_id = running.worker.worker_id
        read_only(conn, True)
        try:
            wait_for(lambda: logged(caplog, f"heartbeats of {worker_id} unavailable"))
            go.set()  # the handler returns while the database is read-only
            wait_for(lambda: logged(caplog, f"completions of {worker_id} unavailable"))
        finally:
            read_only(conn, False)
        wait_for(lambda: status(client, first) == "completed")
        assert types_of(client.get(first)) == ["TaskAssignment"]
        # not wedged: it leases again, and heartbeats carry the new task's progress
        second = client.submit("ro", {"n": 2})["rn"]
        wait_for(lambda: client.get(second)["progress"] == 0.25)
        assert client.get(second)["owner"] == worker_id
        assert running.thread.is_alive() and running.worker.fatal is None
    finally:
        running.stop()
    assert types_of(client.get(second)) == ["TaskAssignment", "TaskYield"]


def test_abort_is_recorded_through_a_read_only_database(dsn, conn, client, caplog):
    """An Abort used to be lost on any database error: the lease expired and the task ran again."""
    go = threading.Event()

    def handler(ctx: TaskContext) -> None:
        go.wait(30)
        raise Abort("bad", "bad input")

    running = Worker(dsn, "ab", handler, timeout=60, heartbeat_interval=0.1, poll_interval=0.2).start()
    try:
        rn = client.submit("ab", {})["rn"]
        wait_for(lambda: status(client, rn) == "running")
        read_only(conn, True)
        try:
            go.set()
            wait_for(lambda: logged(caplog, f"abort_task of task {rn} unavailable"))
        finally:
            read_only(conn, False)
        wait_for(lambda: status(client, rn) == "aborted")  # long before the 60 s lease would end
        task = client.get(rn)
        assert task["errors"] == [{"code": "bad", "args": {}, "description": "bad input"}]
        assert types_of(task) == ["TaskAssignment"]
    finally:
        running.stop()


def test_a_stale_execution_does_not_finish_a_newer_lease_of_the_same_task(dsn, client, monitor, caplog):
    """The same worker leases a task again after its first lease expired: the first execution's
    outcome (here an Abort) must not be applied to the second lease, nor free its slot."""
    executions, second_started, release = [], threading.Event(), threading.Event()

    def handler(ctx: TaskContext) -> None:
        executions.append(ctx)
        if len(executions) == 1:
            ctx._progress = 2.0  # its heartbeats are refused (PS205): the lease expires for real
            second_started.wait(30)
            raise Abort("stale", "the first execution")
        second_started.set()
        release.wait(30)

    running = Worker(dsn, "st", handler, capacity=2, timeout=1, heartbeat_interval=0.2, poll_interval=0.2).start()
    try:
        rn = client.submit("st", {})["rn"]
        assert second_started.wait(30), "the task was not leased again after its lease expired"
        wait_for(lambda: logged(caplog, "the outcome of this execution is discarded")
                 or status(client, rn) != "running")
        task = client.get(rn)
        assert task["status"] == "running" and task["owner"] == running.worker.worker_id
        assert running.worker.held.get(rn) is executions[1]
        release.set()
        wait_for(lambda: status(client, rn) == "completed")
        assert types_of(client.get(rn)) == ["TaskAssignment", "TaskTimeout", "TaskAssignment"]
    finally:
        release.set()
        running.stop()


def test_without_yield_on_stop_a_handler_that_returns_when_told_to_stop_is_not_completed(dsn, client):
    """The documented pattern (return when ctx.stopping is set) used to complete half-done tasks."""
    processed: dict[str, int] = {}

    def handler(ctx: TaskContext) -> None:
        items = ctx.spec["items"]
        for i in range(items):
            if ctx.stopping.is_set():
                return
            processed[ctx.rn] = i + 1
            ctx.progress((i + 1) / items)
            if i == 2:
                ctx.stopping.wait(30)  # the worker is stopped here, 3 of 20 items done

    started = threading.Event()

    def finisher(ctx: TaskContext) -> None:
        started.set()
        ctx.stopping.wait(30)
        ctx.complete()  # "my work is done": recorded as completed although told to stop

    running = Worker(dsn, "ns", handler, timeout=30, yield_on_stop=False).start()
    rn = client.submit("ns", {"items": 20})["rn"]
    wait_for(lambda: processed.get(rn) == 3)
    running.stop()
    assert not running.thread.is_alive()
    task = client.get(rn)
    assert task["status"] != "completed" and processed[rn] == 3
    assert types_of(task) == ["TaskAssignment", "TaskYield"]

    running = Worker(dsn, "ns2", finisher, timeout=30, yield_on_stop=False).start()
    done = client.submit("ns2", {})["rn"]
    assert started.wait(30)  # in the handler (leased is not enough: a stop before it starts hands it back)
    running.stop()
    assert not running.thread.is_alive()
    assert status(client, done) == "completed"


def test_completions_still_failing_when_the_worker_stops_are_given_up_loudly(dsn, conn, client, caplog):
    go = threading.Event()
    running = Worker(dsn, "gu", lambda ctx: go.wait(30), timeout=1, poll_interval=0.2).start()
    try:
        rn = client.submit("gu", {})["rn"]
        wait_for(lambda: status(client, rn) == "running")
        worker_id = running.worker.worker_id
        read_only(conn, True)
        go.set()
        wait_for(lambda: logged(caplog, f"completions of {worker_id} unavailable"))
        running.stop(timeout=30)  # retried for one lease length (1 s) after the stop, then given up
        assert not running.thread.is_alive()
        assert logged(caplog, f"completions of {worker_id}: giving up")
        assert not running.worker.held
    finally:
        read_only(conn, False)
        running.stop()


class _DyingHeartbeats(Heartbeats):
    """Heartbeats whose thread dies (as from a bug): the worker must not run on wedged."""

    def run(self, stop: threading.Event) -> None:
        wait_for(lambda: self.held or stop.is_set())  # once it holds a task
        raise SystemExit("heartbeat thread killed")


def test_a_worker_whose_heartbeat_thread_dies_stops_loudly_and_yields(dsn, client, monitor, caplog):
    worker = Worker(dsn, "dh", lambda ctx: ctx.stopping.wait(30), timeout=60)
    worker.heartbeats = _DyingHeartbeats(worker)
    outcome: list[BaseException | None] = []
    stop = threading.Event()

    def run() -> None:
        try:
            worker.run(stop)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        rn = client.submit("dh", {})["rn"]
        wait_for(lambda: outcome)  # the worker stopped by itself
    finally:
        stop.set()
        thread.join(10)
    assert isinstance(outcome[0], RuntimeError) and "heartbeat" in str(outcome[0])
    assert worker.fatal and logged(caplog, "stopping the worker")
    wait_for(lambda: status(client, rn) == "ready")  # yielded, long before the 60 s lease would end
    assert types_of(client.get(rn)) == ["TaskAssignment", "TaskYield"]


# ------------------------------------------------------------------ hardening (issue 11)


@pytest.mark.parametrize("args, description", [
    ({"ratio": float("nan"), "limit": float("inf")}, "not a number"),
    ({"when": __import__("datetime").datetime(2030, 1, 1)}, "a datetime"),
    ({"text": "a\x00b"}, "a NUL \x00 in the description"),
])
def test_an_abort_json_cannot_encode_still_aborts_the_task_and_frees_the_slot(dsn, client, args, description):
    """Item 5: Abort arguments JSON cannot encode made the record call fail as if retryable:
    the task stayed running forever and the capacity slot leaked."""
    def handler(ctx: TaskContext) -> None:
        if ctx.spec["bad"]:
            raise Abort("bad-data", description, args)

    running = Worker(dsn, "ab5", handler, capacity=1, timeout=60, poll_interval=0.2).start()
    try:
        bad = client.submit("ab5", {"bad": True})["rn"]
        wait_for(lambda: status(client, bad) == "aborted")
        [error] = client.get(bad)["errors"]
        assert error["code"] == "bad-data" and set(error["args"]) == set(args)
        assert "\x00" not in error["description"] and description.split()[0] in error["description"]
        good = client.submit("ab5", {"bad": False})["rn"]  # the one slot is free again
        wait_for(lambda: status(client, good) == "completed")
    finally:
        running.stop()


def test_an_abort_the_database_refuses_is_recorded_short_or_yielded(dsn, conn, client, monitor):
    """Item 5: any failure to record an outcome ends with the task aborted (a sanitised
    short error) or reset, never stuck running."""
    conn.execute("UPDATE pyscheduler.settings SET value = '300' WHERE name = 'task_max_errors_bytes'")

    executions: list[TaskContext] = []

    def handler(ctx: TaskContext) -> None:
        executions.append(ctx)
        raise Abort("too-big", "x" * 2000, {"blob": "y" * 2000})

    running = Worker(dsn, "ab6", handler, timeout=60, poll_interval=0.2).start()
    try:
        rn = client.submit("ab6", {})["rn"]
        wait_for(lambda: status(client, rn) == "aborted")
        [error] = client.get(rn)["errors"]
        assert error["code"] == "too-big" and "refused" in error["args"]
        assert not running.worker.held
        conn.execute("UPDATE pyscheduler.settings SET value = '10' WHERE name = 'task_max_errors_bytes'")
        again = client.submit("ab6", {})["rn"]  # not even a short error fits: yielded, not stuck
        wait_for(lambda: "TaskYield" in types_of(client.get(again)))
        # the yielded lease's slot is free (the monitor may already have let it lease the task again)
        yielded = next(c for c in executions if c.rn == again)
        wait_for(lambda: all(c is not yielded for c in list(running.worker.held.values())))
    finally:
        running.stop()


def test_a_heartbeat_answer_that_the_task_is_gone_stops_the_handler(dsn, conn, client):
    """Item 7: a heartbeat for a deleted task (cleanup after cancel, or an admin) answered
    PS200 and the handler was never told to stop."""
    seen = threading.Event()

    def handler(ctx: TaskContext) -> None:
        if ctx.stopping.wait(30):
            seen.set()

    running = Worker(dsn, "gone", handler, timeout=30, heartbeat_interval=0.2, poll_interval=0.2).start()
    try:
        rn = client.submit("gone", {})["rn"]
        wait_for(lambda: status(client, rn) == "running")
        conn.execute("DELETE FROM pyscheduler.tasks WHERE rn = %s", (rn,))
        assert seen.wait(20), "the handler was not told its lease is gone"
        wait_for(lambda: not running.worker.held)
    finally:
        running.stop()


@pytest.mark.parametrize("spec, field", [
    ({"ratio": float("nan")}, "spec['ratio']"),
    ({"a": [1, float("inf")]}, "spec['a'][1]"),
    ({"name": "a\x00b"}, "spec['name']"),
    ({"k\x00": 1}, "spec key"),
])
def test_client_submit_with_unstorable_json_is_invalid_argument_naming_the_field(client, spec, field):
    """Item 11: a NaN in the spec surfaced a raw psycopg error that looked retryable."""
    with pytest.raises(errors.InvalidArgument) as info:
        client.submit("q", spec)
    assert field in str(info.value)
    assert not errors.is_retryable(info.value)
    with pytest.raises(errors.InvalidArgument) as info:
        client.submit_many("q", [{}, spec])
    assert field.replace("spec", "specs[1]") in str(info.value)
    assert client.list() == []
