"""``--shard K/N`` divides the selected tests into N parts, whole files at a time, that
together run each test once (tests/_shards.py)."""

from __future__ import annotations

import pytest
from tests._shards import parts

pytestmark = pytest.mark.timeout(60)

FILES = {
    "test_big": "\n".join(f"def test_{i}():\n    pass\n" for i in range(6)),
    "test_middle": "\n".join(f"def test_{i}():\n    pass\n" for i in range(4)),
    "test_small": "def test_one():\n    pass\n\ndef test_two():\n    pass\n",
    "test_tiny": "def test_alone():\n    pass\n",
}


def test_files_go_whole_to_the_part_with_the_fewest_tests() -> None:
    sizes = {"a.py": 6, "b.py": 4, "c.py": 2, "d.py": 1}

    assert parts(sizes, 2) == [["a.py", "d.py"], ["b.py", "c.py"]]
    assert parts(sizes, 3) == [["a.py"], ["b.py"], ["c.py", "d.py"]]
    assert parts(sizes, 1) == [["a.py", "b.py", "c.py", "d.py"]]


def test_the_parts_run_every_test_once_between_them(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(**FILES)

    everything = pytester.runpytest_inprocess("-p", "tests._shards", "-v")
    ran: list[str] = []
    for shard in ("1/2", "2/2"):
        result = pytester.runpytest_inprocess("-p", "tests._shards", "--shard", shard, "-v")
        ran += _passed(result)

    assert len(ran) == len(set(ran)) == 13
    assert sorted(ran) == sorted(_passed(everything))


def _passed(result: pytest.RunResult) -> list[str]:
    return [
        line.split(" ")[0] for line in result.outlines if line.endswith("]") and " PASSED" in line
    ]


def test_a_shard_keeps_whole_files(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(**FILES)

    result = pytester.runpytest_inprocess("-p", "tests._shards", "--shard", "1/2", "-v")

    result.assert_outcomes(passed=7, deselected=6)
    result.stdout.fnmatch_lines(["*test_big.py::test_0 PASSED*", "*test_tiny.py::test_alone*"])
    result.stdout.no_fnmatch_line("*test_middle.py*PASSED*")


@pytest.mark.parametrize("value", ["2", "0/2", "3/2", "a/b"])
def test_a_malformed_shard_is_refused(pytester: pytest.Pytester, value: str) -> None:
    pytester.makepyfile(test_one="def test_one():\n    pass\n")

    result = pytester.runpytest_inprocess("-p", "tests._shards", "--shard", value)

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--shard*"])
