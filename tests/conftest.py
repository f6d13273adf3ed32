"""Real servers for the tests: PostgreSQL, a Kafka-protocol broker, Redis.

Each is the embedded one (pyscheduler.embedded) unless the environment names
one: PYSCHEDULER_TEST_DSN (a role that may CREATE DATABASE and CREATE ROLE),
PYSCHEDULER_TEST_KAFKA_BOOTSTRAP, PYSCHEDULER_TEST_REDIS_URL (a disposable
Redis: tests flush it).

Databases: one template is migrated per session; each test that asks for
``dsn`` or ``db`` gets its own database cloned from it (pytest-postgresql's
DatabaseJanitor with a template), dropped afterwards.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pytest_postgresql.janitor import DatabaseJanitor

warnings.filterwarnings("ignore", module="platformdirs")

from pyscheduler import embedded, migrate  # noqa: E402
from pyscheduler.db import Database  # noqa: E402


@dataclass
class PgServer:
    """The test PostgreSQL: a base DSN and, when embedded, the server itself."""

    base_dsn: str
    server: embedded.Postgres | None = None

    def dsn(self, dbname: str) -> str:
        return make_conninfo(self.base_dsn, dbname=dbname)

    @property
    def params(self) -> dict:
        p = conninfo_to_dict(self.base_dsn)
        return {"user": p.get("user") or "postgres", "host": p.get("host") or "127.0.0.1",
                "port": p.get("port") or 5432, "password": p.get("password")}

    def janitor(self, dbname: str, template: str | None = None) -> DatabaseJanitor:
        return DatabaseJanitor(dbname=dbname, template_dbname=template, **self.params)


@pytest.fixture(scope="session")
def pg() -> PgServer:
    dsn = os.environ.get("PYSCHEDULER_TEST_DSN")
    if dsn:
        yield PgServer(dsn)
        return
    # Not under pytest's base temp: as root the server runs as another system user,
    # and every new pytest session on the machine makes pytest-of-<user> private
    # again (chmod go-rwx), which cut a running server off from its data directory.
    workdir = Path(tempfile.mkdtemp(prefix="pyscheduler-test-pg-"))
    server = embedded.Postgres(workdir).start()
    try:
        yield PgServer(server.dsn(), server)
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def template_db(pg: PgServer) -> str:
    """Name of a migrated template database, made once per session."""
    name = f"pyscheduler_tmpl_{os.getpid()}"
    janitor = pg.janitor(name)
    janitor.init()
    migrate.migrate(pg.dsn(name))
    yield name
    janitor.drop()


_counter = itertools.count()


@pytest.fixture
def dsn(pg: PgServer, template_db: str) -> str:
    """A fresh, migrated database for this test."""
    name = f"t{os.getpid()}_{next(_counter)}"
    janitor = pg.janitor(name, template=template_db)
    janitor.init()
    yield pg.dsn(name)
    janitor.drop()


@pytest.fixture
def empty_dsn(pg: PgServer) -> str:
    """A fresh database without any pyscheduler schema."""
    name = f"e{os.getpid()}_{next(_counter)}"
    janitor = pg.janitor(name)
    janitor.init()
    yield pg.dsn(name)
    janitor.drop()


@pytest.fixture
def pg_db_factory(pg: PgServer):
    """Make more empty databases in one test: pg_db_factory() -> dsn."""
    janitors = []

    def make() -> str:
        name = f"f{os.getpid()}_{next(_counter)}"
        janitors.append(pg.janitor(name))
        janitors[-1].init()
        return pg.dsn(name)

    yield make
    for janitor in janitors:
        janitor.drop()


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

