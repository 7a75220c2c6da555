"""What ``python -m bench.bigtable`` found, and the report it prints: markdown, a table
per section, headed by the command and the commit; or the same as JSON."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field

from bench._bigtable_load import Churn, Loaded, Timeline
from bench._bigtable_probe import TableStats, Vacuum
from bench._bigtable_statements import StatementTime
from bench._env import Environment

__all__ = [
    "TARGET_MS",
    "TARGET_RATIO",
    "BigTableRun",
    "DrainRun",
    "Timed",
    "render_json",
    "render_markdown",
]

# Every page and listing under this; the drain on the big table at this share of the
# empty table's at least.
TARGET_MS = 150.0
TARGET_RATIO = 0.90

# The stages the relation sizes are read at, in order.
STAGES = ("after load", "after churn", "after VACUUM", "at the end")


@dataclass(frozen=True)
class DrainRun:
    """One drain of ``jobs`` ready jobs: on which table, how fast, and what the jobs
    table's statistics counted meanwhile (``changes``: TableStats.since)."""

    table: str  # "big" or "empty"
    round: int
    jobs: int
    seconds: float
    settle_s: float
    changes: dict[str, int]

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else float("nan")


@dataclass(frozen=True)
class Timed:
    """A page, a listing or a command: median and p95 of ``runs``, ms."""

    label: str
    median_ms: float
    p95_ms: float
    runs: int
    note: str = ""


@dataclass
class BigTableRun:
    command: str
    environment: Environment
    timeline: Timeline
    cleanup: str
    load: Loaded | None = None
    load_vacuum_s: float = 0.0
    rollup_steps: int = 0
    rollup_s: float = 0.0
    churn: Churn | None = None
    autovacuum_wait_s: float | None = None
    stats_after_churn: TableStats | None = None
    vacuums: dict[str, Vacuum] = field(default_factory=dict)
    sizes: dict[str, dict[str, tuple[str, int]]] = field(default_factory=dict)
    drains: list[DrainRun] = field(default_factory=list)
    statements: list[StatementTime] = field(default_factory=list)
    pages: list[Timed] = field(default_factory=list)
    jobs_list: list[Timed] = field(default_factory=list)
    reloptions: dict[str, str] = field(default_factory=dict)
    free_percent: float | None = None
    final_stats: TableStats | None = None

    def median_rate(self, table: str) -> float:
        rates = [d.rate for d in self.drains if d.table == table]
        return statistics.median(rates) if rates else float("nan")

    @property
    def ratio(self) -> float:
        empty = self.median_rate("empty")
        return self.median_rate("big") / empty if empty > 0 else float("nan")

    def to_json(self) -> str:
        data = asdict(self)
        data["acquire"] = {
            "big_jobs_per_s": self.median_rate("big"),
            "empty_jobs_per_s": self.median_rate("empty"),
            "ratio": self.ratio,
            "target": TARGET_RATIO,
        }
        for drain, run in zip(data["drains"], self.drains, strict=True):
            drain["rate"] = run.rate
        return json.dumps(data, indent=2, default=str)


def _mib(size: int) -> str:
    return f"{size / 2**20:,.1f} MiB"


def _ms(value: float) -> str:
    return f"{value:,.1f}"


def _flag(ms: float) -> str:
    return "yes" if ms < TARGET_MS else "**no**"


def render_markdown(run: BigTableRun) -> str:
    out = ["## pgwork at big-table scale", "", f"- command: `{run.command}`"]
    out += run.environment.lines()
    out += ["", *_load(run), "", *_sizes(run), "", *_acquire(run), "", *_statements(run)]
    out += ["", *_pages(run), "", *_vacuum(run)]
    return "\n".join(out) + "\n"


def _load(run: BigTableRun) -> list[str]:
    t, loaded, churn = run.timeline, run.load, run.churn
    assert loaded is not None
    assert churn is not None
    finished = loaded.jobs - loaded.live - churn.deleted
    lines = [
        "### 1. The big table",
        "",
        f"A steady state of {t.rate:,.2f} chains/s kept by pgwork's default retention "
        f"(completed chains {t.completed_s / 3600:g} h, failed and cancelled "
        f"{t.ended_early_s / 86400:g} days), {t.due_s:,.0f} s of them past due (about one "
        f"retention batch): {finished:,} finished jobs, {loaded.live:,} pending or blocked.",
        "",
        "| step | seconds | what |",
        "|---|---:|---|",
        f"| load | {loaded.seconds:,.1f} | {loaded.jobs:,} jobs in {loaded.chains:,} chains "
        f"({loaded.jobs / loaded.seconds:,.0f} jobs/s), INSERT ... SELECT generate_series |",
        f"| VACUUM (ANALYZE) after the load | {run.load_vacuum_s:,.1f} | |",
        f"| history rollup | {run.rollup_s:,.1f} | {run.rollup_steps} step(s) of the "
        "adapter's roll_up_history, up to 1,000,000 jobs each |",
        f"| churn | {churn.seconds:,.1f} | {churn.deleted:,} jobs of expired chains deleted, "
        f"{churn.updated:,} jobs updated to running and back |",
    ]
    if run.autovacuum_wait_s is not None:
        lines.append(
            f"| autovacuum after the churn | {run.autovacuum_wait_s:,.1f} | waited for "
            "autovacuum to vacuum jobs |"
        )
    churned = run.vacuums.get("after the churn")
    if churned is not None:
        lines.append(
            f"| {run.cleanup} after the churn | {churned.seconds:,.1f} | "
            f"{churned.dead_before:,} dead tuples before, {churned.dead_after:,} after |"
        )
    return lines


def _sizes(run: BigTableRun) -> list[str]:
    """jobs and each of its indexes, then the other tables (their indexes in their
    totals; the JSON has each)."""
    stages = [s for s in STAGES if s in run.sizes]
    names: list[str] = []
    for stage in stages:
        names += [n for n in run.sizes[stage] if n not in names]
    kinds = {n: next(run.sizes[s][n][0] for s in stages if n in run.sizes[s]) for n in names}
    shown = ["jobs", *(n for n in names if kinds[n] == "index of jobs")]
    shown += [n for n in names if kinds[n] == "table" and n != "jobs"]
    lines = [
        "Sizes: `pg_total_relation_size` of each table (its indexes and TOAST included), "
        "`pg_relation_size` of each index of jobs:",
        "",
        "| relation | of | " + " | ".join(stages) + " |",
        "|---|---|" + "---:|" * len(stages),
    ]
    for name in (n for n in shown if n in kinds):
        cells = [_mib(run.sizes[s][name][1]) if name in run.sizes[s] else "" for s in stages]
        lines.append(f"| {name} | {kinds[name]} | " + " | ".join(cells) + " |")
    return lines


def _acquire(run: BigTableRun) -> list[str]:
    rounds = max((d.round for d in run.drains), default=-1) + 1
    jobs = run.drains[0].jobs if run.drains else 0
    lines = [
        "### 2. Acquire rate",
        "",
        f"{jobs:,} ready no-op jobs drained by one worker process, on the big table and on "
        "an empty one, the two taking turns; from the first handler start to no job left "
        "(loading and vacuuming are not timed).",
        "",
        "| table | " + " | ".join(f"run {r + 1}" for r in range(rounds)) + " | median |",
        "|---|" + "---:|" * (rounds + 1),
    ]
    for table in ("big", "empty"):
        runs = sorted((d for d in run.drains if d.table == table), key=lambda d: d.round)
        cells = [f"{d.rate:,.0f}" for d in runs]
        lines.append(
            f"| {table} | " + " | ".join(cells) + f" | {run.median_rate(table):,.0f} jobs/s |"
        )
    verdict = "meets" if run.ratio >= TARGET_RATIO else "**misses**"
    lines += ["", f"big / empty: **{run.ratio:.2f}** ({verdict} the target of {TARGET_RATIO})"]
    return lines


def _statements(run: BigTableRun) -> list[str]:
    lines = [
        "### 3. Statements on the big table",
        "",
        "pgwork's own statement text and parameters, each run in a transaction rolled back "
        "(the same rows every run); the client's wall clock around execute and fetch, and "
        "one `EXPLAIN (ANALYZE, BUFFERS)`.",
        "",
        "| statement | pgwork's | median ms | p95 ms | server ms | buffers hit / read "
        "| rows | what |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for s in run.statements:
        lines.append(
            f"| {s.name} | `{s.statement}` | {_ms(s.median_ms)} | {_ms(s.p95_ms)} | "
            f"{_ms(s.server_ms)} | {s.hit:,} / {s.read:,} | {s.rows:,} | {s.what} |"
        )
    return lines


def _pages(run: BigTableRun) -> list[str]:
    lines = [
        "### 4. Dashboard pages and `pgwork jobs list`",
        "",
        f"Median and p95 of each; target: under {TARGET_MS:g} ms.",
        "",
        f"| page | median ms | p95 ms | under {TARGET_MS:g} ms |",
        "|---|---:|---:|---|",
    ]
    for p in [*run.pages, *run.jobs_list]:
        note = f" ({p.note})" if p.note else ""
        lines.append(
            f"| {p.label}{note} | {_ms(p.median_ms)} | {_ms(p.p95_ms)} | {_flag(p.median_ms)} |"
        )
    return lines


def _vacuum(run: BigTableRun) -> list[str]:
    autovacuum = run.environment.settings.get("autovacuum", "?")
    lines = [
        "### 5. Vacuum",
        "",
        "| VACUUM (VERBOSE) of jobs | dead tuples before | after | dead items removed "
        "| index scans | pages scanned | seconds |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, v in run.vacuums.items():
        items = "" if v.dead_items is None else f"{v.dead_items:,}"
        scans = "" if v.index_scans is None else str(v.index_scans)
        pages = "" if v.pages is None else f"{v.pages_scanned:,} of {v.pages:,}"
        lines.append(
            f"| {label} | {v.dead_before:,} | {v.dead_after:,} | {items} | {scans} | "
            f"{pages} | {v.seconds:,.1f} |"
        )
    lines += [
        "",
        f"Autovacuum on the server: `autovacuum={autovacuum}`. During each drain, on jobs:",
        "",
        "| drain | autovacuums | autoanalyzes | updates | of them HOT | inserts | deletes |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for d in run.drains:
        c = d.changes
        lines.append(
            f"| {d.table}, run {d.round + 1} | {c['autovacuums']} | {c['autoanalyzes']} | "
            f"{c['updated']:,} | {c['hot_updated']:,} | {c['inserted']:,} | {c['deleted']:,} |"
        )
    lines += ["", "Storage settings (`reloptions`):", "", "| table | reloptions |", "|---|---|"]
    lines += [f"| {t} | {o or '(none)'} |" for t, o in run.reloptions.items()]
    lines += ["", *_autovacuum_pace(run)]
    return lines


def _autovacuum_pace(run: BigTableRun) -> list[str]:
    """How often jobs' own ``autovacuum_vacuum_scale_factor`` would start a vacuum at
    the big table's size and the big drain's pace, and what one costs there."""
    stats, after_drain = run.final_stats, run.vacuums.get("after a drain")
    options = dict(
        part.split("=", 1) for part in run.reloptions.get("jobs", "").split(", ") if "=" in part
    )
    factor = float(options.get("autovacuum_vacuum_scale_factor", 0.2))
    if stats is None or after_drain is None or not run.drains:
        return []
    threshold = 50 + factor * stats.live
    big = [d for d in run.drains if d.table == "big"]
    dead_per_s = statistics.median(
        (d.changes["updated"] + d.changes["deleted"]) / d.seconds for d in big
    )
    every = threshold / dead_per_s if dead_per_s > 0 else float("nan")
    return [
        f"At {stats.live:,} live rows, jobs' `autovacuum_vacuum_scale_factor={factor:g}` "
        f"starts a vacuum every {threshold:,.0f} dead tuples: at the big drain's "
        f"{dead_per_s:,.0f} dead tuples/s (updates and deletes), every {every:,.1f} s; a "
        f"VACUUM of jobs after one drain ({after_drain.dead_before:,} dead tuples) took "
        f"{after_drain.seconds:,.1f} s."
        + (
            f" The heap's free space (pgstattuple_approx): {run.free_percent:.1f} %."
            if run.free_percent is not None
            else ""
        )
    ]


def render_json(run: BigTableRun) -> str:
    return run.to_json()
