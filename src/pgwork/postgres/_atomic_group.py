"""A group of atomic attempts in one transaction: ``PgAtomicGroup``.

One transaction per atomic job caps an atomic drain at the server's commit rate (a
WAL flush each). A group runs its members one after another on one connection, each
in the savepoint ``pgwork_member``, and commits once. Under load one round trip per
member: its completion travels in one simple-protocol query with what the next
member, already waiting for the lane, needs to start (``complete``'s ``then``):

    EXECUTE <complete k>; RELEASE SAVEPOINT pgwork_member;
    SAVEPOINT pgwork_member; EXECUTE <lock k+1>

and the completion that fills the group (or comes after its due time) carries the
group's commit and the next group's start (``complete``'s ``commit``):

    EXECUTE <complete k>; COMMIT; BEGIN;
    SET LOCAL idle_in_transaction_session_timeout = <ms>;
    SAVEPOINT pgwork_member; EXECUTE <lock k+1>

A member that had no one waiting behind it completes alone, and the next one's
``enter`` sends the savepoint commands and its lock (for the group's first member
``BEGIN`` and ``SAVEPOINT``). A refused completion makes its statement fail on
purpose; the rest of the query is then skipped, the member is rolled back to its
savepoint (``ROLLBACK TO`` keeps the savepoint, ready for the next member), and the
next member enters on its own. A lock taken ahead for a member that does not enter
next is rolled back in front of whatever comes next. The group one ``COMMIT``. A
rolled-back savepoint also releases the row lock taken in it, so a member that failed
can record its failure on its own connection at once.

Whenever the lane's connection is left idle in the transaction, the server must be
able to end it (a worker that froze must not hold its members' rows for ever): every
query here ends with the server's ReadyForQuery as the last message, which arms the
``idle_in_transaction_session_timeout`` of the transaction. That bound (the member's
deadline plus ``ATOMIC_SLACK``) is set with the group's ``BEGIN``, before its first
savepoint, so that no member rolled back takes it with it; a member whose deadline
asks for another sets its own in its savepoint (kept with it, undone with it). The
member's lock sets nothing (a ``set_config`` in every lock cost the server ~10-20 µs
per member) and says whether its job is its chain's root: such a member, the common
one-job chain, completes through ``COMPLETE_ATOMIC_ROOT``, one ``UPDATE`` without the
general completion's CTEs. Nothing here is pipelined:
psycopg's pipeline ends with a Flush, which disarms that timer on PostgreSQL < 17
(``BEGIN_ATOMIC_BOUNDED``). A simple query carries no bound parameters, so the
values are written in as literals: the lease's uuids (checked as uuids), the idle
timeout in milliseconds, and the handler's output escaped by libpq
(``PQescapeLiteral``), never formatted by hand. The lock and the completion are
prepared once per connection (SQL ``PREPARE``) and run by ``EXECUTE``, so the server
parses and plans neither per member (their full text cost ~220 µs more server CPU
each, measured); on a connection without prepared statements (``prepare_threshold``
None: a pooler in transaction mode, where a named statement lives in one server
session) their full text goes instead.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import re
import weakref
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any, Protocol
from uuid import UUID

import psycopg
from psycopg import errors as pg_errors
from psycopg.pq import Escaping

from pgwork.adapters.state import (
    Completion,
    CompletionResult,
    Lease,
    NextMember,
    TransactionHandle,
)
from pgwork.postgres._errors import translate_errors
from pgwork.postgres._statements import ATOMIC_REFUSED, Statements
from pgwork.postgres._transactions import PgTransaction

__all__ = ["ATOMIC_SLACK", "GroupLostError", "PgAtomicGroup", "atomic_params"]

# An atomic attempt's transaction is ended by the server this long after its handler's
# deadline (once idle before PostgreSQL 17; in all, from 17 on).
ATOMIC_SLACK = timedelta(seconds=5)

_RELEASE = b"RELEASE SAVEPOINT pgwork_member"
_UNDO = b"ROLLBACK TO SAVEPOINT pgwork_member"
_KEEP = b"RELEASE SAVEPOINT pgwork_member; SAVEPOINT pgwork_member"
_NEXT = b"; RELEASE SAVEPOINT pgwork_member; SAVEPOINT pgwork_member; "
_COMMIT = b"; COMMIT"
_COMMIT_BEGIN = b"; COMMIT; BEGIN; "
_SAVEPOINT = b"SAVEPOINT pgwork_member; "
# The bound of an idle lane: transaction-local, so a group's COMMIT (or ROLLBACK) ends
# it, and one set in a member's savepoint is undone with the savepoint.
_SET_IDLE = b"SET LOCAL idle_in_transaction_session_timeout = "
# A lock taken ahead for a member that did not enter: undone, savepoint kept.
_DROP_AHEAD = b"ROLLBACK TO SAVEPOINT pgwork_member; RELEASE SAVEPOINT pgwork_member"

# What goes before a member's row lock, by the state of the group's savepoint.
_NOT_BEGUN, _FRESH, _USED, _NONE, _STALE = range(5)
_BEFORE_LOCK = {
    _NOT_BEGUN: b"BEGIN; ",  # then the idle bound, then the savepoint
    _FRESH: b"",  # open, nothing written in it
    _USED: b"RELEASE SAVEPOINT pgwork_member; SAVEPOINT pgwork_member; ",  # a member kept
    _NONE: b"SAVEPOINT pgwork_member; ",  # released, none open
    # Open, and only a lock in it that no member uses: one taken ahead for a member
    # that did not enter, or one whose lease no longer held.
    _STALE: b"ROLLBACK TO SAVEPOINT pgwork_member; ",
}

# The prepared statements' parameters, in order, with their types.
_LOCK_PARAMS = ((b"job_id", b"uuid"), (b"lease_token", b"uuid"))
_COMPLETE_PARAMS = (
    (b"id", b"uuid"),
    (b"token", b"uuid"),
    (b"output", b"text"),
    (b"ends_chain", b"bool"),
)
_COMPLETE_ROOT_PARAMS = _COMPLETE_PARAMS[:3]

# The names (statement texts) prepared on each connection, as long as it lives.
_prepared: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Any], set[bytes]] = (
    weakref.WeakKeyDictionary()
)


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

    __slots__ = (
        "_ahead",
        "_complete",
        "_complete_root",
        "_conn",
        "_cur",
        "_encoding",
        "_escaping",
        "_give_back",
        "_idle",
        "_lock",
        "_ops",
        "_root",
        "_savepoint",
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
        self._savepoint = _NOT_BEGUN
        # The member whose lock a completion took ahead, whether its lease held, and
        # whether its job is its chain's root.
        self._ahead: tuple[Lease, bool, bool] | None = None
        # Whether the current member's job is its chain's root (its lock said so).
        self._root = False
        # The idle bound in force (SQL literal, ms): in the transaction outside the
        # savepoint, and set in the open savepoint (None: not set there).
        self._idle: tuple[bytes | None, bytes | None] = (None, None)
        self._escaping = Escaping(conn.pgconn)
        self._encoding = conn.info.encoding
        prepared = conn.prepare_threshold is not None
        sql = ops._sql
        self._lock = _Statement(sql.atomic_member_lock, _LOCK_PARAMS, b"lock", prepared)
        self._complete = _Statement(sql.complete_atomic, _COMPLETE_PARAMS, b"complete", prepared)
        self._complete_root = _Statement(
            sql.complete_atomic_root, _COMPLETE_ROOT_PARAMS, b"complete_root", prepared
        )
        self.members = 0

    def _usable(self) -> psycopg.AsyncConnection[Any]:
        conn = self._conn
        if conn.closed or conn.broken:
            raise GroupLostError("the atomic group's connection was closed")
        return conn

    async def enter(self, *, lease: Lease, deadline: timedelta) -> TransactionHandle | None:
        conn = self._usable()
        ahead = self._ahead
        if ahead is not None:
            self._ahead = None
            if ahead[0] == lease:  # entered ahead with the last completion
                if ahead[1]:
                    self._root = ahead[2]
                    return PgTransaction(conn, self._give_back)
                self._savepoint = _STALE
                return None
            self._savepoint = _STALE
        if self._savepoint == _NOT_BEGUN:
            await self._prepare(conn)
        savepoint = self._savepoint
        idle = self._idle_after(savepoint)
        entry, idle = self._entry(idle, savepoint == _NOT_BEGUN, lease, deadline)
        cur = self._cur
        with translate_errors(self._ops.schema):
            # Never prepared by psycopg: the text is the member's own.
            await cur.execute(_BEFORE_LOCK[savepoint] + entry, prepare=False)
            self._savepoint = _FRESH
            self._idle = idle
            while cur.nextset():  # the lock's rows come last
                pass
            rows = await cur.fetchall()
        if not rows:
            self._savepoint = _STALE  # rolled back in front of what comes next
            return None
        self._root = bool(rows[0][0])
        return PgTransaction(conn, self._give_back)

    async def complete(
        self,
        completion: Completion,
        *,
        then: NextMember | None = None,
        commit: bool = False,
    ) -> CompletionResult:
        if completion.continuation is not None:
            raise ValueError("AtomicGroup.complete takes a completion without continuation")
        self._usable()
        ops = self._ops
        token = completion.lease_token
        output = self._escaping.escape_literal(completion.output_json.encode(self._encoding))
        job_id = _uuid_literal(completion.job_id)
        fence = b"NULL" if token is None else _uuid_literal(token)
        if self._root:  # ends its chain (no continuation), of which it is the root
            query = self._complete_root.text((job_id, fence, output))
        else:
            query = self._complete.text((job_id, fence, output, b"true"))
        idle = self._idle
        if commit:
            query += _COMMIT if then is None else _COMMIT_BEGIN
            idle = (None, None)
        elif then is not None:
            query += _NEXT
            idle = (idle[1] or idle[0], None)
        if then is not None:
            entry, idle = self._entry(idle, commit, then.lease, then.deadline)
            query += entry
        cur = self._cur
        try:
            with translate_errors(ops.schema):
                await cur.execute(query, prepare=False)
                rows = await cur.fetchall()
                if then is not None:
                    self._idle = idle
                    while cur.nextset():
                        pass
                    ahead = await cur.fetchall()
                    self._ahead = (then.lease, bool(ahead), bool(ahead and ahead[0][0]))
        except pg_errors.InvalidTextRepresentation as exc:
            if ATOMIC_REFUSED not in str(exc):
                raise
            # Nothing after the completion ran: roll the member back (no one ahead).
            await self.undo()
            return CompletionResult(job_id=completion.job_id, accepted=False)
        if not commit:
            self.members += 1
            self._savepoint = _USED if then is None else _FRESH
            return await self._settle_dependants(completion, rows)
        # Committed: a new group goes on with ``then``'s entry, or the connection goes
        # back. Dependants are settled on their own, as after ``complete_atomic``.
        self.members = 0
        if then is None:
            self._idle = (None, None)
            self._savepoint = _NOT_BEGUN
            await self._give_back()
        else:
            self._savepoint = _FRESH
        [result] = await ops._completion_results(None, [completion], rows)
        return result

    async def _settle_dependants(
        self, completion: Completion, rows: Sequence[tuple[Any, ...]]
    ) -> CompletionResult:
        """The completion's result; a chain it ended that others wait on is resolved in
        the group's transaction, outside the next member's savepoint (rare: one more
        round trip each way; a lock taken ahead is dropped, the next member enters on
        its own)."""
        ops = self._ops
        conn = self._conn
        ends_with_dependants = any(row[3] and row[4] for row in rows)
        if ends_with_dependants:
            if self._ahead is not None:
                self._ahead = None
                await self._cur.execute(_DROP_AHEAD)
                self._idle = (self._idle[0], None)
            else:
                await self._cur.execute(_RELEASE)
                self._idle = self._idle_after(_USED)
            self._savepoint = _NONE
        [result] = await ops._completion_results(PgTransaction(conn), [completion], rows)
        return result

    async def keep(self) -> None:
        self._usable()
        with translate_errors(self._ops.schema):
            await self._cur.execute(_KEEP)
        self.members += 1
        self._ahead = None
        self._savepoint = _FRESH
        self._idle = self._idle_after(_USED)

    async def undo(self) -> None:
        self._usable()
        with translate_errors(self._ops.schema):
            await self._cur.execute(_UNDO)
        self._ahead = None
        self._savepoint = _FRESH
        self._idle = (self._idle[0], None)

    async def commit(self) -> None:
        try:
            self._usable()
            if self._savepoint != _NOT_BEGUN:
                with translate_errors(self._ops.schema):
                    await self._cur.execute(b"COMMIT")
        finally:
            self._ahead = None
            self._idle = (None, None)
            await self._give_back()

    async def discard(self) -> None:
        conn = self._conn
        self._ahead = None
        self._idle = (None, None)
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

    def _idle_after(self, savepoint: int) -> tuple[bytes | None, bytes | None]:
        """The idle bound in force once ``_BEFORE_LOCK[savepoint]`` has run: a released
        savepoint's setting joins the transaction's, a rolled-back one's is gone."""
        outside, inside = self._idle
        if savepoint == _NOT_BEGUN:
            return (None, None)
        if savepoint == _USED:
            return (inside or outside, None)
        if savepoint == _FRESH:
            return (outside, inside)
        return (outside, None)  # _NONE (none open), _STALE (rolled back)

    def _entry(
        self,
        idle: tuple[bytes | None, bytes | None],
        begun: bool,
        lease: Lease,
        deadline: timedelta,
    ) -> tuple[bytes, tuple[bytes | None, bytes | None]]:
        """A member's entry after what opens its savepoint (``begun``: after a BEGIN,
        before its savepoint), and the idle bound in force after it. The bound is
        set once per transaction, outside the members' savepoints (a member rolled
        back cannot take it with it), and again, in the member's savepoint, only for
        a member whose deadline asks for another one."""
        ms = _idle_ms(deadline)
        lock = self._lock.text((_uuid_literal(lease.job_id), _uuid_literal(lease.lease_token)))
        if begun:
            return b"%s%s; %s%s" % (_SET_IDLE, ms, _SAVEPOINT, lock), (ms, None)
        outside, inside = idle
        if (inside or outside) == ms:
            return lock, idle
        return b"%s%s; %s" % (_SET_IDLE, ms, lock), (outside, ms)

    async def _prepare(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Prepare the group's statements on ``conn`` unless done already (once per
        connection: a name is taken until the session ends, whatever the transaction
        it was prepared in did). Each alone, so that one that fails leaves nothing."""
        done = _prepared.setdefault(conn, set())
        for statement in (self._lock, self._complete, self._complete_root):
            if statement.prepare is None or statement.prepare in done:
                continue
            # (Taken already: prepared on this session by an earlier group.)
            with (
                translate_errors(self._ops.schema),
                contextlib.suppress(pg_errors.DuplicatePreparedStatement),
            ):
                await self._cur.execute(statement.prepare, prepare=False)
            done.add(statement.prepare)


class _Statement:
    """One of the group's statements as simple-protocol text, with literals written
    in: ``EXECUTE`` of its prepared form, or (``prepared`` False) its full text."""

    __slots__ = ("_execute", "_order", "_parts", "prepare")

    def __init__(
        self,
        template: bytes,
        params: tuple[tuple[bytes, bytes], ...],
        kind: bytes,
        prepared: bool,
    ) -> None:
        names = [name for name, _ in params]
        parts, order = _cut(template)
        if sorted(order) != sorted(names):
            raise ValueError(f"{kind!r}: placeholders {order} are not {names}")
        # For each placeholder in the text, its parameter's position.
        self._order = tuple(names.index(name) for name in order)
        self._parts = parts
        self.prepare: bytes | None = None
        self._execute: bytes | None = None
        if prepared:
            # Named after its text: another schema's or version's is another statement.
            name = b"pgwork_atomic_%s_%s" % (kind, hashlib.sha1(template).hexdigest()[:12].encode())
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


_PLACEHOLDER = re.compile(rb"%\((\w+)\)s")


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
