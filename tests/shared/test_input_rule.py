"""The input rule (docs/sql-api.md, "Input"): every name, label, free text and JSON
payload a public function takes is of a domain (migrations/0031_input_domains.sql), so names
refuse what prints as something else and payloads are bounded in size and nesting below what
every reader loads. The catalog walks prove it for every public function, added ones included:
no text or JSON parameter bypasses the domains, and hostile values of every parameter's type
end in a documented error or a bounded answer, storing nothing a reader cannot load."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone

import orjson
import psycopg
import pytest

from pyscheduler.calls import label_refusal

DEEP = 3000  # issue 27, reproduction 6: a few KB of JSON that stops every Python reader


def deep_array(levels: int) -> str:
    """JSON text nesting `levels` levels: arrays around a 1 (the 1 is the last level)."""
    return "[" * (levels - 1) + "1" + "]" * (levels - 1)


def deep_object(levels: int) -> str:
    return '{"a": ' * (levels - 1) + "1" + "}" * (levels - 1)


def sqlstate(conn, sql: str, params=None) -> str | None:
    """The SQLSTATE the statement fails with (None: it succeeded); rolled back either way."""
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(sql, params)
    except psycopg.Error as exc:
        return exc.sqlstate
    return None


def call(function: str, **args: str) -> str:
    """SELECT * FROM pyscheduler.function(name => %(name)s, ...): every value sent untyped."""
    return f"SELECT * FROM pyscheduler.{function}(" + ", ".join(f"{k} => %({k})s" for k in args) + ")"


# ---------------------------------------------------------------- reproduction 10: spoofing names

HOSTILE_NAMES = {"newline": "q\nx", "bidi": "q\u202ex", "zero-width": "q\u200bx", "leading space": " q",
                 "trailing space": "q ", "no-break space": "q\u00a0"}

# (function, its other arguments); "queue" or "worker" gets the hostile name
QUEUE_CALLS = [
    ("submit_task", {"spec": "{}"}), ("submit_tasks", {"specs": "[{}]"}),
    ("lease_task", {"worker": "w-1"}), ("lease_tasks", {"worker": "w-1"}), ("lease_tasks_lean", {"worker": "w-1"}),
    ("complete_and_lease", {"worker": "w-1"}), ("pause_queue", {}), ("resume_queue", {}),
    ("set_queue_limits", {"running_total": "1"}), ("set_rate_limit", {"starts": "1"}), ("next_task_due", {}),
    ("list_tasks", {}), ("retry_tasks", {}),
]
WORKER_CALLS = [("lease_task", {"queue": "q"}), ("lease_tasks", {"queue": "q"}), ("lease_tasks_lean", {"queue": "q"}),
                ("complete_and_lease", {"queue": "q"})]


@pytest.mark.parametrize("kind", sorted(HOSTILE_NAMES))
def test_queue_names_and_worker_ids_refuse_what_prints_as_another_name(tx, kind):
    """Reproduction 10: "q\\n", "q\\u202e...", "q\\u200b...", " q" were queues and workers of their
    own, spoofing "q" in queue_status, the metrics' labels and the dashboard."""
    name = HOSTILE_NAMES[kind]
    tx.execute(call("submit_task", queue="q", spec="{}"), {"queue": "q", "spec": "{}"})  # something to lease
    codes = {f"{fn}(queue)": sqlstate(tx, call(fn, queue="", **args), {"queue": name, **args})
             for fn, args in QUEUE_CALLS}
    codes |= {f"{fn}(worker)": sqlstate(tx, call(fn, worker="", **args), {"worker": name, **args})
              for fn, args in WORKER_CALLS}
    codes["list_tasks(owner)"] = sqlstate(tx, call("list_tasks", owner=""), {"owner": name})
    codes["submit_workflow(a node's queue)"] = sqlstate(tx, call("submit_workflow", workflow=""), {
        "workflow": json.dumps([{"name": "a", "queue": name, "spec": {}}])})
    assert codes == dict.fromkeys(codes, "PS208")


@pytest.mark.parametrize("function, args, field, code", [
    ("submit_task", {"queue": "q", "spec": "{}"}, "unique_key", "PS213"),
    ("submit_task", {"queue": "q", "spec": "{}"}, "concurrency_key", "PS215"),
    ("pause_queue", {"queue": "q"}, "note", "PS208"),
    ("create_schedule", {"target": "t", "every": "1 hour"}, "name", "PS310"),
    ("pause_schedule", {"name": "s"}, "note", "PS312"),
    ("add_check", {"entity_key": "42", "job": "count", "kind": "python", "check_after": "1 hour"}, "entity_name",
     "PS401"),
    ("add_check", {"entity_name": "order", "job": "count", "kind": "python", "check_after": "1 hour"}, "entity_key",
     "PS401"),
    ("add_check", {"entity_name": "order", "entity_key": "42", "kind": "python", "check_after": "1 hour"}, "job",
     "PS402"),
    ("enqueue_message", {"deadline": "2100-01-01T00:00:00Z"}, "id", "PS101"),
    ("cancel_message", {}, "id", "PS101"),
])
def test_every_name_and_key_refuses_a_bidi_name_with_its_own_code(tx, function, args, field, code):
    assert sqlstate(tx, call(function, **{field: ""}, **args), {field: "a\u202eb", **args}) == code
    assert sqlstate(tx, call(function, **{field: ""}, **args), {field: "a\nb", **args}) == code


@pytest.mark.parametrize("field, keys, code", [
    ("unique_keys", ["a", "b\u200b"], "PS213"), ("concurrency_keys", ["a", " b"], "PS215"),
    ("unique_keys", ["a", None], None),  # NULL: no key
])
def test_a_batch_of_keys_refuses_a_bad_one(tx, field, keys, code):
    sql = f"SELECT * FROM pyscheduler.submit_tasks(queue => 'q', specs => '[{{}}, {{}}]', {field} => %s::text[])"
    assert sqlstate(tx, sql, (keys,)) == code


# ---------------------------------------------------------------- reproduction 6: deep payloads

def leased(conn) -> dict:
    conn.execute("SELECT pyscheduler.submit_task(queue => 'deep', spec => '{}')")
    return conn.execute("SELECT l.rn, l.token FROM pyscheduler.lease_tasks_lean(queue => 'deep', worker => 'w-1') l"
                        ).fetchone()


def test_a_payload_nested_3000_deep_is_refused_with_the_fields_code(tx):
    """Reproduction 6: a spec (result, error args, payload, ...) nested 3,000 deep was accepted (only its
    size was checked) and stopped every Python reader of it (json and orjson raise RecursionError)."""
    deep = deep_object(DEEP)  # an object: an array would be refused as a spec anyway
    lease = leased(tx)
    lease = {"rn": str(lease["rn"]), "token": str(lease["token"])}
    tx.execute(call("create_schedule", name="s", target="t", every="1 hour"),
                 {"name": "s", "target": "t", "every": "1 hour"})
    error = f'{{"code": "boom", "args": {deep}}}'
    cases = {
        "spec": ("submit_task", {"queue": "q", "spec": deep}, "PS206"),
        "specs": ("submit_tasks", {"queue": "q", "specs": f"[{{}}, {deep}]"}, "PS206"),
        "workflow": ("submit_workflow", {"workflow": f'[{{"name": "a", "queue": "q", "spec": {deep}}}]'}, "PS220"),
        "result": ("complete_task", {**lease, "result": deep}, "PS217"),
        "results": ("complete_tasks", {"rns": f"{{{lease['rn']}}}", "tokens": f"{{{lease['token']}}}",
                                       "results": f"[{deep}]"}, "PS217"),
        "result of complete_and_lease": ("complete_and_lease", {**lease, "worker": "w-1", "queue": "deep",
                                                                "result": deep}, "PS217"),
        "error args": ("fail_task", {**lease, "error": error}, "PS207"),
        "errors args": ("abort_task", {**lease, "errors": f"[{error}]"}, "PS207"),
        "fail_tasks errors": ("fail_tasks", {"rns": f"{{{lease['rn']}}}", "tokens": f"{{{lease['token']}}}",
                                             "errors": f"[{error}]"}, "PS207"),
        "schedule payload": ("create_schedule", {"name": "s2", "target": "t", "every": "1 hour", "payload": deep},
                             "PS308"),
        "updated payload": ("update_schedule", {"name": "s", "payload": deep}, "PS308"),
        "check payload": ("add_check", {"entity_name": "order", "entity_key": "42", "job": "count", "kind": "python",
                                        "check_after": "1 hour", "payload": deep}, "PS409"),
        "headers": ("enqueue_message", {"id": "m", "deadline": "2100-01-01T00:00:00Z",
                                        "headers": f'[{{"h": {deep}}}]'}, "PS104"),
    }
    codes = {field: sqlstate(tx, call(fn, **args), args) for field, (fn, args, _) in cases.items()}
    assert codes == {field: code for field, (_, _, code) in cases.items()}
    # nothing was stored, and a message names the field
    with pytest.raises(psycopg.Error, match="spec nests more than 64 levels"):
        tx.execute(call("submit_task", queue="q", spec=deep), {"queue": "q", "spec": deep})
    assert tx.execute("SELECT count(*) AS n FROM pyscheduler.tasks").fetchone()["n"] == 1
    assert tx.execute("SELECT count(*) AS n FROM pyscheduler.checks").fetchone()["n"] == 0


def test_64_levels_are_accepted_alone_and_in_a_batch_and_every_reader_loads_them(tx):
    """The bound: 64 levels (the top value is level 1), one more per level of a batch's wrapping,
    so a spec accepted alone is accepted in a batch; 65 are refused. Read back through the API,
    Python's json and orjson load (and orjson dumps) what was accepted."""
    ok, too_deep = deep_array(64), deep_object(65)  # a spec is an object
    spec = f'{{"s": {deep_array(63)}}}'
    assert sqlstate(tx, call("submit_task", queue="q", spec=""), {"queue": "q", "spec": too_deep}) == "PS206"
    assert sqlstate(tx, call("submit_tasks", queue="q", specs=""), {"queue": "q", "specs": f"[{too_deep}]"}) == "PS206"
    submitted = tx.execute(call("submit_task", queue="q", spec=""), {"queue": "q", "spec": spec}).fetchone()
    rn = submitted["submit_task"]["rn"]
    tx.execute(call("submit_tasks", queue="q", specs=""), {"queue": "q", "specs": f"[{spec}, {spec}]"})
    tx.execute(call("submit_workflow", workflow=""),
                 {"workflow": f'[{{"name": "a", "queue": "q", "spec": {spec}}}]'})
    tx.execute(call("create_schedule", name="s", target="t", every="1 hour", payload=""),
                 {"name": "s", "target": "t", "every": "1 hour", "payload": ok})
    assert tx.execute("SELECT count(*) AS n FROM pyscheduler.tasks").fetchone()["n"] == 4
    task = tx.execute("SELECT pyscheduler.get_task(rn => %s)::text AS t", (rn,)).fetchone()["t"]
    assert orjson.loads(orjson.dumps(json.loads(task))) == orjson.loads(task)
    page = tx.execute("SELECT json_agg(t)::text AS p FROM pyscheduler.list_tasks(queue => 'q') t").fetchone()["p"]
    assert len(json.loads(page)) == 4 and orjson.dumps(orjson.loads(page))


def test_a_compressed_deep_payload_is_walked_not_waved_through(tx):
    """A deep value compresses to far fewer bytes than its nesting costs uncompressed: passed from
    a table (TOAST-compressed), it is not taken for a small payload."""
    # the row is over TOAST's threshold (an uncompressible pad), so its jsonb is compressed
    tx.execute("CREATE TABLE deep_specs (pad text STORAGE PLAIN, v jsonb)")
    tx.execute("INSERT INTO deep_specs SELECT string_agg(md5(g::text), ''), %s::jsonb FROM generate_series(1, 70) g",
                 (f'{{"s": {deep_array(127)}}}',))
    size = tx.execute("SELECT pg_column_size(v) AS s, pg_column_compression(v) AS c FROM deep_specs").fetchone()
    assert size["c"] is not None and size["s"] < 8 * 64  # smaller than any 64-level payload uncompressed
    assert sqlstate(tx, "SELECT pyscheduler.submit_task('q', v) FROM deep_specs") == "PS206"


# ---------------------------------------------------------------- one rule, in SQL and in Python

def test_the_label_rule_is_one_rule_in_sql_and_in_python(tx):
    """_label_ok (inlined into the domains' checks), _label_refusal (their messages) and
    calls.label_refusal (the relay and DelayProducer judge message ids before SQL) agree."""
    specials = ["\t", "\n", "\r", "\x0b", "\x0c", "\x1f", "\x7f", "\x85", "\xa0", "\xad", "\u061c", "\u1680",
                "\u180e", "\u2000", "\u200a", "\u200b", "\u200f", "\u2028", "\u202a", "\u202e", "\u202f",
                "\u205f", "\u2066", "\u2069", "\u3000", "\u3164", "\ufeff", "\ufffa", " ", "é", "東", "-", "😀"]
    values = [""] + [v for c in specials for v in (c + "ab", "a" + c + "b", "ab" + c, c)] + ["x" * 200, "x" * 201]
    rows = tx.execute("SELECT v, pyscheduler._label_refusal(v, 200) AS why, pyscheduler._label_ok(v, 200) AS ok "
                        "FROM unnest(%s::text[]) v", (values,)).fetchall()
    for row in rows:
        assert row["ok"] == (row["why"] is None), row
        # the same values refused (the reason of a control character that is also a space may
        # differ with the database's locale: what PostgreSQL's \s includes)
        assert (label_refusal(row["v"], 200) is None) == row["ok"], row


@pytest.mark.parametrize("audience, function, good, bad, code", [
    ("client", "submit_task", {"queue": "q", "spec": '{"pad": "' + "x" * 600 + '"}'}, {"queue": "q\n"}, "PS208"),
    ("client", "submit_task", {"queue": "q", "spec": "{}"}, {"spec": deep_array(65)}, "PS206"),
    ("worker", "lease_task", {"queue": "q", "worker": "w-1"}, {"worker": "w-1 "}, "PS208"),
    ("relay", "enqueue_message", {"id": "m-1", "deadline": "2100-01-01T00:00:00Z", "headers": '[{"h": "v"}]'},
     {"id": "m\u202e1"}, "PS101"),
    ("scheduler", "resync_progress", {"sync_id": "sync-1"}, {"sync_id": ""}, "PS312"),
    ("checker", "finish_checks", {"ids": "{1}", "errors": "{boom}"}, {"errors": "{" + "x" * 1048577 + "}"}, "PS408"),
    ("monitor", "list_tasks", {"queue": "q"}, {"queue": "\u200bq"}, "PS208"),
])
def test_every_audience_runs_the_checks_with_its_own_rights(login, audience, function, good, bad, code):
    """The domains' checks run as the caller, before the SECURITY DEFINER function: every role
    may run them (roles.sql grants them), so a role gets the field's code, never 42501."""
    _, dsn = login(f"pyscheduler_{audience}")
    with psycopg.connect(dsn, autocommit=True) as c:
        assert sqlstate(c, call(function, **good), good) is None
        assert sqlstate(c, call(function, **{**good, **bad}), {**good, **bad}) == code


# ---------------------------------------------------------------- the bypass walk

NAME_TYPES = ("text", "character varying", "character", "name", "json", "jsonb", "citext")


def bypasses(conn) -> list[tuple[str, str, str]]:
    """(function, parameter, type) of every input parameter of a public function whose values are
    names or payloads (text, json and their arrays) without one of pyscheduler's domains."""
    return [tuple(r.values()) for r in conn.execute(
        "SELECT p.proname, a.name, format_type(a.t, NULL) AS type"
        "  FROM pg_proc p,"
        "       unnest(coalesce(p.proallargtypes, p.proargtypes::oid[]), p.proargnames,"
        "              coalesce(p.proargmodes, array_fill('i'::\"char\", ARRAY[p.pronargs::int]))) AS a(t, name, mode),"
        "       pg_type t LEFT JOIN pg_type e ON e.oid = t.typelem AND t.typcategory = 'A'"
        " WHERE p.pronamespace = 'pyscheduler'::regnamespace AND p.proname !~ '^_' AND a.mode IN ('i', 'b', 'v')"
        "   AND t.oid = a.t AND format_type(coalesce(e.oid, t.oid), NULL) = ANY (%s)"
        " ORDER BY 1, 2", (list(NAME_TYPES),)).fetchall()]


def test_work_named_before_the_rule_stays_reachable_by_its_name_and_no_new_one_is_made(tx):
    """A schedule or check whose name the rule refuses now (stored before it) is found, paused and
    deleted by that name: the functions that find work take any name of a bounded size; those
    that create it judge the name."""
    bad = "b\u202egnp.exe"
    tx.execute("SELECT pyscheduler.create_schedule(name => 'legacy', target => 't', every => '1 hour')")
    tx.execute("SELECT pyscheduler.add_check(entity_name => 'legacy', entity_key => 'k', job => 'q', kind => 'task', "
                 "check_after => '1 hour')")
    tx.execute("UPDATE pyscheduler.schedules SET name = %s WHERE name = 'legacy'", (bad,))
    tx.execute("UPDATE pyscheduler.checks SET entity_name = %s WHERE entity_name = 'legacy'", (bad,))
    assert tx.execute("SELECT pyscheduler.get_schedule(name => %s) ->> 'name' AS n", (bad,)).fetchone()["n"] == bad
    tx.execute("SELECT pyscheduler.pause_schedule(name => %s)", (bad,))
    listed = tx.execute("SELECT count(*) AS n FROM pyscheduler.list_checks(entity_name => %s)", (bad,)).fetchone()
    assert listed["n"] == 1
    assert sqlstate(tx, "SELECT pyscheduler.create_schedule(name => %s, target => 't', every => '1 hour')",
                    (bad + "2",)) == "PS310"
    assert sqlstate(tx, "SELECT * FROM pyscheduler.add_check(entity_name => %s, entity_key => 'k', job => 'q', "
                          "kind => 'task', check_after => '1 hour')", (bad,)) == "PS401"
    tx.execute("SELECT pyscheduler.delete_schedule(name => %s)", (bad,))
    tx.execute("SELECT * FROM pyscheduler.delete_checks(entity_name => %s, entity_key => 'k')", (bad,))
    assert tx.execute("SELECT count(*) AS n FROM pyscheduler.schedules").fetchone()["n"] == 0
    assert sqlstate(tx, "SELECT pyscheduler.get_schedule(name => repeat('x', 801))") == "PS310"  # still bounded


def test_no_public_function_takes_a_name_or_payload_past_the_domains(tx):
    assert bypasses(tx) == []


def test_a_new_public_function_with_a_plain_text_parameter_fails_the_walk(tx):
    """The walk reads the catalog, not a list: a function added later is in it."""
    with tx.transaction(force_rollback=True):
        tx.execute("CREATE FUNCTION pyscheduler.throwaway(queue text, payload jsonb[], ok pyscheduler.queue_name)"
                     " RETURNS void LANGUAGE sql AS ''")
        assert bypasses(tx) == [("throwaway", "payload", "jsonb[]"), ("throwaway", "queue", "text")]


def test_no_function_call_can_be_read_as_a_cast_to_a_domain(tx):
    """PostgreSQL reads f(x) as a cast when f is also a type's name and no f takes x's type
    exactly: a domain named d brings the array type _d, which shadowed _tz_name(text) when
    called with a domain value. No pyscheduler function of one argument may share a type's name."""
    assert tx.execute(
        "SELECT p.proname FROM pg_proc p JOIN pg_type t ON t.typname = p.proname AND t.typnamespace = p.pronamespace"
        " WHERE p.pronamespace = 'pyscheduler'::regnamespace AND p.pronargs = 1").fetchall() == []


# ---------------------------------------------------------------- the poison walk

UUID0 = "'00000000-0000-0000-0000-000000000000'::uuid"
BIG_ARRAY = 1_000_000

# hostile values by (base) type, as SQL expressions built by the server
HOSTILE = {
    "text": ["'a' || chr(8238) || 'b'", "'a' || chr(10) || 'b'", "repeat('x', 1000000)", "''"],
    "name": ["('a' || chr(8238) || 'b')::name", "('a' || chr(10) || 'b')::name", "repeat('x', 100)::name", "''::name"],
    "jsonb": ["(repeat('[', 10000) || repeat(']', 10000))::jsonb", "to_jsonb(repeat('x', 10000000))",
              "'[1, 2]'::jsonb", "'\"s\"'::jsonb", "'42'::jsonb"],
    "interval": ["'infinity'::interval", "'-infinity'::interval", "'-1 day'::interval", "'1000000 years'::interval"],
    "timestamp with time zone": ["'infinity'::timestamptz", "'-infinity'::timestamptz",
                                 "'0001-01-01 00:00:00+00'::timestamptz", "'10000-01-01 00:00:00+00'::timestamptz"],
    "integer": ["-1", "2147483647", "(-2147483648)::integer"],
    "bigint": ["-1::bigint", "9223372036854775807", "(-9223372036854775808)::bigint"],
    "double precision": ["'NaN'::float8", "'Infinity'::float8", "'-Infinity'::float8"],
    "uuid": [UUID0, "gen_random_uuid()"],
    "boolean": [],
    "bytea": [],
    "cidr": ["'0.0.0.0/0'::cidr"],
}
# one valid element per array element type (10^6 of it)
ELEMENT = {"text": "'x'::text", "jsonb": "'{}'::jsonb", "interval": "'1 second'::interval",
           "timestamp with time zone": "now() + interval '1 hour'", "integer": "1", "bigint": "1::bigint",
           "double precision": "0.5::float8", "uuid": "gen_random_uuid()", "boolean": "false",
           "bytea": "'\\x00'::bytea", "cidr": "'10.0.0.0/8'::cidr"}
# valid values of the parameters a call needs, by (name, base type); {rn}, {token}, {check} and
# {schedule} are objects the walk makes first (walk_objects), so calls reach their writes
VALID = {
    ("allow", "cidr[]"): "ARRAY['10.0.0.0/8']::cidr[]", ("owner", "name"): "'pyscheduler_client'",
    ("deadline", "timestamp with time zone"): "now() + interval '1 hour'",
    ("deadlines", "timestamp with time zone[]"): "ARRAY[now() + interval '1 hour']",
    ("entity_key", "text"): "'42'", ("entity_name", "text"): "'order'", ("target_prefix", "text"): "'walk-'",
    ("error", "jsonb"): "'{{\"code\": \"boom\"}}'", ("errors", "jsonb"): "'[{{\"code\": \"boom\"}}]'",
    ("expr", "text"): "'*/5 * * * *'",
    ("id", "bigint"): "{check}", ("id", "text"): "'walk-1'",
    ("ids", "bigint[]"): "ARRAY[{check}::bigint]", ("ids", "text[]"): "ARRAY['walk-1']",
    ("job", "text"): "'count'", ("name", "text"): "'walk'", ("node", "uuid"): "gen_random_uuid()",
    ("keep", "boolean"): "false",
    ("attempts", "integer[]"): "ARRAY[1]", ("errors", "text[]"): "ARRAY['boom']",
    ("expected", "timestamp with time zone[]"): "ARRAY[now()]",
    ("outcomes", "text[]"): "ARRAY['failed']", ("owner", "text"): "'walker'",
    ("shard_count", "integer"): "1", ("shards", "integer[]"): "ARRAY[0]", ("sync_id", "text"): "'walk-sync'",
    ("queue", "text"): "'walk'", ("rn", "uuid"): "'{rn}'::uuid", ("rns", "uuid[]"): "ARRAY['{rn}'::uuid]",
    ("slot", "timestamp with time zone"): "pyscheduler.slot_round(now() - interval '1 hour')",
    ("spec", "jsonb"): "'{{}}'", ("specs", "jsonb"): "'[{{}}]'", ("starts", "integer"): "10",
    ("token", "uuid"): "'{token}'::uuid", ("tokens", "uuid[]"): "ARRAY['{token}'::uuid]",
    ("ts", "timestamp with time zone"): "now()", ("worker", "text"): "'walker'",
    ("workflow", "jsonb"): "'[{{\"name\": \"a\", \"queue\": \"walk\", \"spec\": {{}}}}]'",
    ("step", "text"): "'walk-step'", ("payload", "jsonb"): "'{{}}'",
}
# optional arguments a valid call also needs (exactly one of every and cron, a target, ...), and
# values of a function's own (the schedules' ids, where ids are a check's by default)
VALID_CALLS = {
    "create_schedule": {"name": "'walk-2'", "target": "'walk-topic'", "every": "'1 hour'"},
    "add_check": {"entity_key": "'43'", "check_after": "'1 hour'", "kind": "'python'"},
    "upcoming_runs": {"every": "'1 hour'"},
    **{f: {"ids": "ARRAY[{schedule}::bigint]"}
       for f in ("index_entries", "fire_details", "record_executions", "fire_task_schedules", "stop_schedules")},
}


def walk_objects(conn) -> dict:
    """A schedule, a leased task, a pending check and a waiting message for the walk's calls to act on."""
    schedule = conn.execute("SELECT (pyscheduler.create_schedule(name => 'walk', target => 'walk-topic',"
                            " every => '1 hour') ->> 'id')::bigint AS id").fetchone()["id"]
    conn.execute("SELECT pyscheduler.submit_task(queue => 'walk', spec => '{}')")
    lease = conn.execute("SELECT * FROM pyscheduler.lease_tasks_lean(queue => 'walk', worker => 'walker')").fetchone()
    check = conn.execute("SELECT id FROM pyscheduler.add_check(entity_name => 'order', entity_key => '42',"
                         " job => 'count', kind => 'python', check_after => '1 hour')").fetchone()["id"]
    conn.execute("SELECT pyscheduler.enqueue_message(id => 'walk-1', deadline => now() + interval '1 hour')")
    return {"schedule": schedule, "rn": lease["rn"], "token": lease["token"], "check": check}


DOCUMENTED = ("PS", "22", "23")  # and 54000 (a program limit) and 42501: docs/sql-api.md, Conventions A


def parameters(conn) -> dict[str, list[dict]]:
    """Every public function's input parameters in order: name, base type (a domain's base, an array
    of a domain's as base[]), whether it has a default."""
    rows = conn.execute("""
        WITH a AS (
            SELECT p.proname, p.pronargs, p.pronargdefaults, x.name, x.t, x.ord,
                   row_number() OVER (PARTITION BY p.oid ORDER BY x.ord) AS pos
              FROM pg_proc p,
                   unnest(coalesce(p.proallargtypes, p.proargtypes::oid[]), p.proargnames,
                          coalesce(p.proargmodes, array_fill('i'::"char", ARRAY[p.pronargs::int])))
                       WITH ORDINALITY AS x(t, name, mode, ord)
             WHERE p.pronamespace = 'pyscheduler'::regnamespace AND p.proname !~ '^_' AND x.mode IN ('i', 'b', 'v'))
        SELECT a.proname, a.name, a.pos > a.pronargs - a.pronargdefaults AS optional,
               CASE WHEN t.typtype = 'd' THEN format_type(t.typbasetype, NULL)
                    WHEN e.typtype = 'd' THEN format_type(e.typbasetype, NULL) || '[]'
                    ELSE format_type(t.oid, NULL) END AS base
          FROM a JOIN pg_type t ON t.oid = a.t LEFT JOIN pg_type e ON e.oid = t.typelem AND t.typcategory = 'A'
         ORDER BY a.proname, a.ord""").fetchall()
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r["proname"], []).append(r)
    return out


def hostile(base: str) -> list[str]:
    if not base.endswith("[]"):
        return HOSTILE[base]
    elem = base[:-2]
    return ([f"ARRAY[NULL]::{base}", f"array_fill({ELEMENT[elem]}, ARRAY[{BIG_ARRAY}])"]
            + [f"ARRAY[{v}]" for v in HOSTILE[elem]])


# The rules a table no longer checks itself because every value is refused where it enters, by a
# function's domain or check (migration 0054: a CHECK is re-planned by every statement that writes
# the table): the walk checks every row written under them.
ROW_RULES = {
    "tasks": "octet_length(queue) BETWEEN 1 AND 40 AND priority BETWEEN 0 AND 4294967295 AND progress BETWEEN 0 AND 1"
             " AND attempts >= 0 AND coalesce(max_attempts BETWEEN 1 AND 1000, true)",
}


def stored_values(conn, since_xid: int) -> list[str]:
    """What a reader cannot load among the rows written since since_xid (this transaction's):
    every jsonb column through json and orjson, every timestamptz through psycopg, in range; and
    a row outside its table's ROW_RULES."""
    columns = conn.execute(
        "SELECT c.relname, array_agg(a.attname ORDER BY a.attnum) FILTER (WHERE a.atttypid = 'jsonb'::regtype) AS j,"
        "       array_agg(a.attname ORDER BY a.attnum) FILTER (WHERE a.atttypid = 'timestamptz'::regtype) AS t"
        "  FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped"
        " WHERE c.relnamespace = 'pyscheduler'::regnamespace AND c.relkind IN ('r', 'p')"
        " GROUP BY c.relname").fetchall()
    bad = []
    for table in columns:
        exprs = [f'"{c}"::text AS "{c}"' for c in table["j"] or []] + [f'"{c}"' for c in table["t"] or []]
        if not exprs:
            continue
        try:
            rows = conn.execute(f'SELECT {", ".join(exprs)} FROM pyscheduler."{table["relname"]}"'
                                " WHERE xmin::text::bigint >= %s", (since_xid,)).fetchall()
        except psycopg.DataError as exc:  # a timestamptz psycopg cannot load (infinity, year 10000)
            bad.append(f"{table['relname']}: {exc}")
            continue
        for row in rows:
            for c in table["j"] or []:
                try:
                    if row[c] is not None:
                        json.loads(row[c]), orjson.loads(row[c])
                except (RecursionError, ValueError) as exc:
                    bad.append(f"{table['relname']}.{c}: {type(exc).__name__}")
            for c in table["t"] or []:
                at = row[c]
                if at is not None and not datetime(1970, 1, 1, tzinfo=timezone.utc) <= at < datetime(
                        9999, 1, 1, tzinfo=timezone.utc):
                    bad.append(f"{table['relname']}.{c}: {at}")
    for table, rule in ROW_RULES.items():
        n = conn.execute(f"SELECT count(*) AS n FROM pyscheduler.{table} WHERE xmin::text::bigint >= %s"
                         f" AND NOT coalesce({rule}, false)", (since_xid,)).fetchone()["n"]
        if n:
            bad.append(f"{table}: {n} rows outside its rules")
    return bad


def poison_walk(conn, functions: dict[str, list[dict]], timeout: str = "10s") -> tuple[list[str], int]:
    """Call each function with each hostile value of each parameter (the others valid), as the
    admin role with a statement timeout (10 s: 10^6 elements take seconds on a busy machine),
    each call from the same state (a savepoint rolled
    back): (what went wrong, how many calls). Wrong: an error that is not documented (a PS code,
    class 22 or 23, 54000, 42501; a timeout is not), an answer psycopg cannot load, or a stored
    value a reader cannot load."""
    objects = walk_objects(conn)
    failures, calls = [], 0
    with conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL ROLE pyscheduler_admin")
        conn.execute(f"SET LOCAL statement_timeout = '{timeout}'")
        since = conn.execute("SELECT pg_current_xact_id()::text::bigint % 4294967296 AS x").fetchone()["x"]
        for function, params in sorted(functions.items()):
            baseline = {p["name"]: VALID[(p["name"], p["base"])].format(**objects) for p in params if not p["optional"]}
            baseline |= {k: v.format(**objects) for k, v in VALID_CALLS.get(function, {}).items()}
            for p in params:
                for value in hostile(p["base"]):
                    args = {**baseline, p["name"]: value}
                    sql = (f"SELECT * FROM pyscheduler.{function}("
                           + ", ".join(f"{k} => {v}" for k, v in args.items()) + ") LIMIT 1000")
                    calls += 1
                    bad: list[str] = []
                    try:
                        with conn.transaction(force_rollback=True):
                            conn.execute(sql).fetchall()
                            conn.execute("RESET ROLE")  # the tables, as their owner (undone with the savepoint)
                            bad = stored_values(conn, since)
                    except psycopg.Error as exc:
                        code = exc.sqlstate or ""
                        if not (code.startswith(DOCUMENTED) or code in ("54000", "42501")):
                            failures.append(f"{function}({p['name']} => {value[:60]}): {code} {str(exc)[:200]}")
                    if bad:
                        failures.append(f"{function}({p['name']} => {value[:60]}) stored {bad}")
    return failures, calls


def test_poison_walk_every_parameter_of_every_public_function_gets_hostile_values(tx):
    """For each public function (from the catalog) and each parameter, values hostile for its
    type (text: bidi, newline, 1 MB, empty; jsonb: 10,000 deep, 10 MB, an array, a string or a
    number for an object; instants and intervals: infinite, negative, beyond year 9999; numbers:
    negative, huge, NaN; uuids: zero, random; arrays: a NULL element, 10^6 elements, a hostile
    element), the other parameters valid: a documented error or an answer, within 10 s, and
    nothing stored that Python cannot load, nor a row outside ROW_RULES."""
    functions = parameters(tx)
    missing = sorted({(p["name"], p["base"]) for params in functions.values() for p in params
                      if not p["optional"] and (p["name"], p["base"]) not in VALID})
    assert missing == [], f"add a valid value to VALID for these required parameters: {missing}"
    started = time.monotonic()
    failures, calls = poison_walk(tx, functions)
    assert failures == [], "\n".join(failures)
    assert calls > 1000, calls
    print(f"poison walk: {calls} calls in {time.monotonic() - started:.1f} s")


def test_the_poison_walk_fails_a_function_that_stores_poison_or_never_answers(tx):
    """The walk can fail: a public function that stores an instant or a payload readers cannot
    load, a task outside the rules its table no longer checks (ROW_RULES), or that does not answer
    within the time bound, is reported."""
    with tx.transaction(force_rollback=True):
        tx.execute("CREATE TABLE pyscheduler.throwaway_sink (at timestamptz, j jsonb)")
        tx.execute("CREATE FUNCTION pyscheduler.throwaway_store(at timestamptz DEFAULT now(), j jsonb DEFAULT '{}')"
                     " RETURNS void"
                     " LANGUAGE sql SECURITY DEFINER SET search_path = pyscheduler, pg_temp"
                     " AS 'INSERT INTO pyscheduler.throwaway_sink VALUES (at, j)'")
        tx.execute("CREATE FUNCTION pyscheduler.throwaway_sleep(seconds integer DEFAULT 0) RETURNS void"
                     " LANGUAGE sql AS 'SELECT pg_sleep(seconds)'")
        tx.execute("CREATE FUNCTION pyscheduler.throwaway_task(priority bigint DEFAULT 50) RETURNS void"
                     " LANGUAGE sql SECURITY DEFINER SET search_path = pyscheduler, pg_temp"
                     " AS $$INSERT INTO pyscheduler.tasks (rn, queue, spec, priority, status, progress, created,"
                     " updated, errors, history, submitted_by) VALUES (gen_random_uuid(), 'q', '{}', priority,"
                     " 'ready', 0, now(), now(), '[]', '[]', 'x')$$")
        tx.execute("GRANT EXECUTE ON FUNCTION pyscheduler.throwaway_store, pyscheduler.throwaway_sleep,"
                     " pyscheduler.throwaway_task TO pyscheduler_admin")
        walked = {f: params for f, params in parameters(tx).items() if f.startswith("throwaway")}
        failures, _ = poison_walk(tx, walked, timeout="1s")
    text = "\n".join(failures)
    assert "throwaway_store(at => 'infinity'::timestamptz) stored [\"throwaway_sink: timestamp too large" in text
    assert "throwaway_store(at => '0001-01-01 00:00:00+00'::timestamptz) stored ['throwaway_sink.at: 0001" in text
    assert "throwaway_store(j => (repeat('[', 10000)" in text and "throwaway_sink.j: RecursionError" in text
    assert "throwaway_sleep(seconds => 2147483647): 57014" in text
    assert "throwaway_task(priority => -1::bigint) stored ['tasks: 1 rows outside its rules']" in text
    assert "throwaway_task(priority => 9223372036854775807) stored" in text
