"""``--without-controls`` leaves out exactly the control cases (tests/_controls.py)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(60)

CASES = """
import pytest


@pytest.mark.parametrize("build", ["fixed", "control-deaf"])
@pytest.mark.parametrize("mode", ["staged", "atomic"])
def test_modes(mode, build):
    pass


@pytest.mark.parametrize("name", ["FlowControl-acquire", "controlled", "no-controls"])
def test_names_that_only_look_alike(name):
    pass


def test_plain():
    pass
"""


def test_without_controls_runs_every_case_but_the_controls(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_cases=CASES)

    result = pytester.runpytest_inprocess("-p", "tests._controls", "--without-controls", "-v")

    result.assert_outcomes(passed=6, deselected=2)
    result.stdout.no_fnmatch_line("*control-deaf*PASSED*")
    result.stdout.fnmatch_lines(["*[[]atomic-fixed[]] PASSED*", "*FlowControl-acquire*PASSED*"])


def test_the_controls_run_by_default(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_cases=CASES)

    result = pytester.runpytest_inprocess("-p", "tests._controls")

    result.assert_outcomes(passed=8)
