"""docs/sql-api.md cannot drift: every example runs, every public function and view is documented."""

import re
import subprocess

import psycopg
import pytest
import yaml

from tests.support import REPO

SQL_API = REPO / "docs" / "sql-api.md"
FENCE = re.compile(r"^```sql(?:[ \t]+error=(?P<code>\w{5}))?[ \t]*\n(?P<body>.*?)^```", re.S | re.M)


def sections() -> dict[str, list[tuple[str | None, str]]]:
    """'## title' -> [(expected SQLSTATE or None, sql), ...] in page order."""
    out: dict[str, list] = {}
    for chunk in re.split(r"^## ", SQL_API.read_text(), flags=re.M)[1:]:
        title, _, body = chunk.partition("\n")
        blocks = [(m["code"], m["body"]) for m in FENCE.finditer(body)]
        if blocks:
            out[title.strip()] = blocks
    return out


def markdown_blocks(text: str) -> tuple[list[str], list[tuple[int, str]]]:
    """CommonMark's fenced code blocks, as a renderer reads them: a fence is 3+ backticks or
    tildes indented at most 3 spaces, closed by a line of the same character, at least as many,
    and nothing else; an unclosed fence runs to the end of the page. Returns (the level-2
    headings outside fences, [(line, text) of every line starting with '## ' inside one])."""
    headings, swallowed = [], []
    fence: str | None = None
    opened = 0
    for number, line in enumerate(text.split("\n"), 1):
        m = re.match(r"^ {0,3}(`{3,}|~{3,})(.*)$", line)
        if fence is None:
            if m and not (m[1][0] == "`" and "`" in m[2]):
                fence, opened = m[1], number
            elif re.match(r"^ {0,3}## ", line):
                headings.append(line.strip()[3:].strip())
        elif m and m[1][0] == fence[0] and len(m[1]) >= len(fence) and not m[2].strip():
            fence = None
        elif line.startswith("## "):
            swallowed.append((number, f"{line} (in the fence opened on line {opened})"))
    if fence is not None:
        swallowed.append((opened, f"the fence opened on line {opened} is never closed"))
    return headings, swallowed


@pytest.mark.parametrize("page", ["sql-api.md", "operations.md", "python-api.md", "benchmarks.md", "../README.md"])
def test_every_fence_closes_and_every_section_heading_is_a_heading(page):
    headings, swallowed = markdown_blocks((REPO / "docs" / page).read_text())
    assert swallowed == [], page
    if page == "sql-api.md":  # the sections the examples are read from are the page's headings
        assert {"Foundation", "Future checks"} <= set(headings)
        assert set(sections()) <= {h for h in headings}


def test_the_page_has_examples():
    assert "Foundation" in sections()


@pytest.mark.parametrize("section", sorted(sections()))
def test_examples_run(section, dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        for number, (code, body) in enumerate(sections()[section], 1):
            where = f"{section}, example {number}:\n{body}"
            if code is None:
                try:
                    conn.execute(body)
                except psycopg.Error as exc:
                    pytest.fail(f"{where}\nfailed: {exc.sqlstate} {exc}")
            else:
                with pytest.raises(psycopg.Error) as info:
                    conn.execute(body)
                assert info.value.sqlstate == code, where


def test_every_public_function_and_view_is_documented(tx):
    documented = set(re.findall(r"^### `(\w+)", SQL_API.read_text(), flags=re.M))
    public = {r["name"] for r in tx.execute(
        "SELECT proname AS name FROM pg_proc WHERE pronamespace = 'pyscheduler'::regnamespace "
        "UNION SELECT relname FROM pg_class WHERE relnamespace = 'pyscheduler'::regnamespace AND relkind = 'v'"
    ).fetchall() if not r["name"].startswith("_")}
    assert public - documented == set(), "undocumented in docs/sql-api.md"
    assert documented - public == set(), "documented but not in the schema"


def test_every_documented_signature_has_the_catalogs_parameters(tx):
    """Each function's signature line (`pyscheduler.f(name type DEFAULT ..., ...)`) names its input
    parameters with their types as the catalog has them (a domain by its name): a changed
    parameter type (issue 27 B made them domains) cannot drift from the page."""
    catalog = {r["proname"]: r["args"] or [] for r in tx.execute(
        "SELECT p.proname, array_agg(a.name || ' ' || replace(replace(format_type(a.t, NULL), 'pyscheduler.', ''),"
        "                                                     'timestamp with time zone', 'timestamptz')"
        "                            ORDER BY a.ord) FILTER (WHERE a.mode IN ('i', 'b', 'v')) AS args"
        "  FROM pg_proc p, unnest(coalesce(p.proallargtypes, p.proargtypes::oid[]), p.proargnames,"
        "                         coalesce(p.proargmodes, array_fill('i'::\"char\", ARRAY[p.pronargs::int])))"
        "       WITH ORDINALITY AS a(t, name, mode, ord)"
        " WHERE p.pronamespace = 'pyscheduler'::regnamespace AND p.proname !~ '^_' GROUP BY 1").fetchall()}
    documented = {}
    for m in re.finditer(r"^`pyscheduler\.(\w+)\((.*?)\)(?: RETURNS|`)", SQL_API.read_text(), re.M):
        params = [re.sub(r"^(INOUT|IN|VARIADIC) | DEFAULT .*$", "", p.strip())
                  for p in re.split(r",(?![^(]*\))", m[2]) if p.strip() and not p.strip().startswith("OUT ")]
        documented[m[1]] = params
    assert set(catalog) <= set(documented), "functions without a signature line"
    assert documented == {f: catalog.get(f, []) for f in documented}  # (no parameters: no row in catalog)


def test_no_public_function_names_a_parameter_with_the_private_prefix(tx):
    """Public functions name their parameters bare (named notation: ``ids => ...``); ``p_`` is
    the private helpers' prefix (issue 28: the schedules daemons' functions had it)."""
    prefixed = [f"{r['proname']}({r['name']})" for r in tx.execute(
        "SELECT p.proname, a.name FROM pg_proc p, unnest(p.proargnames) AS a(name)"
        " WHERE p.pronamespace = 'pyscheduler'::regnamespace AND p.proname !~ '^_' AND a.name ~ '^p_'"
        " ORDER BY 1, 2").fetchall()]
    assert prefixed == []


def test_every_sqlstate_raised_in_sql_is_listed_and_mapped():
    from pyscheduler.errors import CODES

    raised = set()
    for path in (REPO / "sql").glob("*.sql"):
        raised |= set(re.findall(r"ERRCODE\s*=\s*'(PS\d{3})'", path.read_text()))
    page = SQL_API.read_text()
    assert {c for c in raised if f"`{c}`" not in page} == set(), "codes missing from docs/sql-api.md"
    assert raised - set(CODES) == set(), "codes missing from pyscheduler/errors.py"


def test_compose_file_is_valid_and_complete():
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose["services"]
    assert services["postgres"]["image"].startswith("postgres:16")
    assert services["kafka"]["image"].startswith("apache/kafka")
    assert services["redis"]["image"].startswith("redis:7")
    for name in ("postgres", "kafka", "redis"):
        assert "test" in services[name]["healthcheck"], name
    migrate = services["migrate"]
    assert "migrate" in migrate["command"] and migrate["restart"] == "no"
    daemons = services["pyscheduler"]
    assert daemons["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    for name in ("postgres", "kafka", "redis"):
        assert daemons["depends_on"][name]["condition"] == "service_healthy"
    assert "--no-migrate" in daemons["command"]
    # its health check asks /readyz on the port it publishes; the broker (no auto-create) gets every
    # topic the daemons use, a schedule target topic included
    port = daemons["environment"]["PYSCHEDULER_HTTP_PORT"]
    assert f"127.0.0.1:{port}/readyz" in " ".join(daemons["healthcheck"]["test"])
    assert any(p.endswith(f":{port}") for p in daemons["ports"])
    assert compose["services"]["kafka"]["environment"]["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    created = " ".join(services["kafka-topics"]["command"])
    dlq = daemons["environment"]["PYSCHEDULER_DELAY_DLQ_TOPIC"]
    for topic in ("pyscheduler.delay.input", "pyscheduler.delay.output", dlq, "pyscheduler.schedules"):
        assert topic in created, topic


def test_the_readme_psql_session_runs(dsn):
    from pgserver._commands import POSTGRES_BIN_PATH

    readme = (REPO / "README.md").read_text()
    session = FENCE.search(readme)["body"]
    result = subprocess.run([str(POSTGRES_BIN_PATH / "psql"), "-X", "-v", "ON_ERROR_STOP=1", dsn],
                            input=session, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert '"status": "running"' in result.stdout and "worker-" in result.stdout


def test_the_readme_commands_table_names_every_command():
    """Each command of the CLI (`tasks limits`, `delay status`, ...) in README's Commands table, as
    `pyscheduler GROUP COMMAND`, or as COMMAND in its group's row (`tasks submit/get/list`)."""
    import click

    from pyscheduler.cli import main

    readme = (REPO / "README.md").read_text()
    table = readme.split("## Commands", 1)[1].lstrip("\n").split("\n\n", 1)[0]
    rows = {}
    for line in table.splitlines()[2:]:
        command = re.match(r"\| `pyscheduler (\w+)", line)
        if command:
            rows.setdefault(command[1], []).append(line)
    missing = []
    ctx = click.Context(main)
    for name in main.list_commands(ctx):  # the lazy ones (cliroot.LazyGroup) loaded by name
        cmd = main.get_command(ctx, name)
        subs = cmd.list_commands(click.Context(cmd)) if isinstance(cmd, click.Group) else []
        if not subs:
            if name not in rows:
                missing.append(name)
            continue
        text = " ".join(rows.get(name, []))
        for sub in subs:
            if not re.search(rf"(`pyscheduler {name} {sub}`|`{name} {sub}\b|[`/ ]{sub}[`/ ])", text) \
                    and f"`{sub}`" not in text and f"bench {sub}" not in text:
                missing.append(f"{name} {sub}")
    assert not missing, f"README's Commands table does not name: {missing}"
