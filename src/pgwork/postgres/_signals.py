"""PostgreSQL side of ``ChainSignals``: signals, waiting steps, and matching the two.

Mixed into ``PostgresStateAdapter``; the SQL, and why a match that begins after a signal
and its step committed always pairs them, is in ``sql.signals``. ``insert_waiting`` is
what ``insert_jobs`` calls for the waiting steps of a batch: a statement of their own,
so that the enqueue's other statements know nothing of waiting.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any
from uuid import UUID

import psycopg

from pgwork.adapters.notify import Notice, NotifyAdapter
from pgwork.adapters.state import (
    NewJob,
    NewSignal,
    ReceivedSignal,
    SignalDelivery,
    SignalMatch,
    TransactionHandle,
)
from pgwork.postgres._base import AdapterBase
from pgwork.postgres._callers import DbConn, execute
from pgwork.postgres._errors import translate_errors
from pgwork.postgres._transactions import read_committed, require_transaction, unwrap
from pgwork.postgres.notify import PostgresNotifyAdapter, encode_notice

__all__ = ["SignalOps", "insert_waiting"]


class SignalOps(AdapterBase):
    """``ChainSignals`` of the PostgreSQL state adapter."""

    async def send_signals(
        self,
        tx: TransactionHandle,
        *,
        signals: Sequence[NewSignal],
        notify: NotifyAdapter | None = None,
    ) -> None:
        if not signals:
            return
        conn = await unwrap(tx)
        require_transaction(conn)
        notices = [Notice(kind="signal", name=name) for name in sorted({s.name for s in signals})]
        channel = notify.channel if isinstance(notify, PostgresNotifyAdapter) else None
        params = {
            "ids": [s.id for s in signals],
            "names": [s.name for s in signals],
            "payloads": [s.payload_json for s in signals],
            "channel": channel,
            "notices": [encode_notice(n) for n in notices] if channel is not None else [],
        }
        with translate_errors(self.schema):
            await execute(conn, self.statements.signals.send_signals, params)
        if notify is not None and channel is None:
            await notify.publish(tx, notices=notices)

    async def match_signals(self, *, names: Sequence[str], limit: int = 100) -> SignalMatch:
        if not names:
            return SignalMatch()
        async with self._pooled() as conn:
            # Every worker that hears a name's notice asks: most find nothing left to
            # pair (another worker's match took it, or one side is not there yet), or
            # another match pairing it now. A read in autocommit says which names have
            # both sides and which of those are free (their lock tried, and let go as
            # it ends); only the free ones take a transaction, and the held ones are
            # the caller's to ask for again (the holder's snapshot may predate the
            # commit that asked).
            found = await self._fetch(
                conn, self.statements.signals.matchable_names, {"names": list(names)}
            )
            free = [name for name, got in found if got]
            held = tuple(name for name, got in found if not got)
            if not free:
                return SignalMatch(busy=held)
            match = await self._match_locked(conn, free, limit, wait=False)
        return replace(match, busy=tuple(sorted((*held, *match.busy))))

    async def _match_locked(
        self, conn: psycopg.AsyncConnection[Any], names: Sequence[str], limit: int, *, wait: bool
    ) -> SignalMatch:
        """Pair ``names``' pending signals and waiting steps under the names' locks, in
        a transaction of its own on ``conn``, and commit. ``wait``: wait for each lock
        another transaction holds (the sweep); else take only the free locks of the
        names with something to pair, and return the others held as ``busy``."""
        names = sorted(set(names))
        statements = self.statements.signals
        busy: tuple[str, ...] = ()
        await read_committed(conn)
        async with conn.transaction():
            # Two statements: the second's snapshot is taken once the first holds
            # the locks, so it sees what the locks' previous holders committed.
            if wait:
                await self._fetch(conn, statements.lock_signal_names, {"names": names})
                locked = names
            else:
                found = await self._fetch(conn, statements.matchable_names, {"names": names})
                locked = [name for name, got in found if got]
                busy = tuple(name for name, got in found if not got)
            rows = (
                await self._fetch(conn, statements.match_signals, {"names": locked, "limit": limit})
                if locked
                else []
            )
        return replace(_match(rows, limit), busy=busy)

    async def sweep_signals(self, *, limit: int = 100) -> SignalMatch:
        rows = await self._read(None, self.statements.signals.find_unmatched, {"limit": limit})
        if not rows:
            return SignalMatch()
        # Found with both sides already: no probe before the match. The sweep is the
        # backstop: it waits its turn on a name rather than leave it to anyone.
        async with self._pooled() as conn:
            return await self._match_locked(conn, [row[0] for row in rows], limit, wait=True)

    async def received_signal(
        self, tx: TransactionHandle | None, *, job_id: UUID
    ) -> ReceivedSignal | None:
        async with self._connection(tx) as conn:
            rows = await self._fetch(
                conn, self.statements.signals.received_signal, {"job_id": job_id}
            )
        if not rows:
            return None
        signal_id, name, payload, sent_at = rows[0]
        return ReceivedSignal(signal_id=signal_id, name=name, payload=payload, sent_at=sent_at)

    async def prune_signals(self, *, older_than: timedelta, limit: int = 1000) -> int:
        async with self._pooled() as conn:
            rows = await self._fetch(
                conn,
                self.statements.signals.prune_signals,
                {"older_than_s": older_than.total_seconds(), "limit": limit},
            )
        return len(rows)


def _match(rows: Sequence[Sequence[Any]], limit: int) -> SignalMatch:
    delivered = tuple(
        SignalDelivery(signal_id=row[0], job_id=row[1], name=row[2], queue=row[3]) for row in rows
    )
    per_name: dict[str, int] = {}
    for delivery in delivered:
        per_name[delivery.name] = per_name.get(delivery.name, 0) + 1
    return SignalMatch(
        delivered=delivered,
        full=tuple(sorted(name for name, count in per_name.items() if count >= limit)),
    )


async def insert_waiting(conn: DbConn, query: bytes, schema: str, jobs: Sequence[NewJob]) -> None:
    """Insert waiting steps (``NewJob.wait_signal`` set) in ``conn``'s transaction:
    blocked without a timeout, pending at their timeout with one (``run_after``)."""
    params = {
        "ids": [j.id for j in jobs],
        "type_names": [j.type_name for j in jobs],
        "chain_ids": [j.chain_id for j in jobs],
        "chain_type_names": [j.chain_type_name for j in jobs],
        "chain_indexes": [j.chain_index for j in jobs],
        "inputs": [j.input_json for j in jobs],
        "queues": [j.queue for j in jobs],
        "priorities": [j.priority for j in jobs],
        "max_attempts": [j.max_attempts for j in jobs],
        "run_afters": [None if j.run_after is None else j.run_after.total_seconds() for j in jobs],
        "trace_contexts": [
            json.dumps(dict(j.trace_context)) if j.trace_context else None for j in jobs
        ],
        "contexts": [json.dumps(dict(j.context)) if j.context else None for j in jobs],
        "limit_keys": [j.limit_key for j in jobs],
        "limit_groups": [j.limit_group for j in jobs],
        "wait_signals": [j.wait_signal for j in jobs],
    }
    with translate_errors(schema):
        await execute(conn, query, params)
