"""PostgreSQL side of the ``EnqueueStore`` role: ``insert_jobs``.

Mixed into ``PostgresStateAdapter`` (``state.py``), whose pool and statement helpers it
uses. Plain jobs stream in by COPY (``_enqueue``); deduplicated ones are matched first
under a per-key lock, blocked ones get their blocker edges and settle at once; steps
waiting for a signal (continuations only) go by a statement of their own
(``_signals.insert_waiting``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import cast
from uuid import UUID

import psycopg

from pgwork.adapters.notify import Notice, NotifyAdapter, counted_ready, ready_notices
from pgwork.adapters.state import (
    DedupSpec,
    InsertedJob,
    NewJob,
    Resolution,
    TransactionHandle,
)
from pgwork.errors import ConfigurationError, IsolationLevelError
from pgwork.postgres._callers import DbConn, can_copy, kept_cursor
from pgwork.postgres._chains import ChainOps
from pgwork.postgres._encoding import check_encodable, narrow_encoding
from pgwork.postgres._enqueue import (
    COPY_MIN_ROWS,
    due_notices,
    insert_streamed,
    is_plain,
    plain_job_statement,
    ready_queues,
    write_jobs,
)
from pgwork.postgres._errors import missing_schema
from pgwork.postgres._queries import QueryOps
from pgwork.postgres._signals import insert_waiting
from pgwork.postgres._transactions import PgTransaction, require_transaction, unwrap
from pgwork.postgres.notify import PostgresNotifyAdapter
from pgwork.records import JobStatus

__all__ = ["EnqueueOps", "scheduled"]

_PENDING = JobStatus.PENDING  # an enum attribute lookup, once
# The levels at which a statement sees what was committed before it began (PostgreSQL
# runs READ UNCOMMITTED as READ COMMITTED).
_READ_COMMITTED = frozenset({"read committed", "read uncommitted"})


class EnqueueOps(ChainOps, QueryOps):
    """Insert jobs: streamed, deduplicated, blocked."""

    async def insert_jobs(
        self,
        tx: TransactionHandle,
        *,
        jobs: Iterable[NewJob],
        notify: NotifyAdapter | None = None,
    ) -> list[InsertedJob]:
        if type(jobs) is list and len(jobs) == 1 and is_plain(jobs[0]):
            return await self._insert_plain(tx, jobs[0], notify)
        conn = await unwrap(tx)
        require_transaction(conn)
        encoding = narrow_encoding(conn)
        if encoding is not None:  # every job checked before the first row is written
            jobs = list(jobs)
            check_encodable(jobs, encoding)
        stream = iter(jobs)
        head = list(islice(stream, COPY_MIN_ROWS))
        copies = can_copy(conn)
        if copies and len(head) == COPY_MIN_ROWS and all(is_plain(job) for job in head):
            return await self._insert_streamed(tx, head, stream, notify)
        head.extend(stream)
        return await self._insert_listed(tx, head, notify)

    async def _insert_plain(
        self, tx: TransactionHandle, job: NewJob, notify: NotifyAdapter | None
    ) -> list[InsertedJob]:
        """One plain job, the commonest enqueue: one statement that also announces its
        queue, and nothing else to decide.

        On psycopg's connection the statement runs on a cursor kept on the connection
        (``kept_cursor``), and errors are translated here rather than by
        ``translate_errors``' generator: a single ``start_chain`` is measured against a
        bare ``INSERT``, and each call on its path costs several times what it costs in
        a warm loop, since the caches are cold after every round trip.
        """
        conn = tx.connection if isinstance(tx, PgTransaction) else await unwrap(tx)
        require_transaction(conn)
        encoding = narrow_encoding(conn)
        if encoding is not None:
            check_encodable([job], encoding)
        channel = notify.channel if isinstance(notify, PostgresNotifyAdapter) else None
        query, params = plain_job_statement(self.statements.enqueue, job, channel=channel)
        try:
            if isinstance(conn, psycopg.AsyncConnection):
                await kept_cursor(conn).execute(query, params)
            else:
                await conn.execute(query, params)
        except Exception as exc:
            missing = missing_schema(exc, self.schema)
            if missing is not None:
                raise missing from exc
            raise
        if notify is not None and channel is None:
            await notify.publish(tx, notices=[Notice(kind="ready", queue=job.queue, count=1)])
        return [InsertedJob(job.id, job.chain_id, _PENDING, False)]

    async def _insert_streamed(
        self,
        tx: TransactionHandle,
        head: list[NewJob],
        rest: Iterator[NewJob],
        notify: NotifyAdapter | None,
    ) -> list[InsertedJob]:
        """A batch that starts with plain jobs: COPY them as the client builds them, then
        insert the few set aside (deduplicated, blocked or scheduled) the usual way."""
        conn = await unwrap(tx)
        channel = notify.channel if isinstance(notify, PostgresNotifyAdapter) else None
        ready = ready_queues(head) if notify is not None else []
        streamed = await insert_streamed(
            conn, self.statements.enqueue, self.schema, head, rest, channel=channel, ready=ready
        )
        if streamed.aside:
            later = iter(await self._insert_listed(tx, streamed.aside, notify))
            results = [result or next(later) for result in streamed.inserted]
        else:  # nothing set aside: no result is None
            results = cast("list[InsertedJob]", streamed.inserted)
        late = streamed.queues.difference(ready if channel is not None else ())
        if notify is not None and late:
            await notify.publish(tx, notices=[Notice(kind="ready", queue=q) for q in sorted(late)])
        return results

    async def _insert_listed(
        self,
        tx: TransactionHandle,
        jobs: Sequence[NewJob],
        notify: NotifyAdapter | None,
    ) -> list[InsertedJob]:
        conn = await unwrap(tx)
        results: list[InsertedJob | None] = [None] * len(jobs)
        fresh = jobs
        if any(job.dedup for job in jobs):
            await self._deduplicate(conn, jobs, results)
            fresh = [job for job, result in zip(jobs, results, strict=True) if result is None]
        waiting: list[NewJob] = []
        if any(job.wait_signal is not None for job in fresh):
            waiting = [job for job in fresh if job.wait_signal is not None]
            fresh = [job for job in fresh if job.wait_signal is None]
            await insert_waiting(
                conn, self.statements.signals.insert_waiting_jobs, self.schema, waiting
            )
        blocked = [job for job in fresh if job.blockers]
        # Pending blocker roots, locked until commit: announced then (see LOCK_BLOCKER_CHAINS).
        skipped = await self._check_blockers(conn, blocked) if blocked else []
        ready = ready_queues(fresh) if notify is not None else []
        # The notices ride in the insert itself when they go to the same database.
        channel = notify.channel if isinstance(notify, PostgresNotifyAdapter) else None
        pending = JobStatus.PENDING  # an enum attribute lookup is slow, once per job
        inserted: list[InsertedJob] = []

        def fill() -> None:
            inserted.extend(
                result or InsertedJob(job.id, job.chain_id, pending, False)
                for job, result in zip(jobs, results, strict=True)
            )

        # Without blocked jobs every result is known before the rows are in: they are
        # built while the server finishes a COPY.
        announced = await write_jobs(
            conn,
            self.statements.enqueue,
            self.schema,
            fresh,
            channel=channel,
            ready=ready,
            meanwhile=None if blocked else fill,
        )
        settled: dict[UUID, JobStatus] = {}
        late: set[str] = set()
        resolution = Resolution()
        if blocked:
            # Blocked jobs whose blockers already ended are pending now; one scheduled
            # later has its due time in ``resolution.due``.
            resolution = await self._insert_blocker_edges(conn, blocked)
            for job in await self.get_jobs(tx, job_ids=[job.id for job in blocked]):
                settled[job.id] = job.status
            late = {
                job.queue
                for job in blocked
                if settled.get(job.id) is JobStatus.PENDING and not scheduled(job)
            }
        if notify is not None:
            if announced:
                notices = [Notice(kind="ready", queue=q) for q in sorted(late)]
            else:  # each queue with how many of its jobs are ready: that many may look
                notices = counted_ready(
                    [job.queue for job in fresh if not job.blockers and not scheduled(job)]
                    + [
                        job.queue
                        for job in blocked
                        if settled.get(job.id) is JobStatus.PENDING and not scheduled(job)
                    ]
                )
            notices += due_notices(fresh)
            notices += due_notices(waiting)  # the timeouts
            notices += ready_notices((), resolution.due)
            notices += skipped
            if notices:
                await notify.publish(tx, notices=notices)
        if not blocked and not waiting:
            return inserted
        for step in waiting:
            settled[step.id] = JobStatus.BLOCKED if step.run_after is None else pending
        return [
            result or InsertedJob(job.id, job.chain_id, settled.get(job.id, pending), False)
            for job, result in zip(jobs, results, strict=True)
        ]

    async def _deduplicate(
        self,
        conn: DbConn,
        jobs: Sequence[NewJob],
        results: list[InsertedJob | None],
    ) -> None:
        """Fill ``results`` for jobs that match an earlier chain (in the database or
        earlier in this batch). Holds a transaction-scoped lock per key until commit, so
        a concurrent enqueue of the same key waits and then sees this one. Only a READ
        COMMITTED transaction can see it then: at a higher level, IsolationLevelError
        before anything is written."""
        indexed: list[tuple[int, NewJob, DedupSpec]] = []
        for i, job in enumerate(jobs):
            if isinstance(job.dedup, DedupSpec):
                indexed.append((i, job, job.dedup))
            elif job.dedup is not None:
                raise ConfigurationError(
                    f"insert_jobs cannot debounce (job {job.id}, {job.dedup!r}): "
                    "a Debounce job goes to debounce_jobs"
                )
        keys = [f"{self.schema}\x1f{job.chain_type_name}\x1f{spec.key}" for _, job, spec in indexed]
        locked = await self._fetch(conn, self.statements.enqueue.lock_dedup_keys, {"keys": keys})
        if locked[0][0] not in _READ_COMMITTED:
            raise IsolationLevelError(locked[0][0])
        rows = await self._fetch(
            conn,
            self.statements.enqueue.find_dedup_matches,
            {
                "chain_type_names": [job.chain_type_name for _, job, _ in indexed],
                "keys": [spec.key for _, _, spec in indexed],
                "scopes": [spec.scope for _, _, spec in indexed],
                "windows": [
                    spec.window.total_seconds() if spec.window else None for _, _, spec in indexed
                ],
            },
        )
        matches = {int(ordinal) - 1: (chain_id, status) for ordinal, chain_id, status in rows}
        first_in_batch: dict[tuple[str, str], InsertedJob] = {}
        for position, (i, job, spec) in enumerate(indexed):
            key = (job.chain_type_name, spec.key)
            if position in matches:
                chain_id, status = matches[position]
                results[i] = InsertedJob(chain_id, chain_id, JobStatus(status), deduplicated=True)
            elif key in first_in_batch:
                earlier = first_in_batch[key]
                results[i] = InsertedJob(earlier.job_id, earlier.chain_id, earlier.status, True)
            else:
                first_in_batch[key] = InsertedJob(job.id, job.chain_id, JobStatus.PENDING, False)


def scheduled(job: NewJob) -> bool:
    """A job that waits for a time of its own (``run_at`` / ``run_after``), not for now."""
    return job.run_at is not None or job.run_after is not None
