"""Records of the operator's read side: recent activity and a chain's links.

What the dashboard (or any operator tool) reads beyond the listings of ``state``: how
much work finished lately, and which chains a chain waits for or holds up. Kept apart
from ``state`` so the storage contract's core stays about running jobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from pgwork.records import ChainStatus, JobStatus

__all__ = ["ActivityBucket", "ChainLink", "ChainLinks", "RecentActivity"]


@dataclass(frozen=True, slots=True)
class ActivityBucket:
    """Jobs of one queue that ended in ``[start, start + bucket)``."""

    queue: str
    start: datetime
    completed: int
    failed: int


@dataclass(frozen=True, slots=True)
class RecentActivity:
    """Jobs that ended within a window, per queue and time bucket.

    Reading every job that ended in the last hour would read as much as the busiest
    hour wrote, so completions are counted among the newest ``sample_size`` jobs by
    creation (an index range, whatever the table's size); ``sampled`` says how many were
    read, and ``complete`` whether that reached every job of the window (fewer jobs than
    the sample). Failures come from the failed jobs' own index and are exact up to the
    same cap. ``estimated_jobs``: the planner's estimate of the table's rows, never a
    count.
    """

    now: datetime
    buckets: tuple[ActivityBucket, ...]
    sampled: int
    complete: bool
    estimated_jobs: int


@dataclass(frozen=True, slots=True)
class ChainLink:
    """One edge between chains: ``job_id`` of ``chain_id`` waits for ``blocker_chain_id``.

    ``status`` is the status of the chain at the other end of the edge as seen from the
    chain asked about (``None``: it was deleted); ``job_status`` the waiting job's.
    """

    chain_id: UUID
    job_id: UUID
    blocker_chain_id: UUID
    status: ChainStatus | None
    job_status: JobStatus


@dataclass(frozen=True, slots=True)
class ChainLinks:
    """The chains a chain's jobs wait for (``blockers``) and the jobs of other chains
    that wait for it (``dependants``), at most the limit asked for each."""

    blockers: tuple[ChainLink, ...]
    dependants: tuple[ChainLink, ...]
