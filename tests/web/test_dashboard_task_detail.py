"""The task page complete (issue 30): its result, each attempt (worker, when leased, how long,
how it ended, its error), the workflow around it (parents and children with their states),
its concurrency key and its queue's limits; the tasks page lists every queue (finished tasks
and limits included)."""

from __future__ import annotations

import re

from pyscheduler.dashboard import make_app
from tests.support.dashboard import Client, served, text_of


def _table(page: str, table: str) -> list[str]:
    body = page.split(f'<table id="{table}">')[1].split("</table>")[0]
    return [" ".join(text_of(r).split()) for r in re.findall(r"<tr>(.*?)</tr>", body, re.S)[1:]]


def test_a_task_page_shows_attempts_result_workflow_and_limits(conn, login):
    x = conn.execute
    x("SELECT pyscheduler.set_queue_limits(queue => 'ledger', running_total => 5, running_per_key => 1)")
    x("SELECT pyscheduler.set_rate_limit(queue => 'ledger', starts => 10, per => '1 minute')")
    parent = x("SELECT pyscheduler.submit_task(queue => 'ledger', spec => '{}', concurrency_key => 'acct-1') AS t"
               ).fetchone()["t"]["rn"]
    child = x("SELECT pyscheduler.submit_task(queue => 'mail', spec => '{}', after => ARRAY[%s]::uuid[]) AS t",
              (parent,)).fetchone()["t"]["rn"]
    worker = x("SELECT pyscheduler.register_worker() AS w").fetchone()["w"]
    t = x("SELECT pyscheduler.lease_task(queue => 'ledger', worker => %s) AS t", (worker,)).fetchone()["t"]
    x("SELECT pyscheduler.fail_task(rn => %s, token => %s, error => '{\"code\": \"ledger_locked\", "
      "\"description\": \"try again\"}', retry_in => '0 seconds')", (t["rn"], t["token"]))
    x("UPDATE pyscheduler.tasks SET run_at = now() - interval '1 second' WHERE rn = %s", (parent,))
    t = x("SELECT pyscheduler.lease_task(queue => 'ledger', worker => %s) AS t", (worker,)).fetchone()["t"]
    assert t["rn"] == parent
    x("SELECT pyscheduler.complete_task(rn => %s, token => %s, result => '{\"posted\": 3}')", (t["rn"], t["token"]))
    x("SELECT pyscheduler.submit_task(queue => 'quiet', spec => '{}')")
    quiet = x("SELECT pyscheduler.lease_task(queue => 'quiet', worker => %s) AS t", (worker,)).fetchone()["t"]
    x("SELECT pyscheduler.complete_task(rn => %s, token => %s)", (quiet["rn"], quiet["token"]))
    app = make_app(login("pyscheduler_admin")[1])
    with served(app) as base:
        c = Client(base)
        page = c.get(f"/tasks/{parent}")[2]
        fields = " ".join(text_of(page.split('id="task-fields">')[1].split("</dl>")[0]).split())
        assert "concurrency key acct-1" in fields
        assert "queue limits 5 running, 1 running per key, 10 starts per" in fields
        rows = _table(page, "attempts")
        assert len(rows) == 2, rows
        assert re.fullmatch(rf"1 {worker} \S+ \S+ \S+ \S+ [\d.]+ m?s TaskRetry ledger_locked try again", rows[0]), rows
        assert re.fullmatch(rf"2 {worker} \S+ \S+ \S+ \S+ [\d.]+ m?s TaskCompleted", rows[1]), rows
        assert '"posted": 3' in text_of(page.split('id="result">')[1].split("</pre>")[0])
        assert _table(page, "family")[0].startswith(f"child {child} mail ready")
        assert _table(c.get(f"/tasks/{child}")[2], "family")[0].startswith(f"parent {parent} ledger completed")
        queues = {r.split()[0]: r for r in _table(c.get("/tasks")[2], "queues")}
        assert queues["quiet"].startswith("quiet 0 0 0 0 1 0 0")  # only a finished task: listed
        assert "5 running, 1 running per key, 10 starts per" in queues["ledger"]
        assert queues["mail"].startswith("mail 1 0 0 0 0 0 0")
    app.close()
