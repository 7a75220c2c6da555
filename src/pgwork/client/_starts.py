"""What starting a chain takes and gives back: ``ChainStart`` and ``StartedChain``.

Below the client and its sync twins (``_sync.py``), which both build and return
them; re-exported by ``pgwork.client`` and ``pgwork``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from uuid import UUID

from pgwork._continuations import Schedule
from pgwork.adapters.state import Debounce, DedupSpec
from pgwork.job_types import JobType
from pgwork.records import JobStatus

__all__ = ["ChainStart", "StartedChain"]

I = TypeVar("I")  # noqa: E741
O = TypeVar("O")  # noqa: E741


@dataclass(frozen=True, slots=True, init=False)
class ChainStart(Generic[I]):
    """One chain to start with ``Client.start_chains``; the same options as start_chain."""

    job_type: JobType[I, Any]
    input: I
    schedule: Schedule
    dedup: str | DedupSpec | Debounce | None
    queue: str | None
    priority: int | None
    max_attempts: int | None
    blockers: tuple[UUID, ...]
    context: Mapping[str, str] | None
    limit_key: str | None

    def __init__(
        self,
        job_type: JobType[I, Any],
        input: I,
        *,
        schedule: Schedule = None,
        dedup: str | DedupSpec | Debounce | None = None,
        queue: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        blockers: Sequence[UUID | StartedChain[Any, Any]] = (),
        context: Mapping[str, str] | None = None,
        limit_key: str | None = None,
    ) -> None:
        # Built by the thousand for start_chains, so kept cheap.
        set_ = object.__setattr__
        set_(self, "job_type", job_type)
        set_(
            self,
            "blockers",
            tuple(b.id if isinstance(b, StartedChain) else b for b in blockers) if blockers else (),
        )
        set_(self, "input", input)
        set_(self, "schedule", schedule)
        set_(self, "dedup", dedup)
        set_(self, "queue", queue)
        set_(self, "priority", priority)
        set_(self, "max_attempts", max_attempts)
        set_(self, "context", context)
        set_(self, "limit_key", limit_key)


@dataclass(frozen=True, slots=True)
class StartedChain(Generic[I, O]):
    """What ``start_chain`` did: the chain's id (= its first job's id), and whether an
    existing chain was returned instead of a new one (deduplication).

    ``debounced``: the enqueue (``dedup=Debounce(...)``) was merged into the existing
    pending job of its key, named by ``id`` / ``job_id``, which took its input (or kept
    its own) and a later start; ``deduplicated`` is then true as well."""

    id: UUID
    job_id: UUID
    job_type: JobType[I, O]
    deduplicated: bool
    status: JobStatus
    debounced: bool = False
