"""Read-side client API: listings with keyset pagination, queue counts, workers.

Mixed into ``Client``; relies on ``self.state`` (of which it needs only the ``ReadStore``
role: it changes nothing), ``self.registry`` and the client's decoding helpers.

Listings are newest first: jobs by id (UUIDv7, the order they were made in), chains and
blocked jobs by ``(created_at, id)``. A page's ``next_cursor`` encodes its
last row's position, and the next page starts strictly after it, so pages never repeat
or skip a row that existed when the first page was read, however many jobs are
enqueued meanwhile (new jobs are newer than any cursor, and sort before it).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar
from uuid import UUID

from pgwork.adapters.state import (
    BlockedJob,
    BlockerEdge,
    ChainFilter,
    JobFilter,
    PageKey,
    QueueCount,
    WorkerRecord,
)
from pgwork.errors import ConfigurationError, InvalidCursorError
from pgwork.records import Chain, ChainStatus, Job, JobStatus, Page

if TYPE_CHECKING:
    from pgwork.adapters.capabilities import Capabilities
    from pgwork.adapters.state import ReadCore, TransactionHandle
    from pgwork.job_types import JobTypeRegistry

__all__ = ["MAX_PAGE_SIZE", "QueryMixin", "decode_cursor", "encode_cursor"]

MAX_PAGE_SIZE = 1000

T = TypeVar("T")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
# One letter per listing, so a cursor is refused by a listing it does not belong to.
_LISTINGS = {
    "j": "list_jobs",
    "c": "list_chains",
    "b": "list_blocked_jobs",
    "bl": "list_blockers",
    "i": "find_by_input",
    "wait": "list_waiting",
    "sig": "list_signals",
}


class QueryMixin:
    """Listings, counts and workers of ``Client``: reads only."""

    if TYPE_CHECKING:
        state: ReadCore
        capabilities: Capabilities
        registry: JobTypeRegistry

        def _decoded(self, job: Job[Any]) -> Job[Any]: ...

        def _decode_input(self, type_name: str, data: Any) -> Any: ...

    # --- listings ----------------------------------------------------------------------

    async def list_jobs(
        self,
        *,
        type_name: str | None = None,
        queue: str | None = None,
        status: JobStatus | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        chain_id: UUID | None = None,
        limit: int = 50,
        cursor: str | None = None,
        tx: object | None = None,
    ) -> Page[Job[Any]]:
        """One page of jobs, newest first, inputs and outputs decoded to their models.

        Every filter is optional; ``created_after`` / ``created_before`` are exclusive
        and must be timezone-aware. Pass ``next_cursor`` back as ``cursor`` (with the
        same filters) for the next page; it is ``None`` on the last page. Raises
        InvalidCursorError for a cursor this listing did not hand out.
        """
        where = JobFilter(
            type_name=type_name,
            queue=queue,
            status=_job_status(status),
            created_after=_aware("created_after", created_after),
            created_before=_aware("created_before", created_before),
            chain_id=chain_id,
        )
        size, after = _fetch_size(limit), decode_cursor(cursor, "j")
        handle = await self._read_handle(tx)
        jobs = await self.state.list_jobs(handle, where=where, after=after, limit=size)
        return _page([self._decoded(job) for job in jobs], limit, "j", _job_key)

    async def list_chains(
        self,
        *,
        type_name: str | None = None,
        status: ChainStatus | str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        dedup_key: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        tx: object | None = None,
    ) -> Page[Chain]:
        """One page of chains (by their first job's type and creation), newest first,
        decoded like ``get_chain``. ``dedup_key``: only chains started with that
        key. Same paging and filter rules as ``list_jobs``."""
        where = ChainFilter(
            type_name=type_name,
            status=_chain_status(status),
            created_after=_aware("created_after", created_after),
            created_before=_aware("created_before", created_before),
            dedup_key=dedup_key,
        )
        size, after = _fetch_size(limit), decode_cursor(cursor, "c")
        handle = await self._read_handle(tx)
        chains = await self.state.list_chains(handle, where=where, after=after, limit=size)
        return _page([self._decoded_chain(chain) for chain in chains], limit, "c", _chain_key)

    async def list_blocked_jobs(
        self, *, limit: int = 50, cursor: str | None = None, tx: object | None = None
    ) -> Page[BlockedJob]:
        """One page of blocked jobs, newest first, each with its counts (how many of its
        blockers it needs, has met, has open) and the first ``LISTED_BLOCKERS`` (20)
        chains it waits for with their status (``BlockedJob``): what an operator looks
        at when work seems stuck. A page reads that many edges a job at most, whatever
        each waits for; ``list_blockers`` pages through all of one job's."""
        size, after = _fetch_size(limit), decode_cursor(cursor, "b")
        handle = await self._read_handle(tx)
        blocked = await self.capabilities.require_views(
            "Client.list_blocked_jobs"
        ).list_blocked_jobs(handle, after=after, limit=size)
        items = [replace(item, job=self._decoded(item.job)) for item in blocked]
        return _page(items, limit, "b", lambda item: _job_key(item.job))

    async def list_blockers(
        self, job_id: UUID, *, limit: int = 50, cursor: str | None = None, tx: object | None = None
    ) -> Page[BlockerEdge]:
        """One page of the chains job ``job_id`` waits for, in declaration order (the
        order a handler started its children), each with its position and its status
        now: every blocker of a job, where ``list_blocked_jobs`` shows the first
        ``LISTED_BLOCKERS``. Reads one index range of the job's edges, whatever their
        number. Empty for a job that waits for no chain, or that does not exist. Pass
        ``next_cursor`` back with the same ``job_id`` for the next page."""
        size, after = _fetch_size(limit), _blocker_position(cursor, job_id)
        edges = await self.capabilities.require_views("Client.list_blockers").list_blockers(
            await self._read_handle(tx), job_id=job_id, after=after, limit=size
        )
        return _page(edges, limit, "bl", lambda edge: _blocker_key(job_id, edge.position))

    async def count_jobs(self, *, tx: object | None = None) -> list[QueueCount]:
        """Unfinished work per queue (ready, scheduled, leased — ``QueueCount.running``
        counts jobs running *or* prefetched by a worker and waiting for a slot: both
        are leased, and the store cannot tell them apart —, blocked, failed), the
        oldest ready job's age and whether the queue is paused, ordered by queue name.

        Reads every unfinished job's index entry, never a finished one's.
        """
        return await self.capabilities.require_views("Client.count_jobs").count_jobs(
            await self._read_handle(tx)
        )

    # --- workers ----------------------------------------------------------------------

    async def list_workers(self, *, dead_after: float = 30.0) -> list[WorkerRecord]:
        """Registered workers, newest first; ``alive`` is False for a worker silent for
        longer than ``dead_after`` seconds or stopped."""
        return await self.state.list_workers(alive_within_s=dead_after)

    # --- helpers -----------------------------------------------------------------------

    async def _read_handle(self, tx: object | None) -> TransactionHandle | None:
        return await self.state.adopt(tx) if tx is not None else None

    def _decoded_chain(self, chain: Chain) -> Chain:
        """``chain`` with input, output and newest job decoded by the registry."""
        current = self._decoded(chain.current_job)
        return replace(
            chain,
            input=self._decode_input(chain.type_name, chain.input),
            output=current.output if chain.output is not None else None,
            current_job=current,
        )


def encode_cursor(listing: str, key: PageKey) -> str:
    """An opaque, URL-safe cursor for the position ``key`` in ``listing``."""
    micros = (key.created_at - _EPOCH) // _MICROSECOND
    raw = f"{listing}.{micros}.{key.id.hex}"
    return base64.urlsafe_b64encode(raw.encode("ascii")).decode("ascii").rstrip("=")


def decode_cursor(cursor: str | None, listing: str) -> PageKey | None:
    """The position ``cursor`` stands for; InvalidCursorError if ``listing`` did not
    hand it out."""
    if cursor is None:
        return None
    if not isinstance(cursor, str):
        raise InvalidCursorError(repr(cursor), "a cursor is a string")
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        raw = base64.b64decode(padded, altchars=b"-_", validate=True).decode("ascii")
        kind, micros, hex_id = raw.split(".")
        key = PageKey(_EPOCH + int(micros) * _MICROSECOND, UUID(hex=hex_id))
    except (ValueError, binascii.Error, OverflowError):
        raise InvalidCursorError(cursor, "it was not made by pgwork") from None
    if kind != listing:
        made_by = _LISTINGS.get(kind, "something else")
        raise InvalidCursorError(
            cursor, f"it belongs to {made_by}, not {_LISTINGS.get(listing, listing)}"
        )
    return key


def _page(items: list[T], limit: int, listing: str, key: Callable[[T], PageKey]) -> Page[T]:
    """Items were fetched with one extra row: its presence says another page exists."""
    if len(items) <= limit:
        return Page(items=tuple(items))
    shown = items[:limit]
    return Page(items=tuple(shown), next_cursor=encode_cursor(listing, key(shown[-1])))


# A position among a job's blockers, as the cursor's time: that many microseconds after
# the epoch; the job rides in the cursor's id, so another job's listing refuses it.
_MAX_POSITION = 2**31 - 1


def _blocker_key(job_id: UUID, position: int) -> PageKey:
    return PageKey(_EPOCH + position * _MICROSECOND, job_id)


def _blocker_position(cursor: str | None, job_id: UUID) -> int | None:
    """The position after which ``cursor`` (of ``list_blockers`` for ``job_id``) goes on."""
    key = decode_cursor(cursor, "bl")
    if key is None:
        return None
    assert cursor is not None
    if key.id != job_id:
        raise InvalidCursorError(cursor, "it belongs to another job's blockers")
    position = (key.created_at - _EPOCH) // _MICROSECOND
    if not 0 <= position <= _MAX_POSITION:
        raise InvalidCursorError(cursor, "it was not made by pgwork")
    return position


def _fetch_size(limit: int) -> int:
    if not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE_SIZE:
        raise ConfigurationError(f"limit must be between 1 and {MAX_PAGE_SIZE}, got {limit!r}")
    return limit + 1


def _job_key(job: Job[Any]) -> PageKey:
    return PageKey(job.created_at, job.id)


def _chain_key(chain: Chain) -> PageKey:
    return PageKey(chain.created_at, chain.id)


def _aware(name: str, value: datetime | None) -> datetime | None:
    if value is not None and (value.tzinfo is None or value.utcoffset() is None):
        raise ConfigurationError(
            f"{name} {value.isoformat()} has no timezone; pass an aware datetime"
        )
    return value


def _job_status(status: JobStatus | str | None) -> JobStatus | None:
    if status is None:
        return None
    try:
        return JobStatus(status)
    except ValueError:
        known = ", ".join(s.value for s in JobStatus)
        raise ConfigurationError(f"unknown job status {status!r}; one of {known}") from None


def _chain_status(status: ChainStatus | str | None) -> ChainStatus | None:
    if status is None:
        return None
    try:
        return ChainStatus(status)
    except ValueError:
        known = ", ".join(s.value for s in ChainStatus)
        raise ConfigurationError(f"unknown chain status {status!r}; one of {known}") from None
