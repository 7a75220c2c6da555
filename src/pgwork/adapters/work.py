"""Records of the operator's work views: jobs waiting or running, stuck job types,
failures grouped by error.

What an operator looks for when work seems stuck: which jobs wait in a queue and
since when, which job types nobody handles, which failures are the same failure. Each
is read from a bounded index range (``ReadStore.list_work`` and the reads after it),
never by counting the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from pgwork.records import Job

__all__ = [
    "ErrorGroup",
    "PendingType",
    "WorkFilter",
    "WorkStatus",
    "WorkerJobs",
]


class WorkStatus(StrEnum):
    """Which jobs a work listing shows, and the time it orders them by.

    ``ready``: pending and due (by ``scheduled_at``); ``scheduled``: pending and due
    later (by ``scheduled_at``); ``running``: leased by a worker (by ``started_at``);
    ``failed``: failed for good (by ``created_at``).
    """

    READY = "ready"
    SCHEDULED = "scheduled"
    RUNNING = "running"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class WorkFilter:
    """Which jobs ``list_work`` returns; ``None`` leaves a field unfiltered.

    ``leased_by`` applies to running jobs, ``error_type`` / ``error_message`` (exact
    matches of the stored last error) to failed ones.
    """

    status: WorkStatus
    queue: str | None = None
    leased_by: str | None = None
    error_type: str | None = None
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class PendingType:
    """A job type among the oldest ready jobs of a queue: ``jobs`` of them in the
    sample, the oldest due since ``oldest_due_at``."""

    queue: str
    type_name: str
    jobs: int
    oldest_due_at: datetime


@dataclass(frozen=True, slots=True)
class ErrorGroup:
    """Failed jobs whose last error has the same type and message."""

    error_type: str
    message: str
    jobs: int
    queues: tuple[str, ...]
    newest_at: datetime


@dataclass(frozen=True, slots=True)
class WorkerJobs:
    """The jobs one worker holds: how many (``running``), and the ``oldest`` of them by
    start time, at most the number asked for."""

    worker_id: str
    running: int
    oldest: tuple[Job[Any], ...]
