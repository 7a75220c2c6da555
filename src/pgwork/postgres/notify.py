"""The PostgreSQL notify adapter: LISTEN/NOTIFY as wake-up hints.

``publish`` with a transaction runs ``pg_notify`` inside it, so PostgreSQL itself
delivers the notice only on commit, never on rollback, and folds identical notices of
one transaction into one. Each ``listen`` holds one dedicated autocommit connection;
when it breaks, the listener reconnects with capped exponential backoff and reports a
``reconnected`` notice so the worker fetches at once instead of trusting the gap.
"""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any
from uuid import UUID

import anyio
import psycopg
from psycopg import sql

from pgwork.adapters.notify import Listener, Notice
from pgwork.postgres._callers import execute
from pgwork.postgres._connect import connect
from pgwork.postgres._names import DEFAULT_SCHEMA, validate_schema_name
from pgwork.postgres._transactions import unwrap

__all__ = ["PostgresNotifyAdapter"]

log = logging.getLogger("pgwork.notify")

_SEP = "|"
_KINDS = ("ready", "abort", "chain_done")


def encode_notice(notice: Notice) -> str:
    """Compact text payload: ``kind|job_id|chain_id|reason|at|queue``, never job data.

    The queue comes last and the decoder splits off only the first five fields, so a
    queue name may contain any character, the separator included.
    """
    return _SEP.join(
        (
            notice.kind,
            str(notice.job_id) if notice.job_id else "",
            str(notice.chain_id) if notice.chain_id else "",
            notice.reason or "",
            repr(round(notice.at, 3)) if notice.at is not None else "",
            notice.queue or "",
        )
    )


def decode_notice(payload: str) -> Notice | None:
    """The notice in ``payload``, or None for anything this version does not know."""
    parts = payload.split(_SEP, 5)
    if len(parts) != 6 or parts[0] not in _KINDS:
        return None
    kind, job_id, chain_id, reason, at, queue = parts
    try:
        return Notice(
            kind=kind,  # type: ignore[arg-type]
            queue=queue or None,
            job_id=UUID(job_id) if job_id else None,
            chain_id=UUID(chain_id) if chain_id else None,
            reason=reason or None,
            at=float(at) if at else None,
        )
    except ValueError:
        return None


class _PgListener:
    def __init__(self, adapter: PostgresNotifyAdapter) -> None:
        self._adapter = adapter
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._failures = 0

    async def open(self) -> None:
        self._conn = await self._adapter._listen_connection()

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    async def wait(self, timeout: float) -> list[Notice]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            return await self._reconnect(timeout)
        notices: list[Notice] = []
        try:
            gen = self._conn.notifies(timeout=timeout, stop_after=1)
            async for note in gen:
                self._collect(note.payload, notices)
            # Drain whatever else already arrived without waiting again.
            async for note in self._conn.notifies(timeout=0.0):
                self._collect(note.payload, notices)
        except psycopg.OperationalError as exc:
            log.warning("pgwork listener connection lost: %s", exc)
            await self.close()
            return await self._reconnect(timeout)
        return notices

    def _collect(self, payload: str, into: list[Notice]) -> None:
        notice = decode_notice(payload)
        if notice is not None:
            into.append(notice)

    async def _reconnect(self, budget: float) -> list[Notice]:
        """Try to reconnect within ``budget`` seconds; backoff is capped and resets
        after a success."""
        delay = min(
            self._adapter.reconnect_max, self._adapter.reconnect_initial * 2**self._failures
        )
        try:
            self._conn = await self._adapter._listen_connection()
        except Exception as exc:  # any failure: keep the worker polling, try again later
            self._failures += 1
            log.warning("pgwork listener reconnect failed (%s); retrying in %.1fs", exc, delay)
            await anyio.sleep(min(budget, delay * random.uniform(0.8, 1.2)))
            return []
        self._failures = 0
        log.info("pgwork listener reconnected")
        return [Notice(kind="reconnected")]


class PostgresNotifyAdapter:
    """``NotifyAdapter`` over PostgreSQL LISTEN/NOTIFY on one channel per schema."""

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        reconnect_initial: float = 0.1,
        reconnect_max: float = 5.0,
    ) -> None:
        self.schema = validate_schema_name(schema)
        self.channel = f"{self.schema}_events"
        self.reconnect_initial = reconnect_initial
        self.reconnect_max = reconnect_max
        self._dsn = dsn
        self._publish_conn: psycopg.AsyncConnection[Any] | None = None
        self._publish_lock = anyio.Lock()
        self._notify_sql = b"SELECT pg_notify(%s, p) FROM unnest(%s::text[]) AS p"
        self._notify_tx_sql = (
            b"SELECT pg_notify(%(channel)s, p) FROM unnest(%(payloads)s::text[]) AS p"
        )
        self._listen_sql = sql.SQL("LISTEN {}").format(sql.Identifier(self.channel))

    async def publish(self, tx: object | None, *, notices: Sequence[Notice]) -> None:
        if not notices:
            return
        payloads = sorted({encode_notice(n) for n in notices})
        if tx is not None:
            await execute(
                await unwrap(tx),
                self._notify_tx_sql,
                {"channel": self.channel, "payloads": payloads},
            )
            return
        async with self._publish_lock:
            if self._publish_conn is None or self._publish_conn.closed:
                self._publish_conn = await connect(self._dsn, autocommit=True)
            try:
                await self._publish_conn.execute(self._notify_sql, (self.channel, payloads))
            except psycopg.OperationalError:
                await self._publish_conn.close()
                self._publish_conn = None
                raise

    @asynccontextmanager
    async def listen(self) -> AsyncIterator[Listener]:
        listener = _PgListener(self)
        await listener.open()
        try:
            yield listener
        finally:
            await listener.close()

    async def _listen_connection(self) -> psycopg.AsyncConnection[Any]:
        conn = await connect(self._dsn, autocommit=True)
        await conn.execute(self._listen_sql)
        return conn

    async def close(self) -> None:
        if self._publish_conn is not None:
            await self._publish_conn.close()
            self._publish_conn = None
