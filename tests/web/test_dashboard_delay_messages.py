"""The delay queue's waiting messages on the dashboard (issue 30): listed soonest first a page at
a time (waiting_messages, keyset by deadline and id, read through delay_messages_waiting_idx),
one looked up by id, one cancelled behind the confirmation."""

from __future__ import annotations

import html
import re
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from pyscheduler.dashboard import make_app
from tests.support.dashboard import Client, served, text_of
from tests.support.reads import reads


def _enqueue(conn, ids: list[str], deadlines: list[datetime]) -> None:
    conn.execute("SELECT pyscheduler.enqueue_messages(ids => %s, deadlines => %s, vals => %s)",
                 (ids, deadlines, [b"x" * (i % 7) for i in range(len(ids))]))


def test_waiting_messages_page_by_deadline_and_id_through_the_waiting_index(conn):
    now = datetime.now(timezone.utc)
    # 120 messages, 3 to a deadline (ties are paged by id); one claimed (ready): never listed
    _enqueue(conn, [f"m-{i:03d}" for i in range(120)], [now + timedelta(minutes=10 + i // 3) for i in range(120)])
    _enqueue(conn, ["soon"], [now - timedelta(seconds=1)])
    conn.execute("SELECT * FROM pyscheduler.ready_and_claim(node => gen_random_uuid(), max_count => 1)")
    seen, after = [], (None, None)
    while True:
        rows = conn.execute("SELECT * FROM pyscheduler.waiting_messages(after_deadline => %s, after_id => %s, "
                            "max_messages => 50)", after).fetchall()
        seen += rows
        if len(rows) < 50:
            break
        after = (rows[-1]["deadline"], rows[-1]["id"])
    assert [r["id"] for r in seen] == [f"m-{i:03d}" for i in range(120)]
    assert seen[5]["value_bytes"] == 5 and seen[0]["headers"] == 0
    conn.execute("ANALYZE pyscheduler.delay_messages")
    _, r = reads(conn, "SELECT * FROM pyscheduler.waiting_messages(after_deadline => %s, after_id => %s, "
                       "max_messages => 10)", (seen[59]["deadline"], seen[59]["id"]), tables=("delay_messages",))
    assert r.scans["delay_messages_waiting_idx"] >= 1 and r.seq_scans("delay_messages") == 0, r
    # the page, and the ties of its first and last deadline (the sort by id finishes a deadline's group)
    assert r.entries("delay_messages_waiting_idx") <= 10 + 2 * 3, r
    for bad in ("max_messages => 1001", "after_id => 'm-001'"):
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(f"SELECT * FROM pyscheduler.waiting_messages({bad})")
        assert refused.value.sqlstate == "PS105"


def test_the_delay_page_lists_looks_up_and_cancels_a_waiting_message(conn, login):
    now = datetime.now(timezone.utc)
    _enqueue(conn, [f"order-{i:02d}" for i in range(60)], [now + timedelta(minutes=60 - i) for i in range(60)])
    app = make_app(login("pyscheduler_monitor")[1], allow_actions=True, action_dsn=login("pyscheduler_admin")[1])
    with served(app) as base:
        c = Client(base)
        assert 'href="/delay/messages"' in c.get("/delay")[2]
        status, _, page = c.get("/delay/messages")
        assert status == 200, page
        ids = re.findall(r'<td class="id">([^<]+)</td>', page)
        assert ids == [f"order-{i:02d}" for i in range(59, 9, -1)]  # soonest first: 50 to a page
        nxt = html.unescape(re.search(r'<a href="([^"]+)" rel="next">', page)[1])
        page = c.get(nxt)[2]
        assert re.findall(r'<td class="id">([^<]+)</td>', page) == [f"order-{i:02d}" for i in range(9, -1, -1)]
        assert 'rel="next"' not in page
        # look one up by id; one that is not stored says so
        page = c.get("/delay/messages?id=order-07")[2]
        assert re.findall(r'<td class="id">([^<]+)</td>', page) == ["order-07"] and "waiting" in text_of(page)
        assert "no stored message nope" in text_of(c.get("/delay/messages?id=nope")[2])
        assert c.get("/delay/messages?id=" + "x" * 300)[0] == 200  # not an id a message may have: none
        # cancel it: the confirmation, then it is gone from the list
        href = html.unescape(re.search(r'<a class="act danger" href="(/confirm/cancel_message\?[^"]+)"', page)[1])
        page = c.get(href)[2]
        assert "Cancel delayed message order-07" in text_of(page)
        fields = {html.unescape(n): html.unescape(v)
                  for n, v in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page)}
        status, headers, _ = c.request("/actions/cancel_message", fields, {"Origin": base})
        assert status == 303 and headers["Location"].startswith("/delay/messages?id=order-07&flash=")
        page = c.get(headers["Location"])[2]
        assert "done: Cancel delayed message order-07" in text_of(page)
        assert "no stored message order-07" in text_of(page)
        assert "order-07" not in re.findall(r'<td class="id">([^<]+)</td>', c.get(nxt)[2])
    app.close()
