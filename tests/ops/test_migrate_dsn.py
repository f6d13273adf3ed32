"""Every DSN psycopg accepts works for migrate: a Unix-socket
directory, a password with URL-special characters, several hosts."""

import os
import subprocess
import sys
import urllib.parse

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pyscheduler import migrate


def migrated(dsn: str) -> bool:
    with psycopg.connect(dsn) as c:
        return bool(c.execute("SELECT migrations FROM pyscheduler.version()").fetchone()[0])


def embedded_only(pg):
    if pg.server is None:
        pytest.skip("needs the embedded PostgreSQL (its socket directory and pg_hba.conf)")


def test_a_unix_socket_directory_dsn_migrates_in_both_forms(pg, pg_db_factory):
    embedded_only(pg)
    socket_dir, port = str(pg.server.pgdata), conninfo_to_dict(pg.base_dsn)["port"]
    keywords = make_conninfo(pg_db_factory(), host=socket_dir, hostaddr=None)  # host=/dir: the socket
    assert conninfo_to_dict(keywords)["host"].startswith("/")
    result = subprocess.run([sys.executable, "-m", "pyscheduler", "migrate", "--dsn", keywords],
                            capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert result.returncode == 0, result.stderr
    assert migrated(keywords)
    dbname = conninfo_to_dict(pg_db_factory())["dbname"]
    uri = f"postgresql:///{dbname}?host={urllib.parse.quote(socket_dir, safe='')}&port={port}&user=postgres"
    assert migrate.migrate(uri).fresh_install
    assert migrated(uri)


def test_a_password_with_at_slash_and_percent_migrates(pg, pg_db_factory, conn):
    embedded_only(pg)
    password = "p@ss/w%rd:?#&= x"
    hba = pg.server.pgdata / "pg_hba.conf"
    original = hba.read_text()
    conn.execute("CREATE ROLE odd_pw_user LOGIN SUPERUSER PASSWORD 'p@ss/w%rd:?#&= x'")
    databases = [pg_db_factory(), pg_db_factory()]
    try:
        hba.write_text("host all odd_pw_user 127.0.0.1/32 scram-sha-256\n" + original)
        conn.execute("SELECT pg_reload_conf()")
        keywords = make_conninfo(databases[0], user="odd_pw_user", password=password)
        assert migrate.migrate(keywords).fresh_install
        p = conninfo_to_dict(databases[1])
        uri = (f"postgresql://odd_pw_user:{urllib.parse.quote(password, safe='')}@{p['host']}:{p['port']}/"
               f"{p['dbname']}")
        assert migrate.migrate(uri).fresh_install
        wrong = make_conninfo(keywords, password=password + "!")  # and the password is really checked
        with pytest.raises(Exception, match="password authentication failed"):
            migrate.migrate(wrong)
    finally:
        hba.write_text(original)
        conn.execute("SELECT pg_reload_conf()")
        for dsn in databases:
            with psycopg.connect(dsn, autocommit=True) as c:
                c.execute("REASSIGN OWNED BY odd_pw_user TO postgres")
                c.execute("DROP OWNED BY odd_pw_user")
        conn.execute("DROP OWNED BY odd_pw_user")
        conn.execute("DROP ROLE odd_pw_user")


def test_a_two_host_dsn_migrates_through_the_host_that_answers(pg, pg_db_factory):
    p = conninfo_to_dict(pg_db_factory())
    # the first host refuses (port 1), libpq moves on to the second
    dsn = make_conninfo("", **{**p, "host": f"127.0.0.1,{p['host']}", "port": f"1,{p['port']}"})
    assert migrate.migrate(dsn).fresh_install
    assert migrated(dsn)
