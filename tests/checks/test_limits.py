"""The future checks' limits that Python keeps to before a round trip (pyscheduler/checks/sqlapi.py)
are SQL's: with Python's cut bypassed, check_history keeps an error of ERROR_CHARS characters whole
and cuts one of a character more to ERROR_CHARS, so the two cannot drift apart."""

from __future__ import annotations

from pyscheduler.checks import sqlapi as sql
from pyscheduler.checks.handlers import error_text
from pyscheduler.db import Session


def test_check_history_keeps_error_chars_characters_of_an_error_where_python_cuts_it(conn):
    added = [conn.execute("SELECT * FROM pyscheduler._add_check('order', %s, 'alert', 'python', NULL, '0'::interval, "
                          "NULL, NULL, NULL, clock_timestamp())", (key,)).fetchone() for key in ("1", "2")]
    ids, slot = [a["id"] for a in added], added[0]["next_check_at"]
    whole, longer = "é" * sql.ERROR_CHARS, "é" * (sql.ERROR_CHARS + 1)
    assert error_text(whole) == whole and error_text(longer) == whole  # Python's cut
    with conn.transaction():
        taken = conn.execute("SELECT id FROM pyscheduler._take_checks(%s, 0, 1, 10, NULL, %s)", (slot, slot))
        assert sorted(r["id"] for r in taken) == sorted(ids)
        out = Session.borrow(conn).call(sql.FINISH_CHECKS, ids=ids, errors=[whole, longer])  # bypassing it
        assert [r["outcome"] for r in out] == ["error", "error"]
    kept = {r["id"]: r["error"] for r in conn.execute(
        "SELECT id, error FROM pyscheduler.check_history(entity_name => 'order')")}
    assert kept == {ids[0]: whole, ids[1]: whole}
