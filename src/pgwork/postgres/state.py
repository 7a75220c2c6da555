"""The PostgreSQL state adapter: pgwork's job operations on psycopg.

One pool of autocommit connections serves the worker's own operations, so a
single-statement operation (acquire, renew, reap) is one round trip with no BEGIN or
COMMIT. Operations that take ``tx`` run on the caller's connection inside the caller's
transaction and never commit it.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from itertools import islice
from typing import Any, Self, cast
from uuid import UUID

import psycopg
from psycopg import errors as pg_errors
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool

from pgwork.adapters.notify import Notice, NotifyAdapter
from pgwork.adapters.state import (
    AcquiredJob,
    Completion,
    CompletionResult,
    Failure,
    InsertedJob,
    Lease,
    NewJob,
    ReapedJob,
    RenewResult,
    TransactionHandle,
)
from pgwork.postgres._chain_statements import render_chain_statements
from pgwork.postgres._chains import ChainOps
from pgwork.postgres._connect import connect
from pgwork.postgres._enqueue import (
    COPY_MIN_ROWS,
    insert_streamed,
    is_plain,
    ready_queues,
    write_jobs,
)
from pgwork.postgres._errors import translate_errors
from pgwork.postgres._insight import InsightOps
from pgwork.postgres._names import DEFAULT_SCHEMA, validate_schema_name
from pgwork.postgres._queries import QueryOps
from pgwork.postgres._registry import RegistryOps, render_registry_statements
from pgwork.postgres._rows import acquired_from_row, chain_from_row, job_from_row
from pgwork.postgres._statements import ATOMIC_REFUSED, render
from pgwork.postgres._transactions import PgTransaction, unwrap
from pgwork.postgres._verify import verify_schema
from pgwork.postgres.notify import PostgresNotifyAdapter, encode_notice
from pgwork.records import Chain, Job, JobStatus

__all__ = ["PostgresStateAdapter"]

_IDLE = TransactionStatus.IDLE

# An atomic attempt's transaction is ended by the server this long after its handler's
# deadline (once idle before PostgreSQL 17; in all, from 17 on).
_ATOMIC_SLACK = timedelta(seconds=5)

# The first server version whose transaction_timeout lets BEGIN and the row lock travel
# in one pipeline.
_PIPELINED_BEGIN_FROM = 170000


class PostgresStateAdapter(QueryOps, InsightOps, ChainOps, RegistryOps):
    """``StateAdapter`` over a psycopg ``AsyncConnectionPool``.

    Build one with ``await PostgresStateAdapter.connect(dsn)``, which checks the server
    is reachable and the schema is migrated before anything else runs; or wrap a pool
    you manage yourself (its connections must be in autocommit mode).
    """

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        *,
        schema: str = DEFAULT_SCHEMA,
        owns_pool: bool = False,
    ) -> None:
        self.schema = validate_schema_name(schema)
        self.pool = pool
        self._owns_pool = owns_pool
        self._sql = render(self.schema)
        self._csql = render_chain_statements(self.schema)
        self._rsql = render_registry_statements(self.schema)

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        min_size: int = 1,
        max_size: int = 10,
        verify: bool = True,
    ) -> Self:
        """Open a pool on ``dsn``; raises DatabaseUnreachableError / SchemaMissingError /
        SchemaOutdatedError with the next step in the message."""
        schema = validate_schema_name(schema)
        probe = await connect(dsn)
        try:
            if verify:
                await verify_schema(probe, schema)
        finally:
            await probe.close()
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            kwargs={"autocommit": True},
            open=False,
            name=f"pgwork-{schema}",
        )
        await pool.open(wait=True, timeout=30)
        return cls(pool, schema=schema, owns_pool=True)

    async def verify(self) -> None:
        async with self._pooled() as conn:
            await verify_schema(conn, self.schema)

    async def close(self) -> None:
        if self._owns_pool:
            await self.pool.close()

    @asynccontextmanager
    async def _pooled(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection from the pool. When it turns out broken (server restarted,
        backend terminated), every idle connection is checked at once: after a restart
        they are all dead, and the pool hands out each of them once more otherwise,
        each failing one worker turn while the worker's backoff keeps growing."""
        broken = False
        try:
            async with self.pool.connection() as conn:
                try:
                    yield conn
                finally:
                    broken = conn.broken
        finally:
            if broken:
                await self.pool.check()

    # --- transactions ------------------------------------------------------------------

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[TransactionHandle]:
        async with self._pooled() as conn, conn.transaction():
            yield PgTransaction(conn)

    @asynccontextmanager
    async def atomic_transaction(
        self, *, lease: Lease, deadline: timedelta
    ) -> AsyncIterator[TransactionHandle | None]:
        # Begun and ended by hand rather than with psycopg's transaction block:
        # ``complete_atomic`` commits in the same round trip as its completion, which
        # psycopg's block would not know about.
        async with self._pooled() as conn:
            try:
                if not await self._begin_and_lock(conn, lease, deadline):
                    await conn.execute(b"ROLLBACK")
                    yield None
                    return
                yield PgTransaction(conn)
            except BaseException:
                # Closed: discarded for an abandoned handler. Broken: it cannot roll
                # back, and the error worth raising is the one that got us here.
                if not conn.closed and conn.info.transaction_status != _IDLE:
                    with contextlib.suppress(psycopg.Error):
                        await conn.execute(b"ROLLBACK")
                raise
            if not conn.closed and conn.info.transaction_status != _IDLE:
                # (idle: complete_atomic has committed it already)
                await conn.execute(b"COMMIT")

    async def _begin_and_lock(
        self, conn: psycopg.AsyncConnection[Any], lease: Lease, deadline: timedelta
    ) -> bool:
        """BEGIN and lock the job's row: one round trip from PostgreSQL 17 on, two before.

        Either way the server ends the transaction of a worker that stops talking to
        it (frozen, paused): before 17 by the lock statement's local
        idle_in_transaction_session_timeout, which must not be pipelined (see
        BEGIN_ATOMIC_BOUNDED); from 17 by its local transaction_timeout.
        """
        if conn.info.server_version < _PIPELINED_BEGIN_FROM:
            await conn.execute(b"BEGIN")
            return await self.begin_atomic(PgTransaction(conn), lease=lease, deadline=deadline)
        with translate_errors(self.schema):
            async with conn.pipeline():
                await conn.execute(b"BEGIN")
                cur = conn.cursor()
                await cur.execute(self._sql.begin_atomic_bounded, _atomic_params(lease, deadline))
            return bool(await cur.fetchall())

    async def adopt(self, tx: object) -> TransactionHandle:
        return PgTransaction(await unwrap(tx))

    @asynccontextmanager
    async def _connection(
        self, tx: TransactionHandle | None
    ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        if tx is None:
            async with self._pooled() as conn:
                yield conn
        else:
            yield await unwrap(tx)

    async def _fetch(
        self, conn: psycopg.AsyncConnection[Any], query: bytes, params: Mapping[str, Any]
    ) -> list[tuple[Any, ...]]:
        with translate_errors(self.schema):
            async with conn.cursor() as cur:
                await cur.execute(query, params)
                # Not ``cur.description``: it builds a Column object per column.
                result = cur.pgresult
                return await cur.fetchall() if result is not None and result.nfields else []

    # --- enqueue -----------------------------------------------------------------------

    async def insert_jobs(
        self,
        tx: TransactionHandle,
        *,
        jobs: Iterable[NewJob],
        notify: NotifyAdapter | None = None,
    ) -> list[InsertedJob]:
        stream = iter(jobs)
        head = list(islice(stream, COPY_MIN_ROWS))
        if len(head) == COPY_MIN_ROWS and all(is_plain(job) for job in head):
            return await self._insert_streamed(tx, head, stream, notify)
        head.extend(stream)
        return await self._insert_listed(tx, head, notify)

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
            conn, self._sql, self.schema, head, rest, channel=channel, ready=ready
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
        blocked = [job for job in fresh if job.blockers]
        if blocked:
            await self._check_blockers(conn, blocked)
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
            self._sql,
            self.schema,
            fresh,
            channel=channel,
            ready=ready,
            meanwhile=None if blocked else fill,
        )
        settled: dict[UUID, JobStatus] = {}
        late: set[str] = set()
        if blocked:
            await self._insert_blocker_edges(conn, blocked)
            for job in await self.get_jobs(tx, job_ids=[job.id for job in blocked]):
                settled[job.id] = job.status
            late = {
                job.queue
                for job in blocked
                if settled.get(job.id) is JobStatus.PENDING and not _scheduled(job)
            }
        if notify is not None and (late or (ready and not announced)):
            queues = late if announced else late.union(ready)
            await notify.publish(
                tx, notices=[Notice(kind="ready", queue=q) for q in sorted(queues)]
            )
        if not blocked:
            return inserted
        return [
            result or InsertedJob(job.id, job.chain_id, settled.get(job.id, pending), False)
            for job, result in zip(jobs, results, strict=True)
        ]

    async def _deduplicate(
        self,
        conn: psycopg.AsyncConnection[Any],
        jobs: Sequence[NewJob],
        results: list[InsertedJob | None],
    ) -> None:
        """Fill ``results`` for jobs that match an earlier chain (in the database or
        earlier in this batch). Holds a transaction-scoped lock per key until commit, so
        a concurrent enqueue of the same key waits and then sees this one."""
        indexed = [(i, job) for i, job in enumerate(jobs) if job.dedup]
        keys = [
            f"{self.schema}\x1f{job.chain_type_name}\x1f{job.dedup.key}"
            for _, job in indexed
            if job.dedup
        ]
        await self._fetch(conn, self._sql.lock_dedup_keys, {"keys": keys})
        rows = await self._fetch(
            conn,
            self._sql.find_dedup_matches,
            {
                "chain_type_names": [job.chain_type_name for _, job in indexed],
                "keys": [job.dedup.key for _, job in indexed if job.dedup],
                "scopes": [job.dedup.scope for _, job in indexed if job.dedup],
                "windows": [
                    job.dedup.window.total_seconds() if job.dedup and job.dedup.window else None
                    for _, job in indexed
                ],
            },
        )
        matches = {int(ordinal) - 1: (chain_id, status) for ordinal, chain_id, status in rows}
        first_in_batch: dict[tuple[str, str], InsertedJob] = {}
        for position, (i, job) in enumerate(indexed):
            assert job.dedup is not None
            key = (job.chain_type_name, job.dedup.key)
            if position in matches:
                chain_id, status = matches[position]
                results[i] = InsertedJob(chain_id, chain_id, JobStatus(status), deduplicated=True)
            elif key in first_in_batch:
                earlier = first_in_batch[key]
                results[i] = InsertedJob(earlier.job_id, earlier.chain_id, earlier.status, True)
            else:
                first_in_batch[key] = InsertedJob(job.id, job.chain_id, JobStatus.PENDING, False)

    # --- worker operations -------------------------------------------------------------

    async def acquire(
        self,
        *,
        worker_id: str,
        leases: Mapping[str, timedelta],
        queues: Sequence[str] | None,
        limit: int,
    ) -> list[AcquiredJob]:
        if limit <= 0 or not leases:
            return []
        query, params = self._acquire_statement(
            worker_id,
            leases,
            queues,
            limit,
            by_queue=self._sql.acquire,
            any_queue=self._sql.acquire_any_queue,
        )
        async with self._pooled() as conn:
            rows = await self._fetch(conn, query, params)
        return [acquired_from_row(row) for row in rows]

    def _acquire_statement(
        self,
        worker_id: str,
        leases: Mapping[str, timedelta],
        queues: Sequence[str] | None,
        limit: int,
        *,
        by_queue: bytes,
        any_queue: bytes,
    ) -> tuple[bytes, dict[str, Any]]:
        """``by_queue`` (or ``any_queue`` when ``queues`` is None) with its limit written
        in, and the acquire's parameters."""
        params: dict[str, Any] = {
            "worker_id": worker_id,
            "type_names": list(leases),
            "lease_seconds": [d.total_seconds() for d in leases.values()],
        }
        if queues is None:
            return _with_limit(any_queue, limit), params
        params["queues"] = list(queues)
        return _with_limit(by_queue, limit), params

    async def complete_and_acquire(
        self,
        *,
        completions: Sequence[Completion],
        worker_id: str,
        leases: Mapping[str, timedelta],
        queues: Sequence[str] | None,
        limit: int,
    ) -> tuple[list[CompletionResult], list[AcquiredJob]]:
        if any(c.continuation for c in completions):
            raise ValueError("complete_and_acquire takes completions without continuation")
        if not completions:
            return [], await self.acquire(
                worker_id=worker_id, leases=leases, queues=queues, limit=limit
            )
        if limit <= 0 or not leases:
            return await self.complete(None, completions=completions), []
        query, params = self._acquire_statement(
            worker_id,
            leases,
            queues,
            limit,
            by_queue=self._sql.complete_and_acquire,
            any_queue=self._sql.complete_and_acquire_any_queue,
        )
        params.update(_completion_params(completions))
        async with self._pooled() as conn:
            rows = await self._fetch(conn, query, params)
        head = next(row for row in rows if row[0])
        completed_rows = [
            (job_id, chain_id, None, True, has_dependants, awaited)
            for job_id, chain_id, has_dependants, awaited in zip(
                head[1] or (), head[2] or (), head[3] or (), head[4] or (), strict=True
            )
        ]
        results = await self._completion_results(None, completions, completed_rows)
        return results, [acquired_from_row(row[5:]) for row in rows if not row[0]]

    async def begin_atomic(
        self, tx: TransactionHandle, *, lease: Lease, deadline: timedelta
    ) -> bool:
        conn = await unwrap(tx)
        rows = await self._fetch(conn, self._sql.begin_atomic, _atomic_params(lease, deadline))
        return bool(rows)

    async def renew(
        self, *, leases: Sequence[Lease], duration: Mapping[UUID, timedelta]
    ) -> list[RenewResult]:
        if not leases:
            return []
        params = {
            "ids": [lease.job_id for lease in leases],
            "tokens": [lease.lease_token for lease in leases],
            "seconds": [duration[lease.job_id].total_seconds() for lease in leases],
        }
        async with self._pooled() as conn:
            rows = await self._fetch(conn, self._sql.renew, params)
        return [
            RenewResult(
                job_id=job_id,
                lease_token=token,
                renewed=until is not None,
                leased_until=until,
                status=JobStatus(status) if status else None,
            )
            for job_id, token, until, status in rows
        ]

    async def complete(
        self,
        tx: TransactionHandle | None,
        *,
        completions: Sequence[Completion],
        notify: NotifyAdapter | None = None,
    ) -> list[CompletionResult]:
        if not completions:
            return []
        if tx is None and len(completions) == 1 and _plain_hand_on(completions[0]):
            return [await self._hand_on(completions[0], notify)]
        if tx is None and any(c.continuation for c in completions):
            async with self.transaction() as own:
                return await self.complete(own, completions=completions, notify=notify)
        async with self._connection(tx) as conn:
            if len(completions) == 1:
                [one] = completions
                rows = await self._fetch(
                    conn,
                    self._sql.complete_one,
                    {
                        "id": one.job_id,
                        "token": one.lease_token,
                        "output": one.output_json,
                        "ends_chain": one.continuation is None,
                    },
                )
            else:
                rows = await self._fetch(conn, self._sql.complete, _completion_params(completions))
        results = await self._completion_results(tx, completions, rows)
        if notify is not None:
            chain_ids = {row[0]: row[1] for row in rows}
            notices = [Notice(kind="ready", queue=q) for q in _ready_of(results)]
            notices += [
                Notice(kind="chain_done", chain_id=chain_ids[r.job_id])
                for r in results
                if r.chain_awaited
            ]
            if notices:
                await notify.publish(tx, notices=notices)
        return results

    async def _hand_on(
        self, completion: Completion, notify: NotifyAdapter | None
    ) -> CompletionResult:
        """Complete a job and insert its continuation in one statement, which also
        announces the continuation when ``notify`` shares this database; any other
        ``notify`` is told after the commit. The chain goes on: no dependant to settle,
        nobody to tell it ended."""
        following = completion.continuation
        assert following is not None
        runs_now = not _scheduled(following)
        channel = notify.channel if isinstance(notify, PostgresNotifyAdapter) else None
        ready = encode_notice(Notice(kind="ready", queue=following.queue))
        params = {
            "id": completion.job_id,
            "token": completion.lease_token,
            "output": completion.output_json,
            "ends_chain": False,
            "next_id": following.id,
            "next_type_name": following.type_name,
            "next_chain_id": following.chain_id,
            "next_chain_type_name": following.chain_type_name,
            "next_chain_index": following.chain_index,
            "next_input": following.input_json,
            "next_queue": following.queue,
            "next_priority": following.priority,
            "next_max_attempts": following.max_attempts,
            "next_run_at": following.run_at,
            "next_run_after": (
                following.run_after.total_seconds() if following.run_after else None
            ),
            "next_trace_context": (
                json.dumps(dict(following.trace_context)) if following.trace_context else None
            ),
            "channel": channel,
            "ready": ready if channel is not None and runs_now else None,
        }
        async with self._pooled() as conn:
            rows = await self._fetch(conn, self._sql.complete_and_continue, params)
        if not rows:
            return CompletionResult(job_id=completion.job_id, accepted=False)
        ready_queues = (following.queue,) if runs_now else ()
        if notify is not None and channel is None and ready_queues:
            await notify.publish(None, notices=[Notice(kind="ready", queue=following.queue)])
        return CompletionResult(
            job_id=completion.job_id,
            accepted=True,
            continuation_id=following.id,
            ready_queues=ready_queues,
        )

    async def complete_atomic(
        self, tx: TransactionHandle, *, completion: Completion
    ) -> CompletionResult:
        if completion.continuation is not None:
            raise ValueError("complete_atomic takes a completion without continuation")
        conn = await unwrap(tx)
        params = {
            "id": completion.job_id,
            "token": completion.lease_token,
            "output": completion.output_json,
            "ends_chain": True,
        }
        try:
            with translate_errors(self.schema):
                async with conn.pipeline():
                    cur = conn.cursor()
                    await cur.execute(self._sql.complete_atomic, params)
                    await conn.execute(b"COMMIT")
                rows = await cur.fetchall()
        except pg_errors.InvalidTextRepresentation as exc:
            if ATOMIC_REFUSED not in str(exc):
                raise
            # The statement failed on purpose: the transaction is aborted, and the
            # COMMIT behind it was never run. End it; nothing in it was written.
            await conn.execute(b"ROLLBACK")
            return CompletionResult(job_id=completion.job_id, accepted=False)
        # Committed: dependants are settled on their own, as for complete(None, ...).
        [result] = await self._completion_results(None, [completion], rows)
        return result

    async def _completion_results(
        self,
        tx: TransactionHandle | None,
        completions: Sequence[Completion],
        rows: Sequence[tuple[Any, ...]],
    ) -> list[CompletionResult]:
        """Insert the accepted completions' continuations, settle dependants of chains
        that ended, and say what each completion did."""
        # id -> (chain_id, ends_chain, has_dependants, awaited)
        accepted = {row[0]: (row[1], bool(row[3]), bool(row[4]), bool(row[5])) for row in rows}
        continuations = [
            c.continuation for c in completions if c.continuation and c.job_id in accepted
        ]
        if continuations:
            assert tx is not None
            await self.insert_jobs(tx, jobs=continuations)
        ended_with_dependants = [v[0] for v in accepted.values() if v[1] and v[2]]
        resolution = await self.resolve_dependants(tx, chain_ids=ended_with_dependants)
        unblocked = tuple(sorted(set(resolution.ready_queues)))
        results = []
        for c in completions:
            found = accepted.get(c.job_id)
            if found is None:
                results.append(CompletionResult(job_id=c.job_id, accepted=False))
                continue
            chain_id, ends, _, awaited = found
            ready_queues = unblocked
            if c.continuation and not _scheduled(c.continuation):
                ready_queues = tuple(sorted({c.continuation.queue, *unblocked}))
            results.append(
                CompletionResult(
                    job_id=c.job_id,
                    accepted=True,
                    chain_completed=ends,
                    continuation_id=c.continuation.id if c.continuation else None,
                    ready_queues=ready_queues,
                    chain_awaited=awaited or chain_id in resolution.awaited_chain_ids,
                )
            )
        return results

    async def fail(
        self, tx: TransactionHandle | None, *, failures: Sequence[Failure]
    ) -> list[bool]:
        if not failures:
            return []
        async with self._connection(tx) as conn:
            rows = await self._fetch(
                conn,
                self._sql.fail,
                {
                    "ids": [f.job_id for f in failures],
                    "tokens": [f.lease_token for f in failures],
                    "errors": [json.dumps(f.error.to_json()) for f in failures],
                    "retry_seconds": [
                        f.retry_after.total_seconds() if f.retry_after is not None else None
                        for f in failures
                    ],
                },
            )
        done = {row[0] for row in rows}
        await self.resolve_dependants(tx, chain_ids=[row[1] for row in rows if row[2]])
        return [f.job_id in done for f in failures]

    async def reschedule(
        self,
        tx: TransactionHandle | None,
        *,
        lease: Lease,
        run_at: datetime | None,
        run_after: timedelta | None,
        count_attempt: bool,
    ) -> bool:
        params = {
            "job_id": lease.job_id,
            "lease_token": lease.lease_token,
            "run_at": run_at,
            "run_after": run_after.total_seconds() if run_after is not None else None,
            "count_attempt": count_attempt,
        }
        async with self._connection(tx) as conn:
            rows = await self._fetch(conn, self._sql.reschedule, params)
        return bool(rows)

    async def release(self, *, leases: Sequence[Lease]) -> int:
        if not leases:
            return 0
        async with self._pooled() as conn:
            rows = await self._fetch(
                conn,
                self._sql.release,
                {
                    "ids": [lease.job_id for lease in leases],
                    "tokens": [lease.lease_token for lease in leases],
                },
            )
        return len(rows)

    async def reap(
        self,
        *,
        type_names: Sequence[str],
        exclude_worker: str,
        limit: int = 1,
        dead_workers: Sequence[str] = (),
        held: Sequence[UUID] | None = None,
    ) -> list[ReapedJob]:
        if not type_names and not dead_workers:
            return []
        params = {
            "type_names": list(type_names),
            "worker_id": exclude_worker,
            "limit": limit,
            "dead_workers": list(dead_workers),
            "held": list(held) if held is not None else None,
        }
        async with self._pooled() as conn:
            rows = await self._fetch(conn, self._sql.reap, params)
        await self.resolve_dependants(None, chain_ids=[r[5] for r in rows if r[6]])
        return [
            ReapedJob(
                job_id=r[0], type_name=r[1], leased_by=r[2], attempt=r[3], status=JobStatus(r[4])
            )
            for r in rows
        ]

    # --- reads -------------------------------------------------------------------------

    async def get_jobs(
        self, tx: TransactionHandle | None, *, job_ids: Sequence[UUID]
    ) -> list[Job[Any]]:
        async with self._connection(tx) as conn:
            rows = await self._fetch(conn, self._sql.get_jobs, {"ids": list(job_ids)})
        return [job_from_row(row) for row in rows]

    async def get_chains(
        self, tx: TransactionHandle | None, *, chain_ids: Sequence[UUID]
    ) -> list[Chain]:
        async with self._connection(tx) as conn:
            rows = await self._fetch(conn, self._sql.get_chains, {"ids": list(chain_ids)})
        return [chain_from_row(row) for row in rows]

    async def list_chain_jobs(
        self, tx: TransactionHandle | None, *, chain_id: UUID
    ) -> list[Job[Any]]:
        async with self._connection(tx) as conn:
            rows = await self._fetch(conn, self._sql.list_chain_jobs, {"chain_id": chain_id})
        return [job_from_row(row) for row in rows]


@functools.lru_cache(maxsize=256)
def _with_limit(query: bytes, limit: int) -> bytes:
    """``query`` with its ``LIMIT`` written in, one text per limit.

    A bound ``LIMIT`` makes PostgreSQL's generic plan assume a tenth of the queue is
    wanted, so it re-plans the statement on every call (about a millisecond of server
    CPU per acquire); with the number in the text each variant keeps one cached plan.
    A worker only ever asks for 1..2*max_slots jobs, so there are few variants.
    """
    return query.replace(b"%(limit)s", str(int(limit)).encode())


def _atomic_params(lease: Lease, deadline: timedelta) -> dict[str, Any]:
    return {
        "job_id": lease.job_id,
        "lease_token": lease.lease_token,
        # Slack over the handler deadline: the worker's own timeout fires first; the
        # server's only ends transactions of a stuck process.
        "idle_ms": str(int((deadline + _ATOMIC_SLACK).total_seconds() * 1000)),
    }


def _completion_params(completions: Sequence[Completion]) -> dict[str, list[Any]]:
    return {
        "ids": [c.job_id for c in completions],
        "tokens": [c.lease_token for c in completions],
        "outputs": [c.output_json for c in completions],
        "ends_chain": [c.continuation is None for c in completions],
    }


def _plain_hand_on(completion: Completion) -> bool:
    """A completion whose continuation ``COMPLETE_AND_CONTINUE`` can insert: a later job
    of the chain with no blocker and no dedup key (what a worker's ``Continue`` makes)."""
    following = completion.continuation
    return (
        following is not None
        and following.id != following.chain_id
        and not following.blockers
        and following.dedup is None
    )


def _ready_of(results: Sequence[CompletionResult]) -> list[str]:
    """Every queue some result made ready, once."""
    return sorted({q for r in results for q in r.ready_queues})


def _scheduled(job: NewJob) -> bool:
    return job.run_at is not None or job.run_after is not None
