"""The state adapter's own connections: a pool whose checks, and whose borrowers'
statements, are bounded in time.

A connection whose network path drops packets without a reset (a NAT or a load
balancer that lost the flow's state) stays open on the client's side and never
answers: TCP keepalives do not help while the middlebox still acknowledges them, and
libpq waits for ever. Without a bound, a worker whose pooled connections went that
way never ran a job again (tests/faults/test_network_blackhole.py). So:

- every operation the adapter runs on a connection it borrows (not in a caller's
  transaction) is bounded by ``operation_timeout``; cancelling the statement makes
  psycopg give up on the connection and close it, and the pool replaces it;
- so is every statement of a transaction the adapter holds itself (an atomic
  attempt's, its completion and COMMIT included; ``bounded``): past the bound the
  connection is closed, its transaction lost, and the server rolls it back;
- the pool's check of its idle connections, run when one turns out broken, is bounded
  per connection, and runs in a task of its own, so a caller never waits for it and
  cannot cancel it half-way (which would leave connections counted but lost);
- connections are opened with a connect timeout, as every other pgwork connection is.

They also run their sessions in UTC and at READ COMMITTED (``configure_session``),
whatever the server's ``TimeZone`` and ``default_transaction_isolation``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import psycopg
from psycopg_pool import AsyncConnectionPool

from pgwork.errors import DatabaseTimeoutError

__all__ = ["CHECK_TIMEOUT", "BoundedPool", "borrow", "bounded", "check_soon", "configure_session"]

# How long the pool's check waits for one idle connection to answer an empty query.
CHECK_TIMEOUT = 5.0


class BoundedPool(AsyncConnectionPool[Any]):
    """psycopg's pool, with its idle-connection check bounded in time."""

    @staticmethod
    async def check_connection(conn: psycopg.AsyncConnection[Any]) -> None:
        try:
            with anyio.fail_after(CHECK_TIMEOUT):
                await AsyncConnectionPool.check_connection(conn)
        except TimeoutError as exc:
            # psycopg closed it when the query was interrupted; make sure, and report
            # it the way the pool expects a broken connection to be reported.
            await conn.close()
            raise psycopg.OperationalError(
                f"no answer to the pool's check within {CHECK_TIMEOUT:g}s"
            ) from exc


async def configure_session(conn: psycopg.AsyncConnection[Any]) -> None:
    """Set up a new connection of the state adapter's own (the pool's ``configure``):
    its session runs in UTC and at READ COMMITTED, whatever the server's defaults.
    One round trip, once per connection.

    READ COMMITTED: the adapter's connections are in autocommit, so each statement is
    a transaction of its own at ``default_transaction_isolation``. Every statement of
    the worker is written for READ COMMITTED: an UPDATE that meets a row another
    transaction changed after its snapshot re-reads it and re-checks its fence. At
    REPEATABLE READ the same statement fails with a serialization error instead (an
    ``await_chain`` racing the worker's completion of the chain's root did), so a
    database or role whose default is higher must not change pgwork's own statements.

    UTC: psycopg gives every ``timestamptz`` it reads the session's zone, and only the
    name ``UTC`` maps to ``datetime.timezone.utc``; any other name, ``Etc/UTC``
    included (the default of Debian's packages and of the official container image),
    becomes a ``ZoneInfo`` that each value is converted into, several times slower per
    row (``python -m bench.cpu --only drain`` shows it in a worker's acquire). So every
    datetime pgwork's own connections return is in UTC; the instants are the same, and
    schedules and leases never depended on the session's zone (the database clock and
    intervals in seconds).

    Not for a pool opened with ``prepare_threshold=None``, the setting for a
    transaction pooler: a session's ``SET`` there reaches whichever server session the
    pooler picked, which other clients share (PgBouncer keeps ``TimeZone`` per client,
    RDS Proxy pins the client to one session, other poolers may do neither). Through
    such a pooler the database's (or the role's) ``default_transaction_isolation``
    must be READ COMMITTED, PostgreSQL's own default (docs/deploying.md).
    """
    statements = [b"SET default_transaction_isolation TO 'read committed'"]
    if conn.pgconn.parameter_status(b"TimeZone") != b"UTC":
        statements.append(b"SET TIME ZONE 'UTC'")
    await conn.execute(b"; ".join(statements))


_checks: dict[int, asyncio.Task[None]] = {}


def check_soon(pool: AsyncConnectionPool[Any]) -> None:
    """Check ``pool``'s idle connections in the background, once at a time per pool.

    After a server restart every idle connection is dead, and the pool would hand out
    each of them once more, each failing one worker turn; the check discards them all.
    """
    key = id(pool)
    running = _checks.get(key)
    if running is not None and not running.done():
        return
    task = asyncio.get_running_loop().create_task(pool.check(), name="pgwork-pool-check")
    _checks[key] = task
    task.add_done_callback(lambda done: _forget(key, done))


def _forget(key: int, task: asyncio.Task[None]) -> None:
    if _checks.get(key) is task:
        del _checks[key]
    if not task.cancelled():
        task.exception()  # retrieved: a failed check is not worth a warning at exit


@asynccontextmanager
async def borrow(
    pool: AsyncConnectionPool[Any], timeout: float | None, what: str = "a statement"
) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A pooled connection for one operation, which must be done within ``timeout``
    seconds (None: no bound), waiting for a free connection included; past it,
    ``DatabaseTimeoutError``.

    The connection goes back to the pool outside the bound: returning it must not be
    cancelled half-way. A connection that broke (or was closed because it did not
    answer) makes the pool check its idle ones.
    """
    conn: psycopg.AsyncConnection[Any] | None = None
    try:
        with anyio.move_on_after(timeout) as scope:
            conn = await pool.getconn()
            yield conn
    finally:
        if conn is not None:
            with anyio.CancelScope(shield=True):
                if scope.cancelled_caught and not conn.closed:
                    await conn.close()
                broken = conn.broken or conn.closed
                await pool.putconn(conn)
            if broken:
                check_soon(pool)
    if scope.cancelled_caught:
        raise DatabaseTimeoutError(what, timeout or 0.0)


@asynccontextmanager
async def bounded(
    conn: psycopg.AsyncConnection[Any], timeout: float | None, what: str = "a statement"
) -> AsyncIterator[None]:
    """An operation on ``conn``, a connection the adapter holds (an atomic attempt's
    transaction), that must be done within ``timeout`` seconds (None: no bound). Past
    it the connection is closed (what the server did with the statement is unknown;
    its transaction is lost, and rolled back once the server notices) and
    ``DatabaseTimeoutError`` raised."""
    if timeout is None:
        yield
        return
    with anyio.move_on_after(timeout) as scope:
        yield
    if scope.cancelled_caught:
        with anyio.CancelScope(shield=True):
            await conn.close()
        raise DatabaseTimeoutError(what, timeout)
