"""Embedded servers, `pyscheduler run` and `pyscheduler demo` as a user starts them."""

import os
import re
import selectors
import signal
import subprocess
import sys
import time

import psycopg
import pytest
import redis
from confluent_kafka.admin import AdminClient

from pyscheduler import embedded


def clean_env():
    """The environment of a new user: no pyscheduler configuration."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYSCHEDULER_")}


def read_until(proc, pattern, timeout=120.0):
    """Read proc's stdout until a line matches; return everything read."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sel.select(timeout=0.5):
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if re.search(pattern, line):
                return "".join(seen)
    proc.kill()
    raise AssertionError(f"{pattern!r} not seen; output:\n{''.join(seen)}\n{proc.stderr.read()}")


def test_stack_starts_each_server_on_a_free_loopback_port_and_stops_it_by_pid(tmp_path):
    with embedded.Stack(workdir=tmp_path) as stack:
        pids = [s.pid for s in stack.servers]
        assert len(pids) == 3 and all(pids)
        with psycopg.connect(stack.dsn) as c:
            assert c.execute("SELECT 1").fetchone() == (1,)
        assert redis.Redis.from_url(stack.redis_url).ping()
        assert AdminClient({"bootstrap.servers": stack.kafka_bootstrap}).list_topics(timeout=10) is not None
        assert all(addr.startswith(("postgresql://postgres@127.0.0.1:", "127.0.0.1:", "redis://127.0.0.1:"))
                   for addr in (stack.dsn, stack.kafka_bootstrap, stack.redis_url))
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


def test_configured_servers_are_used_instead_of_starting_ones(tmp_path):
    stack = embedded.Stack(dsn="postgresql://elsewhere/db", kafka_bootstrap="k:9092", redis_url="redis://r")
    assert not stack.embedded and stack.dsn == "postgresql://elsewhere/db"


def test_a_server_that_cannot_start_is_a_clear_error(tmp_path):
    taken = embedded.Redis(tmp_path / "a").start()
    try:
        with pytest.raises(embedded.EmbeddedError, match="already in use"):
            embedded.Redis(tmp_path / "b", port=taken.port).start()
    finally:
        taken.stop()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_run_starts_the_embedded_stack_and_stops_cleanly(sig):
    proc = subprocess.Popen([sys.executable, "-m", "pyscheduler", "run"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=clean_env())
    out = read_until(proc, r"^running ")
    dsn = re.search(r"psql '([^']+)'", out).group(1)
    with psycopg.connect(dsn) as c:  # migrated and reachable as printed
        assert c.execute("SELECT code_version FROM pyscheduler.version()").fetchone()[0]
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert "stopped" in stdout
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(dsn, connect_timeout=2)


def test_demo_runs_every_capability_and_exits_zero():
    result = subprocess.run([sys.executable, "-m", "pyscheduler", "demo"], capture_output=True, text=True,
                            env=clean_env(), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "demo finished" in result.stdout
    for title in ("delay queue", "leased tasks", "recurring schedules", "future checks"):
        assert f"== {title} ==" in result.stdout
