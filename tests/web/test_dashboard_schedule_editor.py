"""The schedule editor (issue 30): create, edit and delete a schedule from the dashboard as its
action login, a preview of the next runs while editing (a server round trip), CSRF- and
origin-checked posts, errors that name the field (cron, zone, target, a duration), another
role's schedule refused with the SQL's error (42501), not a 500. The browser walk is in
tests/web/test_dashboard_browser.py."""

from __future__ import annotations

import html
import re

import psycopg
import pytest

from pyscheduler.dashboard import make_app
from tests.support.dashboard import Client, served, text_of


@pytest.fixture
def editor(login):
    """A dashboard whose action login may create schedules (a client that reads as a monitor)."""
    name, dsn = login("pyscheduler_client", "pyscheduler_monitor")
    app = make_app(login("pyscheduler_monitor")[1], allow_actions=True, action_dsn=dsn)
    with served(app) as base:
        c = Client(base)
        c.get("/")  # the session cookie
        yield c, base, name
    app.close()


def _form(c: Client, path: str) -> dict[str, str]:
    """The editor's fields as the page fills them (inputs, the payload, the selects, ticked boxes)."""
    status, _, page = c.get(path)
    assert status == 200, page
    fields = {html.unescape(n): html.unescape(v)
              for n, v in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page)}
    fields |= {n: html.unescape(v) for n, v in re.findall(r'<input name="([^"]+)" id="f-[^"]+" value="([^"]*)"', page)}
    fields["payload"] = html.unescape(re.search(r'<textarea name="payload"[^>]*>([^<]*)</textarea>', page)[1])
    for n, options in re.findall(r'<select name="([^"]+)"[^>]*>(.*?)</select>', page):
        fields[n] = re.search(r"<option selected>([^<]*)<", options)[1]
    fields |= {n: "on" for n in re.findall(r'<input type="checkbox" name="([^"]+)"[^>]* checked>', page)}
    return fields


def _get(conn, name: str):
    return conn.execute("SELECT pyscheduler.get_schedule(name => %s) AS s", (name,)).fetchone()["s"]


def test_create_preview_edit_and_delete_a_schedule(editor, conn):
    c, base, role = editor
    assert 'href="/schedule/new"' in c.get("/schedules")[2]
    fields = _form(c, "/schedule/new")
    assert fields["retry_base"] == "200ms" and fields["target_kind"] == "kafka" and "critical" not in fields
    fields |= {"name": "nightly-report", "cron": "30 2 * * *", "tz": "Europe/Berlin", "target": "reports"}
    # the preview: the next runs of what is typed, nothing saved
    status, _, page = c.request("/schedule/save", {**fields, "do": "preview"}, {"Origin": base})
    t = text_of(page)
    assert status == 200 and "Next 10 runs" in t, t
    assert len(re.findall(r"<li>\d{4}-\d\d-\d\d (?:00|01):30:00Z", page)) == 10  # 02:30 in Berlin
    assert conn.execute("SELECT count(*) AS n FROM pyscheduler.list_schedules()").fetchone()["n"] == 0
    # create: as the action login, then its page
    status, headers, page = c.request("/schedule/save", {**fields, "do": "save"}, {"Origin": base})
    assert status == 303, page
    assert headers["Location"].startswith("/schedule?name=nightly-report&flash=")
    assert "done: created schedule nightly-report" in text_of(c.get(headers["Location"])[2])
    s = _get(conn, "nightly-report")
    assert (s["owner"], s["cron"], s["tz"], s["target"], s["retry_attempts"]) == (
        role, "30 2 * * *", "Europe/Berlin", "reports", 3)
    # edit: the form is filled from the schedule; only what changed is sent
    page = c.get("/schedule?name=nightly-report")[2]
    assert 'href="/schedule/edit?name=nightly-report"' in page and "/confirm/delete_schedule?" in page
    fields = _form(c, "/schedule/edit?name=nightly-report")
    assert (fields["cron"], fields["tz"], fields["editing"], fields["catchup_window"]) == (
        "30 2 * * *", "Europe/Berlin", "nightly-report", "1m")
    next_run = s["next_run_at"]
    status, headers, page = c.request("/schedule/save", {**fields, "target": "reports-v2", "critical": "on",
                                                         "do": "save"}, {"Origin": base})
    assert status == 303, page
    s = _get(conn, "nightly-report")
    assert (s["target"], s["critical"], s["cron"], s["next_run_at"]) == ("reports-v2", True, "30 2 * * *", next_run)
    # every replaces cron; emptied bounds stay empty
    status, _, page = c.request("/schedule/save", {**fields, "cron": "", "every": "15m", "do": "save"},
                                {"Origin": base})
    assert status == 303, page
    s = _get(conn, "nightly-report")
    assert s["cron"] is None and s["every"] in ("00:15:00", "PT15M", "15 mins")
    # delete: a confirmation, then it is gone
    page = c.get("/confirm/delete_schedule?name=nightly-report&next=/schedules")[2]
    assert "Delete schedule nightly-report" in text_of(page)
    csrf = re.search(r'name="csrf" value="([^"]+)"', page)[1]
    status, headers, _ = c.request("/actions/delete_schedule", {"name": "nightly-report", "csrf": csrf,
                                                                "next": "/schedules"}, {"Origin": base})
    assert status == 303 and headers["Location"].startswith("/schedules?flash=")
    assert "done: Delete schedule nightly-report" in text_of(c.get(headers["Location"])[2])
    assert conn.execute("SELECT count(*) AS n FROM pyscheduler.list_schedules()").fetchone()["n"] == 0


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"every": "", "cron": "61 * * * *"}, "cron", "cron"),
    ({"tz": "Mars/Olympus"}, "tz", "IANA time zone"),
    ({"target": "not a topic!"}, "target", "Kafka topic name"),
    ({"target_kind": "http", "target": "http://127.0.0.1/x"}, "target", "http target"),
    ({"every": "soon"}, "every", "duration such as"),
    ({"payload": "{nope"}, "payload", "not JSON"),
    ({"start_at": "tomorrow"}, "start_at", "ISO 8601"),
    ({"name": "existing"}, "name", "already exists"),
])
def test_a_refusal_names_its_field_and_keeps_what_was_typed(editor, conn, change, field, words):
    c, base, _ = editor
    conn.execute("SELECT pyscheduler.create_schedule(name => 'existing', every => '1 hour', target => 'x')")
    fields = _form(c, "/schedule/new") | {"name": "fresh", "every": "5m", "target": "reports"} | change
    for do in ("preview", "save") if field in ("cron", "tz", "every", "start_at") else ("save",):
        status, _, page = c.request("/schedule/save", {**fields, "do": do}, {"Origin": base})
        assert status == 400, page
        error = " ".join(text_of(re.search(r'<div class="flash bad" id="error".*?</div>', page, re.S)[0]).split())
        error = error.replace(" :", ":", 1)
        assert error.startswith(f"{field}:") and words in error, error
        assert '<label class="bad">' in page and html.escape(list(change.values())[-1], quote=True) in page
    assert conn.execute("SELECT count(*) AS n FROM pyscheduler.list_schedules(name_like => 'fresh')"
                        ).fetchone()["n"] == 0


def test_another_role_s_schedule_is_refused_with_the_sql_error(editor, conn, login):
    c, base, _ = editor
    with psycopg.connect(login("pyscheduler_client")[1], autocommit=True) as other:
        other.execute("SELECT pyscheduler.create_schedule(name => 'theirs', every => '1 hour', target => 'theirs')")
    fields = _form(c, "/schedule/edit?name=theirs")
    assert "may not see its target or change it" in text_of(c.get("/schedule/edit?name=theirs")[2])
    status, _, page = c.request("/schedule/save", {**fields, "target": "mine", "do": "save"}, {"Origin": base})
    assert status == 403 and "schedule 'theirs' belongs to another role (42501)" in text_of(page), page
    page = c.get("/confirm/delete_schedule?name=theirs&next=/schedules")[2]
    csrf = re.search(r'name="csrf" value="([^"]+)"', page)[1]
    status, headers, _ = c.request("/actions/delete_schedule", {"name": "theirs", "csrf": csrf, "next": "/schedules"},
                                   {"Origin": base})
    assert status == 303 and "(42501)" in c.get(headers["Location"])[2]
    assert _get(conn, "theirs")["target"] == "theirs"


def test_the_editor_needs_actions_the_csrf_token_and_the_same_origin(editor, conn, login):
    c, base, _ = editor
    fields = _form(c, "/schedule/new") | {"name": "sneaky", "every": "5m", "target": "reports", "do": "save"}
    assert c.request("/schedule/save", fields, {"Origin": "http://evil.example"})[0] == 403
    assert c.request("/schedule/save", {**fields, "csrf": "guess"}, {"Origin": base})[0] == 403
    assert c.get("/schedule/save")[0] == 405
    read_only = make_app(login("pyscheduler_monitor")[1])
    with served(read_only) as other:
        ro = Client(other)
        assert ro.get("/schedule/new")[0] == 403
        assert 'href="/schedule/new"' not in ro.get("/schedules")[2]
    read_only.close()
    assert conn.execute("SELECT count(*) AS n FROM pyscheduler.list_schedules()").fetchone()["n"] == 0
