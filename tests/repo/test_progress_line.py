"""The test run says what it is doing while a test runs long (tests/_progress.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

LONG_TEST = """
from tests._progress import BEAT


def test_quick():
    pass


def test_long():
    BEAT.clear()
    # Waits for the plugin's line rather than for a time: it ends once one is written.
    assert BEAT.wait(10), "no progress line while this test ran"
"""


def test_a_test_that_runs_long_gets_a_progress_line(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_long=LONG_TEST)

    result = pytester.runpytest_inprocess("-p", "tests._progress", "--progress-every", "0.2")

    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        ["[[]progress[]] 1/2 tests done, * s in; running test_long.py::test_long (* s)"]
    )


def test_the_progress_line_shows_while_the_run_captures_a_tests_output(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a run of its own, pytest captures standard output at its file descriptor while
    a test runs: a line written there would show only with a failing test's output."""
    root = str(Path(__file__).resolve().parents[2])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    pytester.makepyfile(test_long=LONG_TEST)

    result = pytester.runpytest_subprocess(
        "-p", "tests._progress", "--progress-every", "0.2", "-p", "no:cacheprovider"
    )

    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        ["[[]progress[]] 1/2 tests done, * s in; running test_long.py::test_long (* s)"]
    )


def test_no_progress_line_when_turned_off(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_quick="def test_quick():\n    pass\n")

    result = pytester.runpytest_inprocess("-p", "tests._progress", "--progress-every", "0")

    result.assert_outcomes(passed=1)
    assert not [line for line in result.outlines if line.startswith("[progress]")]
