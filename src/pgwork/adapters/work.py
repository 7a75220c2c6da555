"""Records of the operator's work views: jobs waiting or running, stuck job types,
failures grouped by error, jobs found by an input field.

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

from pgwork.adapters._state_records import PageKey
from pgwork.records import Job

__all__ = [
    "ErrorGroup",
    "InputMatch",
    "InputScan",
    "InputSearch",
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


@dataclass(frozen=True, slots=True)
class InputMatch:
    """The jobs ``scan_input`` looks for: of type ``type_name``, whose input holds, at
    ``path`` (object keys, or array indexes written as digits), a JSON value equal to
    ``value_json`` (JSON text: ``42`` and ``"42"`` differ, ``42`` and ``42.0`` do not)."""

    type_name: str
    path: tuple[str, ...]
    value_json: str


@dataclass(frozen=True, slots=True)
class InputScan:
    """What one bounded scan of the newest jobs found.

    ``jobs``: the matches, newest first. ``examined``: how many jobs (of any type) were
    looked at, newest first, down to ``oldest_examined`` (``None``: none were).
    ``exhausted``: the scan reached the oldest job, so no older one is left to look at.
    When the scan stopped at its match limit, ``oldest_examined`` is the last match.
    """

    jobs: tuple[Job[Any], ...]
    examined: int
    oldest_examined: PageKey | None
    exhausted: bool


@dataclass(frozen=True, slots=True)
class InputSearch:
    """One page of ``Client.find_by_input``: the matches among the jobs it looked at.

    ``examined`` jobs were looked at (newest first, of every type), back to jobs
    created at ``reached`` (``None``: there were none). ``next_cursor`` looks further
    back, from where this page stopped; ``None`` once the oldest job was looked at.
    """

    jobs: tuple[Job[Any], ...]
    examined: int
    reached: datetime | None
    next_cursor: str | None
