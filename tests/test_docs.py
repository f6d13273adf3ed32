"""docs/sql-api.md cannot drift: every example runs, every public function and view is documented."""

import re
import subprocess

import psycopg
import pytest
import yaml

from conftest import REPO

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


def test_every_public_function_and_view_is_documented(conn):
    documented = set(re.findall(r"^### `(\w+)", SQL_API.read_text(), flags=re.M))
    public = {r["name"] for r in conn.execute(
        "SELECT proname AS name FROM pg_proc WHERE pronamespace = 'pyscheduler'::regnamespace "
        "UNION SELECT relname FROM pg_class WHERE relnamespace = 'pyscheduler'::regnamespace AND relkind = 'v'"
    ).fetchall() if not r["name"].startswith("_")}
    assert public - documented == set(), "undocumented in docs/sql-api.md"
    assert documented - public == set(), "documented but not in the schema"


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


def test_the_readme_psql_session_runs(dsn):
    from pgserver._commands import POSTGRES_BIN_PATH

    readme = (REPO / "README.md").read_text()
    session = FENCE.search(readme)["body"]
    result = subprocess.run([str(POSTGRES_BIN_PATH / "psql"), "-X", "-v", "ON_ERROR_STOP=1", dsn],
                            input=session, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert '"status": "running"' in result.stdout and "worker-" in result.stdout
