"""Real work for the dashboard's tests and screenshots, made through the SQL API, and a
dashboard served on a free loopback port."""

from __future__ import annotations

import contextlib
import html
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

SECRET = "Zx81secretPath9f3k2LmQ"  # in an HTTP target's path and query: never shown


def populate(conn: Any) -> dict[str, Any]:
    """Tasks in every state, delayed messages (waiting, overdue, ready), schedules (one of
    each target, a paused one, a failing one with runs), checks (pending, overdue, ended)."""
    x = conn.execute
    out: dict[str, Any] = {}
    # -- tasks
    for i in range(3):
        x("SELECT pyscheduler.submit_task(queue => 'emails', spec => %s::jsonb, priority => %s)",
          (f'{{"to": "user{i}@example.com", "api_key": "k-{i}"}}', 50 + i))
    x("SELECT pyscheduler.submit_task(queue => 'reports', spec => '{\"report\": \"weekly\"}', run_in => '1 hour')")
    worker = x("SELECT pyscheduler.register_worker() AS w").fetchone()["w"]
    t = x("SELECT pyscheduler.lease_task(queue => 'emails', worker => %s, timeout => '1 hour') AS t",
          (worker,)).fetchone()["t"]
    x("SELECT pyscheduler.heartbeat_task(rn => %s, token => %s, progress => 0.4, timeout => '1 hour')",
      (t["rn"], t["token"]))
    out["running"] = t["rn"]
    t = x("SELECT pyscheduler.lease_task(queue => 'emails', worker => %s) AS t", (worker,)).fetchone()["t"]
    x("SELECT pyscheduler.fail_task(rn => %s, token => %s, error => %s::jsonb, retry_in => '10 minutes')",
      (t["rn"], t["token"], '{"code": "smtp_421", "description": "try later", "args": {}}'))
    out["retrying"] = t["rn"]
    x("SELECT pyscheduler.submit_task(queue => 'payouts', spec => '{\"amount\": 10}')")
    t = x("SELECT pyscheduler.lease_task(queue => 'payouts', worker => %s) AS t", (worker,)).fetchone()["t"]
    x("SELECT pyscheduler.abort_task(rn => %s, token => %s, errors => %s::jsonb)",
      (t["rn"], t["token"], '[{"code": "bank_refused", "description": "account closed", "args": {"iban": "x"}}]'))
    out["aborted"] = t["rn"]
    t = x("SELECT pyscheduler.lease_task(queue => 'emails', worker => %s) AS t", (worker,)).fetchone()["t"]
    x("SELECT pyscheduler.complete_task(rn => %s, token => %s)", (t["rn"], t["token"]))
    x("SELECT pyscheduler.submit_task(queue => 'emails', spec => '{\"to\": \"ops@example.com\"}')")
    out["ready"] = x("SELECT task ->> 'rn' AS rn FROM pyscheduler.list_tasks(queue => 'emails', status => 'ready')"
                     ).fetchone()["rn"]
    # -- delay queue: two waiting, one overdue (its relays are behind), one ready (claimed)
    x("SELECT * FROM pyscheduler.enqueue_messages(ids => ARRAY['order-1', 'order-2', 'late-1', 'soon-1'], "
      "deadlines => ARRAY[now() + interval '1 hour', now() + interval '2 hours', now() - interval '30 seconds', "
      "now() - interval '1 second'], store_late => true)")
    x("SELECT * FROM pyscheduler.ready_and_claim(node => gen_random_uuid(), max_count => 1)")
    # -- schedules
    x("SELECT pyscheduler.create_schedule(name => 'billing-report', cron => '0 6 * * MON-FRI', "
      "tz => 'Europe/Berlin', target => 'reports')")
    x("SELECT pyscheduler.create_schedule(name => 'partner-hook', every => '1 minute', target_kind => 'http', "
      "target => %s, critical => true, retry_attempts => 0)",
      (f"https://hooks.example.com/services/{SECRET}?token={SECRET}",))
    x("SELECT pyscheduler.create_schedule(name => 'cleanup', every => '1 hour', target_kind => 'task', "
      "target => 'maintenance', payload => '{\"job\": \"cleanup\"}', overlap => 'skip')")
    x("SELECT pyscheduler.create_schedule(name => 'ledger-sync', every => '5 minutes', target => 'ledger', "
      "paused => true, paused_note => 'ledger migration until Monday')")
    for outcome, error in (("fired", None), ("failed", "HTTP 503 from partner")):
        x("SELECT r.* FROM (SELECT (pyscheduler.get_schedule(name => 'partner-hook') ->> 'id')::bigint AS id, "
          "(pyscheduler.get_schedule(name => 'partner-hook') ->> 'due_at')::timestamptz AS due_at) s, "
          "pyscheduler.record_executions(ids => ARRAY[s.id], expected => ARRAY[s.due_at], "
          "outcomes => ARRAY[%s::text], attempts => ARRAY[1], errors => ARRAY[%s::text]) r",
          (outcome, error))
    # -- checks: pending (python and task jobs), one ended, one overdue (added for a slot now past)
    x("SELECT * FROM pyscheduler.add_check(entity_name => 'order', entity_key => '233', job => 'order_sms', "
      "kind => 'python', check_after => '3 hours', payload => '{\"phone\": \"+4915112345678\"}')")
    x("SELECT * FROM pyscheduler.add_check(entity_name => 'order', entity_key => '234', job => 'order_sms', "
      "kind => 'python', check_after => '1 hour')")
    x("SELECT * FROM pyscheduler.add_check(entity_name => 'invoice', entity_key => '77', job => 'dunning', "
      "kind => 'task', check_after => '2 hours')")
    x("SELECT * FROM pyscheduler.delete_checks(entity_name => 'order', entity_key => '234')")
    x("SELECT * FROM pyscheduler._add_check(p_entity_name => 'cart', p_entity_key => '9', p_job => 'cart_reminder', "
      "p_kind => 'python', p_check_at => NULL, p_check_after => interval '1 second', p_payload => NULL, "
      "p_max_checks => NULL, p_horizon => NULL, p_now => now() - interval '1 day')")
    return out


@contextlib.contextmanager
def served(app: Any) -> Iterator[str]:
    """Serve a WSGI app on a free loopback port; yields its base URL."""
    from pyscheduler.dashboard import serve

    stop, ready = threading.Event(), threading.Event()
    where: dict[str, Any] = {}

    def on_ready(host: str, port: int) -> None:
        where.update(host=host, port=port)
        ready.set()

    thread = threading.Thread(target=serve, args=(app, "127.0.0.1", 0), kwargs={"ready": on_ready, "stop": stop},
                              daemon=True)
    thread.start()
    assert ready.wait(10), "the server did not start"
    try:
        yield f"http://127.0.0.1:{where['port']}"
    finally:
        stop.set()
        thread.join(10)


class Client:
    """A cookie-keeping HTTP client that follows no redirects."""

    def __init__(self, base: str):
        self.base = base
        self.cookies: dict[str, str] = {}

    def request(self, path: str, data: dict | None = None, headers: dict | None = None) -> tuple[int, dict, str]:
        body = urllib.parse.urlencode(data).encode() if data is not None else None
        req = urllib.request.Request(self.base + path, data=body, headers=dict(headers or {}))
        if self.cookies:
            req.add_header("Cookie", "; ".join(f"{k}={v}" for k, v in self.cookies.items()))

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *a, **k):
                return None

        opener = urllib.request.build_opener(NoRedirect)
        try:
            resp = opener.open(req, timeout=30)
            status, hdrs, text = resp.status, resp.headers, resp.read().decode()
        except urllib.error.HTTPError as exc:
            status, hdrs, text = exc.code, exc.headers, exc.read().decode()
        for cookie in hdrs.get_all("Set-Cookie") or []:
            name, _, rest = cookie.partition("=")
            self.cookies[name] = rest.split(";")[0]
        return status, dict(hdrs), text

    def get(self, path: str, **kw) -> tuple[int, dict, str]:
        return self.request(path, **kw)


def text_of(page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", page))
