"""The end-of-run table of fault scenarios says which rows are controls: a scenario that
ran a deliberately broken build shows losses and duplicates on a passing run, and a
reader must not take them for the library's."""

from __future__ import annotations

import pytest
from tests.faults._fleet import (
    BROKEN_ENV,
    Options,
    WorkerProcess,
    broken_builds_started,
    forget_started_builds,
)
from tests.faults._oracle import CONTROL, Figures, summary_lines

pytestmark = pytest.mark.timeout(30)


def table_rows(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("| ") and " --- " not in line]


def test_rows_of_broken_builds_are_marked_and_explained() -> None:
    shipped = Figures("SIGKILL a worker", jobs=60, completed=60)
    control = Figures("SIGKILL a worker", jobs=60, completed=54, lost=6, broken=["no-reap"])
    control.recovery_s = [float("inf")]

    lines = summary_lines([shipped, control], "quick")

    header, *rows = table_rows(lines)
    assert rows[0].startswith("| SIGKILL a worker |")
    assert rows[1].startswith(f"| {CONTROL} (no-reap) SIGKILL a worker |")
    assert [row.count("|") for row in rows] == [header.count("|")] * 2  # same columns
    legend = "\n".join(lines[: lines.index(header)])
    assert f"Rows marked {CONTROL} ran a deliberately broken build" in legend
    assert "'inf'" in legend
    assert any(
        line.startswith("2 scenario(s) at the quick tier, 1 of them CONTROL") for line in lines
    )


def test_the_broken_builds_a_scenario_started_are_recorded() -> None:
    """The ``report`` fixture marks a scenario with the builds its worker processes
    ran, not by its name: some controls share their scenario's name with the correct
    run."""
    unreachable = "postgresql://nobody@127.0.0.1:1/nowhere"
    forget_started_builds()  # what the ``report`` fixture does before each scenario
    WorkerProcess(unreachable, "w", Options(env={BROKEN_ENV: "no-reap"})).close()
    WorkerProcess(unreachable, "v", Options()).close()

    assert broken_builds_started() == ["no-reap"]
    forget_started_builds()
    assert broken_builds_started() == []
