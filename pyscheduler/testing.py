"""A pytest plugin for applications that use pyscheduler: ``pytest -p pyscheduler.testing`` (also
loaded by its ``pytest11`` entry point) gives the fixture ``pyscheduler_dsn``: a fresh database
with pyscheduler's schema for each test, cloned from one migrated once per session, on the
embedded PostgreSQL (or on the server of ``PYSCHEDULER_TEST_DSN``, a role that may CREATE
DATABASE), dropped after the test. docs/python-api.md, "Testing task functions"."""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

_numbers = itertools.count()


def _database(base_dsn: str, name: str, template: str | None = None) -> str:
    """Create database ``name`` (a copy of ``template``) on the server of ``base_dsn``; its DSN."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    with psycopg.connect(base_dsn, autocommit=True) as conn:
        statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template is not None:
            statement += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
        conn.execute(statement)
    return make_conninfo(base_dsn, dbname=name)


def _drop(base_dsn: str, name: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(base_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="session")
def pyscheduler_server() -> Iterator[str]:
    """The DSN of a PostgreSQL server for the session: ``PYSCHEDULER_TEST_DSN``, else the
    embedded one, started now and stopped at the end."""
    configured = os.environ.get("PYSCHEDULER_TEST_DSN")
    if configured:
        yield configured
        return
    from . import embedded

    # not under pytest's base temp: as root the server runs as another user (embedded.Postgres)
    workdir = Path(tempfile.mkdtemp(prefix="pyscheduler-pytest-"))
    server = embedded.Postgres(workdir).start()
    try:
        yield server.dsn()
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def pyscheduler_template(pyscheduler_server: str) -> Iterator[str]:
    """The name of a database migrated once for the session, that each test's is cloned from."""
    from . import migrate

    name = f"pyscheduler_template_{os.getpid()}"
    _drop(pyscheduler_server, name)
    migrate.migrate(_database(pyscheduler_server, name))
    yield name
    _drop(pyscheduler_server, name)


@pytest.fixture
def pyscheduler_dsn(pyscheduler_server: str, pyscheduler_template: str) -> Iterator[str]:
    """A fresh database with pyscheduler's schema for this test (its DSN), dropped after it."""
    name = f"pyscheduler_test_{os.getpid()}_{next(_numbers)}"
    yield _database(pyscheduler_server, name, pyscheduler_template)
    _drop(pyscheduler_server, name)
