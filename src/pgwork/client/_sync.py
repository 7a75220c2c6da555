"""Synchronous enqueue: ``start_chain_sync`` / ``start_chains_sync`` (and ``get_job_sync``
to read a job back) for code with no event loop (Django views, Flask, scripts,
Celery-style workers).

Not a second implementation. The async ``start_chains`` is one coroutine: validate,
encode, adopt the caller's transaction, insert, report. Given a blocking connection,
the state adapter's ``adopt_sync`` returns a handle whose every operation completes
without suspending (it calls the blocking driver), so that same coroutine runs to its
end on the first ``send``. ``_drive`` does exactly that: no event loop is created or
looked up, so it works in any thread, even one whose loop is running.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar
from uuid import UUID

from pgwork._continuations import Schedule
from pgwork.adapters.state import Debounce, DedupSpec, SyncAdopter, TransactionHandle
from pgwork.client._starts import ChainStart, StartedChain
from pgwork.errors import ConfigurationError, JobNotFoundError
from pgwork.job_types import JobType
from pgwork.records import Job

if TYPE_CHECKING:
    from pgwork.adapters.state import CoreStateAdapter

__all__ = ["SyncEnqueueMixin"]

I = TypeVar("I")  # noqa: E741
O = TypeVar("O")  # noqa: E741
T = TypeVar("T")


class SyncEnqueueMixin:
    """Mixed into ``Client``: the blocking twins of ``start_chain`` / ``start_chains``."""

    if TYPE_CHECKING:
        state: CoreStateAdapter

        def _start_chains(
            self,
            items: Sequence[ChainStart[Any]],
            adopt: Callable[[object], Awaitable[TransactionHandle]],
            tx: object,
        ) -> Coroutine[Any, Any, list[StartedChain[Any, Any]]]: ...

        def _decoded(self, job: Job[Any]) -> Job[Any]: ...

        def _start_plain(
            self,
            job_type: JobType[I, O],
            input: I,
            queue: str | None,
            priority: int | None,
            max_attempts: int | None,
            context: Mapping[str, str] | None,
            limit_key: str | None,
            adopt: Callable[[object], Awaitable[TransactionHandle]],
            tx: object,
        ) -> Coroutine[Any, Any, StartedChain[I, O]]: ...

    def start_chain_sync(
        self,
        conn: object,
        job_type: JobType[I, O],
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
    ) -> StartedChain[I, O]:
        """``start_chain`` in the caller's open transaction on a blocking connection.

        ``conn``: a psycopg ``Connection`` (Django: ``django.db.connection.connection``
        inside ``transaction.atomic()``), or a SQLAlchemy ``Connection`` / ``Session``
        on ``postgresql+psycopg://`` (its transaction is begun if it was not). The job
        exists once, and only if, the caller commits. Same options and result as
        ``start_chain``; starts no event loop.
        """
        if schedule is None and dedup is None and not blockers:
            plain = self._start_plain(
                job_type,
                input,
                queue,
                priority,
                max_attempts,
                context,
                limit_key,
                self._sync_adopt(),
                conn,
            )
            return _drive(plain)
        start = ChainStart(
            job_type,
            input,
            schedule=schedule,
            dedup=dedup,
            queue=queue,
            priority=priority,
            max_attempts=max_attempts,
            blockers=blockers,
            context=context,
            limit_key=limit_key,
        )
        return self.start_chains_sync(conn, [start])[0]

    def start_chains_sync(
        self, conn: object, items: Sequence[ChainStart[Any]]
    ) -> list[StartedChain[Any, Any]]:
        """``start_chains`` on a blocking connection (see ``start_chain_sync``)."""
        if not items:
            return []
        return _drive(self._start_chains(items, self._sync_adopt(), conn))

    def get_job_sync(self, conn: object, job_id: UUID) -> Job[Any]:
        """``get_job`` on a blocking connection (the same kinds as ``start_chain_sync``'s,
        in a transaction or not): the job as that connection sees it, so a job its own
        transaction wrote and has not committed yet is found. Raises JobNotFoundError."""
        handle: TransactionHandle = _drive(_awaited(self._sync_adopt()(conn)))
        jobs = _drive(self.state.get_jobs(handle, job_ids=[job_id]))
        if not jobs:
            raise JobNotFoundError([job_id])
        return self._decoded(jobs[0])

    def _sync_adopt(self) -> Callable[[object], Awaitable[TransactionHandle]]:
        """The state adapter's ``adopt_sync`` as the coroutine the enqueue awaits."""
        state = self.state
        if not isinstance(state, SyncAdopter):
            raise ConfigurationError(
                f"{type(state).__name__} cannot adopt a blocking connection; "
                "use the async start_chains"
            )

        async def adopt(tx: object) -> TransactionHandle:
            return state.adopt_sync(tx)

        return adopt


async def _awaited(value: Awaitable[T]) -> T:
    return await value


def _drive(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine``, which must never suspend, to its end without an event loop."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coroutine.close()
    raise ConfigurationError(
        "a synchronous enqueue reached code that waits for an event loop (a state or "
        "notify adapter that only works asynchronously); use the async start_chains"
    )
