"""The connection layer every part of ``PostgresStateAdapter`` stands on.

``AdapterBase`` holds what the mixins of ``state`` share: the schema, the pool, the
adapter's own connection outside it, the rendered SQL catalogue (``statements``), and
the few ways to reach a connection (``_pooled``, ``_own_line``, ``_connection``,
``transaction``) and run a statement on it (``_fetch``, ``_read``). Each mixin
subclasses it, so its methods are typed against these and nothing else.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import psycopg
from psycopg_pool import AsyncConnectionPool

from pgwork.adapters.after_commit import notify_after_commit
from pgwork.adapters.state import TransactionHandle
from pgwork.errors import DatabaseTimeoutError
from pgwork.postgres._callers import DbConn, fetch
from pgwork.postgres._errors import translate_errors
from pgwork.postgres._pool import borrow, bounded, configure_session
from pgwork.postgres._transactions import PgTransaction, read_committed, unwrap
from pgwork.postgres.connect import connect
from pgwork.postgres.sql import Statements

__all__ = ["PSYCOPG_PREPARE_THRESHOLD", "AdapterBase"]

# psycopg's own default for ``prepare_threshold``.
PSYCOPG_PREPARE_THRESHOLD = 5


class AdapterBase:
    """Connections and statements for the adapter's operations (see the module)."""

    schema: str
    pool: AsyncConnectionPool[Any]
    operation_timeout: float | None
    statements: Statements
    _line: psycopg.AsyncConnection[Any] | None
    _line_lock: anyio.Lock

    @asynccontextmanager
    async def _pooled(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection from the pool for one operation, bounded by
        ``operation_timeout`` (``_pool.borrow``). When it turns out broken (server
        restarted, backend terminated, no answer), every idle connection is checked:
        after a restart they are all dead, and the pool hands out each of them once
        more otherwise, each failing one worker turn."""
        async with borrow(self.pool, self.operation_timeout) as conn:
            yield conn

    @asynccontextmanager
    async def _own_line(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """The adapter's connection outside the pool (opened on first use with the
        pool's settings), for one operation bounded like a pooled one. A failed or
        timed-out operation closes it; the next opens a new one."""
        async with self._line_lock:
            done = False
            try:
                with anyio.move_on_after(self.operation_timeout) as scope:
                    line = self._line
                    if line is None or line.closed or line.broken:
                        line = self._line = await self._open_line()
                    yield line
                    done = True
            finally:
                if not done:
                    await self._drop_line()
            if scope.cancelled_caught:
                raise DatabaseTimeoutError("a statement", self.operation_timeout or 0.0)

    async def _open_line(self) -> psycopg.AsyncConnection[Any]:
        # A pool may take its settings as callables (sync or async) returning them.
        settings: list[Any] = [self.pool.conninfo, self.pool.kwargs]
        for n, value in enumerate(settings):
            if callable(value):
                value = value()
                settings[n] = await value if inspect.isawaitable(value) else value
        conninfo, kwargs = settings
        kwargs = {**(kwargs or {}), "autocommit": True}
        line = await connect(conninfo or "", **kwargs)
        if kwargs.get("prepare_threshold", PSYCOPG_PREPARE_THRESHOLD) is not None:
            try:
                await configure_session(line)  # as the pool's own (no transaction pooler)
            except BaseException:
                await line.close()
                raise
        return line

    async def _drop_line(self) -> None:
        line, self._line = self._line, None
        if line is not None:
            with anyio.CancelScope(shield=True):
                await line.close()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[TransactionHandle]:
        # Not bounded: the block is the caller's, and may hold anything. A broker's
        # notices published in it are sent once it committed (``after_commit``).
        async with notify_after_commit(independent=True), borrow(self.pool, None) as conn:
            await read_committed(conn)
            async with conn.transaction():
                yield PgTransaction(conn)

    @asynccontextmanager
    async def _connection(self, tx: TransactionHandle | None) -> AsyncIterator[DbConn]:
        if tx is None:
            async with self._pooled() as conn:
                yield conn
            return
        held = await unwrap(tx)
        bound = tx.bound if isinstance(tx, PgTransaction) else None
        if bound is None or not isinstance(held, psycopg.AsyncConnection):
            yield held
            return
        # A transaction of the worker's own (an atomic attempt's): bounded as a
        # statement on a pooled connection is.
        async with bounded(held, bound):
            yield held

    async def _fetch(
        self, conn: DbConn, query: bytes, params: Mapping[str, Any]
    ) -> list[tuple[Any, ...]]:
        with translate_errors(self.schema):
            return await fetch(conn, query, params)  # type: ignore[return-value]

    async def _read(
        self, tx: TransactionHandle | None, query: bytes, params: Mapping[str, Any]
    ) -> list[tuple[Any, ...]]:
        async with self._connection(tx) as conn:
            with translate_errors(self.schema):
                return await fetch(conn, query, params, prepare=False)  # type: ignore[return-value]
