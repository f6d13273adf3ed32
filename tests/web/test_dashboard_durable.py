"""The task page's timeline (its history table) shows a task's durable steps, sleeps and the
events it waits for or received (task_steps), to a reader who sees the task's contents."""

from __future__ import annotations

import re

from pyscheduler.dashboard import make_app
from tests.support.dashboard import Client, served, text_of


def test_the_task_page_shows_steps_sleeps_and_events_on_its_timeline(conn, login):
    task = conn.execute("SELECT pyscheduler.submit_task(queue => 'orders', spec => '{}') AS t").fetchone()["t"]
    leased = conn.execute("SELECT pyscheduler.lease_task(queue => 'orders', worker => 'w') AS t").fetchone()["t"]
    lease = {"rn": leased["rn"], "token": leased["token"]}
    conn.execute("SELECT pyscheduler.record_step(rn => %(rn)s, token => %(token)s, step => 'charge', "
                 "result => '{\"charged\": 10}')", lease)
    conn.execute("SELECT pyscheduler.sleep_task(rn => %(rn)s, token => %(token)s, duration => '0', "
                 "step => 'nap')", lease)
    conn.execute("SELECT pyscheduler.await_event(rn => %(rn)s, token => %(token)s, name => 'shipped')", lease)
    with served(make_app(login("pyscheduler_admin")[1])) as base:
        status, _, page = Client(base).get(f"/tasks/{task['rn']}")
        t = text_of(page)
        assert status == 200, page
        assert re.search(r"Step\s.*charge.*charged", t, re.S) and re.search(r"Sleep\s.*nap", t, re.S), t
        assert re.search(r"AwaitingEvent\s.*shipped", t, re.S), t
        conn.execute("SELECT pyscheduler.emit_event(name => 'shipped', payload => '\"parcel-7\"')")
        t = text_of(Client(base).get(f"/tasks/{task['rn']}")[2])
        assert re.search(r"Event\s.*shipped.*received.*parcel-7", t, re.S) and "AwaitingEvent" not in t, t
