"""Finding the connection under whatever transaction a caller hands us.

Enqueueing must happen on the caller's own connection, inside the caller's own
transaction, so that rolling it back leaves no job behind. A SQLAlchemy session or
connection is unwrapped to the very driver connection it is using (psycopg or asyncpg);
a second connection is never opened.

SQLAlchemy must know its transaction has begun before we write under it: a connection
from ``engine.connect()`` ("commit as you go") has none until its first statement, and
its ``commit()`` does nothing while it believes so (the job would be rolled back when
the connection goes back to the pool). So we begin it first, exactly as its own first
statement would. Under the asyncpg dialect SQLAlchemy sends its BEGIN only with its
first statement, so we run one (``SELECT 1``) when asyncpg is not in a transaction yet.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
from psycopg.pq import TransactionStatus

from pgwork.errors import UnsupportedConnectionError
from pgwork.postgres._callers import AsyncpgCaller, DbConn, SyncPsycopgCaller
from pgwork.postgres._loan import BlockingLoan

__all__ = [
    "BEGIN_READ_COMMITTED",
    "PgTransaction",
    "own_connection",
    "read_committed",
    "require_transaction",
    "unwrap",
    "unwrap_sync",
]

# How pgwork begins a transaction of its own by hand: at the isolation level its
# statements are written for (a lock, then a statement that sees what the lock's
# previous holder committed), whatever the database's default_transaction_isolation.
BEGIN_READ_COMMITTED = b"BEGIN ISOLATION LEVEL READ COMMITTED"

C = TypeVar("C", psycopg.AsyncConnection[Any], psycopg.Connection[Any])


class PgTransaction:
    """The PostgreSQL adapters' transaction handle: an open connection in a transaction
    (psycopg's ``AsyncConnection``, or a caller's connection of another kind).

    ``give_back``, when the connection was lent by a pool for this transaction alone,
    returns it there (once); ``discard`` calls it at once, so that a connection given
    up on counts as returned even while its borrower (an abandoned handler) runs on.
    ``bound``: each of pgwork's own operations in the transaction must be done within
    that many seconds (a worker's atomic attempt; None for a caller's transaction).
    """

    __slots__ = ("bound", "connection", "give_back", "loan")

    def __init__(
        self,
        connection: DbConn,
        give_back: Callable[[], Awaitable[None]] | None = None,
        bound: float | None = None,
    ) -> None:
        self.connection = connection
        self.give_back = give_back
        self.bound = bound
        self.loan: BlockingLoan | None = None

    def __repr__(self) -> str:
        return f"PgTransaction({self.connection!r})"

    def lend(self, check: Callable[[], None]) -> BlockingLoan:
        """The transaction as a blocking connection for a sync handler's thread
        (``TransactionLending.lend_transaction``; see ``_loan``)."""
        self.loan = BlockingLoan(own_connection(self), check, self.bound)
        return self.loan

    async def discard(self) -> None:
        if self.loan is not None:
            # Lent to a thread that may still use it: stopped first (see ``_loan``).
            await self.loan.discard()
        # close() takes no lock (a rollback would wait for the statement in progress);
        # the server rolls back, and the pool replaces a closed connection.
        await own_connection(self).close()
        if self.give_back is not None:
            await self.give_back()


async def read_committed(conn: psycopg.AsyncConnection[Any]) -> None:
    """Make the transactions psycopg begins on ``conn`` (one of pgwork's own, outside
    a transaction) READ COMMITTED, as ``BEGIN_READ_COMMITTED``. Client-side only: the
    level rides on psycopg's ``BEGIN``, no statement is sent."""
    if conn.isolation_level is not psycopg.IsolationLevel.READ_COMMITTED:
        await conn.set_isolation_level(psycopg.IsolationLevel.READ_COMMITTED)


def own_connection(tx: object) -> psycopg.AsyncConnection[Any]:
    """The psycopg connection of a transaction pgwork opened itself (the worker's)."""
    if isinstance(tx, PgTransaction) and isinstance(tx.connection, psycopg.AsyncConnection):
        return tx.connection
    raise UnsupportedConnectionError(tx, "this operation needs a transaction pgwork opened")


async def unwrap(tx: object) -> DbConn:
    """The connection ``tx`` runs on, for the async API."""
    if isinstance(tx, PgTransaction):
        return tx.connection
    if isinstance(tx, psycopg.AsyncConnection):
        return _usable(tx)
    if isinstance(tx, psycopg.Connection):
        raise UnsupportedConnectionError(
            tx, "a synchronous connection: use start_chain_sync / start_chains_sync"
        )
    if _is_asyncpg(tx):
        return _asyncpg(tx, tx)
    sa_conn = await _sqlalchemy_connection(tx)
    if sa_conn is None:
        raise UnsupportedConnectionError(tx)
    raw = await sa_conn.get_raw_connection()
    driver = raw.driver_connection
    if isinstance(driver, psycopg.AsyncConnection) and _commits_alone(driver):
        # isolation_level="AUTOCOMMIT": a begin would only mark SQLAlchemy's side as in a
        # transaction; the caller's connection is left as it was.
        return _usable(driver)
    if _is_asyncpg(driver) and getattr(raw.dbapi_connection, "autocommit", False):
        # The same on asyncpg, where the statement that begins a transaction would run
        # alone, begin nothing, and be sent before the refusal.
        return _asyncpg(tx, driver)
    if not sa_conn.in_transaction():
        await sa_conn.begin()
    if isinstance(driver, psycopg.AsyncConnection):
        return _usable(driver)
    if _is_asyncpg(driver):
        if not driver.is_in_transaction():
            await sa_conn.exec_driver_sql("SELECT 1")
        return _asyncpg(tx, driver)
    raise UnsupportedConnectionError(tx, f"its driver is {sa_conn.dialect.driver!r}")


def unwrap_sync(tx: object) -> SyncPsycopgCaller:
    """The connection ``tx`` runs on, for the ``*_sync`` API: psycopg's blocking one."""
    if isinstance(tx, PgTransaction) and isinstance(tx.connection, SyncPsycopgCaller):
        return tx.connection
    if isinstance(tx, psycopg.Connection):
        return SyncPsycopgCaller(_usable(tx))
    if isinstance(tx, psycopg.AsyncConnection) or _is_asyncpg(tx):
        raise UnsupportedConnectionError(tx, "an asynchronous connection: use start_chain")
    sa_conn = _sqlalchemy_sync_connection(tx)
    if sa_conn is None:
        raise UnsupportedConnectionError(tx)
    driver = sa_conn.connection.driver_connection
    if isinstance(driver, psycopg.Connection) and _commits_alone(driver):
        return SyncPsycopgCaller(_usable(driver))  # as in ``unwrap``
    if not sa_conn.in_transaction():
        sa_conn.begin()
    if isinstance(driver, psycopg.Connection):
        return SyncPsycopgCaller(_usable(driver))
    raise UnsupportedConnectionError(tx, f"its driver is {sa_conn.dialect.driver!r}")


async def _sqlalchemy_connection(tx: object) -> Any:
    # SQLAlchemy's asyncio extension is imported lazily: psycopg-only users pay nothing.
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

    if isinstance(tx, AsyncSession):
        # Begins the session's transaction (autobegin) and its connection's.
        return await tx.connection()
    if isinstance(tx, AsyncConnection):
        return tx
    return None


def _sqlalchemy_sync_connection(tx: object) -> Any:
    if "sqlalchemy" not in sys.modules:
        return None
    from sqlalchemy.engine import Connection
    from sqlalchemy.orm import Session

    if isinstance(tx, Session):
        return tx.connection()
    if isinstance(tx, Connection):
        return tx
    return None


def _is_asyncpg(conn: object) -> bool:
    """Whether ``conn`` is an asyncpg connection (or a pool's proxy of one), without
    importing asyncpg: an object of asyncpg's exists only once asyncpg is loaded."""
    asyncpg = sys.modules.get("asyncpg")
    if asyncpg is None:
        return False
    return isinstance(conn, asyncpg.Connection | asyncpg.pool.PoolConnectionProxy)


def _asyncpg(tx: object, conn: Any) -> AsyncpgCaller:
    if conn.is_closed():
        raise UnsupportedConnectionError(tx, "the connection is closed")
    if not conn.is_in_transaction():
        # Outside a transaction every statement commits alone: a batch could half
        # succeed and the dedup lock would hold for nothing.
        raise UnsupportedConnectionError(
            tx, "it is not in a transaction: enqueue inside `async with conn.transaction():`"
        )
    return AsyncpgCaller(conn)


def _commits_alone(conn: psycopg.AsyncConnection[Any] | psycopg.Connection[Any]) -> bool:
    """Whether each statement on ``conn`` would commit by itself: autocommit mode, and
    no transaction opened on it (``conn.transaction()`` opens one even in autocommit)."""
    return conn.autocommit and conn.info.transaction_status is TransactionStatus.IDLE


def require_transaction(conn: DbConn) -> None:
    """UnsupportedConnectionError if a job written on ``conn`` would commit at once.

    An enqueue belongs to the caller's transaction: on a connection in autocommit mode
    (psycopg's ``autocommit=True``, SQLAlchemy's ``isolation_level="AUTOCOMMIT"``,
    Django outside ``atomic()``) the job would be committed by its own statement, before
    and whatever the caller's code does next, and a batch could half succeed. Refused
    before any SQL, as an asyncpg connection outside a transaction is."""
    psycopg_conn = conn.connection if isinstance(conn, SyncPsycopgCaller) else conn
    if isinstance(psycopg_conn, psycopg.AsyncConnection | psycopg.Connection) and (
        _commits_alone(psycopg_conn)
    ):
        raise UnsupportedConnectionError(
            psycopg_conn,
            "it is in autocommit mode outside a transaction, so the job would commit on "
            "its own: enqueue inside `with conn.transaction():` (or on a connection "
            "without autocommit, then commit it; in Django, inside `transaction.atomic()`)",
        )


def _usable(conn: C) -> C:
    if conn.closed:
        raise UnsupportedConnectionError(conn, "the connection is closed")
    return conn
