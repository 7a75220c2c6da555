"""Measurements and the markdown table they end up in.

One row per measured quantity, one column per library, so a reader compares libraries
across a row; the last column gives pgwork's ratio to the best peer on that row (>1 means
pgwork is better, whichever way "better" points for the row's unit).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bench._env import Environment

__all__ = ["LIBRARIES", "Measurement", "render_markdown"]

# Column order of the table.
LIBRARIES = ("pgwork", "oban", "pgqueuer", "procrastinate")
TITLES = {
    "pgwork": "pgwork",
    "oban": "oban-py",
    "pgqueuer": "PgQueuer",
    "procrastinate": "procrastinate",
}


@dataclass(frozen=True)
class Measurement:
    """One number: ``row`` names what was measured (shared by all libraries)."""

    row: str
    library: str
    value: float
    unit: str
    higher_is_better: bool = True
    note: str = ""

    def cell(self) -> str:
        if self.value != self.value:  # NaN: measured nothing
            return "n/a"
        if self.unit in ("ms",):
            text = f"{self.value:,.1f}"
        elif self.value >= 100:
            text = f"{self.value:,.0f}"
        else:
            text = f"{self.value:,.1f}"
        return f"{text} {self.unit}"


def render_markdown(
    env: Environment,
    measurements: Sequence[Measurement],
    *,
    failures: Sequence[str] = (),
) -> str:
    libraries = [lib for lib in LIBRARIES if any(m.library == lib for m in measurements)]
    rows: list[str] = []
    for m in measurements:
        if m.row not in rows:
            rows.append(m.row)
    by_key = {(m.row, m.library): m for m in measurements}
    peers = [lib for lib in libraries if lib != "pgwork"]
    header = ["workload", *(TITLES[lib] for lib in libraries)]
    if peers:
        header.append("pgwork vs best peer")
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---", *("---:" for _ in header[1:])]) + "|",
    ]
    for row in rows:
        cells = [row]
        for lib in libraries:
            found = by_key.get((row, lib))
            cells.append(found.cell() if found else "")
        if peers:
            cells.append(_ratio(by_key.get((row, "pgwork")), [by_key.get((row, p)) for p in peers]))
        lines.append("| " + " | ".join(cells) + " |")
    notes = [f"- {m.library}, {m.row}: {m.note}" for m in measurements if m.note]
    out = ["## pgwork benchmark", "", *env.lines(), "", *lines]
    if notes:
        out += ["", "Notes:", *notes]
    if failures:
        out += ["", "Did not run:", *(f"- {f}" for f in failures)]
    return "\n".join(out) + "\n"


def _ratio(ours: Measurement | None, theirs: list[Measurement | None]) -> str:
    peers = [m for m in theirs if m is not None and m.value == m.value and m.value > 0]
    if ours is None or not peers or not ours.value > 0:
        return ""
    if ours.higher_is_better:
        best = max(peers, key=lambda m: m.value)
        ratio = ours.value / best.value
    else:
        best = min(peers, key=lambda m: m.value)
        ratio = best.value / ours.value
    return f"{ratio:.2f}x ({TITLES[best.library]})"
