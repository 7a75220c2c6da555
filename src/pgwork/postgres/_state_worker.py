"""PostgreSQL side of the ``WorkerStore`` role, bar completing: leases and their ends.

Acquire (alone or with the previous batch's completions, in one statement), renew,
fail, reschedule, release, reap, and the transaction of an atomic attempt (and its
loan to a sync handler's thread, ``_loan``). Completions
live in ``_state_complete``. Mixed into ``PostgresStateAdapter`` (``state.py``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import anyio
import psycopg
from psycopg.pq import TransactionStatus

from pgwork.adapters.state import (
    AcquiredJob,
    Completion,
    CompletionResult,
    Failure,
    Lease,
    LimitedTurn,
    ReapedJob,
    RenewResult,
    TransactionHandle,
    TransactionLoan,
    TypeLimits,
)
from pgwork.errors import DatabaseTimeoutError
from pgwork.postgres._arrays import (
    completion_arrays,
    floats,
    ints,
    optional_floats,
    texts,
    turn_constants,
    uuids,
)
from pgwork.postgres._atomic_group import PgAtomicGroup, atomic_params
from pgwork.postgres._callers import DbConn, to_numbered
from pgwork.postgres._errors import translate_errors
from pgwork.postgres._pool import bounded, check_soon
from pgwork.postgres._rows import acquired_from_rows
from pgwork.postgres._state_complete import CompletionOps, mark_deferred
from pgwork.postgres._storable import storable
from pgwork.postgres._transactions import BEGIN_READ_COMMITTED, PgTransaction, own_connection
from pgwork.postgres.sql.limits import OPENS, WAITED, LimitStatements, variant
from pgwork.records import AttemptError, JobStatus

__all__ = ["WorkerOps"]

_IDLE = TransactionStatus.IDLE

# The first server version whose transaction_timeout lets BEGIN and the attempt's first
# statement travel in one pipeline.
_PIPELINED_BEGIN_FROM = 170000


class WorkerOps(CompletionOps):
    """Acquire, renew, fail, reschedule, release, reap; atomic transactions."""

    @asynccontextmanager
    async def atomic_transaction(
        self, *, lease: Lease, deadline: timedelta
    ) -> AsyncIterator[TransactionHandle | None]:
        # Begun and ended by hand rather than with psycopg's transaction block:
        # ``complete_atomic`` commits in the same round trip as its completion, which
        # psycopg's block would not know about. The connection is borrowed by hand too:
        # the handle's ``discard`` (for a handler given up on) returns it to the pool
        # at once, while the handler's coroutine, still inside this block, may live on
        # for ever. With ``pool.connection()`` it stayed checked out until then, and
        # enough hung handlers starved every other statement of the worker.
        conn = await self.pool.getconn()
        returned = False

        async def give_back() -> None:
            nonlocal returned
            if not returned:
                returned = True
                broken = conn.broken
                await self.pool.putconn(conn)
                if broken:
                    check_soon(self.pool)

        # Each statement of the worker's own in it is bounded (``operation_timeout``):
        # one without an answer closes the connection (see ``_pool.bounded``).
        bound = self.operation_timeout
        try:
            async with bounded(conn, bound, "an atomic attempt's BEGIN"):
                locked = await self._begin_and_lock(conn, lease, deadline)
            if not locked:
                async with bounded(conn, bound):
                    await conn.execute(b"ROLLBACK")
                yield None
                return
            yield PgTransaction(conn, give_back, bound)
        except BaseException:
            # Closed: discarded for an abandoned handler. Broken: it cannot roll
            # back, and the error worth raising is the one that got us here.
            if not conn.closed and conn.info.transaction_status != _IDLE:
                with contextlib.suppress(psycopg.Error, DatabaseTimeoutError):
                    async with bounded(conn, bound):
                        await conn.execute(b"ROLLBACK")
            raise
        else:
            if not conn.closed and conn.info.transaction_status != _IDLE:
                # (idle: complete_atomic has committed it already)
                async with bounded(conn, bound, "an atomic attempt's COMMIT"):
                    await conn.execute(b"COMMIT")
        finally:
            await give_back()

    async def open_atomic_group(self) -> PgAtomicGroup:
        # Borrowed by hand, as for ``atomic_transaction``: a member's handler given up
        # on closes the connection, which then counts as returned at once.
        conn = await self.pool.getconn()
        returned = False

        async def give_back() -> None:
            nonlocal returned
            if not returned:
                returned = True
                broken = conn.broken or conn.closed
                await self.pool.putconn(conn)
                if broken:
                    check_soon(self.pool)

        return PgAtomicGroup(self, conn, give_back)

    async def _begin_and_lock(
        self, conn: psycopg.AsyncConnection[Any], lease: Lease, deadline: timedelta
    ) -> bool:
        """BEGIN and check the lease: one round trip from PostgreSQL 17 on, two before.

        Either way the server ends the transaction of a worker that stops talking to
        it (frozen, paused): before 17 by the check statement's local
        idle_in_transaction_session_timeout, which must not be pipelined (see
        BEGIN_ATOMIC_BOUNDED); from 17 by its local transaction_timeout.
        """
        if conn.info.server_version < _PIPELINED_BEGIN_FROM:
            await conn.execute(BEGIN_READ_COMMITTED)
            return await self.begin_atomic(PgTransaction(conn), lease=lease, deadline=deadline)
        with translate_errors(self.schema):
            async with conn.pipeline():
                await conn.execute(BEGIN_READ_COMMITTED)
                cur = conn.cursor()
                await cur.execute(
                    self.statements.leases.begin_atomic_bounded, atomic_params(lease, deadline)
                )
            return bool(await cur.fetchall())

    async def acquire(
        self,
        *,
        worker_id: str,
        leases: Mapping[str, timedelta],
        queues: Sequence[str] | None,
        limit: int,
    ) -> list[AcquiredJob]:
        jobs: list[AcquiredJob] = []
        for _ in range(_ACQUIRES_AFTER_A_MISS + 1):
            if limit - len(jobs) <= 0 or not leases:
                break
            query = self._acquire_query(
                queues,
                limit - len(jobs),
                by_queue=self.statements.leases.acquire,
                any_queue=self.statements.leases.acquire_any_queue,
            )
            async with self._pooled() as conn:
                params = _turn_params(conn, worker_id, leases, queues)
                rows = await _fetch_turn(conn, query, params, self.schema)
            if not _add_acquired(jobs, rows):
                break
        return jobs

    def _acquire_query(
        self, queues: Sequence[str] | None, limit: int, *, by_queue: bytes, any_queue: bytes
    ) -> bytes:
        """``by_queue`` (or ``any_queue`` when ``queues`` is None) with its limit written
        in."""
        return _with_limit(any_queue if queues is None else by_queue, limit)

    async def next_due(
        self,
        *,
        type_names: Sequence[str],
        queues: Sequence[str],
        missed_after: float | None = None,
    ) -> float | None:
        if not type_names or not queues:
            return None
        async with self._pooled() as conn:
            # Reckoned once the connection is in hand: waiting for one is part of the gap.
            since = 0.0
            if missed_after is not None and math.isfinite(missed_after):
                since = max(time.monotonic() - missed_after, 0.0)
            params = {"type_names": list(type_names), "queues": list(queues), "since": since}
            [(seconds,)] = await self._fetch(conn, self.statements.leases.next_due, params)
        return None if seconds is None else max(float(seconds), 0.0)

    async def complete_and_acquire(
        self,
        *,
        completions: Sequence[Completion],
        worker_id: str,
        leases: Mapping[str, timedelta],
        queues: Sequence[str] | None,
        limit: int,
    ) -> tuple[list[CompletionResult], list[AcquiredJob]]:
        if any(c.continuation or c.children for c in completions):
            raise ValueError(
                "complete_and_acquire takes completions without continuation or children"
            )
        if not completions:
            return [], await self.acquire(
                worker_id=worker_id, leases=leases, queues=queues, limit=limit
            )
        if limit <= 0 or not leases:
            return await self.complete(None, completions=completions), []
        query = self._acquire_query(
            queues,
            limit,
            by_queue=self.statements.outcomes.complete_and_acquire,
            any_queue=self.statements.outcomes.complete_and_acquire_any_queue,
        )
        async with self._pooled() as conn:
            params = _turn_params(conn, worker_id, leases, queues)
            with storable(completions):
                params.update(completion_arrays(completions, conn.info.encoding))
                rows = await _fetch_turn(conn, query, params, self.schema)
        results, acquired, missed = await self._turn_outcome(completions, rows)
        if missed:
            acquired += await self.acquire(
                worker_id=worker_id, leases=leases, queues=queues, limit=limit - len(acquired)
            )
        return results, acquired

    async def _turn_outcome(
        self, completions: Sequence[Completion], rows: Sequence[Sequence[Any]]
    ) -> tuple[list[CompletionResult], list[AcquiredJob], bool]:
        """What a turn's ``rows`` say: the completions' results (from the head row), the
        jobs acquired, and whether candidates were locked but missed (see ``_add_acquired``)."""
        head = next(row for row in rows if row[0])
        # What ``_completion_results`` makes of completed rows, straight from the head's
        # arrays (every completion here ends its chain's step; a NULL flag is false).
        accepted = {
            job_id.int: (chain_id, True, has_dependants is True, awaited is True)
            for job_id, chain_id, has_dependants, awaited in zip(
                head[1] or (), head[2] or (), head[3] or (), head[4] or (), strict=True
            )
        }
        results = await self._completion_results(None, completions, (), accepted=accepted)
        if head[5]:
            results = mark_deferred(results, head[5])
        acquired: list[AcquiredJob] = []
        missed = _add_acquired(acquired, [row for row in rows if not row[0]], skip=6)
        return results, acquired, missed

    async def acquire_limited(
        self,
        *,
        completions: Sequence[Completion],
        worker_id: str,
        leases: Mapping[str, timedelta],
        queues: Sequence[str],
        limit: int,
        limits: Mapping[str, TypeLimits],
        expect_short: bool = True,
        freed: Sequence[tuple[str, str]] = (),
    ) -> LimitedTurn:
        if any(c.continuation or c.children for c in completions):
            raise ValueError("acquire_limited takes completions without continuation or children")
        if limit <= 0 or not leases:
            written = await self.complete(None, completions=completions) if completions else []
            return LimitedTurn(written, [])
        statements = self.statements.limits
        kinds = _kinds(leases, limits)
        # Without the marks a short acquire leaves, unless it is expected to come back
        # short: one that does anyway is followed at once by one with them.
        shared = "whole" in kinds or "keyed" in kinds
        marks = expect_short or not shared
        chosen = (
            statements.complete_and_acquire_limited if completions else statements.acquire_limited
        )
        query = _with_limit(chosen[_statement(kinds, marks)], limit)
        results: list[CompletionResult] = []
        acquired: list[AcquiredJob] = []
        waited_for: set[str] = set()
        opens_at: datetime | None = None
        asked = limit
        misses = 0
        while True:
            async with self._pooled() as conn:
                params = _turn_params(conn, worker_id, leases, queues)
                params.update(_limit_params(leases, limits, conn.info.encoding))
                params["freed_types"] = texts([name for name, _ in freed], conn.info.encoding)
                params["freed_groups"] = texts([key for _, key in freed], conn.info.encoding)
                with storable(completions):
                    if completions:
                        params.update(completion_arrays(completions, conn.info.encoding))
                    rows, waited, opens = await _fetch_limited_turn(
                        conn,
                        statements,
                        query,
                        params,
                        self.schema,
                        marks=marks,
                        skip=6 if completions else 0,
                        rated="rated" in kinds,
                    )
            waited_for.update(waited)
            if opens is not None:
                opens_at = opens if opens_at is None else min(opens_at, opens)
            if completions:
                results, acquired, missed = await self._turn_outcome(completions, rows)
            else:
                missed = _add_acquired(acquired, rows)
            completions = ()
            limit = asked - len(acquired)  # ``acquired`` holds every try's jobs
            if limit <= 0:
                break
            if missed and misses < _ACQUIRES_AFTER_A_MISS:
                misses += 1
            elif not marks:
                marks = True
            else:
                break
            query = _with_limit(statements.acquire_limited[_statement(kinds, marks)], limit)
        return LimitedTurn(results, acquired, frozenset(waited_for), opens_at)

    def lend_transaction(
        self, tx: TransactionHandle, *, check: Callable[[], None]
    ) -> TransactionLoan:
        # The handle's own connection, as a blocking one (``_loan``); ``own_connection``
        # refuses a caller's transaction, which is not the worker's to lend.
        own_connection(tx)
        assert isinstance(tx, PgTransaction)
        return tx.lend(check)

    async def begin_atomic(
        self, tx: TransactionHandle, *, lease: Lease, deadline: timedelta
    ) -> bool:
        conn = own_connection(tx)
        rows = await self._fetch(
            conn, self.statements.leases.begin_atomic, atomic_params(lease, deadline)
        )
        return bool(rows)

    async def renew(
        self, *, leases: Sequence[Lease], duration: Mapping[UUID, timedelta]
    ) -> list[RenewResult]:
        if not leases:
            return []
        # Binary arrays, built here: psycopg's list dumper formats every uuid as text,
        # and a worker renews every job it holds (up to twice its slots) at once.
        params = {
            "ids": uuids([lease.job_id for lease in leases]),
            "tokens": uuids([lease.lease_token for lease in leases]),
            "seconds": floats([duration[lease.job_id].total_seconds() for lease in leases]),
        }
        # On the adapter's own connection, as heartbeats, never a pooled one: atomic
        # attempts, whose leases this renews too, hold a pooled connection each for
        # their handlers' whole run and may hold them all, and after an outage the
        # pool replaces its lost connections only as its reconnection backoff allows.
        # Either way a renewal waiting for a pooled connection lost every lease.
        async with self._own_line() as conn:
            rows = await self._fetch(conn, self.statements.leases.renew, params)
        return [
            RenewResult(
                job_id=job_id,
                lease_token=token,
                renewed=until is not None,
                leased_until=until,
                status=JobStatus(status) if status else None,
                deferred=deferred,
            )
            for job_id, token, until, status, deferred in rows
        ]

    async def renew_in_line(
        self, *, lease: Lease, duration: timedelta, wait: timedelta
    ) -> RenewResult:
        params = {
            "id": lease.job_id,
            "token": lease.lease_token,
            "seconds": duration.total_seconds(),
            "wait_ms": str(max(1, round(wait.total_seconds() * 1000))),
        }
        # A connection of its own, opened for the wait and closed after it: the wait may
        # last as long as the caller holds the row, and no other statement may queue
        # behind it (the adapter's own line carries every other lease's renewal).
        line = None
        try:
            with anyio.fail_after(wait.total_seconds() + (self.operation_timeout or 60.0)):
                line = await self._open_line()
                async with line.transaction():
                    await self._fetch(line, self.statements.leases.take_lease_line, params)
                    renewed = await self._fetch(line, self.statements.leases.renew_in_line, params)
                    found = renewed or await self._fetch(
                        line, self.statements.leases.job_status, params
                    )
        except psycopg.errors.LockNotAvailable:
            # Still held when the wait ran out: the lease stays as it was.
            return RenewResult(lease.job_id, lease.lease_token, False, None, None, deferred=True)
        finally:
            if line is not None:
                with anyio.CancelScope(shield=True):
                    await line.close()
        if renewed:
            [(until,)] = renewed
            return RenewResult(lease.job_id, lease.lease_token, True, until, JobStatus.RUNNING)
        status = JobStatus(found[0][0]) if found else None
        return RenewResult(lease.job_id, lease.lease_token, False, None, status)

    async def fail(
        self, tx: TransactionHandle | None, *, failures: Sequence[Failure]
    ) -> list[bool]:
        if not failures:
            return []
        async with self._connection(tx) as conn:
            rows = await self._fetch(
                conn,
                self.statements.outcomes.fail,
                {
                    "ids": [f.job_id for f in failures],
                    "tokens": [f.lease_token for f in failures],
                    "errors": [_error_json(f.error, _codec(conn)) for f in failures],
                    "retry_seconds": [
                        f.retry_after.total_seconds() if f.retry_after is not None else None
                        for f in failures
                    ],
                    "ran_for": [
                        f.ran_for.total_seconds() if f.ran_for is not None else None
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
            rows = await self._fetch(conn, self.statements.outcomes.reschedule, params)
        return bool(rows)

    async def release(self, *, leases: Sequence[Lease]) -> int:
        if not leases:
            return 0
        async with self._pooled() as conn:
            rows = await self._fetch(
                conn,
                self.statements.leases.release,
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
            # (As a binary array: a busy worker's reaper sends every lease it holds,
            # twice a second, and psycopg's list dumper formats each uuid as text.)
            "held": uuids(list(held)) if held is not None else None,
        }
        async with self._pooled() as conn:
            rows = await self._fetch(conn, self.statements.leases.reap, params)
        await self.resolve_dependants(None, chain_ids=[r[5] for r in rows if r[6]])
        return [
            ReapedJob(
                job_id=r[0], type_name=r[1], leased_by=r[2], attempt=r[3], status=JobStatus(r[4])
            )
            for r in rows
        ]


def _codec(conn: DbConn) -> str:
    """The Python codec of ``conn``'s encoding (UTF-8 when it does not say)."""
    info = getattr(conn, "info", None)
    return getattr(info, "encoding", None) or "utf-8"


def _error_json(error: AttemptError, codec: str) -> str:
    """``error`` as the JSON text of ``last_attempt_error``. The server turns each
    ``\\uXXXX`` escape into its own encoding, and fails the write on a character that
    encoding lacks (a handler's message with "€" in a LATIN1 database): such
    characters are written as ``\\uXXXX`` text instead, so a failure is always
    recorded."""
    data = error.to_json()
    if codec != "utf-8":
        data = {
            key: value.encode(codec, "backslashreplace").decode(codec)
            if isinstance(value, str)
            else value
            for key, value in data.items()
        }
    return json.dumps(data)


# How many more acquires follow one whose lease missed candidates (see ``_LEASE`` in
# ``sql.leases``): each needs a write to a pending row committed in the instant
# between its statement's snapshot and its row lock.
_ACQUIRES_AFTER_A_MISS = 3


def _add_acquired(jobs: list[AcquiredJob], rows: Sequence[Sequence[Any]], skip: int = 0) -> bool:
    """Append the jobs of an acquire's ``rows`` (their first ``skip`` columns left out)
    to ``jobs``; True if they end with the marker of candidates it locked but could not
    lease (a row whose id is NULL): those are pending again, and another acquire can
    take them."""
    leased = [row for row in rows if row[skip] is not None]
    jobs += acquired_from_rows(leased, skip)
    return len(leased) < len(rows)


@functools.lru_cache(maxsize=256)
def _with_limit(query: bytes, limit: int) -> bytes:
    """``query`` with its ``LIMIT`` written in, one text per limit.

    A bound ``LIMIT`` makes PostgreSQL's generic plan assume a tenth of the queue is
    wanted, so it re-plans the statement on every call (about a millisecond of server
    CPU per acquire); with the number in the text each variant keeps one cached plan.
    A worker only ever asks for 1..2*max_slots jobs, so there are few variants.
    """
    return query.replace(b"%(limit)s", str(int(limit)).encode())


async def _fetch_turn(
    conn: psycopg.AsyncConnection[Any], query: bytes, params: Mapping[str, Any], schema: str
) -> list[tuple[Any, ...]]:
    """The rows of an acquire statement, sent with ``$n`` placeholders and read in
    binary.

    psycopg parses a statement's ``%(name)s`` placeholders on every call once its text
    is longer than 4 KiB (shorter ones it caches), and the turn statement is: that
    parse cost more than a job's share of the turn at fifty jobs a turn. Numbered once
    (``to_numbered``, cached like the limit's variants), it goes through a raw cursor
    as it is. Binary uuids, integers and timestamps load faster than their text; the
    values are the same (``python -m bench.cpu --only drain`` measures both)."""
    numbered, names = _numbered(query)
    with translate_errors(schema):
        async with psycopg.AsyncRawCursor(conn) as cur:
            await cur.execute(numbered, [params[name] for name in names], binary=True)
            rows: list[tuple[Any, ...]] = await cur.fetchall()
    return rows


@functools.lru_cache(maxsize=256)
def _numbered(query: bytes) -> tuple[bytes, tuple[str, ...]]:
    text, names = to_numbered(query)
    return text.encode(), names


async def _fetch_limited_turn(
    conn: psycopg.AsyncConnection[Any],
    statements: LimitStatements,
    query: bytes,
    params: Mapping[str, Any],
    schema: str,
    *,
    marks: bool,
    skip: int,
    rated: bool = False,
) -> tuple[list[tuple[Any, ...]], list[str], datetime | None]:
    """The rows of a limited acquire, the types with room that a worker waits for
    (``sql.limits.CLEAR_WAITING``), and when a limit may next let a job start
    (``sql.limits.OPENS``, after a short acquire): its types' locks (none for a worker's own caps
    alone), the acquire, then the marks, sent as one pipeline (one round trip). The
    locks come in a statement of their own so that the acquire's snapshot is taken once
    they are held (see ``sql.limits``). On the adapter's autocommit connections the
    statements share the implicit transaction a pipeline's statements run in until its
    sync, which commits them together: the locks are held until the leases are
    committed, with no BEGIN or COMMIT to send.

    An acquire without the ``marks`` leaves ``CLEAR_WAITING`` out, unless its rows say
    a worker waits for one of its types (``sql.limits.WAITED``, in the type column of
    the acquired rows, which start at ``skip``): then it is sent after them, in the
    same transaction (a second round trip, only then).

    An acquire of a type with a rate (``rated``) sends ``AWAIT_OPENING`` first, in the
    same pipeline: it waits, holding no lock, for a window about to open (see
    ``sql.limits``)."""
    numbered, names = _numbered(query)
    clear, clear_names = _numbered(statements.clear_waiting)
    lock, lock_names = _numbered(statements.lock_types)
    waited: list[str] = []
    with translate_errors(schema):
        async with conn.pipeline():
            if rated:
                opening, opening_names = _numbered(statements.await_opening)
                waits = psycopg.AsyncRawCursor(conn)
                await waits.execute(opening, [params[name] for name in opening_names], binary=True)
            locks = psycopg.AsyncRawCursor(conn)
            await locks.execute(lock, [params[name] for name in lock_names], binary=True)
            cur = psycopg.AsyncRawCursor(conn)
            await cur.execute(numbered, [params[name] for name in names], binary=True)
            marked = psycopg.AsyncRawCursor(conn)
            if marks:
                await marked.execute(clear, [params[name] for name in clear_names], binary=True)
            rows: list[tuple[Any, ...]] = await cur.fetchall()
            markers = {r[skip + 1]: r for r in rows if r[skip] is None and r[skip + 1]}
            if markers:
                rows = [r for r in rows if r[skip] is not None or not r[skip + 1]]
            if not marks and WAITED in markers:
                await marked.execute(clear, [params[name] for name in clear_names], binary=True)
                marks = True
            if marks:
                waited = [name for (name,) in await marked.fetchall()]
    opens = markers.get(OPENS)
    return rows, waited, None if opens is None else opens[skip + 11]


@functools.lru_cache(maxsize=64)
def _kinds_of(leases: tuple[str, ...], limits: tuple[tuple[str, TypeLimits], ...]) -> str:
    by_name = dict(limits)
    kinds = set()
    for name in leases:
        found = by_name.get(name)
        if found is None:
            kinds.add("free")
        elif not found.shared:
            kinds.add("capped")
        else:
            kinds.add("keyed" if found.keyed else "whole")
            if found.rated:
                kinds.add("rated")
    return variant(kinds)


def _statement(kinds: str, marks: bool) -> str:
    return kinds + ("+marks" if marks else "")


def _kinds(leases: Mapping[str, timedelta], limits: Mapping[str, TypeLimits]) -> str:
    """Which of the limited acquire's statements serves these types (``sql.limits``:
    one per combination of kinds, each with only the parts its types need)."""
    return _kinds_of(tuple(leases), tuple(limits.items()))


def _limit_params(
    leases: Mapping[str, timedelta], limits: Mapping[str, TypeLimits], encoding: str
) -> dict[str, Any]:
    """A limited acquire's arrays: the types with limits shared by every worker (counted
    by group, under their locks, taken in name order), those only this worker caps,
    and the others. Built once per set of limits (do not mutate): a worker's are the
    same on every acquire but for its caps' room."""
    return _limit_arrays(tuple(leases), tuple(limits.items()), encoding)


@functools.lru_cache(maxsize=256)
def _limit_arrays(
    leases: tuple[str, ...], items: tuple[tuple[str, TypeLimits], ...], encoding: str
) -> dict[str, Any]:
    limits = dict(items)
    limited = [name for name in leases if name in limits and limits[name].shared]
    capped = [name for name in leases if name in limits and not limits[name].shared]
    return {
        "limited_names": texts(limited, encoding),
        "limited_concurrency": ints([limits[name].concurrency for name in limited]),
        "limited_key_concurrency": ints([limits[name].key_concurrency for name in limited]),
        "limited_most": ints([limits[name].most for name in limited]),
        "limited_rate_n": ints([limits[name].rate_n for name in limited]),
        "limited_rate_per_s": optional_floats([limits[name].rate_per_s for name in limited]),
        "limited_key_rate_n": ints([limits[name].key_rate_n for name in limited]),
        "limited_key_rate_per_s": optional_floats(
            [limits[name].key_rate_per_s for name in limited]
        ),
        "capped_names": texts(capped, encoding),
        "capped_most": ints([limits[name].most for name in capped]),
        "free_names": texts([name for name in leases if name not in limits], encoding),
        "lock_names": texts(sorted(limited), encoding),
    }


def _turn_params(
    conn: psycopg.AsyncConnection[Any],
    worker_id: str,
    leases: Mapping[str, timedelta],
    queues: Sequence[str] | None,
) -> dict[str, Any]:
    """An acquire's parameters: the worker's id and its constant arrays (built once)."""
    constants = turn_constants(
        tuple(leases.items()), None if queues is None else tuple(queues), conn.info.encoding
    )
    return {"worker_id": worker_id, **constants}
