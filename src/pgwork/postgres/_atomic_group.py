"""A group of atomic attempts in one transaction: ``PgAtomicGroup``.

One transaction per atomic job caps an atomic drain at the server's commit rate (a
WAL flush each). A group runs its members one after another on one connection and
commits once. Opening a member's savepoint costs no round trip of its own:

- Its savepoint (``pgwork_member``), and the group's ``BEGIN`` before the first one,
  are opened when the member first uses the connection, not before. For the time a
  member may use it, the connection's ``wait`` (the one door every psycopg operation
  goes through: a cursor's statement, ``transaction()``, ``pipeline()``, ``copy``) is
  this group's ``_first_use``, which sends what opens the savepoint ahead of the
  member's first statement and steps aside. So ``conn.transaction()`` in a handler
  nests inside the member's savepoint, as it would inside an open transaction.
- A member's completion is written in its savepoint at once, fenced by its lease,
  after its deferred checks, with the next member's savepoint opened behind it:

      SET CONSTRAINTS ALL IMMEDIATE; EXECUTE <complete>; SET CONSTRAINTS ALL DEFERRED;
      RELEASE SAVEPOINT pgwork_member; SAVEPOINT pgwork_member

  A refused completion (the lease no longer holds) makes the statement fail on
  purpose; the rest is skipped and the member is rolled back to its savepoint. So
  does a deferred check that fails: it fires in the member's savepoint, not at the
  group's COMMIT, so one member's deferred constraint costs the others nothing. The
  checks are deferred again for the next member (a savepoint rolled back restores
  the deferral by itself); ``ALL DEFERRED`` defers the ``DEFERRABLE INITIALLY
  IMMEDIATE`` ones too, whose checks then fire as that member's outcome is written.
  A member kept with an outcome of its own (``keep``) is checked alike.
- A member that never used its transaction has its savepoint (and the group's
  ``BEGIN``, first) opened by its completion, in the same round trip: what its first
  use would have sent goes ahead of the statement above. So every kept member is in
  the group's transaction, and ``commit`` is its ``COMMIT`` (nothing at all when none
  was begun). The worker sends no such member here: one that wrote nothing and
  completes plainly has nothing to commit but its completion, so it ``leave``s the
  group and its completion is written with the worker's staged ones (see
  ``pgwork.worker._atomic_group``).

A member's row is not locked while its handler runs: the worker renews a grouped
member's lease as it does a staged attempt's, and the completion's fence decides.
Whenever the lane's connection is left idle in the transaction, the server must be
able to end it (a worker that froze must not hold the kept members' rows for ever):
every query here ends with the server's ReadyForQuery as the last message, which arms
the ``idle_in_transaction_session_timeout`` of the transaction. That bound (the
member's deadline plus ``ATOMIC_SLACK``) is set with the group's ``BEGIN``, before its
first savepoint, so that no member rolled back takes it with it; a later member whose
deadline asks for a longer one raises it as it enters (one round trip, in its
savepoint if one is open: kept with it, undone with it). Every statement here is
bounded by the adapter's ``operation_timeout`` (``_pool.bounded``): one without an
answer closes the connection, which loses the group. Nothing here is pipelined:
psycopg's pipeline ends with a Flush, which disarms that timer on PostgreSQL < 17
(``BEGIN_ATOMIC_BOUNDED``). A simple query carries no bound parameters, so the
completion's values are written in as literals: the lease's uuids (checked as
uuids) and the handler's output escaped by libpq (``PQescapeLiteral``), never
formatted by hand. The completion is prepared on the connection (SQL ``PREPARE``)
and run by ``EXECUTE``; its name is kept in psycopg's cache of the session's prepared
statements, so that whatever makes psycopg deallocate them (a rollback it sees, on the
connection's later use in the pool too) makes the group prepare it again
(``_prepare``). On a connection without prepared statements
(``prepare_threshold`` None: a pooler in transaction mode, where a named statement
lives in one server session) its full text goes instead.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import re
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any, Protocol
from uuid import UUID

import psycopg
from psycopg import errors as pg_errors
from psycopg import generators
from psycopg.pq import Escaping, ExecStatus

from pgwork.adapters.state import (
    Completion,
    CompletionResult,
    Lease,
    TransactionHandle,
)
from pgwork.errors import DatabaseTimeoutError
from pgwork.postgres._errors import translate_errors
from pgwork.postgres._pool import bounded
from pgwork.postgres._storable import storable
from pgwork.postgres._transactions import BEGIN_READ_COMMITTED, PgTransaction
from pgwork.postgres.sql import Statements
from pgwork.postgres.sql.outcomes import ATOMIC_REFUSED

__all__ = ["ATOMIC_SLACK", "GroupLostError", "PgAtomicGroup", "atomic_params"]

# An atomic attempt's transaction is ended by the server this long after its handler's
# deadline (once idle before PostgreSQL 17; in all, from 17 on).
ATOMIC_SLACK = timedelta(seconds=5)

_BEGIN = BEGIN_READ_COMMITTED + b"; "
_SAVEPOINT = b"SAVEPOINT pgwork_member"
_RELEASE = b"RELEASE SAVEPOINT pgwork_member"
_UNDO = b"ROLLBACK TO SAVEPOINT pgwork_member"
# Keep the member that wrote, and open the next one's savepoint.
_NEXT = b"RELEASE SAVEPOINT pgwork_member; SAVEPOINT pgwork_member"
# Fire the member's deferred checks (constraints and constraint triggers declared
# INITIALLY DEFERRED) now, in its savepoint, rather than at the group's COMMIT; then
# defer them again for the next member. A check that fails fails this statement, and
# rolling back to the savepoint restores the deferral.
_CHECK = b"SET CONSTRAINTS ALL IMMEDIATE"
_DEFER = b"SET CONSTRAINTS ALL DEFERRED"
_CHECKED_NEXT = _DEFER + b"; " + _NEXT
# The bound of an idle lane: transaction-local, so a group's COMMIT (or ROLLBACK) ends
# it, and one set in a member's savepoint is undone with the savepoint.
_SET_IDLE = b"SET LOCAL idle_in_transaction_session_timeout = "

# What a statement of the group that got no answer in time was (``_pool.bounded``).
_STATEMENT = "a statement of a group of atomic attempts"
_COMPLETING = "an atomic attempt's completion in its group"

# The prepared statement's parameters, in order, with their types.
_COMPLETE_PARAMS = (
    (b"id", b"uuid"),
    (b"token", b"uuid"),
    (b"output", b"text"),
    (b"ends_chain", b"bool"),
)


class GroupLostError(psycopg.OperationalError):
    """The group's connection was closed (a member's handler was abandoned) or broke:
    nothing of the group committed."""


class _Ops(Protocol):
    """What a group uses of the adapter (``PostgresStateAdapter``)."""

    schema: str
    statements: Statements
    operation_timeout: float | None

    async def _completion_results(
        self,
        tx: TransactionHandle | None,
        completions: Sequence[Completion],
        rows: Sequence[tuple[Any, ...]],
    ) -> list[CompletionResult]: ...


class PgAtomicGroup:
    """``AtomicGroup`` on one pooled psycopg connection (autocommit, so BEGIN by hand)."""

    __slots__ = (
        "_begun",
        "_complete",
        "_conn",
        "_cur",
        "_encoding",
        "_escaping",
        "_fresh",
        "_give_back",
        "_idle",
        "_opening_ms",
        "_ops",
        "_pending",
        "_touched",
        "members",
    )

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
        # The group's transaction was begun; a savepoint is open with nothing in it
        # (ready for the next member that writes).
        self._begun = False
        self._fresh = False
        # The current member used its transaction (its savepoint is open), and what
        # its first use must send ahead of it (None: nothing).
        self._touched = False
        self._pending: bytes | None = None
        # The bound the pending ``BEGIN`` sets (ms).
        self._opening_ms = 0
        # The idle bound in force (ms): in the transaction outside the open
        # savepoint, and set in that savepoint (None: not set there).
        self._idle: tuple[int | None, int | None] = (None, None)
        self._escaping = Escaping(conn.pgconn)
        self._encoding = conn.info.encoding
        prepared = conn.prepare_threshold is not None
        self._complete = _statement(ops.statements.outcomes.complete_atomic, prepared)
        self.members = 0

    @property
    def open(self) -> bool:
        return self._begun

    @property
    def used(self) -> bool:
        return self._touched

    def leave(self) -> None:
        if self._touched:
            raise ValueError("AtomicGroup.leave: the member used its transaction")
        self._disarm()

    def _usable(self) -> psycopg.AsyncConnection[Any]:
        conn = self._conn
        if conn.closed or conn.broken:
            raise GroupLostError("the atomic group's connection was closed")
        return conn

    # --- a member ------------------------------------------------------------------

    async def enter(self, *, lease: Lease, deadline: timedelta) -> TransactionHandle:
        conn = self._usable()
        self._disarm()
        ms = _idle_ms(deadline)
        self._touched = False
        if not self._begun:
            self._pending = b"%s%s%d; %s" % (_BEGIN, _SET_IDLE, ms, _SAVEPOINT)
            self._opening_ms = ms
        else:
            outside, inside = self._idle
            if ms > (inside or outside or 0):
                # Held in the transaction while this member runs, maybe for longer
                # than the bound in force: raise it now.
                await self._run(b"%s%d" % (_SET_IDLE, ms))
                self._idle = (outside, ms) if self._fresh else (ms, None)
            self._pending = None if self._fresh else _SAVEPOINT
        conn.wait = self._first_use  # type: ignore[method-assign]
        return PgTransaction(conn, self._give_back_conn, self._ops.operation_timeout)

    async def _first_use(self, gen: Any, *args: Any, **kwargs: Any) -> Any:
        """The connection's ``wait`` until the member first uses it: open the member's
        savepoint (the group's transaction first), then run what was asked."""
        conn = self._conn
        self._disarm()
        pending, self._pending = self._pending, None
        self._touched = True
        self._fresh = False
        if pending is not None:
            begins = not self._begun
            await _send(conn, pending)
            self._opened(begins)
        return await conn.wait(gen, *args, **kwargs)

    def _disarm(self) -> None:
        self._conn.__dict__.pop("wait", None)

    async def complete(self, completion: Completion) -> CompletionResult:
        if completion.continuation is not None or completion.children:
            raise ValueError(
                "AtomicGroup.complete takes a completion without continuation or children"
            )
        conn = self._usable()
        self._disarm()
        await self._prepare(conn, self._complete)
        token = completion.lease_token
        with storable([completion]):
            output = self._escaping.escape_literal(completion.output_json.encode(self._encoding))
        job_id = _uuid_literal(completion.job_id)
        fence = b"NULL" if token is None else _uuid_literal(token)
        query = (
            _CHECK
            + b"; "
            + self._complete.text((job_id, fence, output, b"true"))
            + b"; "
            + _CHECKED_NEXT
        )
        # A member that never used its transaction: what its first use would have sent
        # (its savepoint, the group's BEGIN first) goes ahead, in the same round trip.
        opening: bytes | None = None
        if not self._touched:
            opening, self._pending = self._pending, None
            self._touched = True
            self._fresh = False
            if opening is not None:
                query = opening + b"; " + query
        begins = opening is not None and not self._begun
        cur = self._cur
        try:
            with storable([completion]), translate_errors(self._ops.schema):
                async with bounded(self._conn, self._ops.operation_timeout, _COMPLETING):
                    await cur.execute(query, prepare=False)
                # Past the results of what opened the savepoint and of the check, to
                # the completion's.
                for _ in range(1 if opening is None else opening.count(b"; ") + 2):
                    cur.nextset()
                rows = await cur.fetchall()
        except pg_errors.InvalidSqlStatementName as exc:
            # Deallocated behind psycopg's back (a handler's own DEALLOCATE sent past
            # its cursor): the member's savepoint is aborted, and its writes with it.
            _forget(conn, self._complete)
            await conn.close()
            raise GroupLostError("the atomic group's prepared completion was deallocated") from exc
        except pg_errors.InvalidTextRepresentation as exc:
            if ATOMIC_REFUSED not in str(exc):
                raise
            # Nothing after the completion ran (what opened the savepoint did): roll
            # the member back.
            self._opened(begins)
            await self._undo()
            self._member_undone()
            return CompletionResult(job_id=completion.job_id, accepted=False)
        self._opened(begins)
        self.members += 1
        self._member_kept()
        if any(row[3] and row[4] for row in rows):
            # It ended a chain others wait on: settle them in the group's transaction,
            # outside any member's savepoint (rare: one more round trip).
            await self._run(_RELEASE)
            self._fresh = False
            self._idle = (self._idle[0], None)
            self._pending = _SAVEPOINT
        [result] = await self._ops._completion_results(PgTransaction(conn), [completion], rows)
        return result

    async def keep(self) -> None:
        self._usable()
        self._disarm()
        if self._touched:
            await self._run(b"%s; %s" % (_CHECK, _CHECKED_NEXT))
            self._member_kept()
        self.members += 1

    async def undo(self) -> None:
        self._usable()
        self._disarm()
        if self._touched:
            await self._undo()
            self._member_undone()
        # The member may go on to write its failure: its first use opens a savepoint.
        self._touched = False
        if self._begun:
            self._pending = None if self._fresh else _SAVEPOINT
        self._conn.wait = self._first_use  # type: ignore[method-assign]

    def _opened(self, begins: bool) -> None:
        """The group's transaction was begun by the query just sent, if ``begins``."""
        if begins:
            self._begun = True
            self._idle = (self._opening_ms, None)

    def _member_kept(self) -> None:
        """The member's savepoint was released and a fresh one opened."""
        outside, inside = self._idle
        self._idle = (inside or outside, None)
        self._fresh = True
        self._touched = False

    def _member_undone(self) -> None:
        """The member was rolled back to its savepoint (kept open, empty)."""
        self._idle = (self._idle[0], None)
        self._fresh = True
        self._touched = False

    # --- the group -----------------------------------------------------------------

    async def commit(self) -> None:
        self._disarm()
        try:
            self._usable()
            if self._begun:
                await self._run(b"COMMIT")
        except BaseException:
            await self._roll_back()
            raise
        finally:
            self._reset()
            await self._give_back_conn()

    async def _roll_back(self) -> None:
        """End a transaction a failed statement left open (aborted), if any, before the
        connection goes back."""
        conn = self._conn
        if (
            not conn.closed
            and not conn.broken
            and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
        ):
            with contextlib.suppress(psycopg.Error, DatabaseTimeoutError):
                async with bounded(conn, self._ops.operation_timeout):
                    await conn.execute(b"ROLLBACK")

    async def discard(self) -> None:
        self._disarm()
        try:
            # By the connection's state, not ours: a first use that failed after its
            # BEGIN left a transaction open (aborted).
            await self._roll_back()
        finally:
            self._reset()
            await self._give_back_conn()

    def _reset(self) -> None:
        self._begun = self._fresh = self._touched = False
        self._pending = None
        self._idle = (None, None)
        self.members = 0

    async def _give_back_conn(self) -> None:
        self._disarm()
        await self._give_back()

    async def _undo(self) -> None:
        """Roll the member back to its savepoint, past psycopg's cursor: its command
        status reads ``ROLLBACK``, after which psycopg would deallocate every prepared
        statement of the session, and the group's completion would cost the next
        member a round trip more to prepare it again."""
        conn = self._conn
        with translate_errors(self._ops.schema):
            async with bounded(conn, self._ops.operation_timeout, _STATEMENT), conn.lock:
                await _send(conn, _UNDO)

    async def _run(self, query: bytes) -> None:
        with translate_errors(self._ops.schema):
            async with bounded(self._conn, self._ops.operation_timeout, _STATEMENT):
                await self._cur.execute(query, prepare=False)

    async def _prepare(self, conn: psycopg.AsyncConnection[Any], statement: _Statement) -> None:
        """Prepare ``statement`` on ``conn`` unless it is prepared there already.

        The name is kept in psycopg's own cache of the session's prepared statements,
        as if psycopg had prepared it: psycopg deallocates every prepared statement of
        the session (``DEALLOCATE ALL``) after a rollback it sees (a handler's nested
        transaction that failed, a lone atomic attempt's ``ROLLBACK`` on the same
        pooled connection, ...), and empties its cache as it does; it deallocates the
        least recently used one past ``prepared_max``. Either way the name leaves the
        cache with the statement, and is prepared again here."""
        prepare = statement.prepare
        if prepare is None:
            return
        names = conn._prepared._names
        key = (prepare, ())
        if key in names:
            names.move_to_end(key)  # used: the last psycopg would deallocate
            return
        # (Taken already: prepared by a query cancelled before it was recorded.)
        with (
            translate_errors(self._ops.schema),
            contextlib.suppress(pg_errors.DuplicatePreparedStatement),
        ):
            async with bounded(conn, self._ops.operation_timeout, _STATEMENT):
                # psycopg sends what it has to deallocate first.
                await self._cur.execute(prepare, prepare=False)
        names[key] = statement.name


def _forget(conn: psycopg.AsyncConnection[Any], statement: _Statement) -> None:
    """``statement`` is no longer prepared on ``conn``."""
    if statement.prepare is not None:
        conn._prepared._names.pop((statement.prepare, ()), None)


async def _send(conn: psycopg.AsyncConnection[Any], query: bytes) -> None:
    """Run ``query`` (simple protocol, several statements) under a psycopg operation
    already in progress: the connection's lock is held by it, so no cursor can be
    used; its ``wait`` is the real one again."""
    pgconn = conn.pgconn
    pgconn.send_query(query)
    results = await conn.wait(generators.execute(pgconn))
    for result in results:
        if result.status == ExecStatus.FATAL_ERROR:
            raise pg_errors.error_from_result(result, encoding=conn.info.encoding)


class _Statement:
    """The group's completion as simple-protocol text, with literals written in:
    ``EXECUTE`` of its prepared form, or (``prepared`` False) its full text."""

    __slots__ = ("_execute", "_order", "_parts", "name", "prepare")

    def __init__(
        self,
        template: bytes,
        params: tuple[tuple[bytes, bytes], ...],
        prepared: bool,
    ) -> None:
        names = [name for name, _ in params]
        parts, order = _cut(template)
        if sorted(order) != sorted(names):
            raise ValueError(f"the atomic completion's placeholders {order} are not {names}")
        # For each placeholder in the text, its parameter's position.
        self._order = tuple(names.index(name) for name in order)
        self._parts = parts
        self.prepare: bytes | None = None
        self.name = b""
        self._execute: bytes | None = None
        if prepared:
            # Named after its text: another schema's or version's is another statement.
            name = b"pgwork_atomic_complete_" + hashlib.sha1(template).hexdigest()[:12].encode()
            self.name = name
            body = [parts[0]]
            for at, part in zip(self._order, parts[1:], strict=True):
                body += (b"$%d" % (at + 1), part)
            types = b", ".join(type_name for _, type_name in params)
            self.prepare = b"PREPARE %s(%s) AS %s" % (name, types, b"".join(body))
            self._execute = b"EXECUTE " + name + b"("

    def text(self, values: tuple[bytes, ...]) -> bytes:
        """The statement with ``values`` (SQL literals, in the parameters' order)."""
        if self._execute is not None:
            return self._execute + b", ".join(values) + b")"
        parts = self._parts
        out = [parts[0]]
        for at, part in zip(self._order, parts[1:], strict=True):
            out += (values[at], part)
        return b"".join(out)


@functools.lru_cache(maxsize=16)
def _statement(template: bytes, prepared: bool) -> _Statement:
    """The group's completion for ``template`` (built once per schema: a group is
    made for every commit)."""
    return _Statement(template, _COMPLETE_PARAMS, prepared)


_PLACEHOLDER = re.compile(rb"%\((\w+)\)[sb]")


@functools.lru_cache(maxsize=16)
def _cut(template: bytes) -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
    """``template`` (psycopg's ``%(name)s`` placeholders) cut around its placeholders:
    the texts between them (``%%`` unescaped) and the placeholders' names in order."""
    pieces = _PLACEHOLDER.split(template)
    texts = tuple(piece.replace(b"%%", b"%") for piece in pieces[0::2])
    return texts, tuple(pieces[1::2])


def _uuid_literal(value: object) -> bytes:
    """A uuid as an SQL literal: checked as a uuid (its canonical text is hex digits
    and dashes only)."""
    if type(value) is not UUID:
        value = UUID(str(value))
    return b"'%s'::uuid" % str(value).encode()


@functools.lru_cache(maxsize=64)
def _idle_ms(deadline: timedelta) -> int:
    return int((deadline + ATOMIC_SLACK).total_seconds() * 1000)


def atomic_params(lease: Lease, deadline: timedelta) -> dict[str, Any]:
    """``BEGIN_ATOMIC``'s parameters."""
    return {
        "job_id": lease.job_id,
        "lease_token": lease.lease_token,
        # Slack over the handler deadline: the worker's own timeout fires first; the
        # server's only ends transactions of a stuck process.
        "idle_ms": str(int((deadline + ATOMIC_SLACK).total_seconds() * 1000)),
    }
