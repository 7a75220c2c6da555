"""Measurements and the markdown table they end up in.

One row per measured quantity, one column per library, so a reader compares libraries
across a row. Two columns follow: pgwork's ratio to the best peer on that row (>1 means
pgwork is better, whichever way "better" points for the row's unit), and, where the
raw-SQL floor ran, pgwork's figure as a share of that floor: the floor is no peer but
the ceiling every library shares, so it never counts as "best peer". Enqueue rows also
have the floor's insert of pgwork's own rows into pgwork's table, and pgwork's figure
as a share of it: what pgwork's code costs over the rows it writes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

from bench._env import Environment
from bench._plan import ROW_DRAIN_BEST, ROW_DRAIN_BEST_ATOMIC

__all__ = ["LIBRARIES", "Cost", "Measurement", "render_json", "render_markdown"]

# Rows whose pgwork figure is compared with the peers' (and the floor's) of another row:
# the atomic drain's target is the peers' at-least-once drain.
COMPARED_WITH = {ROW_DRAIN_BEST_ATOMIC: ROW_DRAIN_BEST}

# Column order of the table; the floors come last.
FLOOR = "raw"
ROWS = "raw-rows"
LIBRARIES = (
    "pgwork",
    "oban",
    "pgqueuer-asyncpg",
    "pgqueuer-psycopg",
    "procrastinate",
    FLOOR,
    ROWS,
)
TITLES = {
    "pgwork": "pgwork",
    "oban": "oban-py",
    "pgqueuer-asyncpg": "PgQueuer (asyncpg)",
    "pgqueuer-psycopg": "PgQueuer (psycopg)",
    "procrastinate": "procrastinate",
    FLOOR: "raw SQL floor",
    ROWS: "raw SQL, pgwork's rows",
}


@dataclass(frozen=True)
class Cost:
    """What one job of a timed run cost (bench/_cost.py): µs of CPU of the library's
    process and of the server's backends (None: the server is not on this machine), and
    transaction ids taken (by transactions and savepoints that wrote), and bytes of
    WAL."""

    library_us: float
    server_us: float | None
    writes: float
    wal_bytes: float = float("nan")


@dataclass(frozen=True)
class Measurement:
    """One number: ``row`` names what was measured (shared by all libraries);
    ``detail`` is shown in brackets after it (the same figure in another unit);
    ``cost``, what each job of the run cost, becomes rows of its own under ``row``."""

    row: str
    library: str
    value: float
    unit: str
    higher_is_better: bool = True
    note: str = ""
    detail: str = ""
    cost: Cost | None = None

    def cost_rows(self) -> list[Measurement]:
        """The rows ``cost`` adds under this one: CPU per job (library + server),
        transaction ids taken per job and WAL per job, all lower is better."""
        cost = self.cost
        if cost is None:
            return []
        if cost.server_us is None:
            cpu = Measurement(
                f"{self.row}: CPU per job, library (server n/a)",
                self.library,
                cost.library_us,
                "µs",
                False,
            )
        else:
            cpu = Measurement(
                f"{self.row}: CPU per job, library + server",
                self.library,
                cost.library_us + cost.server_us,
                "µs",
                False,
                detail=f"{cost.library_us:.0f} + {cost.server_us:.0f}",
            )
        writes = Measurement(
            f"{self.row}: transaction ids taken, per job", self.library, cost.writes, "ids", False
        )
        wal = Measurement(f"{self.row}: WAL per job", self.library, cost.wal_bytes, "B", False)
        return [cpu, writes, wal]

    def cell(self) -> str:
        if self.value != self.value:  # NaN: measured nothing
            return "n/a"
        if self.unit in ("ms",):
            text = f"{self.value:,.1f}"
        elif self.value >= 100:
            text = f"{self.value:,.0f}"
        elif self.value >= 1 or self.value == 0:
            text = f"{self.value:,.1f}"
        else:
            text = f"{self.value:.3g}"
        return f"{text} {self.unit}" + (f" ({self.detail})" if self.detail else "")


# The floors' ratio columns, after "pgwork vs best peer".
_FLOORS = ((FLOOR, "pgwork / floor"), (ROWS, "pgwork / its rows"))


def render_markdown(
    env: Environment,
    measurements: Sequence[Measurement],
    *,
    failures: Sequence[str] = (),
) -> str:
    libraries = [lib for lib in LIBRARIES if any(m.library == lib for m in measurements)]
    measurements = [row for m in measurements for row in (m, *m.cost_rows())]
    rows: list[str] = []
    for m in measurements:
        if m.row not in rows:
            rows.append(m.row)
    by_key = {(m.row, m.library): m for m in measurements}
    peers = [lib for lib in libraries if lib not in ("pgwork", FLOOR, ROWS)]
    floors = [(lib, title) for lib, title in _FLOORS if lib in libraries]
    header = ["workload", *(TITLES[lib] for lib in libraries)]
    if peers:
        header.append("pgwork vs best peer")
    header += [title for _, title in floors]
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---", *("---:" for _ in header[1:])]) + "|",
    ]
    for row in rows:
        cells = [row]
        for lib in libraries:
            found = by_key.get((row, lib))
            cells.append(found.cell() if found else "")
        ours = by_key.get((row, "pgwork"))
        against = _compared_with(row)
        if peers:
            cells.append(_ratio(ours, [by_key.get((against, p)) for p in peers]))
        for lib, _ in floors:
            floor = by_key.get((against, lib))
            cells.append(_ratio(ours, [floor], name=False) if floor else "")
        lines.append("| " + " | ".join(cells) + " |")
    notes = [f"- {TITLES[m.library]}, {m.row}: {m.note}" for m in measurements if m.note]
    out = ["## pgwork benchmark", "", *env.lines(), "", *lines]
    if notes:
        out += ["", "Notes:", *notes]
    if failures:
        out += ["", "Did not run:", *(f"- {f}" for f in failures)]
    return "\n".join(out) + "\n"


def render_json(
    env: Environment, measurements: Sequence[Measurement], *, failures: Sequence[str] = ()
) -> str:
    """The run as JSON: the environment (server settings included) with every result,
    for comparing runs by program rather than by eye."""
    return json.dumps(
        {
            "environment": asdict(env),
            "measurements": [asdict(m) for m in measurements],
            "failures": list(failures),
        },
        indent=2,
    )


def _compared_with(row: str) -> str:
    """The row whose peers (and floor) ``row``'s pgwork figure is compared with; a cost
    row follows the row it is under."""
    for ours, theirs in COMPARED_WITH.items():
        if row == ours or row.startswith(ours + ": "):
            return theirs + row[len(ours) :]
    return row


def _ratio(ours: Measurement | None, theirs: list[Measurement | None], *, name: bool = True) -> str:
    peers = [m for m in theirs if m is not None and m.value == m.value and m.value > 0]
    if ours is None or not peers or not ours.value > 0:
        return ""
    if ours.higher_is_better:
        best = max(peers, key=lambda m: m.value)
        ratio = ours.value / best.value
    else:
        best = min(peers, key=lambda m: m.value)
        ratio = best.value / ours.value
    return f"{ratio:.2f}x ({TITLES[best.library]})" if name else f"{ratio:.2f}x"


def medians(measurements: list[Measurement]) -> list[Measurement]:
    """One measurement per row and library: where a workload ran several times
    (``--repeat``), the run whose figure is the median (the lower middle one of an even
    count), its cost rows with it, and a note giving every run's figure in run order;
    the table keeps the order of first appearance."""
    runs: dict[tuple[str, str], list[Measurement]] = {}
    for m in measurements:
        runs.setdefault((m.row, m.library), []).append(m)
    out = []
    for tried in runs.values():
        if len(tried) == 1:
            out.append(tried[0])
            continue
        ranked = sorted(tried, key=lambda m: m.value)
        middle = ranked[(len(ranked) - 1) // 2]
        figures = ", ".join(_figure(m.value) for m in tried)
        note = f"median of {len(tried)} runs ({figures} {middle.unit})"
        out.append(replace(middle, note=f"{note}; {middle.note}" if middle.note else note))
    return out


def _figure(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.1f}"
