"""A group of atomic attempts in one transaction: ``PgAtomicGroup``.

One transaction per atomic job caps an atomic drain at the server's commit rate (a
WAL flush each). A group runs its members one after another on one connection, each
in the savepoint ``pgwork_member``, and commits once. Round trips per member:

1. ``enter``: the row lock, behind what the savepoint needs (``RELEASE`` of the last
   member's and a new ``SAVEPOINT``; for the group's first member ``BEGIN`` and
   ``SAVEPOINT``), all in one simple-protocol query;
2. ``complete``: the completion (``COMPLETE_ATOMIC``), alone. A refused completion
   makes the statement fail on purpose, and the member is rolled back to its
   savepoint (``ROLLBACK TO`` keeps the savepoint, ready for the next member).

The group one ``COMMIT``. A rolled-back savepoint also releases the row lock taken in
it, so a member that failed can record its failure on its own connection at once.

Whenever the lane's connection is left idle in the transaction, the server must be
able to end it (a worker that froze must not hold its members' rows for ever): every
statement here ends with the server's ReadyForQuery as the last message, which arms
the ``idle_in_transaction_session_timeout`` the lock set. Nothing here is pipelined:
psycopg's pipeline ends with a Flush, which disarms that timer on PostgreSQL < 17
(``BEGIN_ATOMIC_BOUNDED``). The completion used to travel in a pipeline with the next
``SAVEPOINT``, leaving the lane unbounded until its next statement. A simple query
cannot carry bound parameters, so the lock's are written into its text: the lease's
job id and token (uuids of the worker's own acquire, never a user value) and the
idle timeout in milliseconds; the completion, which carries the handler's output,
keeps its bound parameters.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any, Protocol
from uuid import UUID

import psycopg
from psycopg import errors as pg_errors

from pgwork.adapters.state import Completion, CompletionResult, Lease, TransactionHandle
from pgwork.postgres._errors import translate_errors
from pgwork.postgres._state_complete import atomic_completion_params
from pgwork.postgres._statements import ATOMIC_REFUSED, Statements
from pgwork.postgres._transactions import PgTransaction

__all__ = ["ATOMIC_SLACK", "GroupLostError", "PgAtomicGroup", "atomic_params"]

# An atomic attempt's transaction is ended by the server this long after its handler's
# deadline (once idle before PostgreSQL 17; in all, from 17 on).
ATOMIC_SLACK = timedelta(seconds=5)

_RELEASE = b"RELEASE SAVEPOINT pgwork_member"
_UNDO = b"ROLLBACK TO SAVEPOINT pgwork_member"
_KEEP = b"RELEASE SAVEPOINT pgwork_member; SAVEPOINT pgwork_member"

# What goes before a member's row lock, by the state of the group's savepoint.
_NOT_BEGUN, _FRESH, _USED, _NONE = range(4)
_BEFORE_LOCK = {
    _NOT_BEGUN: b"BEGIN; SAVEPOINT pgwork_member; ",
    _FRESH: b"",  # open, nothing written in it
    _USED: b"RELEASE SAVEPOINT pgwork_member; SAVEPOINT pgwork_member; ",  # a member kept
    _NONE: b"SAVEPOINT pgwork_member; ",  # released, none open
}


class GroupLostError(psycopg.OperationalError):
    """The group's connection was closed (a member's handler was abandoned) or broke:
    nothing of the group committed."""


class _Ops(Protocol):
    """What a group uses of the adapter (``PostgresStateAdapter``)."""

    schema: str
    _sql: Statements

    async def _completion_results(
        self,
        tx: TransactionHandle | None,
        completions: Sequence[Completion],
        rows: Sequence[tuple[Any, ...]],
    ) -> list[CompletionResult]: ...


class PgAtomicGroup:
    """``AtomicGroup`` on one pooled psycopg connection (autocommit, so BEGIN by hand)."""

    __slots__ = ("_conn", "_cur", "_give_back", "_ops", "_savepoint", "members")

    def __init__(
        self,
        ops: _Ops,
        conn: psycopg.AsyncConnection[Any],
        give_back: Callable[[], Awaitable[None]],
    ) -> None:
        self._ops = ops
        self._conn = conn
        # One cursor for all the group's statements (they run one after another).
        self._cur = conn.cursor()
        self._give_back = give_back
        self._savepoint = _NOT_BEGUN
        self.members = 0

    def _usable(self) -> psycopg.AsyncConnection[Any]:
        conn = self._conn
        if conn.closed or conn.broken:
            raise GroupLostError("the atomic group's connection was closed")
        return conn

    async def enter(self, *, lease: Lease, deadline: timedelta) -> TransactionHandle | None:
        conn = self._usable()
        ops = self._ops
        query = _BEFORE_LOCK[self._savepoint] + lock_query(ops._sql.begin_atomic, lease, deadline)
        cur = self._cur
        with translate_errors(ops.schema):
            # Never prepared: the text is the member's own (its lease written in).
            await cur.execute(query, prepare=False)
            self._savepoint = _FRESH
            while cur.nextset():  # the lock's rows come last
                pass
            rows = await cur.fetchall()
        if not rows:
            await self.undo()
            return None
        return PgTransaction(conn, self._give_back)

    async def complete(self, completion: Completion) -> CompletionResult:
        if completion.continuation is not None:
            raise ValueError("AtomicGroup.complete takes a completion without continuation")
        self._usable()
        ops = self._ops
        params = atomic_completion_params(completion)
        cur = self._cur
        try:
            with translate_errors(ops.schema):
                await cur.execute(ops._sql.complete_atomic, params)
                rows = await cur.fetchall()
        except pg_errors.InvalidTextRepresentation as exc:
            if ATOMIC_REFUSED not in str(exc):
                raise
            await self.undo()
            return CompletionResult(job_id=completion.job_id, accepted=False)
        self.members += 1
        self._savepoint = _USED
        return await self._settle_dependants(completion, rows)

    async def _settle_dependants(
        self, completion: Completion, rows: Sequence[tuple[Any, ...]]
    ) -> CompletionResult:
        """The completion's result; a chain it ended that others wait on is resolved in
        the group's transaction, outside the next member's savepoint (rare: one more
        round trip each way)."""
        ops = self._ops
        conn = self._conn
        ends_with_dependants = any(row[3] and row[4] for row in rows)
        if ends_with_dependants:
            await self._cur.execute(_RELEASE)
            self._savepoint = _NONE
        [result] = await ops._completion_results(PgTransaction(conn), [completion], rows)
        return result

    async def keep(self) -> None:
        self._usable()
        with translate_errors(self._ops.schema):
            await self._cur.execute(_KEEP)
        self.members += 1
        self._savepoint = _FRESH

    async def undo(self) -> None:
        self._usable()
        with translate_errors(self._ops.schema):
            await self._cur.execute(_UNDO)
        self._savepoint = _FRESH

    async def commit(self) -> None:
        try:
            self._usable()
            if self._savepoint != _NOT_BEGUN:
                with translate_errors(self._ops.schema):
                    await self._cur.execute(b"COMMIT")
        finally:
            await self._give_back()

    async def discard(self) -> None:
        conn = self._conn
        try:
            # By the connection's state, not ours: a first member's query that failed
            # after its BEGIN left a transaction open (aborted).
            if (
                not conn.closed
                and not conn.broken
                and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
            ):
                await conn.execute(b"ROLLBACK")
        except psycopg.Error:
            pass
        finally:
            await self._give_back()


def lock_query(begin_atomic: bytes, lease: Lease, deadline: timedelta) -> bytes:
    """``begin_atomic`` with its parameters written in (for a simple-protocol query):
    two uuids, checked as such, and a number; no user value."""
    head, between, tail = _lock_parts(begin_atomic)
    idle_ms = _idle_ms(deadline)
    return b"".join(
        (
            head[0],
            idle_ms,
            head[1],
            _uuid_literal(lease.job_id),
            between,
            _uuid_literal(lease.lease_token),
            tail,
        )
    )


@functools.lru_cache(maxsize=8)
def _lock_parts(begin_atomic: bytes) -> tuple[tuple[bytes, bytes], bytes, bytes]:
    """``begin_atomic`` cut around its placeholders, which appear in this order:
    ``idle_ms``, ``job_id``, ``lease_token`` (each once)."""
    before_idle, rest = begin_atomic.split(b"%(idle_ms)s")
    before_id, rest = rest.split(b"%(job_id)s")
    between, tail = rest.split(b"%(lease_token)s")
    return (before_idle, before_id), between, tail


def _uuid_literal(value: object) -> bytes:
    """A uuid as an SQL literal: checked as a uuid (its canonical text is hex digits
    and dashes only)."""
    if type(value) is not UUID:
        value = UUID(str(value))
    return b"'" + str(value).encode() + b"'::uuid"


@functools.lru_cache(maxsize=64)
def _idle_ms(deadline: timedelta) -> bytes:
    return b"'" + str(int((deadline + ATOMIC_SLACK).total_seconds() * 1000)).encode() + b"'"


def atomic_params(lease: Lease, deadline: timedelta) -> dict[str, Any]:
    """``BEGIN_ATOMIC``'s parameters."""
    return {
        "job_id": lease.job_id,
        "lease_token": lease.lease_token,
        # Slack over the handler deadline: the worker's own timeout fires first; the
        # server's only ends transactions of a stuck process.
        "idle_ms": str(int((deadline + ATOMIC_SLACK).total_seconds() * 1000)),
    }
