"""An atomic attempt's transaction lent to a sync handler: a blocking connection.

A plain ``def`` handler of an atomic job type runs on one of the worker's threads, and
writes in the job's transaction, which the worker opened on an ``AsyncConnection`` of
its pool. The handler is given a real ``psycopg.Connection`` over that very libpq
connection (``_LentConnection``): psycopg code, SQLAlchemy's sync API (``creator=``)
and anything else that takes a DB-API connection use it as their own, and every
statement runs in the job's transaction, which commits with its completion or not at
all. Nothing is proxied through the event loop, and no second connection is opened.

One libpq connection may be used by one thread at a time: while it is lent, the event
loop leaves it alone (the worker waits for the handler's thread), each statement of
the borrower holds the loan's lock, and a statement from any thread but the one that
opened the loan (the handler's) is refused. ``discard`` (a handler given up on) takes
that lock before it closes the connection, after asking the server to cancel the
statement in progress and shutting the socket down, so the borrower's statement fails
at once rather than the connection being freed under it; every later statement fails
cleanly.

``commit`` and ``rollback`` keep their DB-API meaning for the handler's own part of the
transaction, through a savepoint taken when the loan opens: ``commit`` keeps what the
handler wrote so far (it commits with the job), ``rollback`` undoes what it wrote since
its last ``commit``, which leaves the transaction usable after an error. So
SQLAlchemy's session commits, its rollback after an error, and its reset when a
connection goes back to its pool behave as they would on a connection of its own.
``close`` does not close the worker's connection.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable
from typing import Any, TypeVar
from warnings import warn

import anyio
import psycopg
from psycopg.abc import PQGen

__all__ = ["BlockingLoan"]

RV = TypeVar("RV")

# The savepoint the handler's ``commit`` and ``rollback`` act on.
_KEEP = b"RELEASE SAVEPOINT pgwork_handler; SAVEPOINT pgwork_handler"
_UNDO = b"ROLLBACK TO SAVEPOINT pgwork_handler"
_OPEN = b"SAVEPOINT pgwork_handler"
# psycopg's own interval between checks of a blocking wait.
_WAIT_INTERVAL = 0.1


class _LentConnection(psycopg.Connection[Any]):
    """A blocking psycopg connection over the libpq connection of an atomic attempt."""

    _loan: BlockingLoan

    def wait(
        self, gen: PQGen[RV], interval: float = _WAIT_INTERVAL, timeout: float | None = None
    ) -> RV:
        # Every exchange with the server goes through here: the loan's lock and checks
        # come first.
        with self._loan.using():
            return super().wait(gen, interval, timeout)

    def _check_connection_ok(self) -> None:
        # psycopg's own check, made before a statement: say why it cannot run.
        self._loan.check_lent()
        super()._check_connection_ok()

    def commit(self) -> None:
        """Keep what the handler wrote so far: it commits with the job's completion."""
        self.execute(_KEEP)

    def rollback(self) -> None:
        """Undo what the handler wrote since its last ``commit`` (or since it began)."""
        self.execute(_UNDO)

    def close(self) -> None:
        """Nothing: the connection is the worker's, given back when the handler ends."""

    def __del__(self, __warn: Any = warn) -> None:
        pass  # never the owner of its connection: nothing to warn about


class BlockingLoan:
    """``TransactionLoan`` over the ``AsyncConnection`` of a ``PgTransaction``."""

    def __init__(
        self, conn: psycopg.AsyncConnection[Any], check: Callable[[], None], bound: float | None
    ) -> None:
        self._conn = conn
        self._check = check
        self._bound = bound
        self._lock = threading.Lock()
        self._lent: _LentConnection | None = None
        self._handlers: tuple[Any, Any] | None = None
        self._ended = False
        self._discarded = False
        self._borrower: int | None = None

    @contextlib.contextmanager
    def using(self) -> Any:
        """Held by the borrower around each exchange with the server."""
        with self._lock:
            self.check_lent()
            self._check()
            yield

    def check_lent(self) -> None:
        """OperationalError once the connection is no longer the borrower's;
        ProgrammingError on a thread other than the borrower's."""
        if self._discarded:
            raise psycopg.OperationalError(
                "the worker gave up on this attempt and closed its connection: nothing "
                "written through it commits"
            )
        if self._ended:
            raise psycopg.OperationalError(
                "this attempt's connection was given back to the worker when its "
                "handler returned: use `attempt.connection` only inside the handler"
            )
        if self._borrower is not None and threading.get_ident() != self._borrower:
            raise psycopg.ProgrammingError(
                "this attempt's connection is lent to its handler's thread: use "
                "`attempt.connection` from the handler itself, not from another thread"
            )

    def open(self) -> _LentConnection:
        self._borrower = threading.get_ident()
        with self.using():
            pgconn = self._conn.pgconn
            # psycopg points the libpq connection's notice and notify callbacks at the
            # newest connection object made over it: given back in ``close``.
            self._handlers = (pgconn.notice_handler, pgconn.notify_handler)
            lent = _LentConnection(pgconn)
            lent._loan = self
            # One cache of prepared statements for the two: their names never clash.
            lent._prepared = self._conn._prepared
            self._lent = lent
        lent.execute(_OPEN)
        return lent

    def close(self) -> None:
        with self._lock:
            self._ended = True
            if self._handlers is not None and not self._discarded:
                pgconn = self._conn.pgconn
                pgconn.notice_handler, pgconn.notify_handler = self._handlers

    async def interrupt(self) -> None:
        if self._lent is None or self._ended or self._conn.closed:
            return
        with contextlib.suppress(psycopg.Error):
            await self._conn.cancel_safe(timeout=self._bound or 5.0)

    async def discard(self) -> None:
        """Stop the borrower's use of the connection, before its owner closes it: the
        statement in progress is cancelled and its socket shut down (so it fails now),
        then the borrower's lock is taken, so the connection is not closed under it."""
        self._discarded = True
        if self._lent is None or self._ended or self._conn.closed:
            return
        await self.interrupt()
        # A duplicate of the descriptor: shutting it down ends the connection for both,
        # and closing it leaves libpq's own descriptor to libpq.
        with (
            contextlib.suppress(OSError, psycopg.Error),
            socket.socket(fileno=os.dup(self._conn.pgconn.socket)) as sock,
        ):
            sock.shutdown(socket.SHUT_RDWR)
        taken = await anyio.to_thread.run_sync(
            lambda: self._lock.acquire(timeout=self._bound or 5.0)
        )
        if taken:
            self._lock.release()
