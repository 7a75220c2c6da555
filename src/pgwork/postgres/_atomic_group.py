"""A group of atomic attempts in one transaction: ``PgAtomicGroup``.

One transaction per atomic job caps an atomic drain at the server's commit rate (a
WAL flush each). A group runs its members one after another on one connection, each
in the savepoint ``pgwork_member``, and commits once. Round trips per member, with a
savepoint already open for it (the usual case inside a group):

1. ``enter``: the row lock (``BEGIN_ATOMIC``), alone: not pipelined, so the server
   arms the lock's ``idle_in_transaction_session_timeout`` before the handler runs
   (see ``BEGIN_ATOMIC_BOUNDED`` on why a pipeline leaves it disarmed);
2. ``complete``: the completion (``COMPLETE_ATOMIC``), ``RELEASE`` and the next
   member's ``SAVEPOINT``, in one pipeline. A refused completion makes the statement
   fail on purpose, so nothing behind it in the pipeline runs, and the member is
   rolled back to its savepoint (``ROLLBACK TO`` keeps the savepoint, ready for the
   next member).

The group's first member also sends ``BEGIN; SAVEPOINT`` (one simple query); the
group one ``COMMIT``. A rolled-back savepoint also releases the row lock taken in it,
so a member that failed can record its failure on its own connection at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Protocol

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

_BEGIN = b"BEGIN; SAVEPOINT pgwork_member"
_SAVEPOINT = b"SAVEPOINT pgwork_member"
_RELEASE = b"RELEASE SAVEPOINT pgwork_member"
_UNDO = b"ROLLBACK TO SAVEPOINT pgwork_member"
_KEEP = b"RELEASE SAVEPOINT pgwork_member; SAVEPOINT pgwork_member"


class GroupLostError(psycopg.OperationalError):
    """The group's connection was closed (a member's handler was abandoned) or broke:
    nothing of the group committed."""


class _Ops(Protocol):
    """What a group uses of the adapter (``PostgresStateAdapter``)."""

    schema: str
    _sql: Statements

    async def _fetch(
        self, conn: psycopg.AsyncConnection[Any], query: bytes, params: Mapping[str, Any]
    ) -> list[tuple[Any, ...]]: ...

    async def _completion_results(
        self,
        tx: TransactionHandle | None,
        completions: Sequence[Completion],
        rows: Sequence[tuple[Any, ...]],
    ) -> list[CompletionResult]: ...


class PgAtomicGroup:
    """``AtomicGroup`` on one pooled psycopg connection (autocommit, so BEGIN by hand)."""

    __slots__ = ("_begun", "_conn", "_fresh", "_give_back", "_ops", "members")

    def __init__(
        self,
        ops: _Ops,
        conn: psycopg.AsyncConnection[Any],
        give_back: Callable[[], Awaitable[None]],
    ) -> None:
        self._ops = ops
        self._conn = conn
        self._give_back = give_back
        self._begun = False
        self._fresh = False  # a savepoint is open and nothing was written in it yet
        self.members = 0

    def _usable(self) -> psycopg.AsyncConnection[Any]:
        conn = self._conn
        if conn.closed or conn.broken:
            raise GroupLostError("the atomic group's connection was closed")
        return conn

    async def enter(self, *, lease: Lease, deadline: timedelta) -> TransactionHandle | None:
        conn = self._usable()
        ops = self._ops
        with translate_errors(ops.schema):
            if not self._begun:
                await conn.execute(_BEGIN)
                self._begun = True
            elif not self._fresh:
                await conn.execute(_SAVEPOINT)
            self._fresh = False
        rows = await ops._fetch(conn, ops._sql.begin_atomic, atomic_params(lease, deadline))
        if not rows:
            await self.undo()
            return None
        return PgTransaction(conn, self._give_back)

    async def complete(self, completion: Completion) -> CompletionResult:
        if completion.continuation is not None:
            raise ValueError("AtomicGroup.complete takes a completion without continuation")
        conn = self._usable()
        ops = self._ops
        params = atomic_completion_params(completion)
        try:
            with translate_errors(ops.schema):
                async with conn.pipeline():
                    cur = conn.cursor()
                    await cur.execute(ops._sql.complete_atomic, params)
                    await conn.execute(_RELEASE)
                    await conn.execute(_SAVEPOINT)
                rows = await cur.fetchall()
        except pg_errors.InvalidTextRepresentation as exc:
            if ATOMIC_REFUSED not in str(exc):
                raise
            await self.undo()
            return CompletionResult(job_id=completion.job_id, accepted=False)
        self.members += 1
        self._fresh = True
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
            await conn.execute(_RELEASE)
            self._fresh = False
        [result] = await ops._completion_results(PgTransaction(conn), [completion], rows)
        return result

    async def keep(self) -> None:
        conn = self._usable()
        with translate_errors(self._ops.schema):
            await conn.execute(_KEEP)
        self.members += 1
        self._fresh = True

    async def undo(self) -> None:
        conn = self._usable()
        with translate_errors(self._ops.schema):
            await conn.execute(_UNDO)
        self._fresh = True

    async def commit(self) -> None:
        try:
            conn = self._usable()
            if self._begun:
                with translate_errors(self._ops.schema):
                    await conn.execute(b"COMMIT")
        finally:
            await self._give_back()

    async def discard(self) -> None:
        conn = self._conn
        try:
            if self._begun and not conn.closed and not conn.broken:
                await conn.execute(b"ROLLBACK")
        except psycopg.Error:
            pass
        finally:
            await self._give_back()


def atomic_params(lease: Lease, deadline: timedelta) -> dict[str, Any]:
    """``BEGIN_ATOMIC``'s parameters."""
    return {
        "job_id": lease.job_id,
        "lease_token": lease.lease_token,
        # Slack over the handler deadline: the worker's own timeout fires first; the
        # server's only ends transactions of a stuck process.
        "idle_ms": str(int((deadline + ATOMIC_SLACK).total_seconds() * 1000)),
    }
