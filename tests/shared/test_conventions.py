"""The shared hardening classes of design.md, tested where they live: one
classification of failures, the session settings every connection pins, daemons
restarted instead of stopping their siblings, the SQL helpers every capability uses
(caller, ownership, instants, labels, user code), and the one egress policy."""

from __future__ import annotations

import http.server
import re
import socket
import threading

import psycopg
import pytest
from psycopg import sql

from pyscheduler import db as dbmod, egress
from pyscheduler.daemon import run_daemons
from pyscheduler.db import Database
from pyscheduler.errors import ConfigError, is_retryable, rejects_arguments


# -- A: one classification ----------------------------------------------------------------

def _error(conn, statement: str, params=None) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as info, conn.transaction():
        conn.execute(statement, params).fetchall()
    return info.value


def test_only_outages_are_retried_and_data_errors_are_poison(conn):
    outages = {
        "57014 statement timeout": _error(conn, "SET LOCAL statement_timeout = '1ms'; SELECT pg_sleep(1)"),
        "25006 read-only": _error(conn, "SET TRANSACTION READ ONLY; CREATE TEMP TABLE x ()"),
        "55P03 lock timeout": None,
    }
    conn.execute("CREATE TABLE locked ()")
    with psycopg.connect(conn.info.dsn, autocommit=True) as other, other.transaction():
        other.execute("LOCK TABLE locked")
        outages["55P03 lock timeout"] = _error(conn, "SET LOCAL lock_timeout = '10ms'; SELECT * FROM locked")
    for what, exc in outages.items():
        assert is_retryable(exc) and not rejects_arguments(exc), what

    data = {
        "22012 division by zero": _error(conn, "SELECT 1/0"),
        "22008 timestamp out of range": _error(conn, "SELECT 'infinity'::timestamptz::date + 1"),
        "22P05 untranslatable": _error(conn, "SELECT convert_from('\\xff'::bytea, 'UTF8')"),
        "23514 check violation": _error(conn, "CREATE TEMP TABLE c (x int CHECK (x > 0)); INSERT INTO c VALUES (0)"),
        "year 10000, loaded by psycopg": _error(conn, "SELECT '10000-01-01'::timestamptz"),
        "infinite date, loaded by psycopg": _error(conn, "SELECT 'infinity'::date"),
        "PS408 deliberate": _error(conn, "SELECT pyscheduler.set_check_settings(max_checks => 0)"),
    }
    for what, exc in data.items():
        assert rejects_arguments(exc) and not is_retryable(exc), what

    # neither: a missing function or privilege, a bug. Not retried either; a daemon crashes
    # on it and run_daemons restarts it.
    for exc in (_error(conn, "SELECT pyscheduler.no_such_function()"), _error(conn, "DO $$ BEGIN RAISE 'bug'; END $$")):
        assert not is_retryable(exc) and not rejects_arguments(exc), exc.sqlstate


def test_a_database_that_sets_another_datestyle_intervalstyle_or_time_zone_cannot_reach_pyscheduler(dsn, conn):
    """Every pyscheduler connection pins TimeZone UTC, DateStyle ISO, IntervalStyle postgres:
    psycopg loads nothing in German dates or ISO-8601 intervals, and a DST zone would put
    Python's wall-clock arithmetic on aware datetimes an hour off at a change."""
    dbname = conn.info.dbname
    for setting, value in (("DateStyle", "German, DMY"), ("IntervalStyle", "iso_8601"),
                           ("TimeZone", "Europe/Berlin")):
        conn.execute(sql.SQL("ALTER DATABASE {} SET {} = {}").format(sql.Identifier(dbname), sql.Identifier(setting),
                                                                     sql.Literal(value)))
    with psycopg.connect(dsn) as plain:  # what the database hands out otherwise
        with pytest.raises((psycopg.DataError, NotImplementedError)):  # "can't parse interval"
            plain.execute("SELECT interval '1 day 2 hours'").fetchone()
    with Database(dsn, max_size=1) as db:
        row = db.query("SELECT interval '1 day 2 hours' AS i, timestamptz '2026-10-25 01:30:00Z' AS t, "
                       "current_setting('TimeZone') AS tz, current_setting('DateStyle') AS ds")[0]
    assert (row["i"].days, row["i"].seconds) == (1, 7200)
    assert row["tz"] == "UTC" and row["ds"].startswith("ISO") and row["t"].utcoffset().total_seconds() == 0


# -- E: daemons restarted, siblings untouched ----------------------------------------------------

class _Flaky:
    """Crashes on its first ``crashes`` runs (counted across fresh() instances), then runs until stop."""

    def __init__(self, crashes: int, log: list, running: threading.Event, error: type = RuntimeError):
        self.name, self.crashes, self.log, self.running, self.error = "flaky", crashes, log, running, error

    def fresh(self) -> "_Flaky":
        return _Flaky(self.crashes, self.log, self.running, self.error)

    def run(self, stop: threading.Event) -> None:
        self.log.append(id(self))
        if len(self.log) <= self.crashes:
            raise self.error(f"crash {len(self.log)}")
        self.running.set()
        stop.wait()


class _Steady:
    name = "steady"

    def __init__(self) -> None:
        self.runs = 0
        self.stopped_cleanly = False

    def run(self, stop: threading.Event) -> None:
        self.runs += 1
        stop.wait()
        self.stopped_cleanly = True


def _run_in_thread(daemons, stop: threading.Event, **kw) -> tuple[threading.Thread, dict]:
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("code", run_daemons(daemons, stop, **kw)))
    t.start()
    return t, out


def test_a_crashing_daemon_is_restarted_fresh_with_backoff_and_its_sibling_runs_on(caplog):
    stop, running, runs = threading.Event(), threading.Event(), []
    steady = _Steady()
    t, out = _run_in_thread([_Flaky(2, runs, running), steady], stop, first_backoff=0.01)
    assert running.wait(10), "the crashed daemon was not restarted"
    stop.set()
    t.join(10)
    assert len(runs) == 3 and len(set(runs)) == 3  # each restart a fresh instance
    assert steady.runs == 1 and steady.stopped_cleanly  # never stopped nor restarted by the crashes
    assert out["code"] == 1  # a crash happened: the exit code says so
    assert sum("restarting it in" in r.getMessage() for r in caplog.records) == 2


def test_a_config_error_on_the_first_run_stops_the_process_and_later_it_only_restarts():
    stop, running, runs = threading.Event(), threading.Event(), []
    steady = _Steady()
    t, out = _run_in_thread([_Flaky(1, runs, running, ConfigError), steady], stop, first_backoff=0.01)
    t.join(10)
    assert not t.is_alive() and out["code"] == 1 and stop.is_set() and not running.is_set()

    class LaterConfigError(_Flaky):  # ran fine once, then a topic vanished (e.g. a broker restart)
        def run(self, stop):
            self.log.append(id(self))
            if len(self.log) == 2:
                raise ConfigError("topic gone")
            if len(self.log) == 1:
                raise RuntimeError("first crash")
            self.running.set()
            stop.wait()

        def fresh(self):
            return LaterConfigError(0, self.log, self.running)

    stop, running, runs = threading.Event(), threading.Event(), []
    t, out = _run_in_thread([LaterConfigError(0, runs, running)], stop, first_backoff=0.01)
    assert running.wait(10)
    stop.set()
    t.join(10)
    assert len(runs) == 3


# -- SQL helpers: caller, ownership, instants, labels, user code ---------------------------------

def test_the_caller_is_the_calling_role_even_inside_security_definer_functions(conn, login):
    conn.execute("CREATE FUNCTION public.who() RETURNS name LANGUAGE sql SECURITY DEFINER "
                 "SET search_path = pg_catalog, pg_temp AS $$ SELECT pyscheduler._caller() $$")
    alice, alice_dsn = login("pyscheduler_client")
    conn.execute(sql.SQL("GRANT EXECUTE ON FUNCTION public.who() TO {}").format(sql.Identifier(alice)))
    with psycopg.connect(alice_dsn, autocommit=True) as c:
        assert c.execute("SELECT public.who()").fetchone()[0] == alice
        c.execute("SET ROLE pyscheduler_client")
        assert c.execute("SELECT public.who()").fetchone()[0] == "pyscheduler_client"


def test_the_caller_is_user_codes_role_from_its_begin_to_its_end_in_one_transaction(conn, login):
    """_caller() looks at _user_code only once the transaction has written (issue 31): the row
    _begin_user_code writes is the transaction's first write when nothing else wrote before it,
    and a caller that wrote first (a client's own transaction) still sees it."""
    alice, _ = login("pyscheduler_client")
    me = conn.execute("SELECT session_user AS me").fetchone()["me"]

    def who() -> tuple[str, bool]:
        row = conn.execute("SELECT pyscheduler._caller() AS caller, "
                           "pg_current_xact_id_if_assigned() IS NOT NULL AS wrote").fetchone()
        return row["caller"], row["wrote"]

    for wrote_first in (False, True):
        with conn.transaction():
            if wrote_first:
                conn.execute("CREATE TEMP TABLE scratch (x int) ON COMMIT DROP")
            assert who() == (me, wrote_first)
            conn.execute("SELECT pyscheduler._begin_user_code(%s)", (alice,))
            assert who() == (alice, True)
            conn.execute("SELECT pyscheduler._end_user_code()")
            assert who() == (me, True)
        assert who() == (me, False)


def test_work_may_be_acted_on_by_its_owner_a_member_or_an_admin_only(conn, login):
    conn.execute("CREATE FUNCTION public.may(o name) RETURNS boolean LANGUAGE sql SECURITY DEFINER "
                 "SET search_path = pg_catalog, pg_temp AS $$ SELECT pyscheduler._may_act(o) $$; "
                 "GRANT EXECUTE ON FUNCTION public.may(name) TO PUBLIC")
    alice, alice_dsn = login("pyscheduler_client")
    bob, bob_dsn = login("pyscheduler_client")
    admin, admin_dsn = login("pyscheduler_admin")
    expect = {alice_dsn: {alice: True, bob: False, "pyscheduler_client": True, None: False},
              bob_dsn: {alice: False, bob: True, None: False},
              admin_dsn: {alice: True, bob: True, None: True}}
    for who, cases in expect.items():
        with psycopg.connect(who, autocommit=True) as c:
            for owner, allowed in cases.items():
                assert c.execute("SELECT public.may(%s)", (owner,)).fetchone()[0] is allowed, (who, owner)
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute("SELECT pyscheduler._require_owner('nobody_at_all', 'schedule x')")


@pytest.mark.parametrize("value, ok", [
    ("1969-12-31 23:59:59.999999Z", False), ("1970-01-01 00:00:00Z", True),
    ("9998-12-31 23:59:59.999999Z", True), ("9999-01-01 00:00:00Z", False),
    ("infinity", False), ("-infinity", False), ("0001-01-01 BC", False), ("294276-01-01", False)])
def test_instants_a_daemon_can_load(tx, value, ok):
    assert tx.execute("SELECT pyscheduler._instant_ok(%s::timestamptz) AS ok", (value,)).fetchone()["ok"] is ok
    if not ok:
        err = _error(tx, "SELECT pyscheduler._require_instant('start_at', %s::timestamptz, 'PS312')", (value,))
        assert err.sqlstate == "PS312" and "start_at" in str(err)


@pytest.mark.parametrize("label, why", [
    ("nightly report", None), ("日本語のジョブ", None), ("ok-ok_ok.ok", None),
    ("", "empty"), (" ", "white space"), ("a ", "white space"), ("\tx", "white space"),
    ("a\u202eb", "bidirectional"), ("a\u200bb", "zero-width"), ("a\u2066b", "bidirectional"),
    ("a\x07b", "control"), ("a\u0085b", "control"), ("a\ufeffb", "zero-width"), ("x" * 201, "at most 200")])
def test_labels_refuse_what_prints_as_something_else(tx, label, why):
    got = tx.execute("SELECT pyscheduler._label_refusal(%s, 200) AS why", (label,)).fetchone()["why"]
    assert got is None if why is None else why in got


def test_after_user_code_undoes_what_a_job_left_in_the_session(tx):
    tx.execute("CREATE SCHEMA evil; CREATE FUNCTION evil.job() RETURNS void LANGUAGE sql SECURITY DEFINER "
                 "SET search_path = pg_catalog AS $$ SELECT set_config('search_path', 'evil, pg_catalog', false), "
                 "set_config('DateStyle', 'German', false), set_config('TimeZone', 'Asia/Tokyo', false), "
                 "set_config('IntervalStyle', 'sql_standard', false) $$")
    with tx.transaction():
        tx.execute("SELECT evil.job()")
        assert tx.execute("SHOW search_path").fetchone()["search_path"].startswith("evil")
        tx.execute("SELECT pyscheduler._after_user_code()")
        got = tx.execute("SELECT current_setting('search_path') AS sp, current_setting('TimeZone') AS tz, "
                           "current_setting('DateStyle') AS ds, current_setting('IntervalStyle') AS st").fetchone()
    assert got == {"sp": "pyscheduler, pg_temp", "tz": "UTC", "ds": "ISO, MDY", "st": "postgres"}
    err = _error(tx, "SET TRANSACTION READ ONLY; SELECT pyscheduler._after_user_code()")
    assert err.sqlstate == "PS003"


def test_python_and_sql_pin_the_same_session_settings(tx):
    """One owner a side: tx.PINNED (every connection Python opens) and _after_user_code() (after
    a job's SQL changed the session) set the same settings to the same values."""
    source = tx.execute("SELECT prosrc FROM pg_proc WHERE oid = 'pyscheduler._after_user_code'::regproc"
                          ).fetchone()["prosrc"]
    assert set(re.findall(r"set_config\('(\w+)'", source)) == set(dbmod.PINNED) | {"search_path"}

    def pinned(statement: str) -> dict:
        tx.execute("SET TimeZone = 'Asia/Tokyo'; SET DateStyle = 'German, DMY'; SET IntervalStyle = 'sql_standard'")
        tx.execute(statement)
        return {name: tx.execute("SELECT current_setting(%s) AS v", (name,)).fetchone()["v"]
                for name in dbmod.PINNED}

    assert pinned(dbmod.SESSION_PINS) == pinned("SELECT pyscheduler._after_user_code()") == dbmod.PINNED


# -- D: one egress policy -----------------------------------------------------------------------

SAMPLES = ["127.0.0.1", "127.255.0.9", "10.1.2.3", "172.16.0.1", "172.32.0.1", "192.168.1.1", "169.254.169.254",
           "100.64.0.1", "0.0.0.0", "224.0.0.1", "255.255.255.255", "198.18.0.1", "8.8.8.8", "1.1.1.1",
           "93.184.216.34", "::1", "::", "::ffff:127.0.0.1", "::ffff:8.8.8.8", "64:ff9b::a00:1", "2002:a00:1::",
           "fe80::1", "fd00::1", "fec0::1", "ff02::1", "2001:db8::1", "2001::1", "2606:4700:4700::1111",
           "2a00:1450:4001:80b::200e"]


def test_sql_and_python_apply_the_same_egress_policy(tx):
    blocked = {r["n"] for r in tx.execute("SELECT unnest(pyscheduler._egress_blocked())::text AS n").fetchall()}
    assert set(egress.allow_list(blocked)) == set(egress.BLOCKED)
    for allow in ([], ["10.0.0.0/8", "::1/128"]):
        tx.execute("SELECT pyscheduler.set_http_allow(%s::cidr[])", (allow,))
        for address in SAMPLES:
            in_sql = tx.execute("SELECT pyscheduler._egress_refusal(%s::inet) AS why", (address,)).fetchone()["why"]
            in_python = egress.address_refusal(address, egress.allow_list(allow))
            assert (in_sql is None) == (in_python is None), (address, allow)
    assert egress.address_refusal("8.8.8.8") is None and egress.address_refusal("169.254.169.254")


@pytest.mark.parametrize("url, refused", [
    ("https://hooks.example.com/a/b?c=d", None), ("http://203.0.114.7:8080/x", None),
    ("http://[2606:4700:4700::1111]/", None),
    ("http://127.0.0.1:5432/", "not a public address"), ("http://[::1]:6379/", "not a public address"),
    ("http://169.254.169.254/latest/meta-data", "not a public address"), ("http://10.0.0.7/", "not a public address"),
    ("http://[::ffff:127.0.0.1]/", "not a public address"), ("http://localhost:8080/", "this machine"),
    ("http://api.localhost/", "this machine"), ("http://127.1/", "dotted-quad"), ("http://2130706433/", "dotted-quad"),
    ("http://0x7f000001/", "dotted-quad"), ("http://0177.0.0.1/", "dotted-quad"),
    ("https://user:secret@example.com/", "credentials"), ("http://example.com@10.0.0.1/", "credentials"),
    ("ftp://example.com/", "http:// or https://"), ("http://exämple.com/", "ASCII"),
    ("http://example.com/a b", "ASCII"), ("http://example.com:0/", "port"), ("http:///x", "host"),
    ("http://" + "a" * 2100 + ".com/", "2048")])
def test_a_target_url_is_checked_when_it_is_named(tx, url, refused):
    why = tx.execute("SELECT pyscheduler._http_target_refusal(%s) AS why", (url,)).fetchone()["why"]
    assert why is None if refused is None else refused in why, why


class _Listener:
    """A real TCP server on loopback that counts connections and answers HTTP with ``status``."""

    def __init__(self, status: int = 200):
        self.connections, self.requests = 0, []
        listener = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                listener.requests.append((self.command, self.path, body))
                self.send_response(status)
                self.send_header("Location", "/elsewhere")
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST

            def log_message(self, *args):
                pass

        class Server(http.server.ThreadingHTTPServer):
            def get_request(self):
                listener.connections += 1
                return super().get_request()

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_port
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_internal_target_is_refused_before_any_connection_whether_its_port_is_open_or_not():
    listener = _Listener()
    try:
        closed = _closed_port()
        answers = {}
        for port in (listener.port, closed):
            for host in ("127.0.0.1", "localhost"):
                with pytest.raises(egress.EgressRefused) as info:
                    egress.post(f"http://{host}:{port}/x", b"{}", {}, timeout=2)
                answers[(host, port)] = str(info.value)
        assert listener.connections == 0
        for host in ("127.0.0.1", "localhost"):  # nothing tells an open port from a closed one
            assert answers[(host, listener.port)] == answers[(host, closed)]
            assert str(listener.port) not in answers[(host, listener.port)]
    finally:
        listener.close()


def test_an_allowed_target_gets_one_post_and_a_redirect_is_not_followed():
    listener = _Listener(status=302)
    try:
        allow = egress.allow_list(["127.0.0.0/8"])
        status = egress.post(f"http://127.0.0.1:{listener.port}/hook?x=1", b'{"a":1}',
                             {"Content-Type": "application/json"}, timeout=5, allow=allow)
        assert status == 302
        assert listener.requests == [("POST", "/hook?x=1", b'{"a":1}')]  # no GET of the Location
        with pytest.raises(egress.EgressRefused):  # the allow-list widens only what it names
            egress.post(f"http://127.0.0.1:{listener.port}/", b"{}", {}, timeout=2,
                        allow=egress.allow_list(["10.0.0.0/8"]))
        with pytest.raises(OSError) as info:
            egress.post(f"http://127.0.0.1:{_closed_port()}/", b"{}", {}, timeout=2, allow=allow)
        assert "could not connect" in str(info.value)
    finally:
        listener.close()



# -- B and C across capabilities: user code acts as its owner, never as the daemon running it ----

def test_a_check_job_acts_as_its_functions_owner_not_as_the_runner_that_runs_it(conn, dsn, login):
    """The runner's login is often an admin: a client's SQL job that calls another
    capability's functions (pause bob's schedule) must meet the ownership rule as the
    client, whatever role runs the check."""
    from tests.support import wait_for

    alice, alice_dsn = login("pyscheduler_client")
    bob, bob_dsn = login("pyscheduler_client")
    with psycopg.connect(bob_dsn, autocommit=True) as b:
        b.execute("SELECT pyscheduler.create_schedule(name => 'bobs', every => '1 hour', target_kind => 'task', "
                  "target => 'q')")
    conn.execute(sql.SQL("CREATE SCHEMA alice_s AUTHORIZATION {}").format(sql.Identifier(alice)))
    conn.execute("SELECT pyscheduler.set_check_settings(resolution => '1 second')")
    with psycopg.connect(alice_dsn, autocommit=True) as a:
        a.execute("CREATE FUNCTION alice_s.job(c pyscheduler.future_check) RETURNS timestamptz LANGUAGE plpgsql "
                  "SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$ BEGIN "
                  "PERFORM pyscheduler.pause_schedule(name => 'bobs', note => 'paused by alice'); RETURN NULL; END $$")
        slot = a.execute("SELECT next_check_at FROM pyscheduler.add_check(entity_name => 'x', entity_key => '1', "
                         "job => 'alice_s.job', check_after => '0')").fetchone()[0]
    with Database(dsn, max_size=1) as db:  # the runner's login: the superuser
        wait_for(lambda: db.call_one("check_slots")["slot"] >= slot, 10, "the check's slot")
        with db.connection() as c, c.transaction():
            c.execute("SELECT * FROM pyscheduler.run_due_checks(slot => %s)", (slot,))
        ended = db.call_one("check_history", entity_name="x", entity_key="1")
        paused = db.call_value("get_schedule", name="bobs")["paused"]
    assert not paused
    assert ended["outcome"] == "error" and "belongs to another role" in ended["error"], ended


# -- plans kept --------------------------------------------------------------------------------

def test_no_write_function_is_planned_on_every_call(tx):
    """A SQL-language function that is not inlined is planned on every call (PostgreSQL 16 keeps
    no plan for it): a SECURITY DEFINER one (every API function) never is, nor a volatile
    set-returning one. Every such function that writes (volatile) is PL/pgSQL, which keeps its
    plans for the session: the SQL wrappers cost 40-250 us a call (issue 31: submit_task 221 ->
    174 us). Read-only ones (STABLE) may stay SQL: a read is not on a hot path."""
    planned = tx.execute(
        "SELECT p.proname FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang "
        "WHERE p.pronamespace = 'pyscheduler'::regnamespace AND l.lanname = 'sql' AND p.provolatile = 'v' "
        "  AND (p.prosecdef OR p.proretset) ORDER BY 1").fetchall()
    assert [r["proname"] for r in planned] == []
