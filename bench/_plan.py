"""What a run measures: workload names, sizes (scaled by ``--size``) and row labels.

Row labels are shared by pgwork and the peers, so their numbers land in one table row.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BEST_SETTINGS",
    "ROW_DRAIN_BEST",
    "ROW_DRAIN_BEST_ATOMIC",
    "WORKLOADS",
    "Sizes",
    "percentile",
    "row_chains",
    "row_drain",
    "row_enqueue",
    "row_fleet",
    "row_idle",
    "row_latency",
]

# Name on the command line -> what it measures (for --help).
WORKLOADS = {
    "enqueue": "enqueue 20k jobs: one chain per transaction, batches of 100 and 1,000",
    "drain": "drain 20k queued jobs: 10 slots staged, 10 slots atomic, 2 worker processes",
    "best": (
        "drain 20k jobs at each of 10, 50, 100, 200, 400 slots (PgQueuer: batch_size); the best;"
        " pgwork also atomic in groups of 32"
    ),
    "latency": "idle pickup latency: 200 jobs 20 ms apart, commit to handler start",
    "backlog": "drain rate at a 1M-job backlog vs a 10k backlog",
    "rss": "worker RSS at start, after 100k and after 1M jobs",
    "chains": "3-step chains (Continue) per second",
    "idle": "idle cost: commits and CPU per minute of 1, then 10 idle worker processes",
    "fleet": "drain 20k jobs with 1, 4, 16 and 50 worker processes; server connections used",
}


# The "best" workload: each library drains once at each of these settings (pgwork's
# ``max_slots``, PgQueuer's ``batch_size``) and the fastest is its figure. One list for
# all, so no library gets more tries (and more luck) than another. 400 since session
# 11: PgQueuer on asyncpg was still faster at 400 than at 200 (23,053 against 21,844
# jobs/s, 800 slower again), so the list has to reach past each library's peak.
BEST_SETTINGS = (10, 50, 100, 200, 400)
ROW_DRAIN_BEST = "drain, best setting"
# The atomic drain at its best setting too (groups of 32, the same slot settings), so
# that atomic mode's target compares best to best.
ROW_DRAIN_BEST_ATOMIC = "drain, best setting, atomic groups of 32"


def row_drain(slots: int, variant: str = "") -> str:
    """``variant``: "" (staged, one process), "atomic" or "2 processes"."""
    if variant == "2 processes":
        return f"drain, 2 worker processes x {slots} slots"
    return f"drain, 1 worker x {slots} slots" + (f", {variant} mode" if variant else "")


def row_fleet(processes: int, slots: int, what: str = "") -> str:
    row = f"drain, {processes} worker process{'es' if processes > 1 else ''} x {slots} slots"
    return f"{row}: {what}" if what else row


def row_chains(slots: int) -> str:
    return f"3-step chains, 1 worker x {slots} slots"


def row_enqueue(batch: int | None) -> str:
    if batch is None:
        return "enqueue, 1 job per transaction"
    return f"enqueue, batches of {batch:,}"


def row_latency(pct: int, poll_interval: float | None = None) -> str:
    """``poll_interval`` None: the worker's default (the row peers share)."""
    if poll_interval is None:
        return f"idle pickup latency p{pct}"
    return f"idle pickup latency p{pct}, {poll_interval:.0f} s poll"


def row_idle(workers: int, what: str) -> str:
    return f"idle, {workers} worker{'s' if workers > 1 else ''}: {what}"


def row_backlog(backlog: int) -> str:
    return f"drain at a {_count(backlog)}-job backlog"


def row_rss(label: str) -> str:
    return f"worker RSS {label}"


def _count(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1000 and n % 1000 == 0:
        return f"{n // 1000}k"
    return f"{n:,}"


def _scaled(base: int, size: float, floor: int) -> int:
    return max(floor, round(base * size))


@dataclass(frozen=True)
class Sizes:
    """Job counts of each workload; ``scaled(1.0)`` is the issue's full size."""

    enqueue: int
    drain: int
    latency: int
    latency_interval: float
    backlog_big: int
    backlog_small: int
    backlog_measured: int
    backlog_windows: int
    rss_checkpoints: tuple[int, int]
    chains: int
    idle_window: float = 60.0
    slots: int = 10
    fleet: tuple[int, ...] = (1, 4, 16, 50)

    @classmethod
    def scaled(cls, size: float, *, slots: int = 10) -> Sizes:
        return cls(
            enqueue=_scaled(20_000, size, 50),
            drain=_scaled(20_000, size, 50),
            latency=_scaled(200, size, 20),
            latency_interval=0.02,
            backlog_big=_scaled(1_000_000, size, 1_000),
            backlog_small=_scaled(10_000, size, 50),
            backlog_measured=_scaled(10_000, size, 50),
            backlog_windows=5,
            rss_checkpoints=(_scaled(100_000, size, 100), _scaled(1_000_000, size, 1_000)),
            chains=_scaled(5_000, size, 20),
            idle_window=max(5.0, 60.0 * size),
            slots=slots,
            fleet=(1, 4, 16, 50) if size >= 0.5 else (1, 2),
        )

    def describe(self) -> str:
        first, second = self.rss_checkpoints
        return (
            f"enqueue {self.enqueue:,}, drain {self.drain:,}, latency {self.latency} x "
            f"{self.latency_interval * 1000:.0f} ms, backlogs {self.backlog_big:,} / "
            f"{self.backlog_small:,} (median of {self.backlog_windows} windows of "
            f"{self.backlog_window:,} jobs), RSS at "
            f"{first:,} / {second:,}, chains {self.chains:,}, idle windows of "
            f"{self.idle_window:g} s, {self.slots} slots"
        )

    @property
    def backlog_skip(self) -> int:
        """Handler starts left out before a backlog window: the worker's start-up."""
        return self.backlog_measured // 10

    @property
    def backlog_window(self) -> int:
        """Jobs per backlog window; with the skip, one window fits the small backlog
        with a tenth of it to spare, so the queue never runs dry inside one."""
        return self.backlog_measured * 8 // 10

    def rss_label(self, index: int) -> str:
        return f"after {_count(self.rss_checkpoints[index])} jobs"


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile of ``values`` (NaN when empty)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), -(-len(ordered) * pct // 100)))
    return ordered[int(rank) - 1]
