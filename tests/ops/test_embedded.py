"""Embedded servers, `pyscheduler run` and `pyscheduler demo` as a user starts them."""

import os
import re
import signal
import socket
import subprocess
import sys

import psycopg
import pytest
import redis
from confluent_kafka.admin import AdminClient

from pyscheduler import embedded
from tests.support.ops import Output, clean_env


@pytest.mark.slow
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


def test_a_chosen_port_taken_before_the_server_binds_it_is_replaced(tmp_path):
    """Between choosing a free port and binding it, another process may take it (a test's other
    server, an outgoing connection's ephemeral port): it raised "already in use" in a test run
    with two workers. A port chosen by the server is replaced; a port given is not (above)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        server = embedded.Redis(tmp_path / "r")
        server.port = taken  # as if another process took it after it was chosen
        server.start()
        try:
            assert server.port != taken
            assert redis.Redis.from_url(server.url).ping()
        finally:
            server.stop()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_run_starts_the_embedded_stack_and_stops_cleanly(sig):
    proc = subprocess.Popen([sys.executable, "-m", "pyscheduler", "run"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=clean_env())
    output = Output(proc)
    out = output.wait_for(r"^running ")
    dsn = re.search(r"psql '([^']+)'", out).group(1)
    with psycopg.connect(dsn) as c:  # migrated and reachable as printed
        assert c.execute("SELECT code_version FROM pyscheduler.version()").fetchone()[0]
    proc.send_signal(sig)
    assert proc.wait(timeout=60) == 0, proc.stderr.read()
    assert output.wait_for(r"^stopped")
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(dsn, connect_timeout=2)


@pytest.mark.slow
def test_demo_runs_every_capability_and_exits_zero():
    result = subprocess.run([sys.executable, "-m", "pyscheduler", "demo"], capture_output=True, text=True,
                            env=clean_env(), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "demo finished" in result.stdout
    for title in ("delay queue", "leased tasks", "recurring schedules", "future checks"):
        assert f"== {title} ==" in result.stdout


@pytest.mark.parametrize("round_", [1, 2])
def test_each_test_gets_a_real_empty_redis(redis_url, round_):
    client = redis.Redis.from_url(redis_url)
    assert client.dbsize() == 0  # the other round's key is gone
    client.set(f"left-behind-{round_}", "x")
    assert client.get(f"left-behind-{round_}") == b"x"
