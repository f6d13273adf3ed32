"""The dashboard's search box (issue 30): one term finds tasks by id prefix, spec fragment or
unique key, a queue, a worker's running tasks, schedules by name or target prefix, checks by
entity key and a delay message by id, each through an index (what each call read, from
PostgreSQL's counters, at a few thousand rows); a key or spec fragment finds only what the reading role
may see."""

from __future__ import annotations

import html
import re
from datetime import datetime, timedelta, timezone
import urllib.parse

from pyscheduler.dashboard import make_app
from pyscheduler.web.dashboard.data import id_range, spec_fragment
from tests.support.dashboard import Client, populate, served, text_of
from tests.support.reads import reads


def _section(page: str, title: str) -> str:
    """The text of one result section (from its heading to the next)."""
    m = re.search(rf"<h2>{re.escape(title)} \(\d+\+?\)</h2>(.*?)(?=<h2>|</div>\s*</main>)", page, re.S)
    return text_of(m.group(1)) if m else ""


def test_a_waiting_message_found_by_id_is_cancelled_from_the_search(conn, login):
    """Issue 30 (the delay queue: look a message up, cancel it): the search's message row offers
    cancel while it waits; the confirmation, the POST, then nothing left to find."""
    populate(conn)
    app = make_app(login("pyscheduler_admin")[1], allow_actions=True)
    with served(app) as base:
        c = Client(base)
        page = c.get("/search?q=order-1")[2]
        href = html.unescape(re.search(r'<a class="act danger" href="(/confirm/cancel_message\?[^"]+)"', page).group(1))
        page = c.get(href)[2]
        assert "Cancel delayed message order-1: it never fires?" in text_of(page)
        action = html.unescape(re.search(r'<form method="post" action="([^"]+)"', page).group(1))
        fields = {html.unescape(n): html.unescape(v)
                  for n, v in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page)}
        status, headers, _ = c.request(action, fields, {"Origin": base})
        assert status == 303 and "done: Cancel delayed message order-1" in text_of(c.get(headers["Location"])[2])
        assert conn.execute("SELECT count(*) AS n FROM pyscheduler.find_message(id => 'order-1')").fetchone()["n"] == 0
        assert "Delay messages by id" not in c.get("/search?q=order-1")[2]
        status, headers, _ = c.request(action, fields, {"Origin": base})  # again: nothing waits
        assert "not cancelled: Cancel delayed message order-1" in text_of(c.get(headers["Location"])[2])
        page = c.get("/search?q=late-1")[2]  # ready (being fired): too late to cancel
        assert re.search(r"late-1\s+ready", text_of(page)) and "cancel_message" not in page
    app.close()


def test_the_terms_the_box_reads():
    lo, hi = id_range("01A2-277b")
    assert str(lo) == "01a2277b-0000-0000-0000-000000000000" and str(hi) == "01a2277b-ffff-ffff-ffff-ffffffffffff"
    assert id_range("abc") is None and id_range("emails") is None and id_range("0" * 33) is None
    assert spec_fragment("to:a@example.com") == {"to": "a@example.com"}
    assert spec_fragment("order:42") == {"order": 42} and spec_fragment('order:"42"') == {"order": "42"}
    assert spec_fragment("customer.id:7") == {"customer": {"id": 7}}
    assert spec_fragment('{"to": "x"}') == {"to": "x"}
    assert spec_fragment("https://hooks.example.com/x") is None and spec_fragment("emails") is None
    assert spec_fragment("[1]") is None


def test_the_search_box_finds_each_kind_of_work(conn, login):
    work = populate(conn)
    conn.execute("SELECT pyscheduler.submit_task(queue => 'invoices', spec => '{\"invoice\": 42}', "
                 "unique_key => 'invoice-42')")
    keyed = conn.execute("SELECT task ->> 'rn' AS rn FROM pyscheduler.list_tasks(queue => 'invoices')"
                         ).fetchone()["rn"]
    worker = conn.execute("SELECT pyscheduler.get_task(rn => %s) ->> 'owner' AS w", (work["running"],)).fetchone()["w"]
    app = make_app(login("pyscheduler_admin")[1])
    with served(app) as base:
        c = Client(base)
        assert 'action="/search"' in c.get("/")[2]  # the box is on every page

        def search(q: str) -> str:
            status, _, page = c.get("/search?q=" + urllib.parse.quote_plus(q))
            assert status == 200, page
            return page

        tail = work["aborted"].replace("-", "")[-10:]  # not a prefix: nothing
        assert "Tasks by id" not in search(tail)
        page = search(work["aborted"][:23])  # a prefix that tells it from its neighbours
        assert work["aborted"] in _section(page, "Tasks by id") and work["ready"] not in _section(page, "Tasks by id")
        assert work["aborted"] in _section(search(work["aborted"]), "Tasks by id")
        found = _section(search("to:user1@example.com"), "Tasks by spec")
        assert work["retrying"] in found and work["running"] not in found
        assert keyed in _section(search("invoice:42"), "Tasks by spec")
        assert keyed in _section(search("invoice-42"), "Tasks by unique key")
        assert "emails" in _section(search("emails"), "Queues")
        assert work["running"] in _section(search(worker), "Tasks held by worker")
        assert "partner-hook" in _section(search("partner"), "Schedules by name")
        found = _section(search("https://hooks.example.com/"), "Schedules by target")
        assert "partner-hook" in found and "billing-report" not in found
        assert re.search(r"order 233\s+order_sms\s+pending", _section(search("233"), "Checks by entity key"))
        assert re.search(r"order 234\s+order_sms\s+deleted", _section(search("234"), "Checks by entity key"))
        assert re.search(r"order-1\s+waiting", _section(search("order-1"), "Delay messages by id"))
        page = search("nothing-like-this")
        assert "nothing found for" in text_of(page) and "<h2>" not in page.split('id="results"')[1]
        assert search("a\u202eb%_\\") and search("x" * 3000)  # what no kind takes finds nothing, no error
    app.close()
    # the monitor: ids and names find metadata; a spec fragment or key (contents) finds nothing of others
    app = make_app(login("pyscheduler_monitor")[1])
    with served(app) as base:
        c = Client(base)
        assert work["aborted"] in _section(c.get("/search?q=" + work["aborted"][:23])[2], "Tasks by id")
        assert "Tasks by spec (" not in c.get("/search?q=to:user1@example.com")[2]
        assert "Tasks by unique key (" not in c.get("/search?q=invoice-42")[2]
        assert "Schedules by target (" not in c.get("/search?q=https://hooks.example.com/")[2]
        assert "Schedules by name (" in c.get("/search?q=partner")[2]
    app.close()


def test_each_search_reads_an_index(conn):
    """At 20,000 tasks, 2,000 schedules and checks under 50 entity names: each reads its index
    and scans no table (task_family too: the task page's children)."""
    conn.execute("SELECT pyscheduler.submit_tasks(queue => 'q' || (i % 5), specs => (SELECT jsonb_agg("
                 "jsonb_build_object('to', 'user' || j || '@example.com', 'n', j)) FROM generate_series(1, 1000) j), "
                 "unique_keys => (SELECT array_agg('k-' || i || '-' || j) FROM generate_series(1, 1000) j)) "
                 "FROM generate_series(1, 20) i")
    conn.execute("SELECT pyscheduler.create_schedule(name => 's-' || i, every => '1 hour', target => 'topic-' || i) "
                 "FROM generate_series(1, 2000) i")
    conn.execute("SELECT pyscheduler.add_check(entity_name => 'e' || (i % 50), entity_key => i::text, job => 'j', "
                 "kind => 'python', check_after => '1 hour') FROM generate_series(1, 2000) i")
    conn.execute("SELECT pyscheduler.delete_checks(entity_name => 'e' || (i % 50), entity_key => i::text) "
                 "FROM generate_series(1, 2000, 2) i")  # the odd keys' checks end: their history
    conn.execute("SELECT pyscheduler.enqueue_messages(ids => %s, deadlines => %s)",
                 ([f"m-{i}" for i in range(1, 2001)], [datetime.now(timezone.utc) + timedelta(hours=1)] * 2000))
    parent = conn.execute("SELECT pyscheduler.submit_task(queue => 'flow', spec => '{}') AS t").fetchone()["t"]["rn"]
    conn.execute("SELECT pyscheduler.submit_tasks(queue => 'flow', specs => '[{}, {}, {}]', "
                 "after => ARRAY[%s]::uuid[])", (parent,))
    conn.execute("ANALYZE")
    rn = conn.execute("SELECT task ->> 'rn' AS rn FROM pyscheduler.list_tasks(max_tasks => 1)").fetchone()["rn"]
    lo, hi = id_range(rn[:13])
    cases = {  # index: (table, the call, its parameters)
        "tasks_pkey": ("tasks", "SELECT * FROM pyscheduler.find_tasks(rn_from => %s, rn_to => %s)", (lo, hi)),
        "tasks_spec_idx": ("tasks", "SELECT * FROM pyscheduler.find_tasks(spec => '{\"to\": \"user7@example.com\"}')",
                           None),
        "tasks_unique_key_idx": ("tasks", "SELECT * FROM pyscheduler.find_tasks(unique_key => 'k-3-7')", None),
        "schedules_target_pattern_idx": ("schedules",
                                         "SELECT * FROM pyscheduler.find_schedules(target_prefix => 'topic-12')", None),
        "checks_entity_job_key": ("checks", "SELECT * FROM pyscheduler.find_checks(entity_key => '78')", None),
        "check_history_entity_idx": ("check_history", "SELECT * FROM pyscheduler.find_checks(entity_key => '77')",
                                     None),
        "delay_messages_pkey": ("delay_messages", "SELECT * FROM pyscheduler.find_message(id => 'm-7')", None),
        "tasks_after_idx": ("tasks", "SELECT * FROM pyscheduler.task_family(rn => %s)", (parent,)),
    }
    for index, (table, sql, params) in cases.items():
        _, r = reads(conn, sql, params, tables=(table,))
        assert r.scans[index] >= 1 and r.seq_scans(table) == 0, (index, r)
    assert len(conn.execute(cases["tasks_spec_idx"][1]).fetchall()) == 20
    assert [(r["entity_name"], r["state"]) for r in conn.execute(cases["checks_entity_job_key"][1])] == [
        ("e28", "pending")]
    assert [(r["entity_name"], r["state"]) for r in conn.execute(
        "SELECT * FROM pyscheduler.find_checks(entity_key => '77')")] == [("e27", "deleted")]
