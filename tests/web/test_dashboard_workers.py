"""The workers page and the overview's no-worker warning (issue 30): registered workers with
what each holds and when it was last seen; a queue with ready tasks and no worker seen for a
minute is flagged, with how long."""

from __future__ import annotations

import re
import threading

from pyscheduler.dashboard import make_app
from pyscheduler.tasks import Worker
from tests.support.dashboard import Client, served, text_of


def test_the_workers_page_and_the_no_worker_warning(conn, dsn, login):
    conn.execute("SELECT pyscheduler.submit_tasks(queue => 'invoices', specs => '[{}, {}, {}]')")
    conn.execute("SELECT pyscheduler.submit_task(queue => 'served', spec => '{}')")
    gone = conn.execute("SELECT pyscheduler.register_worker() AS w").fetchone()["w"]
    conn.execute("SELECT pyscheduler.submit_task(queue => 'abandoned', spec => '{}')")
    conn.execute("SELECT pyscheduler.worker_seen(worker => %s, queue => 'abandoned')", (gone,))
    conn.execute("UPDATE pyscheduler._task_workers SET seen_at = now() - interval '8 minutes'")
    conn.execute("SELECT pyscheduler.submit_task(queue => 'stopped', spec => '{}')")
    conn.execute("SELECT pyscheduler.pause_queue(queue => 'stopped')")
    hold = threading.Event()
    running = Worker(dsn, "served", lambda ctx: hold.wait(10), poll_interval=0.2).start()
    app = make_app(login("pyscheduler_monitor")[1])
    try:
        running.wait_idle()
        with served(app) as base:
            c = Client(base)
            page = c.get("/workers")[2]
            row = text_of(re.search(r"<tr>\s*<td><a [^>]*>%s</a></td>.*?</tr>" % running.worker.worker_id, page,
                                    re.S).group(0))
            assert "served" in row and re.search(r"served\s+1\s", row), row  # it holds the task
            warning = " ".join(text_of(page.split('id="no-worker" role="status">')[1].split("</div></div>")[0]).split())
            assert re.search(r"invoices : 3 ready, oldest [\d.]+ (ms|s), no worker seen", warning), warning
            assert re.search(r"abandoned : 1 ready, oldest [\d.]+ (ms|s), no worker for 8 min", warning), warning
            assert "served" not in warning and "stopped" not in warning  # a worker, a pause
            overview = c.get("/")[2].split('id="no-worker" role="status">')[1].split("</div></div>")[0]
            assert re.sub(r"oldest [\d.]+ (ms|s)", "", " ".join(text_of(overview).split())) == re.sub(
                r"oldest [\d.]+ (ms|s)", "", warning)
            assert 'href="/workers"' in c.get("/")[2]
    finally:
        hold.set()
        running.stop()
        app.close()
