"""Under CI=true a skip not listed in tests/_skips.py fails the run; a listed one does not."""

from __future__ import annotations

import pytest

SKIPPING = """
import pytest

def test_needs_a_browser():
    pytest.skip("browser unavailable: no Chromium at /usr/bin/chromium")

def test_needs_postgres_17():
    pytest.skip("one round trip needs PostgreSQL 17")
"""

LISTED_ONLY = """
import pytest

@pytest.mark.xfail(strict=True, reason="a known bug")
def test_known_bug():
    assert False

def test_needs_postgres_17():
    pytest.skip("one round trip needs PostgreSQL 17")
"""


MODULE_SKIPPED = """
import pytest

pytest.skip("browser unavailable: no Chromium at /usr/bin/chromium", allow_module_level=True)

def test_in_a_browser():
    pass
"""

MODULE_IMPORTORSKIP = """
import pytest

pytest.importorskip("a_module_nobody_installed")

def test_with_it():
    pass
"""

MODULE_LISTED = """
import pytest

pytest.skip("one round trip needs PostgreSQL 17", allow_module_level=True)

def test_pipelined():
    pass
"""


def test_an_unlisted_skip_fails_a_ci_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "true")
    pytester.makepyfile(SKIPPING)
    result = pytester.runpytest("-p", "tests._skips")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*unexpected skips (CI=true)*", "*browser unavailable*"])


def test_a_listed_skip_passes_a_ci_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "true")
    pytester.makepyfile(LISTED_ONLY)
    assert pytester.runpytest("-p", "tests._skips").ret == pytest.ExitCode.OK


def test_skips_outside_ci_only_say_what_to_install(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CI", raising=False)
    pytester.makepyfile(SKIPPING)
    assert pytester.runpytest("-p", "tests._skips").ret == pytest.ExitCode.OK


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        (MODULE_SKIPPED, "*browser unavailable*"),
        (MODULE_IMPORTORSKIP, "*a_module_nobody_installed*"),
    ],
    ids=["skip", "importorskip"],
)
def test_an_unlisted_module_level_skip_fails_a_ci_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, source: str, reason: str
) -> None:
    """A skip at collection hides every test of its file: no test report is skipped,
    the run would pass with nothing of the file run."""
    monkeypatch.setenv("CI", "true")
    pytester.makepyfile(test_module=source, test_other="def test_runs():\n    pass\n")
    result = pytester.runpytest("-p", "tests._skips")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*unexpected skips (CI=true)*", f"test_module.py: {reason}"])


def test_a_listed_module_level_skip_passes_a_ci_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "true")
    pytester.makepyfile(test_module=MODULE_LISTED, test_other="def test_runs():\n    pass\n")
    assert pytester.runpytest("-p", "tests._skips").ret == pytest.ExitCode.OK
