"""Real servers for the tests: PostgreSQL, a Kafka-protocol broker, Redis.

Each is the embedded one (pyscheduler.embedded) unless the environment names
one: PYSCHEDULER_TEST_DSN (a role that may CREATE DATABASE and CREATE ROLE),
PYSCHEDULER_TEST_KAFKA_BOOTSTRAP, PYSCHEDULER_TEST_REDIS_URL (a disposable
Redis: tests flush it).

Databases: one template is migrated per session; each test that asks for
``dsn`` or ``db`` gets its own database cloned from it, dropped afterwards. A
pure-SQL test asks for ``tx`` instead: a connection to one migrated database
per session (per pytest-xdist worker), inside a transaction rolled back at the
end, with each call in a savepoint (a refused call leaves the transaction
usable, as in autocommit). No database to clone, so no commit either: nothing
it does is seen by another connection (no second session, no LISTEN/NOTIFY, no
login of a role it creates, no daemon), and now() is the transaction's start (a
fixed clock: use the private ``_fn(..., p_now)`` twins, or clock_timestamp(),
to see time move).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import tempfile
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

warnings.filterwarnings("ignore", module="platformdirs")

from pyscheduler import db as pyscheduler_db, embedded, migrate  # noqa: E402
from pyscheduler.db import Database, Session  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist, the slow tests first: a worker takes the next test when it is free
    (--dist loadgroup), so the long ones start early and the short ones fill in at the end."""
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@dataclass
class PgServer:
    """The test PostgreSQL: a base DSN and, when embedded, the server itself."""

    base_dsn: str
    server: embedded.Postgres | None = None
    _admin: psycopg.Connection | None = field(default=None, repr=False)

    def dsn(self, dbname: str = "postgres") -> str:
        return make_conninfo(self.base_dsn, dbname=dbname)

    def create(self, name: str, template: str = "template1") -> str:
        """A new database, a copy of ``template``; its DSN. Its files are copied (FILE_COPY), not
        written to the WAL block by block (the default): a tenth of the WAL, as fast in RAM."""
        self._admin_execute(sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY = FILE_COPY").format(
            sql.Identifier(name), sql.Identifier(template)))
        return self.dsn(name)

    def drop(self, name: str) -> None:
        """Drop a database, ending the sessions still on it."""
        self._admin_execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def _admin_execute(self, statement: sql.Composed) -> None:
        """On one connection to the maintenance database, made again after a test restarted
        the server."""
        for attempt in range(2):
            if self._admin is None or self._admin.closed or self._admin.broken:
                self._admin = psycopg.connect(self.dsn(), autocommit=True)
            try:
                self._admin.execute(statement)
                return
            except psycopg.OperationalError:
                self._admin.close()
                if attempt:
                    raise


def _ram(need: int = 4 << 30) -> str | None:
    """/dev/shm if it is writable with ``need`` bytes free (a container's is often 64 MB)."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return None
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) and st.f_bavail * st.f_frsize >= need else None


@pytest.fixture(scope="session")
def pg() -> PgServer:
    dsn = os.environ.get("PYSCHEDULER_TEST_DSN")
    if dsn:
        yield PgServer(dsn)
        return
    # Not under pytest's base temp: as root the server runs as another system user,
    # and every new pytest session on the machine makes pytest-of-<user> private
    # again (chmod go-rwx), which cut a running server off from its data directory.
    # In RAM where there is a roomy tmpfs: each test's database is a thousand files made and
    # deleted, and ext4 spent ~0.3 s of CPU a database finding inodes for them (its
    # allocator walks the recently deleted ones). fsync off: the tests stop and kill
    # processes, never the machine (a server killed with -9 loses nothing the kernel has).
    workdir = Path(tempfile.mkdtemp(prefix="pyscheduler-test-pg-", dir=_ram()))
    server = embedded.Postgres(workdir, settings={"fsync": "off"}).start()
    try:
        yield PgServer(server.dsn(), server)
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def template_db(pg: PgServer) -> str:
    """Name of a migrated template database, made once per session."""
    name = f"pyscheduler_tmpl_{os.getpid()}"
    migrate.migrate(pg.create(name))
    yield name
    pg.drop(name)


_counter = itertools.count()


@pytest.fixture
def dsn(pg: PgServer, template_db: str) -> str:
    """A fresh, migrated database for this test."""
    name = f"t{os.getpid()}_{next(_counter)}"
    yield pg.create(name, template=template_db)
    pg.drop(name)


@pytest.fixture
def empty_dsn(pg: PgServer) -> str:
    """A fresh database without any pyscheduler schema."""
    name = f"e{os.getpid()}_{next(_counter)}"
    yield pg.create(name)
    pg.drop(name)


@pytest.fixture
def pg_db_factory(pg: PgServer):
    """Make more empty databases in one test: pg_db_factory() -> dsn."""
    names = []

    def make() -> str:
        names.append(f"f{os.getpid()}_{next(_counter)}")
        return pg.create(names[-1])

    yield make
    for name in names:
        pg.drop(name)


@pytest.fixture
def login(dsn, conn):
    """login(*roles) -> (name, DSN) of a fresh login role that is a member of those roles
    (e.g. login("pyscheduler_client")); dropped, with what it owns, after the test."""
    made = []

    def make(*roles: str) -> tuple[str, str]:
        name = f"login_{uuid.uuid4().hex[:8]}"
        conn.execute(f'CREATE ROLE "{name}" LOGIN')
        for role in roles:
            conn.execute(f'GRANT "{role}" TO "{name}"')
        made.append(name)
        return name, make_conninfo(dsn, user=name)

    yield make
    for name in reversed(made):
        conn.execute(f'DROP OWNED BY "{name}" CASCADE')
        conn.execute(f'DROP ROLE "{name}"')


@pytest.fixture
def db(dsn: str) -> Database:
    """A pool on this test's database; call SQL as db.call('fn', arg=...)."""
    with Database(dsn, max_size=4) as database:
        yield database


@pytest.fixture(scope="session")
def shared_dsn(pg: PgServer, template_db: str) -> str:
    """A migrated database for this session's ``tx`` tests, each in a transaction rolled back."""
    name = f"s{os.getpid()}"
    yield pg.create(name, template=template_db)
    pg.drop(name)


class Tx(Session):
    """``db`` and ``conn`` of a pure-SQL test in one: ``call``, ``call_value``, ..., ``query`` and
    ``connection()`` as on a Database, ``execute`` as on a connection (dict rows), each in a
    savepoint; the rest (``transaction()``, ``cursor()``, ``info``) is the connection's."""

    def call(self, function: str, /, **args):
        with self.conn.transaction():
            return super().call(function, **args)

    def call_binary(self, function: str, /, **args):
        with self.conn.transaction():
            return super().call_binary(function, **args)

    def call_tuples(self, function: str, /, **args):
        with self.conn.transaction():
            return super().call_tuples(function, **args)

    def call_scalar(self, function: str, /, **args):
        with self.conn.transaction():
            return super().call_scalar(function, **args)

    def call_column(self, function: str, column: str, /, **args):
        with self.conn.transaction():
            return super().call_column(function, column, **args)

    def execute(self, query, params=None, **kwargs):
        with self.conn.transaction():
            return self.conn.execute(query, params, **kwargs)

    @contextlib.contextmanager
    def connection(self):
        with self.conn.transaction():
            yield self.conn

    def query(self, query, params=None):
        with pyscheduler_db.translating():
            return self.execute(query, params).fetchall()

    def __getattr__(self, name: str):
        return getattr(self.conn, name)


@pytest.fixture
def tx(shared_dsn: str) -> Tx:
    """A pure-SQL test's connection to the session's shared database, in a transaction rolled
    back at its end (see above for what such a test cannot do)."""
    with pyscheduler_db.connect(shared_dsn) as c, c.transaction(force_rollback=True):
        yield Tx(c)


@pytest.fixture
def conn(dsn: str):
    """One autocommit connection on this test's database, dict rows."""
    from psycopg.rows import dict_row

    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as c:
        yield c


def _configured_or_embedded(env_var: str, cls, tmp_path_factory, address):
    """The address in env_var, else that of an embedded server run for the session."""
    configured = os.environ.get(env_var)
    if configured:
        yield configured
        return
    server = cls(tmp_path_factory.mktemp(cls.name)).start()
    try:
        yield address(server)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def kafka(tmp_path_factory) -> str:
    """Bootstrap address of a Kafka-protocol broker."""
    yield from _configured_or_embedded("PYSCHEDULER_TEST_KAFKA_BOOTSTRAP", embedded.Kafka, tmp_path_factory,
                                       lambda broker: broker.bootstrap)


@pytest.fixture
def topic(kafka: str):
    """A factory of fresh topics on the test broker: topic('in') -> 'in-<random>'."""

    def make(prefix: str = "t", partitions: int = 1) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        embedded.create_topics(kafka, [name], partitions=partitions)
        return name

    return make


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory) -> str:
    yield from _configured_or_embedded("PYSCHEDULER_TEST_REDIS_URL", embedded.Redis, tmp_path_factory,
                                       lambda server: server.url)


@pytest.fixture
def redis_url(redis_server: str) -> str:
    """The test Redis, emptied for this test."""
    import redis

    client = redis.Redis.from_url(redis_server)
    client.flushdb()
    client.close()
    return redis_server

