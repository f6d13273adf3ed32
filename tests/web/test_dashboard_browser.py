"""The dashboard in a real browser: headless Chromium from Debian's packages
(.ci/run installs it), driven by Playwright pointed at it. Loads every page against real
work, cancels a task and pauses a schedule through their confirmations and sees the
effect in the database and on the page; a cross-site form post and a missing access
token are refused; creates, edits and deletes a schedule. Set
PYSCHEDULER_DASHBOARD_SCREENSHOTS=docs/img to write the README's screenshots (dashboard-*.png)."""

from __future__ import annotations

import os
import re
import shutil
import threading
from pathlib import Path

import pytest

from pyscheduler.dashboard import make_app
from pyscheduler.tasks import Worker
from tests.support.dashboard import SECRET, populate, served

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')")
# web-first assertions: each waits (up to 5 s) for the page an action loads or the script it runs
expect = sync_api.expect

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [
    pytest.mark.slow,  # a browser, on the real clock
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium on this machine: install Debian's chromium "
                                                "(apt-get install chromium; .ci/run does) to run the browser test"),
]


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


def shots(tmp_path: Path) -> Path:
    where = os.environ.get("PYSCHEDULER_DASHBOARD_SCREENSHOTS")
    return Path(where) if where else tmp_path


def test_every_page_and_an_action_in_a_browser(browser, conn, login, tmp_path):
    work = populate(conn)
    monitor = login("pyscheduler_monitor")[1]
    admin = login("pyscheduler_admin")[1]
    app = make_app(monitor, allow_actions=True, action_dsn=admin, token="t0ken-for-the-test", refresh_s=3600)
    out = shots(tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    with served(app) as base, served(_evil_site) as evil:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text)
                if m.type == "error" and not m.text.startswith("Failed to load resource") else None)
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        # the access token: nothing without it
        page.goto(base + "/tasks")
        expect(page.locator("h1")).to_have_text("Access token")
        assert work["running"][:8] not in page.content()
        page.fill("input[name=token]", "wrong")
        page.click("button[type=submit]")
        expect(page.locator(".flash.bad")).to_have_text("wrong token")
        page.fill("input[name=token]", "t0ken-for-the-test")
        page.click("button[type=submit]")
        expect(page).to_have_url(base + "/tasks")

        for path, name, shows in (("/", "overview", "Leased tasks"), ("/tasks?status=running", "tasks", "Queues"),
                                   (f"/tasks/{work['aborted']}", "task", "bank_refused"),
                                   ("/delay", "delay", "Relay nodes"), ("/delay/messages", "delay-messages", "order-2"),
                                   ("/schedules", "schedules", "Failing"),
                                   ("/schedule?name=partner-hook", "schedule", "Next runs"),
                                   ("/checks", "checks", "missed slot")):
            response = page.goto(base + path)
            assert response.status == 200, path
            assert shows in page.locator("main").inner_text(), path
            assert SECRET not in page.content()
            page.screenshot(path=str(out / f"dashboard-{name}.png"), full_page=True)
        # charts are drawn (inline SVG with bars)
        page.goto(base + "/")
        expect(page.locator("#card-tasks svg.bars rect")).to_have_count(24)
        # the range picker: 7 days in 6-hour buckets, and each card's latency lines
        page.locator("nav.range a", has_text="7d").click()
        expect(page).to_have_url(base + "/?range=7d")
        expect(page.locator("#card-tasks svg.bars rect")).to_have_count(2 * 28)
        expect(page.locator("svg.latency")).to_have_count(4)  # tasks, delay, schedules, checks

        # cancel a ready task: the link, the confirmation, the effect on the page and in the database
        page.goto(base + "/tasks?status=ready&queue=emails")
        row = page.locator("#tasks tr", has=page.locator(f"a[href='/tasks/{work['ready']}']"))
        row.locator("a.act", has_text="cancel").click()
        expect(page.locator("form.confirm")).to_contain_text("Cancel task " + work["ready"])
        assert _status(conn, work["ready"]) == "ready"  # nothing happens before the confirmation
        page.click("#confirm")
        expect(page.locator(".flash")).to_contain_text("done: Cancel task")
        assert _status(conn, work["ready"]) == "cancelled"
        expect(page.locator(f"#tasks a[href='/tasks/{work['ready']}']")).to_have_count(0)
        page.goto(base + "/tasks?status=cancelled")
        expect(page.locator(f"#tasks a[href='/tasks/{work['ready']}']")).to_have_count(1)

        # pause a schedule with a note
        page.goto(base + "/schedules?name_like=billing%25")
        page.locator("#schedules a.act", has_text="pause").click()
        page.fill("input[name=note]", "quarter close")
        page.click("#confirm")
        expect(page.locator(".flash")).to_contain_text("done: Pause schedule billing-report")
        expect(page.locator("#paused")).to_contain_text("quarter close")
        s = conn.execute("SELECT pyscheduler.get_schedule(name => 'billing-report') AS s").fetchone()["s"]
        assert s["paused"] and s["paused_note"] == "quarter close"

        # a cross-site post: another origin's page submits a form to the dashboard
        page.goto(evil + "/?target=" + base)
        page.click("#go")
        expect(page.locator("main")).to_contain_text("cross-site request refused")
        assert _status(conn, work["running"]) == "running"
        assert not errors, errors  # no CSP violation or script error on any page
        page.close()
    app.close()


def test_the_clock_ticks_and_a_refresh_in_place_breaks_no_policy(browser, conn, login):
    """Issue 30, defect 4: the header's database clock stood still, and every refresh of the
    page's main part logged a Content Security Policy error (the fetched page's <style> has
    another nonce): the clock ticks, the refresh shows new work, the console stays clean."""
    populate(conn)
    app = make_app(login("pyscheduler_monitor")[1], refresh_s=1)
    with served(app) as base:
        page = browser.new_page()
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(base + "/tasks?status=ready&queue=fresh")
        first = page.locator("#clock").inner_text()
        page.wait_for_function("t => document.getElementById('clock').textContent !== t", arg=first, timeout=5000)
        conn.execute("SELECT pyscheduler.submit_task(queue => 'fresh', spec => '{}')")
        rn = conn.execute("SELECT task ->> 'rn' AS rn FROM pyscheduler.list_tasks(queue => 'fresh')").fetchone()["rn"]
        page.locator(f"#tasks a[href='/tasks/{rn}']").wait_for(timeout=5000)  # refreshed in place (errors: by then)
        assert page.locator("style").count() == 1 and not errors, errors
        page.close()
    app.close()


def test_search_retry_bulk_retry_and_workers_in_a_browser(browser, conn, dsn, login, tmp_path):
    """Issue 30's walk: search for a task by its id's prefix, open it, retry it; tick 3 failed
    tasks and retry them at once; the workers page shows a running Worker and the warning for
    a queue with ready tasks and no worker."""
    work = populate(conn)
    worker = conn.execute("SELECT pyscheduler.register_worker() AS w").fetchone()["w"]
    conn.execute("SELECT pyscheduler.submit_tasks(queue => 'refunds', specs => '[{}, {}, {}, {}]')")
    failed = []
    for _ in range(4):
        t = conn.execute("SELECT pyscheduler.lease_task(queue => 'refunds', worker => %s) AS t", (worker,)
                         ).fetchone()["t"]
        conn.execute("SELECT pyscheduler.abort_task(rn => %s, token => %s, errors => '[{\"code\": \"x\"}]')",
                     (t["rn"], t["token"]))
        failed.append(t["rn"])
    conn.execute("SELECT pyscheduler.submit_tasks(queue => 'invoices', specs => '[{}, {}]')")
    conn.execute("SELECT pyscheduler.submit_task(queue => 'served', spec => '{}')")
    hold = threading.Event()
    running = Worker(dsn, "served", lambda ctx: hold.wait(30), poll_interval=0.2).start()
    app = make_app(login("pyscheduler_monitor")[1], allow_actions=True, action_dsn=login("pyscheduler_admin")[1],
                   refresh_s=3600)
    out = shots(tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    try:
        running.wait_idle()
        with served(app) as base:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            # search -> open the task -> retry it
            page.goto(base + "/")
            page.fill("#q", work["aborted"][:23])
            page.press("#q", "Enter")
            expect(page.locator("h1")).to_have_text("Search")
            page.screenshot(path=str(out / "dashboard-search.png"), full_page=True)
            page.click(f"#results a[href='/tasks/{work['aborted']}']")
            expect(page.locator("h1")).to_have_text(f"Task {work['aborted']}")
            page.click("a.act:has-text('retry')")
            page.click("#confirm")
            expect(page.locator(".flash")).to_contain_text("done: Requeue task")
            assert _status(conn, work["aborted"]) == "ready"
            # tick 3 failed tasks -> bulk retry
            page.goto(base + "/tasks?status=aborted&queue=refunds")
            for rn in failed[:3]:
                page.check(f"#tasks input[value='{rn}']")
            page.click("#bulk-actions button[value=retry]")
            expect(page.locator("form.confirm")).to_have_text(re.compile("^Requeue 3 selected tasks"),
                                                              use_inner_text=True)
            page.click("#confirm")
            expect(page.locator(".flash")).to_contain_text("done: requeued 3 of 3 tasks")
            assert [_status(conn, rn) for rn in failed] == ["ready"] * 3 + ["aborted"]
            # the workers page: the running Worker, and the queue nobody works
            page.goto(base + "/workers")
            row = page.locator("#workers tr", has=page.locator(f"a:text-is('{running.worker.worker_id}')"))
            assert "served" in row.inner_text()
            expect(page.locator("#no-worker")).to_contain_text("invoices: 2 ready")
            page.screenshot(path=str(out / "dashboard-workers.png"), full_page=True)
            assert not errors, errors
            page.close()
    finally:
        hold.set()
        running.stop()
        app.close()


def test_dark_mode_and_a_390_px_screen(browser, conn, login, tmp_path):
    """Issue 30: the system's dark mode gives dark pages (the screenshot differs from the light
    one); at 390 px wide no page scrolls sideways (wide tables scroll inside themselves)."""
    work = populate(conn)
    app = make_app(login("pyscheduler_admin")[1], allow_actions=True, refresh_s=3600)
    out = shots(tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    with served(app) as base:
        pages = ["/", "/tasks?status=all", f"/tasks/{work['aborted']}", "/workers", "/search?q=emails", "/delay",
                 "/delay/messages", "/schedules", "/schedule/edit?name=partner-hook", "/schedules/partner-hook",
                 "/checks"]
        narrow = browser.new_page(viewport={"width": 390, "height": 844})
        for path in pages:
            narrow.goto(base + path)
            assert narrow.evaluate("document.documentElement.scrollWidth") <= 390, path
        narrow.goto(base + "/tasks?status=all")
        narrow.screenshot(path=str(out / "dashboard-390px.png"), full_page=True)
        narrow.close()
        shots_by_scheme = {}
        for scheme in ("light", "dark"):
            page = browser.new_page(viewport={"width": 1280, "height": 900}, color_scheme=scheme)
            page.goto(base + "/")
            assert page.evaluate("getComputedStyle(document.body).backgroundColor") == {
                "light": "rgb(246, 247, 249)", "dark": "rgb(17, 21, 28)"}[scheme]
            shots_by_scheme[scheme] = page.screenshot(path=str(out / f"dashboard-overview-{scheme}.png"))
            page.close()
        assert shots_by_scheme["light"] != shots_by_scheme["dark"]
    app.close()


def test_create_edit_and_delete_a_schedule_in_a_browser(browser, conn, login, tmp_path):
    """Issue 30's walk: a new schedule from the schedules page, its next runs previewed while
    it is typed (a bad zone said next to its field), created; edited (its target); deleted
    behind a confirmation. The editor's page is the screenshot dashboard-schedule-edit.png."""
    role, dsn = login("pyscheduler_client", "pyscheduler_monitor")
    app = make_app(login("pyscheduler_monitor")[1], allow_actions=True, action_dsn=dsn, refresh_s=3600)
    out = shots(tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    with served(app) as base:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text)  # the refused preview is a 400: said, not an error
                if m.type == "error" and not m.text.startswith("Failed to load resource") else None)
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(base + "/schedules")
        page.click("#new-schedule")
        page.fill("#f-name", "nightly-report")
        page.fill("#f-cron", "30 2 * * *")
        page.fill("#f-tz", "Europe/Berlni")
        page.fill("#f-target", "reports")
        page.click("#preview")
        expect(page.locator("#error")).to_have_text(re.compile("^tz:"), use_inner_text=True)
        page.fill("#f-tz", "Europe/Berlin")
        page.click("#preview")
        expect(page.locator("#preview-runs li")).to_have_count(10)
        assert page.locator("#f-cron").input_value() == "30 2 * * *"  # what was typed is kept
        page.screenshot(path=str(out / "dashboard-schedule-edit.png"), full_page=True)
        page.click("#save")
        expect(page.locator(".flash")).to_contain_text("done: created schedule nightly-report")
        expect(page.locator("h1")).to_have_text("Schedule nightly-report")
        s = conn.execute("SELECT pyscheduler.get_schedule(name => 'nightly-report') AS s").fetchone()["s"]
        assert (s["owner"], s["tz"], s["target"]) == (role, "Europe/Berlin", "reports")
        page.click("#edit")
        page.fill("#f-target", "reports-v2")
        page.click("#save")
        expect(page.locator(".flash")).to_contain_text("done: updated schedule nightly-report")
        expect(page.locator("#schedule-fields")).to_contain_text("reports-v2")
        page.click("#delete")
        expect(page.locator("form.confirm")).to_contain_text("Delete schedule nightly-report")
        page.click("#confirm")
        expect(page.locator(".flash")).to_contain_text("done: Delete schedule nightly-report")
        expect(page).to_have_url(re.compile(re.escape(base + "/schedules?")))
        assert conn.execute("SELECT count(*) AS n FROM pyscheduler.list_schedules()").fetchone()["n"] == 0
        assert not errors, errors
        page.close()
    app.close()


def _status(conn, rn: str) -> str:
    return conn.execute("SELECT pyscheduler.get_task(rn => %s) ->> 'status' AS s", (rn,)).fetchone()["s"]


def _evil_site(environ, start_response):
    """Another origin with a form that posts a cancel to the dashboard (as a link in a mail would)."""
    from urllib.parse import parse_qs

    target = parse_qs(environ.get("QUERY_STRING", "")).get("target", [""])[0]
    rn = "00000000-0000-0000-0000-000000000000"
    body = (f'<html><body><form method="post" action="{target}/actions/cancel_task">'
            f'<input type="hidden" name="rn" value="{rn}"><input type="hidden" name="csrf" value="guess">'
            f'<button id="go" type="submit">win a prize</button></form></body></html>').encode()
    start_response("200 OK", [("Content-Type", "text/html"), ("Content-Length", str(len(body)))])
    return [body]
