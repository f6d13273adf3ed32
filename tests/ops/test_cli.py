"""The CLI and embedded mode as a user meets them: a bad DSN, an
unreachable database, zero intervals and refused flag values are one clear line with the
right exit code; ``run --data-dir`` keeps the data; a clean first start logs no WARNING."""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from pyscheduler import embedded
from pyscheduler.cli import main

from tests.support.ops import Output, clean_env

DAEMONS = [["run"], ["delay", "run", "--bootstrap-servers", "127.0.0.1:1"], ["schedules", "run"], ["checks", "run"],
           ["tasks", "monitor"], ["tasks", "work", "--queue", "q"], ["migrate"], ["tasks", "list"],
           ["schedules", "list"], ["checks", "list"], ["delay", "status"]]


@pytest.fixture(autouse=True)
def signal_handlers():
    """Commands run in this process install SIGTERM/SIGINT handlers: put pytest's back."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def invoke(*args: str):
    return CliRunner().invoke(main, list(args), env={"PYSCHEDULER_DSN": None})


@pytest.mark.parametrize("command", DAEMONS, ids=" ".join)
def test_a_bad_dsn_is_one_line_naming_it_and_exit_code_2(command):
    result = invoke(*command, "--dsn", "not a dsn")
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "--dsn" in lines[0], result.output


@pytest.mark.parametrize("command", [["tasks", "list"], ["schedules", "list"], ["migrate"]], ids=" ".join)
def test_an_unreachable_database_fails_within_seconds_naming_host_port_and_reason(command):
    port = embedded.free_port()  # nothing listens there
    started = time.monotonic()
    result = invoke(*command, "--dsn", f"postgresql://app@127.0.0.1:{port}/app")
    took = time.monotonic() - started
    assert result.exit_code == 1 and took < 5, (took, result.output)
    assert f"127.0.0.1:{port}" in result.output and "refused" in result.output.lower(), result.output


class Forward:
    """A loopback port chosen now that nothing listens on until ``open()``; then each connection
    to it is forwarded to ``target`` (host, port): a PostgreSQL that is down, then back."""

    def __init__(self, target: tuple[str, int]):
        self.target, self.port = target, embedded.free_port()
        self.listener: socket.socket | None = None

    def open(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()


def readyz(port: int) -> tuple[int, dict] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except OSError:
        return None


@pytest.mark.slow
@pytest.mark.parametrize("command", [["tasks", "monitor"], ["run", "--no-migrate"]], ids=" ".join)
def test_a_daemon_command_waits_for_a_postgresql_down_at_start_and_readyz_names_it(command, dsn, tmp_path):
    """PostgreSQL down when a daemon command starts is an outage, not a crash (issue 27, C): the
    command waits for it, /readyz answers 503 naming postgresql meanwhile, and the daemons start
    once it answers (before: exit 1 within 5 s). A refusal (a database that does not exist)
    stays one line and exit 1 (tests/delay/test_cli.py)."""
    given = psycopg.conninfo.conninfo_to_dict(dsn)
    forward = Forward((given.get("host") or "127.0.0.1", int(given.get("port") or 5432)))
    http = embedded.free_port()
    log = tmp_path / "log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "pyscheduler", *command, "--http-port", str(http),
                                 "--dsn", psycopg.conninfo.make_conninfo(dsn, host="127.0.0.1", port=forward.port)],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**clean_env(), "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 60
        while (answer := readyz(http)) is None or "postgresql" not in json.dumps(answer[1]):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        status, body = answer
        assert status == 503 and body["servers"]["postgresql"], body
        assert "waiting for it" in log.read_text()
        forward.open()
        while "PostgreSQL answers: starting" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        while not re.search(r"running \S|tasks-monitor", log.read_text()) or readyz(http) is None:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()
        assert "Traceback" not in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
        forward.close()


@pytest.mark.parametrize("args", [
    ["tasks", "monitor", "--reset-interval", "0"],
    ["tasks", "monitor", "--cleanup-interval", "0s"],
    ["tasks", "work", "--queue", "q", "--lease-timeout", "0"],
    ["checks", "run", "--timeout", "0ms"],
    ["checks", "run", "--shards", "2", "--shard", "2"],
    ["delay", "run", "--bootstrap-servers", "127.0.0.1:1", "--hold-ms", "1000", "--poll-ms", "600"],
    ["schedules", "run", "--poll-ms", "0"],
    ["run", "--http-port", "70000"],
    ["run", "--data-dir", "/tmp/x"],
], ids=" ".join)
def test_bad_flag_values_are_usage_errors_with_exit_code_2(args):
    # a DSN nothing listens on: the flag must be refused before anything connects
    result = invoke(*args, "--dsn", f"postgresql://app@127.0.0.1:{embedded.free_port()}/app")
    assert result.exit_code == 2, result.output


def test_run_with_a_bad_capability_variable_is_a_usage_error(dsn):
    result = CliRunner().invoke(main, ["run", "--no-migrate", "--dsn", dsn],
                                env={"PYSCHEDULER_DELAY_HOLD_MS": "10", "PYSCHEDULER_KAFKA_BOOTSTRAP": "127.0.0.1:1"})
    assert result.exit_code == 2 and "hold-ms" in result.output, result.output


class Merged(Output):
    """Output of a child whose stderr goes to its stdout (one stream: the order of lines kept)."""

    def wait_for(self, pattern, timeout=120.0) -> str:
        try:
            return super().wait_for(pattern, timeout)
        except AttributeError:  # Output's failure message reads a separate stderr
            raise AssertionError(f"{pattern!r} not seen (exit code {self.proc.poll()}):\n{self.text()}") from None


def start_run(data_dir) -> tuple[subprocess.Popen, Output, str]:
    proc = subprocess.Popen([sys.executable, "-m", "pyscheduler", "run", "--data-dir", str(data_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**clean_env(), "PYTHONUNBUFFERED": "1"})
    output = Merged(proc)
    text = output.wait_for(r"^running ")
    return proc, output, re.search(r"psql '([^']+)'", text).group(1)


@pytest.fixture
def data_dir():
    """Not under pytest's base temp (see conftest.pg): as root, PostgreSQL runs as another user,
    and a pytest session starting elsewhere on the machine makes that directory private."""
    path = Path(tempfile.mkdtemp(prefix="pyscheduler-test-data-"))
    yield path / "data"
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
def test_run_data_dir_keeps_the_data_across_restarts_and_a_first_start_warns_of_nothing(data_dir):
    data = data_dir
    proc, output, dsn = start_run(data)
    try:
        assert f"with their data in {data}" in output.text()
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("SELECT pyscheduler.submit_task(queue => 'kept', spec => '{}')")
        output.wait_for(r"Redis index resynced")  # the executor's first round: the index built on a first start
        output.wait_for(r"delay relay node \S+ starting")
        # the start-up (what a first start logs until every daemon began) warns of nothing
        warned = [line for line in output.text().splitlines() if " WARNING " in line or " ERROR " in line]
        assert not warned, "\n".join(warned)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0  # a clean stop
    finally:
        if proc.poll() is None:
            proc.kill()
    proc, output, dsn_again = start_run(data)
    try:
        assert dsn_again == dsn  # the same port again
        with psycopg.connect(dsn_again) as c:
            assert c.execute("SELECT count(*) FROM pyscheduler.tasks WHERE queue = 'kept'").fetchone()[0] == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_run_help_names_the_new_flags():
    result = invoke("run", "--help")
    assert "--data-dir" in result.output and "--http-port" in result.output and "--metrics-port" in result.output
