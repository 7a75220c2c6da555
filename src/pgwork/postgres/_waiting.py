"""PostgreSQL side of the waiting views: what chains wait for, the waiting steps, the
signals (``OperatorViews.chain_waits``, ``list_waiting``, ``list_signals``).

Mixed into ``PostgresStateAdapter``; the SQL, and which index each kind of wait is
read from, is in ``sql.waiting``. The listings run unprepared (``_read``), so a kind
not asked for folds away when planned.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from pgwork.adapters.state import PageKey, SignalFilter, TransactionHandle, WaitingFilter
from pgwork.postgres._base import AdapterBase
from pgwork.postgres._rows import parse_stored_json
from pgwork.postgres.sql.waiting import WAIT_KINDS
from pgwork.records import SignalRecord, Waiting, WaitKind

__all__ = ["WaitingOps"]


class WaitingOps(AdapterBase):
    """The waiting views of the PostgreSQL state adapter."""

    async def chain_waits(
        self, tx: TransactionHandle | None, *, chain_ids: Sequence[UUID]
    ) -> list[Waiting]:
        if not chain_ids:
            return []
        params = {"ids": list(dict.fromkeys(chain_ids))}
        rows = await self._read(tx, self.statements.waiting.chain_waits, params)
        return [_waiting(row) for row in rows]

    async def list_waiting(
        self,
        tx: TransactionHandle | None,
        *,
        where: WaitingFilter,
        after: PageKey | None,
        limit: int,
    ) -> list[Waiting]:
        kinds = [kind.value for kind in where.kinds] or list(WAIT_KINDS)
        if where.signal is not None or where.signal_prefix is not None:
            kinds = [kind for kind in kinds if kind == WaitKind.SIGNAL.value]
        params = {
            "kinds": kinds,
            "signal": where.signal,
            "prefix": where.signal_prefix,
            "chain_type": where.chain_type,
            "after_id": after.id if after is not None else None,
            "limit": limit,
        }
        rows = await self._read(tx, self.statements.waiting.list_waiting, params)
        return [_waiting(row) for row in rows]

    async def list_signals(
        self,
        tx: TransactionHandle | None,
        *,
        where: SignalFilter,
        after: PageKey | None,
        limit: int,
    ) -> list[SignalRecord]:
        params = {
            "pending": where.pending,
            "name": where.name,
            "prefix": where.name_prefix,
            "after_id": after.id if after is not None else None,
            "limit": limit,
        }
        rows = await self._read(tx, self.statements.waiting.list_signals, params)
        return [
            SignalRecord(
                id=row[0],
                name=row[1],
                payload=parse_stored_json(row[2]),
                sent_at=row[3],
                consumed_by=row[4],
                consumed_at=row[5],
                as_of=row[6],
            )
            for row in rows
        ]


def _waiting(row: Sequence[Any]) -> Waiting:
    return Waiting(
        kind=WaitKind(row[0]),
        job_id=row[1],
        type_name=row[2],
        chain_id=row[3],
        chain_type_name=row[4],
        chain_index=row[5],
        queue=row[6],
        since=row[7],
        until=row[8],
        signal=row[9],
        deadline=row[10],
        total=row[11],
        done=row[12],
        as_of=row[13],
    )
