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

    The window starts at the beginning of the bucket it begins in, so every bucket is
    whole. Jobs that completed or failed in it are read newest first from an index of
    ended jobs by end time, at most ``sample_size`` of them: ``sampled`` says how many
    were read, and ``complete`` whether that was every job of the window, so each
    count is exact. When the cap was reached first, ``counted_from`` is the end time of
    the oldest job read: buckets before it were not counted (and the bucket holding it
    only in part). ``estimated_jobs``: the planner's estimate of the table's rows,
    never a count.
    """

    now: datetime
    buckets: tuple[ActivityBucket, ...]
    sampled: int
    complete: bool
    estimated_jobs: int
    counted_from: datetime | None = None


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
