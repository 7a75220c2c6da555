"""Client API of the operator's work views: jobs waiting or running, stuck job types,
failures grouped by error, jobs by id prefix or by an input field.

Mixed into ``Client``. Each call reads a bounded index range (see
``pgwork.postgres.sql.work_views``), so a dashboard page built on them costs the same
on a table of a thousand jobs or a hundred million.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any
from uuid import UUID

from pgwork._input_search import input_path, input_type_name, input_value_json
from pgwork.adapters.state import PageKey
from pgwork.adapters.work import (
    ErrorGroup,
    InputMatch,
    InputSearch,
    PendingType,
    WorkerJobs,
    WorkFilter,
    WorkStatus,
)
from pgwork.client._queries import MAX_PAGE_SIZE, _fetch_size, _page, decode_cursor, encode_cursor
from pgwork.errors import ConfigurationError
from pgwork.records import Job, Page

if TYPE_CHECKING:
    from pgwork.adapters.capabilities import Capabilities
    from pgwork.adapters.state import TransactionHandle

__all__ = ["WorkMixin"]

_HEX = re.compile(r"[0-9a-f]{1,32}")
MAX_SAMPLE = 100_000
# Jobs ``find_by_input`` looks at per call: by default, and at most.
EXAMINED = 10_000
MAX_EXAMINED = 100_000
_INPUT_SEARCH = "i"


def _listing(status: WorkStatus, oldest_first: bool) -> str:
    """A cursor's kind: a cursor of one listing (or order) is refused by another."""
    return f"w{status.value}{'+' if oldest_first else '-'}"


def _work_key(status: WorkStatus) -> Any:
    """The position of a job in its listing: the time it is ordered by, then id."""

    def key(job: Job[Any]) -> PageKey:
        if status is WorkStatus.RUNNING:
            moment = job.started_at
        elif status is WorkStatus.FAILED:
            moment = job.created_at
        else:
            moment = job.scheduled_at
        assert moment is not None  # a running job has started
        return PageKey(moment, job.id)

    return key


def id_range(prefix: str) -> tuple[UUID, UUID]:
    """The first and last UUID starting with the hex digits of ``prefix`` (dashes and
    case ignored); ConfigurationError if it holds anything else."""
    digits = prefix.strip().replace("-", "").lower()
    if not _HEX.fullmatch(digits):
        raise ConfigurationError(
            f"an id prefix is 1 to 32 hexadecimal digits (dashes allowed), got {prefix!r}"
        )
    return UUID(hex=digits.ljust(32, "0")), UUID(hex=digits.ljust(32, "f"))


class WorkMixin:
    """``list_work``, ``running_by_worker``, ``pending_types``, ``error_groups``,
    ``find_by_id_prefix``, ``find_by_input``."""

    if TYPE_CHECKING:
        capabilities: Capabilities

        async def _read_handle(self, tx: object | None) -> TransactionHandle | None: ...

        def _decoded(self, job: Job[Any]) -> Job[Any]: ...

    async def list_work(
        self,
        *,
        status: WorkStatus | str,
        queue: str | None = None,
        leased_by: str | None = None,
        error_type: str | None = None,
        error_message: str | None = None,
        oldest_first: bool = True,
        limit: int = 50,
        cursor: str | None = None,
        tx: object | None = None,
    ) -> Page[Job[Any]]:
        """One page of ready, scheduled, running or failed jobs (``WorkStatus``), oldest
        first by the time their status is about (when due, when started, when made) or
        newest first, decoded like ``get_job``.

        Unlike ``list_jobs`` (newest first by id), the order follows an index of each
        status, so a page of the jobs waiting in one queue costs the same however many
        jobs the table holds. ``leased_by`` filters running jobs by worker id;
        ``error_type`` / ``error_message`` failed jobs by their last error. Pass
        ``next_cursor`` back with the same filters and order for the next page.
        """
        try:
            chosen = WorkStatus(status)
        except ValueError:
            known = ", ".join(s.value for s in WorkStatus)
            raise ConfigurationError(f"unknown work status {status!r}; one of {known}") from None
        where = WorkFilter(
            status=chosen,
            queue=queue,
            leased_by=leased_by,
            error_type=error_type,
            error_message=error_message,
        )
        kind = _listing(chosen, oldest_first)
        size, after = _fetch_size(limit), decode_cursor(cursor, kind)
        handle = await self._read_handle(tx)
        jobs = await self.capabilities.require_views("Client.list_work").list_work(
            handle, where=where, after=after, oldest_first=oldest_first, limit=size
        )
        return _page([self._decoded(job) for job in jobs], limit, kind, _work_key(chosen))

    async def running_by_worker(
        self, *, per_worker: int = 10, tx: object | None = None
    ) -> list[WorkerJobs]:
        """Per worker that holds running jobs: how many it holds, and the ``per_worker``
        it started first, decoded like ``get_job``; by worker id.

        Reads each running job's row once (at most the workers' slots) but returns
        and decodes only ``per_worker`` jobs of each worker, however many they run.
        ``list_work(status="running", leased_by=...)`` pages through all of one
        worker's jobs.
        """
        if not isinstance(per_worker, int) or not 1 <= per_worker <= MAX_PAGE_SIZE:
            raise ConfigurationError(
                f"per_worker must be between 1 and {MAX_PAGE_SIZE}, got {per_worker!r}"
            )
        found = await self.capabilities.require_views("Client.running_by_worker").running_by_worker(
            await self._read_handle(tx), per_worker=per_worker
        )
        return [
            replace(held, oldest=tuple(self._decoded(job) for job in held.oldest)) for held in found
        ]

    async def pending_types(
        self, *, sample: int = 100, tx: object | None = None
    ) -> list[PendingType]:
        """The job types among the oldest ``sample`` ready jobs of each queue (per
        priority), by queue: a type no worker takes gathers there, however long the
        queue."""
        if not 1 <= sample <= MAX_SAMPLE:
            raise ConfigurationError(f"sample must be in 1..{MAX_SAMPLE}, got {sample}")
        return await self.capabilities.require_views("Client.pending_types").pending_types(
            await self._read_handle(tx), sample=sample
        )

    async def error_groups(
        self, *, sample: int = 10_000, limit: int = 50, tx: object | None = None
    ) -> list[ErrorGroup]:
        """The newest ``sample`` failed jobs grouped by their last error's type and
        message, largest group first (at most ``limit`` groups)."""
        if not 1 <= sample <= MAX_SAMPLE:
            raise ConfigurationError(f"sample must be in 1..{MAX_SAMPLE}, got {sample}")
        _fetch_size(limit)
        return await self.capabilities.require_views("Client.error_groups").error_groups(
            await self._read_handle(tx), sample=sample, limit=limit
        )

    async def find_by_id_prefix(
        self, prefix: str, *, limit: int = 50, tx: object | None = None
    ) -> list[Job[Any]]:
        """Up to ``limit`` jobs whose id starts with ``prefix`` (hex digits, dashes and
        case ignored; a chain's id is its first job's), in id order.

        Ids are UUIDv7: the first 12 digits are the creation time in milliseconds, so a
        short prefix names every job made in a stretch of time; more digits (the random
        part follows) tell jobs apart. Reads one range of the primary key.
        """
        low, high = id_range(prefix)
        _fetch_size(limit)
        jobs = await self.capabilities.require_views("Client.find_by_id_prefix").jobs_in_id_range(
            await self._read_handle(tx), low=low, high=high, limit=limit
        )
        return [self._decoded(job) for job in jobs]

    async def find_by_input(
        self,
        type_name: str,
        field: str | Sequence[str],
        value: Any,
        *,
        examine: int = EXAMINED,
        limit: int = 50,
        cursor: str | None = None,
        tx: object | None = None,
    ) -> InputSearch:
        """Jobs of ``type_name`` whose input holds ``value`` at ``field``, newest first,
        among the newest ``examine`` jobs (of every type) before ``cursor``.

        ``field`` is a key or a dotted path (``"user_id"``, ``"address.city"``,
        ``"items.0.sku"``; a leading ``input.`` is ignored), or a sequence of keys.
        ``value`` is compared as JSON: ``42`` matches the number, not the string
        ``"42"``; ``42`` and ``42.0`` are the same number. No index covers inputs (one
        would slow every enqueue), so a call looks at a bounded number of jobs
        (``examine``, at most 100,000) along the primary key, and says how far it got:
        ``examined`` and ``reached``. Pass ``next_cursor`` back, with the same search,
        to look further back; it is ``None`` once the oldest job was looked at.
        Raises ConfigurationError for a search that cannot be made, before any SQL.
        """
        match = InputMatch(
            type_name=input_type_name(type_name),
            path=input_path(field),
            value_json=input_value_json(value),
        )
        if not isinstance(examine, int) or not 1 <= examine <= MAX_EXAMINED:
            raise ConfigurationError(f"examine must be in 1..{MAX_EXAMINED}, got {examine!r}")
        _fetch_size(limit)
        before = decode_cursor(cursor, _INPUT_SEARCH)
        scan = await self.capabilities.require_views("Client.find_by_input").scan_input(
            await self._read_handle(tx), match=match, before=before, examine=examine, limit=limit
        )
        oldest = scan.oldest_examined
        return InputSearch(
            jobs=tuple(self._decoded(job) for job in scan.jobs),
            examined=scan.examined,
            reached=oldest.created_at if oldest is not None else None,
            next_cursor=(
                None if scan.exhausted or oldest is None else encode_cursor(_INPUT_SEARCH, oldest)
            ),
        )
