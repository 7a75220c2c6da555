"""Finding the psycopg connection under whatever transaction a caller hands us.

Enqueueing must happen on the caller's own connection, inside the caller's own
transaction, so that rolling it back leaves no job behind. A SQLAlchemy session or
connection is unwrapped to the very psycopg connection it is using; a second
connection is never opened.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from pgwork.errors import UnsupportedConnectionError

__all__ = ["PgTransaction", "unwrap"]


class PgTransaction:
    """The PostgreSQL adapters' transaction handle: an open psycopg connection.

    ``give_back``, when the connection was lent by a pool for this transaction alone,
    returns it there (once); ``discard`` calls it at once, so that a connection given
    up on counts as returned even while its borrower (an abandoned handler) runs on.
    """

    __slots__ = ("connection", "give_back")

    def __init__(
        self,
        connection: psycopg.AsyncConnection[Any],
        give_back: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.connection = connection
        self.give_back = give_back

    def __repr__(self) -> str:
        return f"PgTransaction({self.connection!r})"

    async def discard(self) -> None:
        # close() takes no lock (a rollback would wait for the statement in progress);
        # the server rolls back, and the pool replaces a closed connection.
        await self.connection.close()
        if self.give_back is not None:
            await self.give_back()


async def unwrap(tx: object) -> psycopg.AsyncConnection[Any]:
    """Return the psycopg ``AsyncConnection`` that ``tx`` runs on."""
    if isinstance(tx, PgTransaction):
        return tx.connection
    if isinstance(tx, psycopg.AsyncConnection):
        return _usable(tx)
    if isinstance(tx, psycopg.Connection):
        raise UnsupportedConnectionError(tx, "a synchronous connection; use AsyncConnection")
    sa_conn = await _sqlalchemy_connection(tx)
    if sa_conn is None:
        raise UnsupportedConnectionError(tx)
    raw = await sa_conn.get_raw_connection()
    driver = raw.driver_connection
    if not isinstance(driver, psycopg.AsyncConnection):
        raise UnsupportedConnectionError(tx, f"its driver is {sa_conn.dialect.driver!r}")
    return _usable(driver)


async def _sqlalchemy_connection(tx: object) -> Any:
    # SQLAlchemy's asyncio extension is imported lazily: psycopg-only users pay nothing.
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

    if isinstance(tx, AsyncSession):
        return await tx.connection()
    if isinstance(tx, AsyncConnection):
        return tx
    return None


def _usable(conn: psycopg.AsyncConnection[Any]) -> psycopg.AsyncConnection[Any]:
    if conn.closed:
        raise UnsupportedConnectionError(conn, "the connection is closed")
    return conn
