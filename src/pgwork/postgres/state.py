"""The PostgreSQL state adapter: pgwork's job operations on psycopg.

One pool of autocommit connections serves the worker's own operations, so a
single-statement operation (acquire, renew, reap) is one round trip with no BEGIN or
COMMIT. The worker's registration and heartbeat have a connection of their own,
outside the pool: atomic handlers may hold every pooled connection for as long as they
run, and a heartbeat that waited for one would have other workers declare this one
dead. Operations that take ``tx`` run on the caller's connection inside the caller's
transaction and never commit it.

The class is composed of one mixin per role of ``pgwork.adapters.state`` (this module
keeps the ``Store`` role: ``connect``, ``verify``, ``close``, ``adopt``), so that each
part can be read alone. Every mixin stands on ``_base.AdapterBase`` (the pool, the own
connection, transactions, the SQL catalogue); one that calls another's operations
subclasses it (``WorkerOps`` < ``CompletionOps`` < ``EnqueueOps`` < ``ChainOps``,
``QueryOps``):

- ``_state_enqueue.EnqueueOps``: ``EnqueueStore`` (``insert_jobs``);
- ``_debounce.DebounceOps``: ``Debouncing`` (``debounce_jobs``);
- ``_state_worker.WorkerOps`` and ``_state_complete.CompletionOps``: ``WorkerStore``
  (acquire, renew, fail, release, reap; complete), with ``_chains.ChainOps`` settling
  chains that wait on chains;
- ``_queries.QueryOps``: ``ReadStore`` (get, list, count) and chain deletion;
- ``_chains.ChainOps``: ``ControlStore``'s cancel, retry, trigger, pause;
- ``_registry.RegistryOps``: ``WorkerRegistry`` (and ``list_workers``);
- ``_history.HistoryOps``: the job history (``roll_up_history``, ``job_history``);
- ``_limit_control.LimitControlOps``: ``LimitControl`` (limits and pauses changed at
  run time);
- ``_signals.SignalOps``: ``ChainSignals`` (signals, and matching them with the steps
  that wait for them);
- ``_waiting.WaitingOps``: the waiting views of ``OperatorViews`` (what chains wait
  for, the waiting steps, the signals).

``mark_chain_awaited``, ``chains_of`` and ``now`` also live in ``_chains``. The SQL of
every part is in one catalogue (``pgwork.postgres.sql``), rendered once per schema.
"""

from __future__ import annotations

from typing import Any, Self

import anyio
import psycopg
from psycopg_pool import AsyncConnectionPool

from pgwork.adapters.state import TransactionHandle
from pgwork.errors import ConfigurationError
from pgwork.postgres._base import PSYCOPG_PREPARE_THRESHOLD
from pgwork.postgres._chains import ChainOps
from pgwork.postgres._debounce import DebounceOps
from pgwork.postgres._history import HistoryOps
from pgwork.postgres._insight import InsightOps
from pgwork.postgres._limit_control import LimitControlOps
from pgwork.postgres._names import DEFAULT_SCHEMA, validate_schema_name
from pgwork.postgres._pool import BoundedPool, configure_session
from pgwork.postgres._queries import QueryOps
from pgwork.postgres._registry import RegistryOps
from pgwork.postgres._signals import SignalOps
from pgwork.postgres._state_complete import CompletionOps
from pgwork.postgres._state_enqueue import EnqueueOps
from pgwork.postgres._state_worker import WorkerOps
from pgwork.postgres._transactions import PgTransaction, unwrap, unwrap_sync
from pgwork.postgres._verify import check_server_version, verify_schema
from pgwork.postgres._waiting import WaitingOps
from pgwork.postgres._work import WorkOps
from pgwork.postgres.connect import connect, normalize_dsn, with_connect_timeout
from pgwork.postgres.sql import render

__all__ = ["DEFAULT_OPERATION_TIMEOUT", "PSYCOPG_PREPARE_THRESHOLD", "PostgresStateAdapter"]

# Bound on one operation on the adapter's own connections (seconds). Every statement
# pgwork runs for itself takes milliseconds; one that takes this long is waiting on a
# connection that will never answer (or on a lock that someone else holds too long).
DEFAULT_OPERATION_TIMEOUT = 30.0


class PostgresStateAdapter(
    WorkerOps,
    CompletionOps,
    EnqueueOps,
    DebounceOps,
    ChainOps,
    QueryOps,
    InsightOps,
    RegistryOps,
    WorkOps,
    HistoryOps,
    LimitControlOps,
    SignalOps,
    WaitingOps,
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

    # --- transactions ------------------------------------------------------------------

    async def adopt(self, tx: object) -> TransactionHandle:
        if isinstance(tx, psycopg.AsyncConnection) and not tx.closed:
            # The commonest caller, without ``unwrap``'s coroutine (see _insert_plain).
            return PgTransaction(tx)
        return PgTransaction(await unwrap(tx))

    def adopt_sync(self, tx: object) -> TransactionHandle:
        """``adopt`` for the ``*_sync`` client calls: a blocking psycopg connection,
        whose operations then complete without an event loop."""
        return PgTransaction(unwrap_sync(tx))


def _check_operation_timeout(value: float | None) -> None:
    if value is not None and not value > 0:  # NaN included
        raise ConfigurationError(f"operation_timeout must be positive or None, got {value!r}")
