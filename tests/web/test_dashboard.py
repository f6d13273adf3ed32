"""The dashboard over HTTP: every page against real work made
through the SQL API, read by a login that is only in pyscheduler_monitor; actions only
when allowed, behind a confirmation, refused cross-site and without the CSRF token or
the access token; no secrets shown. The browser test is tests/web/test_dashboard_browser.py."""

from __future__ import annotations

import html
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request

import pytest

from pyscheduler.dashboard import make_app, mask_json, mask_url
from tests.support import wait_for
from tests.support.dashboard import SECRET, Client, populate, served, text_of


@pytest.fixture
def work(conn):
    return populate(conn)


@pytest.fixture
def monitor_dsn(login):
    return login("pyscheduler_monitor")[1]


@pytest.fixture
def admin_dsn(login):
    return login("pyscheduler_admin")[1]


def test_pages_show_the_work_through_the_monitor_role(work, monitor_dsn):
    app = make_app(monitor_dsn)
    with served(app) as base:
        c = Client(base)
        status, headers, page = c.get("/")
        assert status == 200, page
        assert "default-src 'none'" in headers["Content-Security-Policy"]
        assert headers["X-Frame-Options"] == "DENY"
        t = text_of(page)
        for card in ("Leased tasks", "Delay queue", "Schedules", "Future checks"):
            assert card in t
        assert page.count("<svg") >= 4
        assert re.search(r"overdue\s+1\b", t), t  # the delay message past its deadline
        status, _, page = c.get("/tasks?status=running")
        assert status == 200 and work["running"][:8] in page and "<progress" in page
        # the monitor sees the tasks' metadata, never their contents (docs/sql-api.md, "Ownership")
        status, _, page = c.get("/tasks?status=scheduled&queue=emails")
        assert work["retrying"][:8] in page and "retrying" in page and "smtp_421" not in page
        status, _, page = c.get("/tasks?status=aborted")
        assert work["aborted"][:8] in page and "bank_refused" not in page
        status, _, page = c.get(f"/tasks/{work['aborted']}")
        assert status == 200 and 'id="redacted"' in page and "account closed" not in page
        status, _, page = c.get(f"/tasks/{work['running']}")
        assert status == 200 and "api_key" not in page and "user0@" not in page
        status, _, page = c.get("/delay")
        t = text_of(page)
        assert status == 200 and re.search(r"waiting\s+3\b", t) and re.search(r"ready \(claimed.*?\)\s+1\b", t), t
        status, _, page = c.get("/schedules")
        t = text_of(page)
        assert status == 200 and "ledger migration until Monday" in t and "partner-hook" in t
        assert "HTTP 503" not in t  # monitor: no other role's errors (convention C)
        assert "unknown (start the dashboard with --redis-url" in t
        status, _, page = c.get("/schedule?name=partner-hook")
        t = text_of(page)
        assert status == 200 and "failed" in t and "fired" in t and "hidden from" in t and "HTTP 503" not in t
        status, _, page = c.get("/checks")
        t = text_of(page)
        assert status == 200 and "cart 9" in t and "missed slot" in t and "order 233" in t
        assert "deleted" in t and "order 234" in t  # history
        assert "+4915112345678" not in page  # payloads are not shown
        status, _, page = c.get("/checks?entity_name=invoice")
        assert "dunning" in page and "order_sms" not in text_of(page).split("Pending checks")[1].split("History")[0]
        # read-only: no action links, confirmation and POST refused
        assert "/confirm/" not in c.get("/tasks?status=running")[2]
        assert c.get(f"/confirm/cancel_task?rn={work['ready']}")[0] == 403
        assert c.get("/nope")[0] == 404
    app.close()


def test_pages_page_and_filter(conn, monitor_dsn):
    conn.execute("SELECT pyscheduler.submit_tasks(queue => 'bulk', specs => "
                 "(SELECT jsonb_agg(jsonb_build_object('i', i)) FROM generate_series(1, 120) i))")
    conn.execute("SELECT pyscheduler.create_schedule(name => 's-' || lpad(i::text, 3, '0'), every => '1 hour', "
                 "target => 't') FROM generate_series(1, 60) i")
    app = make_app(monitor_dsn)
    with served(app) as base:
        c = Client(base)
        seen: list[str] = []
        path = "/tasks?status=ready&queue=bulk"
        while path:
            page = c.get(path)[2]
            seen += re.findall(r'href="/tasks/([0-9a-f-]{36})"', page)
            nxt = re.search(r'href="([^"]+)" rel="next"', page)
            path = html.unescape(nxt.group(1)) if nxt else None
        assert len(seen) == 120 == len(set(seen))
        names: list[str] = []
        path = "/schedules"
        while path:
            page = c.get(path)[2]
            names += re.findall(r'<td><a href="/schedule\?name=(s-\d+)">', page.split('<table id="schedules">')[1])
            nxt = re.search(r'href="([^"]+)" rel="next"', page)
            path = html.unescape(nxt.group(1)) if nxt else None
        assert names == [f"s-{i:03d}" for i in range(1, 61)]
        page = c.get("/schedules?name_like=s-05%25")[2]
        assert re.findall(r'<td><a href="/schedule\?name=(s-\d+)">', page.split('<table id="schedules">')[1]) \
            == [f"s-05{i}" for i in range(10)]
    app.close()


def _confirm_form(c: Client, path: str) -> tuple[str, dict]:
    status, _, page = c.get(path)
    assert status == 200, page
    action = html.unescape(re.search(r'<form method="post" action="([^"]+)"', page).group(1))
    fields = {html.unescape(n): html.unescape(v)
              for n, v in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page)}
    return action, fields


def test_actions_need_confirmation_csrf_and_same_origin(work, conn, monitor_dsn, admin_dsn):
    app = make_app(monitor_dsn, allow_actions=True, action_dsn=admin_dsn)
    with served(app) as base:
        c = Client(base)
        c.get("/")  # the session cookie
        page = c.get("/tasks?status=ready")[2]
        assert "/confirm/cancel_task?" in page
        action, fields = _confirm_form(c, f"/confirm/cancel_task?rn={work['ready']}&next=/tasks")
        status_of = lambda: conn.execute("SELECT pyscheduler.get_task(rn => %s) ->> 'status' AS s",  # noqa: E731
                                         (work["ready"],)).fetchone()["s"]
        # a cross-site POST (another origin), one without Origin or Referer, one without the token
        assert c.request(action, fields, {"Origin": "http://evil.example"})[0] == 403
        assert c.request(action, fields, {"Sec-Fetch-Site": "cross-site", "Origin": base})[0] == 403
        assert c.request(action, fields)[0] == 403
        assert c.request(action, {k: v for k, v in fields.items() if k != "csrf"}, {"Origin": base})[0] == 403
        other = Client(base)  # another session: its own CSRF token
        other.get("/")
        assert other.request(action, fields, {"Origin": base})[0] == 403
        assert c.get(action)[0] == 405  # GET never acts
        assert status_of() == "ready"
        status, headers, _ = c.request(action, fields, {"Origin": base})
        assert status == 303 and headers["Location"].startswith("/tasks?flash=")
        assert status_of() == "cancelled"
        assert "done: Cancel task" in text_of(c.get(headers["Location"])[2])
        # refused by the database: shown, not raised (a completed task cannot be cancelled)
        done = conn.execute("SELECT task ->> 'rn' AS rn FROM pyscheduler.list_tasks(status => 'completed')"
                            ).fetchone()["rn"]
        action, fields = _confirm_form(c, f"/confirm/cancel_task?rn={done}")
        status, headers, _ = c.request(action, fields, {"Origin": base})
        assert "refused" in text_of(c.get(headers["Location"])[2]) and "PS209" in c.get(headers["Location"])[2]
        # a forged flash is not shown
        assert "pwned" not in c.get("/?flash=" + urllib.parse.quote('[true, "pwned"].0000'))[2]
        # schedules and checks
        action, fields = _confirm_form(c, "/confirm/pause_schedule?name=billing-report&next=/schedules")
        c.request(action, {**fields, "note": "quarter close"}, {"Origin": base})
        row = conn.execute("SELECT pyscheduler.get_schedule(name => 'billing-report') AS s").fetchone()["s"]
        assert row["paused"] and row["paused_note"] == "quarter close"
        action, fields = _confirm_form(c, "/confirm/delete_checks?entity_name=cart&entity_key=9&job=cart_reminder")
        c.request(action, fields, {"Origin": base})
        assert conn.execute("SELECT count(*) AS n FROM pyscheduler.list_checks(entity_name => 'cart')"
                            ).fetchone()["n"] == 0
        # an open redirect through next is not possible
        action, fields = _confirm_form(c, "/confirm/resume_schedule?name=billing-report&next=//evil.example/x")
        assert c.request(action, fields, {"Origin": base})[1]["Location"].startswith("/?flash=")
    app.close()


def test_access_token(work, monitor_dsn):
    app = make_app(monitor_dsn, token="s3cret-token", allow_actions=True)
    with served(app) as base:
        c = Client(base)
        status, _, page = c.get("/tasks")
        assert status == 401 and 'name="token"' in page and work["running"][:8] not in page
        assert c.get("/tasks", headers={"Authorization": "Bearer wrong"})[0] == 401
        assert c.get("/tasks", headers={"Authorization": "Bearer s3cret-token"})[0] == 200
        assert c.request("/actions/cancel_task", {"rn": work["ready"]}, {"Origin": base})[0] == 401
        assert c.request("/login", {"token": "wrong", "next": "/tasks"}, {"Origin": base})[0] == 401
        assert c.request("/login", {"token": "s3cret-token", "next": "/tasks"}, {"Origin": "http://evil.example"}
                         )[0] == 403
        status, headers, _ = c.request("/login", {"token": "s3cret-token", "next": "/tasks"}, {"Origin": base})
        assert status == 303 and headers["Location"] == "/tasks"
        assert "s3cret-token" not in str(c.cookies)
        assert c.get("/tasks")[0] == 200
    app.close()


def test_secrets_are_masked_for_a_reader_that_sees_targets(work, admin_dsn):
    """An admin login sees every target and task content: the HTTP target's secret path and
    query and a spec's credential-like keys are masked."""
    app = make_app(admin_dsn)
    with served(app) as base:
        c = Client(base)
        for path in ("/schedules", "/schedule?name=partner-hook", "/schedules?target_kind=http"):
            status, _, page = c.get(path)
            assert status == 200 and "hooks.example.com" in page and SECRET not in page, path
        # and every task's contents, its spec's credential-like keys masked
        status, _, page = c.get("/tasks?status=scheduled&queue=emails")
        assert work["retrying"][:8] in page and "smtp_421" in page
        status, _, page = c.get(f"/tasks/{work['aborted']}")
        assert status == 200 and "account closed" in page and "TaskAssignment" in page
        status, _, page = c.get(f"/tasks/{work['running']}")
        assert '"api_key": "***"' in html.unescape(page) and "k-0" not in page and "k-1" not in page
    app.close()


def test_mask_url_and_json():
    assert mask_url("https://user:pw@h.example.com:8443/a/Zx81secretPath9f3k2LmQ?x=1&token=abc#frag") == (
        "https://user:***@h.example.com:8443/a/***?x=***&token=***#***")
    assert mask_url("https://example.com/ping") == "https://example.com/ping"
    assert mask_json({"to": "a", "Authorization": "Bearer x", "nested": [{"password": 1, "n": 2}]}) == {
        "to": "a", "Authorization": "***", "nested": [{"password": "***", "n": 2}]}


def test_mounted_under_a_prefix(work, monitor_dsn):
    """Behind a proxy at /ops/ (SCRIPT_NAME), links and cookies follow the prefix."""
    app = make_app(monitor_dsn)

    def mounted(environ, start_response):
        path = environ.get("PATH_INFO", "")
        if not path.startswith("/ops"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"no"]
        environ = dict(environ, SCRIPT_NAME="/ops", PATH_INFO=path[4:] or "/")
        return app(environ, start_response)

    with served(mounted) as base:
        c = Client(base)
        status, headers, page = c.get("/ops/")
        assert status == 200 and 'href="/ops/tasks"' in page and "Path=/ops" in headers["Set-Cookie"]
        assert c.get("/ops/tasks?status=aborted")[0] == 200
    app.close()


def test_run_serves_the_dashboard_as_the_monitor_role_and_acts_as_admin(dsn, login):
    """``pyscheduler run``'s login (here a superuser) reads the dashboard as pyscheduler_monitor,
    and with actions on acts (and reads) as pyscheduler_admin (issue 30: its actions were the
    monitor's and every one was refused); a login that is not a member keeps its own role."""
    import psycopg

    from pyscheduler.cli import _as_role

    with psycopg.connect(_as_role(dsn, "monitor")) as c:
        assert c.execute("SELECT current_user").fetchone()[0] == "pyscheduler_monitor"
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute("SELECT * FROM pyscheduler.tasks LIMIT 1")  # the table itself: not the monitor's
    with psycopg.connect(_as_role(dsn, "admin")) as c:
        assert c.execute("SELECT current_user").fetchone()[0] == "pyscheduler_admin"
    _, client = login("pyscheduler_client")
    assert _as_role(client, "monitor") == client


def test_with_actions_on_the_pages_show_what_the_action_login_may_see(work, monitor_dsn, admin_dsn):
    """An operator who acts as a login sees what that role may see; read-only, the monitor's
    metadata."""
    for allow, seen in ((False, False), (True, True)):
        app = make_app(monitor_dsn, allow_actions=allow, action_dsn=admin_dsn)
        with served(app) as base:
            status, _, page = Client(base).get(f"/tasks/{work['aborted']}")
            assert status == 200 and ("account closed" in page) is seen and ('id="redacted"' in page) is not seen
        app.close()


def test_the_schedules_page_shows_late_and_due_soon_from_one_read(conn, monitor_dsn):
    """The Late card is the late rows of schedules_due_soon (the same order as schedules_late)."""
    conn.execute("SELECT pyscheduler.create_schedule(name => 'l-' || lpad(i::text, 2, '0'), every => '1 hour', "
                 "target => 't') FROM generate_series(1, 25) i")
    conn.execute("SELECT pyscheduler.create_schedule(name => 'soon', every => '1 hour', target => 't')")
    conn.execute("UPDATE pyscheduler.schedules SET next_run_at = now() - interval '1 hour' + "
                 "substr(name, 3)::int * interval '1 minute' WHERE name LIKE 'l-%'")
    conn.execute("UPDATE pyscheduler.schedules SET next_run_at = now() + interval '1 minute' WHERE name = 'soon'")
    late = [r["name"] for r in conn.execute("SELECT name FROM pyscheduler.schedules_late LIMIT 20")]
    app = make_app(monitor_dsn)
    with served(app) as base:
        page = Client(base).get("/schedules")[2]
    app.close()
    card = page.split('<table id="late">')[1].split("</table>")[0]
    assert re.findall(r'name=(l-\d+)">', card) == late == [f"l-{i:02d}" for i in range(1, 21)]
    assert "Late (20+)" in page


@pytest.mark.slow
def test_the_redis_index_state_of_a_redis_cluster(monitor_dsn, tmp_path):
    """With ``--redis-url redis+cluster://...`` the dashboard reads the index through the one Redis
    connector (pyscheduler.redisconn), as the executors do: a cluster that does not answer is
    unreachable (degraded mode), one whose shards lack their markers is resyncing, one whose
    every shard has its marker is ok; the URL's password is not shown."""
    from pyscheduler import embedded
    from pyscheduler.schedules.index import Shards

    def shown(url: str) -> str:
        app = make_app(monitor_dsn, redis_url=url)
        try:
            with served(app) as base:
                pages = [Client(base).get(path)[2] for path in ("/schedules", "/")]
        finally:
            app.close()
        assert all(SECRET not in page for page in pages)
        on_schedules = re.search(r'<p id="degraded">Redis index:\s*<span class="[^"]*">([^<]*)</span>', pages[0])
        on_overview = re.search(r"<dt>Redis index</dt><dd><span class=\"[^\"]*\">([^<]*)</span>", pages[1])
        return f"{on_schedules[1]} / {on_overview[1]}"

    down = f"redis+cluster://admin:{SECRET}@127.0.0.1:{embedded.free_port()}"
    assert shown(down) == "unreachable / unreachable: degraded mode"
    cluster = embedded.RedisCluster(tmp_path / "cluster", masters=1, replicas=0).start()
    try:
        assert shown(cluster.url) == "resyncing / resyncing"
        index = Shards.from_url(cluster.url)
        for shard in index.shards:  # a resync of every shard, as the executors make it
            assert shard.finish_resync(shard.begin_resync())
        index.close()
        assert shown(cluster.url) == "ok / ok"
    finally:
        cluster.stop()


def test_the_overview_and_the_tasks_page_show_exact_counts(conn, monitor_dsn):
    """queue_status's counts are exact however large (the tallies every write keeps): the
    overview's total and the tasks page's per-queue figures are the real numbers."""
    conn.execute("SELECT pyscheduler.submit_tasks(queue => 'bulk', specs => "
                 "(SELECT jsonb_agg(jsonb_build_object('i', i)) FROM generate_series(1, 1500) i))")
    conn.execute("SELECT pyscheduler.submit_tasks(queue => 'few', specs => '[{}, {}, {}]')")
    app = make_app(monitor_dsn)
    with served(app) as base:
        c = Client(base)
        overview, tasks = c.get("/")[2], c.get("/tasks")[2]
    app.close()
    ready = conn.execute("SELECT count(*) AS n FROM pyscheduler.tasks WHERE status = 'ready'").fetchone()["n"]
    card = overview.split('id="card-tasks"')[1].split("</section>")[0]
    assert f"<dt>ready</dt><dd><a href=\"/tasks?status=ready\">{ready}</a></dd>" in card, card
    rows = {m.group(1): m.group(2) for m in re.finditer(
        r'<td><a href="[^"]*">(bulk|few)</a></td>\s*<td class="num"><a href="[^"]*">([^<]*)</a>', tasks)}
    assert rows == {"bulk": "1500", "few": "3"}, rows


def test_a_host_not_allowed_gets_421_before_any_page_or_action(work, conn, monitor_dsn, admin_dsn):
    """DNS rebinding (issue 27, item 2): a page of a name the attacker controls, resolving to
    the dashboard's address, sends its own name as Host (and as Origin): refused with 421
    on every page and action, whatever its Origin; loopback names with the listening port
    and the configured names are served, and a POST must come from the allowed host it names."""
    app = make_app(monitor_dsn, allow_actions=True, action_dsn=admin_dsn,
                   allowed_hosts="dash.example.com, ops.example.com:8443")
    status_of = lambda: conn.execute("SELECT pyscheduler.get_task(rn => %s) ->> 'status' AS s",  # noqa: E731
                                     (work["ready"],)).fetchone()["s"]
    with served(app) as base:
        port = urllib.parse.urlsplit(base).port
        evil = f"evil.example:{port}"
        c = Client(base)
        action, fields = _confirm_form(c, f"/confirm/cancel_task?rn={work['ready']}&next=/tasks")
        for path in ("/", "/tasks?status=ready", f"/tasks/{work['ready']}", "/delay", "/schedules",
                     "/schedule?name=billing-report", "/checks", f"/confirm/cancel_task?rn={work['ready']}", "/login"):
            status, headers, page = c.get(path, headers={"Host": evil})
            assert status == 421 and "Set-Cookie" not in headers and 'name="csrf"' not in page, path
            assert work["ready"][:8] not in page, path
        for origin in (f"http://{evil}", base):
            assert c.request(action, fields, {"Host": evil, "Origin": origin})[0] == 421
        assert c.request("/login", {"token": "x"}, {"Host": evil, "Origin": f"http://{evil}"})[0] == 421
        assert status_of() == "ready"
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", f"LocalHost:{port}",
                     "dash.example.com", f"dash.example.com:{port}", "ops.example.com:8443"):
            assert c.get("/tasks", headers={"Host": host})[0] == 200, host
        for host in (f"localhost:{port + 1}", "127.0.0.1", "ops.example.com", "ops.example.com:9999",
                     "example.com", "dash.example.com.evil.example", f"127.0.0.1.nip.io:{port}", "",
                     f"dash.example.com:{port}@evil.example", "dash.example.com/x"):
            assert c.get("/", headers={"Host": host})[0] == 421, host
        # the origin a POST must come from is the allowed host it was sent to
        assert c.request(action, fields, {"Host": "dash.example.com", "Origin": base})[0] == 403
        status, headers, _ = c.request(action, fields, {"Host": "dash.example.com",
                                                        "Origin": "http://dash.example.com"})
        assert status == 303 and status_of() == "cancelled"
    app.close()


def _startup_log(tmp_path, *args: str, env: dict | None = None) -> str:
    """The log of ``pyscheduler *args`` until its dashboard's startup line (then stopped)."""
    log = tmp_path / f"{args[0]}-{len(list(tmp_path.iterdir()))}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "pyscheduler", *args], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    try:
        def started():
            assert proc.poll() is None, log.read_text()
            return "dashboard on http" in log.read_text()

        wait_for(started, timeout=60, interval=0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return log.read_text()


@pytest.mark.slow
def test_the_startup_line_names_the_url_and_the_token_and_a_warning_says_when_it_is_open_beyond_loopback(
        dsn, monitor_dsn, tmp_path):
    text = _startup_log(tmp_path, "dashboard", "--dsn", monitor_dsn, "--host", "0.0.0.0", "--port", "0")
    port = re.search(r"INFO pyscheduler.dashboard: dashboard on http://0\.0\.0\.0:(\d+)/ \(read-only, "
                     r"no access token; answers to Host 127\.0\.0\.1:\d+, localhost:\d+, \[::1\]:\d+\)", text)
    assert port, text
    assert re.search(rf"WARNING pyscheduler.dashboard: the dashboard listens on 0\.0\.0\.0, beyond loopback, "
                     rf"without an access token: whoever reaches port {port.group(1)} reads every page", text), text
    text = _startup_log(tmp_path, "dashboard", "--dsn", monitor_dsn, "--port", "0",
                        "--allowed-host", "dash.example.com", env={"PYSCHEDULER_DASHBOARD_TOKEN": "s3cret"})
    assert re.search(r"dashboard on http://127\.0\.0\.1:\d+/ \(read-only, access token required; answers to Host "
                     r"127\.0\.0\.1:\d+, localhost:\d+, \[::1\]:\d+, dash\.example\.com\)", text), text
    assert "WARNING" not in text and "s3cret" not in text
    # pyscheduler run mounts it at / of its HTTP endpoint: the same line and warning
    text = _startup_log(tmp_path, "run", "--no-migrate", "--dsn", dsn, "--http-host", "0.0.0.0", "--http-port", "0",
                        env={"PYSCHEDULER_DASHBOARD_ALLOW_ACTIONS": "1",
                             "PYSCHEDULER_DASHBOARD_ALLOWED_HOSTS": "a.example,b.example:8443"})
    assert re.search(r"dashboard on http://0\.0\.0\.0:\d+/ \(actions allowed, no access token; answers to Host "
                     r"127\.0\.0\.1:\d+, localhost:\d+, \[::1\]:\d+, a\.example, b\.example:8443\)", text), text
    assert "beyond loopback, without an access token" in text and "reads every page and acts" in text


# -- issue 30: the defects an operator met first ------------------------------------------------------


def _card(page: str, table: str) -> str:
    return text_of(page.split(f'<table id="{table}">')[1].split("</section>")[0])


def test_a_failure_cause_is_shown_to_a_login_that_may_see_it_and_said_hidden_to_one_that_may_not(
        work, conn, login, admin_dsn):
    """Issue 30, defect 2: the Failing card and the schedule page show the cause to a login that
    may see it; to one that may not (the monitor) they say it is hidden from which role and where
    the owner reads it, not a bare "(owner only)"; a paused schedule is not listed as failing."""
    app = make_app(admin_dsn)
    with served(app) as base:
        c = Client(base)
        assert "HTTP 503 from partner" in _card(c.get("/schedules")[2], "failing")
        assert "HTTP 503 from partner" in text_of(c.get("/schedules/partner-hook")[2])
    app.close()
    monitor, monitor_dsn = login("pyscheduler_monitor")
    app = make_app(monitor_dsn)
    with served(app) as base:
        c = Client(base)
        page = c.get("/schedules")[2]
        card = _card(page, "failing")
        assert "partner-hook" in card and f"hidden from {monitor}" in card and "owner only" not in page
        assert "pyscheduler schedules get NAME" in card and "HTTP 503" not in page
        t = text_of(c.get("/schedules/partner-hook")[2])
        assert re.search(rf"last error\s+hidden from {monitor}", t) and "pyscheduler schedules get partner-hook" in t
        conn.execute("SELECT pyscheduler.pause_schedule(name => 'partner-hook')")
        page = c.get("/schedules")[2]
        assert "partner-hook" not in _card(page, "failing") and "partner-hook" in _card(page, "paused")
        assert re.search(r"failing\s+0\b", text_of(c.get("/")[2]))
    app.close()


def test_task_ids_in_lists_can_be_told_apart(conn, monitor_dsn):
    """Issue 30, defect 3: time-ordered ids share their first characters; lists show them whole."""
    conn.execute("SELECT pyscheduler.submit_tasks(queue => 'ids', specs => '[{}, {}, {}, {}]')")
    rns = [r["rn"] for r in conn.execute("SELECT task ->> 'rn' AS rn FROM pyscheduler.list_tasks(queue => 'ids')")]
    assert len({rn[:8] for rn in rns}) == 1  # what the list showed ("01a220cc…" four times)
    app = make_app(monitor_dsn)
    with served(app) as base:
        shown = re.findall(r'<a class="id" href="/tasks/[0-9a-f-]{36}">([^<]*)</a>',
                           Client(base).get("/tasks?status=ready&queue=ids")[2])
    app.close()
    assert sorted(shown) == sorted(rns)


def test_a_finished_task_s_history_ends_with_how_it_ended(work, conn, admin_dsn):
    """Issue 30, defect 4: the history ended at the last assignment; it ends with the completion,
    abort or cancellation (at the task's last update)."""
    done = conn.execute("SELECT task ->> 'rn' AS rn FROM pyscheduler.list_tasks(status => 'completed')"
                        ).fetchone()["rn"]
    conn.execute("SELECT pyscheduler.cancel_task(rn => %s)", (work["ready"],))
    app = make_app(admin_dsn)
    with served(app) as base:
        c = Client(base)
        for rn, last in ((done, "TaskCompleted"), (work["aborted"], "TaskAborted"), (work["ready"], "TaskCancelled"),
                         (work["running"], "TaskAssignment")):
            rows = re.findall(r"<tr>(.*?)</tr>", c.get(f"/tasks/{rn}")[2].split('<table id="history">')[1]
                              .split("</table>")[0], re.S)
            assert re.findall(r"<td>(Task\w+)</td>", rows[-1]) == [last], (rn, rows)
            assert re.findall(r"<td>(Task\w+)</td>", rows[-2]) != [last], (rn, rows)  # once
        updated = conn.execute("SELECT pyscheduler.get_task(rn => %s) ->> 'updated' AS u", (done,)).fetchone()["u"]
        assert updated[:19].replace("T", " ") in c.get(f"/tasks/{done}")[2].split("TaskCompleted")[0][-200:]
    app.close()


def test_the_schedule_page_at_schedules_name_and_the_empty_list_s_words(work, monitor_dsn):
    """Issue 30, defect 4: ``/schedules/NAME`` is the schedule's page (``/schedule?name=`` too);
    an empty list says what it lists ("no all tasks in nosuchqueue" did not)."""
    app = make_app(monitor_dsn)
    with served(app) as base:
        c = Client(base)
        status, _, page = c.get("/schedules/partner-hook")
        assert status == 200 and "<h1>Schedule partner-hook</h1>" in page and 'id="runs"' in page
        assert c.get("/schedules/" + urllib.parse.quote("no such/schedule"))[0] == 404
        assert "no tasks in queue nosuchqueue" in text_of(c.get("/tasks?status=all&queue=nosuchqueue")[2])
        assert "no aborted tasks in queue nosuchqueue held by w-9" in text_of(
            c.get("/tasks?status=aborted&queue=nosuchqueue&owner=w-9")[2])
    app.close()


def test_intervals_read_as_words_and_the_overview_s_counts_link_to_their_lists(work, conn, monitor_dsn):
    """Issue 30: "every 00:00:45" read as "every 45 s"; each count of the overview opens the list
    it counts."""
    conn.execute("SELECT pyscheduler.create_schedule(name => 'often', every => '45 seconds', target => 't')")
    conn.execute("SELECT pyscheduler.create_schedule(name => 'daily-ish', every => '1 day 90 minutes', target => 't')")
    app = make_app(monitor_dsn)
    with served(app) as base:
        c = Client(base)
        t = text_of(c.get("/schedules")[2])
        assert "every 45 s" in t and "every 1 day 1 h 30 min" in t and "every 1 min" in t and "00:00:45" not in t
        assert re.search(r"recurrence\s+every 45 s", text_of(c.get("/schedules/often")[2]))
        page = c.get("/")[2]
        for href in ('/tasks?status=ready', '/tasks?status=scheduled', '/tasks?status=running', '/delay',
                     '/schedules#failing', '/schedules?paused=yes', '/checks#overdue'):
            assert f'<a href="{href}">' in page, href
    app.close()


def test_every_page_shows_what_readyz_knows(work, monitor_dsn):
    """Issue 30: served by the process's endpoint (``pyscheduler run``), every page's header
    says whether /readyz answers 200, and if not, what is not ready."""
    from pyscheduler.web.endpoint import serve

    app = make_app(monitor_dsn)
    endpoint = serve("127.0.0.1", 0, [], app=app)  # no daemon, no server to probe: ready
    try:
        c = Client(f"http://127.0.0.1:{endpoint.port}")
        for path in ("/", "/tasks", "/workers", "/schedules", "/nope"):
            assert re.search(r'<a class="pill ok" id="health" href="/readyz">ready</a>', c.get(path)[2]), path
        endpoint.health.expect("tasks-worker:emails")
        endpoint.health.down("tasks-worker:emails", "crashed: boom")
        page = c.get("/checks")[2]
        assert re.search(r'id="health" href="/readyz" title="/readyz">not ready: daemon tasks-worker:emails</a>', page)
    finally:
        endpoint.close()
        app.close()
    app = make_app(monitor_dsn)  # served alone (pyscheduler dashboard): no process to report on
    with served(app) as base:
        assert 'id="health"' not in Client(base).get("/")[2]
    app.close()
