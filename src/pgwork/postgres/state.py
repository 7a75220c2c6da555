"""The PostgreSQL state adapter: pgwork's job operations on psycopg.

One pool of autocommit connections serves the worker's own operations, so a
single-statement operation (acquire, renew, reap) is one round trip with no BEGIN or
COMMIT. The worker's registration and heartbeat have a connection of their own,
outside the pool: atomic handlers may hold every pooled connection for as long as they
run, and a heartbeat that waited for one would have other workers declare this one
dead. Operations that take ``tx`` run on the caller's connection inside the caller's
transaction and never commit it.

The class is composed of one mixin per role of ``pgwork.adapters.state`` (this module
keeps the ``Store`` role: the pool, transactions, ``connect``), so that each part can be
read alone:

- ``_state_enqueue.EnqueueOps``: ``EnqueueStore`` (``insert_jobs``);
- ``_state_worker.WorkerOps`` and ``_state_complete.CompletionOps``: ``WorkerStore``
  (acquire, renew, fail, release, reap; complete), with ``_chains.ChainOps`` settling
  chains that wait on chains;
- ``_queries.QueryOps``: ``ReadStore`` (get, list, count) and chain deletion;
- ``_chains.ChainOps``: ``ControlStore``'s cancel, retry, trigger, pause;
- ``_registry.RegistryOps``: ``WorkerRegistry`` (and ``list_workers``);
- ``_history.HistoryOps``: the job history (``roll_up_history``, ``job_history``).

``mark_chain_awaited``, ``chains_of`` and ``now`` also live in ``_chains``. The SQL of
every part is in one catalogue (``pgwork.postgres.sql``), rendered once per schema.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, Self

import anyio
import psycopg
from psycopg_pool import AsyncConnectionPool

from pgwork.adapters.state import TransactionHandle
from pgwork.errors import ConfigurationError, DatabaseTimeoutError
from pgwork.postgres._callers import DbConn, fetch
from pgwork.postgres._chains import ChainOps
from pgwork.postgres._connect import connect, normalize_dsn, with_connect_timeout
from pgwork.postgres._errors import translate_errors
from pgwork.postgres._history import HistoryOps
from pgwork.postgres._insight import InsightOps
from pgwork.postgres._names import DEFAULT_SCHEMA, validate_schema_name
from pgwork.postgres._pool import BoundedPool, borrow, bounded, configure_session
from pgwork.postgres._queries import QueryOps
from pgwork.postgres._registry import RegistryOps
from pgwork.postgres._state_complete import CompletionOps
from pgwork.postgres._state_enqueue import EnqueueOps
from pgwork.postgres._state_worker import WorkerOps
from pgwork.postgres._transactions import PgTransaction, read_committed, unwrap, unwrap_sync
from pgwork.postgres._verify import check_server_version, verify_schema
from pgwork.postgres._work import WorkOps
from pgwork.postgres.sql import render

__all__ = ["DEFAULT_OPERATION_TIMEOUT", "PSYCOPG_PREPARE_THRESHOLD", "PostgresStateAdapter"]

# psycopg's own default for ``prepare_threshold``.
PSYCOPG_PREPARE_THRESHOLD = 5

# Bound on one operation on the adapter's own connections (seconds). Every statement
# pgwork runs for itself takes milliseconds; one that takes this long is waiting on a
# connection that will never answer (or on a lock that someone else holds too long).
DEFAULT_OPERATION_TIMEOUT = 30.0


class PostgresStateAdapter(
    EnqueueOps,
    WorkerOps,
    CompletionOps,
    QueryOps,
    InsightOps,
    ChainOps,
    RegistryOps,
    WorkOps,
    HistoryOps,
):
    """``StateAdapter`` over a psycopg ``AsyncConnectionPool``.

    Build one with ``await PostgresStateAdapter.connect(dsn)``, which checks the server
    is reachable and the schema is migrated before anything else runs; or wrap a pool
    you manage yourself (its connections must be in autocommit mode).
    """

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        *,
        schema: str = DEFAULT_SCHEMA,
        owns_pool: bool = False,
        operation_timeout: float | None = DEFAULT_OPERATION_TIMEOUT,
    ) -> None:
        if not isinstance(pool, AsyncConnectionPool):
            raise ConfigurationError(
                f"PostgresStateAdapter wraps a psycopg_pool.AsyncConnectionPool, not "
                f"{type(pool).__name__}: inside an event loop use `await "
                "PostgresStateAdapter.connect(dsn)`; code without one (Django, Flask, "
                "scripts) that only enqueues with start_chain_sync can use "
                "`PostgresStateAdapter(AsyncConnectionPool(dsn, open=False))`, a pool "
                "it never opens (docs/enqueue.md, 'Without an event loop')"
            )
        _check_operation_timeout(operation_timeout)
        self.schema = validate_schema_name(schema)
        self.pool = pool
        self.operation_timeout = operation_timeout
        self._owns_pool = owns_pool
        self._line: psycopg.AsyncConnection[Any] | None = None
        self._line_lock = anyio.Lock()
        self.statements = render(self.schema)

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        min_size: int = 1,
        max_size: int = 10,
        verify: bool = True,
        prepare_threshold: int | None = PSYCOPG_PREPARE_THRESHOLD,
        operation_timeout: float | None = DEFAULT_OPERATION_TIMEOUT,
    ) -> Self:
        """Open a pool on ``dsn``; raises DatabaseUnreachableError / SchemaMissingError /
        SchemaOutdatedError with the next step in the message.

        ``prepare_threshold`` goes to every connection opened here (psycopg's setting:
        after that many runs a statement is prepared on the server under a name). Pass
        ``None`` when ``dsn`` is a pooler in transaction mode (PgBouncer, most hosted
        poolers): a named statement lives in one server session, and the pooler hands
        the next transaction to another, where the name is missing or taken
        (``InvalidSqlStatementName`` / ``DuplicatePreparedStatement``). Nothing else
        pgwork's state adapter does depends on the server session (docs/deploying.md).

        ``operation_timeout`` bounds each operation the adapter runs on its own
        connections (not in a caller's transaction): past it the connection is closed
        and ``DatabaseTimeoutError`` raised, so a connection whose network path went
        silent cannot hold a worker for ever. None waits for ever.
        """
        schema = validate_schema_name(schema)
        _check_operation_timeout(operation_timeout)
        dsn = normalize_dsn(dsn)
        options: dict[str, Any] = {"prepare_threshold": prepare_threshold}
        probe = await connect(dsn, **options)
        try:
            check_server_version(probe)
            if verify:
                await verify_schema(probe, schema)
        finally:
            await probe.close()
        pool = BoundedPool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            kwargs=with_connect_timeout(dsn, {"autocommit": True, **options}),
            # No session state through a transaction pooler (see configure_session).
            configure=configure_session if prepare_threshold is not None else None,
            open=False,
            name=f"pgwork-{schema}",
        )
        await pool.open(wait=True, timeout=30)
        return cls(pool, schema=schema, owns_pool=True, operation_timeout=operation_timeout)

    async def verify(self) -> None:
        async with self._pooled() as conn:
            await verify_schema(conn, self.schema)

    async def close(self) -> None:
        await self._drop_line()
        if self._owns_pool:
            await self.pool.close()

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

    # --- transactions ------------------------------------------------------------------

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[TransactionHandle]:
        # Not bounded: the block is the caller's, and may hold anything.
        async with borrow(self.pool, None) as conn:
            await read_committed(conn)
            async with conn.transaction():
                yield PgTransaction(conn)

    async def adopt(self, tx: object) -> TransactionHandle:
        if isinstance(tx, psycopg.AsyncConnection) and not tx.closed:
            # The commonest caller, without ``unwrap``'s coroutine (see _insert_plain).
            return PgTransaction(tx)
        return PgTransaction(await unwrap(tx))

    def adopt_sync(self, tx: object) -> TransactionHandle:
        """``adopt`` for the ``*_sync`` client calls: a blocking psycopg connection,
        whose operations then complete without an event loop."""
        return PgTransaction(unwrap_sync(tx))

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


def _check_operation_timeout(value: float | None) -> None:
    if value is not None and not value > 0:  # NaN included
        raise ConfigurationError(f"operation_timeout must be positive or None, got {value!r}")
