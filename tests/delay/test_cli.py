"""The delay queue's commands and capability contract: run, demo, flags, metrics."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.support import wait_for
from tests.support.delay import Output, RelayProcess, Sender, Topics, warm_up
from pyscheduler.daemon import RunContext
from pyscheduler.delay import cli
from pyscheduler.delay.relay import Relay
from pyscheduler.embedded import free_port


def test_run_without_kafka_skips_the_relay(dsn):
    assert cli.daemons(RunContext(dsn=dsn)) == []


def test_run_uses_the_default_topics_and_the_environment(dsn, kafka, monkeypatch):
    from confluent_kafka.admin import AdminClient

    monkeypatch.setenv("PYSCHEDULER_DELAY_HOLD_MS", "7000")
    (relay,) = cli.daemons(RunContext(dsn=dsn, kafka_bootstrap=kafka))
    assert isinstance(relay, Relay)
    assert (relay.cfg.input_topic, relay.cfg.output_topic, relay.cfg.hold_ms) == (
        "pyscheduler.delay.input", "pyscheduler.delay.output", 7000)
    relay.check_topics()  # run's relay creates its topics once Kafka answers (it may be down at start)
    topics = AdminClient({"bootstrap.servers": kafka}).list_topics(timeout=10).topics
    assert {"pyscheduler.delay.input", "pyscheduler.delay.output"} <= set(topics)


def test_relay_command_refuses_missing_topics_with_a_clear_error(dsn, kafka):
    proc = subprocess.run([sys.executable, "-m", "pyscheduler.delay", "run", "--dsn", dsn, "--bootstrap-servers", kafka,
                           "--input-topic", "no-such-input", "--output-topic", "no-such-output"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "no-such-input, no-such-output do not exist" in proc.stderr


def test_bad_flag_values_are_usage_errors_naming_the_flag(dsn, kafka, monkeypatch):
    monkeypatch.setenv("PYSCHEDULER_DELAY_POLL_MS", "0")
    proc = subprocess.run(
        [sys.executable, "-m", "pyscheduler.delay", "run", "--dsn", dsn, "--bootstrap-servers", kafka],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--poll-ms" in proc.stderr


def test_a_hold_time_that_would_refire_everything_is_refused(dsn, kafka):
    run = [sys.executable, "-m", "pyscheduler.delay", "run", "--dsn", dsn, "--bootstrap-servers", kafka]
    proc = subprocess.run(run + ["--hold-ms", "1"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--hold-ms" in proc.stderr
    proc = subprocess.run(run + ["--hold-ms", "1500", "--poll-ms", "1000"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "hold-ms must be at least 2000" in proc.stderr  # a usage error too


def test_every_entry_point_gives_the_same_one_line_error_when_postgresql_refuses(pg):
    """``python -m pyscheduler.delay run`` printed a traceback where ``pyscheduler delay run``
    printed one line; every entry point now runs under the same root (pyscheduler.cliroot).
    (A PostgreSQL that does not answer is waited for: tests/ops/test_cli.py.)"""
    down = pg.dsn("no_such_database")  # the server refuses: it does not exist
    delay = ["delay", "run", "--dsn", down, "--bootstrap-servers", "127.0.0.1:1"]
    schedules = ["schedules", "run", "--dsn", down, "--redis-url", "redis://127.0.0.1:1"]
    script = str(Path(sys.executable).with_name("pyscheduler"))  # the console script
    runs = {"python -m pyscheduler.delay": [sys.executable, "-m", "pyscheduler.delay", *delay[1:]],
            "python -m pyscheduler delay": [sys.executable, "-m", "pyscheduler", *delay],
            "pyscheduler delay": [script, *delay],
            "python -m pyscheduler.schedules": [sys.executable, "-m", "pyscheduler.schedules", *schedules[1:]],
            "pyscheduler schedules": [script, *schedules]}
    procs = {name: subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, cmd in runs.items()}
    out = {name: (p.wait(60), p.stderr.read()) for name, p in procs.items()}
    for p in procs.values():
        p.stdout.close()
        p.stderr.close()
    for name, (code, err) in out.items():
        assert code == 1 and err.startswith("error: cannot connect to PostgreSQL at 127.0.0.1:"), (name, err)
        assert err.count("\n") == 1 and "Traceback" not in err, (name, err)
    assert len({err for _, err in out.values()}) == 1, out


def test_status_shows_deadlines_at_the_end_of_the_range(dsn, db):
    """A deadline past year 9999 in UTC made status exit 1 (psycopg cannot load it); now such a
    deadline is refused (PS106) and the latest one allowed prints."""
    db.call("enqueue_messages", ids=["last"], deadlines=["9998-12-31T23:59:59Z"])
    proc = subprocess.run([sys.executable, "-m", "pyscheduler", "delay", "status", "--dsn", dsn],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "next_deadline=9998-12-31 23:59:59+00:00" in proc.stdout, proc.stderr


@pytest.mark.slow
def test_demo_prints_throughput_and_jitter_percentiles(dsn, kafka):
    lines: list[str] = []
    cli.demo(RunContext(dsn=dsn, kafka_bootstrap=kafka), lines.append)
    text = "\n".join(lines)
    assert "received 3000/3000 on the output topic" in text, text
    assert "p50" in text and "p99.9" in text and "max" in text
    assert "0 waiting, 0 ready" in text


@pytest.mark.slow
def test_metrics_count_what_the_relay_did(dsn, kafka, topic, tmp_path):
    topics = Topics(input=topic("in"), output=topic("out"), dlq=topic("dlq"))
    port = free_port()
    output = Output(kafka, topics.output)
    # --metrics-port: the former name of --http-port
    relay = RelayProcess(dsn, kafka, topics, tmp_path / "relay.log", "--metrics-port", str(port),
                         "--dlq-topic", topics.dlq)
    try:
        relay.node()
        sender = Sender(kafka, topics.input)
        warm_up(sender, output, partitions=1)
        sender.send(None, None, value=b"malformed")
        sender.flush()

        def metrics() -> str:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()

        text = wait_for(lambda: "pyscheduler_delay_dead_lettered_total 1.0" in metrics() and metrics(), 20,
                        "the dead letter to be counted")
        for line in ("pyscheduler_delay_consumed_total 2.0", "pyscheduler_delay_late_total 1.0",
                     "pyscheduler_delay_fired_total 1.0", "pyscheduler_delay_fire_lag_seconds_count 1.0",
                     "pyscheduler_delay_dropped_total 0.0"):  # on the dead-letter topic: not dropped
            assert line in text
    finally:
        relay.close()
        output.close()
