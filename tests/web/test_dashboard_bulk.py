"""Bulk actions on the tasks list (issue 30): tick rows or take the list's filter, a confirmation
that says how many, a CSRF-checked POST that acts in bounded batches through the action
login's role (another role's tasks are left as they were), the result in the flash, the history
and the log."""

from __future__ import annotations

import contextlib
import html
import logging
import re

from pyscheduler.dashboard import make_app
from tests.support.dashboard import Client, served, text_of


def _status(conn, rn: str) -> str | None:
    row = conn.execute("SELECT status::text AS s FROM pyscheduler.tasks WHERE rn = %s", (rn,)).fetchone()
    return row["s"] if row else None


def _aborted(conn, queue: str, n: int, dsn: str | None = None) -> list[str]:
    """n aborted tasks of queue (submitted by dsn's role when given)."""
    import psycopg
    from psycopg.rows import dict_row

    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) if dsn else contextlib.nullcontext(conn) as c:
        c.execute("SELECT pyscheduler.submit_tasks(queue => %s, specs => %s::jsonb)", (queue, "[" + ",".join(["{}"] * n)
                                                                                       + "]"))
    worker = conn.execute("SELECT pyscheduler.register_worker() AS w").fetchone()["w"]
    rns = []
    for _ in range(n):
        t = conn.execute("SELECT pyscheduler.lease_task(queue => %s, worker => %s) AS t",
                         (queue, worker)).fetchone()["t"]
        conn.execute("SELECT pyscheduler.abort_task(rn => %s, token => %s, errors => '[{\"code\": \"x\"}]')",
                     (t["rn"], t["token"]))
        rns.append(t["rn"])
    return rns


def _confirm(c: Client, path: str) -> tuple[str, str, dict]:
    """(what the confirmation says, its form's action, its hidden fields)."""
    status, _, page = c.get(path)
    assert status == 200, page
    action = html.unescape(re.search(r'<form method="post" action="([^"]+)"', page).group(1))
    fields = {html.unescape(n): html.unescape(v)
              for n, v in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page)}
    return text_of(page.split('class="confirm card">')[1].split("</p>")[0]).strip(), action, fields


def test_bulk_retry_of_ticked_rows_and_of_a_filter_with_the_ownership_rule(conn, login, caplog):
    caplog.set_level(logging.INFO, logger="pyscheduler.dashboard")
    name, client_dsn = login("pyscheduler_client")
    mine = _aborted(conn, "invoices", 5, client_dsn)
    theirs = _aborted(conn, "invoices", 2)  # the superuser's: another role for the client login
    app = make_app(login("pyscheduler_monitor")[1], allow_actions=True, action_dsn=client_dsn)
    with served(app) as base:
        c = Client(base)
        page = c.get("/tasks?status=aborted&queue=invoices")[2]
        assert page.count('type="checkbox" name="rn"') == 7 and 'action="/confirm/bulk_tasks"' in page
        # three ticked rows
        picked = "&".join(f"rn={rn}" for rn in mine[:3])
        what, action, fields = _confirm(c, f"/confirm/bulk_tasks?op=retry&{picked}&next=/tasks?status=aborted")
        assert what == "Requeue 3 selected tasks (those aborted/cancelled)?", what
        assert [_status(conn, rn) for rn in mine[:3]] == ["aborted"] * 3  # nothing before the confirmation
        assert c.request(action, {k: v for k, v in fields.items() if k != "csrf"}, {"Origin": base})[0] == 403
        status, headers, _ = c.request(action, fields, {"Origin": base})
        assert status == 303 and "done: requeued 3 of 3 tasks" in text_of(c.get(headers["Location"])[2])
        assert [_status(conn, rn) for rn in mine[:3]] == ["ready"] * 3
        history = conn.execute("SELECT pyscheduler.get_task(rn => %s) -> 'history' AS h", (mine[0],)).fetchone()["h"]
        assert history[-1]["_typ"] == "TaskRequeued" and history[-1]["by"] == name
        assert "dashboard bulk action retry: 3 of 3 tasks requeued" in caplog.text
        # the filter: the 4 aborted ones left, 2 of another role: those are left as they were
        what, action, fields = _confirm(c, "/confirm/bulk_tasks?op=retry&scope=filter&queue=invoices&status=aborted")
        assert what == "Requeue 4 tasks: the aborted tasks in queue invoices?", what
        text = text_of(c.get(c.request(action, fields, {"Origin": base})[1]["Location"])[2])
        assert "done: requeued 2 of 4 tasks; 2 left as they were (first: " in text and "(42501)" in text, text
        assert [_status(conn, rn) for rn in mine + theirs] == ["ready"] * 5 + ["aborted"] * 2
        # a filter a bulk action does not apply to, and nothing ticked
        assert c.get("/confirm/bulk_tasks?op=retry&scope=filter&queue=invoices&status=ready")[0] == 400
        assert c.get("/confirm/bulk_tasks?op=retry")[0] == 400
        assert c.get("/confirm/bulk_tasks?op=explode&rn=" + mine[0])[0] == 400
    app.close()


def test_bulk_cancel_delete_and_run_now(conn, login):
    admin = login("pyscheduler_admin")[1]
    conn.execute("SELECT pyscheduler.submit_tasks(queue => 'later', specs => '[{}, {}, {}]', run_in => '1 hour')")
    later = [r["rn"] for r in conn.execute("SELECT task ->> 'rn' AS rn FROM pyscheduler.list_tasks(queue => 'later')")]
    done = _aborted(conn, "old", 2)
    app = make_app(admin, allow_actions=True)
    with served(app) as base:
        c = Client(base)
        what, action, fields = _confirm(c, f"/confirm/bulk_tasks?op=run&rn={later[0]}&rn={later[1]}")
        assert what.startswith("Run now 2 selected tasks")
        assert "made due now 2 of 2" in text_of(c.get(c.request(action, fields, {"Origin": base})[1]["Location"])[2])
        assert conn.execute("SELECT count(*) AS n FROM pyscheduler.tasks WHERE run_at <= now() AND queue = 'later'"
                            ).fetchone()["n"] == 2
        what, action, fields = _confirm(c, "/confirm/bulk_tasks?op=cancel&scope=filter&queue=later&status=scheduled")
        assert what == "Cancel 3 tasks: the scheduled tasks in queue later?", what
        assert 'class="primary danger"' in c.get("/confirm/bulk_tasks?op=cancel&scope=filter&queue=later"
                                                 "&status=scheduled")[2]
        c.request(action, fields, {"Origin": base})
        assert [_status(conn, rn) for rn in later] == ["cancelled"] * 3
        what, action, fields = _confirm(c, "/confirm/bulk_tasks?op=delete&scope=filter&queue=old&status=all")
        assert what == "Delete 2 tasks: the completed/aborted/cancelled tasks in queue old?", what
        assert "deleted 2 of 2" in text_of(c.get(c.request(action, fields, {"Origin": base})[1]["Location"])[2])
        assert [_status(conn, rn) for rn in done] == [None, None]
    app.close()
